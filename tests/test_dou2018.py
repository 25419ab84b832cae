"""dou2018 (docs/dou2018.md): layer aggregation, multi-layer attention, layer diversity, warm start — on the one
Transformer, composed with everything else."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hf_deepnmt.modeling_common import output_cache
import torch.nn.functional as F
from conftest import TINY, tiny_config, tiny_model
from test_trainer import data, make_trainer  # noqa: F401  (the `data` fixture)
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from hf_deepnmt import (
    DeepRepresentationTransformerConfig,
    DeepRepresentationTransformerForConditionalGeneration,
    DeepTransformerConfig,
    DeepTransformerForConditionalGeneration,
    export_marian,
    fold_admin,
    warm_start,
)
from hf_deepnmt.losses import compute_losses, layer_diversity_sum

DEEP = dict(encoder_layers=4, decoder_layers=5)  # 5: an odd decoder exercises hierarchical's last node
MECHANISMS = {
    "dense": dict(encoder_layer_aggregation="dense", decoder_layer_aggregation="dense"),
    "linear": dict(encoder_layer_aggregation="linear", decoder_layer_aggregation="linear"),
    "iterative": dict(encoder_layer_aggregation="iterative", decoder_layer_aggregation="iterative"),
    "hierarchical": dict(encoder_layer_aggregation="hierarchical", decoder_layer_aggregation="hierarchical"),
    "mla2": dict(multi_layer_attention_k=2),
    "mla3": dict(multi_layer_attention_k=3),
    "all": dict(encoder_layer_aggregation="hierarchical", decoder_layer_aggregation="linear", multi_layer_attention_k=2,
                aggregation_activation="relu"),
}


def dou_model(mechanism: str, seed: int = 0, **overrides) -> DeepTransformerForConditionalGeneration:
    model = tiny_model(seed, **{**DEEP, **MECHANISMS[mechanism], **overrides})
    if mechanism == "linear":  # identity init would make the combination invisible; perturb it
        torch.manual_seed(seed + 1)
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "layer_inputs" in name or "output_combination" in name:
                    parameter.add_(0.1 * torch.randn_like(parameter))
    return model


# ------------------------------------------------------------------------------------------------ Table 1 counts
BASE = dict(vocab_size=32000, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
            decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048)


def base_parameters(**switches) -> int:
    with torch.device("meta"):
        return DeepTransformerForConditionalGeneration(DeepTransformerConfig(**BASE, **switches)).num_parameters()


@pytest.mark.parametrize("row, switches, table_millions", [
    ("2 + Dense Connection", MECHANISMS["dense"], 0.0),
    ("3 + Linear Combination", MECHANISMS["linear"], 14.7),
    ("4 + Iterative Aggregation", MECHANISMS["iterative"], 31.5),
    ("5 + Hierarchical Aggregation", MECHANISMS["hierarchical"], 23.1),
    ("6 + Multi-Layer Attention (k=2)", MECHANISMS["mla2"], 33.6),
    ("7 + Multi-Layer Attention (k=3)", MECHANISMS["mla3"], 37.8),
])
def test_added_parameters_at_base_equal_dou2018_table_1(row, switches, table_millions):
    """dou2018 Table 1 (Transformer-Base 6-6, 512/2048/8): parameters added over the vanilla model, to 0.1M."""
    added = base_parameters(**switches) - base_parameters()
    assert round(added / 1e6, 1) == table_millions, (row, added)


def test_the_exact_structure_behind_the_counts():
    d, ffn = 512, 2048
    agg2, agg3 = 2 * d * ffn + ffn + ffn * d + d + 2 * d, 3 * d * ffn + ffn + ffn * d + d + 2 * d  # Eq. (7)
    attention = 4 * (d * d + d)
    assert base_parameters(**MECHANISMS["linear"]) - base_parameters() == 2 * 28 * d * d  # 21 + 7 d×d per stack
    assert base_parameters(**MECHANISMS["iterative"]) - base_parameters() == 2 * 5 * agg2
    assert base_parameters(**MECHANISMS["hierarchical"]) - base_parameters() == 2 * (agg2 + 2 * agg3)
    assert base_parameters(**MECHANISMS["mla2"]) - base_parameters() == 2 * 4 * (attention + agg2)
    assert base_parameters(**MECHANISMS["mla3"]) - base_parameters() == 2 * 3 * (2 * attention + agg3)


# ------------------------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize("overrides, field, words", [
    (dict(encoder_layer_aggregation="deep"), "encoder_layer_aggregation", "use one of ['none', 'dense'"),
    (dict(decoder_layers=1, decoder_layer_aggregation="hierarchical"), "decoder_layer_aggregation", "at least 2 layers"),
    (dict(aggregation_activation="tanh"), "aggregation_activation", "['sigmoid', 'relu']"),
    (dict(multi_layer_attention_k=4), "multi_layer_attention_k", "1 (off), 2 or 3"),
    (dict(multi_layer_attention_k=3), "multi_layer_attention_k", "at least 4 layers"),
    (dict(diversity_weight=-1.0), "diversity_weight", "≥ 0"),
    (dict(decoder_layers=1, diversity_weight=1.0), "diversity_weight", "the decoder needs at least 2 layers"),
])
def test_invalid_dou2018_settings_raise_one_sentence(overrides, field, words):
    with pytest.raises(ValueError) as error:
        tiny_config(**overrides)
    message = str(error.value)
    assert f"`{field}` = " in message and words in message and len(message.splitlines()) == 1


def test_the_paper_config_and_auto_classes():
    config = DeepRepresentationTransformerConfig()
    assert config.model_type == "deep_representation_transformer"
    assert (config.encoder_layers, config.decoder_layers, config.d_model, config.encoder_ffn_dim) == (6, 6, 512, 2048)
    assert (config.encoder_layer_aggregation, config.decoder_layer_aggregation) == ("hierarchical", "hierarchical")
    assert (config.diversity_weight, config.aggregation_activation, config.multi_layer_attention_k) == (1.0, "sigmoid", 1)
    tiny = AutoConfig.for_model("deep_representation_transformer", **TINY)
    assert type(AutoModelForSeq2SeqLM.from_config(tiny)) is DeepRepresentationTransformerForConditionalGeneration
    assert tiny_config(diversity_weight=1.0).diversity_stacks() == ("encoder", "decoder")
    assert tiny_config(diversity_weight=1.0, encoder_layer_aggregation="linear").diversity_stacks() == ("encoder",)


# ------------------------------------------------------------------------------------------------ the equations
def reference_stack(stack, embeddings, call):
    """dou2018 §3.1.1 written out plainly for one stack: returns (output, [H^1 … H^L])."""
    kind = stack.aggregation.kind if stack.aggregation is not None else "none"
    outputs = [embeddings]
    node = None
    for number, layer in enumerate(stack.layers, start=1):
        if kind == "linear":
            weights = stack.aggregation.layer_inputs[number - 1].weight
            x = sum(h @ w.T for h, w in zip(outputs, weights))  # Eq. (5): Σ_i W_i h^i
        elif kind == "hierarchical" and number % 2 == 1 and number > 1:
            x = node
        else:
            x = outputs[-1]
        h = call(layer, x)
        if kind == "dense":
            h = h + sum(outputs[1:], torch.zeros_like(h))  # Eq. (4)
        outputs.append(h)
        if kind == "iterative":
            node = h if number == 1 else stack.aggregation.nodes[number - 2](h, node)
        if kind == "hierarchical" and number % 2 == 0:
            i = number // 2
            node = (stack.aggregation.nodes[0](outputs[1], outputs[2]) if i == 1
                    else stack.aggregation.nodes[i - 1](outputs[number - 1], h, node))
        if kind == "hierarchical" and number % 2 == 1 and number == len(stack.layers):
            node = stack.aggregation.nodes[-1](h, node)
    if kind == "linear":
        out = sum(h @ w.T for h, w in zip(outputs, stack.aggregation.output_combination.weight))
    elif kind in ("iterative", "hierarchical"):
        out = node
    else:
        out = outputs[-1]
    return out, outputs[1:]


@pytest.mark.parametrize("mechanism", ["dense", "linear", "iterative", "hierarchical"])
def test_each_aggregation_is_what_the_paper_writes(mechanism, batch):
    model = dou_model(mechanism)
    encoder = model.model.encoder
    mask = batch["attention_mask"]
    additive = torch.zeros(mask.shape[0], 1, 1, mask.shape[1]).masked_fill(~mask.bool()[:, None, None, :], float("-inf"))
    with torch.no_grad():
        embeddings = encoder._embed(batch["input_ids"], None, 0)
        expected, layers = reference_stack(encoder, embeddings, lambda layer, x: layer(x, additive)[0])
        got = encoder(input_ids=batch["input_ids"], attention_mask=mask, output_hidden_states=True)
    real = mask.bool()
    torch.testing.assert_close(got.last_hidden_state[real], expected[real], atol=1e-5, rtol=1e-5)
    for h_got, h_ref in zip(got.hidden_states[1:], layers):
        torch.testing.assert_close(h_got[real], h_ref[real], atol=1e-5, rtol=1e-5)


def test_hierarchical_nodes_feed_the_next_pair_and_use_the_papers_agg():
    model = dou_model("hierarchical")
    aggregation = model.model.decoder.aggregation  # 5 layers: AGG2, AGG3, and AGG2 for the odd last layer
    assert [node.num_inputs for node in aggregation.nodes] == [2, 3, 2]
    node = aggregation.nodes[0]
    x, y = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    expected = node.layer_norm(node.fc2(torch.sigmoid(node.fc1(torch.cat([x, y], -1)))) + x + y)  # Eq. (7)
    torch.testing.assert_close(node(x, y), expected)


def test_multi_layer_attention_merges_k_separate_attentions(batch):
    model = dou_model("mla3")
    encoder = model.model.encoder
    layers = encoder.layers
    assert [layer.multi_layer_attns is not None for layer in layers] == [False, False, False, True]  # l ≥ k+1
    with torch.no_grad():
        out = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        h = out.hidden_states  # H^0 … H^4
        mask = torch.zeros(2, 1, 1, 6).masked_fill(~batch["attention_mask"].bool()[:, None, None, :], float("-inf"))
        layer = layers[3]
        c1 = layer.self_attn(h[3], attention_mask=mask)[0]
        c2 = layer.multi_layer_attns[0](h[3], key_value_states=h[2], attention_mask=mask)[0]  # Eq. (8): C_{-2}
        c3 = layer.multi_layer_attns[1](h[3], key_value_states=h[1], attention_mask=mask)[0]  # C_{-3}
        branch = layer.multi_layer_agg(c1, c2, c3)
        expected = layer._feed_forward(layer.self_attn_layer_norm(h[3] + branch))
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(h[4][real], expected[real], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ decoding
@pytest.mark.parametrize("mechanism, num_beams", [(name, 3) for name in sorted(MECHANISMS)] + [("all", 1)])
def test_cached_generation_equals_uncached(mechanism, num_beams, batch):
    model = dou_model(mechanism)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=7,
                  num_beams=num_beams, do_sample=False, length_penalty=0.6)
    torch.testing.assert_close(model.generate(**kwargs, use_cache=True), model.generate(**kwargs, use_cache=False))


@pytest.mark.parametrize("mechanism", ["hierarchical", "mla2"])
def test_sampling_cached_equals_uncached(mechanism, batch):
    model = dou_model(mechanism)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=7,
                  do_sample=True, top_k=0, num_beams=1)
    torch.manual_seed(5)
    cached = model.generate(**kwargs, use_cache=True)
    torch.manual_seed(5)
    torch.testing.assert_close(cached, model.generate(**kwargs, use_cache=False))


def test_incremental_steps_match_the_full_forward_with_every_mechanism(batch):
    model = dou_model("all")
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    with torch.no_grad():
        full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     decoder_input_ids=decoder_input_ids).logits
        encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        cache, steps = None, []
        for t in range(decoder_input_ids.shape[1]):
            out = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"],
                        decoder_input_ids=decoder_input_ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache, _ = output_cache(out), steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    # the extra attention of every layer l ≥ 3 keeps its own keys/values: 5 layers + 5 slots for H^{l-2}
    assert len(cache.self_attention_cache.layers) == 10
    assert cache.self_attention_cache.layers[5 + 2].keys.shape[2] == decoder_input_ids.shape[1]


@pytest.mark.parametrize("mechanism", sorted(MECHANISMS))
def test_padding_invariance(mechanism):
    model = dou_model(mechanism)
    source, target = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[8, 9, 2]])
    other_source, other_target = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 2]]), torch.tensor([[17, 18, 19, 20, 2]])
    with torch.no_grad():
        alone = model(input_ids=source, labels=target).logits
        input_ids = torch.cat([torch.cat([source, torch.zeros(1, 4, dtype=torch.long)], 1), other_source])
        labels = torch.cat([torch.cat([target, torch.full((1, 2), -100)], 1), other_target])
        padded = model(input_ids=input_ids, attention_mask=(input_ids != 0).long(), labels=labels).logits
    torch.testing.assert_close(padded[0, :3], alone[0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ diversity
def reference_diversity(layers, mask):
    """Eq. (10) dou2018 with explicit loops: mean over positions of 1/(L−1) Σ_l (1 − cos²)."""
    values = []
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t]:
                pairs = [1 - (torch.dot(lo[b, t], up[b, t]) / (lo[b, t].norm() * up[b, t].norm())) ** 2
                         for lo, up in zip(layers[:-1], layers[1:])]
                values.append(sum(pairs) / len(pairs))
    return sum(values) / len(values)


def test_diversity_value_and_gradient_match_a_reference():
    torch.manual_seed(0)
    layers = [torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    ours = layer_diversity_sum(layers, mask) / mask.sum()
    reference = reference_diversity(layers, mask)
    torch.testing.assert_close(ours.double(), reference, atol=1e-6, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(ours, layers), torch.autograd.grad(reference, layers)):
        torch.testing.assert_close(a.double(), b, atol=1e-6, rtol=1e-4)
    same = [layers[0].detach()] * 3
    assert layer_diversity_sum(same, mask).item() == pytest.approx(0.0, abs=1e-5)  # parallel states: no diversity


def test_the_objective_maximises_diversity(batch):
    """Eq. (9): trained loss = NLL − λ·L_div (averaged over the stacks); a gradient step on it raises L_div."""
    model = dou_model("hierarchical", dropout=0.0, diversity_weight=2.0).train()
    out = compute_losses(model, batch, label_smoothing=0.1)
    c = out.components
    torch.testing.assert_close(out.loss.detach(), c["smoothed_nll"] - 2.0 * (c["div_encoder"] + c["div_decoder"]) / 2)
    with torch.no_grad():
        reference = model(**batch, output_hidden_states=True)
    source_mask = batch["attention_mask"].bool()
    expected = reference_diversity(reference.encoder_hidden_states[1:], source_mask)
    assert c["div_encoder"].item() == pytest.approx(float(expected), rel=1e-4)
    # the sign: the gradient λ adds, g(λ=1) − g(λ=0) = −∇L_div; stepping against it must raise L_div
    gradients = []
    for weight in (0.0, 1.0):
        candidate = dou_model("hierarchical", dropout=0.0, diversity_weight=weight).train()
        gradients.append(torch.autograd.grad(compute_losses(candidate, batch).loss, list(candidate.parameters()),
                                             allow_unused=True))
    probe = dou_model("hierarchical", dropout=0.0, diversity_weight=1.0).train()
    before = compute_losses(probe, batch).components
    with torch.no_grad():
        for parameter, g0, g1 in zip(probe.parameters(), *gradients):
            if g1 is not None:
                parameter -= 0.05 * (g1 - (g0 if g0 is not None else 0.0))
    after = compute_losses(probe, batch).components
    assert after["div_encoder"] + after["div_decoder"] > before["div_encoder"] + before["div_decoder"]


def test_diversity_with_ddr_averages_both_decoder_passes(batch):
    plain = dou_model("hierarchical", dropout=0.0, diversity_weight=1.0).train()
    doubled = dou_model("hierarchical", dropout=0.0, diversity_weight=1.0, ddr_weight=1.0,
                        cross_attention_drop_depth=0).train()
    a, b = compute_losses(plain, batch).components, compute_losses(doubled, batch).components
    # no dropout, no drop-net: the two passes are identical, so their mean is the single pass
    torch.testing.assert_close(a["div_decoder"], b["div_decoder"])
    torch.testing.assert_close(a["div_encoder"], b["div_encoder"])


# ------------------------------------------------------------------------------------------------ warm start
def test_warm_start_copies_every_trained_weight_and_linear_starts_as_vanilla(batch, tmp_path):
    vanilla = tiny_model(**DEEP).train()
    vanilla.save_pretrained(tmp_path)
    for mechanism in ("linear", "hierarchical", "mla2"):
        model = warm_start(tmp_path, **MECHANISMS[mechanism], diversity_weight=1.0)
        assert type(model) is DeepRepresentationTransformerForConditionalGeneration
        state = model.state_dict()
        for name, tensor in vanilla.state_dict().items():
            torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)
        assert len(state) > len(vanilla.state_dict())  # the new modules exist, freshly initialised
    linear = warm_start(vanilla, **MECHANISMS["linear"]).eval()
    with torch.no_grad():
        torch.testing.assert_close(linear(**batch).logits, vanilla.eval()(**batch).logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="`model.shared.weight` has shape"):
        warm_start(vanilla, config=DeepTransformerConfig(**{**TINY, **DEEP, "vocab_size": 120}))


@pytest.mark.integration
def test_deepnmt_train_warm_start_option(small_corpus, tiny_folder, tmp_path):
    from conftest import train_argv

    from hf_deepnmt_training.train import train

    outcome = train(train_argv(small_corpus, tmp_path / "hier", "--max_steps", "2", "--warm_start_from",
                               str(tiny_folder), "--config_overrides",
                               "d_model=16,encoder_layers=2,decoder_layers=2,encoder_attention_heads=4,"
                               "decoder_attention_heads=4,encoder_ffn_dim=32,decoder_ffn_dim=32,"
                               "max_position_embeddings=64,encoder_layer_aggregation=hierarchical,"
                               "decoder_layer_aggregation=hierarchical,diversity_weight=1.0",
                               "--learning_rate", "0.0"))
    logs = [entry for entry in outcome.trainer.state.log_history if "loss" in entry]
    assert logs and all("div_encoder" in entry and "div_decoder" in entry for entry in logs)
    model = outcome.trainer.model
    assert model.config.encoder_layer_aggregation == "hierarchical"
    trained = AutoModelForSeq2SeqLM.from_pretrained(tiny_folder).state_dict()
    state = model.state_dict()
    for name, tensor in trained.items():  # learning rate 0: the copied weights are still the trained ones
        torch.testing.assert_close(state[name].cpu(), tensor, rtol=0, atol=0, msg=name)


def warm_started_trainer(tmp_path, data, tokenizer, **options):
    """A trained-looking vanilla model warm-started to hierarchical aggregation, in a DeepNMTTrainer."""
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments

    from hf_deepnmt_training.trainer import DeepNMTTrainer

    vanilla = tiny_model(vocab_size=len(tokenizer), max_position_embeddings=64, dropout=0.0, **DEEP)
    model = warm_start(vanilla, **MECHANISMS["hierarchical"]).train()
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), learning_rate=1e-2, per_device_train_batch_size=8,
                                    max_steps=4, logging_steps=1, report_to="none", use_cpu=True, seed=0,
                                    save_strategy="no", eval_strategy="no", warmup_steps=0, lr_scheduler_type="linear",
                                    disable_tqdm=True, dataloader_num_workers=0)
    return DeepNMTTrainer(model=model, args=args, train_dataset=data[0], processing_class=tokenizer,
                          data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
                          new_parameters=model.warm_start_new_parameters, **options)


def test_warm_start_lists_exactly_the_parameters_it_did_not_copy():
    vanilla = tiny_model(**DEEP)
    model = warm_start(vanilla, **MECHANISMS["hierarchical"])
    copied = set(dict(vanilla.named_parameters()))
    assert set(model.warm_start_new_parameters) == set(dict(model.named_parameters())) - copied
    assert model.warm_start_new_parameters and all("aggregat" in name for name in model.warm_start_new_parameters)
    assert warm_start(vanilla, config=vanilla.config).warm_start_new_parameters == ()  # same model: nothing new


def test_new_parameters_train_at_the_scaled_learning_rate(tmp_path, data, tiny_tokenizer, capsys):
    trainer = warm_started_trainer(tmp_path, data, tiny_tokenizer, new_parameters_lr_scale=0.1)
    trainer.train()
    new = set(trainer.model.warm_start_new_parameters)
    names = {id(parameter): name for name, parameter in trainer.model.named_parameters()}
    groups = trainer.optimizer.param_groups
    for group in groups:  # every group is all-new or all-copied, and the new ones carry the scaled learning rate
        kinds = {names[id(parameter)] in new for parameter in group["params"]}
        assert kinds == {bool(group.get("warm_start_new"))}
    lr = {bool(group.get("warm_start_new")): group["initial_lr"] for group in groups}
    assert lr[True] == pytest.approx(0.1 * lr[False]) and lr[False] == pytest.approx(1e-2)
    assert sum(len(group["params"]) for group in groups) == len(list(trainer.model.parameters()))
    assert "new parameters train at 0.1× the learning rate" in capsys.readouterr().err


def test_held_new_parameters_stay_put_for_exactly_the_freeze_steps(tmp_path, data, tiny_tokenizer):
    from transformers import TrainerCallback

    trainer = warm_started_trainer(tmp_path, data, tiny_tokenizer, new_parameters_freeze_steps=2)
    new = set(trainer.model.warm_start_new_parameters)
    snapshots = [{name: p.detach().clone() for name, p in trainer.model.named_parameters()}]

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            snapshots.append({name: p.detach().clone() for name, p in model.named_parameters()})

    trainer.add_callback(Snapshot())
    trainer.train()
    assert len(snapshots) == 5

    def moved(step: int, names: set[str]) -> bool:
        return any(not torch.equal(snapshots[step][name], snapshots[step - 1][name]) for name in names)

    backbone = set(snapshots[0]) - new
    assert moved(1, backbone) and moved(2, backbone)  # the trained weights adapt during the hold ...
    assert not moved(1, new) and not moved(2, new)  # ... while the new ones are held exactly
    assert moved(3, new) and moved(4, new)  # then they train


@pytest.mark.parametrize("argv, words", [
    (["--warm_start_new_lr_scale", "0.1"], "give --warm_start_from too"),
    (["--warm_start_freeze_steps", "5"], "give --warm_start_from too"),
    (["--warm_start_from", "{tiny}", "--warm_start_new_lr_scale", "0"], "`--warm_start_new_lr_scale` = 0.0 is not"),
    (["--warm_start_from", "{tiny}", "--warm_start_new_lr_scale", "nan"], "`--warm_start_new_lr_scale` = nan is not"),
    (["--warm_start_from", "{tiny}", "--warm_start_freeze_steps", "-1"], "`--warm_start_freeze_steps` = -1 is not"),
])
def test_bad_new_parameter_options_get_one_line_and_exit_2(argv, words, tiny_folder, tmp_path, capsys):
    from hf_deepnmt_training.cli import main

    argv = [part.replace("{tiny}", str(tiny_folder)) for part in argv]
    assert main(["train", "--recipe", "miniature", "--output_dir", str(tmp_path / "run"), *argv]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and words in error[0], error


# ------------------------------------------------------------------------------------------------ around it
@pytest.mark.integration
def test_save_load_and_remote_code_in_a_fresh_process(tmp_path, tiny_tokenizer, batch):
    model = dou_model("all", vocab_size=len(tiny_tokenizer), diversity_weight=1.0)
    model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    assert (tmp_path / "aggregation.py").exists()
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits, rtol=0, atol=0)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["hf_deepnmt"] = None  # not importable: only the folder's own code may be used
        from transformers import pipeline
        translate = pipeline("translation", model={str(tmp_path)!r}, trust_remote_code=True)
        print(type(translate.model).__module__, translate("In the beginning.", max_new_tokens=5))
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "transformers_modules" in result.stdout and "translation_text" in result.stdout


def test_marian_export_and_admin_folding_refuse_deep_representations():
    with pytest.raises(ValueError, match=r"decoder_layer_aggregation='hierarchical' \(dou2018 layer aggregation\)"):
        export_marian(dou_model("hierarchical"))
    with pytest.raises(ValueError, match=r"multi_layer_attention_k=2 \(dou2018 multi-layer attention\)"):
        export_marian(dou_model("mla2"))
    with pytest.raises(ValueError, match="fold_admin: this model uses dou2018"):
        fold_admin(dou_model("hierarchical", residual_scaling="admin", admin_init="closed_form"))


@pytest.mark.parametrize("export_format", ["marian", "ctranslate2"])
def test_an_export_names_each_dou2018_blocker_once(export_format):
    """Aggregation of both stacks and multi-layer attention: three blockers, each named once, in the export's refusal
    and in `export_marian`'s (issue 39: two overlapping lists named them twice)."""
    from hf_deepnmt.export import export_blockers, export_model

    model = dou_model("hierarchical", multi_layer_attention_k=2)
    settings = ["encoder_layer_aggregation='hierarchical'", "decoder_layer_aggregation='hierarchical'",
                "multi_layer_attention_k=2"]
    blockers = export_blockers(model.config, export_format)
    assert len(blockers) == 3 and all(setting in blocker for setting, blocker in zip(settings, blockers))
    with pytest.raises(ValueError) as refusal:
        export_model(model, None, "unused", export_format)
    messages = [str(refusal.value)]
    if export_format == "marian":
        with pytest.raises(ValueError) as error:
            export_marian(model)
        messages.append(str(error.value))
    for message in messages:
        assert all(message.count(setting) == 1 for setting in settings), message
        assert message.count("layer aggregation") == 2 and message.count("multi-layer attention") == 1, message


