"""`DeepNMTTrainer`: a thin `Seq2SeqTrainer` subclass for hf_deepnmt models.

What it adds to `Seq2SeqTrainer`:

* the objective is the model's own (label-smoothed NLL + the auxiliary terms its config switches on, computed by
  the model's forward in training mode, `hf_deepnmt.losses`), with ε = ``label_smoothing_factor``; every term is
  divided by the count of its unit over the **whole optimizer step** — target tokens (exactly the positions the loss
  uses: neither -100 nor pad), source tokens and sentences, summed over the accumulated micro-batches and over
  processes — so gradient accumulation and data parallelism give the same update as one big batch
  (docs/training.md). A stock `Seq2SeqTrainer` optimises the same objective (the model computes it), with exact
  accumulation for token-level terms only;
* every loss component (``nll``, ``ddr``, ``ald``, ``div``, …) logged on its own next to ``loss``, averaged over
  its units in the logging interval and over processes — into the Trainer logs and TensorBoard;
* ``eval_loss`` is the *unsmoothed* NLL per target token on every path (the model's evaluation-mode loss);
* fairseq-style token-budget batches (``max_tokens``) for training;
* a non-finite loss stops training at once with a clear message — before the optimizer step, so no checkpoint
  with NaN weights is ever written;
* li2022's collapse monitor: every evaluation also logs ``eval_source_reliance`` (docs/li2022.md: the mean
  per-token KL between the predictions with the real source and with an all-``<unk>`` source, on the first
  ``source_reliance_samples`` validation pairs); ≈ 0 means the decoder has collapsed into a language model;
* liu2020 ADMIN: a model with ``residual_scaling="admin"`` that is not profiled yet is profiled once on real
  training data before the first step (`hf_deepnmt.admin_profile`);
* atomic checkpoints: written to ``<output_dir>/.incomplete/checkpoint-N`` and renamed into place when complete,
  so a run killed while saving never leaves a half-written ``checkpoint-N`` that resuming would pick up;
* ``torch_compile``: the batch and length dimensions of every batch are marked dynamic and the step's unit counts
  reach the model as tensors, so the compiled model serves every batch shape and step from one graph
  (docs/training.md, "Compiling");
* refuses ``nn.DataParallel`` (several GPUs visible to one process): launch with torchrun or accelerate;
* FSDP (``training/configs/accelerate_fsdp.yaml``): parameters that a process leaves unused in a step (li2022's
  cross-attention drop) get zero gradients, so every process reduce-scatters the same tensors; a run that asked for
  FSDP on CPU processes, where accelerate does not shard, says that it trains as DDP.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import Seq2SeqTrainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from hf_deepnmt.admin import admin_profile
from hf_deepnmt.losses import UNITS, AuxiliaryLoss, LossNormalizers, batch_normalizers, compute_losses, source_reliance
from hf_deepnmt.errors import UserInputError

from .checkpoints import (INCOMPLETE_DIR, fsync_dir, fsync_tree, last_checkpoint, record_final_best_checkpoint,
                          write_run_choices, write_trainer_state)
from .errors import NonFiniteLossError
from .data import TokenBudgetBatchSampler, length_column

# transformers' private Trainer API this module relies on, and the versions it was read and tested against. Every
# override of a private method lives in `TrainerInternals`; `check_private_api` names what disappeared, in one
# sentence, when another transformers version lacks it.
CHECKED_TRANSFORMERS = "5.17 (the GPU machines) to 5.23 (this project's CI)"
PRIVATE_API = ("_prepare_for_training", "_issue_warnings_after_load", "_save_checkpoint", "_get_output_dir",
               "_remove_unused_columns")


def check_private_api(trainer_class: type = Seq2SeqTrainer) -> None:
    """Refuse, in one sentence, a transformers whose Trainer lacks a private method `TrainerInternals` overrides."""
    import transformers

    missing = [name for name in PRIVATE_API if not callable(getattr(trainer_class, name, None))]
    if missing:
        raise RuntimeError(f"DeepNMTTrainer: transformers {transformers.__version__}'s Trainer has no "
                           f"{', '.join(missing)}, which hf_deepnmt overrides (checked against transformers "
                           f"{CHECKED_TRANSFORMERS}); install a transformers version in that range.")


class TrainerInternals(Seq2SeqTrainer):
    """Every place where `DeepNMTTrainer` touches transformers' private Trainer API (`PRIVATE_API`, the
    ``_created_lr_scheduler`` flag), read against transformers `CHECKED_TRANSFORMERS`:

    * ``_prepare_for_training``: under FSDP2, zero gradients for parameters a process left unused;
    * ``_issue_warnings_after_load``: a tied ``lm_head.weight`` is not "missing" on resume;
    * ``_save_checkpoint`` (with ``_get_output_dir``): atomic checkpoint writes (with the run's length-based
      choices, ``run_choices``);
    * ``_remove_unused_columns``: the model's columns for the token-budget data loader;
    * ``_created_lr_scheduler``: a schedule built by a factory is owned by the Trainer like its own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_private_api()
        super().__init__(*args, **kwargs)

    def _mark_scheduler_created(self) -> None:
        """Tell the Trainer it created the schedule (it rebuilds its own on resume otherwise)."""
        self._created_lr_scheduler = True

    def _model_columns(self, dataset: Any) -> Any:
        """``dataset`` with only the columns the model's forward takes (the Trainer's own column filter)."""
        return self._remove_unused_columns(dataset, description="training")

    def _prepare_for_training(self, *args: Any, **kwargs: Any) -> tuple[torch.nn.Module, Any]:
        """`Trainer._prepare_for_training` (wraps the model), then, under FSDP2, zero gradients for parameters a
        process left unused.

        FSDP2 reduce-scatters, per layer, the gradients of the parameters that received one; li2022's cross-attention
        drop draws per process, so processes could reduce different sets of tensors and the collective would fail or
        hang. With zero gradients for the unused ones every process sends the same tensors (DDP's
        ``find_unused_parameters``); a model that uses every parameter in every step is unaffected.
        """
        model, train_dataloader = super()._prepare_for_training(*args, **kwargs)
        if self.is_fsdp_enabled and hasattr(model, "set_reduce_scatter_unused_params"):  # FSDP2 (`fully_shard`)
            model.set_reduce_scatter_unused_params(True)
        return model, train_dataloader

    def _issue_warnings_after_load(self, load_result: Any) -> None:
        """Resuming a model with tied embeddings: the checkpoint does not store ``lm_head.weight`` (it is the shared
        embedding), so it is not "missing" — re-tie it and warn only about keys that really are absent."""
        model = self.accelerator.unwrap_model(self.model)
        tied = set(getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {})
        missing = [key for key in load_result.missing_keys if key not in tied]
        if len(missing) < len(load_result.missing_keys):
            model.tie_weights()
        super()._issue_warnings_after_load(type(load_result)(missing, load_result.unexpected_keys))

    def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:
        """Write the checkpoint under ``.incomplete/`` and move it into place only once every file is on disk."""
        run_dir = self._get_output_dir(trial=trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging_root = os.path.join(run_dir, INCOMPLETE_DIR)
        staged, final = os.path.join(staging_root, name), os.path.join(run_dir, name)
        if self.args.should_save and os.path.exists(staged):
            shutil.rmtree(staged)  # left over by a run killed while saving
        self.accelerator.wait_for_everyone()
        self._get_output_dir = lambda trial=None: staging_root  # type: ignore[method-assign]
        try:
            super()._save_checkpoint(model, trial)
        finally:
            del self._get_output_dir
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            write_run_choices(staged, getattr(self, "run_choices", {}))
            fsync_tree(staged)
            if os.path.exists(final):
                shutil.rmtree(final)
            os.replace(staged, final)
            if not os.listdir(staging_root):
                os.rmdir(staging_root)
            fsync_dir(run_dir)
            value = self.state.best_model_checkpoint
            if isinstance(value, str) and value.startswith(staging_root):
                # the best checkpoint is the one just moved: record its final path, in memory and in the state the
                # checkpoint holds (written under .incomplete/ before the move), so that resuming finds it
                self.state.best_model_checkpoint = value.replace(staging_root, run_dir, 1)
                write_trainer_state(self.state, final)
            rotate_checkpoints(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint, use_mtime=False)
        self.accelerator.wait_for_everyone()


class EpochRunLength(TrainerCallback):
    """A run without ``--max_steps`` (transformers' -1) trains ``--num_train_epochs`` passes over its training data:
    one line says so, with the optimizer steps that makes, before the first step (a user who left ``--max_steps``
    out saw a 3-epoch run of 903 steps start with only a progress bar)."""

    def on_train_begin(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201 (transformers' signature)
        if args.max_steps <= 0 and state.is_world_process_zero:
            print(f"[deepnmt] no --max_steps: the run is --num_train_epochs {args.num_train_epochs:g} over its "
                  f"training data, {state.max_steps:,} optimizer steps; --max_steps N or --max_train_minutes M sets "
                  "another length", file=sys.stderr)
        return control


def mark_batch_dynamic(inputs: dict[str, Any]) -> None:
    """Mark the batch and length dimensions of a batch's token tensors (``(B, T)``: ids, masks, labels) dynamic for
    ``--torch_compile``, so that the first compilation already serves every batch shape. Without it torch compiles
    the first shape statically and again for each dimension that later changes (measured on a tiny model: three steps,
    new lengths at the second and a new batch size at the third, compiled 3 graphs; marked: 1). A batch of one
    sentence still gets a graph of its own (torch specialises sizes 0 and 1). docs/training.md, "Compiling"."""
    for value in inputs.values():
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            torch._dynamo.maybe_mark_dynamic(value, 0)
            torch._dynamo.maybe_mark_dynamic(value, 1)


def check_new_parameter_options(lr_scale: float, freeze_steps: int) -> None:
    """One sentence per bad value of the warm start's new-parameter options."""
    if not lr_scale > 0:
        raise UserInputError(f"`--warm_start_new_lr_scale` = {lr_scale!r} is not allowed; use a number > 0 (1.0: the "
                             "same learning rate as the trained parameters; --warm_start_freeze_steps holds them).")
    if freeze_steps < 0:
        raise UserInputError(f"`--warm_start_freeze_steps` = {freeze_steps!r} is not allowed; use 0 (no hold) or a "
                             "positive number of optimizer steps.")


def hold_new_parameters(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int, new: bool = True) -> None:
    """Multiply the schedule of every ``warm_start_new`` parameter group by 0 for its first ``steps`` steps (``new
    =False``: every other group, the trained parameters — Wu et al. 2019's frozen base while grown layers learn).

    Works on `LambdaLR` (every schedule of transformers' ``lr_scheduler_type`` and of `hf_deepnmt_training.schedules`); the
    current learning rates are recomputed, so the very first optimizer step already holds them."""
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        option = "--warm_start_freeze_steps" if new else "--warm_start_hold_pretrained_steps"
        raise UserInputError(f"`{option}` needs a LambdaLR schedule; this run's is "
                             f"{type(scheduler).__name__}: use --warm_start_new_lr_scale instead.")
    groups = scheduler.optimizer.param_groups
    for index, group in enumerate(groups):
        if bool(group.get("warm_start_new")) == new:
            schedule = scheduler.lr_lambdas[index]
            scheduler.lr_lambdas[index] = lambda step, schedule=schedule: 0.0 if step < steps else schedule(step)
    for group, base, schedule in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * schedule(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]
    scheduler._holds_new_parameters = True


class DeepNMTTrainer(TrainerInternals):
    """`Seq2SeqTrainer` with the paper losses, per-component logging, token batching, NaN guard, atomic saves.

    Args:
        max_tokens: token budget per training batch and device (fairseq ``--max-tokens``); ``None`` uses
            ``per_device_train_batch_size`` sentences per batch.
        auxiliary_losses: extra user-defined terms (`hf_deepnmt.losses.AuxiliaryLoss`) added to the model's own
            objective (the papers' terms need none: the model computes them from its config).
        admin_profile_tokens: target tokens of the ADMIN profiling batch (liu2020; used only by ADMIN models).
        source_reliance_samples: validation pairs on which every evaluation measures source reliance (li2022's
            collapse monitor, docs/li2022.md); 0 switches it off.
        optimizer_cls_and_kwargs: an optimizer class and its arguments (e.g. ``torch.optim.RAdam``), as `Trainer`.
        lr_scheduler_factory: ``factory(optimizer, num_training_steps) -> LRScheduler`` for a schedule that
            ``lr_scheduler_type`` does not offer (e.g. meng2019's, `hf_deepnmt_training.schedules`); ``None`` uses
            ``args.lr_scheduler_type``.
        new_parameters: names (as ``model.named_parameters()`` gives them) of parameters that a warm start left at
            their initialisation (`hf_deepnmt.warm_start` lists them in ``model.warm_start_new_parameters``).
        new_parameters_lr_scale: their learning rate is this multiple of the schedule's (1.0: the same as the rest).
        new_parameters_freeze_steps: their learning rate is 0 for the first this many optimizer steps.
            Why and what was measured: docs/dou2018.md, "Warm start".
        pretrained_hold_steps: the other parameters' (those the warm start copied) learning rate is 0 for the first
            this many optimizer steps: Wu et al. 2019's depth growing trains the new top layers on a frozen base
            first (docs/public-checkpoints.md).
        All other arguments are those of `Seq2SeqTrainer`. Label smoothing is ``args.label_smoothing_factor``.
    """

    # compute_loss already divides by the units of the whole accumulated step (transformers >= 5.2x reads this;
    # older versions decide from `model_accepts_loss_kwargs`, set in __init__).
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        *args: Any,
        max_tokens: int | None = None,
        auxiliary_losses: Sequence[AuxiliaryLoss] | None = None,
        admin_profile_tokens: int = 4096,
        source_reliance_samples: int = 64,
        optimizer_cls_and_kwargs: tuple[type[torch.optim.Optimizer], dict[str, Any]] | None = None,
        lr_scheduler_factory: Callable[[torch.optim.Optimizer, int], torch.optim.lr_scheduler.LRScheduler] | None = None,
        new_parameters: Sequence[str] = (),
        new_parameters_lr_scale: float = 1.0,
        new_parameters_freeze_steps: int = 0,
        pretrained_hold_steps: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        # options `deepnmt train` chose from the run's measured length (`hf_deepnmt_training.train.resolve_by_length`),
        # written into every checkpoint so that a resumed run keeps them (`checkpoints.read_run_choices`)
        self.run_choices: dict[str, Any] = {}
        check_new_parameter_options(new_parameters_lr_scale, new_parameters_freeze_steps)
        self.new_parameters = tuple(new_parameters)
        self.new_parameters_lr_scale = float(new_parameters_lr_scale)
        self.new_parameters_freeze_steps = int(new_parameters_freeze_steps)
        self.pretrained_hold_steps = int(pretrained_hold_steps)
        if self.args.n_gpu > 1:
            raise UserInputError(
                f"DeepNMTTrainer: {self.args.n_gpu} GPUs are visible to one process, so transformers would wrap the "
                "model in nn.DataParallel, which cannot split li2022's multi-view batches or count the step's units; "
                f"launch one process per GPU with `torchrun --nproc_per_node {self.args.n_gpu} -m hf_deepnmt_training.cli "
                "train ...` or `accelerate launch`, or make one GPU visible (CUDA_VISIBLE_DEVICES=0).")
        fsdp_requested = bool(self.args.fsdp) or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
        if fsdp_requested and not self.is_fsdp_enabled and self.is_world_process_zero():
            print(f"[deepnmt] FSDP was requested, but accelerate shards only on GPUs and other accelerators: this "
                  f"run trains as DDP on {self.accelerator.num_processes} {self.args.device.type.upper()} process(es), "
                  "each holding the whole model and optimizer state", file=sys.stderr)
        self.lr_scheduler_factory = lr_scheduler_factory
        if optimizer_cls_and_kwargs is not None:  # Trainer takes it, Seq2SeqTrainer's signature does not
            self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        self.max_tokens = max_tokens
        self.admin_profile_tokens = admin_profile_tokens
        if source_reliance_samples < 0:
            raise UserInputError(f"DeepNMTTrainer: `source_reliance_samples` = {source_reliance_samples!r} is not allowed; "
                             "use 0 (off) or a positive number of validation pairs.")
        self.source_reliance_samples = source_reliance_samples
        self._pending_eval_logs: dict[str, float] = {}
        self.admin_omegas: dict[str, list[float]] | None = None
        """ω per sub-layer from the ADMIN profiling pass, when this trainer ran it."""
        self.auxiliary_losses = list(auxiliary_losses) if auxiliary_losses is not None else []
        # Make the Trainer count the units of every optimizer step (`get_batch_samples`) and call compute_loss with
        # them.
        self.model_accepts_loss_kwargs = True
        self._step_normalizers: LossNormalizers | None = None
        # eval_loss: the model's own unsmoothed token-level NLL (compute_loss handles smoothing in training).
        self.label_smoother = None
        self._component_sums: dict[str, float] = {}
        self._component_counts: dict[str, float] = {}
        self.batching_seconds = 0.0  # building the token-budget batches (get_train_dataloader)
        self.add_callback(EpochRunLength())

    # ------------------------------------------------------------------------------------------------ ADMIN
    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """`Trainer.train`, preceded (on a fresh run) by liu2020's ADMIN profiling when the model needs it; a resumed
        checkpoint written before its best checkpoint's final path was recorded gets that path first
        (`hf_deepnmt_training.checkpoints.record_final_best_checkpoint`), so that the run keeps its best checkpoint."""
        if not resume_from_checkpoint:
            self._profile_admin_if_needed()
        elif isinstance(resume_from_checkpoint, str):
            if self.args.should_save:
                record_final_best_checkpoint(resume_from_checkpoint)
            self.accelerator.wait_for_everyone()
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _profile_admin_if_needed(self) -> None:
        """Profile ω once, before the first optimizer step and before DDP wraps the model (docs/liu2020.md).

        Every process profiles the same batch (the first training examples, in a seeded order, until
        ``admin_profile_tokens`` target tokens) with the same seed, so all processes — and a single-process run —
        get the same ω; DDP's start-up broadcast would make them equal anyway.
        """
        model = self.accelerator.unwrap_model(self.model)
        config = model.config
        if (getattr(config, "residual_scaling", "none") != "admin" or config.admin_init != "profiling"
                or config.admin_profiled):
            return
        batch, tokens = self._admin_profiling_batch()
        self.admin_omegas = admin_profile(model, batch)
        if self.is_world_process_zero():
            summary = "; ".join(
                f"{stack} ω_1..ω_{len(values)} = {values[0]:.3f} … {values[-1]:.3f}"
                for stack, values in self.admin_omegas.items()
            )
            print(f"[deepnmt] ADMIN profile on {tokens} target tokens: {summary}", file=sys.stderr)

    def _admin_profiling_batch(self) -> tuple[dict[str, torch.Tensor], int]:
        dataset = self.train_dataset
        order = np.random.default_rng(self.args.seed).permutation(len(dataset))  # numpy: 8 bytes per pair
        examples, tokens = [], 0
        for index in order:
            row = dataset[int(index)]
            example = {key: row[key] for key in ("input_ids", "attention_mask", "labels")}
            examples.append(example)
            tokens += len(example["labels"])
            if tokens >= self.admin_profile_tokens:
                break
        batch = self.data_collator(examples)
        device = self.accelerator.unwrap_model(self.model).device
        return {key: batch[key].to(device) for key in ("input_ids", "attention_mask", "labels")}, tokens

    # ------------------------------------------------------------------------------------------------ optimizer
    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """`Trainer.create_optimizer`; the parameters a warm start added get groups of their own (same options,
        learning rate × ``new_parameters_lr_scale``, marked ``warm_start_new``) when a scale or freeze is asked."""
        optimizer = super().create_optimizer(model)
        if not self.new_parameters or (self.new_parameters_lr_scale == 1.0 and self.new_parameters_freeze_steps == 0
                                       and self.pretrained_hold_steps == 0):
            return optimizer
        if any(group.get("warm_start_new") for group in optimizer.param_groups):
            return optimizer  # already split (create_optimizer called again)
        named = dict(self.accelerator.unwrap_model(self.model if model is None else model).named_parameters())
        unknown = [name for name in self.new_parameters if name not in named]
        if unknown:
            raise UserInputError(f"DeepNMTTrainer: `new_parameters` names {unknown[:3]}, which the model does not have; "
                                 "pass the names of model.named_parameters() (warm_start_new_parameters).")
        new_ids = {id(named[name]) for name in self.new_parameters}
        added = []
        for group in optimizer.param_groups:
            new = [parameter for parameter in group["params"] if id(parameter) in new_ids]
            if not new:
                continue
            group["params"] = [parameter for parameter in group["params"] if id(parameter) not in new_ids]
            added.append({**{key: value for key, value in group.items() if key != "params"}, "params": new,
                          "lr": group["lr"] * self.new_parameters_lr_scale, "warm_start_new": True})
        for group in added:
            optimizer.add_param_group(group)
        optimizer.param_groups[:] = [group for group in optimizer.param_groups if group["params"]]
        if self.is_world_process_zero():
            count = sum(parameter.numel() for group in added for parameter in group["params"])
            print(f"[deepnmt] warm start: {count:,} new parameters train at {self.new_parameters_lr_scale:g}× the "
                  f"learning rate" + (f", held for the first {self.new_parameters_freeze_steps} steps"
                                      if self.new_parameters_freeze_steps else "")
                  + (f"; the trained ones are held for the first {self.pretrained_hold_steps} steps"
                     if self.pretrained_hold_steps else ""), file=sys.stderr)
        return optimizer

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None
                         ) -> torch.optim.lr_scheduler.LRScheduler:
        """`Trainer.create_scheduler`, or the ``lr_scheduler_factory`` schedule when one was given; the warm start's
        new parameters held at learning rate 0 for ``new_parameters_freeze_steps`` steps."""
        if self.lr_scheduler_factory is None or self.lr_scheduler is not None:
            scheduler = super().create_scheduler(num_training_steps, optimizer)
        else:
            self.lr_scheduler = self.lr_scheduler_factory(self.optimizer if optimizer is None else optimizer,
                                                          num_training_steps)
            self._mark_scheduler_created()
            scheduler = self.lr_scheduler
        if not getattr(scheduler, "_holds_new_parameters", False):
            if self.new_parameters_freeze_steps > 0:
                hold_new_parameters(scheduler, self.new_parameters_freeze_steps)
            if self.pretrained_hold_steps > 0 and self.new_parameters:
                hold_new_parameters(scheduler, self.pretrained_hold_steps, new=False)
        return scheduler

    # ------------------------------------------------------------------------------------------------ loss
    def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: torch.device) -> tuple[list, Any]:
        """`Trainer.get_batch_samples`, plus the step's count of every loss unit (target tokens exactly as the loss
        counts them, source tokens, sentences) over all micro-batches and processes (`hf_deepnmt.losses`)."""
        batch_samples, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        if not batch_samples or "labels" not in batch_samples[0]:
            self._step_normalizers = None
            return batch_samples, None
        pad = getattr(self.accelerator.unwrap_model(self.model).config, "pad_token_id", None)
        counts = LossNormalizers(0.0, 0.0, 0.0)
        for batch in batch_samples:
            counts = counts + batch_normalizers(batch, pad)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            gathered = self.accelerator.gather(counts.as_tensor(device=device)[None])  # (world, 3)
            counts = LossNormalizers.from_tensor(gathered.sum(dim=0).cpu())
        self._step_normalizers = counts
        return batch_samples, torch.tensor(counts.target_tokens, device=device)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        training = model.training
        if training and self.args.torch_compile:
            mark_batch_dynamic(inputs)
        result = compute_losses(
            model,
            inputs,
            label_smoothing=self.args.label_smoothing_factor,
            auxiliary=self.auxiliary_losses,
            num_items_in_batch=num_items_in_batch if training else None,
            loss_normalizers=self._model_normalizers() if training else None,
        )
        loss = result.loss
        if training:
            self._stop_if_not_finite(loss, result.components)
            self._accumulate_components(result.components, result.counts)
            if self.args.average_tokens_across_devices and self.accelerator.num_processes > 1:
                # DDP averages gradients over processes; the divisors already count every process' units.
                loss = loss * self.accelerator.num_processes
        return (loss, result.outputs) if return_outputs else loss

    def _model_normalizers(self) -> LossNormalizers | None:
        """The step's unit counts as the model receives them: 0-d float64 tensors (the same values as the floats), so
        that a compiled model (``--torch_compile``) reads them as inputs; as Python floats it would guard on them and
        compile again for every step (docs/training.md, "Compiling")."""
        counts = self._step_normalizers
        if counts is None:
            return None
        return LossNormalizers(*(torch.tensor(float(getattr(counts, unit)), dtype=torch.float64) for unit in UNITS))

    def _stop_if_not_finite(self, loss: torch.Tensor, components: dict[str, torch.Tensor]) -> None:
        bad = (~torch.isfinite(loss.detach())).float()
        if self.accelerator.num_processes > 1:  # every process stops at the same step
            bad = self.accelerator.reduce(bad, reduction="sum")
        if bad.item() == 0:
            return
        last = last_checkpoint(self.args.output_dir)
        parts = ", ".join(f"{name}={value.item():.4g}" for name, value in components.items())
        raise NonFiniteLossError(
            f"Training stopped at step {self.state.global_step + 1} because the loss is "
            f"{loss.detach().float().item()} ({parts}), before any update with it, so the last good checkpoint "
            f"({last or 'none saved yet'}) is intact; lower --learning_rate, lengthen --warmup_steps or set "
            "--max_grad_norm, then resume with --resume_from_checkpoint."
        )

    def _accumulate_components(self, components: dict[str, torch.Tensor], counts: dict[str, torch.Tensor]) -> None:
        for name, value in components.items():
            count = float(counts[name])
            self._component_sums[name] = self._component_sums.get(name, 0.0) + float(value) * count
            self._component_counts[name] = self._component_counts.get(name, 0.0) + count

    # ------------------------------------------------------------------------------------------------ evaluation
    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval", **gen_kwargs: Any) -> dict[str, float]:
        """`Seq2SeqTrainer.evaluate` plus ``<prefix>_source_reliance`` (li2022 collapse monitor, docs/li2022.md)."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        extra: dict[str, float] = {}
        if self.source_reliance_samples and dataset is not None and not isinstance(dataset, dict):
            extra[f"{metric_key_prefix}_source_reliance"] = round(self.measure_source_reliance(dataset), 4)
        self._pending_eval_logs = extra
        try:
            metrics = super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
                                       **gen_kwargs)
        finally:
            self._pending_eval_logs = {}
        metrics.update(extra)
        return metrics

    def measure_source_reliance(self, dataset: Any) -> float:
        """`hf_deepnmt.losses.source_reliance` on the first ``source_reliance_samples`` pairs of ``dataset``."""
        columns = ("input_ids", "attention_mask", "labels")
        count = min(self.source_reliance_samples, len(dataset))
        features = [{key: dataset[i][key] for key in columns if key in dataset[i]} for i in range(count)]
        batch = self.data_collator(features)
        batch = {key: value.to(self.args.device) for key, value in batch.items() if key in columns}
        return source_reliance(self.model, batch)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """Add the token-weighted means of every loss component since the last training log (and, inside
        `evaluate`, the source reliance to the evaluation's log entry)."""
        if self._pending_eval_logs and any(key.endswith("_loss") for key in logs):
            logs = {**logs, **self._pending_eval_logs}
        if "loss" in logs and self._component_sums:
            names = sorted(self._component_sums)
            stacked = torch.tensor([self._component_sums[name] for name in names]
                                   + [self._component_counts[name] for name in names], dtype=torch.float64)
            if self.accelerator.num_processes > 1:
                stacked = self.accelerator.reduce(stacked.to(self.args.device), reduction="sum").cpu()
            sums, counts = stacked[:len(names)].tolist(), stacked[len(names):].tolist()
            for name, total, count in zip(names, sums, counts):
                logs[name] = round(total / max(count, 1.0), 4)
            self._component_sums, self._component_counts = {}, {}
        super().log(logs, *args, **kwargs)

    # ------------------------------------------------------------------------------------------------ data
    def get_train_dataloader(self) -> DataLoader:
        if self.max_tokens is None:
            return super().get_train_dataloader()
        dataset = self.train_dataset
        if dataset is None or "length" not in dataset.column_names:
            raise UserInputError("DeepNMTTrainer: max_tokens needs a training dataset with a `length` column "
                                 "(hf_deepnmt_training.preprocess and hf_deepnmt_training.data.tokenize_corpus add it).")
        started = time.time()
        # the lengths as one numpy array read from the Arrow column: a few bytes per pair, however large the corpus
        lengths = length_column(dataset)
        sampler = TokenBudgetBatchSampler(lengths, self.max_tokens, seed=self.args.data_seed or self.args.seed)
        self.batching_seconds = time.time() - started
        if self.is_world_process_zero() and len(lengths) >= 100_000:
            print(f"[deepnmt] batching: {len(lengths):,} pairs into {len(sampler):,} batches of ≤ {self.max_tokens} "
                  f"tokens in {self.batching_seconds:.1f} s", file=sys.stderr)
        dataset = self._model_columns(dataset)
        loader = DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
        )
        return self.accelerator.prepare(loader)

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Write hf_deepnmt's card (model_cards/) instead of the generic Trainer card."""
        from hf_deepnmt_model_cards import write_model_card

        if self.is_world_process_zero():
            write_model_card(self.args.output_dir, trainer=self)
