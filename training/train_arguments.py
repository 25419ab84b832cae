"""The arguments of `deepnmt train`: transformers' `Seq2SeqTrainingArguments`, our `DataArguments`, and
`ModelArguments` (model, tokenizer, card); recipes under the command line; the from-scratch NMT defaults applied to
the parsed arguments (`hf_deepnmt_training.defaults`); ``--help``'s description.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
from transformers import HfArgumentParser, Seq2SeqTrainingArguments

from hf_deepnmt.registry import MODEL_TYPES
from hf_deepnmt_model_cards.licenses import normalise_license

from .arguments import TRAIN_ALIASES, canonical_options, unknown_arguments_message
from .data import DataArguments
from .defaults import (CPU_SIZES, DROPOUT_FIELDS, GPU_SIZES, PARSE_TIME_DEFAULTS, WARMUP_BY_LENGTH_TYPES, Resolution,
                       given_options, label_smoothing_for, resolve as resolve_defaults, resolved_option_rules)
from .errors import CommandLineError, is_user_mistake
from .recipes import config_fields, load_recipe, model_fields, parse_overrides, recipe_to_argv, resolve_path
from .train_options import check_option_values, store_option_table


@dataclass
class ModelArguments:
    """Model, tokenizer and card options of `deepnmt train` (run_translation names where they exist)."""

    recipe: str | None = field(default=None, metadata={"help": "A recipe YAML (path or shipped name, e.g. quickstart); its values are defaults that the command line overrides."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "Fine-tune a saved model (folder or Hub id) instead of training from scratch (alias: --model)."})
    model_type: str | None = field(default=None, metadata={"help": "Model type of a model trained from scratch (default: the NMT defaults' size row's model — on a CPU below 200,000 pairs meng2019's DTMT#1, whose row also has a deep_transformer that this option picks, docs/defaults.md — else deep_transformer): " + "; ".join(f"{entry.model_type}, {entry.summary}" for entry in MODEL_TYPES.values()) + ". Overrides the model_type of --config_name / the recipe."})
    config_name: str | None = field(default=None, metadata={"help": "Model config: a preset name (training/presets, e.g. transformer-base), a config.json or a model folder."})
    config_overrides: str | None = field(default=None, metadata={"help": "Override config fields: 'd_model=256,encoder_layers=12'."})
    warm_start_from: str | None = field(default=None, metadata={"help": "Initialise a new model from a trained one (folder or Hub id): its weights are copied, the mechanisms it lacks (e.g. dou2018 aggregation, multi-layer attention) start from their initialisation, as dou2018 trains its models. The model comes from --recipe/--config_name/--config_overrides as usual; the tokenizer is the trained model's."})
    warm_start_new_lr_scale: float = field(default=1.0, metadata={"help": "With --warm_start_from: the parameters the trained model lacks (aggregation nodes, multi-layer attentions, ...) train at this multiple of the learning rate; 1.0 (default) treats them like the rest. docs/dou2018.md 'Warm start' gives the measurements behind the choice."})
    warm_start_freeze_steps: int = field(default=0, metadata={"help": "With --warm_start_from: hold the new parameters (learning rate 0) for this many optimizer steps while the trained ones adapt to them; 0 (default): no hold."})
    warm_start_method: str = field(default="copy", metadata={"help": "With --warm_start_from: 'copy' (default; the same layers, dou2018's warm start), or to start deeper than the trained model (more encoder_layers/decoder_layers in --config_overrides): 'grow' (Wu et al. 2019 depth growing: the trained layers at the bottom, new top layers initialised) or 'stack' (Li et al. 2020 shallow-to-deep: the new top layers are copies of the trained top layers). docs/public-checkpoints.md."})
    warm_start_hold_pretrained_steps: int = field(default=0, metadata={"help": "With --warm_start_from: hold the trained parameters (learning rate 0) for this many optimizer steps while the new ones learn (Wu et al. 2019 train grown layers on a frozen base first); 0 (default): no hold."})
    tokenizer_name: str | None = field(default=None, metadata={"help": "A saved tokenizer; without it (and without a model) a joint BPE is trained on the training data."})
    vocab_size: int = field(default=8000, metadata={"help": "Joint BPE vocabulary size when a tokenizer is trained."})
    bpe_min_frequency: int = field(default=2, metadata={"help": "Minimum merge frequency when a tokenizer is trained."})
    bpe_sample_pairs: int = field(default=1_000_000, metadata={"help": "Train the joint BPE on at most this many pairs: every pair of a smaller corpus, a seeded random sample of a larger one (docs/data.md: merge statistics settle long before WMT size, and BPE time grows with the sample, not the corpus). The trained tokenizer is cached and reused by a later run on the same data and options."})
    eval_num_beams: int = field(default=4, metadata={"help": "Beam size of the final test evaluation and of the saved generation config (alias: --num_beams)."})
    optimizer: str | None = field(default=None, metadata={"help": "'radam' trains with torch.optim.RAdam (liu2020's optimizer, not among transformers' --optim choices) using --learning_rate, --adam_beta1/2, --adam_epsilon, --weight_decay; default: --optim."})
    admin_profile_tokens: int = field(default=4096, metadata={"help": "ADMIN profiling batch size in target tokens (liu2020, docs/liu2020.md: ≥ 4k); used once, before the first step, when the model has residual_scaling=admin and is not profiled yet."})
    lr_schedule: str | None = field(default=None, metadata={"help": "'rnnplus_warmup_decay': meng2019's eq. (17) schedule (training/schedules.py) with lr0 = --learning_rate, warm-up --warmup_steps, decay from --lr_decay_start to --lr_decay_end; replaces --lr_scheduler_type. Default: --lr_scheduler_type."})
    lr_decay_start: int = field(default=8000, metadata={"help": "rnnplus_warmup_decay: s, the step where the exponential decay starts (meng2019 Zh-En: 8000)."})
    lr_decay_end: int = field(default=64000, metadata={"help": "rnnplus_warmup_decay: e, the step where the learning rate has halved from lr0 (meng2019 Zh-En: 64000)."})
    lr_replicas: int | None = field(default=None, metadata={"help": "rnnplus_warmup_decay: n, the number of concurrent model replicas (peak lr = n · lr0); default: processes × gradient accumulation steps."})
    license: str | None = field(default=None, metadata={"help": "The model's license, written into the model card's `license` field: a Hub license id (https://huggingface.co/docs/hub/repositories-licenses, e.g. apache-2.0, mit, cc-by-4.0). Default: none; the card then has no license field and says the license is unknown. Choose one the training data's license allows; `deepnmt push --license` can set it later."})
    dataset_label: str | None = field(default=None, metadata={"help": "Dataset name for the model card (default: the file or Hub name)."})
    max_train_minutes: float | None = field(default=None, metadata={"help": "Stop training after this many minutes of training (evaluations included; the run then saves, tests and writes its card as after --max_steps): a wall-clock budget, e.g. to compare setups at equal time. Without --max_steps (on the command line or in the recipe) the run trains until the budget is spent, whatever --num_train_epochs says (fairseq's --stop-time-hours); the learning-rate schedule must then not depend on the run length (inverse_sqrt, the NMT default, constant, constant_with_warmup, rnnplus_warmup_decay)."})
    early_stopping_patience: int | None = field(default=None, metadata={"help": "Stop after this many validations without a better score (validation BLEU, or loss without --predict_with_generate), Marian's --early-stopping; the best checkpoint is the one kept. Default: train to --max_steps or --max_train_minutes."})
    nmt_defaults: bool = field(default=True, metadata={"help": "A model trained from scratch without --recipe gets NMT defaults for every option the command line leaves unset: model size, learning rate, warm-up, token batch and vocabulary from the data size and device, on a CPU the dropout from the run's length in passes over the data (--max_steps, or --max_train_minutes at a step time measured before training), inverse-sqrt schedule, Adam β2 0.98, validation BLEU four times per run (docs/defaults.md); the resolved values are printed at start. false: transformers' fine-tuning defaults."})


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


def train_help_description() -> str:
    """The top of `deepnmt train --help`: the from-scratch defaults, the paper switches, recipes and presets."""
    from transformers import CONFIG_MAPPING

    from hf_deepnmt.papers import PAPERS
    from hf_deepnmt.registry import model_type_names

    from .recipes import PRESETS_DIR, RECIPES_DIR

    lines = [
        "Train a translation model: fine-tune one (--model_name_or_path), run a recipe (--recipe), or train a new one.",
        "",
        "A new model without --recipe gets NMT defaults for every option left unset (docs/defaults.md): model size,",
        "learning rate, warm-up, token batch and vocabulary from the data size and the device, inverse-sqrt schedule,",
        "label smoothing 0.1, validation BLEU; they are printed at start. The options such a run chooses from the data,",
        textwrap.fill("the device or the other options (" + ", ".join(f"--{name}" for name in resolved_option_rules())
                      + ") say how in their help, before the default that --nmt_defaults false, a --recipe or "
                      "--model_name_or_path keeps; every other (default: ...) below is that of such a run.",
                      width=110, break_on_hyphens=False),
        "",
        "Paper switches (--config_overrides KEY=VALUE,...; meng2019's with --model_type dtmt), with their defaults:",
    ]
    for paper in PAPERS.values():  # each paper's switches (hf_deepnmt.papers), with its family's plain defaults
        if paper.switches:
            defaults = CONFIG_MAPPING[model_type_names(paper.family)[0]]().to_dict()
            lines.append(textwrap.fill(f"  {paper.key}: " + ", ".join(f"{name}={defaults[name]}"
                                                                      for name in paper.switches),
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
    ``scratch_defaults`` (`hf_deepnmt_training.defaults.PARSE_TIME_DEFAULTS`) for a from-scratch run without a recipe."""
    parser = _TrainParser((ModelArguments, DataArguments, Seq2SeqTrainingArguments), prog="deepnmt train",
                         allow_abbrev=False, formatter_class=_HelpFormatter,
                         description=train_help_description())
    parser.set_defaults(**NMT_DEFAULTS, **(scratch_defaults or {}))
    rules = resolved_option_rules() if scratch_defaults is not None else {}
    for action in parser._actions:
        if action.dest == "label_smoothing_factor":
            action.help = ("Label smoothing ε of the training NLL (deepnmt's default 0.1, the value of every paper "
                           "of this package; transformers' own default is 0.0). Recorded in the model config as "
                           "`label_smoothing`. Evaluation losses are never smoothed.")
        if action.dest in rules and not action.option_strings[0].startswith("--no_"):
            # what a new model's run uses, then the parser's own default (where the NMT defaults do not apply)
            action.help = (f"{(action.help or '').rstrip()} NMT default of a new model without --recipe: "
                           f"{rules[action.dest]}. (default: %(default)s where the NMT defaults do not apply: "
                           "--nmt_defaults false, --recipe, --model_name_or_path)")
        if action.dest == "torch_compile":
            action.help = ("Compile the model with torch.compile for training (docs/training.md, 'Compiling'). A "
                           "Transformer is compiled whole by the Trainer, as one graph whose batch and length "
                           "dimensions are dynamic (batches of new shapes do not recompile); a DTMT model compiles "
                           "each timestep of its recurrence instead (compile_recurrence: the time loop stays in "
                           "Python, so new lengths do not recompile), with inductor only. Compiling takes seconds "
                           "to minutes before the first step; on CPU the compiled Transformer step was measured "
                           "slower than eager (benchmarks/RESULTS.md, 'torch.compile').")
    return parser