def test_admin_cad_crt_hierarchical_and_diversity_train_together(tmp_path, data, tiny_tokenizer):
    trainer = make_trainer(tmp_path, data, tiny_tokenizer, max_steps=3, dropout=0.1, model_overrides=dict(
        encoder_layers=3, decoder_layers=4, residual_scaling="admin", cross_attention_drop_depth=2,
        cross_attention_drop_ratio=0.5, ddr_weight=1.0, ald_weight=1.0, encoder_layer_aggregation="hierarchical",
        decoder_layer_aggregation="hierarchical", diversity_weight=1.0))
    trainer.train()
    profile = trainer.admin_omegas
    assert len(profile["encoder"]) == 2 * 3 and len(profile["decoder"]) == 3 * 4  # every sub-layer profiled
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 3
    for entry in logs:
        assert {"nll", "ddr", "ald", "div_encoder", "div_decoder"} <= set(entry)
        assert all(torch.isfinite(torch.tensor(entry[key])) for key in ("loss", "ddr", "ald", "div_encoder"))


def test_gradient_reaches_every_new_parameter(batch):
    model = dou_model("all", dropout=0.0, diversity_weight=1.0).train()
    compute_losses(model, batch).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, missing
    assert F.relu is not None  # aggregation_activation="relu" is used by the "all" mechanism


