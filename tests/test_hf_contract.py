"""The Hugging Face contract (DESIGN.md) of every registered model family, once: save/load, Auto classes and the
code a saved folder carries, config validation, generation (cached = uncached), padding invariance, gradients and
gradient checkpointing, the length guard, and a saved folder used where hf_deepnmt cannot be imported.

Parametrized from the registry (`hf_deepnmt.registry.MODEL_TYPES`): each family's cases are `FAMILIES[family]`, and a
family registered without them fails `test_every_registered_family_has_its_contract_cases`. What is particular to one
family stays in its own file (tests/test_model_contract.py, tests/test_dtmt.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch
from conftest import TINY, TINY_DTMT, dtmt_config, dtmt_model, tiny_config, tiny_model
from test_pipeline_and_remote_code import FRESH_PROCESS, SENTENCES, _direct
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
from transformers.cache_utils import EncoderDecoderCache

from hf_deepnmt import DTMTCache, TranslationPipeline
from hf_deepnmt.modeling_common import CACHE_NAME, output_cache
from hf_deepnmt.registry import DTMT, MODEL_TYPES, TRANSFORMER, model_type_names


@dataclass(frozen=True)
class FamilyCases:
    """What the contract tests need to know about one family."""

    tiny: dict[str, Any]
    """The tiny config (d_model 16, vocab 99)."""
    config: Callable[..., Any]
    model: Callable[..., torch.nn.Module]
    """``model(seed=0, **switches)``: the tiny model in eval mode."""
    grid: list[dict[str, Any]]
    """Switch sets every contract test runs on (the expensive ones on the first two)."""
    cache_class: type
    saved_code: tuple[str, ...]
    """Code files ``save_pretrained`` puts next to the weights (at least these)."""
    dropouts: dict[str, float]
    """Every dropout of the family, switched on (the checkpointing test)."""
    bad_values: list[tuple[str, Any]] = field(default_factory=list)
    mutation: tuple[str, Any] = ("", None)
    """A field set to a bad value after construction, which the model must refuse."""
    peaked: dict[str, Any] = field(default_factory=dict)
    """Overrides of a model whose greedy choices are far apart (a wide init)."""


FAMILIES: dict[str, FamilyCases] = {
    TRANSFORMER: FamilyCases(
        tiny=TINY, config=tiny_config, model=tiny_model,
        grid=[
            dict(layer_norm_position="post", tie_word_embeddings=True),
            dict(layer_norm_position="pre", tie_word_embeddings=True),
            dict(layer_norm_position="post", tie_word_embeddings=False),
            dict(layer_norm_position="pre", tie_word_embeddings=False, scale_embedding=False,
                 activation_function="gelu"),
        ],
        cache_class=EncoderDecoderCache,
        saved_code=("configuration_deep_transformer.py", "modeling_deep_transformer.py", "pipeline_translation.py"),
        dropouts=dict(dropout=0.2),
        bad_values=[
            ("vocab_size", 0), ("vocab_size", 12.5), ("d_model", 15), ("d_model", -8), ("encoder_layers", 0),
            ("decoder_layers", True), ("encoder_attention_heads", 3), ("decoder_attention_heads", 0),
            ("encoder_ffn_dim", "2048"), ("activation_function", "rleu"), ("dropout", 1.0),
            ("attention_dropout", -0.1), ("activation_dropout", "0.1"), ("max_position_embeddings", 0),
            ("scale_embedding", "yes"), ("layer_norm_position", "sandwich"), ("layer_norm_eps", 0.0),
            ("tie_word_embeddings", 1), ("init_std", -0.02), ("pad_token_id", 99), ("eos_token_id", -1),
            ("unk_token_id", 0), ("decoder_start_token_id", 99), ("bos_token_id", "1"), ("is_encoder_decoder", False),
            ("position_encoding", "rotary"), ("position_offset", -2), ("output_bias", 1),
            ("decoder_vocab_size", 50), ("share_encoder_decoder_embeddings", "no"), ("residual_scaling", "admn"), ("admin_init", "lazy"), ("admin_omega_trainable", "yes"),
        ],
        mutation=("decoder_attention_heads", 3),
        peaked=dict(init_std=0.5),
    ),
    DTMT: FamilyCases(
        tiny=TINY_DTMT, config=dtmt_config, model=dtmt_model,
        grid=[
            dict(),
            dict(rnn_cell="gru", transition_depth=0),  # ShallowRNMT
            dict(share_encoder_decoder_embeddings=True, tie_word_embeddings=True, positional_encoding=False),
            dict(tie_word_embeddings=True, encoder_transition=False, query_transition=False),
        ],
        cache_class=DTMTCache,
        saved_code=("configuration_dtmt.py", "modeling_dtmt.py", "cache_dtmt.py", "pipeline_translation.py"),
        dropouts=dict(dropout=0.2, rnn_dropout=0.2, readout_dropout=0.2),
        bad_values=[
            ("vocab_size", 0), ("d_model", 15), ("d_model", 12.0), ("transition_depth", -1), ("transition_depth", 1.5),
            ("attention_heads", 3), ("rnn_cell", "lstm"), ("encoder_transition", "yes"), ("query_transition", 1),
            ("decoder_transition", None), ("positional_encoding", "on"), ("dropout", 1.0), ("rnn_dropout", -0.1),
            ("readout_dropout", "0.5"), ("init_range", 0.0), ("layer_norm_eps", 0.0), ("max_position_embeddings", 0),
            ("share_encoder_decoder_embeddings", 0), ("pad_token_id", 99), ("eos_token_id", 0),
            ("decoder_start_token_id", 0), ("is_encoder_decoder", False),
        ],
        mutation=("rnn_cell", "lstm"),
        peaked=dict(attention_heads=2, transition_depth=4, init_range=0.5),
    ),
}
REGISTERED_FAMILIES: list[str] = list(dict.fromkeys(entry.family for entry in MODEL_TYPES.values()))


def base_entry(family: str):
    """The family's own model type (its first registered one; the others are its paper-named presets)."""
    return MODEL_TYPES[model_type_names(family)[0]]