def parse_train_args(argv: Sequence[str]) -> tuple[ModelArguments, DataArguments, Seq2SeqTrainingArguments, dict]:
    """Parse `deepnmt train` arguments: recipe values first, the command line on top; every value is checked
    (`check_train_args`) before anything is written or loaded."""
    argv = canonical_options(argv, TRAIN_ALIASES)
    recipe = _recipe_of(argv)
    named_output_dir = any(token == "--output_dir" or token.startswith("--output_dir=")
                           for token in recipe_to_argv(recipe) + argv)
    if not named_output_dir and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and "--help" not in argv:
        raise CommandLineError("--output_dir is required when several processes train one model (every rank must "
                               "write the same folder).")
    given = given_options(argv)
    scratch_defaults = None
    if not ({"recipe", "model_name_or_path", "warm_start_from"} & given):  # from scratch: hf_deepnmt_training.defaults
        scratch_defaults = {key: value for key, value in PARSE_TIME_DEFAULTS.items() if key not in given}
        if not {"validation_file", "dataset_name"} & given:
            scratch_defaults.pop("eval_strategy", None)  # nothing to evaluate on
    parser = train_argument_parser(scratch_defaults)
    store_option_table(parser)  # for the next command line's check before torch loads (hf_deepnmt_training.train_options)
    model_args, data_args, training_args, unknown = _parse(parser, recipe_to_argv(recipe) + argv, remaining=True)
    if unknown:
        raise CommandLineError(unknown_arguments_message(unknown, list(parser._option_string_actions))
                               + " (see `deepnmt train --help`)")
    if scratch_defaults and not model_args.nmt_defaults:  # --nmt_defaults false: transformers' defaults
        parser = train_argument_parser()
        model_args, data_args, training_args = _parse(parser, recipe_to_argv(recipe) + argv)
    model_args.nmt_defaults = bool(scratch_defaults) and model_args.nmt_defaults  # True: `train` resolves the rest
    launched = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and not training_args.use_cpu and not torch.cuda.is_available():
        # transformers forms no process group on a machine without GPUs unless told to use the CPU: every process
        # would train alone on the same data and write the same folder. Use the CPU processes (gloo), as launched.
        if int(os.environ.get("RANK", "0") or 0) == 0:
            print(f"[deepnmt] {launched} processes were launched on a machine without GPUs: training on CPU "
                  "processes over gloo (--use_cpu true)", file=sys.stderr)
        model_args, data_args, training_args = _parse(parser, recipe_to_argv(recipe) + argv + ["--use_cpu", "true"])
    check_train_args(model_args, training_args, launched)
    if not named_output_dir:
        training_args.output_dir = default_output_dir(model_args, recipe)
        print(f"[deepnmt] no --output_dir given: writing the run to {training_args.output_dir}", file=sys.stderr)
    for name in ("train_file", "validation_file", "test_file"):
        setattr(data_args, name, resolve_path(getattr(data_args, name)))
    return model_args, data_args, training_args, recipe