def test_dense_under_post_ln_grows_geometrically_and_says_so(caplog):
    """dou2018 Eq. (4) read literally: H^l = LN(...) + Σ_{i<l} H^i; with post-LN outputs of RMS 1 the sum doubles per
    layer. Kept literal (docs/dou2018.md), measured here, and warned about at config time."""
    import logging

    from transformers.utils import logging as hf_logging

    hf_logging.warning_once.cache_clear()  # another test may have built the same config (warned once per process)
    with caplog.at_level(logging.WARNING):
        model = tiny_model(encoder_layers=6, encoder_layer_aggregation="dense")
    assert any("encoder_layer_aggregation='dense' with layer_norm_position='post'" in r.getMessage()
               and "≈32× at layer 6" in r.getMessage() for r in caplog.records), caplog.text
    ids = torch.randint(4, 90, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        states = model.model.encoder(input_ids=ids, output_hidden_states=True).hidden_states[1:]  # H^1..H^6
    rms = [float(h.pow(2).mean().sqrt()) for h in states]
    assert rms[0] == pytest.approx(1.0, rel=0.05)
    assert all(1.7 < b / a < 2.1 for a, b in zip(rms[1:], rms[2:])), rms  # ×≈2 per layer from H^2 on
    assert rms[-1] > 20 * rms[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        tiny_model(encoder_layers=6, encoder_layer_aggregation="dense", layer_norm_position="pre")
    assert not any("layer_aggregation='dense'" in r.getMessage() for r in caplog.records)
