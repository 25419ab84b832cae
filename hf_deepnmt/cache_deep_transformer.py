"""The DeepTransformer's decoding-cache plumbing (DTMT's is cache_dtmt.py): the decoder's `EncoderDecoderCache` —
made, checked, given one slot per dou2018 multi-layer attention source, holding the projected encoder memory — and
the cache `generate`'s beam search starts from and reorders. No equation lives here: the attention that reads and
writes the cache is attention.py's, the layers and models are modeling_deep_transformer.py's.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from .attention import beam_search_cache, ensure_cache_slots
from .generation_common import CACHE_NAME


class DecoderCacheMixin:
    """The cache of `DeepTransformerDecoder`: the one a pass reads and extends, and the encoder memory in it."""

    config: Any
    layers: nn.ModuleList
    gradient_checkpointing: bool
    training: bool

    def project_memory(self, encoder_hidden_states: torch.Tensor, cache: EncoderDecoderCache) -> None:
        """Project the encoder states into the keys and values of every cross-attention and keep them in ``cache``,
        as the first decoding step does lazily; the ONNX export's encoder graph does it up front
        (docs/fast-inference.md)."""
        for layer in self.layers:
            if layer.encoder_attn is not None:
                layer.encoder_attn.memory(encoder_hidden_states, cache)

    def holds_memory(self, cache: EncoderDecoderCache | None) -> bool:
        """Whether ``cache`` already holds the keys and values of every cross-attention (no encoder states needed)."""
        return cache is not None and all(cache.is_updated.get(layer.layer_idx, False) for layer in self.layers
                                         if layer.encoder_attn is not None)

    def _decoding_cache(self, past_key_values: EncoderDecoderCache | None,
                        use_cache: bool | None) -> tuple[EncoderDecoderCache | None, bool]:
        """The cache this pass reads and extends (None: no incremental decoding) and whether it is returned."""
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
        if cache is not None and self.config.multi_layer_attention_k > 1:
            # Eq. (8) dou2018: one self-attention key/value slot per layer and attended source layer
            ensure_cache_slots(cache.self_attention_cache, self.config.multi_layer_attention_k * len(self.layers))
        return cache, use_cache


class GenerationCacheMixin:
    """The caches of `DeepTransformerForConditionalGeneration`'s beam search: the one it starts from and how it
    follows the surviving hypotheses. Put before `TranslationGenerationMixin`, whose `_add_generation_cache` adds
    nothing."""

    config: Any
    generation_config: Any
    # The cross-attention takes one encoder row per sentence for g consecutive decoder rows (its beams): the retiring
    # search passes the source once per sentence (`hf_deepnmt.attention.memory_groups`, docs/transformer.md "Caches").
    beams_share_memory = True
    # Sentences may join a running retiring search: every row takes its own positions (`decoder_position_ids`) and
    # masks the cache columns before its first one (`hf_deepnmt.retiring_search.ContinuousSearch`, docs/serving.md).
    admits_mid_search = True

    def _add_generation_cache(self, kwargs: dict[str, Any]) -> None:
        """transformers' beam search (`TranslationGenerationMixin.generate`) starts from `beam_search_cache` (the
        same beams and scores, one copy of the self-attention cache per step instead of two) unless the call brings
        its own cache, a ``cache_implementation`` or ``use_cache=False``."""
        settings = kwargs.get("generation_config") or self.generation_config
        beams = kwargs.get("num_beams", settings.num_beams) or 1
        own = any(kwargs.get(name) is not None for name in ("cache", "past_key_values", "cache_implementation"))
        if (beams > 1 and not own and kwargs.get("use_cache", settings.use_cache) is not False
                and settings.cache_implementation is None and not torch.compiler.is_compiling()):
            kwargs[CACHE_NAME] = self.beam_search_cache()

    def beam_search_cache(self) -> EncoderDecoderCache:
        """An empty decoding cache for beam search whose self-attention layers gather each step's reordered rows
        straight into the grown cache (`hf_deepnmt.attention.DeferredReorderLayer`; the retiring search uses it)."""
        return beam_search_cache(self.config.decoder_layers)

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
