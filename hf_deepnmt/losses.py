"""Training losses of hf_deepnmt: pure functions plus one entry point usable from any training loop.

`compute_losses(model, batch, ...)` runs the forward pass and returns the total loss to back-propagate together
with every named component (``nll``, and one entry per auxiliary term: li2022's ``ddr`` / ``ald``, dou2018's
``div``, …) for logging. The Trainer of ``training/`` calls it; so can a plain PyTorch loop::

    out = compute_losses(model, batch, label_smoothing=0.1)
    out.loss.backward()
    print({name: value.item() for name, value in out.components.items()})

Normalisation (fairseq's): the label-smoothed NLL is *summed* over target tokens and divided by
``num_items_in_batch`` — the number of target tokens in the whole optimizer step (all gradient-accumulation
micro-batches, all processes) — so that accumulating k micro-batches equals one k-times larger batch. Without it,
the divisor is this batch's own token count (a per-token mean). Auxiliary terms are per-token means of their
micro-batch, weighted by that micro-batch's share of the step's tokens, which gives the same equivalence.

Auxiliary terms are `AuxiliaryLoss` objects (name, weight, function); `auxiliary_losses_from_config(config)`
builds the ones a model's config switches on. The paper losses register there with their issues.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100

AuxiliaryFn = Callable[[nn.Module, Mapping[str, torch.Tensor], Any], torch.Tensor]


@dataclass(frozen=True)
class AuxiliaryLoss:
    """A weighted auxiliary objective: ``total += weight * fn(model, batch, outputs)``.

    ``fn`` returns a scalar that is a per-token mean over its batch (or a per-sentence mean); it may run extra
    forward passes (e.g. a second decoder pass on ``outputs.encoder_last_hidden_state``). ``name`` is the key of
    its logged component.
    """

    name: str
    weight: float
    fn: AuxiliaryFn


@dataclass
class LossOutput:
    """What `compute_losses` returns."""

    loss: torch.Tensor
    """The scalar to back-propagate (normalised as described in the module docstring)."""
    components: dict[str, torch.Tensor] = field(default_factory=dict)
    """Detached per-token means of this batch, for logging: ``nll`` (true NLL, no smoothing),
    ``smoothed_nll`` and one entry per auxiliary term (unweighted)."""
    num_tokens: torch.Tensor | None = None
    """Non-pad target tokens in this batch."""
    outputs: Any = None
    """The main forward pass' model output (logits, encoder states, …)."""


def target_mask(labels: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """True at real target positions: labels that are neither -100 nor the pad id."""
    mask = labels != IGNORE_INDEX
    if pad_token_id is not None:
        mask &= labels != pad_token_id
    return mask


def label_smoothed_nll_loss(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float, pad_token_id: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy, *summed* over real target tokens (Szegedy et al. 2016; SPEC.md §0).

    ``loss_t = (1 − ε) · (−log p(y_t)) + ε · mean_v(−log p(v))`` — the uniform-prior form transformers' LabelSmoother
    uses. Returns ``(smoothed_sum, nll_sum, num_tokens)``; the log-softmax runs in float32.
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label_smoothed_nll_loss: `epsilon` = {epsilon!r} is not allowed; use a value in [0, 1).")
    mask = target_mask(labels, pad_token_id)  # (B, T)
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    safe_labels = labels.masked_fill(~mask, 0)
    nll = -lprobs.gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    nll_sum = (nll * mask).sum()
    if epsilon > 0.0:
        uniform = -lprobs.mean(dim=-1)  # (B, T)
        smoothed_sum = (1.0 - epsilon) * nll_sum + epsilon * (uniform * mask).sum()
    else:
        smoothed_sum = nll_sum
    return smoothed_sum, nll_sum, mask.sum()


def auxiliary_losses_from_config(config: Any) -> list[AuxiliaryLoss]:
    """The auxiliary objectives a model config switches on (none for the plain DeepTransformer).

    li2022 (``ddr_weight``, ``ald_weight``) and dou2018 (``diversity_weight``) add theirs here with their issues.
    """
    return []


def _unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and isinstance(model.module, nn.Module):  # DDP / DataParallel / compiled
        model = model.module
    return getattr(model, "_orig_mod", model)


def compute_losses(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    label_smoothing: float = 0.0,
    auxiliary: Sequence[AuxiliaryLoss] | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> LossOutput:
    """Forward ``batch`` through ``model`` and combine the training objectives.

    Args:
        model: a seq2seq model (``DeepTransformerForConditionalGeneration``, possibly wrapped by DDP).
        batch: ``input_ids``, ``attention_mask``, ``labels`` (-100 or pad for padding) and optionally
            ``decoder_input_ids`` (made from the labels when absent).
        label_smoothing: ε of the label-smoothed NLL.
        auxiliary: auxiliary terms; ``None`` means `auxiliary_losses_from_config(model.config)`.
        num_items_in_batch: target tokens of the whole optimizer step (see the module docstring); ``None`` uses
            this batch's count.
    """
    if "labels" not in batch:
        raise ValueError("compute_losses: the batch has no `labels`; training needs target sequences.")
    core = _unwrap(model)
    labels = batch["labels"]
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    if "decoder_input_ids" not in inputs:
        inputs["decoder_input_ids"] = core.prepare_decoder_input_ids_from_labels(labels)
    outputs = model(**inputs, use_cache=False)
    pad_token_id = getattr(core.config, "pad_token_id", None)
    smoothed_sum, nll_sum, num_tokens = label_smoothed_nll_loss(outputs.logits, labels, label_smoothing, pad_token_id)
    count = num_tokens.clamp(min=1).to(smoothed_sum.dtype)
    normalizer = count if num_items_in_batch is None else torch.as_tensor(
        num_items_in_batch, dtype=smoothed_sum.dtype, device=smoothed_sum.device
    ).clamp(min=1)
    share = count / normalizer  # this micro-batch's share of the optimizer step's tokens
    total = smoothed_sum / normalizer
    components = {"nll": (nll_sum / count).detach(), "smoothed_nll": (smoothed_sum / count).detach()}
    terms = auxiliary_losses_from_config(core.config) if auxiliary is None else auxiliary
    for term in terms:
        if term.name in components:
            raise ValueError(f"compute_losses: auxiliary loss name {term.name!r} is already used by another component.")
        value = term.fn(model, batch, outputs)
        if value.dim() != 0:
            raise ValueError(f"compute_losses: auxiliary loss {term.name!r} must return a scalar, got {tuple(value.shape)}.")
        components[term.name] = value.detach().float()
        total = total + term.weight * value * share
    return LossOutput(loss=total, components=components, num_tokens=num_tokens, outputs=outputs)
