"""Training losses of hf_deepnmt: pure functions, the step-level normalisation, and one entry point.

The training objective of every hf_deepnmt model is computed **by the model's own forward** in training mode when
``labels`` are given (label-smoothed NLL plus every auxiliary term its config switches on: li2022's DDR and ALD,
dou2018's layer diversity), so a stock `Seq2SeqTrainer`, any plain PyTorch loop and ``training.DeepNMTTrainer``
optimise the same thing. In evaluation mode the forward returns the unsmoothed NLL per target token.
`compute_losses(model, batch, ...)` is the entry point for training loops: it calls the model and returns the
loss together with every named component (``nll``, ``smoothed_nll``, ``ddr``, ``ald``, ``div``, …)::

    out = compute_losses(model, batch, label_smoothing=0.1)
    out.loss.backward()
    print({name: value.item() for name, value in out.components.items()})

**Normalisation (docs/training.md).** Every term is a *sum over its units* divided by the number of those units in
the whole optimizer step — all gradient-accumulation micro-batches, all data-parallel processes (`LossNormalizers`):

* target tokens: the label-smoothed NLL (summed over the target tokens) and li2022's DDR (summed over the target
  tokens), dou2018's decoder diversity (summed over target positions);
* source tokens: dou2018's encoder diversity (summed over source positions);
* sentences: li2022's ALD (one contrastive term per sentence pair, Eq. (6) li2022).

So one batch, k accumulated micro-batches and k processes give the same gradient. ``DeepNMTTrainer`` counts all
three units of every step; transformers' stock `Trainer` passes only the target-token count
(``num_items_in_batch``), from which the other two are estimated by this micro-batch's share of the step's target
tokens (exact with one micro-batch per step on one process). Without either, the counts are this batch's own.

`source_reliance` is the collapse monitor described in docs/li2022.md (ours, beyond the paper).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .errors import UserInputError
from .modeling_common import unwrap_model

IGNORE_INDEX = -100

# The units a loss term averages over; `LossNormalizers` counts each per optimizer step.
UNITS: tuple[str, ...] = ("target_tokens", "source_tokens", "sentences")

AuxiliaryFn = Callable[[nn.Module, Mapping[str, torch.Tensor], Any], torch.Tensor]


# ------------------------------------------------------------------------------------------------ normalisation
@dataclass(frozen=True)
class LossNormalizers:
    """How many units of each kind the whole optimizer step holds (every micro-batch, every process).

    Each term of the objective is divided by the count of its own unit (see the module docstring), so the
    gradient of one large batch equals the sum over micro-batches and processes.
    """

    target_tokens: torch.Tensor | float
    source_tokens: torch.Tensor | float
    sentences: torch.Tensor | float

    def as_tensor(self, device: torch.device | None = None) -> torch.Tensor:
        """``(3,)`` float64 tensor in `UNITS` order (for all-reduce)."""
        return torch.tensor([float(getattr(self, unit)) for unit in UNITS], dtype=torch.float64, device=device)

    @classmethod
    def from_tensor(cls, values: torch.Tensor) -> "LossNormalizers":
        target, source, sentences = (float(v) for v in values.tolist())
        return cls(target_tokens=target, source_tokens=source, sentences=sentences)

    def __add__(self, other: "LossNormalizers") -> "LossNormalizers":
        return LossNormalizers(*(float(getattr(self, u)) + float(getattr(other, u)) for u in UNITS))


def batch_normalizers(batch: Mapping[str, torch.Tensor], pad_token_id: int | None) -> LossNormalizers:
    """The units one batch holds: target tokens exactly as the loss counts them (`target_mask`: neither -100 nor
    pad), source tokens (the attention mask, or non-pad ids), sentences (rows)."""
    labels = batch["labels"]
    input_ids = batch.get("input_ids")
    attention_mask = batch.get("attention_mask")
    if attention_mask is not None:
        source = attention_mask.sum()
    elif input_ids is not None:
        source = (input_ids != pad_token_id).sum() if pad_token_id is not None else torch.tensor(input_ids.numel())
    else:
        source = torch.tensor(0)
    return LossNormalizers(target_tokens=float(target_mask(labels, pad_token_id).sum()), source_tokens=float(source),
                           sentences=float(labels.size(0)))


def resolve_normalizers(
    local: Mapping[str, torch.Tensor],
    step: LossNormalizers | None = None,
    num_items_in_batch: torch.Tensor | int | float | None = None,
) -> dict[str, torch.Tensor]:
    """The divisor of each unit for this micro-batch's terms.

    ``local``: this micro-batch's counts per unit (tensors). ``step``: the step's counts (``DeepNMTTrainer``);
    otherwise ``num_items_in_batch`` (the step's target tokens, as transformers' Trainer passes it), from which the
    other units are scaled by this micro-batch's share of the step's target tokens; otherwise the local counts.
    """
    reference = local["target_tokens"]
    if step is not None:
        # no float() on the counts: a 0-d tensor stays one, so that a compiled model (`deepnmt train --torch_compile`)
        # takes each step's counts as graph inputs instead of guarding on their values (a recompile per step)
        return {unit: torch.as_tensor(getattr(step, unit), dtype=torch.float32, device=reference.device)
                .clamp(min=1) for unit in UNITS}
    local = {unit: value.to(torch.float32).clamp(min=1) for unit, value in local.items()}
    if num_items_in_batch is None:
        return local
    step_target = torch.as_tensor(num_items_in_batch, device=reference.device).to(torch.float32).sum().clamp(min=1)
    scale = step_target / local["target_tokens"]  # 1 / (this micro-batch's share of the step's target tokens)
    return {unit: step_target if unit == "target_tokens" else value * scale for unit, value in local.items()}


@dataclass
class LossTerm:
    """One term of the objective: ``weight · total / (step count of unit)``.

    ``total`` is summed over this micro-batch's units and ``count`` is how many it holds (its logged value is
    ``total / count``); ``weight`` 0 logs a term without optimising it.
    """

    name: str
    total: torch.Tensor
    count: torch.Tensor
    unit: str
    weight: float


def combine_terms(
    terms: Sequence[LossTerm], normalizers: Mapping[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(loss, components, counts)``: the weighted sum of every term over its unit's step count, each term's
    per-unit mean of this micro-batch (detached, for logging) and its unit count."""
    loss = None
    components: dict[str, torch.Tensor] = {}
    counts: dict[str, torch.Tensor] = {}
    for term in terms:
        if term.unit not in UNITS:
            raise UserInputError(f"LossTerm {term.name!r}: `unit` = {term.unit!r} is not allowed; use one of {list(UNITS)}.")
        if term.name in components:
            raise UserInputError(f"compute_losses: loss component name {term.name!r} is used twice.")
        count = term.count.to(torch.float32)
        components[term.name] = (term.total.detach().float() / count.clamp(min=1))
        counts[term.name] = count.detach()
        if term.weight != 0.0:
            value = term.weight * term.total / normalizers[term.unit]
            loss = value if loss is None else loss + value
    if loss is None:
        raise UserInputError("combine_terms: no term has a non-zero weight.")
    return loss, components, counts


