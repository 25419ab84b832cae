"""The one Transformer encoder-decoder of hf_deepnmt.

Every Transformer variant of the package is this file with switches of `DeepTransformerConfig` (docs/transformer.md):
the paper-named models are thin subclasses that only set ``model_type`` and defaults.

Read top to bottom:

1. `sinusoidal_positions`, masks and the attention kernels (SDPA; an explicit product when weights are requested
   and for many-row decoding steps on CPU; flex, flash and registered kernels through transformers'
   `AttentionInterface`, `interface_attention`);
2. `DeepTransformerAttention` (self- and cross-attention, `EncoderDecoderCache` aware);
3. the residual sub-layer rule (post-LN or pre-LN) shared by both layer types;
4. encoder / decoder layers and stacks, `DeepTransformerModel`, `DeepTransformerForConditionalGeneration`.

Where the deep-NMT methods live (each validated in the config, each decision explained in docs/):

* li2022 cross-attention drop: ``DeepTransformerDecoderLayer(cross_attention_keep=...)`` and
  `DeepTransformerDecoder.draw_cross_attention` (docs/li2022.md);
* liu2020 ADMIN: the per-sub-layer ω in `DeepTransformerSublayerMixin._residual` (docs/liu2020.md);
* dou2018 layer aggregation: `_DeepTransformerStack._run_layers` with the modules of `hf_deepnmt.aggregation`;
  multi-layer attention: `DeepTransformerSublayerMixin._self_attention` (docs/dou2018.md);
* the training objective (NLL + li2022 DDR / ALD + dou2018 diversity, as the config switches them on) in
  `DeepTransformerForConditionalGeneration.forward` in training mode, built from `hf_deepnmt.losses`
  (docs/training.md).

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.activations import ACT2FN
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.utils import logging
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)

from .aggregation import AggregationFunction, AggregationRun, LayerAggregation, LinearCombination
from .configuration_deep_transformer import (
    AdminTransformerConfig,
    DeepRepresentationTransformerConfig,
    DeepDecoderTransformerConfig,
    DeepTransformerConfig,
    admin_omega_closed_form,
)
from .losses import (
    LossNormalizers,
    LossTerm,
    ald_losses,
    ald_views,
    combine_terms,
    ddr_sum_from_log_probs,
    label_smoothed_nll_loss,
    layer_diversity_sum,
    mean_pool,
    resolve_normalizers,
    target_mask,
    translation_nll_objective,
)
from .pipeline_translation import TRANSLATION_PIPELINE_SPEC

logger = logging.get_logger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# 1. Positions, masks, attention kernel
# ----------------------------------------------------------------------------------------------------------------
def sinusoidal_positions(start: int, length: int, dim: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Sinusoidal position encodings for positions ``start .. start+length-1``, shape ``(length, dim)``.

    Vaswani et al. (2017) §3.5: PE(pos, 2i) = sin(pos / 10000^{2i/d}), PE(pos, 2i+1) = cos(pos / 10000^{2i/d}).
    Layout follows Marian (all sines, then all cosines), so a model without deep-NMT features exports exactly to
    `transformers.MarianMTModel`. Computed in float64 and cast, as Marian's table is.
    """
    half = dim // 2
    inv_freq = torch.pow(10000.0, -torch.arange(half, device=device, dtype=torch.float64) * 2.0 / dim)  # (d/2,)
    positions = torch.arange(start, start + length, device=device, dtype=torch.float64)
    angles = positions[:, None] * inv_freq[None, :]  # (T, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)  # (T, d)


def padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``(B, S)`` 1/0 key mask -> boolean ``(B, 1, 1, S)`` (True = attend), or None when there is none.

    A row with no real key at all (an all-padding sequence) would give NaN in softmax; such rows attend to every
    position instead (their outputs are padding and never used).
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() == 4:  # already a (B, 1, Tq, Tk) mask: bool, or additive (0 = attend)
        mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    else:
        mask = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
    return mask | ~mask.any(dim=-1, keepdim=True)


def causal_mask(query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
    """Boolean ``(1, 1, Tq, Tk)`` mask where query i (absolute position Tk-Tq+i) sees keys 0 .. Tk-Tq+i."""
    return torch.ones(query_length, key_length, dtype=torch.bool, device=device).tril(key_length - query_length)[
        None, None
    ]


def additive_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Boolean mask (True = attend) -> additive ``dtype`` mask (0 = attend, -inf = masked), or None.

    Built once per stack forward and shared by every layer: SDPA would otherwise convert a boolean mask into exactly
    this tensor again in every attention call (benchmarks/RESULTS.md, "Profile and fixes").
    """
    if mask is None:
        return None
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


# From this many (batch x heads) rows on, a single-query attention on CPU is faster as two batched matmuls than
# through SDPA's CPU flash kernel (measured with torch 2.13, head dim 64, 10-200 keys: SDPA wins below ~100 rows,
# e.g. 0.4-0.9x at 4-32 rows; the matmuls win above, 1.2-2.5x at 256-1024 rows).
EXPLICIT_SINGLE_QUERY_MIN_ROWS = 128


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    need_weights: bool,
    eager: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(Q Kᵀ / sqrt(d_h) + M) V (Vaswani et al. Eq. 1) on ``(B, H, T, d_h)`` tensors.

    ``mask`` M is additive (0 = attend, -inf = masked, see `additive_mask`) and broadcasts to ``(B, H, Tq, Tk)``;
    ``is_causal`` is only used with Tq == Tk. Uses `torch.nn.functional.scaled_dot_product_attention`
    (docs/transformer.md), except in two cases that take the explicit product below:

    * the weights are requested (``output_attentions=True``) or ``eager`` (``attn_implementation="eager"``);
    * one incremental decoding step (a single query) of many (batch, head) rows on CPU, where the CPU flash kernel's
      per-row overhead makes SDPA up to 2x slower than two batched matmuls (with few rows SDPA is the faster one;
      `EXPLICIT_SINGLE_QUERY_MIN_ROWS`, benchmarks/RESULTS.md "Profile and fixes").
    """
    batch_heads = query.size(0) * query.size(1)
    explicit_decoding_step = (query.size(-2) == 1 and batch_heads >= EXPLICIT_SINGLE_QUERY_MIN_ROWS
                              and query.device.type == "cpu")
    if not need_weights and not explicit_decoding_step and not eager:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        return out, None
    scores = torch.matmul(query, key.transpose(-1, -2)) * query.size(-1) ** -0.5  # (B, H, Tq, Tk)
    if is_causal and mask is None:
        mask = additive_mask(causal_mask(query.size(-2), key.size(-2), query.device), scores.dtype)
    if mask is not None:
        scores = scores + mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    out = torch.matmul(F.dropout(weights, p=dropout_p, training=dropout_p > 0.0), value)  # (B, H, Tq, d_h)
    return out, weights if need_weights else None



def is_flash_implementation(implementation: str) -> bool:
    """FlashAttention 2/3/4 and the Hub's flash kernels (``kernels-community/flash-attn…``, ``vllm-flash-attn3``)
    all take transformers' flash convention: a 2-D key padding mask or packed sequences, never an additive mask."""
    return "flash" in implementation


def interface_attention(module: nn.Module, implementation: str, query: torch.Tensor, key: torch.Tensor,
                        value: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
                        dropout_p: float) -> torch.Tensor:
    """Attention through the kernel registered under ``implementation`` in transformers' `AttentionInterface`
    (docs/transformer.md, "Attention"); ``(B, H, Tq, d_h)`` tensors in, ``(B, Tq, H, d_h)`` out.

    * flash kernels (`is_flash_implementation`) get what FlashAttention can express: no mask (plus its own causal
      flag, aligned bottom-right like `causal_mask`), or the batch packed into one varlen sequence per sentence
      with only the unmasked keys (`flash_varlen_attention`);
    * ``flex_attention`` gets the mask (the causal one made explicit) as a `BlockMask` (`flex_block_mask`);
    * every other kernel (``sdpa``/``eager`` of transformers, a user's) gets the additive mask expanded to
      ``(B, 1, Tq, Tk)``, with the causal mask made explicit.
    """
    kernel = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, None)
    if kernel is None:
        raise ValueError(f"`attn_implementation` = {implementation!r} is not registered with transformers' "
                         "AttentionInterface; use 'sdpa', 'eager', 'flex_attention', a flash implementation, or "
                         "register the kernel first (`AttentionInterface.register`).")
    scaling = query.size(-1) ** -0.5
    if is_flash_implementation(implementation):
        return flash_varlen_attention(module, kernel, query, key, value, mask, is_causal, dropout_p, scaling)
    batch, _, query_length, _ = query.shape
    key_length = key.size(-2)
    if is_causal and mask is None:
        mask = additive_mask(causal_mask(query_length, key_length, query.device), query.dtype)
    if mask is not None:
        shared = mask
        mask = mask.expand(batch, 1, query_length, key_length)  # (B, 1, Tq, Tk), a view
        if implementation == "flex_attention":
            expanded = mask
            mask = derived_from_mask(shared, f"flex:{batch}x{query_length}x{key_length}",
                                     lambda: flex_block_mask(expanded == 0))
    if implementation == "flex_attention" and query.device.type == "cpu":
        logger.warning_once("attn_implementation='flex_attention' on CPU: torch's compiled CPU flex kernel fails to "
                            "build for some shapes (torch 2.13, e.g. when beam search changes the batch size); 'sdpa' "
                            "is the tested and faster CPU path (docs/transformer.md, \"Attention\").")
    out, _ = kernel(module, query, key, value, mask, dropout=dropout_p, scaling=scaling, is_causal=False)
    return out  # (B, Tq, H, d_h)


