"""The Hugging Face contract of DeepTransformerForConditionalGeneration (DESIGN.md) beyond what every family shares
(tests/test_hf_contract.py), on tiny configs."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from hf_deepnmt.modeling_common import output_cache
from conftest import tiny_model
from test_hf_contract import FAMILIES
from transformers import AutoModelForSeq2SeqLM
from transformers.cache_utils import EncoderDecoderCache

from hf_deepnmt import DeepTransformerForConditionalGeneration
from hf_deepnmt.registry import TRANSFORMER

GRID = FAMILIES[TRANSFORMER].grid  # the switch sets of the contract tests (tests/test_hf_contract.py)


def _generate(model, batch, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # generate() must not warn
        return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)


# ------------------------------------------------------------------------------------------------ save / load / Auto
def test_state_dict_holds_the_shared_embedding_once():
    names = list(tiny_model().state_dict())
    assert "model.shared.weight" in names
    assert not any("embed_tokens" in name for name in names)
    assert any(name.endswith("encoder_attn.q_proj.weight") for name in names)  # Marian/BART names


def test_bad_value_in_saved_config_fails_at_load_time(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    config["layer_norm_position"] = "sandwich"
    path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="layer_norm_position"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)


# ------------------------------------------------------------------------------------------------ generation
def test_beam_search_length_penalty_divides_the_log_probability_and_changes_the_ranking(batch):
    """Every returned hypothesis scores its summed log-probability (recomputed here by teacher forcing) divided by
    its generated length ** α, the n-best lists are sorted by that score, and a positive α prefers longer
    translations than a negative one."""
    model = tiny_model(init_std=0.5)
    with torch.no_grad():
        model.lm_head.weight[model.config.eos_token_id] *= 8.0  # hypotheses end at different lengths
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    lengths = {}
    for alpha in (-2.0, 2.0):
        out = model.generate(**inputs, num_beams=4, num_return_sequences=4, length_penalty=alpha, max_new_tokens=10,
                             early_stopping=True, return_dict_in_generate=True, output_scores=True)
        sequences = out.sequences  # (2·4, 1 + new)
        scores = out.sequences_scores.view(2, 4)
        assert torch.all(scores[:, :-1] >= scores[:, 1:] - 1e-6)  # each n-best list sorted by its score
        for row, hypothesis in enumerate(sequences):
            generated = hypothesis[1:]
            if (generated == model.config.eos_token_id).any():  # up to the first </s>, padding after it
                generated = generated[: int((generated == model.config.eos_token_id).nonzero()[0]) + 1]
            with torch.no_grad():
                logits = model(input_ids=inputs["input_ids"][row // 4: row // 4 + 1],
                               attention_mask=inputs["attention_mask"][row // 4: row // 4 + 1],
                               decoder_input_ids=hypothesis[None, : len(generated)]).logits[0]
            log_prob = torch.log_softmax(logits, -1).gather(-1, generated[:, None]).sum()
            torch.testing.assert_close(out.sequences_scores[row], log_prob / len(generated) ** alpha,
                                       atol=1e-4, rtol=1e-4)
        top = sequences.view(2, 4, -1)[:, 0, 1:]  # the best hypothesis of each sentence
        lengths[alpha] = [int((t == model.config.eos_token_id).nonzero()[0]) + 1 if (t == 2).any() else t.numel()
                          for t in top]
    assert all(long >= short for long, short in zip(lengths[2.0], lengths[-2.0]))
    assert lengths[2.0] != lengths[-2.0], lengths  # the penalty changed which hypothesis ranks first


def test_default_generation_config_is_mt_sized(batch):
    model = tiny_model()
    assert model.generation_config.num_beams == 4
    out = _generate(model, batch)  # no length argument: up to 63 new tokens here (max_position_embeddings 64)
    assert out.shape[1] > 21
    assert _generate(model, batch, max_length=6).shape[1] <= 6
    assert _generate(model, batch, max_new_tokens=3).shape[1] <= 4


@pytest.mark.parametrize("switches", GRID[:2])
def test_incremental_decoding_matches_full_forward(batch, switches):
    """Feeding the target one token at a time through the cache gives the teacher-forced logits."""
    model = tiny_model(**switches)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    with torch.no_grad():
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     decoder_input_ids=decoder_input_ids).logits
        encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"],
                        decoder_input_ids=decoder_input_ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = output_cache(out)
            steps.append(out.logits)
        assert isinstance(cache, EncoderDecoderCache)
        # a multi-token chunk after a cached prefix (offset causal mask)
        prefix = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"],
                       decoder_input_ids=decoder_input_ids[:, :2], use_cache=True)
        chunk = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"],
                      decoder_input_ids=decoder_input_ids[:, 2:], past_key_values=output_cache(prefix),
                      use_cache=True)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    assert torch.allclose(torch.cat([prefix.logits, chunk.logits], dim=1), full, atol=1e-5)


# ------------------------------------------------------------------------------------------------ numerics
def test_loss_ignores_padding_whether_pad_id_or_minus_100(batch):
    model = tiny_model()
    with_pad_id = batch["labels"].masked_fill(batch["labels"] == -100, 0)
    with torch.no_grad():
        a = model(**batch).loss
        b = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=with_pad_id).loss
        logits = model(**batch).logits
    assert torch.allclose(a, b)
    mask = batch["labels"] != -100
    manual = torch.nn.functional.cross_entropy(logits[mask], batch["labels"][mask])
    assert torch.allclose(a, manual, atol=1e-6)


def test_eager_attention_path_matches_sdpa_and_returns_weights(batch):
    model = tiny_model()
    with torch.no_grad():
        fast = model(**batch)
        eager = model(**batch, output_attentions=True, output_hidden_states=True)
    assert torch.allclose(fast.logits, eager.logits, atol=1e-5)
    assert len(eager.encoder_attentions) == len(eager.decoder_attentions) == len(eager.cross_attentions) == 2
    assert eager.encoder_attentions[0].shape == (2, 4, 6, 6)  # (B, H, S, S)
    assert eager.cross_attentions[0].shape == (2, 4, 5, 6)  # (B, H, T, S)
    assert torch.allclose(eager.encoder_attentions[0].sum(-1), torch.ones(2, 4, 6), atol=1e-5)
    assert eager.cross_attentions[0][1, :, :, 4:].abs().max() == 0  # padded source positions get no weight
    causal = eager.decoder_attentions[0][0]
    assert causal.triu(1).abs().max() == 0  # no attention to the future
    assert len(eager.encoder_hidden_states) == len(eager.decoder_hidden_states) == 3  # embeddings + 2 layers
    assert torch.equal(eager.encoder_hidden_states[-1], eager.encoder_last_hidden_state)


def test_encoder_outputs_feed_several_decoder_passes(batch):
    """li2022's losses need one encoder pass reused by independent decoder passes (different dropout draws)."""
    model = tiny_model(dropout=0.3).train()
    encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    first = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], labels=batch["labels"])
    second = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], labels=batch["labels"])
    assert not torch.allclose(first.logits, second.logits)
    (first.loss + second.loss).backward()
    assert model.model.encoder.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        a = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], labels=batch["labels"])
        b = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], labels=batch["labels"])
    assert torch.equal(a.logits, b.logits)