def _recipe_of(argv: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The recipe ``--recipe`` names (empty sections without one)."""
    recipe: dict[str, dict[str, Any]] = {"model": {}, "data": {}, "training": {}}
    for index, token in enumerate(argv):
        if token == "--recipe" or token.startswith("--recipe="):
            name = token.partition("=")[2] if "=" in token else (argv[index + 1] if index + 1 < len(argv) else "")
            if not name:
                raise CommandLineError("--recipe needs a value (a YAML path or a shipped recipe name).")
            recipe = load_recipe(name)
    return recipe


def _parse(parser: HfArgumentParser, argv: list[str], remaining: bool = False) -> tuple:
    """The three argument dataclasses; transformers' own validation of a combination of options (a `ValueError` from
    `Seq2SeqTrainingArguments`) is a command-line mistake, reported in one sentence."""
    try:
        return parser.parse_args_into_dataclasses(argv, return_remaining_strings=remaining)
    except ValueError as error:
        if is_user_mistake(error):
            raise
        raise CommandLineError(f"transformers refused the training options: {error}") from None


def check_train_args(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments, launched: int) -> None:
    """The values transformers would take without complaint but that cannot be what the user meant."""
    if launched > 1 and training_args.world_size != launched:
        raise CommandLineError(f"the launcher started {launched} processes (WORLD_SIZE={launched}) but they formed a "
                               f"process group of {training_args.world_size}; each would train alone and write the "
                               "same --output_dir. Launch with torchrun/accelerate on matching devices, or run one "
                               "process.")
    check_option_values(model_args, training_args)
    model_args.license = normalise_license(model_args.license)  # checked by check_option_values


# A run with --max_train_minutes and no --max_steps runs until its budget: transformers needs a step count, so it
# gets one no budget reaches (docs/defaults.md, "A time budget is a run length").
UNBOUNDED_STEPS = 1_000_000_000


def validates_by_the_clock(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments,
                           given: set[str]) -> bool:
    """Whether a run with NMT defaults that validates by steps does so by the clock instead (`hf_deepnmt_training.
    train.plan_evaluations`): a --max_train_minutes run without --max_steps (before or after its step count became
    `UNBOUNDED_STEPS`) whose command line sets none of --eval_steps, --save_steps, --save_strategy."""
    no_step_count = training_args.max_steps <= 0 or training_args.max_steps == UNBOUNDED_STEPS
    return model_args.max_train_minutes is not None and no_step_count \
        and not {"eval_steps", "save_steps", "save_strategy"} & given


def apply_scratch_defaults(model_args: ModelArguments, data_args: DataArguments,
                           training_args: Seq2SeqTrainingArguments, recipe: dict, pairs: int,
                           given: set[str]) -> Resolution:
    """Set the data-dependent NMT defaults (`hf_deepnmt_training.defaults.resolve`) of a from-scratch run without a recipe on
    the parsed arguments, never touching an option the command line set, and print them (process 0). The returned
    resolution says whether the dropout and the warm-up are still to be chosen from the run's length
    (`hf_deepnmt_training.train.resolve_by_length`)."""
    device = "cpu" if training_args.use_cpu or not torch.cuda.is_available() else "gpu"
    resolution = resolve_defaults(pairs, device, given, bool(model_args.config_name), training_args.max_steps,
                                  model_args.model_type)
    overrides = parse_overrides(model_args.config_overrides)
    if resolution.model and not model_args.model_type:
        row_model_for_overrides(resolution, overrides, training_args.process_index == 0)
    if overrides.get("residual_scaling") == "admin" and "layer_norm_position" not in overrides \
            and resolution.model.get("model_type") == "deep_transformer":
        resolution.model["layer_norm_position"] = "post"  # ADMIN is defined on post-LN (liu2020), not pre-LN
    recipe["model"] = {**resolution.model, **recipe["model"]}
    resolution.dropout_by_length = device == "cpu" and bool(resolution.model) and not overrides.keys() & set(
        DROPOUT_FIELDS[resolution.model["model_type"]])
    resolution.warmup_by_length = device == "cpu" and resolution.model.get("model_type") in WARMUP_BY_LENGTH_TYPES \
        and "warmup_steps" in resolution.options and not 0 < training_args.max_steps  # --max_steps: capped already
    resolution.by_the_clock = training_args.eval_strategy == "steps" and validates_by_the_clock(model_args,
                                                                                             training_args, given)
    smoothing = label_smoothing_for(resolution.model, device)  # the model is final: --config_overrides picked it
    if smoothing is not None and "label_smoothing_factor" not in given:
        resolution.options["label_smoothing_factor"] = smoothing
    if device == "cpu" and "dataloader_pin_memory" not in given:
        resolution.options["dataloader_pin_memory"] = False  # nothing to pin for (and a warning per epoch)
    for key, value in resolution.options.items():
        target = next(args for args in (training_args, data_args, model_args) if hasattr(args, key))
        setattr(target, key, value)
    if training_args.process_index == 0:
        fixed = {key: getattr(training_args, key) for key in PARSE_TIME_DEFAULTS if key not in given}
        effective = model_fields(model_args.config_name, model_args.config_overrides, model_args.model_type,
                                 recipe["model"])[1]
        print("\n".join(resolution.describe(effective) + [
            "[deepnmt]   " + ", ".join(f"--{key} {getattr(value, 'value', value)}" for key, value in fixed.items())]
            + ([] if "label_smoothing_factor" in resolution.options else
               [f"[deepnmt]   --label_smoothing_factor {training_args.label_smoothing_factor}"])), file=sys.stderr)
    return resolution


def provisional_row_model(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments) -> dict[str, Any]:
    """Before the data is read (its size picks the row): the model a from-scratch run with NMT defaults will most
    likely build, for checking ``--config_overrides`` early — the first model of the device's size rows of
    ``--model_type`` (any type: the first whose config has every overridden field); empty when the defaults do not
    choose the model (``--config_name``, a recipe's model, no NMT defaults)."""
    if not model_args.nmt_defaults or model_args.config_name:
        return {}
    cpu = training_args.use_cpu or not torch.cuda.is_available()
    models = [model for row in (CPU_SIZES if cpu else GPU_SIZES) for model in (row.model, *row.alternatives)
              if model_args.model_type in (None, model["model_type"])]
    keys = parse_overrides(model_args.config_overrides).keys()
    fitting = next((model for model in models if not keys - config_fields(model["model_type"])), None)
    if fitting is None and len({model["model_type"] for model in models}) > 1:
        # a typo: no model the defaults may build has the field; the close matches of all of them, not only DTMT's
        import difflib

        from hf_deepnmt.errors import UserInputError

        types = ", ".join(dict.fromkeys(model["model_type"] for model in models))
        known = set().union(*(config_fields(model["model_type"]) for model in models))
        unknown = sorted(keys - known)
        if not unknown:  # each field is some model's, but no one model has them all
            raise UserInputError(f"--config_overrides: {', '.join(f'`{key}`' for key in sorted(keys))} are not fields "
                                 f"of one model of the NMT defaults here ({types}); pick one with --model_type.")
        close = difflib.get_close_matches(unknown[0], sorted(known), n=3, cutoff=0.6)
        raise UserInputError(
            f"--config_overrides: `{unknown[0]}` is a field of no model the NMT defaults build here ({types}); "
            + (f"did you mean {', '.join(close)}?" if close else "see `deepnmt train --help` and docs/defaults.md."))
    return dict(fitting or (models[0] if models else {}))


def row_model_for_overrides(resolution: Resolution, overrides: dict[str, Any], say: bool = True) -> None:
    """``--config_overrides`` that name fields of another of the size row's models than its default (the CPU row's
    deep_transformer for ``encoder_layers=4`` or ``cross_attention_drop_depth=5``, whose default is DTMT) select that
    model, as ``--model_type`` would, with one printed line; fields no model of the row has are left to
    `check_override_keys`, which names them."""
    unknown = sorted(overrides.keys() - config_fields(resolution.model["model_type"]))
    if not unknown:
        return
    model = next((m for m in resolution.size.alternatives if not overrides.keys() - config_fields(m["model_type"])),
                 None)
    if model is not None:
        if say:
            print(f"[deepnmt] --config_overrides {', '.join(unknown)}: field(s) of {model['model_type']}, not of "
                  f"the default {resolution.model['model_type']}: the size row's {model['model_type']} model (as "
                  f"--model_type {model['model_type']})", file=sys.stderr)
        resolution.model = dict(model)


def default_output_dir(model_args: ModelArguments, recipe: dict) -> str:
    """``runs/<recipe or model type>-<date>-<time>``, a new folder for a run that named none."""
    from datetime import datetime

    name = Path(model_args.recipe).stem if model_args.recipe else (
        model_args.model_type or recipe["model"].get("model_type") or "deep_transformer")
    return f"runs/{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