def grid_cases(count: int | None = None) -> list:
    """(family, switches) for every registered family and the first ``count`` switch sets of its grid."""
    return [pytest.param(family, switches, id=f"{family}-{number}")
            for family in REGISTERED_FAMILIES
            for number, switches in enumerate(FAMILIES[family].grid[:count])]


def bad_value_cases() -> list:
    return [pytest.param(family, name, value, id=f"{family}-{name}={value!r}")
            for family in REGISTERED_FAMILIES for name, value in FAMILIES[family].bad_values]


def _generate(model, batch, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # generate() must not warn
        return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs)


def test_every_registered_family_has_its_contract_cases():
    assert set(FAMILIES) == set(REGISTERED_FAMILIES)
    for family in REGISTERED_FAMILIES:
        assert isinstance(FAMILIES[family].config(), base_entry(family).config_class)


# ------------------------------------------------------------------------------------------------ save / load / Auto
@pytest.mark.parametrize("family, switches", grid_cases())
def test_save_load_gives_identical_logits(tmp_path, batch, family, switches):
    model = FAMILIES[family].model(**switches)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    reloaded = base_entry(family).seq2seq_class.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = model(**batch).logits
        got = reloaded(**batch).logits
    assert torch.equal(expected, got)
    assert reloaded.config.to_diff_dict() == model.config.to_diff_dict()
    encoder, decoder = reloaded.model.encoder.embed_tokens, reloaded.model.decoder.embed_tokens
    # one source/target embedding unless a family keeps them apart (DTMT's share_encoder_decoder_embeddings)
    assert (encoder is decoder) == getattr(model.config, "share_encoder_decoder_embeddings", True)
    tied = reloaded.lm_head.weight.data_ptr() == decoder.weight.data_ptr()
    assert tied == model.config.tie_word_embeddings


@pytest.mark.parametrize("family", REGISTERED_FAMILIES)
def test_auto_classes_resolve_after_import_and_saved_folders_carry_the_code(tmp_path, family):
    entry, cases = base_entry(family), FAMILIES[family]
    config = AutoConfig.for_model(entry.model_type, **cases.tiny)
    assert isinstance(config, entry.config_class)
    assert isinstance(AutoModel.from_config(config), entry.base_model_class)
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert isinstance(model, entry.seq2seq_class)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    configuration, modeling = cases.saved_code[0][:-3], cases.saved_code[1][:-3]
    assert saved["auto_map"] == {
        "AutoConfig": f"{configuration}.{entry.config_class.__name__}",
        "AutoModel": f"{modeling}.{entry.base_model_class.__name__}",
        "AutoModelForSeq2SeqLM": f"{modeling}.{entry.seq2seq_class.__name__}",
    }
    assert saved["custom_pipelines"]["translation"]["impl"] == "pipeline_translation.TranslationPipeline"
    for name in cases.saved_code:
        assert (tmp_path / name).exists(), name
    assert isinstance(AutoConfig.from_pretrained(tmp_path), entry.config_class)
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(tmp_path), entry.seq2seq_class)
    base = AutoModel.from_pretrained(tmp_path)  # the base model out of a seq2seq checkpoint
    assert isinstance(base, entry.base_model_class)
    assert torch.equal(base.get_input_embeddings().weight, model.get_input_embeddings().weight)


