"""liu2020 ADMIN: ω recursion, closed form, folding, Marian export, save/load, padding, trainer hook, 2 processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY, train_argv
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, MarianMTModel

import hf_deepnmt
from hf_deepnmt import (
    AdminTransformerConfig,
    AdminTransformerForConditionalGeneration,
    DeepTransformerConfig,
    DeepTransformerForConditionalGeneration,
    admin_omega_closed_form,
    admin_profile,
    export_marian,
    fold_admin,
)
from hf_deepnmt.admin import iter_sublayers, omega_values


def admin_model(seed: int = 0, **overrides) -> DeepTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    config = DeepTransformerConfig(**{**TINY, "residual_scaling": "admin", **overrides})
    return DeepTransformerForConditionalGeneration(config)


def profiling_batch():
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, 0, 0], [13, 14, 15, 16, 2, 0]])
    labels = torch.tensor([[17, 18, 19, 2], [20, 2, -100, -100], [21, 22, 2, -100]])
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


# ------------------------------------------------------------------------------------------------ the recursion
def hand_profile(model, batch) -> dict[str, list[float]]:
    """A direct re-implementation of docs/liu2020.md's recursion that walks the layers by hand (dropout 0 ⇒ deterministic)."""
    core, omegas = model.model, {"encoder": [], "decoder": []}

    def var(t, mask):
        return t[mask].double().var(unbiased=False).item()

    def sublayer(stack, x, branch, norm, mask, omega_param):
        value = omegas[stack][-1][1] if omegas[stack] else 1.0
        if omega_param is not None:
            omega_param.data.fill_(value)
        nxt = math.sqrt(var(value * x, mask) + var(branch, mask))
        omegas[stack].append((value, nxt))
        return norm(value * x + branch)

    with torch.no_grad():
        enc_mask = batch["attention_mask"].bool()
        x = core.encoder.embed_tokens(batch["input_ids"])
        x = x + hf_deepnmt.modeling_common.sinusoidal_positions(0, x.shape[1], x.shape[2], x.device, x.dtype)
        additive = torch.zeros(enc_mask.shape).masked_fill(~enc_mask, float("-inf"))[:, None, None, :]
        for layer in core.encoder.layers:
            branch, _ = layer.self_attn(x, attention_mask=additive)
            x = sublayer("encoder", x, branch, layer.self_attn_layer_norm, enc_mask, None if layer.layer_idx == 0
                         else layer.self_attn_omega)
            branch = layer.fc2(layer.activation_fn(layer.fc1(x)))
            x = sublayer("encoder", x, branch, layer.final_layer_norm, enc_mask, layer.ffn_omega)
        memory = x
        labels = batch["labels"]
        dec_mask = labels != -100
        y_in = model.prepare_decoder_input_ids_from_labels(labels)
        y = core.decoder.embed_tokens(y_in)
        y = y + hf_deepnmt.modeling_common.sinusoidal_positions(0, y.shape[1], y.shape[2], y.device, y.dtype)
        for layer in core.decoder.layers:
            branch, _ = layer.self_attn(y, is_causal=True)
            y = sublayer("decoder", y, branch, layer.self_attn_layer_norm, dec_mask, None if layer.layer_idx == 0
                         else layer.self_attn_omega)
            branch, _ = layer.encoder_attn(y, key_value_states=memory, attention_mask=additive)
            y = sublayer("decoder", y, branch, layer.encoder_attn_layer_norm, dec_mask, layer.encoder_attn_omega)
            branch = layer.fc2(layer.activation_fn(layer.fc1(y)))
            y = sublayer("decoder", y, branch, layer.final_layer_norm, dec_mask, layer.ffn_omega)
    return {stack: [value for value, _ in pairs] for stack, pairs in omegas.items()}


def test_profile_matches_a_hand_computation_of_the_recursion():
    batch = profiling_batch()
    profiled = admin_model(dropout=0.0)
    values = admin_profile(profiled, batch)
    expected = hand_profile(admin_model(dropout=0.0), batch)
    assert len(values["encoder"]) == 2 * 2 and len(values["decoder"]) == 3 * 2  # 2 sub-layers/enc, 3/dec layer
    assert values["encoder"][0] == values["decoder"][0] == 1.0  # ω_1 = 1 in both chains
    for stack in ("encoder", "decoder"):
        assert values[stack] == pytest.approx(expected[stack], rel=1e-5)
        assert all(b > a for a, b in zip(values[stack], values[stack][1:]))  # cumulative variance grows
    for stack in ("encoder", "decoder"):
        assert omega_values(profiled)[stack] == pytest.approx(values[stack], rel=1e-6)
    assert profiled.config.admin_profiled is True
    omega = profiled.model.encoder.layers[1].ffn_omega
    assert omega.shape == (16,) and torch.all(omega == omega[0])  # a d-vector filled with the scalar