def flex_block_mask(keep: torch.Tensor) -> Any:
    """The boolean ``(B, 1, Tq, Tk)`` mask (True = attend) as flex attention's `BlockMask`: fully masked blocks are
    skipped, partial ones read ``keep``. (transformers' alternative for a tensor mask, a ``score_mod`` that indexes
    it as ``mask[b][0][q][kv]``, aborts in torch 2.13's CPU flex kernel — docs/transformer.md, "Attention".)"""
    from torch.nn.attention.flex_attention import create_block_mask

    keep = keep.contiguous()
    batch, _, query_length, key_length = keep.shape

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return keep[b, 0, q, kv]

    return create_block_mask(mask_mod, batch, None, query_length, key_length, device=keep.device)


def derived_from_mask(mask: torch.Tensor, name: str, build: Any) -> Any:
    """What a kernel derives from a mask (flash packing, a flex `BlockMask`), built once per mask tensor: the stacks
    build each mask once per forward and share it between their layers (`additive_mask`), so this runs once per
    forward instead of once per layer. Kept on the tensor itself, so it dies with the mask; under torch.compile it is
    simply rebuilt."""
    if torch.compiler.is_compiling():
        return build()
    cache = mask.__dict__.setdefault("_deepnmt_derived", {})
    if name not in cache:
        cache[name] = build()
    return cache[name]


def flash_packing(mask: torch.Tensor, batch: int, query_length: int) -> dict[str, Any] | None:
    """How `flash_varlen_attention` runs a mask: None for a causal mask over right padding (the kernel's causal flag
    alone), else the varlen packing of the unmasked keys. Refuses a mask FlashAttention cannot express."""
    keep = mask == 0  # (B or 1, 1, Tq or 1, Tk), True = attend
    key_length = keep.size(-1)
    if keep.size(-2) > 1:
        keys = keep[:, :, -1:, :]  # the last query of a causal mask sees every unmasked key
        causal = causal_mask(query_length, key_length, mask.device)
        right_padded = not bool((keys[..., 1:] & ~keys[..., :-1]).any())  # 1…1 0…0 per sentence
        if not (right_padded and torch.equal(keep, (keys & causal) | ~(keys & causal).any(-1, keepdim=True))):
            raise ValueError(
                "FlashAttention can express key padding and causal masks only, not this (left-padded or custom 4-D) "
                "decoder self-attention mask; use attn_implementation='sdpa' or 'eager'.")
        return None  # right padding under a causal mask: real queries never see a padded key
    valid = keep[:, 0, 0, :].expand(batch, key_length)  # (B, Tk)
    lengths = valid.sum(-1)  # (B,) unmasked keys per sentence
    return {
        "kept": valid.reshape(-1).nonzero().squeeze(-1),  # positions of the unmasked keys in (B·Tk)
        "cu_seq_lens_q": torch.arange(0, (batch + 1) * query_length, query_length, dtype=torch.int32,
                                      device=mask.device),
        "cu_seq_lens_k": F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32),
        "max_length_q": query_length,
        "max_length_k": int(lengths.max()),
    }


