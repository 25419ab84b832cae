"""How long a from-scratch run will be, in passes over its training data, and the dropout chosen from that length
(issue 41; docs/defaults.md, "Dropout from the run's length").

Dropout pays when a model sees its training data many times and only slows down one that sees it a few times
(docs/defaults.md: the quickstart probes and the defaults-vs-sweep study). The number of passes (epochs) a run will
make is known before its first step:

* with ``--max_steps``: the steps over the optimizer steps of one epoch (the token batches of the training data,
  divided among the processes and the gradient-accumulation steps);
* with ``--max_train_minutes`` and no ``--max_steps``: the budget over the seconds of one training step, measured
  on a few batches of the real training data with a throw-away copy of the model (built under a forked random
  state, so that the model that trains is the one it would have been without the measurement). The validations
  inside the budget are not counted, so the estimate is an upper bound (docs/defaults.md gives the measured gap);
* otherwise: ``--num_train_epochs``.

Plumbing only: the rule itself (`hf_deepnmt_training.defaults.dropout_for_epochs`) is a table.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .data import DataError, TokenBudgetBatchSampler

MODEL_COLUMNS = ("input_ids", "attention_mask", "labels")


@dataclass(frozen=True)
class RunLength:
    """A run's planned length: ``steps`` optimizer steps (estimated for a time budget), ``steps_per_epoch`` of them
    per pass over the training data; ``how`` says where ``steps`` comes from, for the printed line."""

    steps: float
    steps_per_epoch: int
    how: str

    @property
    def epochs(self) -> float:
        return self.steps / self.steps_per_epoch


def steps_per_epoch(lengths: np.ndarray, max_tokens: int | None, batch_size: int, processes: int,
                    accumulation: int) -> int:
    """Optimizer steps of one pass over pairs of ``lengths``: token-budget batches of ``max_tokens`` (the trainer's
    `TokenBudgetBatchSampler`; sentence batches of ``batch_size`` without one), shared by ``processes`` and
    gathered ``accumulation`` at a time."""
    if len(lengths) == 0:
        return 1
    batches = len(TokenBudgetBatchSampler(lengths, max_tokens)) if max_tokens else math.ceil(len(lengths) / batch_size)
    return max(1, math.ceil(batches / max(1, processes) / max(1, accumulation)))


def measure_step_seconds(build: Callable[[], torch.nn.Module], dataset: Any, tokenizer: Any, lengths: np.ndarray,
                         max_tokens: int | None, batch_size: int, seed: int, steps: int = 4,
                         warmup: int = 2) -> float:
    """The median seconds of one training step (forward, backward, AdamW update) of the model ``build`` returns, on
    ``steps`` batches of the tokenized training ``dataset`` (the trainer's batching and collator) after ``warmup``
    untimed ones; the model is thrown away and the global random state is the same afterwards as before."""
    from transformers import DataCollatorForSeq2Seq

    if len(lengths) == 0:
        raise DataError("The training data has no pairs left (after the empty-pair and length filters), so there is "
                        "nothing to train on; check --train_file and --filter_max_length / --max_source_length.")
    if max_tokens:
        batches = TokenBudgetBatchSampler(lengths, max_tokens, seed=seed).batches_for_epoch(0)
    else:
        order = np.random.default_rng(seed).permutation(len(lengths))
        batches = [order[start:start + batch_size].tolist() for start in range(0, len(order), batch_size)]
    batches = batches[:warmup + steps]
    seconds: list[float] = []
    with torch.random.fork_rng(devices=[]):
        model = build()
        model.train()
        collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for number, indices in enumerate(batches):
            rows = dataset.select(indices)
            inputs = collator([{name: row[name] for name in MODEL_COLUMNS if name in row} for row in rows])
            started = time.perf_counter()
            model(**inputs).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if number >= warmup or len(batches) <= warmup:
                seconds.append(time.perf_counter() - started)
        del model, optimizer
    return statistics.median(seconds)


def plan_run_length(max_steps: int, unbounded_steps: int, max_train_minutes: float | None, num_train_epochs: float,
                    per_epoch: int, step_seconds: Callable[[], float]) -> RunLength:
    """The run's length: ``max_steps`` when it is set (and not the budget run's placeholder ``unbounded_steps``),
    else ``max_train_minutes`` at the measured ``step_seconds()``, else ``num_train_epochs`` passes."""
    if 0 < max_steps < unbounded_steps:
        return RunLength(float(max_steps), per_epoch, f"--max_steps {max_steps}")
    if max_train_minutes is not None:
        seconds = step_seconds()
        return RunLength(max_train_minutes * 60.0 / seconds, per_epoch,
                         f"a {max_train_minutes:g}-minute budget at {seconds:.3g} s a step (measured on the "
                         "training data; validations not counted)")
    return RunLength(num_train_epochs * per_epoch, per_epoch, f"--num_train_epochs {num_train_epochs:g}")
