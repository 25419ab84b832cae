"""Learning-rate schedules that `transformers.get_scheduler` does not offer.

``rnnplus_warmup_decay``: meng2019's schedule (Eq. (17), after RNMT+, Chen et al. 2018), as the authors' THUMT names
it::

    lr = lr0 · min(1 + t·(n − 1) / (n·p),  n,  n · (2n)^((s − n·t) / (e − s)))

t is the optimizer step, n the number of concurrent model replicas, p the warm-up parameter, s and e the first and
last step of the exponential decay (both counted in replica-steps n·t). The learning rate climbs linearly from lr0
and reaches n·lr0 at t = n·p (with one replica there is no warm-up: 1 + 0 = 1), stays at n·lr0, starts decaying
when n·t = s and reaches lr0 / 2 when n·t = e; it keeps decaying after that (the formula has no floor). meng2019 §Training Details: Zh-En lr0 = 1e-3,
p = 500, s = 8000, e = 64000 on 2 GPUs; En-De lr0 = 1e-4, p = 50, s = 200000, e = 1200000 on 8 GPUs; En-Fr
lr0 = 1e-4, p = 50, s = 400000, e = 3000000 on 8 GPUs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hf_deepnmt.errors import UserInputError

SCHEDULES = ("rnnplus_warmup_decay",)


def rnnplus_warmup_decay(step: int, warmup_steps: int, decay_start: int, decay_end: int, replicas: int) -> float:
    """The factor of lr0 at optimizer step ``step`` (Eq. (17) meng2019)."""
    n = replicas
    warmup = 1.0 + step * (n - 1) / (n * warmup_steps) if warmup_steps > 0 else float(n)
    decay = n * (2.0 * n) ** ((decay_start - n * step) / (decay_end - decay_start))
    return min(warmup, float(n), decay)


def check_rnnplus_arguments(warmup_steps: int, decay_start: int, decay_end: int, replicas: int) -> None:
    """One ValueError sentence for each argument Eq. (17) cannot use."""
    if warmup_steps < 0:
        raise UserInputError(f"rnnplus_warmup_decay: `warmup_steps` = {warmup_steps!r} is not allowed; use an integer ≥ 0.")
    if replicas < 1:
        raise UserInputError(f"rnnplus_warmup_decay: `replicas` = {replicas!r} is not allowed; use an integer ≥ 1.")
    if decay_start < 0 or decay_end <= decay_start:
        raise UserInputError(f"rnnplus_warmup_decay: decay start/end = {decay_start!r}/{decay_end!r} are not allowed; use "
                         "0 ≤ start < end (the paper's Zh-En values are 8000 and 64000).")


def rnnplus_scheduler_factory(warmup_steps: int, decay_start: int, decay_end: int,
                              replicas: int) -> Callable[[torch.optim.Optimizer, int], torch.optim.lr_scheduler.LambdaLR]:
    """A ``factory(optimizer, num_training_steps)`` for `hf_deepnmt_training.trainer.DeepNMTTrainer` (``lr_scheduler_factory``)
    that builds the `LambdaLR` of Eq. (17); the optimizer's learning rate is lr0."""
    check_rnnplus_arguments(warmup_steps, decay_start, decay_end, replicas)

    def factory(optimizer: torch.optim.Optimizer, num_training_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: rnnplus_warmup_decay(step, warmup_steps, decay_start, decay_end, replicas))

    return factory