def flash_varlen_attention(module: nn.Module, kernel: Any, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, mask: torch.Tensor | None, is_causal: bool, dropout_p: float,
                           scaling: float) -> torch.Tensor:
    """A flash kernel of transformers' interface on this model's masks; ``(B, H, Tq, d_h)`` in, ``(B, Tq, H, d_h)``
    out.

    transformers' own unpadding of a 2-D mask assumes the query is padded like the keys (self-attention); a
    cross-attention's queries (target) and keys (source) are padded differently. So the batch is packed here: every
    query of sentence b, and only its unmasked keys, form sequence b of one varlen batch (``cu_seq_lens_q/k``),
    which is exactly the masked softmax for any key padding (left or right). A causal mask is passed as the kernel's
    causal flag; a mask that is neither key padding nor causal (+ right padding, where the padded keys are only seen
    by padded queries) cannot be expressed and is refused (`flash_packing`).
    """
    batch, heads, query_length, head_dim = query.shape
    packing = None
    if mask is not None:
        packing = derived_from_mask(mask, f"flash:{batch}x{query_length}",
                                    lambda: flash_packing(mask, batch, query_length))
        is_causal = is_causal or packing is None
    if packing is None:
        out, _ = kernel(module, query, key, value, None, dropout=dropout_p, scaling=scaling, is_causal=is_causal)
        return out  # (B, Tq, H, d_h)

    def packed(x: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        x = x.transpose(0, 1).reshape(heads, -1, head_dim)  # (B, H, T, d_h) -> (H, B·T, d_h)
        return (x if rows is None else x.index_select(1, rows)).unsqueeze(0)  # (1, H, N, d_h)

    varlen = {name: setting for name, setting in packing.items() if name != "kept"}
    out, _ = kernel(module, packed(query), packed(key, packing["kept"]), packed(value, packing["kept"]), None,
                    dropout=dropout_p, scaling=scaling, is_causal=False, **varlen)
    return out.reshape(batch, query_length, heads, head_dim)  # (1, B·Tq, H, d_h) -> (B, Tq, H, d_h)

def check_token_ids(name: str, ids: torch.Tensor | None, vocab_size: int, check_values: bool = True,
                    allow_ignore_index: bool = False) -> None:
    """One clear sentence for bad token ids (docs/training.md, "Bad input"): not an integer tensor, not 2-D, empty,
    or an id outside [0, vocab_size) (labels may also be -100). ``check_values=False`` skips the value scan (it
    synchronises a GPU), e.g. for the ids `generate` itself feeds back."""
    if ids is None:
        return
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"`{name}` must be a torch.LongTensor of token ids (batch, length), got {type(ids).__name__}.")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ValueError(f"`{name}` has dtype {ids.dtype}; token ids must be integers (torch.long).")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` has shape {tuple(ids.shape)}; it must be 2-D (batch, length): for one sentence use "
                         "`ids.unsqueeze(0)`, or the tokenizer with return_tensors='pt'.")
    if ids.size(0) == 0 or ids.size(1) == 0:
        raise ValueError(f"`{name}` has shape {tuple(ids.shape)}: an empty batch or a zero-length sequence has nothing "
                         "to translate (every tokenized sentence holds at least its </s>).")
    if check_values and not torch.compiler.is_compiling():  # a data-dependent branch would break the graph
        bad = (ids >= vocab_size) | ((ids < 0) & ~(ids == -100) if allow_ignore_index else ids < 0)
        if bool(bad.any()):
            value = int(ids[bad][0])
            allowed = f"[0, vocab_size={vocab_size})" + (" or -100 (ignored)" if allow_ignore_index else "")
            raise ValueError(f"`{name}` holds the id {value}, which is not allowed; ids must lie in {allowed} (a "
                             "tokenizer that does not match the model?).")


def check_attention_mask(name: str, mask: torch.Tensor | None, ids_name: str, shape: tuple[int, ...]) -> None:
    """A 2-D padding mask must have the shape of its ids (4-D masks are taken as given)."""
    if mask is None or not isinstance(mask, torch.Tensor) or mask.dim() == 4:
        return
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"`{name}` has shape {tuple(mask.shape)} but `{ids_name}` has shape {tuple(shape)}; the mask "
                         "needs one 1/0 entry per token.")


def check_generation_arguments(kwargs: dict[str, Any]) -> None:
    """``num_beams``, ``num_return_sequences``, ``max_new_tokens`` and ``max_length`` (given directly or through
    ``generation_config``) must be integers ≥ 1."""
    config = kwargs.get("generation_config")
    for name in ("num_beams", "num_return_sequences", "max_new_tokens", "max_length"):
        value = kwargs.get(name, getattr(config, name, None) if config is not None else None)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ValueError(f"generate: `{name}` = {value!r} is not allowed; it must be an integer ≥ 1.")


def multi_layer_cache_slot(layer_idx: int, source: int, num_layers: int) -> int:
    """Self-attention cache slot of dou2018 multi-layer attention to H^{l−source} in decoder layer ``layer_idx``:
    slots 0 … L−1 are the layers' own self-attention, then one block of L slots per extra source (j = 2 … k)."""
    return layer_idx if source == 1 else (source - 1) * num_layers + layer_idx


def _ensure_cache_slots(cache: DynamicCache, slots: int) -> None:
    """Give a self-attention cache room for ``slots`` layers (generate sizes it from ``decoder_layers``; dou2018's
    multi-layer attention keeps keys/values per attended layer in extra slots, which beam search reorders too)."""
    while len(cache.layers) < slots:
        cache.layers.append(DynamicLayer())


# ----------------------------------------------------------------------------------------------------------------
# 2. Multi-head attention
# ----------------------------------------------------------------------------------------------------------------
class DeepTransformerAttention(nn.Module):
    """Multi-head attention, Vaswani et al. (2017) Eq. (1)-(2), with Marian/BART parameter names.

    Three uses: self-attention (keys/values from the query's own sequence, appended to
    ``cache.self_attention_cache`` at ``layer_idx``); cross-attention (``is_cross_attention``: the encoder states,
    projected once and read back from ``cache.cross_attention_cache``); and dou2018's multi-layer attention to a lower
    layer (``key_value_states`` given without ``is_cross_attention``: a sequence as long as the query's, whose
    keys/values are appended per decoding step to the self-attention cache slot ``layer_idx``, see
    `multi_layer_cache_slot`).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float, layer_idx: int, is_cross_attention: bool,
                 config: DeepTransformerConfig | None = None):
        super().__init__()
        self.config = config  # read at call time: `set_attn_implementation` takes effect at once
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.layer_idx = layer_idx
        self.is_cross_attention = is_cross_attention
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, d_h)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length, _ = hidden_states.shape
        query = self._heads(self.q_proj(hidden_states))  # (B, H, Tq, d_h)
        if self.is_cross_attention:
            if cache is not None and cache.is_updated.get(self.layer_idx):
                layer = cache.cross_attention_cache.layers[self.layer_idx]
                key, value = layer.keys, layer.values  # (B, H, S, d_h), projected on the first step
            else:
                key = self._heads(self.k_proj(key_value_states))  # (B, H, S, d_h)
                value = self._heads(self.v_proj(key_value_states))
                if cache is not None:
                    key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
                    cache.is_updated[self.layer_idx] = True
        else:
            source = hidden_states if key_value_states is None else key_value_states  # (B, Tq, d)
            key = self._heads(self.k_proj(source))  # (B, H, Tq, d_h)
            value = self._heads(self.v_proj(source))
            if cache is not None:
                key, value = cache.self_attention_cache.update(key, value, self.layer_idx)  # (B, H, past+Tq, d_h)
        implementation = getattr(self.config, "_attn_implementation", None) or "sdpa"
        dropout = self.dropout if self.training else 0.0
        if implementation in ("sdpa", "eager") or output_attentions:
            out, weights = attention(query, key, value, attention_mask, is_causal, dropout, output_attentions,
                                     eager=implementation == "eager")
            out = out.transpose(1, 2)  # (B, Tq, H, d_h)
        else:  # a kernel registered with transformers' AttentionInterface (docs/transformer.md, "Attention")
            out = interface_attention(self, implementation, query, key, value, attention_mask, is_causal,
                                      dropout)  # (B, Tq, H, d_h)
            weights = None
        out = out.reshape(batch, length, self.embed_dim)  # (B, Tq, d)
        return self.out_proj(out), weights


# ----------------------------------------------------------------------------------------------------------------
# 3. The residual sub-layer rule, shared by encoder and decoder layers
# ----------------------------------------------------------------------------------------------------------------
class DeepTransformerSublayerMixin:
    """x_k = LN(x_{k-1} + f_k(x_{k-1})) (post-LN) or x_k = x_{k-1} + f_k(LN(x_{k-1})) (pre-LN).

    Post-LN is Eq. (3) of li2022 and Eq. (1) of liu2020; pre-LN is the alternative of docs/transformer.md. Every sub-layer of
    both layer types goes through `_sublayer_input` and `_residual`, which is where liu2020's ω_k (docs/liu2020.md) scales
    the residual branch.
    """

    pre_layer_norm: bool
    dropout: float
    training: bool
    stack: str
    omega_names: dict[str, str | None]
    # Set by `hf_deepnmt.admin_profile` for the duration of its one profiling forward pass.
    admin_profiler: Any = None

    def _init_sublayers(self, config: DeepTransformerConfig, stack: str, sublayers: tuple[str, ...]) -> None:
        """Record the stack and create liu2020's ω_k for every residual sub-layer but the stack's first.

        ADMIN (``residual_scaling="admin"``): a d_model-vector ω per sub-layer, a parameter when
        ``admin_omega_trainable`` (the authors' choice) or a buffer; the first sub-layer of each stack keeps ω_1 = 1
        with no tensor at all, so that folding never touches the tied embeddings (docs/liu2020.md).
        """
        self.stack = stack
        self.omega_names = {}
        for position, sublayer in enumerate(sublayers):
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

    def _self_attention(
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None,
        is_causal: bool,
        cache: EncoderDecoderCache | None,
        output_attentions: bool,
        lower_states: tuple[torch.Tensor, ...] | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The self-attention branch f(x): vanilla, or with dou2018 multi-layer attention C^l = AGG(C_{−1}, …,
        C_{−k}) (Eq. (8)), where C_{−1} is this layer's own self-attention and C_{−j} attends with the same query to
        H^{l−j} (``lower_states``, nearest first). Pre-LN applies this sub-layer's LayerNorm to every source."""
        context, weights = self.self_attn(x, attention_mask=attention_mask, is_causal=is_causal, cache=cache,
                                          output_attentions=output_attentions)
        if self.multi_layer_attns is None:
            return context, weights
        contexts = [context]  # C_{−1}
        for attention_j, lower in zip(self.multi_layer_attns, lower_states):
            source = self._sublayer_input(lower, self.self_attn_layer_norm)
            context_j, _ = attention_j(x, key_value_states=source, attention_mask=attention_mask,
                                       is_causal=is_causal, cache=cache)  # Eq. (8) dou2018: C_{−j} = ATT(Q^l, K^{l−j}, V^{l−j})
            contexts.append(context_j)
        return self.multi_layer_agg(*contexts), weights  # Eq. (8) dou2018: C^l = AGG(C_{−1}, …, C_{−k})

    def _sublayer_input(self, hidden_states: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        return norm(hidden_states) if self.pre_layer_norm else hidden_states

    def _residual(
        self, residual: torch.Tensor, branch: torch.Tensor | None, norm: nn.LayerNorm | None, sublayer: str
    ) -> torch.Tensor:
        """Combine a sub-layer's input and output. ``branch=None`` is a sub-layer that adds nothing (li2022 CAD's
        dropped cross-attention): pre-LN passes the input through, post-LN still applies the sub-layer's LN."""
        if branch is not None:
            branch = F.dropout(branch, p=self.dropout, training=self.training)
        if self.pre_layer_norm:
            return residual if branch is None else residual + branch
        name = self.omega_names[sublayer]
        omega = None if name is None else getattr(self, name)
        if self.admin_profiler is not None:  # sets ω_k before it is used
            self.admin_profiler.step(self.stack, residual, torch.zeros_like(residual) if branch is None else branch,
                                     omega)
        if omega is not None:
            residual = residual * omega  # Eq. (2) liu2020: ω_k ⊙ x_{k-1}
        if branch is None:
            # §3.3 li2022, U^l > p^l: H̃ = LN(Ĥ) (docs/li2022.md); with ADMIN composed in (docs/li2022.md) the skipped
            # sub-layer keeps its ω, LN(ω ⊙ Ĥ), so that profiling and folding see every sub-layer of the stack.
            return norm(residual)
        return norm(residual + branch)  # Eq. (3) li2022 / Eq. (1)-(2) liu2020: post-LN

    def _feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """FFN(x) = fc2(dropout(act(fc1(x)))) (Vaswani et al. Eq. 2)."""
        residual = hidden_states
        x = self._sublayer_input(hidden_states, self.final_layer_norm)
        x = F.dropout(self.activation_fn(self.fc1(x)), p=self.activation_dropout, training=self.training)
        return self._residual(residual, self.fc2(x), self.final_layer_norm, "ffn")


class DeepTransformerEncoderLayer(DeepTransformerSublayerMixin, nn.Module):
    """Self-attention and FFN sub-layers (2 residual sub-layers per layer)."""

    def __init__(self, config: DeepTransformerConfig, layer_idx: int):
        super().__init__()
        d = config.d_model
        self.layer_idx = layer_idx
        self.pre_layer_norm = config.layer_norm_position == "pre"
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.self_attn = DeepTransformerAttention(d, config.encoder_attention_heads, config.attention_dropout,
                                                  layer_idx, is_cross_attention=False, config=config)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self._init_sublayers(config, "encoder", ("self_attn", "ffn"))
        self._init_multi_layer_attention(config, config.encoder_attention_heads, config.encoder_ffn_dim,
                                         config.encoder_layers)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        output_attentions: bool = False,
        lower_states: tuple[torch.Tensor, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``lower_states``: H^{l−2} … H^{l−k} for dou2018 multi-layer attention (None otherwise)."""
        residual = hidden_states
        x = self._sublayer_input(hidden_states, self.self_attn_layer_norm)
        x, weights = self._self_attention(x, attention_mask, False, None, output_attentions, lower_states)
        hidden_states = self._residual(residual, x, self.self_attn_layer_norm, "self_attn")
        return self._feed_forward(hidden_states), weights


class DeepTransformerDecoderLayer(DeepTransformerSublayerMixin, nn.Module):
    """Causal self-attention, cross-attention and FFN sub-layers (3 residual sub-layers per layer).

    li2022 cross-attention drop (CAD, §3.3; docs/li2022.md): ``cross_attention_keep`` is the probability that the
    cross-attention sub-layer runs in a training pass (1 − p_net for the bottom L_dr layers, 1.0 above); the decoder
    draws the decision once per layer per forward and passes it as ``use_cross_attention``. At inference every
    existing cross-attention runs. A layer with keep probability 0 (p_net = 1.0) is built **without** any
    cross-attention parameters and never attends to the source; in post-LN it keeps the formula's LayerNorm,
    H̃ = LN(Ĥ), in pre-LN the sub-layer disappears.
    """

    def __init__(self, config: DeepTransformerConfig, layer_idx: int, cross_attention_keep: float = 1.0):
        super().__init__()
        d = config.d_model
        self.layer_idx = layer_idx
        self.pre_layer_norm = config.layer_norm_position == "pre"
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.cross_attention_keep = cross_attention_keep
        self.self_attn = DeepTransformerAttention(d, config.decoder_attention_heads, config.attention_dropout,
                                                  layer_idx, is_cross_attention=False, config=config)
        self.self_attn_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.encoder_attn: DeepTransformerAttention | None = None
        self.encoder_attn_layer_norm: nn.LayerNorm | None = None
        if cross_attention_keep > 0.0:
            self.encoder_attn = DeepTransformerAttention(d, config.decoder_attention_heads, config.attention_dropout,
                                                         layer_idx, is_cross_attention=True, config=config)
        if cross_attention_keep > 0.0 or not self.pre_layer_norm:
            self.encoder_attn_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = nn.Linear(d, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        has_sublayer = self.encoder_attn_layer_norm is not None
        sublayers = ("self_attn", "encoder_attn", "ffn") if has_sublayer else ("self_attn", "ffn")
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
        lower_states: tuple[torch.Tensor, ...] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``use_cross_attention``: li2022 CAD's decision for this forward, True/False for every row or a
        ``(R, 1, 1)`` 0/1 tensor per row (independent drop-net groups, see `DeepTransformerDecoder.forward`).
        ``lower_states``: H^{l−2} … H^{l−k} for dou2018 multi-layer attention (None otherwise)."""
        residual = hidden_states
        x = self._sublayer_input(hidden_states, self.self_attn_layer_norm)
        x, self_weights = self._self_attention(x, self_attention_mask, self_attention_is_causal, cache,
                                               output_attentions, lower_states)
        hidden_states = self._residual(residual, x, self.self_attn_layer_norm, "self_attn")

        cross_weights = None
        if self.encoder_attn is None or use_cross_attention is False:
            if self.encoder_attn_layer_norm is not None:  # §3.3 li2022: only self-attention is used in this layer
                hidden_states = self._residual(hidden_states, None, self.encoder_attn_layer_norm, "encoder_attn")
        else:
            residual = hidden_states
            x = self._sublayer_input(hidden_states, self.encoder_attn_layer_norm)
            x, cross_weights = self.encoder_attn(
                x,
                key_value_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask,
                cache=cache,
                output_attentions=output_attentions,
            )
            if isinstance(use_cross_attention, torch.Tensor):
                # Rows of different drop-net groups drew differently (li2022 §3.3 drop-net formula, with the 0/1
                # indicator per row): a dropped row gets LN(Ĥ + 0) = LN(Ĥ).
                x = x * use_cross_attention  # (R, T, d) * (R, 1, 1)
            hidden_states = self._residual(residual, x, self.encoder_attn_layer_norm, "encoder_attn")
        return self._feed_forward(hidden_states), self_weights, cross_weights


# ----------------------------------------------------------------------------------------------------------------
# 4. Stacks and models
# ----------------------------------------------------------------------------------------------------------------
class ScaledEmbedding(nn.Embedding):
    """The shared token embedding, with its ``embed_scale`` (sqrt(d_model) when ``scale_embedding``, Vaswani et al.
    §3.4) applied in `forward`.

    Scaling inside the module makes ``get_input_embeddings()(ids)`` exactly what the stacks add positions to, so
    ``inputs_embeds=get_input_embeddings()(ids)`` and ``input_ids=ids`` give the same outputs (as BART's scaled word
    embedding does). The parameter is a plain ``weight``: tying, resizing and Marian export are unchanged.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float = 1.0):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeddings = super().forward(input_ids)
        return embeddings if self.embed_scale == 1.0 else embeddings * self.embed_scale


def _bind_shared_embedding(stack: nn.Module, embedding: nn.Embedding) -> None:
    """Give a stack the shared token embedding without registering it a second time.

    The joint source/target embedding (docs/transformer.md) has one owner, ``DeepTransformerModel.shared``; the stacks
    hold a plain reference so that the state dict, DDP and ZeRO see a single parameter.
    """
    stack.__dict__["embed_tokens"] = embedding


class _DeepTransformerStack(nn.Module):
    """What encoder and decoder share: embeddings + positions, the walk through the layers (with dou2018's layer
    aggregation and multi-layer attention), gradient checkpointing, the final pre-LN norm."""

    embed_tokens: nn.Embedding
    layers: nn.ModuleList

    def __init__(self, config: DeepTransformerConfig, embed_tokens: nn.Embedding, stack: str):
        super().__init__()
        self.config = config
        _bind_shared_embedding(self, embed_tokens)
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

    def _run_layers(self, hidden_states: torch.Tensor, call: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Walk the layers from the embeddings ``hidden_states`` (H^0): ``call(layer, x, lower_states)`` runs one
        layer. Returns the stack's output (after aggregation and the final pre-LN norm) and [H^0, …, H^L]."""
        run = AggregationRun(self.aggregation, hidden_states)
        for number, layer in enumerate(self.layers, start=1):
            lower = None
            if layer.multi_layer_attns is not None:  # Eq. (8) dou2018: H^{l−2} … H^{l−k}, nearest first
                lower = tuple(run.outputs[number - j] for j in range(2, len(layer.multi_layer_attns) + 2))
            run.add(number, call(layer, run.layer_input(number), lower))
        return self._finish(run.output()), run.outputs

    def _embed(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int,
               name: str = "input_ids"):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{type(self).__name__}: pass exactly one of `input_ids` and `inputs_embeds`.")
        # the value scan runs on every full pass; incremental steps feed back ids generate itself chose
        check_token_ids(name, input_ids, self.config.vocab_size, check_values=past_length == 0)
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)  # (B, T, d), scaled by `ScaledEmbedding`
        length = inputs_embeds.size(1)
        if past_length + length > self.config.max_position_embeddings:
            raise ValueError(
                f"{type(self).__name__}: a sequence of {past_length + length} tokens is longer than "
                f"max_position_embeddings={self.config.max_position_embeddings}; truncate the input (the tokenizer "
                "and the translation pipeline do this with truncation=True)."
            )
        positions = sinusoidal_positions(past_length, length, self.config.d_model, inputs_embeds.device,
                                         inputs_embeds.dtype)
        hidden_states = inputs_embeds + positions[None]  # (B, T, d)
        return F.dropout(hidden_states, p=self.dropout, training=self.training)

    def _call_layer(self, layer: nn.Module, *args: Any) -> tuple:
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
        output_attentions = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        output_hidden_states = bool(
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        hidden_states = self._embed(input_ids, inputs_embeds, past_length=0)
        check_attention_mask("attention_mask", attention_mask, "input_ids", tuple(hidden_states.shape[:2]))
        mask = additive_mask(padding_mask(attention_mask), hidden_states.dtype)  # (B, 1, 1, S)
        all_attentions: list[torch.Tensor] = []

        def call(layer: DeepTransformerEncoderLayer, x: torch.Tensor, lower: tuple | None) -> torch.Tensor:
            x, weights = self._call_layer(layer, x, mask, output_attentions, lower)
            if output_attentions:
                all_attentions.append(weights)
            return x

        hidden_states, all_states = self._run_layers(hidden_states, call)
        output = BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_states) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )
        return output if return_dict is not False else output.to_tuple()


class DeepTransformerDecoder(_DeepTransformerStack):
    """``decoder_layers`` decoder layers; incremental decoding through `EncoderDecoderCache`."""

    main_input_name = "input_ids"

    def __init__(self, config: DeepTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__(config, embed_tokens, "decoder")
        keep = config.cross_attention_keep_schedule()  # li2022 CAD (docs/li2022.md): 1 − p_net below L_dr, 1 above
        self.layers = nn.ModuleList(
            DeepTransformerDecoderLayer(config, i, cross_attention_keep=keep[i]) for i in range(config.decoder_layers)
        )

    def draw_cross_attention(
        self, group_sizes: list[int] | tuple[int, ...] | None = None, device: torch.device | None = None
    ) -> list[bool | torch.Tensor]:
        """li2022 §3.3 drop-net draws: one U^l ~ U[0, 1) per layer per forward, shared by the batch; layer l uses
        its cross-attention when U^l < keep_l, i.e. drops it with probability p_net (docs/li2022.md). Outside training
        every existing cross-attention is used. Draws come from torch's CPU generator, so they follow the seed and
        are restored with the RNG state on resume.

        ``group_sizes`` splits the rows into consecutive groups that draw independently (li2022's DDR runs two
        decoder passes with independent drop-net draws in one batched call); a layer whose groups disagree gets a
        ``(R, 1, 1)`` 0/1 row mask instead of a bool.
        """
        sizes = list(group_sizes) if group_sizes else [0]
        decisions: list[bool | torch.Tensor] = []
        for layer in self.layers:
            keep = layer.cross_attention_keep
            if not self.training or keep >= 1.0 or keep <= 0.0:
                decisions.append(keep > 0.0 or not self.training)
                continue
            draws = (torch.rand(len(sizes)) < keep).tolist()
            if all(draws) or not any(draws):
                decisions.append(draws[0])
                continue
            mask = torch.repeat_interleave(torch.tensor(draws, dtype=torch.float32), torch.tensor(sizes))
            decisions.append(mask.to(device)[:, None, None])  # (R, 1, 1)
        return decisions

    @staticmethod
    def _self_attention_mask(
        decoder_attention_mask: torch.Tensor | None, query_length: int, past_length: int, device: torch.device
    ) -> tuple[torch.Tensor | None, bool]:
        """(mask, is_causal) for decoder self-attention.

        Without a user mask, training and the first step use SDPA's causal kernel, single-token steps need no mask,
        and a multi-token chunk after a cache gets an explicit offset causal mask. A user's ``(B, past+T)`` mask is
        combined with the causal one (right-padded targets never need it: a real position never sees a later pad).
        """
        key_length = past_length + query_length
        if decoder_attention_mask is None:
            if past_length == 0:
                return None, True
            if query_length == 1:
                return None, False
            return causal_mask(query_length, key_length, device), False
        if decoder_attention_mask.dim() == 4:
            return padding_mask(decoder_attention_mask), False
        keys = decoder_attention_mask.bool()[:, None, None, :]  # (B, 1, 1, past+T)
        mask = keys & causal_mask(query_length, key_length, device)  # (B, 1, T, past+T)
        return mask | ~mask.any(dim=-1, keepdim=True), False

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        drop_net_group_sizes: list[int] | tuple[int, ...] | None = None,
    ) -> BaseModelOutputWithPastAndCrossAttentions | tuple:
        """``drop_net_group_sizes``: consecutive row groups that draw li2022 CAD's drop-net independently
        (`draw_cross_attention`); ``None`` is one group, the whole batch."""
        output_attentions = bool(output_attentions if output_attentions is not None else self.config.output_attentions)
        output_hidden_states = bool(
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if self.gradient_checkpointing and self.training:
            use_cache = False  # a cache written during the forward would be written again by the recomputation
        cache = past_key_values if use_cache else None
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        if cache is not None and not isinstance(cache, EncoderDecoderCache):
            raise TypeError(
                f"{type(self).__name__}: `past_key_values` must be an EncoderDecoderCache, got {type(cache).__name__}."
            )
        if encoder_hidden_states is None:
            raise ValueError(f"{type(self).__name__}: `encoder_hidden_states` is required (run the encoder first).")
        if cache is not None and self.config.multi_layer_attention_k > 1:
            _ensure_cache_slots(cache.self_attention_cache, self.config.multi_layer_attention_k * len(self.layers))
        past_length = cache.get_seq_length() if cache is not None else 0

        hidden_states = self._embed(input_ids, inputs_embeds, past_length, name="decoder_input_ids")
        if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape != (
                hidden_states.size(0), past_length + hidden_states.size(1)):
            raise ValueError(f"`decoder_attention_mask` has shape {tuple(attention_mask.shape)}; it needs one 1/0 entry "
                             f"per target token so far, {(hidden_states.size(0), past_length + hidden_states.size(1))}.")
        self_mask, is_causal = self._self_attention_mask(attention_mask, hidden_states.size(1), past_length,
                                                          hidden_states.device)
        self_mask = additive_mask(self_mask, hidden_states.dtype)  # (B or 1, 1, T, past+T)
        cross_mask = additive_mask(padding_mask(encoder_attention_mask), hidden_states.dtype)  # (B, 1, 1, S)
        all_self: list[torch.Tensor] = []
        all_cross: list[torch.Tensor] = []
        if drop_net_group_sizes is not None and sum(drop_net_group_sizes) != hidden_states.size(0):
            raise ValueError(f"{type(self).__name__}: `drop_net_group_sizes` = {list(drop_net_group_sizes)} must sum "
                             f"to the batch size {hidden_states.size(0)}.")
        use_cross = dict(zip(self.layers, self.draw_cross_attention(drop_net_group_sizes, hidden_states.device)))

        def call(layer: DeepTransformerDecoderLayer, x: torch.Tensor, lower: tuple | None) -> torch.Tensor:
            x, self_weights, cross_weights = self._call_layer(
                layer, x, self_mask, is_causal, encoder_hidden_states, cross_mask, cache, output_attentions,
                use_cross[layer], lower,
            )
            if output_attentions:
                all_self.append(self_weights)
                all_cross.append(cross_weights)
            return x

        hidden_states, all_states = self._run_layers(hidden_states, call)
        output = BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            past_key_values=cache if use_cache else None,
            hidden_states=tuple(all_states) if output_hidden_states else None,
            attentions=tuple(all_self) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions else None,
        )
        return output if return_dict is not False else output.to_tuple()


# ----------------------------------------------------------------------------------------------------------------
# Shared by every model family of the package (the Transformer here, DTMT in modeling_dtmt)
# ----------------------------------------------------------------------------------------------------------------
def _unsharded_class(cls: type) -> type:
    """``cls`` itself, or for the class FSDP2's `fully_shard` generates (``FSDP<Name>``), the model class it wraps."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 cannot have wrapped it
        return cls
    return next(base for base in cls.__mro__ if not issubclass(base, FSDPModule))


class HubReadyMixin:
    """`save_pretrained` that makes the folder self-sufficient on the Hub: the `translation` pipeline
    (``custom_pipelines``) and ``auto_map`` entries for both Auto classes. Put before `PreTrainedModel`.

    The ``custom_pipelines`` entry is written into the saved config.json only; the live config is left as it was,
    because in a process that imported hf_deepnmt the package's configs never carry it (see
    ``configuration_deep_transformer.without_pipelines_served_in_process``), so a reloaded config equals the saved
    model's."""

    base_model_class_name: str
    seq2seq_class_name: str

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        wrapper, defining = type(self), _unsharded_class(type(self))
        if defining is not wrapper:
            # FSDP2 (`fully_shard`) gave this instance a generated subclass, `FSDP<Name>`, defined in torch: saved as
            # is, the folder's `auto_map` and code files would be torch's. Save it as the class it wraps.
            self.__class__ = defining
            try:
                return self.save_pretrained(save_directory, *args, **kwargs)
            finally:
                self.__class__ = wrapper
        if self._auto_class is None:
            super().save_pretrained(save_directory, *args, **kwargs)
            return
        module = type(self).__module__.rsplit(".", 1)[-1]
        self.config.auto_map = {
            **(getattr(self.config, "auto_map", None) or {}),
            "AutoModel": f"{module}.{self.base_model_class_name}",
            "AutoModelForSeq2SeqLM": f"{module}.{self.seq2seq_class_name}",
        }
        had_pipelines = "custom_pipelines" in self.config.__dict__
        previous = self.config.__dict__.get("custom_pipelines")
        self.config.custom_pipelines = {"translation": dict(TRANSLATION_PIPELINE_SPEC)}
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            if had_pipelines:
                self.config.custom_pipelines = previous
            else:
                del self.config.custom_pipelines


class TranslationGenerationMixin:
    """What every seq2seq class of the package shares on top of its base model ``self.model`` and ``lm_head``:
    the output embedding accessors, the encoder/decoder, labels → decoder inputs, and `generate` with checked
    arguments. Put before the `PreTrainedModel` subclass."""

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        return self.model.encoder

    def get_decoder(self) -> nn.Module:
        return self.model.decoder

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """`GenerationMixin.generate`; an explicit ``max_length`` replaces the default ``max_new_tokens`` instead
        of being overridden by it, and bad lengths or beam counts get one clear sentence."""
        check_generation_arguments(kwargs)
        if kwargs.get("max_length") is not None and "max_new_tokens" not in kwargs:
            kwargs["max_new_tokens"] = None
        return super().generate(*args, **kwargs)


class DeepTransformerPreTrainedModel(HubReadyMixin, PreTrainedModel):
    """Weight init, attention capabilities and Hub plumbing shared by the DeepTransformer models."""

    config_class = DeepTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # Kernels of transformers' AttentionInterface, dispatched at call time by `interface_attention`.
    _supports_flex_attn = True
    _supports_flash_attn = True
    _no_split_modules = ["DeepTransformerEncoderLayer", "DeepTransformerDecoderLayer"]
    # forward divides its training objective by `num_items_in_batch` (the optimizer step's target tokens) when
    # transformers' Trainer passes it, so the Trainer must not divide by the accumulation steps again.
    accepts_loss_kwargs = True

    def __init__(self, config: DeepTransformerConfig, *args: Any, **kwargs: Any):
        config.check_fields()  # a config mutated after construction is re-validated here
        super().__init__(config, *args, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform linear weights (gain 1) and zero biases, N(0, init_std) token embeddings and output
        projection, unit LayerNorms. (fairseq's Transformer differs in one place: it gives q/k/v projections gain
        1/√2; we use gain 1 everywhere, as tensor2tensor does.) Uses `torch.nn.init`, which transformers guards for
        loaded weights."""
        std = self.config.init_std if self.config.init_std is not None else self.config.d_model ** -0.5
        if isinstance(module, nn.Linear):
            if module is getattr(self, "lm_head", None):
                init.normal_(module.weight, mean=0.0, std=std)
            else:
                init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, LinearCombination) and not getattr(module.weight, "_is_hf_initialized", False):
            module.reset_to_newest()  # docs/dou2018.md: a linear-aggregation stack starts as the vanilla one
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


class DeepTransformerModel(DeepTransformerPreTrainedModel):
    """Encoder and decoder over one shared (joint-vocabulary) token embedding; returns decoder states."""

    def __init__(self, config: DeepTransformerConfig):
        super().__init__(config)
        embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.shared = ScaledEmbedding(config.vocab_size, config.d_model, config.pad_token_id, embed_scale)
        self.encoder = DeepTransformerEncoder(config, self.shared)
        self.decoder = DeepTransformerDecoder(config, self.shared)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.shared = value
        _bind_shared_embedding(self.encoder, value)
        _bind_shared_embedding(self.decoder, value)

    def get_encoder(self, modality: str | None = None) -> DeepTransformerEncoder:
        return self.encoder

    def get_decoder(self) -> DeepTransformerDecoder:
        return self.decoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        encoder_row_index: torch.LongTensor | None = None,
        drop_net_group_sizes: list[int] | tuple[int, ...] | None = None,
    ) -> Seq2SeqModelOutput | tuple:
        """The usual seq2seq arguments, plus two that let one call hold several views of a batch (li2022's DDR and
        ALD losses, `hf_deepnmt.losses`; one call keeps DDP and gradient checkpointing correct):

        * ``encoder_row_index`` ``(R,)``: decoder row r attends to encoder row ``encoder_row_index[r]`` (default:
          row r), so one encoder pass can feed several decoder passes;
        * ``drop_net_group_sizes``: consecutive decoder row groups with independent CAD drop-net draws.
        """
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        encoder_states, encoder_mask = encoder_outputs.last_hidden_state, attention_mask
        if encoder_row_index is not None:
            encoder_states = encoder_states.index_select(0, encoder_row_index)  # (R, S, d)
            encoder_mask = None if encoder_mask is None else encoder_mask.index_select(0, encoder_row_index)  # (R, S)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_states,
            encoder_attention_mask=encoder_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            drop_net_group_sizes=drop_net_group_sizes,
        )
        output = Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )
        return output if return_dict is not False else output.to_tuple()


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: ``<s> y_1 … y_{n-1}`` from labels ``y_1 … y_n`` (-100 becomes pad)."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


@dataclass
class DeepTransformerSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus, with labels, every term of the loss (in evaluation mode only ``nll``).

    Args:
        loss_components (`dict[str, torch.Tensor]`, *optional*):
            Detached per-unit mean of each term of this batch: ``nll`` (unsmoothed), ``smoothed_nll`` and one entry
            per auxiliary term switched on (``ddr`` per target token, ``ald`` per sentence, ``div_encoder`` per source
            token and ``div_decoder`` per target token, each L_div itself, not its negation), unweighted.
        loss_component_counts (`dict[str, torch.Tensor]`, *optional*):
            How many units (target tokens, source tokens or sentences) each component averages over in this batch.
    """

    loss_components: dict[str, torch.Tensor] | None = None
    loss_component_counts: dict[str, torch.Tensor] | None = None


class DeepTransformerForConditionalGeneration(TranslationGenerationMixin, DeepTransformerPreTrainedModel, GenerationMixin):
    """`DeepTransformerModel` + output projection (tied to the shared embedding by default); generates with
    greedy search, beam search and sampling through `GenerationMixin` and `EncoderDecoderCache`.

    With ``labels``, ``loss`` is the full training objective of the config in training mode and the unsmoothed NLL
    per target token in evaluation mode (see `forward`).
    """

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def __init__(self, config: DeepTransformerConfig):
        super().__init__(config)
        self.model = globals()[self.base_model_class_name](config)  # DeepTransformerModel or a paper subclass
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()
        # MT-sized defaults (a saved generation_config.json overrides them): beam 4 and up to 256 new tokens instead
        # of transformers' 20. `generate` below keeps an explicit `max_length` working without a warning.
        self.generation_config.max_new_tokens = min(256, config.max_position_embeddings - 1)
        self.generation_config.num_beams = 4

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def _reorder_cache(self, past_key_values: EncoderDecoderCache, beam_idx: torch.LongTensor) -> EncoderDecoderCache:
        """Beam search (called by `GenerationMixin` after every step): make the self-attention keys/values follow
        the surviving hypotheses.

        The cross-attention keys/values are not reordered, unlike `EncoderDecoderCache.reorder_cache`: beam search
        only moves hypotheses within a sentence's beam group, and every row of a group holds the projection of the
        same (expanded) encoder states, so that reorder would copy ``(B·beams, H, S, d_h)`` per layer and step and
        change nothing. (The uncached path never reorders the encoder states either.)
        """
        if isinstance(past_key_values, EncoderDecoderCache):
            past_key_values.self_attention_cache.reorder_cache(beam_idx)
        else:
            past_key_values.reorder_cache(beam_idx)
        return past_key_values

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: EncoderDecoderCache | None = None,
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
        ``(B, T, V)``.
        """
        if labels is not None:
            check_token_ids("labels", labels, self.config.vocab_size, allow_ignore_index=True)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        if labels is None and self.training and decoder_input_ids is not None and past_key_values is None and (
                self.config.ddr_weight > 0 or self.config.ald_weight > 0):
            logger.warning_once(
                f"{type(self).__name__}: a training-mode forward without `labels` computes no loss, so the ddr/ald "
                "terms of the config are not trained. A stock Trainer with label_smoothing_factor > 0 does this (it "
                "removes the labels): use label_smoothing_factor=0 and config.label_smoothing instead, or "
                "DeepNMTTrainer.")
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
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V)
        loss = components = counts = None
        if labels is not None:  # evaluation: the unsmoothed NLL per target token
            loss, components, counts = translation_nll_objective(
                logits, labels, self.config.pad_token_id, training=False, epsilon=0.0,
                source_tokens=torch.tensor(0), num_items_in_batch=num_items_in_batch)
        output = DeepTransformerSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            loss_components=components,
            loss_component_counts=counts,
        )
        return output if return_dict is not False else output.to_tuple()

    def _training_objective(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        decoder_input_ids: torch.LongTensor | None,
        decoder_attention_mask: torch.Tensor | None,
        encoder_outputs: BaseModelOutput | tuple | None,
        inputs_embeds: torch.Tensor | None,
        decoder_inputs_embeds: torch.Tensor | None,
        labels: torch.LongTensor,
        output_attentions: bool | None,
        output_hidden_states: bool | None,
        num_items_in_batch: torch.Tensor | int | None,
        loss_normalizers: LossNormalizers | None,
        smoothing_epsilon: float | None,
    ) -> DeepTransformerSeq2SeqLMOutput:
        """The training objective in one model call (docs/training.md).

        With li2022's collapse-reducing training switched on (``ddr_weight`` / ``ald_weight`` > 0) every view of the
        batch goes through **one** call of the base model, so DDP and gradient checkpointing see one ordinary
        forward: encoder rows X (B) [+ X⁺, X⁻ (2B) with ALD]; decoder rows, each block its own drop-net group, pass 1
        on X [+ pass 2 on the same encoder states with DDR] [+ X⁺ and X⁻, one batched pass, with ALD]. Only X's
        passes are projected to the vocabulary. Each term is a sum over its units divided by the step's count of
        them (`hf_deepnmt.losses.resolve_normalizers`).
        """
        config = self.config
        epsilon = config.label_smoothing if smoothing_epsilon is None else float(smoothing_epsilon)
        pad = config.pad_token_id
        ddr, ald = config.ddr_weight > 0.0, config.ald_weight > 0.0
        diversity_stacks = config.diversity_stacks() if config.diversity_weight > 0.0 else ()
        b = labels.size(0)
        passes = 2 if ddr else 1
        mask = target_mask(labels, pad)  # (B, T) the target positions every token-level term sums over
        extra = {"encoder_outputs": encoder_outputs, "inputs_embeds": inputs_embeds,
                 "decoder_inputs_embeds": decoder_inputs_embeds}
        if (ddr or ald) and any(value is not None for value in extra.values()):
            given = sorted(name for name, value in extra.items() if value is not None)
            raise ValueError(f"{type(self).__name__}: li2022's DDR/ALD training objective needs input_ids and "
                             f"decoder ids (it builds several views of them); got {given} instead.")
        if num_items_in_batch is not None and loss_normalizers is None and pad is not None and bool((labels == pad).any()):
            logger.warning_once(
                f"{type(self).__name__}: `labels` contain pad_token_id={pad}; the loss ignores them, but transformers' "
                "Trainer counts them in `num_items_in_batch`, which shrinks every update — pad labels with -100 "
                "(DataCollatorForSeq2Seq does by default) or train with DeepNMTTrainer, which counts exactly.")
        groups: list[int] | None = None
        encoder_row_index = None
        if ddr or ald:
            rows = torch.arange(b, device=labels.device)
            sources, encoder_index, groups = [input_ids], [rows] * passes, [b] * passes
            if ald:
                positive, negative = ald_views(input_ids, attention_mask, config)  # §3.4 li2022: X⁺, X⁻
                sources += [positive, negative]
                encoder_index += [rows + b, rows + 2 * b]
                groups.append(2 * b)
            views = len(encoder_index)  # decoder row blocks of B
            input_ids = torch.cat(sources, dim=0)  # (n·B, S)
            attention_mask = None if attention_mask is None else attention_mask.repeat(len(sources), 1)
            decoder_input_ids = decoder_input_ids.repeat(views, 1)  # (views·B, T)
            if decoder_attention_mask is not None:
                decoder_attention_mask = decoder_attention_mask.repeat(views, 1)
            encoder_row_index = torch.cat(encoder_index)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=bool(output_hidden_states) or bool(diversity_stacks),
            encoder_row_index=encoder_row_index,
            drop_net_group_sizes=groups,
        )
        states = outputs.last_hidden_state  # (views·B, T, d): the states fed to the output projection
        logits = self.lm_head(states[: passes * b])  # (passes·B, T, V)
        log_probs = F.log_softmax(logits.float(), dim=-1)  # shared by the NLL and DDR
        smoothed_sum, nll_sum, count = label_smoothed_nll_loss(
            logits, labels.repeat(passes, 1), epsilon, pad, log_probs=log_probs)
        target_tokens = count // passes
        terms = [
            # the NLL averages the DDR passes (as R-Drop does, docs/li2022.md)
            LossTerm("smoothed_nll", smoothed_sum / passes, target_tokens, "target_tokens", 1.0),
            LossTerm("nll", nll_sum / passes, target_tokens, "target_tokens", 0.0),
        ]
        if ddr:
            # unbind (not slicing): its backward stacks the two gradients instead of zero-filling two full buffers
            lp1, lp2 = log_probs.view(2, b, *log_probs.shape[1:]).unbind(0)  # 2 × (B, T, V)
            terms.append(LossTerm("ddr", ddr_sum_from_log_probs(lp1, lp2, mask), target_tokens, "target_tokens",
                                  config.ddr_weight))  # §3.4 li2022 J_DDR, per target token
        if ald:
            pooled = mean_pool(states, mask.repeat(views, 1))  # (views·B, d) §3.4 li2022 G(·, Y) = AVGPOOL(H_d^{L_d})
            anchor, positive_g, negative_g = pooled[:b], pooled[passes * b:(passes + 1) * b], pooled[(passes + 1) * b:]
            per_sentence = ald_losses(anchor, positive_g, negative_g, config.ald_temperature)  # Eq. (6) li2022, (B,)
            terms.append(LossTerm("ald", per_sentence.sum(), torch.tensor(b, device=labels.device), "sentences",
                                  config.ald_weight))
        if diversity_stacks:
            # Eq. (9) dou2018 maximises layer diversity: the trained objective is NLL − λ·L_div, so its weight is
            # −λ, shared by the stacks it applies to (the mean of their L_div; docs/dou2018.md). A sign error here
            # would be silent: tests/test_dou2018.py checks the direction of the gradient.
            weight = -config.diversity_weight / len(diversity_stacks)
            if "encoder" in diversity_stacks:
                source_mask = (attention_mask[:b].bool() if attention_mask is not None
                               else input_ids[:b] != pad if input_ids is not None
                               else torch.ones(outputs.encoder_last_hidden_state.shape[:2], dtype=torch.bool,
                                               device=labels.device))
                layers = [h[:b] for h in outputs.encoder_hidden_states[1:]]  # H^1 … H^L of X's rows
                terms.append(LossTerm("div_encoder", layer_diversity_sum(layers, source_mask), source_mask.sum(),
                                      "source_tokens", weight))
            if "decoder" in diversity_stacks:
                layers = [h[:passes * b] for h in outputs.decoder_hidden_states[1:]]  # X's passes (both with DDR)
                terms.append(LossTerm("div_decoder", layer_diversity_sum(layers, mask.repeat(passes, 1)) / passes,
                                      target_tokens, "target_tokens", weight))
        local = {
            "target_tokens": target_tokens,
            "source_tokens": (attention_mask[:b].sum() if attention_mask is not None
                              else (input_ids[:b] != pad).sum() if input_ids is not None
                              else torch.tensor(0, device=labels.device)),
            "sentences": torch.tensor(b, device=labels.device),
        }
        normalizers = resolve_normalizers(local, loss_normalizers, num_items_in_batch)
        loss, components, counts = combine_terms(terms, normalizers)
        first = slice(0, b)
        return DeepTransformerSeq2SeqLMOutput(
            loss=loss,
            logits=logits[first],
            encoder_last_hidden_state=outputs.encoder_last_hidden_state[first],
            decoder_hidden_states=None if not output_hidden_states
            else tuple(h[first] for h in outputs.decoder_hidden_states),
            encoder_hidden_states=None if not output_hidden_states
            else tuple(h[first] for h in outputs.encoder_hidden_states),
            decoder_attentions=None if outputs.decoder_attentions is None
            else tuple(a[first] for a in outputs.decoder_attentions),
            cross_attentions=None if outputs.cross_attentions is None
            else tuple(None if a is None else a[first] for a in outputs.cross_attentions),
            encoder_attentions=None if outputs.encoder_attentions is None
            else tuple(a[first] for a in outputs.encoder_attentions),
            loss_components=components,
            loss_component_counts=counts,
        )


# ----------------------------------------------------------------------------------------------------------------
# 5. Paper-named models: the same implementation with their own model_type and defaults
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
