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
    model.generate_by_retiring_search = False  # transformers' loop, whose cache this is about
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


def test_explicit_single_query_attention_equals_sdpa():
    """Decoding steps with many (batch, head) rows skip SDPA's CPU kernel; the result is the same attention."""
    from hf_deepnmt.attention import EXPLICIT_SINGLE_QUERY_MIN_ROWS, additive_mask, attention

    torch.manual_seed(0)
    batch, heads, keys = EXPLICIT_SINGLE_QUERY_MIN_ROWS // 4, 4, 7
    query, key, value = torch.randn(batch, heads, 1, 8), torch.randn(batch, heads, keys, 8), torch.randn(batch, heads, keys, 8)
    lengths = torch.randint(1, keys + 1, (batch,))
    mask = additive_mask((torch.arange(keys)[None] < lengths[:, None])[:, None, None, :], query.dtype)  # (B, 1, 1, S)
    for m in (None, mask):
        expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=m)
        got, weights = attention(query, key, value, m, is_causal=False, dropout_p=0.0, need_weights=False)
        assert weights is None
        assert torch.allclose(got, expected, atol=1e-6)


def test_grouped_beams_take_the_explicit_attention_from_its_row_count_and_equal_sdpa(monkeypatch):
    """A sentence's beams read as the queries of its one memory row (`grouped_beams`) take the two batched matmuls
    from EXPLICIT_GROUPED_MIN_ROWS (batch x heads) rows on, SDPA below; both give SDPA's attention."""
    from hf_deepnmt import attention as attention_module
    from hf_deepnmt.attention import EXPLICIT_GROUPED_MIN_ROWS, additive_mask, attention

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention",
                        lambda *args, **kwargs: calls.append(args[0].shape) or sdpa(*args, **kwargs))
    torch.manual_seed(0)
    heads, beams, keys = 4, 4, 9
    for rows, explicit in ((EXPLICIT_GROUPED_MIN_ROWS, True), (EXPLICIT_GROUPED_MIN_ROWS - heads, False)):
        memory = rows // heads
        query = torch.randn(memory, heads, beams, 8)  # (M, H, g, d_h): each sentence's beams
        key, value = torch.randn(memory, heads, keys, 8), torch.randn(memory, heads, keys, 8)
        lengths = torch.randint(1, keys + 1, (memory,))
        mask = additive_mask((torch.arange(keys)[None] < lengths[:, None])[:, None, None, :], query.dtype)
        calls.clear()
        got, _ = attention(query, key, value, mask, is_causal=False, dropout_p=0.0, need_weights=False,
                           grouped_beams=True)
        assert (not calls) == explicit, (rows, calls)
        assert torch.allclose(got, sdpa(query, key, value, attn_mask=mask), atol=1e-6)


