"""Multi-head attention of the Transformer family, softmax(Q Kᵀ / √d_h + M) V (Vaswani et al. 2017, Eq. (1)-(2)):
the module with its projections (`DeepTransformerAttention`), the masks and the kernels it calls.

`DeepTransformerAttention` lives here, not in modeling_deep_transformer.py, for a second reason: transformers decides
whether ``set_attn_implementation`` may switch kernels at run time by reading the *model class's* module source — if
that file defines an ``*Attention*(nn.Module)`` class it must also call ``ALL_ATTENTION_FUNCTIONS.get_interface(``
(``PreTrainedModel._can_set_attn_implementation``, transformers 5.2x). Keeping the attention module and the
interface dispatch together here keeps that check true.

What the module calls once it has projected queries, keys and values:

* the masks — boolean key-padding and causal masks, turned once per stack forward into the additive mask every
  layer shares (`additive_mask`);
* `attention`: SDPA, or the explicit product when weights are requested, for ``attn_implementation="eager"`` and for
  many-row single-query decoding steps on CPU (docs/transformer.md, "Attention");
* `interface_attention`: any kernel registered with transformers' `AttentionInterface` — flex attention (the mask as a
  `BlockMask`) and FlashAttention (the batch packed into varlen sequences, exact for cross-attention and any key
  padding).

transformers' own `masking_utils` builds masks for decoder-only self-attention from cache positions; it has no
cross-attention mask over a source padded differently from the target, no per-row li2022 drop-net and no dou2018
multi-layer attention slots, so the masks here stay our own (docs/transformer.md, "Attention").

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch and
transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

from .errors import UserInputError

if TYPE_CHECKING:
    from .configuration_deep_transformer import DeepTransformerConfig

logger = logging.get_logger(__name__)


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
# The same crossover for a sentence's beams read as the queries of its one memory row (`grouped_beams`, 4 queries
# per row): the kernel's per-row overhead is shared by fewer rows, and the matmuls win from ~32 rows on (torch 2.13,
# one thread, 4 beams over 30 keys: 1.2x at 64 and 128 rows, a tie at 32, SDPA 1.8x faster at 4; head dims 32, 64).
EXPLICIT_GROUPED_MIN_ROWS = 64


def decoder_self_attention_mask(
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


def decoder_attention_masks(attention_mask: torch.Tensor | None, encoder_attention_mask: torch.Tensor | None,
                            hidden_states: torch.Tensor, past_length: int
                            ) -> tuple[torch.Tensor | None, bool, torch.Tensor | None]:
    """A decoder pass's masks: the causal self-attention mask over the target so far, whether it is plain causal
    (SDPA's fast path), and the source padding mask of the cross-attention; additive, in the states' dtype."""
    batch, length = hidden_states.shape[:2]
    if attention_mask is not None and attention_mask.dim() == 2 and attention_mask.shape != (
            batch, past_length + length):
        raise UserInputError(f"`decoder_attention_mask` has shape {tuple(attention_mask.shape)}; it needs one 1/0 "
                             f"entry per target token so far, {(batch, past_length + length)}.")
    self_mask, is_causal = decoder_self_attention_mask(attention_mask, length, past_length, hidden_states.device)
    self_mask = additive_mask(self_mask, hidden_states.dtype)  # (B or 1, 1, T, past+T)
    cross_mask = additive_mask(padding_mask(encoder_attention_mask), hidden_states.dtype)  # (B, 1, 1, S)
    return self_mask, is_causal, cross_mask


def multi_layer_cache_slot(layer_idx: int, source: int, num_layers: int) -> int:
    """Self-attention cache slot of dou2018 multi-layer attention to H^{l−source} in decoder layer ``layer_idx``:
    slots 0 … L−1 are the layers' own self-attention, then one block of L slots per extra source (j = 2 … k)."""
    return layer_idx if source == 1 else (source - 1) * num_layers + layer_idx


def ensure_cache_slots(cache: DynamicCache, slots: int) -> None:
    """Give a self-attention cache room for ``slots`` layers (generate sizes it from ``decoder_layers``; dou2018's
    multi-layer attention keeps keys/values per attended layer in extra slots, which beam search reorders too)."""
    while len(cache.layers) < slots:
        cache.layers.append(DynamicLayer())


class DeferredReorderLayer(DynamicLayer):
    """A self-attention cache layer for beam search whose reorder waits for the next append.

    transformers' `DynamicLayer` copies the whole cache twice per beam-search step: the reorder gathers the rows the
    surviving hypotheses continue from (``index_select``), then the next step appends the new position
    (``torch.cat``). Here the reorder only records the rows (composing several reorders into one index), and the
    append gathers them straight into the grown tensor: one copy per step, the same keys and values
    (docs/transformer.md, "Caches"). Whoever reads ``keys``/``values`` in between (a returned cache) gets them
    reordered then: the pending rows are applied on that read.
    """

    pending: torch.Tensor | None = None
    _keys: torch.Tensor | None = None
    _values: torch.Tensor | None = None

    @property
    def keys(self) -> torch.Tensor | None:  # type: ignore[override]
        self._apply_pending()
        return self._keys

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._keys = value

    @property
    def values(self) -> torch.Tensor | None:  # type: ignore[override]
        self._apply_pending()
        return self._values

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._values = value

    def _apply_pending(self) -> None:
        if self.pending is not None:
            rows, self.pending = self.pending, None
            self._keys, self._values = self._keys.index_select(0, rows), self._values.index_select(0, rows)

    def get_seq_length(self) -> int:
        """The cached length, read without applying a pending reorder (the decoder asks every step)."""
        if not self.is_initialized or self._keys is None or self._keys.numel() == 0:
            return 0
        return self._keys.shape[-2]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            rows = beam_idx.to(self._keys.device)
            self.pending = rows if self.pending is None else self.pending.index_select(0, rows)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pending is None or not self.is_initialized:
            return super().update(key_states, value_states, *args, **kwargs)
        rows, self.pending = self.pending, None
        self._keys = _gather_and_append(self._keys, rows, key_states)
        self._values = _gather_and_append(self._values, rows, value_states)
        return self._keys, self._values


def _gather_and_append(cached: torch.Tensor, rows: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``cat([cached[rows], new], dim=-2)`` without the intermediate ``cached[rows]``: ``(R, H, t + q, d_h)``."""
    past = cached.size(-2)
    grown = cached.new_empty(rows.size(0), cached.size(1), past + new.size(-2), cached.size(-1))
    torch.index_select(cached, 0, rows, out=grown[:, :, :past])  # written in place into the strided view
    grown[:, :, past:] = new
    return grown


def add_empty_rows(layer: DynamicLayer, rows: int) -> None:
    """Append ``rows`` rows of zeros to a self-attention cache layer, ``(R, H, t, d_h)`` → ``(R + rows, H, t, d_h)``:
    sentences that join a running search (`hf_deepnmt.retiring_search.ContinuousSearch`) have no past yet, and the
    decoder's mask hides these positions from them (a pending deferred reorder is applied first)."""
    if layer.is_initialized and layer.get_seq_length() > 0:
        keys, values = layer.keys, layer.values
        layer.keys = torch.cat((keys, keys.new_zeros(rows, *keys.shape[1:])))
        layer.values = torch.cat((values, values.new_zeros(rows, *values.shape[1:])))


def drop_leading_columns(layer: DynamicLayer, columns: int) -> None:
    """Drop the first ``columns`` positions of a self-attention cache layer (a view, no copy): positions every row's
    mask hides once the sentences that had them left the search. A deferred reorder stays pending (rows only)."""
    if columns and layer.is_initialized and layer.get_seq_length() > 0:
        if isinstance(layer, DeferredReorderLayer):
            layer._keys, layer._values = layer._keys[:, :, columns:], layer._values[:, :, columns:]
        else:
            layer.keys, layer.values = layer.keys[:, :, columns:], layer.values[:, :, columns:]


def keep_leading_columns(layer: DynamicLayer, columns: int) -> None:
    """Keep the first ``columns`` positions of a cross-attention cache layer (a view, no copy): its memory once the
    longest source left the search."""
    if layer.is_initialized and layer.get_seq_length() > 0:
        layer.keys, layer.values = layer.keys[:, :, :columns], layer.values[:, :, :columns]


def join_rows(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Append rows ``(n, H, S', d_h)`` to a cross-attention cache layer of ``(M, H, S, d_h)``: both padded with zeros
    to the longer source (the source mask hides the padding)."""
    width = max(layer.keys.size(-2), keys.size(-2))

    def padded(tensor: torch.Tensor) -> torch.Tensor:
        return F.pad(tensor, (0, 0, 0, width - tensor.size(-2)))  # (n, H, width, d_h)

    layer.keys = torch.cat((padded(layer.keys), padded(keys)))
    layer.values = torch.cat((padded(layer.values), padded(values)))


def beam_search_cache(num_layers: int) -> EncoderDecoderCache:
    """An empty decoding cache whose ``num_layers`` self-attention layers defer beam reorders
    (`DeferredReorderLayer`); further slots (dou2018's multi-layer attention) are ordinary layers."""
    self_attention = DynamicCache()
    self_attention.layers = [DeferredReorderLayer() for _ in range(num_layers)]
    return EncoderDecoderCache(self_attention, DynamicCache())


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    dropout_p: float,
    need_weights: bool,
    eager: bool = False,
    grouped_beams: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(Q Kᵀ / sqrt(d_h) + M) V (Vaswani et al. Eq. 1) on ``(B, H, T, d_h)`` tensors.

    ``mask`` M is additive (0 = attend, -inf = masked, see `additive_mask`) and broadcasts to ``(B, H, Tq, Tk)``;
    ``is_causal`` is only used with Tq == Tk. Uses `torch.nn.functional.scaled_dot_product_attention`
    (docs/transformer.md), except in two cases that take the explicit product below:

    * the weights are requested (``output_attentions=True``) or ``eager`` (``attn_implementation="eager"``);
    * one incremental decoding step (a single query, or ``grouped_beams``: a sentence's beams as the queries of its
      one memory row, `DeepTransformerAttention._grouped_attention`) of many (batch, head) rows on CPU, where the CPU
      flash kernel's per-row overhead makes SDPA up to 2x slower than two batched matmuls (with few rows SDPA is the
      faster one; `EXPLICIT_SINGLE_QUERY_MIN_ROWS`, `EXPLICIT_GROUPED_MIN_ROWS`, benchmarks/RESULTS.md "Profile and fixes"; 4 beams over 40 keys,
      32 sentences × 4 heads, one thread: 86 µs explicit vs 124 µs SDPA);
    * `torch.onnx.export` (``torch.compiler.is_exporting()``): the graph holds the product itself (docs/fast-inference.md).
    """
    # torch.onnx.export traces the explicit product: no branch on the (symbolic) batch size, and ONNX Runtime fuses it
    exporting = torch.compiler.is_exporting()
    rows = query.size(0) * query.size(1)
    explicit_decoding_step = not exporting and query.device.type == "cpu" and (
        (grouped_beams and rows >= EXPLICIT_GROUPED_MIN_ROWS)
        or (query.size(-2) == 1 and rows >= EXPLICIT_SINGLE_QUERY_MIN_ROWS))
    if not need_weights and not explicit_decoding_step and not eager and not exporting:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
        return out, None
    scores = torch.matmul(query, key.transpose(-1, -2)) * query.size(-1) ** -0.5  # (B, H, Tq, Tk)
    if is_causal and mask is None:
        mask = additive_mask(causal_mask(query.size(-2), key.size(-2), query.device), scores.dtype)
    if mask is not None:
        scores = scores + mask
    if scores.dtype == torch.float32:
        weights = torch.softmax(scores, dim=-1)
    else:  # the softmax in float32, as SDPA's CPU kernel computes it
        weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    out = torch.matmul(weights, value)  # (B, H, Tq, d_h)
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
        raise UserInputError(f"`attn_implementation` = {implementation!r} is not registered with transformers' "
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
            raise UserInputError(
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


class RealPositions:
    """The positions of a padded ``(B, T)`` batch whose outputs are needed, for running every position-wise
    computation on them alone (docs/transformer.md, "Padding in training").

    In training, the stacks carry their states *packed*, ``(N, d)`` with one row per needed position, through every
    projection, FFN, LayerNorm, dropout and residual; only the attention products see the padded ``(B, T, …)``
    layout, which `unpack` builds (zeros at the skipped positions) and `pack` takes apart again. For a needed
    position the arithmetic is the padded computation's; a skipped position's output is zero instead of a value no
    loss reads. Which positions are skipped is the caller's promise that nothing needed depends on them: source
    padding (masked as keys everywhere), and the target positions after a row's last label (later positions under
    a causal mask).
    """

    def __init__(self, keep: torch.Tensor) -> None:
        self.batch, self.length = keep.shape
        self.rows = keep.reshape(-1).nonzero().squeeze(1)  # (N,) flat index b·T + t of every kept position

    def pack(self, states: torch.Tensor) -> torch.Tensor:
        """``(B, T, …)`` -> ``(N, …)``: the kept positions, in batch-major order."""
        flat = states.reshape(self.batch * self.length, *states.shape[2:])  # (B·T, …)
        return flat.index_select(0, self.rows)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """``(N, …)`` -> ``(B, T, …)``, zeros at the skipped positions."""
        flat = packed.new_zeros(self.batch * self.length, *packed.shape[1:])  # (B·T, …)
        flat.index_copy_(0, self.rows, packed)
        return flat.view(self.batch, self.length, *packed.shape[1:])

    def per_position(self, per_row: torch.Tensor) -> torch.Tensor:
        """A ``(B, 1, 1)`` per-row value as ``(N, 1)``, one entry per kept position (li2022's per-row drop-net)."""
        return per_row.reshape(self.batch, 1).index_select(0, torch.div(self.rows, self.length, rounding_mode="floor"))


def real_positions(keep: torch.Tensor | None, training: bool) -> RealPositions | None:
    """`RealPositions` for a training forward with something to skip; None otherwise — evaluation, generation and
    export keep the padded layout (their outputs are unchanged at every position), and so does `torch.compile`,
    whose graphs would break on the data-dependent number of kept positions."""
    if keep is None or not training or torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return None
    if keep.dim() != 2 or bool(keep.all()):
        return None
    return RealPositions(keep)


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

    def memory(self, encoder_hidden_states: torch.Tensor | None, cache: EncoderDecoderCache | None,
               positions: RealPositions | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A cross-attention's keys and values ``(B, H, S, d_h)``: the encoder states projected once per sentence and
        kept in ``cache.cross_attention_cache`` (read back on later steps; ``encoder_hidden_states`` may then be None).
        The first decoding step calls this lazily; the ONNX export's encoder graph calls it for every layer up front
        (`DeepTransformerDecoder.project_memory`). With ``positions`` the encoder states come packed, ``(N_S, d)``:
        only the source's real tokens are projected."""
        if cache is not None and cache.is_updated.get(self.layer_idx):
            layer = cache.cross_attention_cache.layers[self.layer_idx]
            return layer.keys, layer.values  # projected on the first step
        key = self._heads(_unpacked(self.k_proj(encoder_hidden_states), positions))  # (B, H, S, d_h)
        value = self._heads(_unpacked(self.v_proj(encoder_hidden_states), positions))
        if cache is not None:
            key, value = cache.cross_attention_cache.update(key, value, self.layer_idx)
            cache.is_updated[self.layer_idx] = True
        return key, value

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
        positions: RealPositions | None = None,
        memory_positions: RealPositions | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``positions``: the query states (and a multi-layer attention's lower states) come packed, ``(N, d)``,
        and so does the output; ``memory_positions``: the same for a cross-attention's encoder states
        (`RealPositions`). The projections run on the packed rows, the attention product on the padded layout."""
        query = self._heads(_unpacked(self.q_proj(hidden_states), positions))  # (B, H, Tq, d_h)
        batch, length = query.size(0), query.size(2)
        if self.is_cross_attention:
            key, value = self.memory(key_value_states, cache, memory_positions)  # (B, H, S, d_h)
        else:
            source = hidden_states if key_value_states is None else key_value_states  # (B, Tq, d) or (N, d)
            key = self._heads(_unpacked(self.k_proj(source), positions))  # (B, H, Tq, d_h)
            value = self._heads(_unpacked(self.v_proj(source), positions))
            if cache is not None:
                key, value = cache.self_attention_cache.update(key, value, self.layer_idx)  # (B, H, past+Tq, d_h)
        implementation = getattr(self.config, "_attn_implementation", None) or "sdpa"
        dropout = self.dropout if self.training else 0.0
        groups = memory_groups(batch, key.size(0)) if self.is_cross_attention else 1
        explicit = implementation in ("sdpa", "eager") or output_attentions
        if groups > 1 and explicit:
            out, weights = self._grouped_attention(query, key, value, attention_mask, groups, dropout,
                                                   output_attentions, implementation == "eager")
        elif explicit:
            out, weights = attention(query, key, value, attention_mask, is_causal, dropout, output_attentions,
                                     eager=implementation == "eager")
            out = out.transpose(1, 2)  # (B, Tq, H, d_h)
        else:  # a kernel registered with transformers' AttentionInterface (docs/transformer.md, "Attention")
            if groups > 1:  # the kernels take one key row per query row
                key, value = key.repeat_interleave(groups, 0), value.repeat_interleave(groups, 0)  # (B, H, S, d_h)
                if attention_mask is not None and attention_mask.size(0) > 1:
                    attention_mask = attention_mask.repeat_interleave(groups, 0)
            out = interface_attention(self, implementation, query, key, value, attention_mask, is_causal,
                                      dropout)  # (B, Tq, H, d_h)
            weights = None
        out = out.reshape(batch, length, self.embed_dim)  # (B, Tq, d)
        if positions is not None:
            out = positions.pack(out)  # (N, d)
        return self.out_proj(out), weights

    @staticmethod
    def _grouped_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                           groups: int, dropout: float, need_weights: bool,
                           eager: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Cross-attention of ``groups`` consecutive query rows over one memory row each: the beams of a sentence
        read its source keys/values once, as one ``(groups·Tq)``-query attention, instead of one copy per beam
        (docs/transformer.md, "Caches"). The same softmax(QKᵀ/√d_h + M)V per query; ``(M·g, H, Tq, d_h)`` queries,
        ``(M, H, S, d_h)`` keys/values; returns ``(M·g, Tq, H, d_h)`` and the weights ``(M·g, H, Tq, S)``."""
        rows, heads, length, head_dim = query.shape
        memory = key.size(0)
        grouped = query.view(memory, groups, heads, length, head_dim).transpose(1, 2)  # (M, H, g, Tq, d_h)
        grouped = grouped.reshape(memory, heads, groups * length, head_dim)  # (M, H, g·Tq, d_h)
        out, weights = attention(grouped, key, value, mask, False, dropout, need_weights, eager=eager,
                                 grouped_beams=length == 1)  # (M, H, g·Tq, d_h)
        out = out.view(memory, heads, groups, length, head_dim).permute(0, 2, 3, 1, 4)  # (M, g, Tq, H, d_h)
        out = out.reshape(rows, length, heads, head_dim)  # (M·g, Tq, H, d_h)
        if weights is not None:
            source = weights.size(-1)
            weights = weights.view(memory, heads, groups, length, source).transpose(1, 2)  # (M, g, H, Tq, S)
            weights = weights.reshape(rows, heads, length, source)  # (M·g, H, Tq, S)
        return out, weights


def memory_groups(query_rows: int, memory_rows: int) -> int:
    """How many consecutive query rows share one memory row in a cross-attention: 1 when each query row has its own;
    ``g`` when the memory holds one row per sentence and the queries ``g`` (its beams, `retiring_generate`)."""
    if query_rows == memory_rows:
        return 1
    if memory_rows == 0 or query_rows % memory_rows:
        raise UserInputError(f"cross-attention: {query_rows} decoder rows cannot share {memory_rows} encoder rows; "
                             "give one encoder row per decoder row, or one per group of consecutive decoder rows.")
    return query_rows // memory_rows


def _unpacked(states: torch.Tensor, positions: RealPositions | None) -> torch.Tensor:
    """Projected states in the padded ``(B, T, d)`` layout the attention product needs."""
    return states if positions is None else positions.unpack(states)
