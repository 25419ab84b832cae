"""The one Transformer encoder-decoder of hf_deepnmt: its layers, stacks and models.

Every Transformer variant of the package is this file with switches of `DeepTransformerConfig` (docs/transformer.md):
the paper-named models are thin subclasses that only set ``model_type`` and defaults.

Read top to bottom:

1. the residual sub-layer rule (post-LN or pre-LN, liu2020's ADMIN ω) shared by both layer types;
2. encoder / decoder layers and stacks, `DeepTransformerModel`, `DeepTransformerForConditionalGeneration`;
3. the paper-named models.

The attention module, `DeepTransformerAttention`, its masks, kernels and cache slots live in `attention.py`.

Where the deep-NMT methods live (each validated in the config, each decision explained in docs/):

* li2022 cross-attention drop: ``DeepTransformerDecoderLayer(cross_attention_keep=...)`` and
  `DeepTransformerDecoder.draw_cross_attention` (docs/li2022.md);
* liu2020 ADMIN: the residual rule `AdminResidual` (built per sub-layer by `residual_rule`), ω on the layers
  (docs/liu2020.md);
* dou2018 layer aggregation: `_DeepTransformerStack._run_layers` with the modules of `hf_deepnmt.aggregation`;
  multi-layer attention: `DeepTransformerSublayerMixin._self_attention_sublayer` (docs/dou2018.md);
* the training objective (NLL + li2022 DDR / ALD + dou2018 diversity, as the config switches them on) in
  `DeepTransformerForConditionalGeneration.forward` in training mode: its terms in `_objective_terms`, built from
  `hf_deepnmt.losses` (docs/training.md).

Plumbing lives in modules of its own: positions, input checks and the Hub/generation plumbing shared with DTMT in
`modeling_common.py`; the decoding caches in `cache_deep_transformer.py`; the one model call for every view of a
training batch and its outputs in `objective_deep_transformer.py`; weight init, capabilities and accessors in
`pretrained_deep_transformer.py`.
This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqModelOutput,
)

from .attention import (
    DeepTransformerAttention,
    RealPositions,
    additive_mask,
    decoder_attention_masks,
    multi_layer_cache_slot,
    padding_mask,
    real_positions,
)
from .aggregation import AggregationFunction, AggregationRun, LayerAggregation
from .cache_deep_transformer import DecoderCacheMixin, GenerationCacheMixin
from .configuration_deep_transformer import (
    AdminTransformerConfig,
    DeepRepresentationTransformerConfig,
    DeepDecoderTransformerConfig,
    DeepTransformerConfig,
    admin_omega_closed_form,
)
from .losses import (
    BatchViews,
    LossNormalizers,
    LossTerm,
    ald_term,
    ddr_term,
    diversity_term,
    nll_terms,
    target_mask,
)
from .modeling_common import (
    DeepTransformerSeq2SeqLMOutput,
    HubReadyMixin,
    ScaledEmbedding,
    TranslationGenerationMixin,
    as_encoder_output,
    bind_shared_embedding,
    cache_field,
    check_attention_mask,
    check_one_input,
    check_positions_fit,
    check_token_ids,
    PositionEncoding,
    merge_cache_arguments,
    output_flags,
    seq2seq_lm_output,
)
from .errors import UserInputError
from .objective_deep_transformer import TrainingObjectiveMixin
from .pretrained_deep_transformer import (
    DeepTransformerCapabilities,
    LMEmbeddingAccessors,
    SharedEmbeddingAccessors,
    init_standard_weights,
    seq2seq_model_output,
)
from .handler import EndpointHandler  # noqa: F401  (so that save_pretrained copies handler.py)


# ----------------------------------------------------------------------------------------------------------------
# 1. The residual sub-layer rule, shared by encoder and decoder layers
# ----------------------------------------------------------------------------------------------------------------
class PostLNResidual(nn.Module):
    """Post-LN: x_k = LN(x_{k−1} + f_k(x_{k−1})) — Eq. (3) li2022, Eq. (1) liu2020.

    Built once per sub-layer at construction (`residual_rule`). The LayerNorm is the layer's own (saved under its
    Marian/BART name, e.g. ``self_attn_layer_norm``): this module only holds a reference to it, so it adds no weights.
    ``branch`` is f_k(x_{k−1}) after dropout; ``branch=None`` is a sub-layer that adds nothing this pass (li2022's
    dropped or absent cross-attention), for which the formula's LayerNorm stays: H̃ = LN(Ĥ) (§3.3 li2022,
    docs/li2022.md).
    """

    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        self.__dict__["norm"] = norm  # a reference, not a submodule: the layer owns (and saves) it

    def sublayer_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """What f_k reads: x_{k−1} itself."""
        return hidden_states

    def forward(self, residual: torch.Tensor, branch: torch.Tensor | None,
                omega: torch.Tensor | None = None) -> torch.Tensor:
        if branch is None:
            return self.norm(residual)  # §3.3 li2022, U^l > p^l: H̃ = LN(Ĥ)
        return self.norm(residual + branch)  # Eq. (3) li2022 / Eq. (1) liu2020


class AdminResidual(PostLNResidual):
    """liu2020 ADMIN: x_k = LN(ω_k ⊙ x_{k−1} + f_k(x_{k−1})) — Eq. (2) liu2020 (docs/liu2020.md).

    ω_k is a parameter (or buffer) of the layer, ``<sublayer>_omega`` — the state-dict name every saved ADMIN model
    has — passed in by the layer at call time; ``omega=None`` is the stack's first sub-layer, whose ω_1 = 1 has no
    tensor. `hf_deepnmt.admin_profile` profiles ω with a forward pre-hook on these modules, which see x_{k−1}, f_k
    and ω_k (``stack`` names the encoder's or the decoder's chain). With li2022's cross-attention drop composed in,
    a skipped sub-layer keeps its ω: LN(ω ⊙ Ĥ) (docs/li2022.md).
    """

    def __init__(self, norm: nn.LayerNorm, stack: str):
        super().__init__(norm)
        self.stack = stack

    def forward(self, residual: torch.Tensor, branch: torch.Tensor | None,
                omega: torch.Tensor | None = None) -> torch.Tensor:
        if omega is not None:
            residual = residual * omega  # Eq. (2) liu2020: ω_k ⊙ x_{k−1}
        return super().forward(residual, branch)


class PreLNResidual(nn.Module):
    """Pre-LN: x_k = x_{k−1} + f_k(LN(x_{k−1})), the alternative of docs/transformer.md (each stack then ends with its
    own LayerNorm). ``branch=None`` (li2022's skipped sub-layer) passes x_{k−1} through: the sub-layer disappears."""

    def __init__(self, norm: nn.LayerNorm | None):
        super().__init__()
        self.__dict__["norm"] = norm  # a reference, not a submodule: the layer owns (and saves) it

    def sublayer_input(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """What f_k reads: LN(x_{k−1})."""
        return self.norm(hidden_states)

    def forward(self, residual: torch.Tensor, branch: torch.Tensor | None,
                omega: torch.Tensor | None = None) -> torch.Tensor:
        return residual if branch is None else residual + branch


def residual_rule(config: DeepTransformerConfig, norm: nn.LayerNorm | None, stack: str) -> nn.Module:
    """The residual rule of one sub-layer, chosen once from the config: pre-LN, post-LN, or post-LN with ADMIN."""
    if config.layer_norm_position == "pre":
        return PreLNResidual(norm)
    if config.residual_scaling == "admin":
        return AdminResidual(norm, stack)
    return PostLNResidual(norm)


class DeepTransformerSublayerMixin:
    """What encoder and decoder layers share: one residual rule per sub-layer (`residual_rule`: post-LN, pre-LN or
    liu2020's ADMIN, built once at construction), liu2020's ω_k, dou2018's multi-layer attention, the FFN.

    Every residual sub-layer ``<name>`` (``self_attn``, ``encoder_attn``, ``ffn``) has a rule ``<name>_residual`` and,
    under ADMIN (except the stack's first sub-layer), a d_model-vector ``<name>_omega`` (docs/liu2020.md).
    """

    dropout: float
    training: bool
    layer_idx: int
    stack: str
    omega_names: dict[str, str | None]

    def _init_sublayers(self, config: DeepTransformerConfig, stack: str,
                        sublayers: dict[str, nn.LayerNorm | None]) -> None:
        """Build each sub-layer's residual rule and liu2020's ω_k.

        ADMIN (``residual_scaling="admin"``): a d_model-vector ω per sub-layer, a parameter when
        ``admin_omega_trainable`` (the authors' choice) or a buffer; the first sub-layer of each stack keeps ω_1 = 1
        with no tensor at all, so that folding never touches the tied embeddings (docs/liu2020.md).
        """
        self.stack = stack
        self.omega_names = {}
        for position, (sublayer, norm) in enumerate(sublayers.items()):
            setattr(self, f"{sublayer}_residual", residual_rule(config, norm, stack))
            first_of_stack = self.layer_idx == 0 and position == 0
            if config.residual_scaling != "admin" or first_of_stack:
                self.omega_names[sublayer] = None
                continue
            name = f"{sublayer}_omega"
            if config.admin_omega_trainable:
                setattr(self, name, nn.Parameter(torch.ones(config.d_model)))
            else:
                self.register_buffer(name, torch.ones(config.d_model))
            self.omega_names[sublayer] = name

    def _residual(self, sublayer: str, residual: torch.Tensor, branch: torch.Tensor | None) -> torch.Tensor:
        """x_k from x_{k−1} (``residual``) and f_k(x_{k−1}) (``branch``, dropped out here; None: adds nothing)."""
        if branch is not None and self.training and self.dropout > 0.0:  # an identity otherwise: no call per step
            branch = F.dropout(branch, p=self.dropout, training=True)
        name = self.omega_names[sublayer]
        return getattr(self, f"{sublayer}_residual")(residual, branch, None if name is None else getattr(self, name))

    def _init_multi_layer_attention(self, config: DeepTransformerConfig, heads: int, ffn_dim: int,
                                    num_layers: int) -> None:
        """dou2018 multi-layer attention (Eq. (8)): a layer l ≥ k+1 (1-based) gets one more attention per extra
        layer it attends to (H^{l−2} … H^{l−k}; its own self-attention covers H^{l−1}) and an AGG over the k
        contexts. Lower layers (l ≤ k) stay vanilla: the embeddings are not a source (docs/dou2018.md)."""
        k = config.multi_layer_attention_k
        self.multi_layer_attns: nn.ModuleList | None = None
        self.multi_layer_agg: AggregationFunction | None = None
        if k > 1 and self.layer_idx + 1 >= k + 1:
            self.multi_layer_attns = nn.ModuleList(
                DeepTransformerAttention(config.d_model, heads, config.attention_dropout,
                                         multi_layer_cache_slot(self.layer_idx, j, num_layers),
                                         is_cross_attention=False, config=config)
                for j in range(2, k + 1)
            )
            self.multi_layer_agg = AggregationFunction(k, config.d_model, ffn_dim, config.aggregation_activation,
                                                       config.layer_norm_eps)

    def _self_attention_sublayer(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        is_causal: bool,
        cache: EncoderDecoderCache | None,
        output_attentions: bool,
        lower_states: tuple[torch.Tensor, ...],
        positions: RealPositions | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The self-attention sub-layer: f(x) vanilla, or with dou2018 multi-layer attention C^l = AGG(C_{−1}, …,
        C_{−k}) (Eq. (8)), where C_{−1} is this layer's own self-attention and C_{−j} attends with the same query to
        H^{l−j} (``lower_states``, nearest first). Pre-LN applies this sub-layer's LayerNorm to every source.
        ``positions``: the states are packed (`RealPositions`)."""
        rule = self.self_attn_residual
        x = rule.sublayer_input(hidden_states)
        context, weights = self.self_attn(x, attention_mask=attention_mask, is_causal=is_causal, cache=cache,
                                          output_attentions=output_attentions, positions=positions)
        if self.multi_layer_attns is not None:
            contexts = [context]  # C_{−1}
            for attention_j, lower in zip(self.multi_layer_attns, lower_states):
                context_j, _ = attention_j(x, key_value_states=rule.sublayer_input(lower),
                                           attention_mask=attention_mask, is_causal=is_causal,
                                           cache=cache, positions=positions)  # Eq. (8) dou2018: C_{−j} = ATT(Q^l, K^{l−j}, V^{l−j})
                contexts.append(context_j)
            context = self.multi_layer_agg(*contexts)  # Eq. (8) dou2018: C^l = AGG(C_{−1}, …, C_{−k})
        return self._residual("self_attn", hidden_states, context), weights

    def _feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """FFN(x) = fc2(dropout(act(fc1(x)))) (Vaswani et al. Eq. 2)."""
        x = self.ffn_residual.sublayer_input(hidden_states)
        x = self.activation_fn(self.fc1(x))
        if self.training and self.activation_dropout > 0.0:
            x = F.dropout(x, p=self.activation_dropout, training=True)
        return self._residual("ffn", hidden_states, self.fc2(x))


class DeepTransformerEncoderLayer(DeepTransformerSublayerMixin, nn.Module):
    """Self-attention and FFN sub-layers (2 residual sub-layers per layer)."""

    def __init__(self, config: DeepTransformerConfig, layer_idx: int):
        super().__init__()
        d = config.d_model
        self.layer_idx = layer_idx
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.self_attn = DeepTransformerAttention(d, config.encoder_attention_heads, config.attention_dropout,
                                                  layer_idx, is_cross_attention=False, config=config)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self._init_sublayers(config, "encoder", {"self_attn": self.self_attn_layer_norm,
                                                 "ffn": self.final_layer_norm})
        self._init_multi_layer_attention(config, config.encoder_attention_heads, config.encoder_ffn_dim,
                                         config.encoder_layers)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool = False,
        positions: RealPositions | None = None,
        *lower_states: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``lower_states``: H^{l−2} … H^{l−k} for dou2018 multi-layer attention (none otherwise), positional so
        that reentrant gradient checkpointing sees every tensor the layer reads. ``positions``: the states are packed,
        ``(N, d)`` (`RealPositions`, training only)."""
        hidden_states, weights = self._self_attention_sublayer(hidden_states, attention_mask, False, None,
                                                               output_attentions, lower_states, positions)
        return self._feed_forward(hidden_states), weights


class DeepTransformerDecoderLayer(DeepTransformerSublayerMixin, nn.Module):
    """Causal self-attention, cross-attention and FFN sub-layers (3 residual sub-layers per layer).

    li2022 cross-attention drop (CAD, §3.3; docs/li2022.md): ``cross_attention_keep`` is the probability that the
    cross-attention sub-layer runs in a training pass (1 − p_net for the bottom L_dr layers, 1.0 above); the decoder
    draws the decision once per layer per forward and passes it as ``use_cross_attention``. At inference every
    existing cross-attention runs. A layer with keep probability 0 (p_net = 1.0) is built **without** any
    cross-attention parameters and never attends to the source; in post-LN it keeps the formula's LayerNorm,
    H̃ = LN(Ĥ), in pre-LN the sub-layer disappears. Its attention weights, when requested, are zeros
    (`DeepTransformerDecoder.forward`).
    """

    def __init__(self, config: DeepTransformerConfig, layer_idx: int, cross_attention_keep: float = 1.0):
        super().__init__()
        d = config.d_model
        self.layer_idx = layer_idx
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.cross_attention_keep = cross_attention_keep
        self.self_attn = DeepTransformerAttention(d, config.decoder_attention_heads, config.attention_dropout,
                                                  layer_idx, is_cross_attention=False, config=config)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.encoder_attn: DeepTransformerAttention | None = None
        self.encoder_attn_layer_norm: nn.LayerNorm | None = None
        pre_layer_norm = config.layer_norm_position == "pre"
        if cross_attention_keep > 0.0:
            self.encoder_attn = DeepTransformerAttention(d, config.decoder_attention_heads, config.attention_dropout,
                                                         layer_idx, is_cross_attention=True, config=config)
        if cross_attention_keep > 0.0 or not pre_layer_norm:
            self.encoder_attn_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(d, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        sublayers = {"self_attn": self.self_attn_layer_norm}
        if self.encoder_attn_layer_norm is not None:
            sublayers["encoder_attn"] = self.encoder_attn_layer_norm
        sublayers["ffn"] = self.final_layer_norm
        self._init_sublayers(config, "decoder", sublayers)
        self._init_multi_layer_attention(config, config.decoder_attention_heads, config.decoder_ffn_dim,
                                         config.decoder_layers)

    def forward(
        self,
        hidden_states: torch.Tensor,
        self_attention_mask: torch.Tensor | None,
        self_attention_is_causal: bool,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor | None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
        use_cross_attention: bool | torch.Tensor = True,
        positions: RealPositions | None = None,
        memory_positions: RealPositions | None = None,
        *lower_states: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``use_cross_attention``: li2022 CAD's decision for this forward, True/False for every row or a
        ``(R, 1, 1)`` 0/1 tensor per row (independent drop-net groups, see `DeepTransformerDecoder.forward`).
        ``lower_states``: H^{l−2} … H^{l−k} for dou2018 multi-layer attention (none otherwise), positional so that
        reentrant gradient checkpointing sees every tensor the layer reads. ``positions`` / ``memory_positions``: the
        target states / the encoder states are packed, ``(N, d)`` (`RealPositions`, training only)."""
        hidden_states, self_weights = self._self_attention_sublayer(
            hidden_states, self_attention_mask, self_attention_is_causal, cache, output_attentions, lower_states,
            positions)
        cross_weights = None
        if self.encoder_attn is None or use_cross_attention is False:
            if self.encoder_attn_layer_norm is not None:  # §3.3 li2022: only self-attention is used in this layer
                hidden_states = self._residual("encoder_attn", hidden_states, None)
        else:
            x = self.encoder_attn_residual.sublayer_input(hidden_states)
            x, cross_weights = self.encoder_attn(
                x,
                key_value_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask,
                cache=cache,
                output_attentions=output_attentions,
                positions=positions,
                memory_positions=memory_positions,
            )
            if isinstance(use_cross_attention, torch.Tensor):
                # Rows of different drop-net groups drew differently (li2022 §3.3 drop-net formula, with the 0/1
                # indicator per row): a dropped row gets LN(Ĥ + 0) = LN(Ĥ).
                if positions is not None:
                    use_cross_attention = positions.per_position(use_cross_attention)  # (R, 1, 1) -> (N, 1)
                x = x * use_cross_attention  # (R, T, d) * (R, 1, 1), packed: (N, d) * (N, 1)
            hidden_states = self._residual("encoder_attn", hidden_states, x)
        return self._feed_forward(hidden_states), self_weights, cross_weights


# ----------------------------------------------------------------------------------------------------------------
# 2. Stacks and models
# ----------------------------------------------------------------------------------------------------------------
class _DeepTransformerStack(nn.Module):
    """What encoder and decoder share: embeddings + positions, the walk through the layers (with dou2018's layer
    aggregation and multi-layer attention), gradient checkpointing, the final pre-LN norm."""

    embed_tokens: nn.Embedding
    layers: nn.ModuleList

    def __init__(self, config: DeepTransformerConfig, embed_tokens: nn.Embedding, stack: str, owns_embedding: bool = False):
        super().__init__()
        self.config = config
        if owns_embedding:  # the decoder's own target embedding (share_encoder_decoder_embeddings=False)
            self.embed_tokens = embed_tokens
        else:  # the shared embedding, owned by `DeepTransformerModel.shared`
            bind_shared_embedding(self, embed_tokens)
        # Vaswani et al. §3.5 or fairseq's sinusoids, or a learned table (config.position_encoding, docs/transformer.md)
        self.embed_positions = PositionEncoding(config.position_encoding, config.position_offset,
                                                config.max_position_embeddings, config.d_model)
        self.dropout = config.dropout
        self.gradient_checkpointing = False
        # Pre-LN needs a final LayerNorm on each stack (docs/transformer.md); post-LN already ends on one.
        self.layer_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.layer_norm_position == "pre" else None
        )
        kind = getattr(config, f"{stack}_layer_aggregation")
        # dou2018 §3.1.1: the modules that combine this stack's layers (none for the vanilla stack)
        self.aggregation = None if kind == "none" else LayerAggregation(
            kind, getattr(config, f"{stack}_layers"), config.d_model, getattr(config, f"{stack}_ffn_dim"),
            config.aggregation_activation, config.layer_norm_eps)

    def _run_layers(self, hidden_states: torch.Tensor, call: Any, positions: RealPositions | None = None,
                    states_wanted: bool = True) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Walk the layers from the embeddings ``hidden_states`` (H^0): ``call(layer, x, lower_states)`` runs one
        layer. Returns the stack's output (after aggregation and the final pre-LN norm) and [H^0, …, H^L].

        With ``positions`` (training, `RealPositions`) the layers see only the needed positions, packed ``(N, d)``;
        the returned states are padded again, zeros at the skipped positions (H^0 … H^L only when
        ``states_wanted``, else an empty list)."""
        if positions is not None:
            hidden_states = positions.pack(hidden_states)  # (B, T, d) -> (N, d)
        run = AggregationRun(self.aggregation, hidden_states)
        for number, layer in enumerate(self.layers, start=1):
            lower: tuple[torch.Tensor, ...] = ()
            if layer.multi_layer_attns is not None:  # Eq. (8) dou2018: H^{l−2} … H^{l−k}, nearest first
                lower = tuple(run.outputs[number - j] for j in range(2, len(layer.multi_layer_attns) + 2))
            run.add(number, call(layer, run.layer_input(number), lower))
        if positions is None:
            return self._finish(run.output()), run.outputs
        return (positions.unpack(self._finish(run.output())),
                [positions.unpack(h) for h in run.outputs] if states_wanted else [])

    def _embed(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int,
               name: str = "input_ids", position_ids: torch.Tensor | None = None):
        """Token embeddings plus sinusoidal positions: ``past_length`` … for every row, or ``position_ids`` ``(B, T)``
        when the rows stand at different positions (a decoder over a left-padded cache, docs/serving.md)."""
        check_one_input(type(self).__name__, input_ids, inputs_embeds)
        # the value scan runs on every full pass; incremental steps feed back ids generate itself chose
        check_token_ids(name, input_ids, self.embed_tokens.num_embeddings, check_values=past_length == 0)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, T, d), scaled by `ScaledEmbedding`
        length = inputs_embeds.size(1)
        check_positions_fit(type(self).__name__, position_ids, tuple(inputs_embeds.shape[:2]), past_length,
                            self.config.max_position_embeddings)
        positions = self.embed_positions(past_length, length, inputs_embeds.device, inputs_embeds.dtype,
                                         position_ids)  # (1 or B, T, d)
        hidden_states = inputs_embeds + positions  # (B, T, d)
        if self.training and self.dropout > 0.0:
            hidden_states = F.dropout(hidden_states, p=self.dropout, training=True)
        return hidden_states

    def _call_layer(self, layer: nn.Module, *args: Any) -> tuple:
        """Run one layer, under gradient checkpointing when it is on. Every tensor the layer reads is a positional
        argument (dou2018's lower layers too, never inside a tuple): reentrant checkpointing only tracks those."""
        if self.gradient_checkpointing and self.training:
            return self._gradient_checkpointing_func(layer.__call__, *args)
        return layer(*args)

    def _finish(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(hidden_states) if self.layer_norm is not None else hidden_states


class DeepTransformerEncoder(_DeepTransformerStack):
    """``encoder_layers`` encoder layers over the embedded source. Reusable: its `BaseModelOutput` can feed any
    number of decoder passes (``model(encoder_outputs=..., ...)``), which li2022's DDR/ALD losses rely on."""

    main_input_name = "input_ids"

    def __init__(self, config: DeepTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__(config, embed_tokens, "encoder")
        self.layers = nn.ModuleList(DeepTransformerEncoderLayer(config, i) for i in range(config.encoder_layers))

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
    ) -> BaseModelOutput | tuple:
        output_attentions, output_hidden_states = output_flags(self.config, output_attentions, output_hidden_states)
        hidden_states = self._embed(input_ids, inputs_embeds, past_length=0)
        check_attention_mask("attention_mask", attention_mask, "input_ids", tuple(hidden_states.shape[:2]))
        mask = additive_mask(padding_mask(attention_mask), hidden_states.dtype)  # (B, 1, 1, S)
        # training: the real source tokens alone go through the layers (docs/transformer.md, "Padding in training")
        positions = real_positions(None if attention_mask is None else attention_mask.bool(), self.training)
        all_attentions: list[torch.Tensor] = []

        def call(layer: DeepTransformerEncoderLayer, x: torch.Tensor, lower: tuple[torch.Tensor, ...]) -> torch.Tensor:
            x, weights = self._call_layer(layer, x, mask, output_attentions, positions, *lower)
            if output_attentions:
                all_attentions.append(weights)
            return x

        hidden_states, all_states = self._run_layers(hidden_states, call, positions, output_hidden_states)
        output = BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )
        return output if return_dict is not False else output.to_tuple()


class DeepTransformerDecoder(DecoderCacheMixin, _DeepTransformerStack):
    """``decoder_layers`` decoder layers; incremental decoding through `EncoderDecoderCache` (`DecoderCacheMixin`)."""

    main_input_name = "input_ids"

    def __init__(self, config: DeepTransformerConfig, embed_tokens: nn.Embedding, owns_embedding: bool = False):
        super().__init__(config, embed_tokens, "decoder", owns_embedding)
        keep = config.cross_attention_keep_schedule()  # li2022 CAD (docs/li2022.md): 1 − p_net below L_dr, 1 above
        self.layers = nn.ModuleList(
            DeepTransformerDecoderLayer(config, i, cross_attention_keep=keep[i]) for i in range(config.decoder_layers)
        )

    def draw_cross_attention(
        self, group_sizes: list[int] | tuple[int, ...] | None = None, device: torch.device | None = None,
        drop: bool = True,
    ) -> list[bool | torch.Tensor]:
        """li2022 §3.3 drop-net draws: one U^l ~ U[0, 1) per layer per forward, shared by the batch; layer l uses
        its cross-attention when U^l < keep_l, i.e. drops it with probability p_net (docs/li2022.md). Outside training
        every existing cross-attention is used. Draws come from torch's CPU generator, so they follow the seed and
        are restored with the RNG state on resume.

        ``group_sizes`` splits the rows into consecutive groups that draw independently (li2022's DDR runs two
        decoder passes with independent drop-net draws in one batched call); a layer whose groups disagree gets a
        ``(R, 1, 1)`` 0/1 row mask instead of a bool. ``drop=False`` draws nothing: every existing cross-attention
        runs, as at inference (liu2020's ADMIN profiles that network, docs/liu2020.md).

        Under `torch.compile` a drawn decision is always a 0/1 tensor (`_compiled_draw`), never a bool.
        """
        sizes = list(group_sizes) if group_sizes else [0]
        decisions: list[bool | torch.Tensor] = []
        for layer in self.layers:
            keep = layer.cross_attention_keep
            if not self.training or not drop or keep >= 1.0 or keep <= 0.0:
                decisions.append(layer.encoder_attn is not None)
                continue
            if torch.compiler.is_compiling():
                decisions.append(self._compiled_draw(keep, sizes, device))
                continue
            draws = (torch.rand(len(sizes)) < keep).tolist()
            if all(draws) or not any(draws):
                decisions.append(draws[0])
                continue
            mask = torch.repeat_interleave(torch.tensor(draws, dtype=torch.float32), torch.tensor(sizes))
            decisions.append(mask.to(device)[:, None, None])  # (R, 1, 1)
        return decisions

    @staticmethod
    def _compiled_draw(keep: float, sizes: list[int], device: torch.device | None) -> torch.Tensor:
        """li2022 §3.3's drop-net draw inside a `torch.compile` graph: the same U^l < keep_l per group, kept as a 0/1
        tensor ``(R, 1, 1)`` (``(1, 1, 1)`` for one group) that multiplies the cross-attention's output.

        Departure from the eager path, compiled only (docs/li2022.md): a Python branch on a random number would break
        the graph (`.tolist()`, then ``if``), so the cross-attention of a dropped layer is computed and multiplied by
        0 — the same forward value, LN(Ĥ + 0) = LN(Ĥ) (pre-LN: Ĥ + 0) — instead of being skipped; its parameters then
        get zero gradients where eager leaves them without one, as the per-row path above already does when groups
        disagree. The draws come from the compiled graph's random numbers (as its dropout's do), on ``device``, not
        from the CPU generator eager draws from.
        """
        draws = (torch.rand(len(sizes), device=device) < keep).to(torch.float32)  # (groups,) U^l < 1 − p_net
        if len(sizes) == 1:
            return draws.view(1, 1, 1)  # one group: broadcasts over every row
        rows = torch.cat([draws[group].expand(size) for group, size in enumerate(sizes)])  # (R,)
        return rows[:, None, None]  # (R, 1, 1)

    def _cross_attention_draws(self, drop_net_group_sizes: list[int] | tuple[int, ...] | None,
                               hidden_states: torch.Tensor, drop: bool) -> dict[nn.Module, bool | torch.Tensor]:
        """li2022 §3.3: per layer, whether its cross-attention runs in this pass (`draw_cross_attention`)."""
        if drop_net_group_sizes is not None and sum(drop_net_group_sizes) != hidden_states.size(0):
            raise UserInputError(f"{type(self).__name__}: `drop_net_group_sizes` = {list(drop_net_group_sizes)} must "
                                 f"sum to the batch size {hidden_states.size(0)}.")
        return dict(zip(self.layers, self.draw_cross_attention(drop_net_group_sizes, hidden_states.device, drop=drop)))

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        drop_net_group_sizes: list[int] | tuple[int, ...] | None = None,
        drop_cross_attention: bool = True,
        target_lengths: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
    ) -> BaseModelOutputWithPastAndCrossAttentions | tuple:
        """``drop_net_group_sizes``: consecutive row groups that draw li2022 CAD's drop-net independently
        (`draw_cross_attention`); ``None`` is one group, the whole batch. ``drop_cross_attention=False``: no drop-net
        draw in training mode either, every existing cross-attention runs (ADMIN profiling, docs/liu2020.md).
        ``target_lengths`` ``(B,)``: in training, row b needs its first ``target_lengths[b]`` positions only (the
        rest is label padding): later positions are not computed and come back as zeros (docs/transformer.md,
        "Padding in training"). ``position_ids`` ``(B, T)``: each input token's position when the rows stand at
        different positions (a left-padded cache whose ``attention_mask`` masks each row's leading columns,
        `hf_deepnmt.retiring_search.ContinuousSearch`); default ``past_length`` … for every row."""
        output_attentions, output_hidden_states = output_flags(self.config, output_attentions, output_hidden_states)
        cache, use_cache = self._decoding_cache(merge_cache_arguments(cache, past_key_values), use_cache)
        if encoder_hidden_states is None and not self.holds_memory(cache):
            raise UserInputError(f"{type(self).__name__}: `encoder_hidden_states` is required (run the encoder first).")
        past_length = cache.get_seq_length() if cache is not None else 0

        hidden_states = self._embed(input_ids, inputs_embeds, past_length, name="decoder_input_ids",
                                    position_ids=position_ids)  # (B, T, d)
        self_mask, is_causal, cross_mask = decoder_attention_masks(attention_mask, encoder_attention_mask,
                                                                   hidden_states, past_length)
        use_cross = self._cross_attention_draws(drop_net_group_sizes, hidden_states, drop_cross_attention)
        batch, length = hidden_states.shape[:2]
        positions = memory_positions = None
        memory = encoder_hidden_states
        if cache is None:  # training: the needed target positions and the real source tokens alone
            if target_lengths is not None:
                needed = torch.arange(length, device=hidden_states.device)[None, :] < target_lengths[:, None]
                positions = real_positions(needed, self.training)  # (B, T) -> N_T positions
            if encoder_attention_mask is not None and encoder_hidden_states is not None:
                memory_positions = real_positions(encoder_attention_mask.bool(), self.training)
                if memory_positions is not None:
                    memory = memory_positions.pack(encoder_hidden_states)  # (B, S, d) -> (N_S, d)
        all_self: list[torch.Tensor] = []
        all_cross: list[torch.Tensor] = []

        def call(layer: DeepTransformerDecoderLayer, x: torch.Tensor, lower: tuple[torch.Tensor, ...]) -> torch.Tensor:
            x, self_weights, cross_weights = self._call_layer(
                layer, x, self_mask, is_causal, memory, cross_mask, cache, output_attentions,
                use_cross[layer], positions, memory_positions, *lower,
            )
            if output_attentions:
                all_self.append(self_weights)
                if cross_weights is None:
                    # li2022 CAD: a layer without (or, in training, skipping) cross-attention attended to nothing —
                    # zeros, so transformers' tools (assisted decoding, attention plots) can index every layer
                    cross_weights = x.new_zeros(batch, self.config.decoder_attention_heads, length,
                                                encoder_hidden_states.size(1))  # (B, H, T, S)
                all_cross.append(cross_weights)
            return x

        hidden_states, all_states = self._run_layers(hidden_states, call, positions, output_hidden_states)
        output = BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            **cache_field(cache if use_cache else None),
            hidden_states=tuple(all_states) if output_hidden_states else None,
            attentions=tuple(all_self) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions else None,
        )
        return output if return_dict is not False else output.to_tuple()


class DeepTransformerPreTrainedModel(DeepTransformerCapabilities, HubReadyMixin, PreTrainedModel):
    """Weight init, attention capabilities (`DeepTransformerCapabilities`) and Hub plumbing shared by the
    DeepTransformer models."""

    config_class = DeepTransformerConfig

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The standard modules as `init_standard_weights` sets them (no paper's equation); liu2020's ω_k."""
        init_standard_weights(module, self.config, getattr(self, "lm_head", None))
        if isinstance(module, DeepTransformerSublayerMixin):
            self._init_omegas(module)

    def _init_omegas(self, layer: DeepTransformerSublayerMixin) -> None:
        """ω before profiling is 1; the closed form is sqrt((N+1)/ln(N+1) − 1) per stack (docs/liu2020.md)."""
        config = self.config
        value = 1.0
        if config.admin_init == "closed_form":
            num_sublayers = 2 * config.encoder_layers if layer.stack == "encoder" else 3 * config.decoder_layers
            value = admin_omega_closed_form(num_sublayers)
        for name in layer.omega_names.values():
            if name is not None:
                init.constant_(getattr(layer, name), value)

    base_model_class_name = "DeepTransformerModel"
    seq2seq_class_name = "DeepTransformerForConditionalGeneration"


class DeepTransformerModel(SharedEmbeddingAccessors, DeepTransformerPreTrainedModel):
    """Encoder and decoder over one shared (joint-vocabulary) token embedding; returns decoder states."""

    def __init__(self, config: DeepTransformerConfig):
        super().__init__(config)
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.shared = ScaledEmbedding(config.vocab_size, config.d_model, config.pad_token_id, embed_scale)
        self.encoder = DeepTransformerEncoder(config, self.shared)
        if config.share_encoder_decoder_embeddings:
            self.decoder = DeepTransformerDecoder(config, self.shared)
        else:  # separate vocabularies (Marian, fairseq): the decoder owns the target embedding
            target = ScaledEmbedding(config.target_vocab_size, config.d_model, config.pad_token_id, embed_scale)
            self.decoder = DeepTransformerDecoder(config, target, owns_embedding=True)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        encoder_row_index: torch.LongTensor | None = None,
        drop_net_group_sizes: list[int] | tuple[int, ...] | None = None,
        drop_cross_attention: bool = True,
        target_lengths: torch.LongTensor | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
    ) -> Seq2SeqModelOutput | tuple:
        """The usual seq2seq arguments, plus two that let one call hold several views of a batch (li2022's DDR and
        ALD losses, `hf_deepnmt.losses`; one call keeps DDP and gradient checkpointing correct):

        * ``encoder_row_index`` ``(R,)``: decoder row r attends to encoder row ``encoder_row_index[r]`` (default:
          row r), so one encoder pass can feed several decoder passes;
        * ``drop_net_group_sizes``: consecutive decoder row groups with independent CAD drop-net draws;
        * ``drop_cross_attention=False``: no CAD draw even in training mode (ADMIN profiling, docs/liu2020.md);
        * ``target_lengths`` ``(R,)``: in training, the decoder computes row r's first ``target_lengths[r]`` positions
          only (`DeepTransformerDecoder.forward`);
        * ``decoder_position_ids`` ``(R, T)``: the decoder rows' positions when they differ (a left-padded decoding
          cache, `DeepTransformerDecoder.forward`).
        """
        past_key_values = merge_cache_arguments(cache, past_key_values)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           inputs_embeds=inputs_embeds, output_attentions=output_attentions,
                                           output_hidden_states=output_hidden_states)
        encoder_outputs = as_encoder_output(encoder_outputs)
        encoder_states, encoder_mask = encoder_outputs.last_hidden_state, attention_mask
        if encoder_row_index is not None:
            encoder_states = encoder_states.index_select(0, encoder_row_index)  # (R, S, d)
            encoder_mask = None if encoder_mask is None else encoder_mask.index_select(0, encoder_row_index)  # (R, S)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask, encoder_hidden_states=encoder_states,
            encoder_attention_mask=encoder_mask, past_key_values=past_key_values, inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            drop_net_group_sizes=drop_net_group_sizes, drop_cross_attention=drop_cross_attention,
            target_lengths=target_lengths, position_ids=decoder_position_ids,
        )
        return seq2seq_model_output(encoder_outputs, decoder_outputs, return_dict)


class DeepTransformerForConditionalGeneration(GenerationCacheMixin, TrainingObjectiveMixin, LMEmbeddingAccessors,
                                              TranslationGenerationMixin, DeepTransformerPreTrainedModel,
                                              GenerationMixin):
    """`DeepTransformerModel` + output projection (tied to the shared embedding by default); generates with
    greedy search, beam search and sampling through `GenerationMixin` and `EncoderDecoderCache`.

    With ``labels``, ``loss`` is the full training objective of the config in training mode and the unsmoothed NLL
    per target token in evaluation mode (see `forward`).
    """

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
    base_model_class: type[DeepTransformerModel] = DeepTransformerModel

    def __init__(self, config: DeepTransformerConfig):
        super().__init__(config)
        self.model = self.base_model_class(config)  # DeepTransformerModel or a paper subclass
        if not config.share_encoder_decoder_embeddings:  # separate vocabularies: tie to the target embedding
            self._tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
        # Marian's output bias (final_logits_bias) is lm_head.bias when config.output_bias
        self.lm_head = nn.Linear(config.d_model, config.target_vocab_size, bias=config.output_bias)
        self.post_init()
        self.set_translation_generation_defaults()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        loss_normalizers: LossNormalizers | None = None,
        smoothing_epsilon: float | None = None,
        decoder_position_ids: torch.LongTensor | None = None,
    ) -> DeepTransformerSeq2SeqLMOutput | tuple:
        """The usual seq2seq forward. With ``labels``:

        * in training mode, ``loss`` is the **full training objective** of the config — the label-smoothed NLL
          (ε = ``smoothing_epsilon``, default ``config.label_smoothing``) plus every auxiliary term switched on
          (li2022's DDR and ALD, dou2018's layer diversity) — and ``loss_components`` / ``loss_component_counts`` hold each term's per-unit
          mean and unit count (docs/training.md). A stock `Seq2SeqTrainer` therefore optimises what
          ``DeepNMTTrainer`` does;
        * in evaluation mode, ``loss`` is the unsmoothed NLL per target token.

        ``num_items_in_batch`` (the optimizer step's target tokens, passed by transformers' Trainer) and
        ``loss_normalizers`` (every unit's step count, passed by ``DeepNMTTrainer``) make the loss a share of the
        whole step, so gradient accumulation and data parallelism equal one large batch (`hf_deepnmt.losses`).
        Padding in ``labels`` may be -100 or the pad id; ``logits`` are those of the (first) decoder pass,
        ``(B, T, V)``. ``decoder_position_ids`` ``(B, T)``: the decoder rows' positions when they differ (decoding
        over a left-padded cache, `hf_deepnmt.retiring_search.ContinuousSearch`).
        """
        past_key_values = merge_cache_arguments(cache, past_key_values)
        if labels is not None:
            check_token_ids("labels", labels, self.config.target_vocab_size, allow_ignore_index=True)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)  # labels shifted right
        elif self.training and decoder_input_ids is not None and past_key_values is None:
            self._warn_if_auxiliary_losses_go_untrained()
        if labels is not None and self.training:
            output = self._training_objective(
                input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
                inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds, labels=labels,
                output_attentions=output_attentions, output_hidden_states=output_hidden_states,
                num_items_in_batch=num_items_in_batch, loss_normalizers=loss_normalizers,
                smoothing_epsilon=smoothing_epsilon,
            )
            return output if return_dict is not False else output.to_tuple()
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            decoder_position_ids=decoder_position_ids,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V)
        loss, components, counts = self._evaluation_objective(logits, labels, num_items_in_batch)
        return seq2seq_lm_output(outputs, logits, loss, components, counts, return_dict)

    def _x_pass_logits(self, views: BatchViews, outputs: Seq2SeqModelOutput, steps: torch.Tensor,
                       lengths: torch.Tensor) -> torch.Tensor:
        """The output projection of X's passes (X, and DDR's second pass) ``(passes·B, T, V)``, at each row's
        positions up to its last label ``lengths`` ``(passes·B, 1)``; ``steps``: the 1-based positions ``(T,)``."""
        x_passes = [p.name for p in views.passes if p.source == "x"]  # X, and DDR's second pass
        states = views.take(outputs.last_hidden_state, *x_passes)  # (passes·B, T, d)
        needed = steps[None, :] <= views.take(lengths, *x_passes)  # (passes·B, T)
        positions = real_positions(needed, self.training)
        if positions is None:
            return self.lm_head(states)  # (passes·B, T, V)
        # the output projection of the needed positions only; zeros after each row's last label
        return positions.unpack(self.lm_head(positions.pack(states)))  # (N, V) -> (passes·B, T, V)

    def _objective_terms(self, views: BatchViews, outputs: Seq2SeqModelOutput, logits: torch.Tensor,
                         labels: torch.Tensor, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                         diversity: tuple[str, ...], smoothing_epsilon: float | None) -> list[LossTerm]:
        """Every term the config switches on, from the views of one model call (the NLL terms first)."""
        config = self.config
        epsilon = config.label_smoothing if smoothing_epsilon is None else float(smoothing_epsilon)
        mask = target_mask(labels, config.pad_token_id)  # (B, T) the target positions every token-level term uses
        passes = logits.size(0) // views.size
        log_probs = F.log_softmax(logits.float(), dim=-1)  # (passes·B, T, V), shared by the NLL and DDR
        terms = nll_terms(log_probs, labels, epsilon, config.pad_token_id, passes)
        if config.ddr_weight > 0.0:
            terms.append(self._ddr_term(log_probs, mask, views.size))
        if config.ald_weight > 0.0:
            terms.append(self._ald_term(views, outputs.last_hidden_state, mask))
        terms += self._diversity_terms(views, outputs, mask, input_ids, attention_mask, diversity, passes)
        return terms

    def _ddr_term(self, log_probs: torch.Tensor, mask: torch.Tensor, batch: int) -> LossTerm:
        """li2022 §3.4 J_DDR between the two decoder passes over X (independent drop-net draws), per target token;
        ``log_probs`` ``(2·B, T, V)``."""
        # unbind (not slicing): its backward stacks the two gradients instead of zero-filling two full buffers
        lp1, lp2 = log_probs.view(2, batch, *log_probs.shape[1:]).unbind(0)  # 2 × (B, T, V)
        return ddr_term(lp1, lp2, mask, self.config.ddr_weight)  # §3.4 li2022 J_DDR

    def _ald_term(self, views: BatchViews, states: torch.Tensor, mask: torch.Tensor) -> LossTerm:
        """li2022 Eq. (6) ALD per sentence, from the top decoder states of X, X⁺ and X⁻ (``states``
        ``(views·B, T, d)``: the states fed to the output projection)."""
        config = self.config
        return ald_term(views.take(states, "x"), views.take(states, "x_plus"), views.take(states, "x_minus"), mask,
                        config.ald_temperature, config.ald_weight)

    def _diversity_terms(self, views: BatchViews, outputs: Seq2SeqModelOutput, mask: torch.Tensor,
                         input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                         diversity: tuple[str, ...], passes: int) -> list[LossTerm]:
        """dou2018's layer diversity L_div (Eq. (9)-(10)) of each stack in ``diversity``, over X's layers H^1 … H^L."""
        terms: list[LossTerm] = []
        # Eq. (9) dou2018 maximises layer diversity: the trained objective is NLL − λ·L_div, so its weight is −λ,
        # shared by the stacks it applies to (the mean of their L_div; docs/dou2018.md). A sign error here would be
        # silent: tests/test_dou2018.py checks the direction of the gradient.
        weight = -self.config.diversity_weight / max(len(diversity), 1)
        if "encoder" in diversity:
            source_mask = self._source_mask(input_ids, attention_mask, outputs.encoder_last_hidden_state, views)
            layers = [views.take(h, "x", sources=True) for h in outputs.encoder_hidden_states[1:]]  # H^1 … H^L of X
            terms.append(diversity_term("encoder", layers, source_mask, weight, "source_tokens"))
        if "decoder" in diversity:
            x_passes = [p.name for p in views.passes if p.source == "x"]
            layers = [views.take(h, *x_passes) for h in outputs.decoder_hidden_states[1:]]  # X's passes
            terms.append(diversity_term("decoder", layers, mask, weight, "target_tokens", passes))
        return terms


# ----------------------------------------------------------------------------------------------------------------
# 3. Paper-named models: the same implementation with their own model_type and defaults
# ----------------------------------------------------------------------------------------------------------------
class AdminTransformerModel(DeepTransformerModel):
    """`DeepTransformerModel` with liu2020's defaults (`AdminTransformerConfig`)."""

    config_class = AdminTransformerConfig
    base_model_class_name = "AdminTransformerModel"
    seq2seq_class_name = "AdminTransformerForConditionalGeneration"


class AdminTransformerForConditionalGeneration(DeepTransformerForConditionalGeneration):
    """liu2020: a very deep post-LN Transformer with ADMIN residual scaling (60L-12L, 512/2048/8 by default).

    The same implementation as `DeepTransformerForConditionalGeneration`; profile it with `hf_deepnmt.admin_profile`
    (the trainer does it before the first step), fold it back with `hf_deepnmt.fold_admin`.
    """

    config_class = AdminTransformerConfig
    base_model_class_name = "AdminTransformerModel"
    seq2seq_class_name = "AdminTransformerForConditionalGeneration"
    base_model_class = AdminTransformerModel


class DeepDecoderTransformerModel(DeepTransformerModel):
    """`DeepTransformerModel` with li2022's defaults (`DeepDecoderTransformerConfig`)."""

    config_class = DeepDecoderTransformerConfig
    base_model_class_name = "DeepDecoderTransformerModel"
    seq2seq_class_name = "DeepDecoderTransformerForConditionalGeneration"


class DeepDecoderTransformerForConditionalGeneration(DeepTransformerForConditionalGeneration):
    """li2022: a deep decoder that does not collapse — 15L-15L post-LN with cross-attention drop (CAD) in the bottom
    decoder layers, trained with the DDR and ALD losses of `hf_deepnmt.losses` (docs/li2022.md).

    The same implementation as `DeepTransformerForConditionalGeneration`. CAD acts in training only: at inference
    every layer that has a cross-attention uses it; layers with p_net = 1.0 have none at all.
    """

    config_class = DeepDecoderTransformerConfig
    base_model_class_name = "DeepDecoderTransformerModel"
    seq2seq_class_name = "DeepDecoderTransformerForConditionalGeneration"
    base_model_class = DeepDecoderTransformerModel


class DeepRepresentationTransformerModel(DeepTransformerModel):
    """`DeepTransformerModel` with dou2018's defaults (`DeepRepresentationTransformerConfig`)."""

    config_class = DeepRepresentationTransformerConfig
    base_model_class_name = "DeepRepresentationTransformerModel"
    seq2seq_class_name = "DeepRepresentationTransformerForConditionalGeneration"


class DeepRepresentationTransformerForConditionalGeneration(DeepTransformerForConditionalGeneration):
    """dou2018: Transformer-Base with hierarchical layer aggregation in both stacks, trained with the
    layer-diversity term (NLL − λ·L_div, λ = 1.0) — the paper's "+ Deep Representations" model (docs/dou2018.md).

    The same implementation as `DeepTransformerForConditionalGeneration`; the other dou2018 strategies (dense,
    linear, iterative aggregation, multi-layer attention) are switches of the same config. Start it from a trained
    vanilla model, as the paper does, with `hf_deepnmt.warm_start`.
    """

    config_class = DeepRepresentationTransformerConfig
    base_model_class_name = "DeepRepresentationTransformerModel"
    seq2seq_class_name = "DeepRepresentationTransformerForConditionalGeneration"
    base_model_class = DeepRepresentationTransformerModel
