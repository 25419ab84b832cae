"""What the `deepnmt` commands do: train, evaluate, translate, quickstart (the main job), push.

Each function takes plain arguments so that it can also be called from Python; `training.cli` only parses.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    set_seed,
)

import hf_deepnmt  # noqa: F401  (registers the model types)
from model_cards import EvalRow, write_model_card

from .data import DataArguments, DataError, load_splits, read_parallel_file, tokenize_corpus
from .hub import push_folder
from .metrics import TranslationMetrics, TranslationScores, score_translations
from .plots import plot_history
from .recipes import load_model_config_dict, load_recipe, parse_overrides, recipe_to_argv, resolve_path
from .schedules import SCHEDULES, rnnplus_scheduler_factory
from .tokenizer import train_and_save
from .trainer import DeepNMTTrainer, last_checkpoint

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
# Defaults of `deepnmt train` that differ from transformers' fine-tuning defaults (a recipe or the command line
# overrides them).
NMT_DEFAULTS: dict[str, Any] = {
    "label_smoothing_factor": 0.1,  # every paper of this package (and Vaswani et al. 2017) smooths labels with 0.1
}


def train_argument_parser() -> HfArgumentParser:
    """The parser of `deepnmt train`, with `NMT_DEFAULTS` in place of transformers' defaults."""
    parser = HfArgumentParser((ModelArguments, DataArguments, Seq2SeqTrainingArguments), prog="deepnmt train")
    parser.set_defaults(**NMT_DEFAULTS)
    for action in parser._actions:
        if action.dest == "label_smoothing_factor":
            action.help = ("Label smoothing ε of the training NLL (deepnmt's default 0.1, the value of every paper "
                           "of this package; transformers' own default is 0.0). Recorded in the model config as "
                           "`label_smoothing`. Evaluation losses are never smoothed.")
    return parser


def parse_train_args(argv: Sequence[str]) -> tuple[ModelArguments, DataArguments, Seq2SeqTrainingArguments, dict]:
    """Parse `deepnmt train` arguments: recipe values first, the command line on top."""
    argv = list(argv)
    recipe = {"model": {}, "data": {}, "training": {}}
    if "--recipe" in argv:
        index = argv.index("--recipe")
        if index + 1 >= len(argv):
            raise ValueError("--recipe needs a value (a YAML path or a shipped recipe name).")
        recipe = load_recipe(argv[index + 1])
    parser = train_argument_parser()
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(recipe_to_argv(recipe) + argv)
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
    for name in ("train_file", "validation_file", "test_file"):
        setattr(data_args, name, resolve_path(getattr(data_args, name)))
    return model_args, data_args, training_args, recipe


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
        return existing
    if not Path(requested).is_dir():
        raise ValueError(f"--resume_from_checkpoint {requested!r} is not a checkpoint folder.")
    return requested


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
        new_tokens = max_new_tokens or min(limit - 1, int(1.5 * max(map(len, encoded))) + 10)
        output = engine.generate(encoded, num_beams=num_beams, max_new_tokens=new_tokens)
        for i, text in zip(batch, tokenizer.batch_decode(output, skip_special_tokens=True)):
            results[i] = text.strip()
    return results


def translate_stream(model, tokenizer, lines: Iterable[str], batch_size: int = 32, **options: Any) -> Iterator[str]:
    """`translate_sentences` over a stream: reads ``batch_size`` lines, translates them as one batch and yields
    their translations in order before reading on (for pipes and interactive use)."""
    chunk: list[str] = []
    for line in lines:
        chunk.append(line.rstrip("\n"))
        if len(chunk) == batch_size:
            yield from translate_sentences(model, tokenizer, chunk, batch_size=batch_size, progress=False, **options)
            chunk = []
    if chunk:
        yield from translate_sentences(model, tokenizer, chunk, batch_size=batch_size, progress=False, **options)


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

    splits = ["train"]
    if training_args.eval_strategy != "no" or training_args.do_eval:
        splits.append("validation")
    corpora = load_splits(data_args, splits)
    if "train" not in corpora:
        raise DataError("No training data: pass --train_file (or --dataset_name) or a recipe that has one.")
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
    rows = []
    if outcome.test_scores is not None:
        scores = outcome.test_scores
        rows.append(EvalRow("test", scores.num_sentences, scores.bleu, scores.chrf, scores.ter,
                            f"beam {model_args.eval_num_beams}", scores.signatures))
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    training = {
        "optimizer steps": trainer.state.global_step,
        "epochs": report["epochs"],
        "batching": f"{data_args.max_tokens} tokens per batch and device" if data_args.max_tokens
        else f"{args.per_device_train_batch_size} sentences per batch and device",
        "gradient accumulation": args.gradient_accumulation_steps,
        "optimizer": f"{args.optim} (lr {args.learning_rate}, {model_args.lr_schedule or args.lr_scheduler_type}, "
                     f"warmup {args.warmup_steps})",
        "label smoothing": args.label_smoothing_factor,
        "auxiliary losses": ", ".join(f"{t.name} × {t.weight}" for t in trainer.auxiliary_losses) or "none",
        "parameters": f"{sum(p.numel() for p in unwrapped.parameters()) / 1e6:.1f} M",
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

