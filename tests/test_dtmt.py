"""meng2019 DTMT: the cells' equations, the length-aware encoder, generation with `DTMTCache` and the paper's parameter
counts, on tiny configs; the Hugging Face contract it shares with every family is tests/test_hf_contract.py's."""

from __future__ import annotations

import warnings

import pytest
import torch

from hf_deepnmt.modeling_common import output_cache
import torch.nn.functional as F
from conftest import dtmt_config, dtmt_model

from hf_deepnmt import DTMTCache, DTMTConfig, DTMTForConditionalGeneration
from hf_deepnmt.losses import compute_losses, source_reliance
from hf_deepnmt.modeling_dtmt import (
    DTMTGatedUnit,
    DTMTTransitionGRU,
    _RecurrentUnit,
    gated_unit_step,
    transition_gru_step,
)

def _generate(model, batch, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # generate() must not warn
        return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)


# ------------------------------------------------------------------------------------------------ the equations
def test_l_gru_step_follows_equations_14_to_16():
    """The fused step against the paper's equations written out one matrix at a time."""
    torch.manual_seed(0)
    d, n = 6, 3
    unit = DTMTGatedUnit(input_size=5, hidden_size=d, linear_transformation=True)
    with torch.no_grad():
        for p in unit.parameters():
            p.uniform_(-0.5, 0.5)
    x, h = torch.randn(4, 5), torch.randn(4, d)
    W_x, W_h = unit.input_proj.weight.split(d), unit.state_proj.weight.split(d)  # [r, z, l, xh, H] / [r, z, l, hh]
    ln = [lambda v, i=i: F.layer_norm(v, (d,), unit.gate_norm_weight[i], unit.gate_norm_bias[i], eps=1e-6)
          for i in range(n)]
    r = torch.sigmoid(ln[0](x @ W_x[0].T + h @ W_h[0].T))  # Eq. (8) with per-gate LayerNorm
    z = torch.sigmoid(ln[1](x @ W_x[1].T + h @ W_h[1].T))  # Eq. (9)
    l = torch.sigmoid(ln[2](x @ W_x[2].T + h @ W_h[2].T))  # Eq. (16)
    candidate = torch.tanh(x @ W_x[3].T + r * (h @ W_h[3].T + unit.candidate_bias)) + l * (x @ W_x[4].T)  # Eq. (15)
    expected = (1 - z) * h + z * candidate  # Eq. (14)
    got = gated_unit_step(unit.input_proj(x)[None], h[None], _RecurrentUnit.pack([unit]), n, True, 0.0, False, 1e-6)
    assert torch.allclose(got[0], expected, atol=1e-6)


def test_t_gru_step_follows_equations_10_to_13():
    torch.manual_seed(1)
    d = 6
    unit = DTMTTransitionGRU(d)
    with torch.no_grad():
        for p in unit.parameters():
            p.uniform_(-0.5, 0.5)
    h = torch.randn(3, d)
    W = unit.state_proj.weight.split(d)  # [r, z, hh]
    r = torch.sigmoid(F.layer_norm(h @ W[0].T, (d,), unit.gate_norm_weight[0], unit.gate_norm_bias[0], eps=1e-6))
    z = torch.sigmoid(F.layer_norm(h @ W[1].T, (d,), unit.gate_norm_weight[1], unit.gate_norm_bias[1], eps=1e-6))
    expected = (1 - z) * h + z * torch.tanh(r * (h @ W[2].T + unit.candidate_bias))  # Eq. (10)-(13)
    got = transition_gru_step(h[None], _RecurrentUnit.pack([unit]), 0.0, False, 1e-6)
    assert torch.allclose(got[0], expected, atol=1e-6)


def test_gru_unit_has_no_linear_transformation_gate():
    gru, lgru = (DTMTGatedUnit(8, 8, linear_transformation=flag) for flag in (False, True))
    assert gru.input_proj.weight.shape == (3 * 8, 8) and gru.state_proj.weight.shape == (3 * 8, 8)
    assert lgru.input_proj.weight.shape == (5 * 8, 8) and lgru.state_proj.weight.shape == (4 * 8, 8)


def test_transition_blocks_have_the_configured_depth():
    model = dtmt_model(transition_depth=3, query_transition=False)
    encoder, decoder = model.model.encoder, model.model.decoder
    assert len(encoder.forward_transition.t_grus) == len(encoder.backward_transition.t_grus) == 3
    assert len(decoder.query_transition.t_grus) == 0  # Table 4: replaced by the shallow RNMT's single unit
    assert len(decoder.decoder_transition.t_grus) == 3
    assert decoder.decoder_transition.unit.input_size == 2 * 16  # its L-GRU reads the 2d-wide context c_t
    assert model.model.encoder.forward_transition.unit.linear_transformation