# ------------------------------------------------------------------------------------------------ config validation
@pytest.mark.parametrize("family, name, value", bad_value_cases())
def test_bad_config_value_raises_one_sentence_naming_the_field(family, name, value):
    with pytest.raises(ValueError) as info:
        FAMILIES[family].config(**{name: value})
    message = str(info.value)
    assert f"`{name}`" in message and repr(value) in message, message
    assert "\n" not in message and message.count(". ") == 0 and message.endswith("."), message


@pytest.mark.parametrize("family", REGISTERED_FAMILIES)
def test_config_mutated_after_construction_is_rejected_by_the_model(family):
    cases = FAMILIES[family]
    config = cases.config()
    name, value = cases.mutation
    setattr(config, name, value)
    with pytest.raises(ValueError, match=name):
        base_entry(family).seq2seq_class(config)


# ------------------------------------------------------------------------------------------------ generation
@pytest.mark.parametrize("family, switches", grid_cases())
def test_greedy_cached_equals_uncached(batch, family, switches):
    model = FAMILIES[family].model(**switches)
    cached = _generate(model, batch, num_beams=1, do_sample=False, max_new_tokens=12)
    uncached = _generate(model, batch, num_beams=1, do_sample=False, max_new_tokens=12, use_cache=False)
    assert cached.shape[1] > 2
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("family, switches", grid_cases(2))
def test_beam_search_cached_equals_uncached(batch, family, switches):
    model = FAMILIES[family].model(**switches)
    kwargs = dict(num_beams=4, num_return_sequences=3, length_penalty=0.6, early_stopping=True, max_new_tokens=10)
    cached = _generate(model, batch, return_dict_in_generate=True, output_scores=True, **kwargs)
    uncached = _generate(model, batch, use_cache=False, return_dict_in_generate=True, output_scores=True, **kwargs)
    assert cached.sequences.shape[0] == 2 * 3
    assert torch.equal(cached.sequences, uncached.sequences)
    assert torch.allclose(cached.sequences_scores, uncached.sequences_scores, atol=1e-5)
    scores = cached.sequences_scores.view(2, 3)
    assert torch.all(scores[:, :-1] >= scores[:, 1:] - 1e-6)  # n-best lists sorted by score
    assert isinstance(output_cache(cached), FAMILIES[family].cache_class)


@pytest.mark.parametrize("family", REGISTERED_FAMILIES)
def test_sampling_cached_equals_uncached(batch, family):
    model = FAMILIES[family].model()
    torch.manual_seed(123)
    cached = _generate(model, batch, do_sample=True, num_beams=1, top_k=20, temperature=0.9, max_new_tokens=10)
    torch.manual_seed(123)
    uncached = _generate(model, batch, do_sample=True, num_beams=1, top_k=20, temperature=0.9, max_new_tokens=10,
                         use_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("family", REGISTERED_FAMILIES)
def test_generation_continues_from_a_returned_cache(batch, family):
    """transformers' `test_generate_continue_from_past_key_values`, greedy: 4 new tokens, then 3 more from the
    returned cache with the full ``decoder_input_ids``, give the 7 tokens and scores of one call. Without
    `TranslationGenerationMixin.prepare_inputs_for_generation` the cached tokens were consumed twice (scores off by
    ~0.4 for both families)."""
    model = FAMILIES[family].model(**FAMILIES[family].peaked)
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    settings = dict(do_sample=False, num_beams=1, eos_token_id=None, return_dict_in_generate=True, output_scores=True)
    whole = _generate(model, inputs, max_new_tokens=7, **settings)
    first = _generate(model, inputs, max_new_tokens=4, **settings)
    cache = output_cache(first)
    assert cache.get_seq_length() == 4  # the start token and 3 generated ones; the 4th is not consumed yet
    rest = _generate(model, inputs, decoder_input_ids=first.sequences, max_new_tokens=3,
                     **{CACHE_NAME: cache}, **settings)
    assert rest.sequences.shape[1] == whole.sequences.shape[1] == 8
    assert torch.equal(rest.sequences, whole.sequences)
    torch.testing.assert_close(torch.stack(first.scores + rest.scores), torch.stack(whole.scores), atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------ numerics
@pytest.mark.parametrize("family, switches", grid_cases(2))
def test_padding_invariance_of_logits_and_decoding(family, switches):
    """A sentence alone gives the same logits (source and target padding) and the same beam-search output as inside
    a padded batch."""
    model = FAMILIES[family].model(**switches)
    source, target = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[8, 9, 2]])
    longer_source = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 2]])
    longer_target = torch.tensor([[17, 18, 19, 20, 21, 2]])
    input_ids = torch.cat([torch.cat([source, torch.zeros(1, 4, dtype=torch.long)], 1), longer_source])
    attention_mask = (input_ids != 0).long()
    labels = torch.cat([torch.cat([target, torch.full((1, 3), -100)], 1), longer_target])
    with torch.no_grad():
        alone = model(input_ids=source, labels=target).logits
        padded = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    assert torch.allclose(padded[0, :3], alone[0], atol=1e-5)
    kwargs = dict(num_beams=4, max_new_tokens=8, length_penalty=0.6)
    one = _generate(model, {"input_ids": source, "attention_mask": torch.ones_like(source)}, **kwargs)
    both = _generate(model, {"input_ids": input_ids, "attention_mask": attention_mask}, **kwargs)
    assert torch.equal(both[0, :one.shape[1]], one[0])


