"""`deepnmt train`: data -> tokenizer -> model -> `DeepNMTTrainer` -> saved model, test scores, card, plots, metrics.

Each stage is its own module (`train_arguments`, `data`, `build`, `trainer`, `translate`, `report`, `checkpoints`);
this one runs them in order.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)

from hf_deepnmt.errors import UserInputError

from .arguments import TRAIN_ALIASES, canonical_options, quiet_libraries
from .build import (build_model, check_torch_compile_options, load_or_train_tokenizer, lr_scheduler_factory,
                    optimizer_setting, prepare_torch_compile)
from .checkpoints import read_run_choices, resume_target
from .clock import RunClock
from .data import DataArguments, DataError, length_column
from .defaults import (DROPOUT_FIELDS, Resolution, describe_dropout_rule, dropout_for_epochs, given_options,
                       warmup_for_length)
from .hub import push_folder
from .metrics import TranslationMetrics
from .preprocess import ReadSplit, TokenizedSplit, read_split, tokenize_split
from .recipes import model_fields
from .report import TrainOutcome, finish_run
from .run_length import measure_step_seconds, plan_run_length, steps_per_epoch
from .train_arguments import (UNBOUNDED_STEPS, ModelArguments, apply_scratch_defaults, parse_train_args,
                              provisional_row_model, validates_by_the_clock)
from .trainer import DeepNMTTrainer
from .translate import evaluate_model, new_token_budget


class _Interval(TrainerCallback):
    """A callback whose ``on_interval`` runs after the step that ends ``minutes`` past the first step's start (or
    past the last interval), at the same step on every process."""

    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60.0
        self.since: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 (transformers' signature)
        if self.since is None:
            self.since = time.time()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        # every process must act at the same step: when any one is past the interval
        if any_process(self.since is not None and time.time() - self.since >= self.seconds, args.device):
            self.on_interval(args, control)
            self.since = time.time()
        return control

    def on_interval(self, args: Any, control: Any) -> None:
        raise NotImplementedError


class TimeBudget(_Interval):
    """``--max_train_minutes``: stop after the step that ends past the budget (the clock starts at the first step),
    with a final evaluation and save if the run evaluates/saves by steps."""

    def on_interval(self, args: Any, control: Any) -> None:
        control.should_training_stop = True
        control.should_evaluate = args.eval_strategy != "no"
        control.should_save = args.save_strategy != "no"


# Schedules whose learning rate at a step does not depend on the run's length (the others decay over --max_steps).
LENGTH_FREE_SCHEDULES = ("inverse_sqrt", "constant", "constant_with_warmup", "rnnplus_warmup_decay")


EVALUATIONS_PER_BUDGET = 4  # a budget run validates at a quarter, half, three quarters and the end of its minutes


def any_process(flag: bool, device: Any) -> bool:
    """``flag`` on any process of a distributed run (every process must then act at the same step); as is alone."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        value = torch.tensor([float(flag)], device=device)
        torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
        return bool(value.item())
    return flag


class TimedEvaluation(_Interval):
    """Validate and save a checkpoint every ``minutes`` of a budget run (`plan_evaluations`), the clock starting at
    the first step; `TimeBudget` adds the last evaluation when the budget ends."""

    def on_interval(self, args: Any, control: Any) -> None:
        control.should_evaluate = control.should_save = True


