"""CTranslate2 export (hf_deepnmt.export_ctranslate2): every standard Transformer variant gives `generate`'s
beam-4 output and its scores; int8 / bfloat16 store quantized weights; our loader is registered in CTranslate2's
own loader registry, so its stock `TransformersConverter` writes a saved folder exactly as `deepnmt export` does.

ctranslate2 is in the `export` extra: without it these tests skip, unless DEEPNMT_REQUIRE_EXPORT=1 (set by
`bash run.sh test`, i.e. CI), where a missing extra fails.
"""

from __future__ import annotations

import filecmp
import importlib
import json
import os

import numpy as np
import pytest
import torch
import export_cases
from conftest import tiny_model
from export_cases import (
    NEW_TOKENS,
    VARIANTS,
    _TRAINED,
    source_batch,
    teacher_forced_log_probs,
    trained_variant,
    variant_model,
)

from search_parity import assert_same_search, generate_search

from hf_deepnmt.errors import UserInputError
from hf_deepnmt.export import export_model
from hf_deepnmt.export_ctranslate2 import CT2_CONFIG_NAMES, CTranslate2Engine, ctranslate2_loader

if os.environ.get("DEEPNMT_REQUIRE_EXPORT") == "1":
    importlib.import_module("ctranslate2")  # CI: a missing extra fails
else:
    pytest.importorskip("ctranslate2")

sources = export_cases.sources  # the shared fixture


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ctranslate2_export_gives_generates_beams_and_scores(variant, tiny_tokenizer, sources, tmp_path):
    """Random weights (every hypothesis runs to the limit) and trained weights (hypotheses end early): CTranslate2's
    beam-4 and greedy outputs are `generate`'s with the model's own search settings — ``early_stopping=True``, the
    package's default, CTranslate2's only rule — on every sentence whose search is decided by more than float32 noise
    (tests/search_parity.py); an explicit ``early_stopping=False``, which CTranslate2 cannot do, is refused. The
    teacher-forced scores of CTranslate2's outputs agree in every case."""
    for model in (variant_model(variant, len(tiny_tokenizer)), trained_variant(variant, tiny_tokenizer)):
        assert model.generation_config.early_stopping is True
        export_model(model, tiny_tokenizer, tmp_path, "ctranslate2")
        engine = CTranslate2Engine(tmp_path, intra_threads=1)
        batch = source_batch(sources, model.config.pad_token_id)
        for num_beams in (4, 1):
            got = engine.generate(sources, num_beams=num_beams, max_new_tokens=NEW_TOKENS)
            reference = generate_search(model, batch, num_beams=num_beams, max_new_tokens=NEW_TOKENS, do_sample=False)
            assert_same_search(reference, [tuple(ids) for ids in got], what=f"{variant} beam {num_beams}")
        if model is _TRAINED.get(variant):
            assert sum(ids[-1] == model.config.eos_token_id for ids in got) >= 2  # </s> ends some: the rule matters
            with pytest.raises(ValueError, match="`early_stopping` = False is not available with the ctranslate2"):
                engine.generate(sources, num_beams=4, max_new_tokens=NEW_TOKENS, early_stopping=False)
        # the scores CTranslate2 exposes: per-token log-probabilities under teacher forcing, vs our log-softmax
        for source, target, scores in zip(sources, got, engine.score(sources, got)):
            np.testing.assert_allclose(scores, teacher_forced_log_probs(model, source, target), atol=1e-4, rtol=0)


def test_ctranslate2_warns_that_an_early_stopping_false_model_can_differ(tiny_tokenizer, tmp_path, caplog):
    """A folder saved before early_stopping=True became the default: CTranslate2 runs its own rule, with a warning."""
    model = variant_model("post_ln", len(tiny_tokenizer))
    model.generation_config.early_stopping = False
    export_model(model, tiny_tokenizer, tmp_path, "ctranslate2")
    with caplog.at_level("WARNING"):
        CTranslate2Engine(tmp_path, intra_threads=1)
    assert "early_stopping=False, which CTranslate2 cannot do" in caplog.text


def test_ctranslate2_int8_and_bfloat16_store_quantized_weights_and_leave_the_model_alone(tiny_tokenizer, sources, tmp_path):
    model = variant_model("cad_p1_post_ln", len(tiny_tokenizer))
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    sizes = {}
    for quantization in (None, "int8", "bfloat16"):
        folder = tmp_path / str(quantization)
        export_model(model, tiny_tokenizer, folder, "ctranslate2", quantization)
        sizes[quantization] = (folder / "model.bin").stat().st_size
        manifest = json.loads((folder / "deepnmt_export.json").read_text())
        assert manifest["quantization"] == (quantization or "float32")
        outputs = CTranslate2Engine(folder, intra_threads=1).generate(sources, num_beams=4, max_new_tokens=8)
        assert all(len(ids) > 0 and max(ids) < len(tiny_tokenizer) for ids in outputs)
    assert sizes["int8"] < sizes["bfloat16"] < sizes[None]
    for name, tensor in model.state_dict().items():  # CTranslate2 quantizes its arrays in place: copies, not ours
        assert torch.equal(tensor, weights[name]), name


def test_our_loader_is_what_ctranslate2s_loader_registry_holds_for_our_config_classes():
    from ctranslate2.converters import transformers as ct2_transformers

    loader = ctranslate2_loader()
    assert isinstance(loader, ct2_transformers.BartLoader)  # BART's structure, as its MarianMTLoader
    assert set(CT2_CONFIG_NAMES) == {"DeepTransformerConfig", "AdminTransformerConfig",
                                     "DeepDecoderTransformerConfig", "DeepRepresentationTransformerConfig"}
    for name in CT2_CONFIG_NAMES:
        assert type(ct2_transformers._MODEL_LOADERS[name]) is type(loader), name
    assert "DTMTConfig" not in ct2_transformers._MODEL_LOADERS  # a recurrent model: no CTranslate2 spec


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ctranslate2s_stock_converter_writes_a_saved_folder_as_our_export(variant, tiny_tokenizer, tmp_path):
    """`TransformersConverter(folder, trust_remote_code=True)` finds our registered loader by the config's class
    name (ADMIN arrives unfolded and is folded by the loader): the same bytes as `export_model`."""
    from ctranslate2.converters import TransformersConverter

    model = variant_model(variant, len(tiny_tokenizer))
    model.save_pretrained(tmp_path / "saved")
    tiny_tokenizer.save_pretrained(tmp_path / "saved")
    ctranslate2_loader()
    TransformersConverter(str(tmp_path / "saved"), trust_remote_code=True).convert(str(tmp_path / "stock"))
    export_model(model, tiny_tokenizer, tmp_path / "ours", "ctranslate2")
    for name in ("model.bin", "config.json", "shared_vocabulary.json"):
        assert filecmp.cmp(tmp_path / "stock" / name, tmp_path / "ours" / name, shallow=False), name


def test_ctranslate2s_stock_converter_refuses_what_ctranslate2_cannot_express(tiny_tokenizer, tmp_path):
    from ctranslate2.converters import TransformersConverter

    tiny_model(vocab_size=len(tiny_tokenizer), encoder_layer_aggregation="dense").save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    ctranslate2_loader()
    with pytest.raises(UserInputError, match="cannot export to ctranslate2: the model uses dou2018 encoder layer"):
        TransformersConverter(str(tmp_path), trust_remote_code=True).convert(str(tmp_path / "ct2"))
