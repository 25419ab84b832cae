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
    same_fraction,
    teacher_forced_log_probs,
    trained_variant,
    variant_model,
)

from hf_deepnmt.errors import UserInputError
from hf_deepnmt.export import TorchEngine, export_model
from hf_deepnmt.export_ctranslate2 import CT2_CONFIG_NAMES, CTranslate2Engine, ctranslate2_loader

if os.environ.get("DEEPNMT_REQUIRE_EXPORT") == "1":
    importlib.import_module("ctranslate2")  # CI: a missing extra fails
else:
    pytest.importorskip("ctranslate2")

sources = export_cases.sources  # the shared fixture


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_ctranslate2_export_gives_generates_beams_and_scores(variant, tiny_tokenizer, sources, tmp_path):
    """Random weights (every hypothesis runs to the limit): CTranslate2 = `generate` with its defaults. Trained
    weights (hypotheses end early): CTranslate2's beam search stops a sentence once K hypotheses finished, which is
    `generate(early_stopping=True)`, exactly; the default `early_stopping=False` may search on (measured on a real
    test set in benchmarks/RESULTS.md). Greedy search and the teacher-forced scores agree in every case."""
    for model in (variant_model(variant, len(tiny_tokenizer)), trained_variant(variant, tiny_tokenizer)):
        export_model(model, tiny_tokenizer, tmp_path, "ctranslate2")
        engine, reference = CTranslate2Engine(tmp_path, intra_threads=1), TorchEngine(model)
        got = engine.generate(sources, num_beams=4, max_new_tokens=NEW_TOKENS)
        if model is _TRAINED.get(variant):
            assert sum(ids[-1] == model.config.eos_token_id for ids in got) >= 2  # </s> ends some: the rule matters
            assert got == reference.generate(sources, num_beams=4, max_new_tokens=NEW_TOKENS, early_stopping=True)
            with pytest.raises(ValueError, match="`early_stopping` = False is not available with the ctranslate2"):
                engine.generate(sources, num_beams=4, max_new_tokens=NEW_TOKENS, early_stopping=False)
        else:
            assert same_fraction(reference.generate(sources, num_beams=4, max_new_tokens=NEW_TOKENS), got) >= 0.99
        greedy = reference.generate(sources, num_beams=1, max_new_tokens=NEW_TOKENS)
        assert engine.generate(sources, num_beams=1, max_new_tokens=NEW_TOKENS) == greedy
        # the scores CTranslate2 exposes: per-token log-probabilities under teacher forcing, vs our log-softmax
        for source, target, scores in zip(sources, got, engine.score(sources, got)):
            np.testing.assert_allclose(scores, teacher_forced_log_probs(model, source, target), atol=1e-4, rtol=0)


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
