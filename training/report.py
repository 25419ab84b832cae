"""What a finished `deepnmt train` run writes and prints about itself: ``metrics.json``, the plots, the model card's
training details (optimizer, schedule, objective, hardware) and the closing summary.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import Seq2SeqTrainingArguments

from hf_deepnmt.papers import papers_used
from hf_deepnmt_model_cards import EvalRow, hub_dataset_id, write_model_card

from .clock import RunClock
from .metrics import TranslationMetrics
from .plots import plot_history
from .recipes import resolve_path

if TYPE_CHECKING:
    from .data import DataArguments
    from .metrics import TranslationScores
    from .train_arguments import ModelArguments
    from .trainer import DeepNMTTrainer


# The embedded corpus is no Hub dataset: no dataset id (the card's `datasets` field and model-index stay empty).
EMBEDDED_DATASET = {
    "dataset_name": "World English Bible ↔ Reina-Valera 1909 (hf_deepnmt embedded corpus)",
    "dataset_id": None,
    "dataset_description": (
        "the embedded Bible corpus of hf_deepnmt: World English Bible ↔ Reina-Valera 1909 (both public domain, "
        "exported from Debian's sword-text-web / sword-text-sparv), verse-aligned, split by held-out books"
    ),
    "data_license": (
        "The training data, the World English Bible and the Reina-Valera 1909 (hf_deepnmt's embedded corpus), is in "
        "the public domain (`DistributionLicense=Public Domain` in the SWORD modules it was exported from); that says "
        "nothing about the model's own license."
    ),
}


@dataclass
class TrainOutcome:
    """What `hf_deepnmt_training.train.train` leaves behind: the report's input (defined here, so that the
    report never imports the training stage)."""

    output_dir: Path
    trainer: DeepNMTTrainer
    tokenizer: Any
    data_args: DataArguments
    model_args: ModelArguments
    training_args: Seq2SeqTrainingArguments
    test_scores: TranslationScores | None = None
    timings: dict[str, float] = field(default_factory=dict)
    clock: RunClock = field(default_factory=RunClock)


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


def print_train_summary(outcome: TrainOutcome) -> None:
    """What `deepnmt train` prints at the end (rank 0): the folder, the run time the card states (the stopped
    `hf_deepnmt_training.clock.RunClock`), the scores and how to use the model."""
    if not outcome.trainer.is_world_process_zero():
        return
    folder, scores = outcome.output_dir, outcome.test_scores
    beams = outcome.model_args.eval_num_beams
    print("\n".join([
        "",
        f"deepnmt train finished in {outcome.clock.minutes()} ({outcome.timings.get('train_seconds', 0) / 60:.1f} min "
        f"training, {outcome.trainer.state.global_step} steps) -> {folder}",
        "data: " + "  ".join(f"{stage} {outcome.timings[f'{stage}_seconds']:.1f} s"
                             for stage in ("read", "bpe", "tokenize", "batching")
                             if f"{stage}_seconds" in outcome.timings),
        f"test ({scores.num_sentences} sentences, beam {beams}): BLEU {scores.bleu}  chrF {scores.chrf}  "
        f"TER {scores.ter}" if scores else "test: not evaluated (pass --test_file to score the model)",
        f"model card: {folder / 'README.md'}   metrics: {folder / 'metrics.json'}",
        f"translate:  deepnmt translate --model_name_or_path {folder} --input FILE --num_beams {beams}",
        f"score:      deepnmt evaluate --model_name_or_path {folder} --test_file FILE "
        f"--source_lang {outcome.data_args.source_lang} --target_lang {outcome.data_args.target_lang}",
    ]), file=sys.stdout)


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
    values = config.to_dict()
    terms += [term for paper in papers_used(values) for term in paper.loss_terms(values)]  # hf_deepnmt.papers
    terms += [f"{term.weight} × {term.name} (user-defined)" for term in auxiliary]
    return " + ".join(terms).replace("+ −", "−")


def finish_run(outcome: TrainOutcome, metrics: TranslationMetrics | None) -> None:
    """Write metrics.json, the plots and the model card of a finished training run."""
    output_dir, trainer = outcome.output_dir, outcome.trainer
    data_args, model_args = outcome.data_args, outcome.model_args
    plots = plot_history(trainer.state.log_history, output_dir)
    outcome.timings["total_seconds"] = outcome.clock.stop()  # the run time the card states and the command prints
    report = _metrics_report(outcome, metrics, plots)
    (output_dir / "metrics.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    dataset = _card_dataset(outcome)
    rows, evaluated = _card_results(outcome, dataset)
    card = {
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "results": [asdict(row) for row in rows],
        "training": _card_training(outcome, report),
        "license": model_args.license,  # the user's --license (checked), or None: no license field
        "plots": [path.name for path in plots],
        "example_source": "In the beginning God created the heavens and the earth." if dataset is EMBEDDED_DATASET
        else "Hello, world!",
        **dataset,
        **evaluated,
    }
    (output_dir / "deepnmt_card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n",
                                                 encoding="utf-8")
    write_model_card(output_dir, trainer=trainer)


def _metrics_report(outcome: TrainOutcome, metrics: TranslationMetrics | None, plots: Sequence[Path]) -> dict:
    """The content of metrics.json: steps, timings, environment, the last validation and the test scores."""
    trainer, data_args, model_args = outcome.trainer, outcome.data_args, outcome.model_args
    history = trainer.state.log_history
    last_eval = next((entry for entry in reversed(history) if "eval_bleu" in entry), {})
    return {
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


def _card_dataset(outcome: TrainOutcome) -> dict:
    """The card's training data: the embedded corpus, or the named dataset or file."""
    data_args, model_args = outcome.data_args, outcome.model_args
    return EMBEDDED_DATASET if str(data_args.train_file or "").startswith(str(resolve_path("corpus:"))) else {
        "dataset_name": model_args.dataset_label or data_args.dataset_name or Path(data_args.train_file or "data").name,
        "dataset_id": hub_dataset_id(data_args.dataset_name),  # a Hub id, never a local path or file name
        "dataset_description": model_args.dataset_label or data_args.dataset_name or str(data_args.train_file),
    }