def _deterministic_init(model: torch.nn.Module) -> None:
    """Set every parameter by a closed-form hash (no RNG), scaled like a sensible init: golden values that do not
    depend on torch's random generator or on `_init_weights`."""
    with torch.no_grad():
        for index, (name, param) in enumerate(sorted(model.named_parameters())):
            i = torch.arange(param.numel(), dtype=torch.float64)
            u = torch.frac(torch.sin(i * 12.9898 + index * 78.233) * 43758.5453) - 0.5  # in [-0.5, 0.5)
            if param.dim() == 2:
                values = u * 2 * math.sqrt(3.0 / param.shape[1])
            elif name.endswith("norm.weight"):
                values = 1.0 + 0.4 * u
            else:
                values = 0.2 * u
            param.copy_(values.view_as(param).to(param.dtype))


GOLDEN_POST_LN = [
    [-0.5569, -0.6189, 1.7341, -0.2109, 0.1304],
    [-0.5404, -0.6152, 1.7321, -0.2193, 0.0977],
    [-0.5249, -0.6113, 1.7297, -0.2278, 0.0653],
]
GOLDEN_PRE_LN = [
    [1.9638, 4.3860, 4.6504, 5.2775, 4.8785],
    [1.8426, 4.1951, 4.5395, 5.0995, 4.8627],
    [1.8517, 4.1932, 4.5535, 5.1290, 4.8768],
]