def test_cached_decoding_through_the_explicit_attention_equals_uncached():
    """Enough sentences x beams x heads (>= EXPLICIT_SINGLE_QUERY_MIN_ROWS) to take the explicit decoding path."""
    model = tiny_model()
    torch.manual_seed(1)
    lengths = torch.randint(3, 9, (8,))
    input_ids = torch.randint(4, 99, (8, 9))
    input_ids[torch.arange(9)[None] >= lengths[:, None]] = 0
    input_ids[torch.arange(8), lengths - 1] = 2
    source = dict(input_ids=input_ids, attention_mask=(input_ids != 0).long())
    kwargs = dict(num_beams=4, max_new_tokens=8, return_dict_in_generate=True, output_scores=True)
    cached = model.generate(**source, **kwargs)
    uncached = model.generate(**source, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert torch.allclose(cached.sequences_scores, uncached.sequences_scores, atol=1e-5)


# Every switch that reads or combines positions in a training forward: li2022's per-row drop-net groups (DDR's two
# passes) and ALD's source views, dou2018's aggregations, multi-layer attention and layer diversity, liu2020's ω.
PACKED_TRAINING_CASES = {
    "post-LN": {},
    "pre-LN, CAD, DDR, ALD": dict(layer_norm_position="pre", decoder_layers=3, cross_attention_drop_depth=2,
                                  cross_attention_drop_ratio=0.5, ddr_weight=1.0, ald_weight=0.5),
    "dou2018 hierarchical + linear, MLA k=2, diversity": dict(
        encoder_layers=4, decoder_layers=5, encoder_layer_aggregation="hierarchical",
        decoder_layer_aggregation="linear", multi_layer_attention_k=2, diversity_weight=0.1),
    "ADMIN, label smoothing": dict(residual_scaling="admin", label_smoothing=0.1),
}


@pytest.mark.parametrize("case", list(PACKED_TRAINING_CASES))
def test_training_forward_on_real_positions_equals_the_padded_forward(case, monkeypatch):
    """In training, the stacks compute only the real source tokens and each row's target positions up to its last
    label (docs/transformer.md, "Padding in training"): the loss, every gradient and the logits of real positions
    are the padded computation's, and the skipped positions are really skipped."""
    from hf_deepnmt import modeling_deep_transformer

    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [11, 12, 2, 0, 0, 0, 0], [13, 14, 15, 16, 2, 0, 0]])
    labels = torch.tensor([[17, 18, 19, 2, -100, -100], [20, 21, 22, 23, 24, 2], [25, 2, -100, -100, -100, -100]])
    batch = {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}
    model = tiny_model(dropout=0.0, **PACKED_TRAINING_CASES[case]).train()

    def run() -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], list[int]]:
        rows: list[int] = []  # rows the first encoder and decoder FFN see
        hooks = [layers[0].fc1.register_forward_hook(lambda m, args, out: rows.append(args[0].numel() // 16))
                 for layers in (model.model.encoder.layers, model.model.decoder.layers)]
        model.zero_grad()
        torch.manual_seed(0)  # the same drop-net draws and ALD views on both paths
        out = model(**batch)
        out.loss.backward()
        for hook in hooks:
            hook.remove()
        grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        return out.loss.detach(), out.logits.detach(), grads, rows

    loss, logits, grads, rows = run()
    monkeypatch.setattr(modeling_deep_transformer, "real_positions", lambda keep, training: None)
    padded_loss, padded_logits, padded_grads, padded_rows = run()

    views = 3 if "ALD" in case else 1  # X, X⁺, X⁻ through the encoder
    passes = (2 if "DDR" in case else 1) + (2 if "ALD" in case else 0)
    assert rows == [views * int(batch["attention_mask"].sum()), passes * (4 + 6 + 2)]  # real tokens only
    assert padded_rows == [views * input_ids.numel(), passes * labels.numel()]
    torch.testing.assert_close(loss, padded_loss, atol=1e-6, rtol=1e-5)
    assert grads.keys() == padded_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, padded_grads[name], atol=1e-6, rtol=1e-4, msg=name)
    real = labels != -100
    torch.testing.assert_close(logits[real], padded_logits[real], atol=1e-6, rtol=1e-5)
    assert not logits[~real].any()  # skipped positions: zero


@pytest.mark.parametrize("implementation", ["sdpa", "eager", "weights"])
def test_beams_grouped_over_one_memory_row_equal_one_memory_row_per_beam(implementation):
    """A cross-attention given one encoder row per sentence for its consecutive beam rows (what the retiring search
    passes, `memory_groups`) gives the outputs and attention weights of the encoder rows repeated per beam."""
    from hf_deepnmt.attention import DeepTransformerAttention, additive_mask, padding_mask

    torch.manual_seed(0)
    config = tiny_model().config
    config._attn_implementation = "eager" if implementation == "eager" else "sdpa"
    attention = DeepTransformerAttention(16, 4, 0.0, 0, is_cross_attention=True, config=config).eval()
    sentences, beams, source = 3, 4, 5
    memory = torch.randn(sentences, source, 16)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
    queries = torch.randn(sentences * beams, 2, 16)  # two target positions per beam row
    weights = implementation == "weights"
    grouped, grouped_weights = attention(queries, key_value_states=memory, output_attentions=weights,
                                         attention_mask=additive_mask(padding_mask(mask), queries.dtype))
    repeated_mask = additive_mask(padding_mask(mask.repeat_interleave(beams, 0)), queries.dtype)
    expected, expected_weights = attention(queries, key_value_states=memory.repeat_interleave(beams, 0),
                                           attention_mask=repeated_mask, output_attentions=weights)
    torch.testing.assert_close(grouped, expected, atol=1e-6, rtol=1e-5)
    if weights:
        torch.testing.assert_close(grouped_weights, expected_weights, atol=1e-6, rtol=1e-5)
    from hf_deepnmt.errors import UserInputError

    with pytest.raises(UserInputError, match="10 decoder rows cannot share 3 encoder rows"):
        attention(queries[:10], key_value_states=memory)


def test_deferred_reorder_cache_holds_what_the_plain_cache_holds():
    """`DeferredReorderLayer` records beam reorders (also several in a row, and a reorder that drops rows, as the
    retiring search's) and gathers them into the next append: the same keys and values as `DynamicLayer`."""
    from transformers.cache_utils import DynamicLayer

    from hf_deepnmt.attention import DeferredReorderLayer

    torch.manual_seed(0)
    plain, deferred = DynamicLayer(), DeferredReorderLayer()
    rows = 6
    for step in range(5):
        keys, values = torch.randn(rows, 2, 1, 3), torch.randn(rows, 2, 1, 3)
        expected = plain.update(keys, values)
        got = deferred.update(keys, values)
        assert all(torch.equal(a, b) for a, b in zip(got, expected)), step
        reorders = [torch.randint(0, rows, (rows,))] + ([torch.tensor([0, 2, 3, 5])] if step == 2 else [])
        for index in reorders:
            plain.reorder_cache(index)
            deferred.reorder_cache(index)
            rows = index.numel()
    assert deferred.pending is not None and deferred.get_seq_length() == plain.get_seq_length() == 5
    # a reader between a reorder and the next append (a cache returned by generate) sees the reordered rows
    assert torch.equal(deferred.keys, plain.keys) and torch.equal(deferred.values, plain.values)
    assert deferred.pending is None


def test_generate_s_beam_search_on_the_deferred_reorder_cache_gives_the_plain_cache_s_beams(batch):
    """A Transformer's beam search in transformers' `generate` starts from `beam_search_cache()`: the same sequences
    and scores as on transformers' own cache layers, and the returned cache holds what theirs holds."""
    from transformers.cache_utils import DynamicCache

    from hf_deepnmt.attention import DeferredReorderLayer
    from hf_deepnmt.modeling_common import CACHE_NAME

    model = tiny_model()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4,
                  num_return_sequences=2, max_new_tokens=8, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        plain = model.generate(**kwargs, **{CACHE_NAME: EncoderDecoderCache(DynamicCache(), DynamicCache())})
        deferred = model.generate(**kwargs)  # the default
    layers = (getattr(deferred, CACHE_NAME, None) or deferred.past_key_values).self_attention_cache.layers
    assert all(isinstance(layer, DeferredReorderLayer) for layer in layers)
    assert torch.equal(plain.sequences, deferred.sequences)
    torch.testing.assert_close(plain.sequences_scores, deferred.sequences_scores, rtol=0, atol=0)
    returned = [getattr(output, CACHE_NAME, None) or output.past_key_values for output in (plain, deferred)]
    for a, b in zip(returned[0].self_attention_cache.layers, returned[1].self_attention_cache.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
