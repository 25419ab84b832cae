"""What the `deepnmt` commands do: train, evaluate, translate, quickstart (the main job), push.

Each function takes plain arguments so that it can also be called from Python; `training.cli` only parses.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import textwrap
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

import hf_deepnmt  # noqa: F401  (registers the model types)
from hf_deepnmt import record_language_pair
from model_cards import EvalRow, write_model_card

from .arguments import TRAIN_ALIASES, CommandLineError, canonical_options, unknown_arguments_message
from .defaults import PARSE_TIME_DEFAULTS, given_options, resolve as resolve_defaults
from .data import DataArguments, DataError, load_splits, read_parallel_file, tokenize_corpus
from .hub import push_folder
from .metrics import TranslationMetrics, TranslationScores, score_translations
from .plots import plot_history
from .recipes import load_model_config_dict, load_recipe, parse_overrides, recipe_to_argv, resolve_path
from .schedules import SCHEDULES, rnnplus_scheduler_factory
from .tokenizer import train_and_save
from .trainer import DeepNMTTrainer, checkpoint_problem, checkpoints_newest_first, last_checkpoint

EMBEDDED_DATASET = {
    "dataset_name": "World English Bible ↔ Reina-Valera 1909 (hf_deepnmt embedded corpus)",
    "dataset_id": "hf_deepnmt/bible-web-rv1909",
    "dataset_description": (
        "the embedded Bible corpus of hf_deepnmt: World English Bible ↔ Reina-Valera 1909 (both public domain, "
        "exported from Debian's sword-text-web / sword-text-sparv), verse-aligned, split by held-out books"
    ),
}


@dataclass
class ModelArguments:
    """Model, tokenizer and card options of `deepnmt train` (run_translation names where they exist)."""

    recipe: str | None = field(default=None, metadata={"help": "A recipe YAML (path or shipped name, e.g. quickstart); its values are defaults that the command line overrides."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "Fine-tune a saved model (folder or Hub id) instead of training from scratch."})
    model_type: str | None = field(default=None, metadata={"help": "Model family of a model trained from scratch: deep_transformer (default), admin_transformer, deep_decoder_transformer or dtmt (meng2019's deep transition RNN); overrides the model_type of --config_name / the recipe."})
    config_name: str | None = field(default=None, metadata={"help": "Model config: a preset name (training/presets, e.g. transformer-base), a config.json or a model folder."})
    config_overrides: str | None = field(default=None, metadata={"help": "Override config fields: 'd_model=256,encoder_layers=12'."})
    warm_start_from: str | None = field(default=None, metadata={"help": "Initialise a new model from a trained one (folder or Hub id): its weights are copied, the mechanisms it lacks (e.g. dou2018 aggregation, multi-layer attention) start from their initialisation, as dou2018 trains its models. The model comes from --recipe/--config_name/--config_overrides as usual; the tokenizer is the trained model's."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "A saved tokenizer; without it (and without a model) a joint BPE is trained on the training data."})
    vocab_size: int = field(default=8000, metadata={"help": "Joint BPE vocabulary size when a tokenizer is trained."})
    bpe_min_frequency: int = field(default=2, metadata={"help": "Minimum merge frequency when a tokenizer is trained."})
    eval_num_beams: int = field(default=4, metadata={"help": "Beam size of the final test evaluation and of the saved generation config."})
    optimizer: str | None = field(default=None, metadata={"help": "'radam' trains with torch.optim.RAdam (liu2020's optimizer, not among transformers' --optim choices) using --learning_rate, --adam_beta1/2, --adam_epsilon, --weight_decay; default: --optim."})
    admin_profile_tokens: int = field(default=4096, metadata={"help": "ADMIN profiling batch size in target tokens (liu2020, docs/liu2020.md: ≥ 4k); used once, before the first step, when the model has residual_scaling=admin and is not profiled yet."})
    lr_schedule: str | None = field(default=None, metadata={"help": "'rnnplus_warmup_decay': meng2019's eq. (17) schedule (training/schedules.py) with lr0 = --learning_rate, warm-up --warmup_steps, decay from --lr_decay_start to --lr_decay_end; replaces --lr_scheduler_type. Default: --lr_scheduler_type."})
    lr_decay_start: int = field(default=8000, metadata={"help": "rnnplus_warmup_decay: s, the step where the exponential decay starts (meng2019 Zh-En: 8000)."})
    lr_decay_end: int = field(default=64000, metadata={"help": "rnnplus_warmup_decay: e, the step where the learning rate has halved from lr0 (meng2019 Zh-En: 64000)."})
    lr_replicas: int | None = field(default=None, metadata={"help": "rnnplus_warmup_decay: n, the number of concurrent model replicas (peak lr = n · lr0); default: processes × gradient accumulation steps."})
    license: str = field(default="apache-2.0", metadata={"help": "License written into the model card."})
    dataset_label: str | None = field(default=None, metadata={"help": "Dataset name for the model card (default: the file or Hub name)."})
    max_train_minutes: float | None = field(default=None, metadata={"help": "Stop training after this many minutes of training (evaluations included; the run then saves, tests and writes its card as after --max_steps): a wall-clock budget, e.g. to compare setups at equal time."})
    nmt_defaults: bool = field(default=True, metadata={"help": "A model trained from scratch without --recipe gets NMT defaults for every option the command line leaves unset: model size, learning rate, warm-up, token batch and vocabulary from the data size and device, inverse-sqrt schedule, Adam β2 0.98, validation BLEU four times per run (docs/defaults.md); the resolved values are printed at start. false: transformers' fine-tuning defaults."})


@dataclass
class TrainOutcome:
    """What `train` leaves behind."""

    output_dir: Path
    trainer: DeepNMTTrainer
    tokenizer: Any
    data_args: DataArguments
    model_args: ModelArguments
    training_args: Seq2SeqTrainingArguments
    test_scores: TranslationScores | None = None
    timings: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------ helpers
class TimeBudget(TrainerCallback):
    """``--max_train_minutes``: stop after the step that ends past the budget (the clock starts at the first step),
    with a final evaluation and save if the run evaluates/saves by steps."""

    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60.0
        self.started: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 (transformers' signature)
        if self.started is None:
            self.started = time.time()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        over = self.started is not None and time.time() - self.started >= self.seconds
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every process must stop at the same step: stop when any one is past the budget
            flag = torch.tensor([float(over)], device=args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            over = bool(flag.item())
        if over:
            control.should_training_stop = True
            control.should_evaluate = args.eval_strategy != "no"
            control.should_save = args.save_strategy != "no"
        return control


# Defaults of `deepnmt train` that differ from transformers' fine-tuning defaults (a recipe or the command line
# overrides them).
NMT_DEFAULTS: dict[str, Any] = {
    "label_smoothing_factor": 0.1,  # every paper of this package (and Vaswani et al. 2017) smooths labels with 0.1
}


class _TrainParser(HfArgumentParser):
    """transformers' parser; a bad value or a missing argument raises `CommandLineError` (one sentence) instead of
    printing the usage."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise CommandLineError(f"{message} (see `deepnmt train --help`)")


