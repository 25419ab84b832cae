"""The performance shortcuts of modeling_deep_transformer.py give the results of the plain computation they replace
(benchmarks/RESULTS.md, "Profile and fixes", measures what each one saves)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from transformers.cache_utils import EncoderDecoderCache


@pytest.mark.parametrize("num_beams,batch_rows", [(4, 2), (3, 1)])
def test_beam_search_without_cross_attention_reorder_equals_full_reorder(batch, num_beams, batch_rows):
    """`_reorder_cache` leaves the cross-attention keys/values in place: identical outputs to reordering them."""
    model = tiny_model()
    source = dict(input_ids=batch["input_ids"][:batch_rows], attention_mask=batch["attention_mask"][:batch_rows])
    kwargs = dict(num_beams=num_beams, num_return_sequences=2, max_new_tokens=10, return_dict_in_generate=True,
                  output_scores=True)
    fast = model.generate(**source, **kwargs)

    def full_reorder(past_key_values: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        past_key_values.reorder_cache(beam_idx)  # EncoderDecoderCache's: self- and cross-attention
        return past_key_values

    model._reorder_cache = full_reorder
    full = model.generate(**source, **kwargs)
    assert torch.equal(fast.sequences, full.sequences)
    assert torch.equal(fast.sequences_scores, full.sequences_scores)


def test_cross_attention_cache_rows_are_identical_within_a_beam_group(batch):
    """The premise of skipping the reorder: every beam of a sentence holds the same cross-attention keys/values."""
    model = tiny_model()
    captured = {}

    def spy(past_key_values: EncoderDecoderCache, beam_idx: torch.Tensor) -> EncoderDecoderCache:
        captured["keys"] = past_key_values.cross_attention_cache.layers[0].keys.clone()  # (B·beams, H, S, d_h)
        past_key_values.self_attention_cache.reorder_cache(beam_idx)
        return past_key_values

    model._reorder_cache = spy
    model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4,
                   max_new_tokens=3)
    keys = captured["keys"].view(2, 4, *captured["keys"].shape[1:])  # (B, beams, H, S, d_h)
    assert torch.equal(keys, keys[:, :1].expand_as(keys))