@pytest.mark.parametrize("position,golden", [("post", GOLDEN_POST_LN), ("pre", GOLDEN_PRE_LN)])
def test_golden_logits_from_a_deterministic_init(position, golden):
    model = tiny_model(layer_norm_position=position)
    _deterministic_init(model)
    input_ids = torch.tensor([[5, 6, 7, 8, 2]])
    with torch.no_grad():
        logits = model(input_ids=input_ids, decoder_input_ids=torch.tensor([[1, 9, 10]])).logits
    assert torch.allclose(logits[0, :, :5], torch.tensor(golden), atol=2e-4), logits[0, :, :5]


def test_resize_token_embeddings_keeps_ties(batch, tmp_path):
    model = tiny_model()
    model.resize_token_embeddings(120)
    assert model.config.vocab_size == 120
    assert model.model.shared.weight.shape == (120, 16)
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert model.model.encoder.embed_tokens is model.model.shared is model.model.decoder.embed_tokens
    with torch.no_grad():
        assert model(**batch).logits.shape[-1] == 120
    model.save_pretrained(tmp_path)
    reloaded = DeepTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.shared.weight.data_ptr()
    assert reloaded.model.encoder.embed_tokens is reloaded.model.shared


def test_untied_output_projection_resizes_too():
    model = tiny_model(tie_word_embeddings=False)
    model.resize_token_embeddings(110)
    assert model.lm_head.weight.shape == (110, 16)
    assert model.lm_head.weight.data_ptr() != model.model.shared.weight.data_ptr()


def test_return_dict_false_gives_tuples(batch):
    model = tiny_model()
    with torch.no_grad():
        as_tuple = model(**batch, return_dict=False)
        as_output = model(**batch)
    assert isinstance(as_tuple, tuple)
    assert torch.equal(as_tuple[0], as_output.loss) and torch.equal(as_tuple[1], as_output.logits)


# ------------------------------------------------------------------------------------------------ config validation
# ------------------------------------------------------------------------------------------------ attention interface
@pytest.mark.parametrize("switches", [dict(), dict(layer_norm_position="pre", cross_attention_drop_depth=1,
                                                    cross_attention_drop_ratio=0.5),
                                      dict(encoder_layers=3, decoder_layers=3, multi_layer_attention_k=2)])