# The switches of each paper, set with --config_overrides (DTMT's with --model_type dtmt); listed in --help with
# their defaults read from the config classes, so the list cannot drift from the code.
PAPER_SWITCHES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("li2022", "deep_transformer", ("cross_attention_drop_depth", "cross_attention_drop_ratio", "ddr_weight",
                                    "ald_weight", "ald_unk_ratio", "ald_temperature")),
    ("liu2020", "deep_transformer", ("residual_scaling", "admin_init", "layer_norm_position")),
    ("dou2018", "deep_transformer", ("encoder_layer_aggregation", "decoder_layer_aggregation",
                                     "aggregation_activation", "multi_layer_attention_k", "diversity_weight")),
    ("meng2019", "dtmt", ("rnn_cell", "transition_depth", "attention_heads", "encoder_transition",
                          "query_transition", "decoder_transition")),
)


def train_help_description() -> str:
    """The top of `deepnmt train --help`: the from-scratch defaults, the paper switches, recipes and presets."""
    from transformers import CONFIG_MAPPING

    from .recipes import PRESETS_DIR, RECIPES_DIR

    lines = [
        "Train a translation model: fine-tune one (--model_name_or_path), run a recipe (--recipe), or train a new one.",
        "",
        "A new model without --recipe gets NMT defaults for every option left unset (docs/defaults.md): model size,",
        "learning rate, warm-up, token batch and vocabulary from the data size and the device, inverse-sqrt schedule,",
        "label smoothing 0.1, validation BLEU; they are printed at start. The (default: ...) values below are those",
        "of such a run; --nmt_defaults false gives transformers' own.",
        "",
        "Paper switches (--config_overrides KEY=VALUE,...; meng2019's with --model_type dtmt), with their defaults:",
    ]
    for paper, model_type, fields in PAPER_SWITCHES:
        defaults = CONFIG_MAPPING[model_type]().to_dict()
        lines.append(textwrap.fill(f"  {paper}: " + ", ".join(f"{name}={defaults[name]}" for name in fields),
                                   width=110, subsequent_indent="    ", break_on_hyphens=False))
    lines += [
        "",
        textwrap.fill("Recipes (--recipe NAME): " + ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))),
                      width=110, subsequent_indent="    ", break_on_hyphens=False),
        textwrap.fill("Presets (--config_name NAME): " + ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.json"))),
                      width=110, subsequent_indent="    ", break_on_hyphens=False),
    ]
    return "\n".join(lines)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Option defaults shown (as transformers does), the description printed as written."""


def train_argument_parser(scratch_defaults: dict[str, Any] | None = None) -> HfArgumentParser:
    """The parser of `deepnmt train`, with `NMT_DEFAULTS` in place of transformers' defaults, and
    ``scratch_defaults`` (`training.defaults.PARSE_TIME_DEFAULTS`) for a from-scratch run without a recipe."""
    parser = _TrainParser((ModelArguments, DataArguments, Seq2SeqTrainingArguments), prog="deepnmt train",
                         allow_abbrev=False, formatter_class=_HelpFormatter,
                         description=train_help_description())
    parser.set_defaults(**NMT_DEFAULTS, **(scratch_defaults or {}))
    for action in parser._actions:
        if action.dest == "label_smoothing_factor":
            action.help = ("Label smoothing ε of the training NLL (deepnmt's default 0.1, the value of every paper "
                           "of this package; transformers' own default is 0.0). Recorded in the model config as "
                           "`label_smoothing`. Evaluation losses are never smoothed.")
    return parser


def parse_train_args(argv: Sequence[str]) -> tuple[ModelArguments, DataArguments, Seq2SeqTrainingArguments, dict]:
    """Parse `deepnmt train` arguments: recipe values first, the command line on top."""
    argv = canonical_options(argv, TRAIN_ALIASES)
    recipe = {"model": {}, "data": {}, "training": {}}
    for index, token in enumerate(argv):
        if token == "--recipe" or token.startswith("--recipe="):
            name = token.partition("=")[2] if "=" in token else (argv[index + 1] if index + 1 < len(argv) else "")
            if not name:
                raise ValueError("--recipe needs a value (a YAML path or a shipped recipe name).")
            recipe = load_recipe(name)
    named_output_dir = any(token == "--output_dir" or token.startswith("--output_dir=")
                           for token in recipe_to_argv(recipe) + argv)
    if not named_output_dir and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and "--help" not in argv:
        raise ValueError("--output_dir is required when several processes train one model (every rank must write "
                         "the same folder).")
    given = given_options(argv)
    from_scratch = not ({"recipe", "model_name_or_path", "warm_start_from"} & given)
    scratch_defaults = None
    if from_scratch:  # training.defaults: what is chosen here does not depend on the data
        scratch_defaults = {key: value for key, value in PARSE_TIME_DEFAULTS.items() if key not in given}
        if not {"validation_file", "dataset_name"} & given:
            scratch_defaults.pop("eval_strategy", None)  # nothing to evaluate on
    parser = train_argument_parser(scratch_defaults)
    model_args, data_args, training_args, unknown = parser.parse_args_into_dataclasses(
        recipe_to_argv(recipe) + argv, return_remaining_strings=True)
    if unknown:
        raise CommandLineError(unknown_arguments_message(unknown, list(parser._option_string_actions))
                               + " (see `deepnmt train --help`)")
    if scratch_defaults and not model_args.nmt_defaults:  # --nmt_defaults false: transformers' defaults
        parser = train_argument_parser()
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(recipe_to_argv(recipe) + argv)
    model_args.nmt_defaults = bool(scratch_defaults) and model_args.nmt_defaults  # True: `train` resolves the rest
    if not named_output_dir:
        training_args.output_dir = default_output_dir(model_args, recipe)
        print(f"[deepnmt] no --output_dir given: writing the run to {training_args.output_dir}", file=sys.stderr)
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and not training_args.use_cpu and not torch.cuda.is_available():
        # transformers forms no process group on a machine without GPUs unless told to use the CPU: every process
        # would train alone on the same data and write the same folder. Use the CPU processes (gloo), as launched.
        if int(os.environ.get("RANK", "0") or 0) == 0:
            print(f"[deepnmt] {launched} processes were launched on a machine without GPUs: training on CPU "
                  "processes over gloo (--use_cpu true)", file=sys.stderr)
        model_args, data_args, training_args = parser.parse_args_into_dataclasses(
            recipe_to_argv(recipe) + argv + ["--use_cpu", "true"])
    if launched > 1 and training_args.world_size != launched:
        raise ValueError(f"the launcher started {launched} processes (WORLD_SIZE={launched}) but they formed a process "
                         f"group of {training_args.world_size}; each would train alone and write the same "
                         "--output_dir. Launch with torchrun/accelerate on matching devices, or run one process.")
    for name in ("eval_num_beams", "vocab_size", "bpe_min_frequency", "admin_profile_tokens"):
        value = getattr(model_args, name)
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"`--{name}` = {value!r} is not allowed; use a positive integer.")
    minutes = model_args.max_train_minutes
    if minutes is not None and not (math.isfinite(minutes) and minutes > 0):
        raise ValueError(f"`--max_train_minutes` = {minutes!r} is not allowed; use a positive number of minutes.")
    for name in ("train_file", "validation_file", "test_file"):
        setattr(data_args, name, resolve_path(getattr(data_args, name)))
    return model_args, data_args, training_args, recipe


def apply_scratch_defaults(model_args: ModelArguments, data_args: DataArguments,
                           training_args: Seq2SeqTrainingArguments, recipe: dict, pairs: int, given: set[str]) -> None:
    """Set the data-dependent NMT defaults (`training.defaults.resolve`) of a from-scratch run without a recipe on
    the parsed arguments, never touching an option the command line set, and print them (process 0)."""
    device = "cpu" if training_args.use_cpu or not torch.cuda.is_available() else "gpu"
    model_given = bool(model_args.config_name or model_args.model_type)
    resolution = resolve_defaults(pairs, device, given, model_given, training_args.max_steps)
    overrides = parse_overrides(model_args.config_overrides)
    if overrides.get("residual_scaling") == "admin" and "layer_norm_position" not in overrides and resolution.model:
        resolution.model["layer_norm_position"] = "post"  # ADMIN is defined on post-LN (liu2020), not pre-LN
    recipe["model"] = {**resolution.model, **recipe["model"]}
    if device == "cpu" and "dataloader_pin_memory" not in given:
        resolution.options["dataloader_pin_memory"] = False  # nothing to pin for (and a warning per epoch)
    for key, value in resolution.options.items():
        target = next(args for args in (training_args, data_args, model_args) if hasattr(args, key))
        setattr(target, key, value)
    if training_args.process_index == 0:
        fixed = {key: getattr(training_args, key) for key in PARSE_TIME_DEFAULTS if key not in given}
        effective = _model_fields(model_args, recipe["model"])[1]
        print("\n".join(resolution.describe(effective) + [
            "[deepnmt]   " + ", ".join(f"--{key} {getattr(value, 'value', value)}" for key, value in fixed.items()),
            f"[deepnmt]   --label_smoothing_factor {training_args.label_smoothing_factor}"]), file=sys.stderr)


def default_output_dir(model_args: ModelArguments, recipe: dict) -> str:
    """``runs/<recipe or model type>-<date>-<time>``, a new folder for a run that named none."""
    from datetime import datetime

    name = Path(model_args.recipe).stem if model_args.recipe else (
        model_args.model_type or recipe["model"].get("model_type") or "deep_transformer")
    return f"runs/{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def print_train_summary(outcome: "TrainOutcome", elapsed: float) -> None:
    """What `deepnmt train` prints at the end (rank 0): the folder, the scores and how to use the model."""
    if not outcome.trainer.is_world_process_zero():
        return
    folder, scores = outcome.output_dir, outcome.test_scores
    beams = outcome.model_args.eval_num_beams
    print("\n".join([
        "",
        f"deepnmt train finished in {elapsed / 60:.1f} min ({outcome.timings.get('train_seconds', 0) / 60:.1f} min "
        f"training, {outcome.trainer.state.global_step} steps) -> {folder}",
        f"test ({scores.num_sentences} sentences, beam {beams}): BLEU {scores.bleu}  chrF {scores.chrf}  "
        f"TER {scores.ter}" if scores else "test: not evaluated (pass --test_file to score the model)",
        f"model card: {folder / 'README.md'}   metrics: {folder / 'metrics.json'}",
        f"translate:  deepnmt translate --model_name_or_path {folder} --input FILE --num_beams {beams}",
        f"score:      deepnmt evaluate --model_name_or_path {folder} --test_file FILE "
        f"--source_lang {outcome.data_args.source_lang} --target_lang {outcome.data_args.target_lang}",
    ]), file=sys.stdout)


def _load_or_train_tokenizer(model_args: ModelArguments, data_args: DataArguments, training_args, train_corpus):
    if model_args.tokenizer_name or model_args.model_name_or_path or model_args.warm_start_from:
        return AutoTokenizer.from_pretrained(model_args.tokenizer_name or model_args.model_name_or_path
                                             or model_args.warm_start_from)
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(desc="joint BPE"):
        if (output_dir / "tokenizer.json").exists():  # resuming, or another process trained it
            return AutoTokenizer.from_pretrained(output_dir)
        if train_corpus is None:
            raise ValueError("No tokenizer: pass --tokenizer_name or training data to train a joint BPE on.")
        limit = max(data_args.max_source_length, data_args.max_target_length)
        print(f"[deepnmt] training a joint BPE ({model_args.vocab_size} tokens) on {len(train_corpus)} pairs",
              file=sys.stderr)
        return train_and_save(train_corpus.sources, train_corpus.targets, output_dir,
                              vocab_size=model_args.vocab_size, min_frequency=model_args.bpe_min_frequency,
                              model_max_length=limit, show_progress=training_args.local_process_index == 0
                              and not training_args.disable_tqdm)


def _model_fields(model_args: ModelArguments, recipe_model: dict) -> tuple[str, dict]:
    """The model type and config fields of a model trained from scratch: preset / recipe, then --config_overrides,
    --model_type on top."""
    fields = load_model_config_dict(model_args.config_name, recipe_model)
    overrides = parse_overrides(model_args.config_overrides)
    fields.update(overrides)
    model_type = model_args.model_type or fields.pop("model_type", "deep_transformer")
    fields.pop("model_type", None)
    check_override_keys(model_type, overrides)
    return model_type, fields


def check_override_keys(model_type: str, overrides: dict[str, Any]) -> None:
    """A ``--config_overrides`` key that the model type's config does not have is a typo (transformers would store it
    beside the real field and nothing would read it): one sentence with the close matches."""
    import difflib
    import inspect

    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        raise ValueError(f"`model_type` = {model_type!r} is not allowed; use one of deep_transformer, "
                         "admin_transformer, deep_decoder_transformer, deep_representation_transformer, dtmt.")
    config_class = CONFIG_MAPPING[model_type]
    known = set(inspect.signature(config_class.__init__).parameters) | set(config_class().to_dict())
    known -= {"self", "kwargs"}
    for key, value in overrides.items():
        if key not in known:
            config_class(**{key: value})  # a config that refuses the field by name says why (e.g. DTMT's refusals)
            close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else "see `deepnmt train --help` and the presets"
            raise ValueError(f"--config_overrides: `{key}` is not a field of {config_class.__name__} "
                             f"({model_type}); {hint}")


def _build_model(model_args: ModelArguments, data_args: DataArguments, recipe_model: dict, tokenizer,
                 label_smoothing: float = 0.0):
    """The model to train: fine-tuned, warm-started or new, its config recording the language pair it is trained
    for (`hf_deepnmt.record_language_pair`, read by ``pipeline("translation")`` to check ``src_lang``/``tgt_lang``)."""
    model = _new_or_loaded_model(model_args, data_args, recipe_model, tokenizer, label_smoothing)
    record_language_pair(model.config, data_args.source_lang, data_args.target_lang)
    return model


def _new_or_loaded_model(model_args: ModelArguments, data_args: DataArguments, recipe_model: dict, tokenizer,
                         label_smoothing: float):
    if model_args.model_name_or_path:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
        if hasattr(model.config, "label_smoothing"):
            model.config.label_smoothing = label_smoothing
        return model
    model_type, fields = _model_fields(model_args, recipe_model)
    fields.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        unk_token_id=tokenizer.unk_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    longest = max(data_args.max_source_length, data_args.max_target_length)
    fields.setdefault("max_position_embeddings", max(1024, longest))
    if fields["max_position_embeddings"] < longest:
        raise ValueError(
            f"`max_position_embeddings` = {fields['max_position_embeddings']} is not allowed with "
            f"--max_source_length/--max_target_length {longest}; it must be at least as long."
        )
    fields["label_smoothing"] = label_smoothing  # the objective the model is trained with, recorded in its config
    config = AutoConfig.for_model(model_type, **fields)
    if model_args.warm_start_from:
        if model_args.model_name_or_path:
            raise ValueError("--warm_start_from and --model_name_or_path exclude each other: fine-tune a model with "
                             "the latter, or start a new one from a trained model's weights with the former.")
        from hf_deepnmt import warm_start

        model = warm_start(model_args.warm_start_from, config=config)
        print(f"[deepnmt] warm start: {config.model_type} initialised from {model_args.warm_start_from}",
              file=sys.stderr)
        return model
    return AutoModelForSeq2SeqLM.from_config(config)


def _lr_scheduler_factory(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments):
    if model_args.lr_schedule is None:
        return None
    if model_args.lr_schedule not in SCHEDULES:
        raise ValueError(f"`--lr_schedule` = {model_args.lr_schedule!r} is not allowed; use one of {list(SCHEDULES)} "
                         "or leave it unset (--lr_scheduler_type).")
    replicas = model_args.lr_replicas or training_args.world_size * training_args.gradient_accumulation_steps
    return rnnplus_scheduler_factory(int(training_args.warmup_steps), model_args.lr_decay_start,
                                     model_args.lr_decay_end, replicas)


def _resume_target(training_args: Seq2SeqTrainingArguments) -> str | None:
    requested = training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    existing = last_checkpoint(output_dir)
    if requested in (None, "", "False", "false"):
        if existing is not None or (Path(output_dir) / "model.safetensors").exists():
            found = Path(existing).name if existing else "a trained model"
            raise ValueError(
                f"--output_dir {output_dir} already holds {found}; continue it with --resume_from_checkpoint last, "
                "or train into a new --output_dir (nothing a run trained is overwritten)."
            )
        return None
    if requested in ("last", "True", "true"):
        if existing is None:
            raise ValueError(f"--resume_from_checkpoint last: {output_dir} holds no complete checkpoint-N yet.")
        target = existing
    elif not Path(requested).is_dir():
        raise ValueError(f"--resume_from_checkpoint {requested!r} is not a checkpoint folder.")
    else:
        target = requested
    problem = checkpoint_problem(target)
    if problem:  # damaged after it was written (the saves themselves are atomic): name it, offer the newest good one
        good = next((c for c in checkpoints_newest_first(output_dir) if Path(c) != Path(target)
                     and not checkpoint_problem(c)), None)
        offer = (f"the newest complete checkpoint is {good}: move {Path(target).name} away and resume with "
                 f"--resume_from_checkpoint {good}" if good else f"{output_dir} holds no other complete checkpoint")
        raise ValueError(f"--resume_from_checkpoint {requested}: {target} cannot be resumed from ({problem}); "
                         f"{offer}.")
    return target


def environment_summary() -> dict[str, str]:
    """Hardware and library versions, for metrics files and cards."""
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)",
        "torch_threads": str(torch.get_num_threads()),
    }


# ------------------------------------------------------------------------------------------------ translate / evaluate
def new_token_budget(source_tokens: int, limit: int) -> int:
    """How many tokens a translation of a ``source_tokens``-token source may have: 1.5 × the source + 10, at most
    ``limit`` − 1 (the decoder start token takes one position). `deepnmt translate`'s default and, applied to the
    longest validation source, the NMT default ``generation_max_length`` (= this + 1) of evaluation in training."""
    return min(limit - 1, int(1.5 * source_tokens) + 10)


@torch.no_grad()
def translate_sentences(
    model,
    tokenizer,
    sentences: Sequence[str],
    num_beams: int = 4,
    batch_size: int = 32,
    max_new_tokens: int | None = None,
    progress: bool = True,
    desc: str = "translating",
    bf16: bool = False,
) -> list[str]:
    """Translate in length-sorted batches (original order restored); an empty line translates to "".

    ``model`` is a PyTorch model (run with `generate`, under bf16 autocast with ``bf16``) or an engine of
    `hf_deepnmt.export.load_engine` (CTranslate2, ONNX Runtime): the batching and the output are the same.
    """
    from tqdm.auto import tqdm

    from hf_deepnmt.export import TorchEngine

    engine = TorchEngine(model, bf16=bf16) if isinstance(model, torch.nn.Module) else model
    limit = min(tokenizer.model_max_length, engine.max_positions)
    order = sorted((i for i, s in enumerate(sentences) if s.strip()), key=lambda i: len(sentences[i]), reverse=True)
    results = [""] * len(sentences)
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc=desc, disable=not progress, file=sys.stderr):
        encoded = tokenizer([sentences[i] for i in batch], truncation=True, max_length=limit)["input_ids"]
        new_tokens = max_new_tokens or new_token_budget(max(map(len, encoded)), limit)
        output = engine.generate(encoded, num_beams=num_beams, max_new_tokens=new_tokens)
        for i, text in zip(batch, tokenizer.batch_decode(output, skip_special_tokens=True)):
            results[i] = text.strip()
    return results


def translate_windows(model, tokenizer, lines: Iterable[str], window: int = 10_000, batch_size: int = 32,
                      progress: Any = None, **options: Any) -> Iterator[str]:
    """`translate_sentences` over a stream of lines of any length, with bounded memory: reads ``window`` lines,
    sorts them by length into batches (the speed of sorted batching), yields their translations in input order,
    then reads on. At most ``window`` lines and their translations are held at a time; ``window = batch_size`` is
    the lowest latency (pipes, interactive use). ``progress``, a tqdm bar, is advanced by the lines translated."""
    if window < 1 or batch_size < 1:
        raise ValueError(f"`window` = {window} and `batch_size` = {batch_size} must both be ≥ 1.")
    chunk: list[str] = []
    for line in lines:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) == window:
            yield from translate_sentences(model, tokenizer, chunk, batch_size=batch_size, progress=False, **options)
            if progress is not None:
                progress.update(len(chunk))
            chunk = []
    if chunk:
        yield from translate_sentences(model, tokenizer, chunk, batch_size=batch_size, progress=False, **options)
        if progress is not None:
            progress.update(len(chunk))


def translate_stream(model, tokenizer, lines: Iterable[str], batch_size: int = 32, **options: Any) -> Iterator[str]:
    """`translate_windows` with a window of one batch: each batch's translations come out before the next batch is
    read (for pipes and interactive use)."""
    yield from translate_windows(model, tokenizer, lines, window=batch_size, batch_size=batch_size, **options)


def completed_lines(path: str | os.PathLike) -> int:
    """How many complete lines (ending in a newline) an interrupted output file holds; a torn last line, written
    when the run was killed, is cut off so that appending continues at a line boundary."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with open(path, "r+b") as handle:
            handle.truncate(keep)
    return data[:keep].count(b"\n")