def test_profile_runs_with_dropout_in_training_mode_and_restores_the_mode():
    model = admin_model(dropout=0.3).eval()
    torch.manual_seed(1)
    first = admin_profile(model, profiling_batch())
    assert not model.training
    model.config.admin_profiled = False
    torch.manual_seed(2)
    second = admin_profile(admin_model(dropout=0.3), profiling_batch())
    assert first["encoder"][1:] != second["encoder"][1:]  # dropout draws change Var(f): training mode was on


def test_heavy_padding_profiles_the_same_omega():
    batch = {"input_ids": torch.tensor([[5, 6, 7, 2], [8, 9, 10, 2]]), "labels": torch.tensor([[11, 12, 2], [13, 14, 2]])}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    padded = {
        "input_ids": torch.cat([batch["input_ids"], torch.zeros(2, 20, dtype=torch.long)], 1),
        "labels": torch.cat([batch["labels"], torch.full((2, 15), -100)], 1),
    }
    padded["attention_mask"] = (padded["input_ids"] != 0).long()
    plain = admin_profile(admin_model(dropout=0.0), batch)
    heavy = admin_profile(admin_model(dropout=0.0), padded)
    for stack in plain:
        assert heavy[stack] == pytest.approx(plain[stack], rel=1e-5)


@pytest.mark.parametrize("n,expected", [(2, 1.3156), (12, 2.0170), (36, 3.0408), (120, 4.9225)])
def test_closed_form_values(n, expected):
    # hand values: sqrt((N+1)/ln(N+1) − 1); N = 2·L_e or 3·L_d (120 = the 60-layer encoder, 36 = the 12-layer decoder)
    assert admin_omega_closed_form(n) == pytest.approx(expected, abs=1e-4)


def test_closed_form_init_sets_every_omega_but_the_first():
    model = admin_model(admin_init="closed_form")
    values = omega_values(model)
    assert values["encoder"][0] == values["decoder"][0] == 1.0
    assert values["encoder"][1:] == pytest.approx([admin_omega_closed_form(4)] * 3)
    assert values["decoder"][1:] == pytest.approx([admin_omega_closed_form(6)] * 5)


def test_omega_is_trainable_or_fixed():
    trainable = admin_model()
    names = [name for name, _ in trainable.named_parameters() if name.endswith("_omega")]
    assert len(names) == (4 - 1) + (6 - 1)
    fixed = admin_model(admin_omega_trainable=False)
    assert not any(name.endswith("_omega") for name, _ in fixed.named_parameters())
    assert sum(name.endswith("_omega") for name in fixed.state_dict()) == len(names)  # buffers, still saved


# ------------------------------------------------------------------------------------------------ folding / export
def _trained_like(model):
    """Profile, then perturb ω per coordinate so that folding must handle real d-vectors."""
    admin_profile(model, profiling_batch())
    with torch.no_grad():
        for sublayer in iter_sublayers(model):
            if sublayer.omega is not None:
                sublayer.omega.mul_(1 + 0.3 * torch.rand_like(sublayer.omega))
    return model.eval()


def test_fold_admin_gives_a_standard_model_with_the_same_logits():
    model = _trained_like(admin_model(dropout=0.1))
    folded = fold_admin(model)
    assert isinstance(folded, DeepTransformerForConditionalGeneration)
    assert folded.config.residual_scaling == "none" and folded.config.model_type == "deep_transformer"
    assert not any(name.endswith("_omega") for name in folded.state_dict())
    batch = profiling_batch()
    with torch.no_grad():
        difference = (model(**batch).logits - folded(**batch).logits).abs().max().item()
    assert difference < 1e-4, difference
    assert folded.lm_head.weight.data_ptr() == folded.model.shared.weight.data_ptr()


@pytest.mark.parametrize("admin", [False, True])
def test_export_marian_gives_the_same_logits_and_beams(admin):
    model = (_trained_like(admin_model(dropout=0.1)) if admin
             else DeepTransformerForConditionalGeneration(DeepTransformerConfig(**TINY)).eval())
    marian = export_marian(model)
    assert type(marian) is MarianMTModel
    batch = profiling_batch()
    with torch.no_grad():
        difference = (model(**batch).logits - marian(**batch).logits).abs().max().item()
    assert difference < 1e-4, difference
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4,
                  num_return_sequences=2, max_new_tokens=8)
    assert torch.equal(model.generate(**kwargs), marian.generate(**kwargs))