# ------------------------------------------------------------------------------------------------ parameter counts
def _count(**fields) -> int:
    with torch.device("meta"):  # no memory, no init cost: only the shapes
        model = DTMTForConditionalGeneration(DTMTConfig(vocab_size=32000, d_model=1024, **fields))
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_at_d_1024_match_the_paper():
    """meng2019 Tables 1 and 3 (Zh-En, d = 1024). The totals depend on the unknown vocabularies; their differences do
    not, and pin the structure. Each paper figure is rounded to 0.1M, so a difference of two is good to < 0.1M."""
    d = 1024
    shallow_gru = _count(rnn_cell="gru", transition_depth=0)  # ShallowRNMT, 143.2M
    gru_1, gru_4 = _count(rnn_cell="gru", transition_depth=1), _count(rnn_cell="gru", transition_depth=4)
    lgru_0, lgru_1, lgru_4 = (_count(rnn_cell="lgru", transition_depth=k) for k in (0, 1, 4))
    t_gru = 3 * d * d + 5 * d  # r, z (no bias) + 2 LayerNorms + W_hh with bias
    assert gru_1 - shallow_gru == 4 * t_gru == 12_603_392  # one T-GRU in each of the 4 transition blocks
    assert gru_4 - gru_1 == 12 * t_gru == 37_810_176  # three more per block
    l_gru_extra = 3 * (3 * d * d + 2 * d) + (5 * d * d + 2 * d)  # 2·in·d + d² + 2d; in = d, d, d and 2d (context)
    for lgru, gru in ((lgru_0, shallow_gru), (lgru_1, gru_1), (lgru_4, gru_4)):
        assert lgru - gru == l_gru_extra == 14_688_256
    paper = {"+T-GRU": (155.8 - 143.2, gru_1 - shallow_gru), "+3 T-GRUs": (193.7 - 155.8, gru_4 - gru_1),
             "L-GRU": (157.9 - 143.2, lgru_0 - shallow_gru), "L-GRU, DTMT#1": (170.5 - 155.8, lgru_1 - gru_1),
             "L-GRU, DTMT#4": (208.4 - 193.7, lgru_4 - gru_4), "DTMT#4 - ShallowRNMT": (208.4 - 143.2, lgru_4 - shallow_gru)}
    for name, (paper_delta, ours) in paper.items():
        assert abs(ours / 1e6 - paper_delta) < 0.1, (name, ours, paper_delta)


def test_table_4_switches_remove_exactly_their_t_grus():
    full = _count(transition_depth=4)
    t_gru = 3 * 1024 * 1024 + 5 * 1024
    assert full - _count(transition_depth=4, encoder_transition=False) == 2 * 4 * t_gru  # both directions
    assert full - _count(transition_depth=4, query_transition=False) == 4 * t_gru
    assert full - _count(transition_depth=4, decoder_transition=False) == 4 * t_gru
    assert _count(transition_depth=0) == _count(transition_depth=4, encoder_transition=False,
                                                query_transition=False, decoder_transition=False)


# ------------------------------------------------------------------------------------------------ encoder
def test_appending_padding_changes_no_annotation():
    model = dtmt_model()
    source = torch.tensor([[5, 6, 7, 8, 2]])
    with torch.no_grad():
        alone = model.get_encoder()(input_ids=source).last_hidden_state
        for pad in (1, 4):
            padded_ids = torch.cat([source, torch.zeros(1, pad, dtype=torch.long)], dim=1)
            padded = model.get_encoder()(input_ids=padded_ids, attention_mask=(padded_ids != 0).long()).last_hidden_state
            assert torch.allclose(padded[:, :5], alone, atol=1e-6)
            assert padded[:, 5:].abs().max() == 0  # padded positions carry no annotation


def test_annotations_are_forward_and_backward_states():
    """→h_j sees x_1..x_j, ←h_j sees x_j..x_n: changing the last word moves only the backward half at position 0."""
    model = dtmt_model()
    a, b = torch.tensor([[5, 6, 7, 8, 2]]), torch.tensor([[5, 6, 7, 9, 2]])
    with torch.no_grad():
        ha = model.get_encoder()(input_ids=a).last_hidden_state
        hb = model.get_encoder()(input_ids=b).last_hidden_state
    assert ha.shape == (1, 5, 32)
    assert torch.equal(ha[0, :3, :16], hb[0, :3, :16])  # forward half before the change: identical
    assert not torch.allclose(ha[0, 0, 16:], hb[0, 0, 16:])  # backward half at position 0 has read the change
    assert torch.equal(ha[0, 4, 16:], hb[0, 4, 16:])  # backward half after the change: identical