def _card_results(outcome: TrainOutcome, dataset: dict) -> tuple[list[EvalRow], dict[str, str | None]]:
    """The card's results table (the test scores, if any) and the data they were scored on."""
    data_args, model_args = outcome.data_args, outcome.model_args
    rows = []
    evaluated: dict[str, str | None] = {}
    if outcome.test_scores is not None:
        scores = outcome.test_scores
        limit = data_args.max_predict_samples
        split = f"test[:{limit}]" if limit and limit <= scores.num_sentences else "test"  # datasets' slice syntax
        rows.append(EvalRow(split, scores.num_sentences, scores.bleu, scores.chrf, scores.ter,
                            f"beam {model_args.eval_num_beams}", scores.signatures))
        test_file = Path(str(data_args.test_file))
        # The scored data is a local file (no Hub id): the results go into the card's text, not into a model-index.
        if dataset is EMBEDDED_DATASET and str(test_file).startswith(str(resolve_path("corpus:"))):
            evaluated = {"eval_dataset_name": f"{EMBEDDED_DATASET['dataset_name']}, held-out test books "
                                              f"({test_file.parent.name}/{test_file.name})", "eval_dataset_id": None}
        else:  # the file actually scored, whatever the training data was
            evaluated = {"eval_dataset_name": test_file.name, "eval_dataset_id": None}
    return rows, evaluated


def _card_training(outcome: TrainOutcome, report: dict) -> dict:
    """The card's training section: steps, batching, optimizer, schedule, objective, size, time and hardware."""
    trainer, data_args, model_args, args = (outcome.trainer, outcome.data_args, outcome.model_args,
                                            outcome.training_args)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    parameters = sum(p.numel() for p in unwrapped.parameters())
    return {
        "optimizer steps": trainer.state.global_step,
        "epochs": report["epochs"],
        "batching": f"{data_args.max_tokens} tokens per batch and device" if data_args.max_tokens
        else f"{args.per_device_train_batch_size} sentences per batch and device",
        "gradient accumulation": args.gradient_accumulation_steps,
        "optimizer": optimizer_description(model_args, args),
        "learning-rate schedule": schedule_description(model_args, args),
        "objective": objective_description(unwrapped.config, trainer.auxiliary_losses),
        "parameters": f"{parameters:,} ({parameters / 1e6:.1f} M)",
        "wall time": wall_time(outcome),
        "hardware": report["environment"]["device"],
        "libraries": f"torch {report['environment']['torch']}, transformers {report['environment']['transformers']}",
    }


def wall_time(outcome: TrainOutcome) -> str:
    """The card's run time: the training loop's minutes, and the stopped command clock's, which the command prints
    (``deepnmt train finished in X min``)."""
    return (f"{outcome.timings.get('train_seconds', 0) / 60:.1f} min training, {outcome.clock.minutes()} in all "
            f"(from the start of `deepnmt {outcome.clock.command}` to the finished model folder, as it printed)")


def restate_run_time(outcome: TrainOutcome) -> None:
    """Stop the run's clock again after more work in the same command (the quickstart's sample translations) and
    write the new figure into ``metrics.json`` and the card, so that they state what the command prints."""
    seconds = outcome.clock.stop()
    folder = outcome.output_dir
    metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    metrics["timings_seconds"][f"{outcome.clock.command}_seconds"] = seconds
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    stored = folder / "deepnmt_card.json"
    card = json.loads(stored.read_text(encoding="utf-8"))
    card["training"]["wall time"] = wall_time(outcome)
    stored.write_text(json.dumps(card, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    write_model_card(folder, trainer=outcome.trainer)
