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

li2022's collapse-reducing training (CRT, SPEC.md §1) is built in, switched on by the config's ``ddr_weight`` /
``ald_weight``: all views of the batch go through **one** model call (the encoder runs on X, X⁺, X⁻; the decoder on
two copies of X's states for DDR plus X⁺ and X⁻ for ALD, with independent drop-net draws per pass), so DDP and
gradient checkpointing see one ordinary forward. Other auxiliary terms are `AuxiliaryLoss` objects (name, weight,
function); `auxiliary_losses_from_config(config)` builds the ones a model's config switches on.

`source_reliance` is the collapse monitor of SPEC.md §1 (ours, beyond the paper).
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
    """The main forward pass' model output (logits, encoder states, …). With li2022's DDR on, ``logits`` holds both
    decoder passes, ``(2B, T, V)``, the main pass first."""


def target_mask(labels: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """True at real target positions: labels that are neither -100 nor the pad id."""
    mask = labels != IGNORE_INDEX
    if pad_token_id is not None:
        mask &= labels != pad_token_id
    return mask


def label_smoothed_nll_loss(
    logits: torch.Tensor, labels: torch.Tensor, epsilon: float, pad_token_id: int | None = None,
    log_probs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Label-smoothed cross-entropy, *summed* over real target tokens (Szegedy et al. 2016; SPEC.md §0).

    ``loss_t = (1 − ε) · (−log p(y_t)) + ε · mean_v(−log p(v))`` — the uniform-prior form transformers' LabelSmoother
    uses. Returns ``(smoothed_sum, nll_sum, num_tokens)``; the log-softmax runs in float32 (``log_probs``, if given,
    is that log-softmax of ``logits``, computed once and shared with other terms).
    """
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"label_smoothed_nll_loss: `epsilon` = {epsilon!r} is not allowed; use a value in [0, 1).")
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


def auxiliary_losses_from_config(config: Any) -> list[AuxiliaryLoss]:
    """The auxiliary objectives a model config switches on (none for the plain DeepTransformer).

    li2022 (``ddr_weight``, ``ald_weight``) and dou2018 (``diversity_weight``) add theirs here with their issues.
    """
    return []


def _unwrap(model: nn.Module) -> nn.Module:
    while hasattr(model, "module") and isinstance(model.module, nn.Module):  # DDP / DataParallel / compiled
        model = model.module
    return getattr(model, "_orig_mod", model)


def ddr_loss(logits_1: torch.Tensor, logits_2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """li2022 §3.4 J_DDR = ½ (KL(P1‖P2) + KL(P2‖P1)), summed over the vocabulary, averaged over ``mask``'s target
    tokens (SPEC.md §1). ``logits_*``: ``(B, T, V)`` of two decoder passes; computed in float32."""
    return ddr_loss_from_log_probs(F.log_softmax(logits_1.float(), dim=-1), F.log_softmax(logits_2.float(), dim=-1),
                                   mask)


def ddr_loss_from_log_probs(lp1: torch.Tensor, lp2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`ddr_loss` on log-probabilities ``(B, T, V)`` (as `compute_losses` shares one log-softmax with the NLL)."""
    # §3.4 li2022 J_DDR: KL(P1‖P2) + KL(P2‖P1) = Σ_v (p1 − p2)(log p1 − log p2)
    symmetric = ((lp1.exp() - lp2.exp()) * (lp1 - lp2)).sum(dim=-1)  # (B, T)
    mask = mask.to(symmetric.dtype)
    return 0.5 * (symmetric * mask).sum() / mask.sum().clamp(min=1)


def mean_pool(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """li2022 §3.4 G(X, Y) = AVGPOOL(H_d^{L_d}): the mean of ``states`` ``(B, T, d)`` over ``mask``'s positions."""
    mask = mask.to(states.dtype).unsqueeze(-1)  # (B, T, 1)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B, d)


def ald_loss(anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, temperature: float) -> torch.Tensor:
    """Eq. (6) li2022: −log( e^{s⁺/τ} / (e^{s⁺/τ} + e^{s⁻/τ}) ) with s* = cos(G(X,Y), G(X*,Y)); only X⁺ and X⁻ in the
    denominator (SPEC.md §1). Inputs ``(B, d)`` pooled states; returns the mean over sentences (float32)."""
    s_pos = F.cosine_similarity(anchor.float(), positive.float(), dim=-1)  # (B,)
    s_neg = F.cosine_similarity(anchor.float(), negative.float(), dim=-1)
    scores = torch.stack([s_pos, s_neg], dim=-1) / temperature  # (B, 2)
    return -F.log_softmax(scores, dim=-1)[:, 0].mean()


def replaceable_source_positions(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: Any
) -> torch.Tensor:
    """True at the source tokens ALD (and `source_reliance`) may turn into ``<unk>``: real tokens that are not pad,
    bos, eos, unk already, or one of ``config.ald_protected_token_ids`` (language tags; SPEC.md §1)."""
    protected = {config.pad_token_id, config.bos_token_id, config.eos_token_id, config.unk_token_id,
                 *getattr(config, "ald_protected_token_ids", [])}
    mask = ~torch.isin(input_ids, torch.tensor(sorted(t for t in protected if t is not None), device=input_ids.device))
    if attention_mask is not None:
        mask &= attention_mask.bool()
    return mask


def ald_views(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config: Any, gamma: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """X⁺ and X⁻ of li2022 §3.4 (SPEC.md §1) for a ``(B, S)`` source batch.

    Each sentence draws γ ~ U[0, p_ALD) (or takes ``gamma`` ``(B,)``); of its n replaceable tokens
    (`replaceable_source_positions`), X⁺ replaces round(γ·n) by ``<unk>`` and X⁻ round((1−γ)·n). Both take the
    positions from one random order, so X⁻'s ``<unk>`` positions include X⁺'s: X⁺ always keeps strictly more of the
    source (neither li2022 nor SPEC.md §1 says whether the two draws are related; this is our choice). Random numbers
    come from torch's generator (seeded, resumable).
    """
    replaceable = replaceable_source_positions(input_ids, attention_mask, config)  # (B, S)
    n = replaceable.sum(dim=1)  # (B,)
    if gamma is None:
        gamma = torch.rand(input_ids.size(0)) * config.ald_unk_ratio
    gamma = gamma.to(device=input_ids.device, dtype=torch.float32)
    k_pos = torch.round(gamma * n).long()  # (B,) §3.4 li2022 / SPEC.md §1: X⁺ masks round(γ·n)
    k_neg = torch.round((1.0 - gamma) * n).long()  # X⁻ masks round((1−γ)·n)
    scores = torch.rand(input_ids.shape).to(input_ids.device).masked_fill(~replaceable, 2.0)  # (B, S)
    rank = scores.argsort(dim=1).argsort(dim=1)  # (B, S): 0 = first position to replace
    unk = config.unk_token_id
    positive = input_ids.masked_fill(replaceable & (rank < k_pos[:, None]), unk)
    negative = input_ids.masked_fill(replaceable & (rank < k_neg[:, None]), unk)
    return positive, negative


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

    With ``config.ddr_weight > 0`` the NLL is the mean of the two decoder passes (as R-Drop) and ``ddr`` is logged;
    with ``config.ald_weight > 0`` ``ald`` is logged (SPEC.md §1).
    """
    if "labels" not in batch:
        raise ValueError("compute_losses: the batch has no `labels`; training needs target sequences.")
    core = _unwrap(model)
    config = core.config
    labels = batch["labels"]
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    if "decoder_input_ids" not in inputs:
        inputs["decoder_input_ids"] = core.prepare_decoder_input_ids_from_labels(labels)
    ddr_weight = float(getattr(config, "ddr_weight", 0.0) or 0.0)
    ald_weight = float(getattr(config, "ald_weight", 0.0) or 0.0)
    crt = (ddr_weight > 0.0 or ald_weight > 0.0) and core.training
    pad_token_id = getattr(config, "pad_token_id", None)
    mask = target_mask(labels, pad_token_id)  # (B, T)
    batch_size = labels.size(0)
    if crt:
        outputs, passes, pooled = _crt_forward(model, inputs, config, ddr_weight > 0.0, ald_weight > 0.0, mask)
    else:
        outputs, passes, pooled = model(**inputs, use_cache=False), 1, None
    logits = outputs.logits  # (passes·B, T, V)
    log_probs = F.log_softmax(logits.float(), dim=-1)  # (passes·B, T, V), shared by the NLL and DDR
    smoothed_sum, nll_sum, num_tokens = label_smoothed_nll_loss(
        logits, labels.repeat(passes, 1), label_smoothing, pad_token_id, log_probs=log_probs)
    smoothed_sum, nll_sum, num_tokens = smoothed_sum / passes, nll_sum / passes, num_tokens // passes
    count = num_tokens.clamp(min=1).to(smoothed_sum.dtype)
    normalizer = count if num_items_in_batch is None else torch.as_tensor(
        num_items_in_batch, dtype=smoothed_sum.dtype, device=smoothed_sum.device
    ).clamp(min=1)
    share = count / normalizer  # this micro-batch's share of the optimizer step's tokens
    total = smoothed_sum / normalizer
    components = {"nll": (nll_sum / count).detach(), "smoothed_nll": (smoothed_sum / count).detach()}
    if crt and ddr_weight > 0.0:
        # unbind (not slicing): its backward stacks the two gradients instead of zero-filling two full-size buffers
        lp1, lp2 = log_probs.view(2, batch_size, *log_probs.shape[1:]).unbind(0)  # 2 × (B, T, V)
        value = ddr_loss_from_log_probs(lp1, lp2, mask)  # §3.4 li2022 J_DDR
        components["ddr"] = value.detach()
        total = total + ddr_weight * value * share
    if crt and ald_weight > 0.0:
        anchor, positive, negative = pooled
        value = ald_loss(anchor, positive, negative, config.ald_temperature)  # Eq. (6) li2022
        components["ald"] = value.detach()
        total = total + ald_weight * value * share
    terms = auxiliary_losses_from_config(config) if auxiliary is None else auxiliary
    for term in terms:
        if term.name in components:
            raise ValueError(f"compute_losses: auxiliary loss name {term.name!r} is already used by another component.")
        value = term.fn(model, batch, outputs)
        if value.dim() != 0:
            raise ValueError(f"compute_losses: auxiliary loss {term.name!r} must return a scalar, got {tuple(value.shape)}.")
        components[term.name] = value.detach().float()
        total = total + term.weight * value * share
    return LossOutput(loss=total, components=components, num_tokens=num_tokens, outputs=outputs)


def _crt_forward(
    model: nn.Module, inputs: dict[str, torch.Tensor], config: Any, ddr: bool, ald: bool, mask: torch.Tensor
) -> tuple[Any, int, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """One model call holding every view li2022's CRT needs (SPEC.md §1).

    Encoder rows: X (B) [+ X⁺ (B) + X⁻ (B) with ALD]. Decoder rows, each its own drop-net group: pass 1 on X
    [+ pass 2 on the same encoder states with DDR] [+ X⁺ and X⁻ with ALD, batched as one extra pass]. So every
    pass draws drop-net as a separate forward call of it would (X⁺ and X⁻ share one draw, being one batched pass,
    SPEC.md §1); only the X passes are projected to the vocabulary. Returns (outputs, number of X passes, pooled
    (G(X,Y), G(X⁺,Y), G(X⁻,Y)) or None).
    """
    input_ids, attention_mask = inputs["input_ids"], inputs.get("attention_mask")
    decoder_input_ids = inputs["decoder_input_ids"]
    extra = {key: value for key, value in inputs.items()
             if key not in ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")}
    if extra:
        raise ValueError(f"compute_losses: li2022's DDR/ALD support input_ids, attention_mask and decoder ids only; "
                         f"the batch also has {sorted(extra)}.")
    b = input_ids.size(0)
    rows = torch.arange(b, device=input_ids.device)
    passes = 2 if ddr else 1
    sources, encoder_index, groups = [input_ids], [rows] * passes, [b] * passes
    if ald:
        positive, negative = ald_views(input_ids, attention_mask, config)
        sources += [positive, negative]
        encoder_index += [rows + b, rows + 2 * b]
        groups.append(2 * b)
    views = len(encoder_index)  # decoder row blocks of B
    repeat = lambda t: None if t is None else t.repeat(len(sources), 1)  # noqa: E731 (B, S) -> (n·B, S)
    outputs = model(
        input_ids=torch.cat(sources, dim=0),  # (n·B, S)
        attention_mask=repeat(attention_mask),
        decoder_input_ids=decoder_input_ids.repeat(views, 1),  # (views·B, T)
        decoder_attention_mask=(None if inputs.get("decoder_attention_mask") is None
                                else inputs["decoder_attention_mask"].repeat(views, 1)),
        encoder_row_index=torch.cat(encoder_index),
        drop_net_group_sizes=groups,
        logits_rows=passes * b,
        output_hidden_states=ald,
        use_cache=False,
    )
    pooled = None
    if ald:
        top = outputs.decoder_hidden_states[-1]  # (views·B, T, d): the states fed to the output projection
        g = mean_pool(top, mask.repeat(views, 1))  # (views·B, d) §3.4 li2022: G(·, Y) = AVGPOOL(H_d^{L_d})
        pooled = (g[:b], g[passes * b:(passes + 1) * b], g[(passes + 1) * b:])
    return outputs, passes, pooled


@torch.no_grad()
def source_reliance(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> float:
    """The collapse monitor of SPEC.md §1 (ours, beyond li2022): mean per-token KL(P(y|X) ‖ P(y|X_unk)), where
    X_unk has every replaceable source token (`replaceable_source_positions`) replaced by ``<unk>``, over the real
    target tokens of ``batch`` (teacher forcing, eval mode, in nats).

    A decoder that ignores its source (li2022's deep-decoder collapse into an unconditional LM) scores ≈ 0; a
    translation model scores clearly above 0.
    """
    core = _unwrap(model)
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
        kl = (lp_full.exp() * (lp_full - lp_unk)).sum(dim=-1)  # (B, T) SPEC.md §1: KL(P(y|X) ‖ P(y|X_unk))
        mask = target_mask(labels, getattr(config, "pad_token_id", None)).to(kl.dtype)
        return float((kl * mask).sum() / mask.sum().clamp(min=1))
    finally:
        core.train(was_training)