def plan_evaluations(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments, evaluates: bool,
                     given: set[str]) -> list[TrainerCallback]:
    """How a from-scratch run with NMT defaults spends its validations (docs/defaults.md, "A time budget is a run
    length"): a budget run validates every 1/`EVALUATIONS_PER_BUDGET` of its minutes instead of every --eval_steps;
    every such run keeps the best checkpoint by validation BLEU (validation loss without --predict_with_generate) and
    saves and tests that one at the end (transformers' ``load_best_model_at_end``); ``--early_stopping_patience N``
    stops after N validations without improvement. Options the command line gives are kept. Returns the callbacks."""
    callbacks: list[TrainerCallback] = []
    patience = model_args.early_stopping_patience
    if patience is not None and (patience < 1 or not evaluates):
        raise UserInputError(f"`--early_stopping_patience` = {patience} is not allowed here; use a positive number of "
                             "validations, in a run that validates (--validation_file and --eval_strategy steps).")
    if not (model_args.nmt_defaults and evaluates and training_args.eval_strategy == "steps"):
        if patience is not None:
            callbacks.append(EarlyStoppingCallback(early_stopping_patience=patience))
        return callbacks
    if validates_by_the_clock(model_args, training_args, given):
        training_args.eval_steps = training_args.save_steps = UNBOUNDED_STEPS  # only the clock triggers them
        callbacks.append(TimedEvaluation(model_args.max_train_minutes / EVALUATIONS_PER_BUDGET))
    same_schedule = training_args.save_strategy == "steps" and training_args.save_steps % training_args.eval_steps == 0
    if same_schedule and not {"load_best_model_at_end", "metric_for_best_model"} & given:
        training_args.load_best_model_at_end = True
        training_args.metric_for_best_model = "bleu" if training_args.predict_with_generate else "loss"
        training_args.greater_is_better = training_args.predict_with_generate
    if patience is not None:
        if not training_args.load_best_model_at_end:
            raise UserInputError("`--early_stopping_patience` needs the best checkpoint to be kept: leave "
                                 "--load_best_model_at_end and --save_strategy to the defaults, or set them so.")
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=patience))
    return callbacks


def best_checkpoint_line(state: Any, metric: str | None) -> str | None:
    """Which checkpoint the run kept and why, for the summary; None when it kept the last weights."""
    if not state.best_model_checkpoint or not metric:
        return None
    evaluations = [entry for entry in state.log_history if f"eval_{metric}" in entry]
    return (f"[deepnmt] kept the best of {len(evaluations)} validations: {Path(state.best_model_checkpoint).name} "
            f"(validation {metric} {state.best_metric:.4g}, {'higher' if metric != 'loss' else 'lower'} is better); "
            "the saved model and the test scores are that checkpoint's")


