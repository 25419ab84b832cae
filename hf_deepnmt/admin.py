"""liu2020 ADMIN for very deep post-LN Transformers: profiling, the closed form, folding.

ADMIN (Liu et al. 2020; docs/liu2020.md) rescales the residual of every post-LN sub-layer k,

    x_k = LN(ω_k ⊙ x_{k−1} + f_k(x_{k−1}))                                  # Eq. (2) liu2020

with ω_k ∈ R^d (`residual_scaling="admin"` on the one Transformer implementation). This module sets ω and removes it:

* `admin_profile(model, batch)` — the *Profiling* phase as the authors' code runs it (docs/liu2020.md, not the paper's
  formula): one forward pass in training mode (dropout on) on a real batch, separate running chains for the
  encoder and the decoder, each starting at ω_1 = 1, and ω_{k+1} = sqrt(Var(ω_k ⊙ x_{k−1}) + Var(f_k(x_{k−1}))) with
  the variances as scalars over the non-pad positions (the original included padding; we do not, docs/liu2020.md).
  As in the authors' code, sub-layer k's ω is set to the running value *before* its residual sum, so the pass
  itself already runs with the profiled ω. ω_k is stored as a d-vector filled with the scalar.
* `admin_omega_closed_form(n)` — ω = sqrt((N+1)/ln(N+1) − 1) without profiling (admin-torch's O(log N) default).
* `fold_admin(model)` — the standard post-LN model with the same function (§3 of the paper: "ω can be folded
  back"): with x' = ω ⊙ LN(·), γ' = ω ⊙ γ and β' = ω ⊙ β in the LayerNorm before sub-layer k, W' = W · diag(1/ω)
  on the sub-layer's input projections (q/k/v of self-attention, q of cross-attention, fc1 of the FFN).

A folded model is a standard Transformer, which the CTranslate2 and Marian exports write
(`hf_deepnmt.export_formats.standard_model`, `hf_deepnmt.export_marian`).

The first sub-layer of each stack keeps ω_1 = 1 and has no parameter, so folding never has to rescale the (tied)
embeddings (docs/liu2020.md).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from .configuration_deep_transformer import DeepTransformerConfig, admin_omega_closed_form
from .modeling_common import unwrap_model
from .modeling_deep_transformer import AdminResidual, DeepTransformerForConditionalGeneration
from .errors import UserInputError

__all__ = ["admin_omega_closed_form", "admin_profile", "fold_admin", "iter_sublayers", "omega_values"]

IGNORE_INDEX = -100


# ------------------------------------------------------------------------------------------------ the sub-layers
@dataclass
class Sublayer:
    """One residual sub-layer of a stack, in forward order: its ω, its LayerNorm and its input projections."""

    stack: str
    layer: nn.Module
    omega_name: str | None
    norm: nn.LayerNorm
    input_projections: tuple[nn.Linear, ...]

    @property
    def omega(self) -> torch.Tensor | None:
        return None if self.omega_name is None else getattr(self.layer, self.omega_name)


def iter_sublayers(model: nn.Module) -> Iterator[Sublayer]:
    """Every residual sub-layer of a DeepTransformer, encoder first, in forward order (2 per encoder layer,
    2 or 3 per decoder layer)."""
    base = getattr(model, "model", model)
    for stack in ("encoder", "decoder"):
        for layer in getattr(base, stack).layers:
            attention = layer.self_attn
            yield Sublayer(stack, layer, layer.omega_names.get("self_attn"), layer.self_attn_layer_norm,
                           (attention.q_proj, attention.k_proj, attention.v_proj))
            if stack == "decoder" and getattr(layer, "encoder_attn_layer_norm", None) is not None:
                # A li2022 CAD layer built without cross-attention (p_net = 1.0) keeps the sub-layer's LN (docs/li2022.md).
                reads = () if layer.encoder_attn is None else (layer.encoder_attn.q_proj,)
                yield Sublayer(stack, layer, layer.omega_names.get("encoder_attn"), layer.encoder_attn_layer_norm,
                               reads)
            yield Sublayer(stack, layer, layer.omega_names.get("ffn"), layer.final_layer_norm, (layer.fc1,))


# ------------------------------------------------------------------------------------------------ profiling
@dataclass
class AdminProfiler:
    """Runs the ω recursion while the model's forward pass goes through it (see the module docstring)."""

    masks: Mapping[str, torch.Tensor]
    chain: dict[str, float] = field(default_factory=lambda: {"encoder": 1.0, "decoder": 1.0})
    omegas: dict[str, list[float]] = field(default_factory=lambda: {"encoder": [], "decoder": []})
    branch_variances: dict[str, list[float]] = field(default_factory=lambda: {"encoder": [], "decoder": []})

    def step(self, stack: str, residual: torch.Tensor, branch: torch.Tensor, omega: torch.Tensor | None) -> None:
        """Called by sub-layer k with x_{k−1} (``residual``) and f_k(x_{k−1}) after dropout (``branch``)."""
        value = self.chain[stack]
        if omega is not None:
            omega.data.fill_(value)  # ω_k := running value, used by this very forward pass (authors' code)
        elif self.omegas[stack]:
            raise RuntimeError(f"ADMIN profiling: a {stack} sub-layer after the first has no ω parameter.")
        if residual.dim() == 3:  # (B, T, d): the real tokens' rows
            mask = self.masks[stack]  # (B, T) True at real tokens
            residual, branch = residual[mask], branch[mask]
        # else (N, d): a training pass carries the real tokens alone (docs/transformer.md, "Padding in training")
        input_variance = (residual * value).float().var(unbiased=False).item()  # Var(ω_k ⊙ x_{k−1})
        branch_variance = branch.float().var(unbiased=False).item()  # Var(f_k(x_{k−1}))
        self.omegas[stack].append(value)
        self.branch_variances[stack].append(branch_variance)
        self.chain[stack] = math.sqrt(input_variance + branch_variance)  # ω_{k+1}, docs/liu2020.md (authors' code)