# ------------------------------------------------------------------------------------------------ generation
def test_beam_search_needs_the_state_reordered(batch, monkeypatch):
    """With a reorder that does nothing, beam search goes wrong: the reordering is what keeps it exact."""
    model = dtmt_model(init_range=0.5)  # a peaked distribution, so that hypotheses really differ
    kwargs = dict(num_beams=4, num_return_sequences=4, max_new_tokens=10, return_dict_in_generate=True,
                  output_scores=True)
    right = _generate(model, batch, **kwargs)
    monkeypatch.setattr(DTMTForConditionalGeneration, "_reorder_cache", lambda self, past, beam_idx: past)
    wrong = _generate(model, batch, **kwargs)
    assert not torch.allclose(right.sequences_scores, wrong.sequences_scores)


def test_default_generation_is_the_papers_beam_4_alpha_0_6(batch):
    model = dtmt_model()
    assert model.generation_config.num_beams == 4 and model.generation_config.length_penalty == 0.6
    out = _generate(model, batch)
    assert out.shape[0] == 2 and out.shape[1] > 12  # untrained model: runs long, up to max_new_tokens
    short = _generate(model, batch, num_beams=4, length_penalty=-2.0, max_new_tokens=10)
    assert short.shape[0] == 2
    assert _generate(model, batch, max_length=6).shape[1] <= 6


@pytest.mark.parametrize("form", ["gnmt", "power"])
def test_beam_scores_use_the_papers_gnmt_length_penalty(batch, form):
    """meng2019 decodes with "length penalty alpha = 0.6" in GNMT's form: every returned hypothesis scores its
    summed log-probability (teacher-forced here) / ((5 + |Y|) / 6) ** 0.6, |Y| its tokens with </s>, by default;
    ``length_penalty_form="power"`` gives transformers' / |Y| ** 0.6. The forms rank hypotheses differently."""
    from hf_deepnmt.configuration_dtmt import ALLOWED_LENGTH_PENALTY_FORMS
    from hf_deepnmt.modeling_common import LENGTH_PENALTY_FORMS

    assert ALLOWED_LENGTH_PENALTY_FORMS == LENGTH_PENALTY_FORMS
    torch.manual_seed(0)
    config = DTMTConfig(vocab_size=99, d_model=16, attention_heads=2, max_position_embeddings=64, init_range=0.5)
    model = DTMTForConditionalGeneration(config).eval()
    assert model.config.length_penalty_form == "gnmt" and model.generation_config.length_penalty == 0.6
    with torch.no_grad():
        model.lm_head.bias[config.eos_token_id] += 1.4  # hypotheses end at different lengths
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    options = {} if form == "gnmt" else {"length_penalty_form": "power"}
    out = _generate(model, inputs, num_beams=4, num_return_sequences=4, max_new_tokens=20,
                    return_dict_in_generate=True, output_scores=True, **options)
    sequences = out.sequences
    repeated = {key: value.repeat_interleave(4, dim=0) for key, value in inputs.items()}
    with torch.no_grad():
        log_probs = model(**repeated, decoder_input_ids=sequences[:, :-1]).logits.log_softmax(-1)
    tokens = log_probs.gather(-1, sequences[:, 1:, None])[..., 0]
    is_end = sequences[:, 1:] == config.eos_token_id
    after_end = (is_end.long().cumsum(-1) - is_end.long()) > 0
    length = (~after_end).sum(-1)  # generated tokens, </s> included
    total = tokens.masked_fill(after_end, 0.0).sum(-1)
    normaliser = ((5 + length) / 6) ** 0.6 if form == "gnmt" else length ** 0.6
    assert len(set(length.tolist())) > 2  # lengths differ: the form matters
    torch.testing.assert_close(out.sequences_scores, total / normaliser, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="`length_penalty_form` = 'gnm' is not allowed"):
        _generate(model, inputs, length_penalty_form="gnm")
    with pytest.raises(ValueError, match="length_penalty_form"):
        DTMTConfig(vocab_size=99, d_model=16, attention_heads=2, length_penalty_form="wu")


