"""`DTMTCache`: what DTMT's decoder carries from one decoding step to the next.

An RNN decoder needs no growing key/value cache: meng2019's decoder state s_{t-1} (Eq. (2)) holds the whole target
prefix. What is worth keeping is everything computed once per source sentence: the attention keys U·h_j projected
once (§Model Description, multi-head additive attention), the annotations split into heads (the values) and the
additive source mask. `generate` threads the object through ``past_key_values``; beam search reorders it.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch and
transformers.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache


class DecoderStateCache(Cache):
    """A decoder state carried from one decoding step to the next instead of a growing key/value cache: what
    `generate` needs of it (``get_seq_length``, the reorders of beam search and of the Hub's decoding methods) over
    ``seen_tokens`` and the subclass's row selection `_select`. A state cannot be rolled back: `crop` refuses, so
    transformers refuses assisted and speculative decoding. Subclasses: `DTMTCache`; the ONNX runtime's
    ``OnnxDecoderCache`` (ort_generation.py)."""

    is_compileable = False
    seen_tokens: int

    def __len__(self) -> int:
        return 1

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def batch_size(self) -> int:
        raise NotImplementedError

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return True

    def _select(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` of every tensor, in place."""
        raise NotImplementedError

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Make every row follow ``beam_idx`` (row r takes the old row ``beam_idx[r]``), in place."""
        self._select(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select(torch.arange(self.batch_size).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select(torch.as_tensor(indices))

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise ValueError(f"{type(self).__name__}: a decoder state cannot be rolled back (no assisted or "
                             "speculative decoding).")

    def reset(self) -> None:
        raise ValueError(f"{type(self).__name__}: a decoder state cannot be reset; start a new generate() call.")


class DTMTCache(DecoderStateCache):
    """Incremental decoding state of `DTMTForConditionalGeneration`.

    Args:
        state: ``(B, d)`` decoder state s_{t-1} after the last decoded token (s_0 before the first).
        keys: ``(B, H, S, d/H)`` attention keys, the annotations projected once per sentence.
        values: ``(B, H, S, 2d/H)`` annotations split into heads (no value projection, as the authors' code).
        mask_bias: ``(B, 1, S)`` additive source mask: 0 at real tokens, a large negative number at padding.
        seen_tokens: decoder input tokens consumed so far (the next token's position for the positional encoding).

    Every tensor has the (beam-expanded) batch as its first dimension. `reorder_cache` selects rows of all of them;
    `DTMTForConditionalGeneration._reorder_cache`, which beam search calls, moves only the state (see there).
    A recurrent state cannot be rolled back, so `crop` refuses (no assisted/speculative decoding).
    """

    def __init__(self, state: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask_bias: torch.Tensor,
                 seen_tokens: int = 0) -> None:
        super().__init__(layers=[])
        self.state = state
        self.keys = keys
        self.values = values
        self.mask_bias = mask_bias
        self.seen_tokens = seen_tokens

    def __repr__(self) -> str:
        return (f"DTMTCache(batch={self.state.size(0)}, d={self.state.size(-1)}, source_length={self.keys.size(2)}, "
                f"seen_tokens={self.seen_tokens})")

    @property
    def batch_size(self) -> int:
        return self.state.size(0)

    def _select(self, index: torch.Tensor) -> None:
        self.state = self.state.index_select(0, index.to(self.state.device))
        self.keys = self.keys.index_select(0, index.to(self.keys.device))
        self.values = self.values.index_select(0, index.to(self.values.device))
        self.mask_bias = self.mask_bias.index_select(0, index.to(self.mask_bias.device))

    def reorder_state(self, beam_idx: torch.LongTensor) -> None:
        """Reorder only the decoder state: enough when ``beam_idx`` stays within each sentence's beam group, whose
        rows hold the same keys, values and mask."""
        self.state = self.state.index_select(0, beam_idx.to(self.state.device))
