"""What transformers' own generic tools expect of a model, for every family and mechanism (issue: user-facing defects
found by transformers' ModelTester/GenerationTester checks): gradient checkpointing in both modes, cross-attention
outputs a tool can index, the stateful-model refusal of assisted decoding, attention weights on the gradient path,
and `pipeline("translation")` without a model."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from hf_deepnmt import DTMTConfig, DTMTForConditionalGeneration
from hf_deepnmt.errors import UserInputError

from benchmarks.experiments.dou2018_miniature import DOU2018_VARIANTS  # dou2018 Table 1 rows

# Every mechanism whose layers are called differently (dou2018 passes the lower layers' outputs to a layer, li2022
# CAD draws per layer, ADMIN scales the residual) and the DTMT family.
MECHANISMS = {
    **{name: switches for name, switches in DOU2018_VARIANTS.items() if name != "hierarchical+div"},
    "cad": {"cross_attention_drop_depth": 2, "cross_attention_drop_ratio": 0.5},
    "admin": {"residual_scaling": "admin", "admin_init": "closed_form"},
    "dtmt": None,
}


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "dtmt":
        return DTMTForConditionalGeneration(DTMTConfig(vocab_size=99, d_model=16, attention_heads=2, transition_depth=2,
                                                       dropout=0.0, rnn_dropout=0.0, readout_dropout=0.0))
    return tiny_model(encoder_layers=4, decoder_layers=4, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                      **MECHANISMS[name])


def enable_checkpointing(model: torch.nn.Module, use_reentrant: bool) -> None:
    """transformers 5.2x names it `activation_checkpointing_enable` (the older name warns); 5.17 has only the old."""
    options = {"use_reentrant": use_reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def gradients(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model.train().zero_grad()
    torch.manual_seed(1)  # the same li2022 drop-net draws in every run
    model(**batch).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])
@pytest.mark.parametrize("name", list(MECHANISMS))
def test_gradient_checkpointing_gives_the_plain_gradients_in_both_modes(name, use_reentrant, batch):
    """Reentrant checkpointing tracks only tensors passed as positional arguments: dou2018's lower-layer outputs used
    to reach a layer inside a tuple, and backward crashed ("Trying to backward through the graph a second time")."""
    model = build(name)
    expected = gradients(model, batch)
    enable_checkpointing(model, use_reentrant)
    got = gradients(model, batch)
    assert got.keys() == expected.keys() and len(got) > 0
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=1e-5, rtol=1e-5, msg=key)  # summation order


def test_cad_layers_without_cross_attention_return_zero_weights_that_tools_can_index(batch):
    """A p_net = 1 layer has no cross-attention; its entry in `cross_attentions` is zeros of the usual shape, so the
    helper transformers' assisted decoding runs on every step's attentions (`_split_model_outputs`, which read
    ``None.shape`` before) and generate's returned attentions can be indexed layer by layer."""
    from transformers.generation.utils import _split_model_outputs

    model = tiny_model(decoder_layers=3, cross_attention_drop_depth=1, cross_attention_drop_ratio=1.0)
    assert model.model.decoder.layers[0].encoder_attn is None
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    out = model(**inputs, decoder_input_ids=torch.tensor([[1, 5, 6], [1, 7, 8]]), output_attentions=True)
    first, second = out.cross_attentions[0], out.cross_attentions[1]
    assert first.shape == second.shape == (2, 4, 3, 6)  # (B, H, T, S)
    assert torch.count_nonzero(first) == 0 and torch.allclose(second.sum(-1), torch.ones(2, 4, 3))
    steps = _split_model_outputs((), out.cross_attentions, cur_len=1, added_len=3)
    # the zero entry is split like an attended layer's (which dimension the helper splits is transformers' choice:
    # the step dimension before 5.25, dimension 1 since)
    assert len(steps) == 2 and all(len(step) == 3 and step[0].shape == step[1].shape == step[2].shape
                                   and step[0].shape[0] == 2 for step in steps)
    generated = model.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=4, output_attentions=True,
                               return_dict_in_generate=True)
    assert all(len(step) == 3 and step[0].shape[:2] == (2, 4) for step in generated.cross_attentions)


def test_dtmt_declares_itself_stateful_so_assisted_decoding_gets_transformers_refusal(batch):
    model = build("dtmt").eval()
    assert DTMTForConditionalGeneration._is_stateful
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    # transformers' refusal: "stateful" until 5.24; since 5.25 its assisted decoding first asks for the KV cache a
    # recurrent decoder does not have ("Assisted decoding requires a cache")
    refused = "stateful|requires a cache"
    with pytest.raises((ValueError, RuntimeError), match=refused):
        model.generate(**inputs, assistant_model=build("dtmt").eval(), num_beams=1, max_new_tokens=3)
    with pytest.raises((ValueError, RuntimeError), match=refused):
        model.generate(**inputs, prompt_lookup_num_tokens=2, num_beams=1, max_new_tokens=3)


@pytest.mark.parametrize("mode", ["eval", "train"])
def test_dtmt_attention_weights_are_on_the_gradient_path(mode, batch):
    """`output_attentions=True` + `retain_grad()` gives the gradient of the output with respect to the weights the
    decoder used (a recurrent decoder used to return a copy stacked after its loop: gradient None), and the model's
    own outputs and parameter gradients do not change (dropout included: the same masks in both passes)."""
    torch.manual_seed(0)
    model = DTMTForConditionalGeneration(DTMTConfig(vocab_size=99, d_model=16, attention_heads=2,
                                                    transition_depth=1))
    getattr(model, mode)()
    torch.manual_seed(3)
    plain = model(**batch)
    plain.loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    torch.manual_seed(3)
    out = model(**batch, output_attentions=True)
    weights = out.cross_attentions[0]
    assert weights.shape == (2, 2, 5, 6)
    weights.retain_grad()
    out.loss.backward()
    assert weights.grad is not None and weights.grad.abs().sum() > 0
    torch.testing.assert_close(out.logits, plain.logits)
    for name, grad in expected.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad, atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("task", ["translation", "translation_en_to_es"])
def test_translation_pipeline_without_a_model_asks_for_one(task):
    from transformers import pipeline

    with pytest.raises(UserInputError, match=r"needs a model.*pass model="):
        pipeline(task=task)