@torch.no_grad()
def admin_profile(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> dict[str, list[float]]:
    """Profile ADMIN's ω on one batch and store it in the model (sets ``config.admin_profiled``).

    Args:
        model: a `DeepTransformerForConditionalGeneration` (or subclass) with ``residual_scaling="admin"``.
        batch: ``input_ids``, ``attention_mask`` and ``labels`` (-100 or pad where padded) of real training data;
            liu2020's authors profile ≥ 3k target tokens; docs/liu2020.md uses ≥ 4k.

    Returns ``{"encoder": [ω_1, ω_2, …], "decoder": [...]}``, one scalar per residual sub-layer in forward order.
    Runs in training mode (dropout on, as the authors' profile does) and restores the previous mode.

    With li2022's cross-attention drop composed in, the pass runs **every existing cross-attention** (no drop-net
    draw): ω then describes the network used at inference and does not depend on the random draws of one pass
    (docs/liu2020.md, "ADMIN with cross-attention drop"). Layers built without a cross-attention (p_net = 1) add
    nothing at that sub-layer, as always.
    """
    model = unwrap_model(model)
    config = model.config
    if getattr(config, "residual_scaling", "none") != "admin":
        raise UserInputError("admin_profile: the model's `residual_scaling` is not 'admin'; there is no ω to profile.")
    labels = batch["labels"]
    pad = config.pad_token_id
    masks = {
        "encoder": batch["attention_mask"].bool() if "attention_mask" in batch else batch["input_ids"] != pad,
        "decoder": (labels != IGNORE_INDEX) & (labels != pad),
    }
    profiler = AdminProfiler(masks={stack: mask.to(model.device) for stack, mask in masks.items()})

    def profile(rule: AdminResidual, args: tuple) -> None:  # runs before each residual sum, in forward order
        residual, branch, omega = args
        profiler.step(rule.stack, residual, torch.zeros_like(residual) if branch is None else branch, omega)

    hooks = [rule.register_forward_pre_hook(profile) for rule in model.modules() if isinstance(rule, AdminResidual)]
    was_training = model.training
    model.train()
    try:
        inputs = {key: value.to(model.device) for key, value in batch.items() if key != "labels"}
        if "decoder_input_ids" not in inputs:
            inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels.to(model.device))
        # the stacks only (no vocabulary projection, no training objective), every existing cross-attention on
        model.model(**inputs, use_cache=False, drop_cross_attention=False)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    config.admin_profiled = True
    return {stack: list(values) for stack, values in profiler.omegas.items()}