def test_attention_implementation_is_honoured_at_call_time(switches, tmp_path):
    """eager == sdpa on padded batches; set_attn_implementation takes effect at once; a kernel registered with
    transformers' AttentionInterface is called for every attention; from_pretrained(attn_implementation=...) works."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = tiny_model(**switches)
    input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    kwargs = dict(input_ids=input_ids, attention_mask=(input_ids != 0).long(),
                  labels=torch.tensor([[11, 12, 2], [13, 2, -100]]))
    with torch.no_grad():
        sdpa = model(**kwargs).logits
        model.set_attn_implementation("eager")
        assert model.config._attn_implementation == "eager"
        eager = model(**kwargs).logits
        calls = []

        def counting(module, query, key, value, mask, **options):
            calls.append(module)
            return sdpa_attention_forward(module, query, key, value, mask, **options)

        AttentionInterface.register("counting_test_kernel", counting)
        model.set_attn_implementation("counting_test_kernel")
        registered = model(**kwargs).logits
    torch.testing.assert_close(eager, sdpa, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(registered, sdpa, atol=1e-5, rtol=1e-5)
    attentions = [m for m in model.modules() if isinstance(m, type(model.model.encoder.layers[0].self_attn))]
    assert set(map(id, calls)) == set(map(id, attentions))  # every attention module went through the kernel
    model.set_attn_implementation("sdpa")
    model.save_pretrained(tmp_path)
    loaded = DeepTransformerForConditionalGeneration.from_pretrained(tmp_path, attn_implementation="eager")
    assert loaded.config._attn_implementation == "eager"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**kwargs).logits, sdpa, atol=1e-5, rtol=1e-5)


def _reference_flash_kernels():
    """FlashAttention's documented semantics in plain torch (no GPU here): ``flash_attn_func`` on (B, T, H, d) and
    ``flash_attn_varlen_func`` on packed (N, H, d) sequences, causal aligned to the bottom-right (flash-attn ≥ 2.1)."""
    import torch.nn.functional as F

    def attend(q, k, v, scale, causal):  # (T, H, d) each
        mask = torch.ones(q.size(0), k.size(0), dtype=torch.bool).tril(k.size(0) - q.size(0)) if causal else None
        return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                              scale=scale).transpose(0, 1)

    def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        return torch.stack([attend(*rows, softmax_scale, causal) for rows in zip(q, k, v)])

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False):
        calls.append((cu_seqlens_q.tolist(), cu_seqlens_k.tolist()))
        spans = zip(cu_seqlens_q[:-1], cu_seqlens_q[1:], cu_seqlens_k[:-1], cu_seqlens_k[1:])
        return torch.cat([attend(q[a:b], k[c:d], v[c:d], softmax_scale, causal) for a, b, c, d in spans])

    calls: list = []
    return flash_attn_func, flash_attn_varlen_func, calls


@pytest.mark.parametrize("switches", [dict(), dict(layer_norm_position="pre", cross_attention_drop_depth=1,
                                                    cross_attention_drop_ratio=0.5),
                                      dict(encoder_layers=3, decoder_layers=3, multi_layer_attention_k=2)])
def test_flash_attention_path_packs_padded_batches_exactly(switches, monkeypatch):
    """attn_implementation='flash_attention_2' goes through transformers' real `flash_attention_forward` (only the
    CUDA kernels are replaced by their documented semantics): padded sources (encoder and cross-attention, where the
    queries are not padded like the keys), causal decoding, beam search and a right-padded decoder mask give sdpa's
    results; a left-padded decoder mask is refused with one sentence."""
    from transformers import modeling_flash_attention_utils as fa

    from hf_deepnmt import attention as modeling

    plan = modeling.flash_packing
    dense, varlen, calls = _reference_flash_kernels()
    monkeypatch.setattr(fa, "_lazy_imports", lambda *args, **kwargs: (dense, varlen, None, fa._pad_input,
                                                                     fa._unpad_input))
    monkeypatch.setattr(fa, "_loaded_implementation", None)
    model = tiny_model(**switches)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 2, 0, 0, 0], [0, 0, 12, 13, 14, 2]])  # right, left padding
    labels = torch.tensor([[13, 14, 15, 2], [17, 18, 2, -100], [19, 2, -100, -100]])
    kwargs = dict(input_ids=input_ids, attention_mask=(input_ids != 0).long(), labels=labels)
    real = labels != -100
    decoder_mask = torch.cat([torch.ones(3, 1, dtype=torch.long), real[:, :-1].long()], dim=1)  # right-padded
    with torch.no_grad():
        sdpa = model(**kwargs).logits
        sdpa_masked = model(**kwargs, decoder_attention_mask=decoder_mask).logits
        sdpa_beams = model.generate(input_ids=input_ids, attention_mask=kwargs["attention_mask"], num_beams=3,
                                    max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
        model.config._attn_implementation = "flash_attention_2"
        packings = []
        monkeypatch.setattr(modeling, "flash_packing", lambda *args: packings.append(args) or plan(*args))
        flash = model(**kwargs).logits
        assert len(packings) == 2  # once per mask and forward (encoder, cross-attention), not once per layer
        flash_masked = model(**kwargs, decoder_attention_mask=decoder_mask).logits
        flash_beams = model.generate(input_ids=input_ids, attention_mask=kwargs["attention_mask"], num_beams=3,
                                     max_new_tokens=6, output_scores=True, return_dict_in_generate=True)
        with pytest.raises(ValueError, match="FlashAttention can express key padding and causal masks only"):
            model(**kwargs, decoder_attention_mask=decoder_mask.flip(1))
    assert calls and any(k[-1] < 3 * 6 for _, k in calls)  # the padded keys were packed away
    torch.testing.assert_close(flash[real], sdpa[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flash_masked[real], sdpa_masked[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(flash_beams.sequences, sdpa_beams.sequences)
    torch.testing.assert_close(flash_beams.sequences_scores, sdpa_beams.sequences_scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("switches", [dict(), dict(layer_norm_position="pre", cross_attention_drop_depth=1,
                                                    cross_attention_drop_ratio=0.5),
                                      dict(encoder_layers=3, decoder_layers=3, multi_layer_attention_k=2)])
def test_flex_attention_path_matches_sdpa_on_padded_batches(switches, monkeypatch):
    """attn_implementation='flex_attention' goes through transformers' `flex_attention_forward` with this model's
    masks as a `BlockMask`; torch's flex_attention runs uncompiled here (its compiled CPU kernel fails to build for
    some shapes in torch 2.13, docs/transformer.md), which evaluates the same mask and scores. Logits and beams equal
    sdpa's on a batch with right and left source padding and a right-padded decoder mask."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention
    from transformers.integrations import flex_attention as hf_flex

    monkeypatch.setattr(hf_flex.WrappedFlexAttention, "__call__", lambda self: flex_attention)
    model = tiny_model(**switches)
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 2, 0, 0, 0], [0, 0, 12, 13, 14, 2]])
    labels = torch.tensor([[13, 14, 15, 2], [17, 18, 2, -100], [19, 2, -100, -100]])
    real = labels != -100
    decoder_mask = torch.cat([torch.ones(3, 1, dtype=torch.long), real[:, :-1].long()], dim=1)
    kwargs = dict(input_ids=input_ids, attention_mask=(input_ids != 0).long(), labels=labels,
                  decoder_attention_mask=decoder_mask)
    generation = dict(input_ids=input_ids, attention_mask=kwargs["attention_mask"], num_beams=3, max_new_tokens=6,
                      output_scores=True, return_dict_in_generate=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention.*")  # torch: "called without torch.compile"
        # transformers sets up torch.compile for flex (unused here); importing inductor warns about torch.jit
        warnings.filterwarnings("ignore", message=".*torch.jit.script_method.*", category=DeprecationWarning)
        sdpa, sdpa_beams = model(**kwargs).logits, model.generate(**generation)
        model.set_attn_implementation("flex_attention")
        assert model.config._attn_implementation == "flex_attention"
        flex, flex_beams = model(**kwargs).logits, model.generate(**generation)
    torch.testing.assert_close(flex[real], sdpa[real], atol=1e-5, rtol=1e-5)
    assert torch.equal(flex_beams.sequences, sdpa_beams.sequences)
    torch.testing.assert_close(flex_beams.sequences_scores, sdpa_beams.sequences_scores, atol=1e-5, rtol=1e-5)