def translation_nll_objective(
    logits: torch.Tensor,
    labels: torch.Tensor,
    pad_token_id: int | None,
    training: bool,
    epsilon: float,
    source_tokens: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | float | None = None,
    loss_normalizers: LossNormalizers | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``(loss, components, counts)`` of a model whose objective is the translation NLL alone (e.g. DTMT, or the
    Transformer in evaluation mode).

    Training: the label-smoothed NLL (ε = ``epsilon``) over the step's target tokens, with the unsmoothed ``nll``
    logged beside it, normalised like every other term (`resolve_normalizers`). Evaluation: the unsmoothed NLL per
    target token (per step target token when ``num_items_in_batch`` is given).
    """
    if not training:
        _, nll_sum, count = label_smoothed_nll_loss(logits, labels, 0.0, pad_token_id)
        normalizer = count.to(torch.float32)
        if num_items_in_batch is not None:
            normalizer = torch.as_tensor(num_items_in_batch, device=logits.device).to(torch.float32).sum()
        return (nll_sum / normalizer.clamp(min=1), {"nll": nll_sum.detach() / count.clamp(min=1)},
                {"nll": count.detach().to(torch.float32)})
    smoothed_sum, nll_sum, count = label_smoothed_nll_loss(logits, labels, epsilon, pad_token_id)
    terms = [LossTerm("smoothed_nll", smoothed_sum, count, "target_tokens", 1.0),
             LossTerm("nll", nll_sum, count, "target_tokens", 0.0)]
    local = {"target_tokens": count, "source_tokens": source_tokens,
             "sentences": torch.tensor(labels.size(0), device=labels.device)}
    return combine_terms(terms, resolve_normalizers(local, loss_normalizers, num_items_in_batch))


# ------------------------------------------------------------------------------------------------ the terms
def target_mask(labels: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """True at real target positions: labels that are neither -100 nor the pad id."""
    mask = labels != IGNORE_INDEX
    if pad_token_id is not None:
        mask &= labels != pad_token_id
    return mask


def label_smoothed_nll_loss(
    logits: torch.Tensor | None, labels: torch.Tensor, epsilon: float, pad_token_id: int | None = None,
    log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy, *summed* over real target tokens (Szegedy et al. 2016).

    ``loss_t = (1 − ε) · (−log p(y_t)) + ε · mean_v(−log p(v))`` — the uniform-prior form transformers' LabelSmoother
    uses. Returns ``(smoothed_sum, nll_sum, num_tokens)``; the log-softmax runs in float32 (``log_probs``, if given,
    is that log-softmax of ``logits``, computed once and shared with other terms).
    """
    if not 0.0 <= epsilon < 1.0:
        raise UserInputError(f"label_smoothed_nll_loss: `epsilon` = {epsilon!r} is not allowed; use a value in [0, 1).")
    mask = target_mask(labels, pad_token_id)  # (B, T)
    lprobs = F.log_softmax(logits.float(), dim=-1) if log_probs is None else log_probs  # (B, T, V)
    safe_labels = labels.masked_fill(~mask, 0)
    nll = -lprobs.gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1)  # (B, T)
    nll_sum = (nll * mask).sum()
    if epsilon > 0.0:
        uniform = -lprobs.mean(dim=-1)  # (B, T)
        smoothed_sum = (1.0 - epsilon) * nll_sum + epsilon * (uniform * mask).sum()
    else:
        smoothed_sum = nll_sum
    return smoothed_sum, nll_sum, mask.sum()