def run_until_budget(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """``--max_train_minutes`` without ``--max_steps`` (nor a recipe's): train until the budget, as fairseq's
    ``--stop-time-hours`` does, instead of stopping after ``--num_train_epochs``. The learning-rate schedule must not
    depend on the run length, since the length is unknown."""
    if model_args.max_train_minutes is None or training_args.max_steps > 0:
        return
    schedule = model_args.lr_schedule or getattr(training_args.lr_scheduler_type, "value",
                                                 training_args.lr_scheduler_type)
    if schedule not in LENGTH_FREE_SCHEDULES:
        raise UserInputError(f"`--lr_scheduler_type` = {schedule!r} decays over --max_steps, which a run of "
                             f"--max_train_minutes {model_args.max_train_minutes:g} without --max_steps does not know; "
                             f"give --max_steps too, or use one of {', '.join(LENGTH_FREE_SCHEDULES[:3])}.")
    training_args.max_steps = UNBOUNDED_STEPS
    if training_args.process_index == 0:
        print(f"[deepnmt] --max_train_minutes {model_args.max_train_minutes:g} without --max_steps: training until "
              "the budget is spent", file=sys.stderr)


def train(argv: Sequence[str], clock: RunClock | None = None) -> TrainOutcome:
    """`deepnmt train`: data -> tokenizer -> model -> DeepNMTTrainer -> saved model, card, plots, metrics.

    ``clock`` is the command's (`hf_deepnmt_training.clock`): the run time the card states runs from its start to the complete
    model folder, and is the figure the command prints; without one, the clock starts here."""
    clock = clock if clock is not None else RunClock()
    model_args, data_args, training_args, recipe = parse_train_args(argv)
    quiet_libraries()
    lr_scheduler_factory(model_args, training_args)  # a bad --lr_schedule fails now, before the data is read
    model_type = None
    if not model_args.model_name_or_path:  # a bad model config fails now, not after the tokenizer is trained
        # a new model of the NMT defaults: the size row's model it will most likely be (the data picks the row)
        model_type, fields = model_fields(model_args.config_name, model_args.config_overrides, model_args.model_type,
                                          recipe["model"] or provisional_row_model(model_args, training_args))
        AutoConfig.for_model(model_type, **fields)
    check_torch_compile_options(training_args, model_type)  # before anything is written
    push_repo = _repo_to_push(training_args)
    set_seed(training_args.seed)
    resume = resume_target(training_args)
    output_dir = Path(training_args.output_dir)
    prepared, defaults, tokenizer = _prepare_data(argv, model_args, data_args, training_args, recipe, output_dir)
    datasets = {split: entry.dataset for split, entry in prepared.items()}
    run_until_budget(model_args, training_args)
    run_choices: dict[str, Any] = {}
    if defaults is not None:  # the choices that need the tokenized data and the run's length
        run_choices = resolve_by_length(model_args, data_args, training_args, recipe, tokenizer, datasets["train"],
                                        defaults, resume)
    model = build_model(model_args, data_args, recipe["model"], tokenizer, training_args.label_smoothing_factor)
    model.generation_config.num_beams = model_args.eval_num_beams
    if model_args.eval_num_beams == 1:  # greedy: transformers refuses to save a beam-only setting beside it
        model.generation_config.early_stopping = False
    compiling = prepare_torch_compile(model, training_args)  # before the Trainer reads --torch_compile
    if compiling and training_args.process_index == 0:
        print(f"[deepnmt] {compiling}", file=sys.stderr)
    callbacks = plan_evaluations(model_args, training_args, "validation" in datasets,
                                 given_options(canonical_options(argv, TRAIN_ALIASES)))
    # built now that the NMT defaults (and the run's length) have set the warm-up it reads
    trainer = build_trainer(model, tokenizer, datasets, model_args, data_args, training_args,
                            lr_scheduler_factory(model_args, training_args))
    trainer.run_choices = run_choices
    for callback in callbacks:
        trainer.add_callback(callback)
    # Seq2SeqTrainer's evaluation writes transformers' global defaults (max_length=20, …) into the model's
    # generation config; save the model with the one it was built with.
    generation_config = copy.deepcopy(model.generation_config)
    trained = time.time()
    result = trainer.train(resume_from_checkpoint=resume)
    trained = time.time() - trained
    trainer.model.generation_config = generation_config
    kept = best_checkpoint_line(trainer.state, training_args.metric_for_best_model
                                if training_args.load_best_model_at_end else None)
    if kept and trainer.is_world_process_zero():
        print(kept, file=sys.stderr)
    trainer.save_model(str(output_dir))
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    outcome = TrainOutcome(output_dir, trainer, tokenizer, data_args, model_args, training_args,
                           timings={**data_timings(prepared, trainer), "train_seconds": round(trained, 1)},
                           clock=clock)
    if trainer.is_world_process_zero():
        _score_report_and_push(outcome, push_repo)
    trainer.accelerator.wait_for_everyone()
    return outcome


def _repo_to_push(training_args: Seq2SeqTrainingArguments) -> str | None:
    """The Hub repository `deepnmt train` pushes to once, at the end; the Trainer's own pushing is turned off."""
    push_repo = training_args.hub_model_id if training_args.push_to_hub else None
    if training_args.push_to_hub:
        training_args.push_to_hub = False  # we push once, at the end, with our card (hf_deepnmt_training.hub)
        if not push_repo:
            raise UserInputError("--push_to_hub needs --hub_model_id USER/NAME.")
    return push_repo


def _prepare_data(argv: Sequence[str], model_args: ModelArguments, data_args: DataArguments,
                  training_args: Seq2SeqTrainingArguments, recipe: dict, output_dir: Path
                  ) -> tuple[dict[str, TokenizedSplit], Resolution | None, Any]:
    """Create the run folder, read the corpora, load or train the tokenizer and tokenize every split; the tokenized
    splits, the resolved defaults and the tokenizer."""
    created = [folder for folder in (output_dir, *output_dir.parents) if not folder.exists()]  # leaf first
    output_dir.mkdir(parents=True, exist_ok=True)
    try:
        corpora, defaults = read_corpora(argv, model_args, data_args, training_args, recipe)
        tokenizer = load_or_train_tokenizer(model_args, data_args, training_args, corpora["train"])
        prepared = tokenize_corpora(corpora, tokenizer, model_args, data_args, training_args)
    except BaseException:
        for folder in created:  # data that cannot be read leaves no empty run folder behind
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return prepared, defaults, tokenizer


def _score_report_and_push(outcome: TrainOutcome, push_repo: str | None) -> None:
    """The main process's end of a run: score the test set, write metrics, plots and card, push to the Hub."""
    trainer, training_args = outcome.trainer, outcome.training_args
    if outcome.data_args.test_file:
        score_test_set(outcome)
    finish_run(outcome, trainer.compute_metrics)  # stops the clock: its figure is the card's and the command's
    if push_repo:
        files = push_folder(outcome.output_dir, push_repo, private=bool(training_args.hub_private_repo),
                            token=training_args.hub_token)
        print(f"[deepnmt] pushed {len(files)} files to https://huggingface.co/{push_repo}", file=sys.stderr)


def read_corpora(argv: Sequence[str], model_args: ModelArguments, data_args: DataArguments,
                 training_args: Seq2SeqTrainingArguments, recipe: dict
                 ) -> tuple[dict[str, ReadSplit], Resolution | None]:
    """The training split (and the validation split when the run evaluates), read into Arrow once
    (`hf_deepnmt_training.preprocess.read_split`); a from-scratch run without a recipe takes its data-dependent NMT
    defaults from the training data's size here (`hf_deepnmt_training.defaults`; returned, else ``None``)."""
    path = data_args.split_file("train")
    if path is None and data_args.dataset_name is None:
        raise DataError("No training data: pass --train_file (or --dataset_name) or a recipe that has one.")
    corpora = {"train": read_split(data_args, "train", path, data_args.max_train_samples, training_args)}
    defaults = None
    if model_args.nmt_defaults:  # from scratch, no recipe: model size etc. from the data size (hf_deepnmt_training.defaults)
        defaults = apply_scratch_defaults(model_args, data_args, training_args, recipe, len(corpora["train"]),
                                          given_options(canonical_options(argv, TRAIN_ALIASES)))
    path = data_args.split_file("validation")
    if (training_args.eval_strategy != "no" or training_args.do_eval) and (path or data_args.dataset_name):
        corpora["validation"] = read_split(data_args, "validation", path, data_args.max_eval_samples, training_args)
    return corpora, defaults


def resolve_by_length(model_args: ModelArguments, data_args: DataArguments, training_args: Seq2SeqTrainingArguments,
                      recipe: dict, tokenizer: Any, train_dataset: Any, defaults: Resolution,
                      resume: str | None = None) -> dict[str, Any]:
    """The NMT defaults' choices that depend on the run's length (`hf_deepnmt_training.run_length`), printed and
    returned (option -> value, for the checkpoints):

    * the dropout (``defaults.dropout_by_length``: a CPU row, dropout not set by the command line), from the run's
      passes over the training data (`hf_deepnmt_training.defaults.dropout_for_epochs`), written into the model
      fields of ``recipe``;
    * the warm-up (``defaults.warmup_by_length``: a CPU row's DTMT without --warmup_steps or --max_steps), the row's
      capped at a fifth of the run's estimated steps (`hf_deepnmt_training.defaults.warmup_for_length`), set on
      ``training_args``.

    The run's length is measured once, for both. Every process of a distributed run takes process 0's choices (a
    measured step time differs between processes); a resumed run keeps its checkpoint's (a measurement near a
    threshold could choose another): the dropout from its config, the warm-up from `checkpoints.read_run_choices`
    (a checkpoint without one trained with the row's warm-up, which stays). A resumed run keeps its checkpoint's
    label smoothing too where the defaults chose it (`hf_deepnmt_training.defaults.label_smoothing_for`): a run
    begun by an hf_deepnmt of another rule goes on with the objective it began with."""
    chosen: dict[str, Any] = {}
    fields = DROPOUT_FIELDS[recipe["model"]["model_type"]]
    dropout_needed, warmup_needed = defaults.dropout_by_length, defaults.warmup_by_length
    saved = Path(resume) / "config.json" if resume else None
    config = json.loads(saved.read_text()) if saved is not None and saved.is_file() else {}  # the checkpoint's
    smoothing = config.get("label_smoothing")
    if "label_smoothing_factor" in defaults.options and smoothing not in (None, training_args.label_smoothing_factor):
        training_args.label_smoothing_factor = smoothing
        if training_args.process_index == 0:
            print(f"[deepnmt]   --label_smoothing_factor {smoothing}: the checkpoint's, whose run this resumes",
                  file=sys.stderr)
    if dropout_needed and "dropout" in config:
        recipe["model"].update({key: config[key] for key in fields if key in config})
        dropout_needed = False
        if training_args.process_index == 0:
            print(f"[deepnmt]   dropout {config['dropout']}: the checkpoint's, whose run this resumes",
                  file=sys.stderr)
    if warmup_needed and resume:
        warmup_needed = False
        training_args.warmup_steps = read_run_choices(resume).get("warmup_steps", training_args.warmup_steps)
        chosen["warmup_steps"] = training_args.warmup_steps
        if training_args.process_index == 0:
            print(f"[deepnmt]   --warmup_steps {training_args.warmup_steps}: the checkpoint's, whose run this "
                  "resumes", file=sys.stderr)
    if not (dropout_needed or warmup_needed):
        return chosen
    lengths = length_column(train_dataset)
    per_epoch = steps_per_epoch(lengths, data_args.max_tokens, training_args.per_device_train_batch_size,
                                training_args.world_size, training_args.gradient_accumulation_steps)

    def step_seconds() -> float:
        return measure_step_seconds(
            lambda: build_model(model_args, data_args, recipe["model"], tokenizer, training_args.label_smoothing_factor),
            train_dataset, tokenizer, lengths, data_args.max_tokens, training_args.per_device_train_batch_size,
            training_args.data_seed or training_args.seed)

    length = plan_run_length(training_args.max_steps, UNBOUNDED_STEPS, model_args.max_train_minutes,
                             training_args.num_train_epochs, per_epoch, step_seconds)
    choice = [dropout_for_epochs(length.epochs), warmup_for_length(int(training_args.warmup_steps), length.steps)]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(choice, src=0)
    dropout, warmup = choice
    said = (f"the run is {length.how}: ≈ {length.steps:,.0f} steps = {length.epochs:.1f} passes over the training "
            f"data ({per_epoch:,} steps each)")
    if dropout_needed:
        recipe["model"].update(dict.fromkeys(fields, dropout))  # every dropout of the model (`DROPOUT_FIELDS`)
        if training_args.process_index == 0:
            print(f"[deepnmt]   {' = '.join(fields)} {dropout}: {said}; {describe_dropout_rule()} (docs/defaults.md)",
                  file=sys.stderr)
    if warmup_needed:
        row = training_args.warmup_steps
        training_args.warmup_steps = chosen["warmup_steps"] = warmup
        if training_args.process_index == 0:
            print(f"[deepnmt]   --warmup_steps {warmup}: the row's {row}, at most a fifth of the run's "
                  f"≈ {length.steps:,.0f} steps (a {recipe['model']['model_type']} row's rule, docs/defaults.md)"
                  + ("" if dropout_needed else f"; {said}"), file=sys.stderr)
    return chosen


def tokenize_corpora(corpora: dict[str, ReadSplit], tokenizer: Any, model_args: ModelArguments,
                     data_args: DataArguments, training_args: Seq2SeqTrainingArguments) -> dict[str, TokenizedSplit]:
    """Every split as a tokenized, memory-mapped `datasets.Dataset` (`hf_deepnmt_training.preprocess.tokenize_split`; the
    length filters apply to training only); sets the NMT default ``generation_max_length`` from the longest
    validation source."""
    prepared = {split: tokenize_split(read, tokenizer, data_args, training_args, split, filters=split == "train")
                for split, read in corpora.items()}
    datasets = {split: entry.dataset for split, entry in prepared.items()}
    if model_args.nmt_defaults and "validation" in datasets and training_args.generation_max_length is None:
        # transformers' default (20 tokens) cuts most translations short, the truncation length (256) lets an
        # untrained model babble for minutes: translate's rule for the longest validation source
        longest = int(length_column(datasets["validation"]).max(initial=0))
        limit = data_args.val_max_target_length or data_args.max_target_length
        training_args.generation_max_length = new_token_budget(longest, limit) + 1  # + the decoder start token
        print(f"[deepnmt]   --generation_max_length {training_args.generation_max_length} (translate's length "
              f"rule, 1.5 × source + 10 new tokens, for the longest validation source: {longest} tokens)",
              file=sys.stderr)
    for split, entry in prepared.items():
        print(f"[deepnmt] {split}: {len(entry):,} pairs from {entry.read.origin} (dropped "
              f"{entry.read.dropped_empty} empty, {entry.dropped_length} by length filters)", file=sys.stderr)
    return prepared


def data_timings(prepared: dict[str, TokenizedSplit], trainer: DeepNMTTrainer) -> dict[str, float]:
    """Seconds of each data stage of the run (reading, joint BPE, tokenizing, batching), for metrics.json and the
    summary; a stage served from the cache takes the seconds of loading it."""
    return {"read_seconds": round(sum(entry.read.seconds for entry in prepared.values()), 1),
            "bpe_seconds": prepared["train"].read.bpe_seconds,
            "tokenize_seconds": round(sum(entry.seconds for entry in prepared.values()), 1),
            "batching_seconds": round(trainer.batching_seconds, 1)}


def build_trainer(model: torch.nn.Module, tokenizer: Any, datasets: dict[str, Any], model_args: ModelArguments,
                  data_args: DataArguments, training_args: Seq2SeqTrainingArguments, schedule: Any) -> DeepNMTTrainer:
    """`DeepNMTTrainer` with the collator, the metrics, the optimizer, the schedule and the time budget."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100,
                                      pad_to_multiple_of=8 if (training_args.fp16 or training_args.bf16) else None)
    trainer = DeepNMTTrainer(
        model=model,
        args=training_args,
        optimizer_cls_and_kwargs=optimizer_setting(model_args, training_args),
        lr_scheduler_factory=schedule,
        admin_profile_tokens=model_args.admin_profile_tokens,
        train_dataset=datasets["train"],
        eval_dataset=datasets.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=TranslationMetrics(tokenizer) if training_args.predict_with_generate else None,
        max_tokens=data_args.max_tokens,
        new_parameters=getattr(model, "warm_start_new_parameters", ()),
        new_parameters_lr_scale=model_args.warm_start_new_lr_scale,
        new_parameters_freeze_steps=model_args.warm_start_freeze_steps,
        pretrained_hold_steps=model_args.warm_start_hold_pretrained_steps,
    )
    if model_args.max_train_minutes is not None:
        trainer.add_callback(TimeBudget(model_args.max_train_minutes))
    return trainer


def score_test_set(outcome: TrainOutcome) -> None:
    """Process 0 translates the test file with beam search and scores it (BLEU, chrF, TER); the translations go to
    ``test_translations.txt``."""
    trainer, data_args, model_args = outcome.trainer, outcome.data_args, outcome.model_args
    test_model = trainer.model
    if trainer.is_fsdp_enabled:
        # A sharded model runs only with every process taking part: process 0 translates with the full
        # weights save_model just gathered and wrote.
        test_model = AutoModelForSeq2SeqLM.from_pretrained(outcome.output_dir).to(outcome.training_args.device)
    test_model.eval()
    scored = time.time()
    outcome.test_scores, hypotheses = evaluate_model(
        outcome.output_dir, data_args.test_file, data_args.source_lang, data_args.target_lang,
        num_beams=model_args.eval_num_beams, batch_size=outcome.training_args.per_device_eval_batch_size,
        max_samples=data_args.max_predict_samples, model=test_model, tokenizer=outcome.tokenizer)
    outcome.timings["test_seconds"] = round(time.time() - scored, 1)
    (outcome.output_dir / "test_translations.txt").write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