def omega_values(model: nn.Module) -> dict[str, list[float]]:
    """The current ω of every sub-layer (mean over its d entries; 1.0 for the parameter-free first one)."""
    values: dict[str, list[float]] = {"encoder": [], "decoder": []}
    for sublayer in iter_sublayers(unwrap_model(model)):
        omega = sublayer.omega
        values[sublayer.stack].append(1.0 if omega is None else float(omega.detach().float().mean()))
    return values


# ------------------------------------------------------------------------------------------------ folding
def _standard_config(config):
    fields = config.to_dict()
    for key in ("model_type", "transformers_version", "architectures", "auto_map", "custom_pipelines", "dtype",
                "residual_scaling", "admin_init", "admin_omega_trainable", "admin_profiled"):
        fields.pop(key, None)
    return DeepTransformerConfig(**fields, residual_scaling="none")


@torch.no_grad()
def fold_admin(model: nn.Module) -> nn.Module:
    """A standard post-LN `DeepTransformerForConditionalGeneration` (``residual_scaling="none"``) computing the same
    function as the ADMIN ``model`` (see the module docstring; exact up to float rounding)."""
    model = unwrap_model(model)
    if getattr(model.config, "residual_scaling", "none") != "admin":
        raise UserInputError("fold_admin: the model's `residual_scaling` is not 'admin'; there is nothing to fold.")
    if model.config.uses_deep_representations():
        raise UserInputError(
            "fold_admin: this model uses dou2018's layer aggregation or multi-layer attention, where a layer's "
            "output also feeds aggregation nodes or lower-layer attentions, so ω cannot be folded into the LayerNorm "
            "before each sub-layer without changing them; keep the ADMIN model (docs/liu2020.md, 'Folding').")
    folded = DeepTransformerForConditionalGeneration(_standard_config(model.config)).to(model.device)
    state = {key: value for key, value in model.state_dict().items() if not key.endswith("_omega")}
    missing, unexpected = folded.load_state_dict(state, strict=False)
    if unexpected or any(not key.endswith("lm_head.weight") for key in missing):
        raise RuntimeError(f"fold_admin: state dicts differ (missing {missing}, unexpected {unexpected}).")
    folded.tie_weights()
    folded.generation_config = copy.deepcopy(model.generation_config)
    source = list(iter_sublayers(model))
    target = list(iter_sublayers(folded))
    for k, (admin_sublayer, plain_sublayer) in enumerate(zip(source, target)):
        omega = admin_sublayer.omega
        if omega is None:
            continue  # ω_1 = 1 of a stack
        previous = target[k - 1]
        if previous.stack != plain_sublayer.stack:
            raise RuntimeError("fold_admin: a stack's first sub-layer carries an ω parameter.")
        omega = omega.detach().to(previous.norm.weight.dtype)
        previous.norm.weight.mul_(omega)  # γ' = ω ⊙ γ: the LayerNorm now outputs x' = ω ⊙ x_{k−1}
        previous.norm.bias.mul_(omega)  # β' = ω ⊙ β
        for projection in plain_sublayer.input_projections:
            projection.weight.div_(omega[None, :])  # W' = W · diag(1/ω): f_k(x') = f_k(x_{k−1})
    folded.eval() if not model.training else folded.train()
    return folded