def ddr_loss(logits_1: torch.Tensor, logits_2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """li2022 §3.4 J_DDR = ½ (KL(P1‖P2) + KL(P2‖P1)), summed over the vocabulary, averaged over ``mask``'s target
    tokens. ``logits_*``: ``(B, T, V)`` of two decoder passes; computed in float32."""
    total = ddr_sum_from_log_probs(F.log_softmax(logits_1.float(), dim=-1), F.log_softmax(logits_2.float(), dim=-1),
                                   mask)
    return total / mask.sum().clamp(min=1)


def ddr_sum_from_log_probs(lp1: torch.Tensor, lp2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`ddr_loss` *summed* over ``mask``'s target tokens, on log-probabilities ``(B, T, V)`` (the model shares one
    log-softmax between the NLL and DDR)."""
    # §3.4 li2022 J_DDR: KL(P1‖P2) + KL(P2‖P1) = Σ_v (p1 − p2)(log p1 − log p2)
    symmetric = ((lp1.exp() - lp2.exp()) * (lp1 - lp2)).sum(dim=-1)  # (B, T)
    return 0.5 * (symmetric * mask.to(symmetric.dtype)).sum()


def mean_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """li2022 §3.4 G(X, Y) = AVGPOOL(H_d^{L_d}): the mean of ``states`` ``(B, T, d)`` over ``mask``'s positions."""
    mask = mask.to(states.dtype).unsqueeze(-1)  # (B, T, 1)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B, d)


def ald_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. (6) li2022, averaged over sentences (see `ald_losses`)."""
    return ald_losses(anchor, positive, negative, temperature).mean()


def ald_losses(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. (6) li2022 per sentence: −log( e^{s⁺/τ} / (e^{s⁺/τ} + e^{s⁻/τ}) ) with s* = cos(G(X,Y), G(X*,Y)); only X⁺
    and X⁻ in the denominator (docs/li2022.md). Inputs ``(B, d)`` pooled states; returns ``(B,)`` in float32."""
    s_pos = F.cosine_similarity(anchor.float(), positive.float(), dim=-1)  # (B,)
    s_neg = F.cosine_similarity(anchor.float(), negative.float(), dim=-1)
    scores = torch.stack([s_pos, s_neg], dim=-1) / temperature  # (B, 2)
    return -F.log_softmax(scores, dim=-1)[:, 0]  # Eq. (6) li2022


def layer_diversity_sum(states: Sequence[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """dou2018 layer diversity (Eq. (10)), *summed* over ``mask``'s positions n:
    Σ_n 1/(L−1) Σ_{l=1}^{L−1} (1 − cos²(h_n^l, h_n^{l+1})).

    ``states``: the L ≥ 2 layer outputs H^1 … H^L of one stack, each ``(R, T, d)``; ``mask`` ``(R, T)`` the real
    positions. Dividing by the number of positions gives L_div = 1/(L−1) Σ_l D(H^l, H^{l+1}) with D the mean
    cosine-squared distance of Eq. (10). Computed in float32.
    """
    if len(states) < 2:
        raise UserInputError(f"layer_diversity_sum: it compares adjacent layers; got {len(states)} layer(s).")
    per_position = None
    for lower, upper in zip(states[:-1], states[1:]):
        cosine = F.cosine_similarity(lower.float(), upper.float(), dim=-1)  # (R, T)
        distance = 1.0 - cosine.pow(2)  # Eq. (10) dou2018: 1 − cos²(h_n^l, h_n^{l+1})
        per_position = distance if per_position is None else per_position + distance
    per_position = per_position / (len(states) - 1)  # Eq. (10) dou2018: 1/(L−1) Σ_l
    return (per_position * mask.to(per_position.dtype)).sum()


def replaceable_source_positions(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: Any
) -> torch.Tensor:
    """True at the source tokens ALD (and `source_reliance`) may turn into ``<unk>``: real tokens that are not pad,
    bos, eos, unk already, or one of ``config.ald_protected_token_ids`` (language tags; docs/li2022.md)."""
    protected = {config.pad_token_id, config.bos_token_id, config.eos_token_id, config.unk_token_id,
                 *getattr(config, "ald_protected_token_ids", [])}
    mask = ~torch.isin(input_ids, torch.tensor(sorted(t for t in protected if t is not None), device=input_ids.device))
    if attention_mask is not None:
        mask &= attention_mask.bool()
    return mask


def ald_views(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: Any, gamma: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """X⁺ and X⁻ of li2022 §3.4 for a ``(B, S)`` source batch.

    Each sentence draws γ ~ U[0, p_ALD) (or takes ``gamma`` ``(B,)``); of its n replaceable tokens
    (`replaceable_source_positions`), X⁺ replaces round(γ·n) by ``<unk>`` and X⁻ round((1−γ)·n). Both take the
    positions from one random order, so X⁻'s ``<unk>`` positions include X⁺'s, and X⁻ masks at least one token more
    when rounding would make the counts equal: X⁺ keeps strictly more of the source whenever n ≥ 1 (li2022 does not
    say whether the two draws are related nor how γ·n is rounded; our choices, docs/li2022.md). Random numbers
    come from torch's generator (seeded, resumable).
    """
    replaceable = replaceable_source_positions(input_ids, attention_mask, config)  # (B, S)
    n = replaceable.sum(dim=1)  # (B,)
    if gamma is None:
        gamma = torch.rand(input_ids.size(0)) * config.ald_unk_ratio
    gamma = gamma.to(device=input_ids.device, dtype=torch.float32)
    k_pos = torch.round(gamma * n).long()  # (B,) §3.4 li2022: X⁺ masks round(γ·n)
    k_neg = torch.round((1.0 - gamma) * n).long()  # X⁻ masks round((1−γ)·n)
    # rounding can make the two equal (n = 2, γ ∈ (0.25, 0.3): both 1): X⁻ then masks one more, so that X⁺ keeps
    # strictly more of the source whenever there is something to mask (docs/li2022.md)
    k_neg = torch.maximum(k_neg, torch.minimum(k_pos + 1, n))  # (B,)
    scores = torch.rand(input_ids.shape).to(input_ids.device).masked_fill(~replaceable, 2.0)  # (B, S)
    rank = scores.argsort(dim=1).argsort(dim=1)  # (B, S): 0 = first position to replace
    unk = config.unk_token_id
    positive = input_ids.masked_fill(replaceable & (rank < k_pos[:, None]), unk)
    negative = input_ids.masked_fill(replaceable & (rank < k_neg[:, None]), unk)
    return positive, negative


# ------------------------------------------------------------------------------------------------ batch views
@dataclass(frozen=True)
class DecoderPass:
    """One decoder pass over the targets: its name, the source view it attends to, and its li2022 drop-net group
    (passes of one group share the cross-attention-drop draw, different groups draw independently)."""

    name: str
    source: str
    group: int


@dataclass
class BatchViews:
    """Named views of one batch of ``size`` sentences that go through the model in **one** call (so DDP and gradient
    checkpointing see one ordinary forward): the source views, stacked as encoder rows in order, and the decoder
    passes, stacked as decoder rows in order, each reading its source view's encoder states.

    The views the papers need (`training_views`): ``x`` (the batch), li2022's DDR second pass ``x_again`` on the same
    encoder states with its own drop-net draw, and li2022's ALD views ``x_plus`` / ``x_minus`` (one batched pass).
    `take` splits any ``(rows, …)`` output of the call back by name.
    """

    size: int
    sources: dict[str, torch.Tensor | None]
    passes: tuple[DecoderPass, ...]

    def _index(self, names: Sequence[str], order: Sequence[str]) -> list[int]:
        return [list(order).index(name) for name in names]

    def take(self, rows: torch.Tensor, *names: str, sources: bool = False) -> torch.Tensor:
        """The rows of the named decoder passes (or source views with ``sources=True``), in the order named:
        ``(k·B, …)`` from a ``(views·B, …)`` tensor (a view of it when the named blocks are adjacent)."""
        order = list(self.sources) if sources else [p.name for p in self.passes]
        blocks = self._index(names, order)
        b = self.size
        if blocks == list(range(blocks[0], blocks[0] + len(blocks))):
            return rows[blocks[0] * b:(blocks[-1] + 1) * b]
        return torch.cat([rows[i * b:(i + 1) * b] for i in blocks])

    def encoder_input_ids(self) -> torch.Tensor | None:
        """The source views stacked as encoder rows, ``(n_sources·B, S)``."""
        if len(self.sources) == 1:
            return next(iter(self.sources.values()))
        return torch.cat(list(self.sources.values()))

    def encoder_row_index(self, device: torch.device) -> torch.Tensor | None:
        """For every decoder row, the encoder row it attends to, ``(n_passes·B,)`` (None: one pass on one view)."""
        if len(self.passes) == 1:
            return None
        rows = torch.arange(self.size, device=device)
        blocks = self._index([p.source for p in self.passes], list(self.sources))
        return torch.cat([rows + block * self.size for block in blocks])

    def group_sizes(self) -> list[int] | None:
        """Rows per li2022 drop-net group, consecutive, for the decoder (None: one group)."""
        if len(self.passes) == 1:
            return None
        sizes: list[int] = []
        for index, decoder_pass in enumerate(self.passes):
            if index and decoder_pass.group == self.passes[index - 1].group:
                sizes[-1] += self.size
            else:
                sizes.append(self.size)
        return sizes

    def per_source(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """A ``(B, L)`` tensor of the batch repeated for every source view, ``(n_sources·B, L)``."""
        return tensor if tensor is None or len(self.sources) == 1 else tensor.repeat(len(self.sources), 1)

    def per_pass(self, tensor: torch.Tensor | None) -> torch.Tensor | None:
        """A ``(B, L)`` tensor of the batch repeated for every decoder pass, ``(n_passes·B, L)``."""
        return tensor if tensor is None or len(self.passes) == 1 else tensor.repeat(len(self.passes), 1)


def training_views(input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, config: Any,
                   size: int) -> BatchViews:
    """The views li2022's collapse-reducing training needs (§3.4): ``x`` always; with ``ddr_weight`` > 0 a second
    pass ``x_again`` on the same encoder states (its own dropout and drop-net draw); with ``ald_weight`` > 0 the
    sources X⁺ / X⁻ (`ald_views`) and one batched pass over them."""
    sources: dict[str, torch.Tensor | None] = {"x": input_ids}
    passes = [DecoderPass("x", "x", 0)]
    if config.ddr_weight > 0.0:
        passes.append(DecoderPass("x_again", "x", 1))
    if config.ald_weight > 0.0:
        sources["x_plus"], sources["x_minus"] = ald_views(input_ids, attention_mask, config)  # §3.4 li2022
        passes += [DecoderPass("x_plus", "x_plus", 2), DecoderPass("x_minus", "x_minus", 2)]
    return BatchViews(size, sources, tuple(passes))


# ------------------------------------------------------------------------------------------------ one function per term
def nll_terms(log_probs: torch.Tensor, labels: torch.Tensor, epsilon: float, pad_token_id: int | None,
              passes: int = 1) -> list[LossTerm]:
    """The label-smoothed NLL (optimised) and the plain NLL (logged), per target token. ``log_probs``
    ``(passes·B, T, V)`` of ``passes`` decoder passes over the same ``labels`` ``(B, T)``: averaged over the passes,
    as R-Drop does for li2022's DDR (docs/li2022.md)."""
    smoothed_sum, nll_sum, count = label_smoothed_nll_loss(None, labels.repeat(passes, 1), epsilon, pad_token_id,
                                                           log_probs=log_probs)
    target_tokens = count // passes
    return [LossTerm("smoothed_nll", smoothed_sum / passes, target_tokens, "target_tokens", 1.0),
            LossTerm("nll", nll_sum / passes, target_tokens, "target_tokens", 0.0)]


def ddr_term(log_probs_1: torch.Tensor, log_probs_2: torch.Tensor, mask: torch.Tensor, weight: float) -> LossTerm:
    """li2022 §3.4 J_DDR between two decoder passes ``(B, T, V)`` over the same batch, per target token."""
    return LossTerm("ddr", ddr_sum_from_log_probs(log_probs_1, log_probs_2, mask), mask.sum(), "target_tokens", weight)


def ald_term(states: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, mask: torch.Tensor,
             temperature: float, weight: float) -> LossTerm:
    """li2022 Eq. (6) per sentence from the top decoder states ``(B, T, d)`` of X, X⁺ and X⁻ over the targets."""
    pooled = [mean_pool(view, mask) for view in (states, positive, negative)]  # 3 × (B, d): §3.4 G(·, Y)
    per_sentence = ald_losses(*pooled, temperature)  # Eq. (6) li2022, (B,)
    return LossTerm("ald", per_sentence.sum(), torch.tensor(states.size(0), device=states.device), "sentences", weight)


def diversity_term(stack: str, layers: Sequence[torch.Tensor], mask: torch.Tensor, weight: float,
                   unit: str, passes: int = 1) -> LossTerm:
    """dou2018 layer diversity L_div of one stack (Eq. (9)-(10)) over ``mask``'s positions; ``layers`` H^1 … H^L of
    ``passes`` passes stacked as rows (averaged over them). ``weight`` is −λ: the paper maximises diversity."""
    return LossTerm(f"div_{stack}", layer_diversity_sum(layers, mask.repeat(passes, 1)) / passes,
                    mask.sum(), unit, weight)


# ------------------------------------------------------------------------------------------------ entry point
@dataclass(frozen=True)
class AuxiliaryLoss:
    """A user-defined weighted auxiliary objective: ``total += weight · share · fn(model, batch, outputs)``.

    ``fn`` returns a scalar that is a per-target-token mean over its batch; ``share`` is this micro-batch's share of
    the optimizer step's target tokens, so the term accumulates like the NLL. It may run extra forward passes (e.g.
    on ``outputs.encoder_last_hidden_state``). ``name`` is the key of its logged component. (The papers' terms are
    computed by the model itself and need no `AuxiliaryLoss`.)
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
    """Detached per-unit means of this batch, for logging: ``nll`` (true NLL, no smoothing), ``smoothed_nll`` and
    one entry per auxiliary term (unweighted; ``ald`` per sentence, the others per token)."""
    counts: dict[str, torch.Tensor] = field(default_factory=dict)
    """Units behind each component in this batch (target tokens, source tokens or sentences)."""
    num_tokens: torch.Tensor | None = None
    """Real target tokens in this batch."""
    outputs: Any = None
    """The model output (logits of the main decoder pass ``(B, T, V)``, encoder states, …)."""


def compute_losses(
    model: nn.Module,
    batch: Mapping[str, torch.Tensor],
    label_smoothing: float = 0.0,
    auxiliary: Sequence[AuxiliaryLoss] | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
    loss_normalizers: LossNormalizers | None = None,
) -> LossOutput:
    """Forward ``batch`` through ``model`` and return its objective with every component.

    Args:
        model: an hf_deepnmt seq2seq model (possibly wrapped by DDP). In training mode its forward computes the full
            objective of its config (NLL + li2022 DDR / ALD + dou2018 diversity, as switched on); in evaluation mode
            the unsmoothed NLL.
        batch: ``input_ids``, ``attention_mask``, ``labels`` (-100 or pad for padding) and optionally
            ``decoder_input_ids`` (made from the labels when absent).
        label_smoothing: ε of the label-smoothed NLL (training only).
        auxiliary: extra user-defined terms (`AuxiliaryLoss`), added on top.
        num_items_in_batch: target tokens of the whole optimizer step (what transformers' Trainer counts).
        loss_normalizers: the step's counts of every unit (see the module docstring); overrides
            ``num_items_in_batch``.
    """
    if "labels" not in batch:
        raise UserInputError("compute_losses: the batch has no `labels`; training needs target sequences.")
    if getattr(unwrap_model(model), "computes_translation_objective", False):
        outputs = model(**batch, smoothing_epsilon=label_smoothing, num_items_in_batch=num_items_in_batch,
                        loss_normalizers=loss_normalizers, use_cache=False)
    else:  # any other transformers seq2seq model: the label-smoothed NLL of its logits, normalised as ours
        outputs = stock_model_objective(model, batch, label_smoothing, num_items_in_batch, loss_normalizers)
    components = dict(outputs.loss_components)
    counts = dict(outputs.loss_component_counts)
    num_tokens = counts["nll"]
    total = outputs.loss
    if auxiliary:
        local = num_tokens.to(total.dtype).clamp(min=1)
        step = local
        if loss_normalizers is not None:
            step = torch.as_tensor(float(loss_normalizers.target_tokens), dtype=total.dtype, device=total.device)
        elif num_items_in_batch is not None:
            step = torch.as_tensor(num_items_in_batch, device=total.device).to(total.dtype).sum()
        share = local / step.clamp(min=1)  # this micro-batch's share of the step's target tokens
        for term in auxiliary:
            if term.name in components:
                raise UserInputError(
                    f"compute_losses: auxiliary loss name {term.name!r} is already used by another component.")
            value = term.fn(model, batch, outputs)
            if value.dim() != 0:
                raise UserInputError(
                    f"compute_losses: auxiliary loss {term.name!r} must return a scalar, got {tuple(value.shape)}.")
            components[term.name] = value.detach().float()
            counts[term.name] = num_tokens
            total = total + term.weight * value * share
    return LossOutput(loss=total, components=components, counts=counts, num_tokens=num_tokens.long(), outputs=outputs)


def stock_model_objective(model: nn.Module, batch: Mapping[str, torch.Tensor], label_smoothing: float,
                          num_items_in_batch: torch.Tensor | int | None,
                          loss_normalizers: LossNormalizers | None) -> Any:
    """The objective of a seq2seq model of another package (BART, T5, M2M100, ... from transformers): its logits under
    teacher forcing, then `translation_nll_objective` — the label-smoothed NLL normalised per step exactly as for
    this package's models (so gradient accumulation and data parallelism still equal one large batch). The papers'
    terms need this package's models (`deepnmt convert` turns Marian, FSMT and fairseq checkpoints into one).
    Returns the model's output with ``loss``, ``loss_components`` and ``loss_component_counts`` set."""
    core = unwrap_model(model)
    labels = batch["labels"]
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    if "decoder_input_ids" not in inputs:
        inputs["decoder_input_ids"] = core.prepare_decoder_input_ids_from_labels(labels=labels)
    outputs = model(**inputs, use_cache=False)
    pad = getattr(core.config, "pad_token_id", None)
    mask = batch.get("attention_mask")
    source_tokens = mask.sum() if mask is not None else torch.tensor(batch["input_ids"].numel())
    loss, components, counts = translation_nll_objective(
        outputs.logits, labels, pad, core.training, label_smoothing, source_tokens,
        num_items_in_batch=num_items_in_batch, loss_normalizers=loss_normalizers)
    outputs.loss = loss
    outputs.loss_components, outputs.loss_component_counts = components, counts
    return outputs


# ------------------------------------------------------------------------------------------------ collapse monitor
@torch.no_grad()
def source_reliance(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> float:
    """The collapse monitor of docs/li2022.md (ours, beyond li2022): mean per-token KL(P(y|X) ‖ P(y|X_unk)), where
    X_unk has every replaceable source token (`replaceable_source_positions`) replaced by ``<unk>``, over the real
    target tokens of ``batch`` (teacher forcing, eval mode, in nats).

    A decoder that ignores its source (li2022's deep-decoder collapse into an unconditional LM) scores ≈ 0; a
    translation model scores clearly above 0.
    """
    core = unwrap_model(model)
    config = core.config
    was_training = core.training
    core.eval()
    try:
        labels = batch["labels"]
        decoder_input_ids = batch.get("decoder_input_ids")
        if decoder_input_ids is None:
            decoder_input_ids = core.prepare_decoder_input_ids_from_labels(labels)
        input_ids, attention_mask = batch["input_ids"], batch.get("attention_mask")
        masked = input_ids.masked_fill(replaceable_source_positions(input_ids, attention_mask, config),
                                       config.unk_token_id)
        logits = core(input_ids=torch.cat([input_ids, masked]),
                      attention_mask=None if attention_mask is None else attention_mask.repeat(2, 1),
                      decoder_input_ids=decoder_input_ids.repeat(2, 1), use_cache=False).logits  # (2B, T, V)
        b = labels.size(0)
        lp_full = F.log_softmax(logits[:b].float(), dim=-1)
        lp_unk = F.log_softmax(logits[b:].float(), dim=-1)
        kl = (lp_full.exp() * (lp_full - lp_unk)).sum(dim=-1)  # (B, T) KL(P(y|X) ‖ P(y|X_unk)), docs/li2022.md
        mask = target_mask(labels, getattr(config, "pad_token_id", None)).to(kl.dtype)
        return float((kl * mask).sum() / mask.sum().clamp(min=1))
    finally:
        core.train(was_training)