def test_incremental_decoding_matches_teacher_forcing(batch):
    """One token at a time through the cache, or a chunk after a cached prefix, gives the teacher-forced logits."""
    model = dtmt_model()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    mask = batch["attention_mask"]
    with torch.no_grad():
        full = model(input_ids=batch["input_ids"], attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
        encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=mask)
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(encoder_outputs=encoder_outputs, attention_mask=mask, past_key_values=cache,
                        decoder_input_ids=decoder_input_ids[:, t:t + 1], use_cache=True)
            cache = output_cache(out)
            steps.append(out.logits)
        assert isinstance(cache, DTMTCache) and cache.get_seq_length() == decoder_input_ids.shape[1]
        prefix = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=decoder_input_ids[:, :2],
                       use_cache=True)
        chunk = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=decoder_input_ids[:, 2:],
                      past_key_values=output_cache(prefix), use_cache=True)
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)
    assert torch.allclose(torch.cat([prefix.logits, chunk.logits], dim=1), full, atol=1e-5)


def test_cache_reorder_and_batch_operations():
    cache = DTMTCache(torch.arange(3.0)[:, None].repeat(1, 4), torch.zeros(3, 2, 5, 2), torch.zeros(3, 2, 5, 4),
                      torch.zeros(3, 1, 5), seen_tokens=2)
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    assert cache.state[:, 0].tolist() == [2.0, 2.0, 0.0] and cache.keys.shape[0] == 3
    cache.batch_repeat_interleave(2)
    assert cache.batch_size == 6 and cache.state[:, 0].tolist() == [2.0, 2.0, 2.0, 2.0, 0.0, 0.0]
    cache.batch_select_indices(torch.tensor([4, 0]))
    assert cache.state[:, 0].tolist() == [0.0, 2.0] and cache.mask_bias.shape == (2, 1, 5)
    assert cache.get_seq_length() == 2 and not cache.is_croppable
    cache.crop(0)
    with pytest.raises(ValueError, match="cannot be rolled back"):
        cache.crop(1)


# ------------------------------------------------------------------------------------------------ training
def test_loss_is_the_mean_token_cross_entropy_over_non_pad_targets(batch):
    model = dtmt_model()
    with torch.no_grad():
        out = model(**batch)
        with_pad_id = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            labels=batch["labels"].masked_fill(batch["labels"] == -100, 0)).loss
    mask = batch["labels"] != -100
    assert torch.allclose(out.loss, F.cross_entropy(out.logits[mask], batch["labels"][mask]), atol=1e-6)
    assert torch.allclose(out.loss, with_pad_id)


def test_dropouts_act_where_the_paper_puts_them(batch):
    """Each of the three dropouts alone makes training-mode logits random; none acts in eval mode."""
    for field in ("dropout", "rnn_dropout", "readout_dropout"):
        model = dtmt_model(**{"dropout": 0.0, "rnn_dropout": 0.0, "readout_dropout": 0.0, field: 0.5}).train()
        with torch.no_grad():
            assert not torch.allclose(model(**batch).logits, model(**batch).logits), field
            model.eval()
            assert torch.equal(model(**batch).logits, model(**batch).logits), field


def test_compute_losses_and_source_reliance_work_on_dtmt(batch):
    model = dtmt_model(init_range=0.5).train()  # a source-dependent output distribution already at init
    result = compute_losses(model, batch, label_smoothing=0.1)
    result.loss.backward()
    assert set(result.components) == {"nll", "smoothed_nll"} and int(result.num_tokens) == 8
    assert torch.allclose(result.components["nll"], model.eval()(**batch).loss, atol=0.5)  # dropout differs
    assert source_reliance(model, batch) > 0