@pytest.mark.parametrize("family", REGISTERED_FAMILIES)
def test_too_long_input_is_a_clear_error(family):
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        FAMILIES[family].model()(input_ids=torch.full((1, 70), 5), decoder_input_ids=torch.tensor([[1]]))


# ------------------------------------------------------------------------------------------------ training
@pytest.mark.parametrize("family, switches", grid_cases())
def test_gradient_reaches_every_parameter(batch, family, switches):
    model = FAMILIES[family].model(**switches).train()
    model(**batch).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing


@pytest.mark.parametrize("family", REGISTERED_FAMILIES)
def test_gradient_checkpointing_gives_the_same_gradients(batch, family):
    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        model = FAMILIES[family].model(**FAMILIES[family].dropouts).train()
        if checkpointing:
            # transformers >= 5.2x renamed it; 5.17 only has the old name
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
            assert model.model.encoder.gradient_checkpointing and model.model.decoder.gradient_checkpointing
        torch.manual_seed(7)
        model(**batch).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters()}

    plain, checkpointed = grads(False), grads(True)
    for name, grad in plain.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name


# ------------------------------------------------------------------------------------------------ remote code
@pytest.fixture
def saved_folder(request, tmp_path_factory, tiny_tokenizer):
    """A saved tiny model of ``family`` with its tokenizer (the Transformer's: conftest's ``tiny_folder``)."""
    family = request.param
    if family == TRANSFORMER:
        return family, request.getfixturevalue("tiny_folder")
    folder = tmp_path_factory.mktemp(f"tiny_{family}")
    FAMILIES[family].model(vocab_size=len(tiny_tokenizer)).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return family, folder


@pytest.mark.integration
@pytest.mark.parametrize("saved_folder", REGISTERED_FAMILIES, indirect=True)
def test_saved_folder_loads_and_translates_where_hf_deepnmt_is_not_importable(saved_folder, tmp_path):
    family, folder = saved_folder
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    script = tmp_path / "fresh.py"
    script.write_text(FRESH_PROCESS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ""}
    result = subprocess.run(
        [sys.executable, "-I", str(script), str(folder), SENTENCES[0]],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["config_module"].startswith("transformers_modules.")
    assert report["model_module"].startswith("transformers_modules.")
    assert report["model_module"].endswith(FAMILIES[family].saved_code[1][:-3])
    assert report["pipeline_module"].startswith("transformers_modules.")
    assert report["tokenizer_class"] in ("TokenizersBackend", "PreTrainedTokenizerFast")  # no custom tokenizer code
    expected = _direct(model, tokenizer, SENTENCES[0], num_beams=3, max_new_tokens=8)
    assert report["generated"] == expected
    assert report["pipeline"] == [{"translation_text": expected}, {"translation_text": ""}]
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr


# ------------------------------------------------------------------------------------------------ pipeline
@pytest.mark.parametrize("saved_folder", REGISTERED_FAMILIES, indirect=True)
def test_in_process_pipeline_translates_like_generate(saved_folder):
    _, folder = saved_folder
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    translate = pipeline("translation", model=model, tokenizer=tokenizer)
    assert isinstance(translate, TranslationPipeline)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        single = translate(SENTENCES[0], num_beams=3, max_new_tokens=8)
    assert single == [{"translation_text": _direct(model, tokenizer, SENTENCES[0], num_beams=3, max_new_tokens=8)}]
    assert single[0]["translation_text"] != ""


@pytest.mark.parametrize("saved_folder", REGISTERED_FAMILIES, indirect=True)
def test_batched_input_equals_one_by_one(saved_folder):
    _, folder = saved_folder
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    translate = pipeline("translation", model=model, tokenizer=tokenizer, num_beams=2, max_new_tokens=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batched = translate(SENTENCES, batch_size=3)
    one_by_one = [translate(text)[0] for text in SENTENCES]
    assert batched == one_by_one
    assert all(isinstance(row["translation_text"], str) for row in batched)
    assert [r["translation_text"] for r in batched] == [
        _direct(model, tokenizer, text, num_beams=2, max_new_tokens=6) for text in SENTENCES
    ]