def evaluate_model(
    model_dir: str | os.PathLike,
    test_file: str,
    source_lang: str,
    target_lang: str,
    num_beams: int = 4,
    batch_size: int = 32,
    max_samples: int | None = None,
    model=None,
    tokenizer=None,
    corpus=None,
) -> tuple[TranslationScores, list[str]]:
    """BLEU/chrF/TER of a saved model on a test file (any format `training.data` reads), with beam search.
    ``model``, ``tokenizer`` and ``corpus`` (the file already read) save loading them again."""
    if corpus is None:
        corpus = read_parallel_file(resolve_path(test_file), source_lang, target_lang, max_samples)
    if model is None:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hypotheses = translate_sentences(model, tokenizer, corpus.sources, num_beams=num_beams, batch_size=batch_size,
                                     desc=f"evaluating (beam {num_beams})")
    return score_translations(hypotheses, corpus.targets), hypotheses


def corpus_source_reliance(model, tokenizer, sources: Sequence[str], targets: Sequence[str],
                           max_pairs: int = 64) -> float:
    """li2022's collapse monitor (docs/li2022.md, `hf_deepnmt.losses.source_reliance`) on the first ``max_pairs``
    non-empty pairs: ≈ 0 nats/token for a decoder that ignores its source, clearly positive for one that uses it."""
    from hf_deepnmt.losses import source_reliance

    pairs = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()][:max_pairs]
    if not pairs:
        raise ValueError("source reliance needs at least one non-empty sentence pair.")
    limit = min(tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", 1024))
    encoded = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True, truncation=True,
                        max_length=limit, return_tensors="pt").to(model.device)
    labels = encoded["labels"].masked_fill(encoded["labels"] == tokenizer.pad_token_id, -100)
    return source_reliance(model, {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
                                   "labels": labels})