def test_a_stock_seq2seq_trainer_trains_dtmt_with_the_papers_label_smoothing(batch, tmp_path):
    """meng2019 §Advanced Techniques: uniform label smoothing 0.1. A stock `Seq2SeqTrainer` (no smoothing of its own)
    gets it from the model's default config; evaluation stays the plain NLL."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    assert DTMTConfig().label_smoothing == 0.1
    model = dtmt_model(dropout=0.0, rnn_dropout=0.0, readout_dropout=0.0, init_range=0.5)
    trainer = Seq2SeqTrainer(model=model, args=Seq2SeqTrainingArguments(str(tmp_path), report_to=[], use_cpu=True))
    model.train()
    with torch.no_grad():
        loss = trainer.compute_loss(model, dict(batch))
        log_probs = F.log_softmax(model.eval()(**batch).logits, dim=-1)
    keep = batch["labels"] != -100
    nll = -log_probs.gather(-1, batch["labels"].clamp(min=0).unsqueeze(-1)).squeeze(-1)[keep].mean()
    uniform = -log_probs.mean(-1)[keep].mean()
    assert torch.allclose(loss, 0.9 * nll + 0.1 * uniform, atol=1e-5)  # transformers' uniform-prior form
    assert not torch.allclose(loss, nll, atol=1e-3)
    with torch.no_grad():
        assert torch.allclose(model.eval()(**batch).loss, nll, atol=1e-6)


def test_init_is_uniform_in_the_init_range():
    model = dtmt_model(init_range=0.05)
    for name, p in model.named_parameters():
        if "gate_norm_weight" in name:
            assert torch.equal(p, torch.ones_like(p)), name
        elif "gate_norm_bias" in name:
            assert torch.equal(p, torch.zeros_like(p)), name
        else:
            assert p.abs().max() <= 0.05 and p.abs().max() > 0.02, name


# ------------------------------------------------------------------------------------------------ HF contract
def test_resize_token_embeddings_resizes_both_embeddings_and_keeps_ties(batch):
    for switches in (dict(tie_word_embeddings=True), dict(share_encoder_decoder_embeddings=True,
                                                          tie_word_embeddings=True), dict()):
        model = dtmt_model(**switches)
        model.resize_token_embeddings(120)
        encoder, decoder = model.model.encoder, model.model.decoder
        assert model.config.vocab_size == 120
        assert encoder.embed_tokens.num_embeddings == decoder.embed_tokens.num_embeddings == 120
        assert model.lm_head.weight.shape == (120, 16) and model.lm_head.bias.shape == (120,)
        assert (model.lm_head.weight.data_ptr() == decoder.embed_tokens.weight.data_ptr()) == \
            model.config.tie_word_embeddings
        with torch.no_grad():
            assert model(**batch).logits.shape[-1] == 120


def test_outputs_weights_hidden_states_and_tuples(batch):
    model = dtmt_model()
    with torch.no_grad():
        out = model(**batch, output_attentions=True, output_hidden_states=True)
        as_tuple = model(**batch, return_dict=False)
    (weights,) = out.cross_attentions
    assert weights.shape == (2, 4, 5, 6)  # (B, H, T, S)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5), atol=1e-5)
    assert weights[1, :, :, 4:].abs().max() == 0  # padded source positions get no weight
    assert [h.shape[-1] for h in out.decoder_hidden_states] == [16, 16, 16]  # y_{t-1}, s_t, readout
    assert torch.allclose(model.lm_head(out.decoder_hidden_states[-1]), out.logits, atol=1e-6)
    assert out.encoder_last_hidden_state.shape == (2, 6, 32)
    assert torch.equal(as_tuple[0], out.loss) and torch.equal(as_tuple[1], out.logits)


# ------------------------------------------------------------------------------------------------ config
TRANSFORMER_MECHANISMS = [
    ("cross_attention_drop_depth", 3), ("cross_attention_drop_ratio", 0.5), ("ddr_weight", 1.0),
    ("ald_weight", 1.0), ("residual_scaling", "admin"), ("admin_init", "closed_form"),
    ("encoder_layer_aggregation", "hierarchical"), ("multi_layer_attention_k", 2), ("diversity_weight", 1.0),
    ("encoder_layers", 6), ("layer_norm_position", "pre"),
]


@pytest.mark.parametrize("field,value", TRANSFORMER_MECHANISMS, ids=[f for f, _ in TRANSFORMER_MECHANISMS])
def test_transformer_mechanisms_are_refused_on_a_dtmt_config(field, value):
    with pytest.raises(ValueError) as info:
        dtmt_config(**{field: value})
    message = str(info.value)
    assert f"`{field}`" in message and "DTMT is a recurrent model" in message, message
    assert "\n" not in message and message.endswith("."), message


def test_paper_defaults():
    config = DTMTConfig()
    assert (config.d_model, config.transition_depth, config.attention_heads, config.rnn_cell) == (1024, 4, 16, "lgru")
    assert (config.dropout, config.rnn_dropout, config.readout_dropout, config.init_range) == (0.5, 0.3, 0.5, 0.08)
    assert config.positional_encoding and config.encoder_transition and config.query_transition
    assert config.decoder_transition and not config.tie_word_embeddings
    assert not config.share_encoder_decoder_embeddings
