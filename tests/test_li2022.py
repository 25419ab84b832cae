"""li2022 (docs/li2022.md): cross-attention drop (CAD), the DDR and ALD losses, and the source-reliance collapse monitor."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, tiny_config, tiny_model
from test_trainer import data, make_trainer  # noqa: F401  (the `data` fixture)
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from hf_deepnmt import (
    DeepDecoderTransformerConfig,
    DeepDecoderTransformerForConditionalGeneration,
    export_marian,
    fold_admin,
)
from hf_deepnmt.losses import (
    ald_loss,
    ald_views,
    compute_losses,
    ddr_loss,
    mean_pool,
    replaceable_source_positions,
    source_reliance,
)

CAD = dict(decoder_layers=3, cross_attention_drop_depth=2)


def cad_model(seed: int = 0, ratio: float = 0.5, **overrides):
    return tiny_model(seed, **{**CAD, "cross_attention_drop_ratio": ratio, **overrides})


# ------------------------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize("field, value, words", [
    ("cross_attention_drop_depth", 4, "[0, decoder_layers=3]"),
    ("cross_attention_drop_depth", -1, "[0, decoder_layers=3]"),
    ("cross_attention_drop_ratio", 1.5, "[0, 1]"),
    ("cross_attention_drop_ratio", -0.1, "[0, 1]"),
    ("ddr_weight", -1.0, "≥ 0"),
    ("ald_weight", float("nan"), "≥ 0"),
    ("ald_unk_ratio", 0.5, "(0, 0.5)"),
    ("ald_unk_ratio", 0.0, "(0, 0.5)"),
    ("ald_temperature", 0.0, "positive"),
    ("ald_protected_token_ids", [5, 500], "vocab_size=99"),
    ("ald_protected_token_ids", [3], "unk_token_id"),
])
def test_invalid_li2022_settings_raise_one_sentence_naming_the_field(field, value, words):
    with pytest.raises(ValueError) as error:
        tiny_config(decoder_layers=3, **{field: value})
    message = str(error.value)
    assert f"`{field}` = {value!r}" in message and words in message and len(message.splitlines()) == 1


def test_deep_decoder_config_has_the_papers_full_model_as_defaults():
    config = DeepDecoderTransformerConfig()
    assert config.model_type == "deep_decoder_transformer"
    assert (config.encoder_layers, config.decoder_layers, config.d_model, config.encoder_ffn_dim) == (15, 15, 512, 2048)
    assert config.layer_norm_position == "post"
    assert (config.ddr_weight, config.ald_weight, config.ald_unk_ratio, config.ald_temperature) == (1.0, 1.0, 0.3, 0.1)
    assert config.cross_attention_keep_schedule() == [0.5] * 12 + [1.0] * 3


# ------------------------------------------------------------------------------------------------ CAD structure
def test_layers_with_drop_ratio_one_have_no_cross_attention_parameters():
    model = cad_model(ratio=1.0)
    names = [name for name, _ in model.named_parameters()]
    for layer in (0, 1):  # bottom L_dr = 2 layers: no cross-attention at all, but post-LN keeps the formula's LN
        assert not any(f"decoder.layers.{layer}.encoder_attn." in name for name in names)
        assert f"model.decoder.layers.{layer}.encoder_attn_layer_norm.weight" in names
    assert "model.decoder.layers.2.encoder_attn.q_proj.weight" in names
    plain = tiny_model(decoder_layers=3)
    cross_params = 4 * (16 * 16 + 16)
    assert plain.num_parameters() - model.num_parameters() == 2 * cross_params
    pre = cad_model(ratio=1.0, layer_norm_position="pre")
    assert not any("decoder.layers.0.encoder_attn" in name for name, _ in pre.named_parameters())
    partial = dict(cad_model(ratio=0.5).named_parameters())  # 0 < p_net < 1: trained, so present
    assert all(f"model.decoder.layers.{i}.encoder_attn.q_proj.weight" in partial for i in (0, 1, 2))


def without_cross_attention(model):
    """Remove the cross-attention of every decoder layer: a decoder that cannot see its source (an unconditional
    LM). A config cannot ask for this (`test_a_decoder_without_any_cross_attention_is_refused`); tests build it."""
    for layer in model.model.decoder.layers:
        layer.encoder_attn, layer.cross_attention_keep = None, 0.0
    return model


def test_a_decoder_without_any_cross_attention_is_refused():
    with pytest.raises(ValueError, match=r"`cross_attention_drop_depth` = 2 is not allowed; with "
                                         r"cross_attention_drop_ratio=1.0 no decoder layer would keep a cross-attention"):
        tiny_config(decoder_layers=2, cross_attention_drop_depth=2, cross_attention_drop_ratio=1.0)
    tiny_config(decoder_layers=2, cross_attention_drop_depth=1, cross_attention_drop_ratio=1.0)  # the top one keeps it


def test_without_any_cross_attention_the_output_ignores_the_source(batch):
    model = without_cross_attention(tiny_model(decoder_layers=2, cross_attention_drop_depth=1,
                                               cross_attention_drop_ratio=1.0))
    other = batch["input_ids"].clone()
    other[other > 3] = 40  # a different source, same padding
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    a = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids)
    b = model(input_ids=other, attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(a.logits, b.logits)
    used = tiny_model(decoder_layers=2)
    a = used(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids)
    b = used(input_ids=other, attention_mask=batch["attention_mask"], decoder_input_ids=decoder_input_ids)
    assert (a.logits - b.logits).abs().max() > 1e-3


@pytest.mark.parametrize("position", ["post", "pre"])
def test_a_dropped_cross_attention_adds_nothing(position):
    model = cad_model(ratio=0.5, layer_norm_position=position)
    layer = model.model.decoder.layers[0]
    torch.manual_seed(1)
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    out, _, _ = layer(x, None, True, memory, None, use_cross_attention=False)
    # the self-attention sub-layer, then (post-LN) H̃ = LN(Ĥ) or (pre-LN) H̃ = Ĥ, then the FFN sub-layer
    if position == "post":
        h = layer.self_attn_layer_norm(x + layer.self_attn(x, is_causal=True)[0])
        expected = layer._feed_forward(layer.encoder_attn_layer_norm(h))
    else:
        h = x + layer.self_attn(layer.self_attn_layer_norm(x), is_causal=True)[0]
        expected = layer._feed_forward(h)
    torch.testing.assert_close(out, expected)
    used, _, _ = layer(x, None, True, memory, None, use_cross_attention=True)
    assert (used - out).abs().max() > 1e-4


def test_drop_net_draws_follow_the_ratio_in_training_only():
    model = cad_model(ratio=0.3).train()
    decoder = model.model.decoder
    torch.manual_seed(0)
    draws = [decoder.draw_cross_attention() for _ in range(2000)]
    for layer in (0, 1):  # bottom L_dr layers: dropped with probability p_net
        kept = sum(bool(d[layer]) for d in draws) / len(draws)
        assert abs(kept - 0.7) < 0.04, kept
    assert all(d[2] is True for d in draws)  # above L_dr: always kept
    decoder.eval()
    assert decoder.draw_cross_attention() == [True, True, True]


def test_independent_draws_per_row_group():
    decoder = cad_model(ratio=0.5).train().model.decoder
    torch.manual_seed(0)
    mixed = 0
    for _ in range(200):
        decisions = decoder.draw_cross_attention([2, 3])
        for decision in decisions[:2]:
            if isinstance(decision, torch.Tensor):
                mixed += 1
                assert decision.shape == (5, 1, 1)
                rows = decision.flatten().tolist()
                assert len(set(rows[:2])) == 1 and len(set(rows[2:])) == 1 and rows[0] != rows[2]
    assert 150 < mixed < 250  # two groups disagree half the time in each of 2 layers (≈ 200)


@pytest.mark.parametrize("ratio", [0.5, 1.0])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_cached_generation_equals_uncached_with_cad(ratio, num_beams, batch):
    model = cad_model(ratio=ratio)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=8,
                  num_beams=num_beams, do_sample=False)
    torch.testing.assert_close(model.generate(**kwargs, use_cache=True), model.generate(**kwargs, use_cache=False))


def test_cad_model_saves_loads_and_auto_classes(tmp_path, batch):
    torch.manual_seed(0)
    model = DeepDecoderTransformerForConditionalGeneration(
        DeepDecoderTransformerConfig(**{**TINY, "decoder_layers": 3, "encoder_layers": 2}, cross_attention_drop_depth=2,
                                     cross_attention_drop_ratio=1.0)).eval()
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "deep_decoder_transformer"
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is DeepDecoderTransformerForConditionalGeneration
    ids = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
               decoder_input_ids=model.prepare_decoder_input_ids_from_labels(batch["labels"]))
    torch.testing.assert_close(model(**ids).logits, loaded(**ids).logits, rtol=0, atol=0)


def test_gradient_checkpointing_gives_the_same_gradients_with_cad(batch):
    grads = []
    for checkpointing in (False, True):
        model = cad_model(ratio=0.5, dropout=0.0).train()
        if checkpointing:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        torch.manual_seed(3)
        compute_losses(model, batch, label_smoothing=0.1).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_marian_export_names_cad_without_cross_attention_and_admin_folds_it(batch):
    with pytest.raises(ValueError, match="cross_attention_drop_ratio=1.0"):
        export_marian(cad_model(ratio=1.0))
    model = cad_model(ratio=0.5)  # at inference every cross-attention is used: a standard Transformer
    marian = export_marian(model).eval()
    ids = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
               decoder_input_ids=model.prepare_decoder_input_ids_from_labels(batch["labels"]))
    torch.testing.assert_close(model(**ids).logits, marian(**ids).logits, atol=1e-5, rtol=0)
    admin = cad_model(ratio=1.0, residual_scaling="admin", admin_init="closed_form")
    folded = fold_admin(admin)
    torch.testing.assert_close(admin(**ids).logits, folded(**ids).logits, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------------ DDR
def reference_ddr(logits_1, logits_2, mask):
    """Token by token, with explicit probabilities."""
    total, count = 0.0, 0
    for b in range(logits_1.size(0)):
        for t in range(logits_1.size(1)):
            if not mask[b, t]:
                continue
            p, q = torch.softmax(logits_1[b, t], -1), torch.softmax(logits_2[b, t], -1)
            kl_pq = sum(p[v] * torch.log(p[v] / q[v]) for v in range(p.numel()))
            kl_qp = sum(q[v] * torch.log(q[v] / p[v]) for v in range(p.numel()))
            total = total + 0.5 * (kl_pq + kl_qp)
            count += 1
    return total / count


def test_ddr_value_and_gradient_match_a_reference():
    torch.manual_seed(0)
    a = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 3, 7, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    ours = ddr_loss(a, b, mask)
    ours_grads = torch.autograd.grad(ours, (a, b))
    ref = reference_ddr(a, b, mask)
    ref_grads = torch.autograd.grad(ref, (a, b))
    torch.testing.assert_close(ours.double(), ref, atol=1e-6, rtol=1e-5)
    for x, y in zip(ours_grads, ref_grads):
        torch.testing.assert_close(x.double(), y, atol=1e-6, rtol=1e-4)
    assert ddr_loss(a, a, mask).item() == pytest.approx(0.0, abs=1e-9)


def test_ddr_runs_two_decoder_passes_that_differ_and_averages_their_nll(batch):
    model = cad_model(ratio=0.5, dropout=0.3, ddr_weight=1.0).train()
    projected = []
    model.lm_head.register_forward_hook(lambda module, args, output: projected.append(output))
    torch.manual_seed(0)
    out = compute_losses(model, batch)
    logits = projected[0]  # the two passes over one encoder output, packed: (N, V), N needed positions
    needed = (batch["labels"] != -100).repeat(2, 1)  # (2B, T): right-padded labels, so up to each last label
    assert logits.shape == (int(needed.sum()), model.config.vocab_size) and len(projected) == 1
    logits = logits.new_zeros(*needed.shape, logits.size(-1)).index_put((needed,), logits)  # (2B, T, V)
    torch.testing.assert_close(out.outputs.logits, logits[:2])  # the output holds the first pass, (B, T, V)
    assert (logits[:2] - logits[2:]).abs().max() > 1e-3 and out.components["ddr"] > 0
    mask = batch["labels"] != -100
    assert out.components["ddr"].item() == pytest.approx(ddr_loss(logits[:2], logits[2:], mask).item(), rel=1e-5)
    labels = batch["labels"]
    per_pass = [F.cross_entropy(logits[i:i + 2].transpose(1, 2), labels) for i in (0, 2)]
    assert out.components["nll"].item() == pytest.approx(sum(p.item() for p in per_pass) / 2, rel=1e-5)
    # no dropout, no drop-net: the two passes are identical, DDR is zero
    still = cad_model(ratio=0.0, dropout=0.0, ddr_weight=1.0).train()
    assert compute_losses(still, batch).components["ddr"].item() == pytest.approx(0.0, abs=1e-7)
    # no dropout, but drop-net: only the independent draws make the passes differ
    drop_only = cad_model(ratio=0.5, dropout=0.0, ddr_weight=1.0).train()
    values = []
    for seed in range(8):
        torch.manual_seed(seed)
        values.append(compute_losses(drop_only, batch).components["ddr"].item())
    assert max(values) > 1e-4


# ------------------------------------------------------------------------------------------------ ALD
def test_ald_views_replace_the_right_number_of_tokens_and_never_specials():
    config = tiny_config(ald_protected_token_ids=[7])
    input_ids = torch.tensor([[1, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 2],
                              [7, 20, 21, 22, 23, 2, 0, 0, 0, 0, 0, 0]])
    attention_mask = (input_ids != 0).long()
    gamma = torch.tensor([0.25, 0.1])
    positive, negative = ald_views(input_ids, attention_mask, config, gamma)
    n = torch.tensor([9, 4])  # replaceable: not pad, bos (1), eos (2) or the protected tag 7
    assert (positive == 3).sum(1).tolist() == torch.round(gamma * n).long().tolist() == [2, 0]
    assert (negative == 3).sum(1).tolist() == torch.round((1 - gamma) * n).long().tolist() == [7, 4]
    keep = ~replaceable_source_positions(input_ids, attention_mask, config)
    assert torch.equal(positive[keep], input_ids[keep]) and torch.equal(negative[keep], input_ids[keep])
    assert bool(((positive == 3) <= (negative == 3)).all())  # X⁻ masks everything X⁺ masks
    torch.manual_seed(0)
    gammas = [(ald_views(input_ids, attention_mask, config)[0][0] == 3).sum().item() / 9 for _ in range(300)]
    assert max(gammas) <= round(0.3 * 9) / 9 and min(gammas) == 0.0  # γ ~ U[0, p_ALD)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 12, 31])
def test_ald_positive_view_keeps_strictly_more_of_the_source(n):
    """For every n ≥ 1 and γ ∈ [0, p_ALD), X⁻ masks a strict superset of X⁺'s positions (n = 2 with γ ∈ (0.25, 0.3)
    rounds both counts to 1 without the tie-break)."""
    config = tiny_config(ald_unk_ratio=0.49)
    input_ids = torch.cat([torch.arange(10, 10 + n), torch.tensor([2])]).repeat(64, 1)  # (64, n + 1): n words + </s>
    attention_mask = torch.ones_like(input_ids)
    gammas = torch.cat([torch.linspace(0, 0.489, 60), torch.tensor([0.26, 0.27, 0.29, 0.2999])])
    positive, negative = ald_views(input_ids, attention_mask, config, gammas)
    masked_pos, masked_neg = positive == config.unk_token_id, negative == config.unk_token_id
    assert bool((masked_pos <= masked_neg).all())
    assert bool((masked_pos.sum(1) < masked_neg.sum(1)).all()), (masked_pos.sum(1), masked_neg.sum(1))
    assert masked_neg.sum(1).max() <= n  # never more than the sentence has


def reference_ald(anchor, positive, negative, tau):
    losses = []
    for g, gp, gn in zip(anchor, positive, negative):
        s_pos = (g @ gp) / (g.norm() * gp.norm())
        s_neg = (g @ gn) / (g.norm() * gn.norm())
        losses.append(-torch.log(torch.exp(s_pos / tau) / (torch.exp(s_pos / tau) + torch.exp(s_neg / tau))))
    return sum(losses) / len(losses)


def test_ald_value_and_gradient_match_a_reference():
    torch.manual_seed(0)
    views = [torch.randn(3, 8, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    ours = ald_loss(*views, temperature=0.1)
    ref = reference_ald(*views, 0.1)
    torch.testing.assert_close(ours.double(), ref, atol=1e-6, rtol=1e-5)
    for x, y in zip(torch.autograd.grad(ours, views), torch.autograd.grad(ref, views)):
        torch.testing.assert_close(x.double(), y, atol=1e-6, rtol=1e-4)
    states = torch.randn(2, 4, 5)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]).bool()
    torch.testing.assert_close(mean_pool(states, mask)[0], states[0, :2].mean(0))


def test_crt_draws_drop_net_once_per_pass(batch, monkeypatch):
    model = cad_model(ratio=0.5, ddr_weight=1.0, ald_weight=1.0).train()
    decoder = model.model.decoder
    seen = []
    original = decoder.draw_cross_attention
    monkeypatch.setattr(decoder, "draw_cross_attention", lambda sizes=None, device=None, drop=True: seen.append(sizes)
                        or original(sizes, device, drop))
    compute_losses(model, batch)
    # one model call; rows [pass 1 on X | DDR pass 2 on X | X⁺, X⁻]: each pass draws on its own, as separate calls would
    assert seen == [[2, 2, 4]]


def test_ald_batches_both_views_in_one_call_and_gradients_reach_all_views(batch):
    model = cad_model(ratio=0.0, dropout=0.0, ald_weight=1.0).train()
    calls = []
    model.model.register_forward_hook(lambda module, args, kwargs, output: calls.append(kwargs["input_ids"].shape),
                                      with_kwargs=True)
    torch.manual_seed(0)
    out = compute_losses(model, batch)
    assert calls == [(3 * 2, batch["input_ids"].size(1))]  # X, X⁺, X⁻ in one encoder batch, one base-model call
    assert out.outputs.logits.size(0) == 2  # only X's pass is projected to the vocabulary
    assert "ald" in out.components and out.components["ald"] > 0
    model.zero_grad()
    out.loss.backward()
    unk_row = model.model.shared.weight.grad[model.config.unk_token_id]
    assert unk_row.abs().sum() > 0  # <unk> appears only in X⁺ / X⁻: the gradient flows through those views


def test_crt_is_training_only_and_logged_by_the_trainer(tmp_path, data, tiny_tokenizer):
    model = cad_model(ratio=0.5, ddr_weight=1.0, ald_weight=1.0).eval()
    out = compute_losses(model, {"input_ids": torch.tensor([[5, 6, 2]]), "labels": torch.tensor([[7, 2]])})
    assert set(out.components) == {"nll"}  # evaluation loss: one plain pass, unsmoothed
    trainer = make_trainer(tmp_path, data, tiny_tokenizer, max_steps=3, eval_strategy="steps", eval_steps=3,
                           model_overrides=dict(decoder_layers=3, cross_attention_drop_depth=2,
                                                cross_attention_drop_ratio=0.5, ddr_weight=1.0, ald_weight=1.0))
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert logs and all("ddr" in entry and "ald" in entry and "nll" in entry for entry in logs)
    evals = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert evals and all(math.isfinite(entry["eval_source_reliance"]) for entry in evals)
    trainer.save_model(str(tmp_path))
    (tmp_path / "deepnmt_card.json").write_text(json.dumps({"source_lang": "en", "target_lang": "es"}))
    trainer.create_model_card()
    card = (tmp_path / "README.md").read_text()
    assert "p_net = 0.5" in card and "DDR loss (li2022 §3.4), weight 1.0" in card
    assert "p_ALD = 0.3, τ = 0.1" in card and "li2022deepdecoder" in card  # settings and BibTeX


# ------------------------------------------------------------------------------------------------ collapse monitor
def train_copy_model(blind: bool = False, **overrides):
    """A tiny model trained for a few seconds to copy its source: it must rely on the source (unless ``blind``: no
    cross-attention at all)."""
    torch.manual_seed(0)
    model = tiny_model(dropout=0.0, **overrides).train()
    if blind:
        without_cross_attention(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(120):
        source = torch.randint(4, 30, (16, 6))
        batch = {"input_ids": torch.cat([source, torch.full((16, 1), 2)], 1),
                 "labels": torch.cat([source, torch.full((16, 1), 2)], 1)}
        optimizer.zero_grad()
        compute_losses(model, batch).loss.backward()
        optimizer.step()
    source = torch.randint(4, 30, (32, 6))
    return model.eval(), {"input_ids": torch.cat([source, torch.full((32, 1), 2)], 1),
                          "labels": torch.cat([source, torch.full((32, 1), 2)], 1)}


def test_source_reliance_is_zero_without_cross_attention_and_clearly_positive_when_the_source_is_used():
    collapsed, _ = train_copy_model(blind=True)
    used, batch = train_copy_model()
    blind = source_reliance(collapsed, batch)
    reliant = source_reliance(used, batch)
    assert blind == pytest.approx(0.0, abs=1e-5)
    assert reliant > 0.5, reliant  # nats per token (0.94 with this seed)
    assert not used.training  # the monitor restores the mode