# ------------------------------------------------------------------------------------------------ train
def train(argv: Sequence[str]) -> TrainOutcome:
    """`deepnmt train`: data -> tokenizer -> model -> DeepNMTTrainer -> saved model, card, plots, metrics."""
    started = time.time()
    model_args, data_args, training_args, recipe = parse_train_args(argv)
    lr_scheduler_factory = _lr_scheduler_factory(model_args, training_args)
    if not model_args.model_name_or_path:  # a bad model config fails now, not after the tokenizer is trained
        model_type, fields = _model_fields(model_args, recipe["model"])
        AutoConfig.for_model(model_type, **fields)
    push_repo = training_args.hub_model_id if training_args.push_to_hub else None
    if training_args.push_to_hub:
        training_args.push_to_hub = False  # we push once, at the end, with our card (training.hub)
        if not push_repo:
            raise ValueError("--push_to_hub needs --hub_model_id USER/NAME.")
    set_seed(training_args.seed)
    resume = _resume_target(training_args)
    output_dir = Path(training_args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    corpora = load_splits(data_args, ["train"])
    if "train" not in corpora:
        raise DataError("No training data: pass --train_file (or --dataset_name) or a recipe that has one.")
    if model_args.nmt_defaults:  # from scratch, no recipe: model size etc. from the data size (training.defaults)
        apply_scratch_defaults(model_args, data_args, training_args, recipe, len(corpora["train"]),
                               given_options(canonical_options(argv, TRAIN_ALIASES)))
    if training_args.eval_strategy != "no" or training_args.do_eval:
        corpora.update(load_splits(data_args, ["validation"]))
    tokenizer = _load_or_train_tokenizer(model_args, data_args, training_args, corpora["train"])
    model = _build_model(model_args, data_args, recipe["model"], tokenizer, training_args.label_smoothing_factor)
    model.generation_config.num_beams = model_args.eval_num_beams
    datasets = {
        split: tokenize_corpus(
            corpus, tokenizer, data_args.max_source_length,
            data_args.max_target_length if split == "train" else (data_args.val_max_target_length or data_args.max_target_length),
            data_args.filter_max_length if split == "train" else None,
            data_args.filter_max_ratio if split == "train" else None,
            data_args.source_prefix,
        )
        for split, corpus in corpora.items()
    }
    if model_args.nmt_defaults and "validation" in datasets and training_args.generation_max_length is None:
        # transformers' default (20 tokens) cuts most translations short, the truncation length (256) lets an
        # untrained model babble for minutes: translate's rule for the longest validation source
        longest = max((len(ids) for ids in datasets["validation"]["input_ids"]), default=0)
        limit = data_args.val_max_target_length or data_args.max_target_length
        training_args.generation_max_length = new_token_budget(longest, limit) + 1  # + the decoder start token
        print(f"[deepnmt]   --generation_max_length {training_args.generation_max_length} (translate's length "
              f"rule, 1.5 × source + 10 new tokens, for the longest validation source: {longest} tokens)",
              file=sys.stderr)
    for split, corpus in corpora.items():
        print(f"[deepnmt] {split}: {len(datasets[split])} pairs from {corpus.origin} "
              f"(dropped {corpus.dropped_empty} empty, {corpus.dropped_length} by length filters)", file=sys.stderr)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100,
                                      pad_to_multiple_of=8 if (training_args.fp16 or training_args.bf16) else None)
    metrics = TranslationMetrics(tokenizer) if training_args.predict_with_generate else None
    if model_args.optimizer not in (None, "radam"):
        raise ValueError(f"`--optimizer` = {model_args.optimizer!r} is not allowed; use 'radam' or leave it unset (--optim).")
    optimizer = None
    if model_args.optimizer == "radam":
        optimizer = (torch.optim.RAdam, {"lr": training_args.learning_rate, "eps": training_args.adam_epsilon,
                                         "betas": (training_args.adam_beta1, training_args.adam_beta2)})
    trainer = DeepNMTTrainer(
        model=model,
        args=training_args,
        optimizer_cls_and_kwargs=optimizer,
        lr_scheduler_factory=lr_scheduler_factory,
        admin_profile_tokens=model_args.admin_profile_tokens,
        train_dataset=datasets["train"],
        eval_dataset=datasets.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=metrics,
        max_tokens=data_args.max_tokens,
    )
    if model_args.max_train_minutes is not None:
        trainer.add_callback(TimeBudget(model_args.max_train_minutes))
    # Seq2SeqTrainer's evaluation writes transformers' global defaults (max_length=20, …) into the model's
    # generation config; save the model with the one it was built with.
    generation_config = copy.deepcopy(model.generation_config)
    trained = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    trained = time.time() - trained
    trainer.model.generation_config = generation_config
    trainer.save_model(str(output_dir))
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    outcome = TrainOutcome(output_dir, trainer, tokenizer, data_args, model_args, training_args,
                           timings={"train_seconds": round(trained, 1)})

    if trainer.is_world_process_zero():
        if data_args.test_file:
            test_model = trainer.model
            if trainer.is_fsdp_enabled:
                # A sharded model runs only with every process taking part: process 0 translates with the full
                # weights save_model just gathered and wrote.
                test_model = AutoModelForSeq2SeqLM.from_pretrained(output_dir).to(training_args.device)
            test_model.eval()
            scored = time.time()
            outcome.test_scores, hypotheses = evaluate_model(
                output_dir, data_args.test_file, data_args.source_lang, data_args.target_lang,
                num_beams=model_args.eval_num_beams, batch_size=training_args.per_device_eval_batch_size,
                max_samples=data_args.max_predict_samples, model=test_model, tokenizer=tokenizer)
            outcome.timings["test_seconds"] = round(time.time() - scored, 1)
            (output_dir / "test_translations.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
        outcome.timings["total_seconds"] = round(time.time() - started, 1)
        finish_run(outcome, metrics)
        if push_repo:
            files = push_folder(output_dir, push_repo, private=bool(training_args.hub_private_repo),
                                token=training_args.hub_token)
            print(f"[deepnmt] pushed {len(files)} files to https://huggingface.co/{push_repo}", file=sys.stderr)
    trainer.accelerator.wait_for_everyone()
    return outcome


# transformers' `--optim` names -> the optimizer's plain name (weight decay decides Adam vs AdamW below)
_ADAM_FAMILY = ("adamw", "adam_")
_SCHEDULE_NAMES = {
    "linear": "linear decay to 0", "inverse_sqrt": "inverse square root (Vaswani et al. 2017)",
    "cosine": "cosine decay", "cosine_with_restarts": "cosine decay with restarts", "polynomial": "polynomial decay",
    "constant": "constant", "constant_with_warmup": "constant", "reduce_lr_on_plateau": "reduce on plateau",
    "cosine_with_min_lr": "cosine decay to a minimum", "warmup_stable_decay": "warm-up, stable, decay",
}


def optimizer_description(model_args: ModelArguments, args: Seq2SeqTrainingArguments) -> str:
    """The optimizer by its plain name with its hyper-parameters, e.g. "Adam (β1 0.9, β2 0.98, ε 1e-09), peak
    learning rate 0.002, gradient clipping 1.0"."""
    optim = str(getattr(args.optim, "value", args.optim))
    betas = f"β1 {args.adam_beta1}, β2 {args.adam_beta2}, ε {args.adam_epsilon}"
    decay = f", weight decay {args.weight_decay}" if args.weight_decay else ""
    if model_args.optimizer == "radam":
        name = f"RAdam ({betas}{decay})"
    elif optim.startswith(_ADAM_FAMILY):
        name = f"AdamW ({betas}{decay})" if args.weight_decay else f"Adam ({betas})"
    else:
        name = f"{optim} (transformers' --optim){decay}"
    clip = f", gradient clipping {args.max_grad_norm}" if args.max_grad_norm else ", no gradient clipping"
    return f"{name}, peak learning rate {args.learning_rate}{clip}"


def schedule_description(model_args: ModelArguments, args: Seq2SeqTrainingArguments) -> str:
    """The learning-rate schedule by its plain name, with its warm-up."""
    if model_args.lr_schedule == "rnnplus_warmup_decay":
        return (f"meng2019 eq. (17): linear warm-up over {int(args.warmup_steps)} steps, exponential decay from step "
                f"{model_args.lr_decay_start} (halved at {model_args.lr_decay_end})")
    kind = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    steps = args.warmup_steps  # transformers 5: a step count, or a fraction of the training steps below 1
    steps = f"{int(steps)} steps" if float(steps).is_integer() else f"{steps:.0%} of the steps"
    warmup = f"linear warm-up over {steps}, then " if args.warmup_steps else ""
    return warmup + _SCHEDULE_NAMES.get(kind, kind)


def objective_description(config: Any, auxiliary: Sequence[Any] = ()) -> str:
    """Every term the model was trained with, from its config (the methods section reads the same fields)."""
    smoothing = getattr(config, "label_smoothing", 0.0) or 0.0
    terms = [f"label-smoothed NLL (ε {smoothing})" if smoothing else "NLL (no label smoothing)"]
    if getattr(config, "ddr_weight", 0.0):
        terms.append(f"{config.ddr_weight} × DDR (li2022)")
    if getattr(config, "ald_weight", 0.0):
        terms.append(f"{config.ald_weight} × ALD (li2022)")
    if getattr(config, "diversity_weight", 0.0):
        terms.append(f"− {config.diversity_weight} × L_div (dou2018 layer diversity, maximised)")
    terms += [f"{term.weight} × {term.name} (user-defined)" for term in auxiliary]
    return " + ".join(terms).replace("+ −", "−")


def finish_run(outcome: TrainOutcome, metrics: TranslationMetrics | None) -> None:
    """Write metrics.json, the plots and the model card of a finished training run."""
    output_dir, trainer = outcome.output_dir, outcome.trainer
    data_args, model_args, args = outcome.data_args, outcome.model_args, outcome.training_args
    history = trainer.state.log_history
    plots = plot_history(history, output_dir)
    last_eval = next((entry for entry in reversed(history) if "eval_bleu" in entry), {})
    report = {
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "global_step": trainer.state.global_step,
        "epochs": round(float(trainer.state.epoch or 0), 3),
        "timings_seconds": outcome.timings,
        "environment": environment_summary(),
        "validation": {key: value for key, value in last_eval.items() if key.startswith("eval_")},
        "validation_signatures": metrics.last.signatures if metrics is not None and metrics.last else None,
        "test": None if outcome.test_scores is None else {
            **outcome.test_scores.as_dict(), "sentences": outcome.test_scores.num_sentences,
            "num_beams": model_args.eval_num_beams, "signatures": outcome.test_scores.signatures},
        "plots": [path.name for path in plots],
    }
    (output_dir / "metrics.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    dataset = EMBEDDED_DATASET if str(data_args.train_file or "").startswith(str(resolve_path("corpus:"))) else {
        "dataset_name": model_args.dataset_label or data_args.dataset_name or Path(data_args.train_file or "data").name,
        "dataset_id": data_args.dataset_name,
        "dataset_description": model_args.dataset_label or data_args.dataset_name or str(data_args.train_file),
    }
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    parameters = sum(p.numel() for p in unwrapped.parameters())
    rows = []
    evaluated: dict[str, str | None] = {}
    if outcome.test_scores is not None:
        scores = outcome.test_scores
        limit = data_args.max_predict_samples
        split = f"test[:{limit}]" if limit and limit <= scores.num_sentences else "test"  # datasets' slice syntax
        rows.append(EvalRow(split, scores.num_sentences, scores.bleu, scores.chrf, scores.ter,
                            f"beam {model_args.eval_num_beams}", scores.signatures))
        test_file = Path(str(data_args.test_file))
        if dataset is EMBEDDED_DATASET and str(test_file).startswith(str(resolve_path("corpus:"))):
            evaluated = {"eval_dataset_name": f"{EMBEDDED_DATASET['dataset_name']}, held-out test books "
                                              f"({test_file.parent.name}/{test_file.name})",
                         "eval_dataset_id": EMBEDDED_DATASET["dataset_id"]}
        else:  # the file actually scored, whatever the training data was
            evaluated = {"eval_dataset_name": test_file.name, "eval_dataset_id": test_file.name}
    training = {
        "optimizer steps": trainer.state.global_step,
        "epochs": report["epochs"],
        "batching": f"{data_args.max_tokens} tokens per batch and device" if data_args.max_tokens
        else f"{args.per_device_train_batch_size} sentences per batch and device",
        "gradient accumulation": args.gradient_accumulation_steps,
        "optimizer": optimizer_description(model_args, args),
        "learning-rate schedule": schedule_description(model_args, args),
        "objective": objective_description(unwrapped.config, trainer.auxiliary_losses),
        "parameters": f"{parameters:,} ({parameters / 1e6:.1f} M)",
        "wall time": f"{outcome.timings.get('train_seconds', 0) / 60:.1f} min training, "
                     f"{outcome.timings.get('total_seconds', 0) / 60:.1f} min in all",
        "hardware": report["environment"]["device"],
        "libraries": f"torch {report['environment']['torch']}, transformers {report['environment']['transformers']}",
    }
    card = {
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "results": [asdict(row) for row in rows],
        "training": training,
        "license": model_args.license,
        "example_source": "In the beginning God created the heavens and the earth." if dataset is EMBEDDED_DATASET
        else "Hello, world!",
        **dataset,
        **evaluated,
    }
    (output_dir / "deepnmt_card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")
    write_model_card(output_dir, trainer=trainer)


# ------------------------------------------------------------------------------------------------ checkpoint averaging
def average_checkpoints(run_dir: str | os.PathLike, last: int = 10, output_dir: str | os.PathLike | None = None) -> Path:
    """Average the weights of the last ``last`` complete checkpoints of a run (liu2020 and fairseq evaluate the
    average of the last 10) into a complete model folder: weights, config, generation config, tokenizer, code."""
    from safetensors.torch import load_file

    run_dir = Path(run_dir)
    steps = sorted(int(p.name.split("-")[-1]) for p in run_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit())
    if last < 1:
        raise ValueError(f"`--last` = {last!r} is not allowed; average at least 1 checkpoint.")
    if len(steps) < last:
        raise ValueError(f"{run_dir} holds {len(steps)} checkpoint(s), fewer than --last {last}; keep more with "
                         "--save_total_limit or average fewer.")
    folders = [run_dir / f"checkpoint-{step}" for step in steps[-last:]]
    total: dict[str, torch.Tensor] = {}
    for folder in folders:
        for name, tensor in load_file(str(folder / "model.safetensors")).items():
            total[name] = total[name] + tensor.double() if name in total else tensor.double()
    model = AutoModelForSeq2SeqLM.from_pretrained(folders[-1])
    reference = model.state_dict()
    averaged = {name: (tensor / len(folders)).to(reference[name].dtype) for name, tensor in total.items()}
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"average_checkpoints: checkpoints do not match the model (missing {missing}).")
    model.tie_weights()
    output_dir = Path(output_dir) if output_dir is not None else run_dir / f"averaged-last{last}"
    model.save_pretrained(output_dir)
    tokenizer_source = folders[-1] if (folders[-1] / "tokenizer.json").exists() else run_dir
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(output_dir)
    (output_dir / "averaged_from.json").write_text(json.dumps([f.name for f in folders], indent=2) + "\n")
    return output_dir