def test_export_marian_names_the_feature_it_cannot_express():
    model = DeepTransformerForConditionalGeneration(DeepTransformerConfig(**TINY, layer_norm_position="pre"))
    with pytest.raises(ValueError, match="layer_norm_position='pre'"):
        export_marian(model)


# ------------------------------------------------------------------------------------------------ save / load, classes
def test_save_load_keeps_omega_and_never_reprofiles(tmp_path):
    model = _trained_like(admin_model())
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["admin_profiled"] is True and config["residual_scaling"] == "admin"
    assert any(key.endswith("_omega") for key in load_file(str(tmp_path / "model.safetensors")))
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    for stack in ("encoder", "decoder"):
        assert omega_values(reloaded)[stack] == pytest.approx(omega_values(model)[stack], rel=1e-6)
    assert not list(tmp_path.glob("*.init")) and not list(tmp_path.glob("profile*"))  # no side file


def test_admin_transformer_classes_have_the_papers_defaults(tmp_path):
    config = AdminTransformerConfig()
    assert config.model_type == "admin_transformer" and config.residual_scaling == "admin"
    assert (config.encoder_layers, config.decoder_layers, config.d_model, config.encoder_ffn_dim,
            config.encoder_attention_heads, config.layer_norm_position) == (60, 12, 512, 2048, 8, "post")
    assert (config.dropout, config.attention_dropout, config.activation_dropout) == (0.2, 0.1, 0.1)
    tiny = AdminTransformerForConditionalGeneration(AdminTransformerConfig(**TINY))
    tiny.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "admin_transformer"
    assert saved["auto_map"]["AutoModelForSeq2SeqLM"] == "modeling_deep_transformer.AdminTransformerForConditionalGeneration"
    assert type(AutoModelForSeq2SeqLM.from_pretrained(tmp_path)) is AdminTransformerForConditionalGeneration
    with pytest.raises(ValueError, match="`residual_scaling` = 'admin'"):
        AdminTransformerConfig(**TINY, layer_norm_position="pre")


def test_cached_generation_equals_uncached_for_admin():
    model = _trained_like(admin_model())
    batch = profiling_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=3, max_new_tokens=8)
    assert torch.equal(model.generate(**kwargs), model.generate(**kwargs, use_cache=False))


def test_gradient_checkpointing_gives_the_same_gradients_for_admin():
    def grads(checkpointing: bool):
        model = _trained_like(admin_model(dropout=0.2)).train()
        if checkpointing:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        torch.manual_seed(3)
        model(**profiling_batch()).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    plain, checkpointed = grads(False), grads(True)
    assert any(name.endswith("_omega") for name in plain)
    for name, grad in plain.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name


# ------------------------------------------------------------------------------------------------ the trainer
ADMIN_ARGS = ["--config_overrides", "d_model=16,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,"
              "decoder_attention_heads=2,encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64,"
              "residual_scaling=admin", "--max_steps", "1", "--learning_rate", "0", "--admin_profile_tokens", "600"]


@pytest.mark.integration
def test_trainer_profiles_once_before_the_first_step(small_corpus, tmp_path, capsys):
    from hf_deepnmt_training.train import train

    outcome = train(train_argv(small_corpus, tmp_path / "run", *ADMIN_ARGS))
    model = outcome.trainer.model
    assert model.config.admin_profiled is True
    assert omega_values(model)["encoder"][1] > 1.0
    assert "ADMIN profile" in capsys.readouterr().err
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["admin_profiled"] is True


@pytest.mark.integration
def test_two_processes_profile_identically_to_one(small_corpus, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    args = [*ADMIN_ARGS, "--ddp_find_unused_parameters", "false", "--per_device_train_batch_size", "4"]
    single = [sys.executable, "-m", "hf_deepnmt_training.cli", "train", *train_argv(small_corpus, tmp_path / "one", *args)]
    assert subprocess.run(single, env=env, capture_output=True, text=True, timeout=300).returncode == 0
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    double = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
              "-m", "hf_deepnmt_training.cli", "train", *train_argv(small_corpus, tmp_path / "two", *args)]
    result = subprocess.run(double, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    one, two = load_file(str(tmp_path / "one" / "model.safetensors")), load_file(str(tmp_path / "two" / "model.safetensors"))
    omegas = [key for key in one if key.endswith("_omega")]
    assert omegas and all(torch.allclose(one[key], two[key], rtol=1e-5) for key in omegas)
    assert not torch.allclose(one[omegas[0]], torch.ones_like(one[omegas[0]]))
