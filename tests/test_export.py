"""ONNX export (hf_deepnmt.export_onnx, hf_deepnmt.ort_generation): every family and variant of the package runs
transformers' `generate` on ONNX Runtime with the model's own outputs — greedy, beam 4 and n-best sequences identical,
scores and teacher-forced log-probabilities within 1e-4; int8 quantizes every family; `deepnmt export` /
`translate --engine`; refusals name the mechanism.

onnxruntime is in the `export` extra: without it these tests skip, unless DEEPNMT_REQUIRE_EXPORT=1 (set by
`bash run.sh test`, i.e. CI), where a missing extra fails.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_model
import export_cases
from export_cases import VARIANTS, source_batch, train_until_lengths_vary, trained_variant
from search_parity import assert_decided_by_margins, assert_same_search, generate_search, trim


import hf_deepnmt
from hf_deepnmt.export import OnnxEngine, export_blockers, export_model, load_engine
from hf_deepnmt.export_formats import check_exportable
from hf_deepnmt.ort_generation import OnnxSeq2SeqLM
from hf_deepnmt_training.cli import main

if os.environ.get("DEEPNMT_REQUIRE_EXPORT") == "1":
    import onnxruntime  # noqa: F401
else:
    pytest.importorskip("onnxruntime")

NEW_TOKENS = 24  # long enough for the briefly trained models to end hypotheses at varied lengths
DOU2018_LAYERS = {"encoder_layers": 4, "decoder_layers": 4}  # multi-layer attention k=3 needs 4 layers
# Every family and variant: the standard Transformers of CTranslate2's list, dou2018 (each aggregation on both stacks,
# multi-layer attention k=2 and 3, and everything composed with pre-LN and li2022 CAD), meng2019 DTMT and its
# ShallowRNMT (GRU, no transition).
ONNX_VARIANTS: dict[str, dict] = {
    **VARIANTS,
    # dense under pre-LN: under post-LN the stream doubles per layer (docs/dou2018.md), the config warns, and 60 steps
    # leave the model running every hypothesis to the limit
    "dou2018_dense_pre_ln": {**DOU2018_LAYERS, "encoder_layer_aggregation": "dense", "decoder_layer_aggregation": "dense",
                             "layer_norm_position": "pre"},
    "dou2018_linear": {**DOU2018_LAYERS, "encoder_layer_aggregation": "linear", "decoder_layer_aggregation": "linear"},
    "dou2018_iterative": {**DOU2018_LAYERS, "encoder_layer_aggregation": "iterative",
                          "decoder_layer_aggregation": "iterative"},
    "dou2018_hierarchical": {**DOU2018_LAYERS, "encoder_layer_aggregation": "hierarchical",
                             "decoder_layer_aggregation": "hierarchical"},
    "dou2018_mla2": {**DOU2018_LAYERS, "multi_layer_attention_k": 2},
    "dou2018_mla3": {**DOU2018_LAYERS, "multi_layer_attention_k": 3},
    "dou2018_composed": {"encoder_layers": 3, "decoder_layers": 3, "encoder_layer_aggregation": "hierarchical",
                         "decoder_layer_aggregation": "iterative", "multi_layer_attention_k": 2,
                         "layer_norm_position": "pre", "cross_attention_drop_depth": 1,
                         "cross_attention_drop_ratio": 1.0},
    "dtmt": {"model_type": "dtmt", "transition_depth": 2, "dropout": 0.0, "rnn_dropout": 0.0, "readout_dropout": 0.0},
    "dtmt_shallow_gru": {"model_type": "dtmt", "rnn_cell": "gru", "transition_depth": 0, "dropout": 0.0,
                         "rnn_dropout": 0.0, "readout_dropout": 0.0},
}
# DTMT's random parity models: wider weights than the paper's ±0.08 and a bias toward </s> (see `trained_case`)
DTMT_INIT_RANGE = 0.5
DTMT_EOS_BIAS = 1.4
_TRAINED: dict[str, torch.nn.Module] = {}
sources = export_cases.sources  # the shared fixture


def case_model(name: str, vocab_size: int) -> torch.nn.Module:
    """A tiny random model of an ONNX variant (a DTMT one for ``model_type="dtmt"``); ADMIN gets random ω."""
    overrides = dict(ONNX_VARIANTS[name])
    if overrides.pop("model_type", None) == "dtmt":
        torch.manual_seed(3)
        config = hf_deepnmt.DTMTConfig(vocab_size=vocab_size, d_model=16, attention_heads=2,
                                       max_position_embeddings=64, init_range=DTMT_INIT_RANGE, **overrides)
        model = hf_deepnmt.DTMTForConditionalGeneration(config).eval()
        with torch.no_grad():
            model.lm_head.bias[config.eos_token_id] += DTMT_EOS_BIAS
        return model
    model = tiny_model(seed=3, vocab_size=vocab_size, init_std=0.5, **overrides)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("_omega"):
                parameter.copy_(torch.rand_like(parameter) + 0.5)
    return model


def trained_case(name: str, tokenizer) -> torch.nn.Module:
    """The model a parity test exports: the standard variants as the CTranslate2 tests train them
    (`export_cases.trained_variant`, shared), the other Transformers after the same `train_briefly`, so that
    hypotheses end at varied lengths. DTMT stays random: 60 steps on six sentences leave it at the unigram stage,
    where every hypothesis ends at once or never (measured); its random weights are drawn from ±``DTMT_INIT_RANGE``
    with ``DTMT_EOS_BIAS`` on </s>, so that hypotheses end at varied lengths and the search is decided by wide margins
    (at the paper's ±0.08 the tiny model's logits are nearly uniform and 12 to 15 of the 18 sentences change when the
    log-probabilities move by 1e-4: measured), while beams still swap at every step, which exercises the reordering
    of its state."""
    if name in VARIANTS:
        return trained_variant(name, tokenizer)
    if name not in _TRAINED:
        model = case_model(name, len(tokenizer))
        _TRAINED[name] = model if model.config.model_type == "dtmt" else \
            train_until_lengths_vary(lambda: case_model(name, len(tokenizer)), tokenizer)
    return _TRAINED[name]


def teacher_forced(model: torch.nn.Module, batch: dict[str, torch.Tensor], sequences: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of every token of ``sequences`` (generate's outputs, start token first) under teacher
    forcing, ``(N, T)``, 0 after a sentence's end; ``batch`` rows are repeated for n-best outputs."""
    repeats = sequences.size(0) // batch["input_ids"].size(0)
    inputs = {name: value.repeat_interleave(repeats, dim=0) for name, value in batch.items()}
    with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=sequences[:, :-1]).logits
    scores = logits.log_softmax(-1).gather(-1, sequences[:, 1:, None])[..., 0]  # (N, T)
    ended = (sequences[:, 1:] == model.config.eos_token_id).long().cumsum(-1) - (
        sequences[:, 1:] == model.config.eos_token_id).long()
    return scores.masked_fill(ended > 0, 0.0)


SEARCHES = {"greedy": {"num_beams": 1}, "beam4": {"num_beams": 4},
            "beam4_nbest2_early_stopping": {"num_beams": 4, "num_return_sequences": 2, "early_stopping": True}}


# ------------------------------------------------------------------------------------------------ ONNX parity
@pytest.mark.parametrize("variant", list(ONNX_VARIANTS))
def test_onnx_export_runs_generate_with_the_models_outputs(variant, tiny_tokenizer, sources, tmp_path):
    """Exported from the model's own modules and run by transformers' `generate` on ONNX Runtime: greedy, beam-4 and
    n-best outputs identical to the torch model's wherever its search is decided by more than float32 noise
    (tests/search_parity.py: a sentence may differ only where the torch search itself reaches ONNX's output when its
    log-probabilities move by ≤ 1e-4, and at most a quarter of the sentences are that close), beam scores of the
    identical sentences and the teacher-forced log-probabilities of both engines' outputs within 1e-4. The sources
    differ in length and number from the traced example (batch 2, length 5): the graphs' dimensions are symbolic."""
    model = trained_case(variant, tiny_tokenizer)
    export_model(model, tiny_tokenizer, tmp_path, "onnx")
    onnx = OnnxSeq2SeqLM.from_export(tmp_path, intra_threads=1)
    batch = source_batch(sources, model.config.pad_token_id)
    config = model.config
    ended = []
    for name, search in SEARCHES.items():
        settings = {**search, "max_new_tokens": NEW_TOKENS, "do_sample": False}
        detailed = {**batch, **settings, "output_scores": True, "return_dict_in_generate": True}
        with torch.no_grad():
            expected, got = model.generate(**detailed), onnx.generate(**detailed)
        n_best = search.get("num_return_sequences", 1)
        rows = [trim(output.sequences, config.eos_token_id, config.pad_token_id, config.decoder_start_token_id)
                for output in (expected, got)]
        tied = assert_same_search(generate_search(model, batch, **settings), rows[1], n_best, f"{variant} {name}",
                                  expected=rows[0])
        if search["num_beams"] > 1:
            same = torch.tensor([row // n_best not in tied for row in range(len(rows[0]))])
            torch.testing.assert_close(got.sequences_scores[same], expected.sequences_scores[same], atol=1e-4, rtol=0)
        for sequences in (expected.sequences, got.sequences):
            torch.testing.assert_close(teacher_forced(onnx, batch, sequences), teacher_forced(model, batch, sequences),
                                       atol=1e-4, rtol=0)
        ended += (expected.sequences[:, 1:] == config.eos_token_id).any(-1).tolist()
    assert 2 <= sum(ended) < len(ended)  # hypotheses end at varied lengths: the stopping rule decides


@pytest.mark.parametrize("variant", ["dou2018_composed", "dtmt"])
def test_onnx_int8_quantizes_every_family(variant, tiny_tokenizer, sources, tmp_path):
    """int8 (ONNX Runtime's dynamic quantization) replaces the float weight products of both graphs with integer
    ones — inside DTMT's encoder loop too — and shrinks them; the model still translates (the BLEU cost on trained
    models: benchmarks/RESULTS.md)."""
    import onnx

    model = trained_case(variant, tiny_tokenizer)
    sizes, integer_products, in_loops = {}, {}, {}
    for quantization in (None, "int8"):
        folder = tmp_path / str(quantization)
        export_model(model, tiny_tokenizer, folder, "onnx", quantization)
        assert json.loads((folder / "deepnmt_export.json").read_text())["quantization"] == (quantization or "float32")
        sizes[quantization] = sum((folder / f"{graph}.onnx").stat().st_size for graph in ("encoder", "decoder"))
        integer_products[quantization] = in_loops[quantization] = 0
        for graph in ("encoder", "decoder"):
            nodes = onnx.load(str(folder / f"{graph}.onnx")).graph.node
            loop_nodes = [inner for node in nodes for attribute in node.attribute
                          if attribute.type == onnx.AttributeProto.GRAPH for inner in attribute.g.node]
            integer_products[quantization] += sum(node.op_type == "MatMulInteger" for node in [*nodes, *loop_nodes])
            in_loops[quantization] += sum(node.op_type == "MatMulInteger" for node in loop_nodes)
        onnx_model = OnnxSeq2SeqLM.from_export(folder, intra_threads=1)
        batch = source_batch(sources, model.config.pad_token_id)
        with torch.no_grad():
            output = onnx_model.generate(**batch, num_beams=4, max_new_tokens=NEW_TOKENS)
        assert output.shape[0] == len(sources) and int(output.max()) < model.config.vocab_size
    assert integer_products[None] == 0 and integer_products["int8"] >= 4
    if variant == "dtmt":  # the encoder's recurrence (an ONNX Scan loop) is quantized too
        assert in_loops["int8"] >= 2
    assert sizes["int8"] < sizes[None]


# ------------------------------------------------------------------------------------------------ CLI end to end
def test_deepnmt_export_and_translate_with_every_engine(tiny_folder, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    """The engines' texts are compared exactly: the torch model's search on these lines is decided by margins wider
    than float32 noise (checked first, tests/search_parity.py), so no engine may differ."""
    from transformers import AutoModelForSeq2SeqLM

    text = "In the beginning God created the heavens.\n\nAnd God saw the light.\nThe earth was void.\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
    reference_model = AutoModelForSeq2SeqLM.from_pretrained(tiny_folder)
    lines = [line for line in text.splitlines() if line]
    assert_decided_by_margins(generate_search(reference_model, dict(tiny_tokenizer(lines, return_tensors="pt",
                                                                                 padding=True)),
                                              num_beams=4, max_new_tokens=12, do_sample=False), what="CLI lines")
    common = ["--input", str(tmp_path / "in.txt"), "--num_beams", "4", "--max_new_tokens", "12", "--threads", "1"]
    assert main(["translate", "--model", str(tiny_folder), "--output", str(tmp_path / "torch.txt"), *common]) == 0
    expected = (tmp_path / "torch.txt").read_text(encoding="utf-8")
    assert expected.count("\n") == 4 and expected.split("\n")[1] == ""
    for engine in ("ctranslate2", "onnx"):
        folder = tmp_path / engine
        assert main(["export", str(tiny_folder), str(folder), "--format", engine]) == 0
        assert (folder / "tokenizer.json").is_file() and (folder / "deepnmt_export.json").is_file()
        out = tmp_path / f"{engine}.txt"
        assert main(["translate", "--model", str(folder), "--engine", engine, "--output", str(out), *common]) == 0
        assert out.read_text(encoding="utf-8") == expected, engine
        # streaming: batches of 2 lines from stdin, each written as soon as it is translated
        monkeypatch.setattr(sys, "stdin", io.StringIO(text))
        capsys.readouterr()
        assert main(["translate", "--model", str(folder), "--engine", engine, "--stream", "--batch_size", "2",
                     *common[2:]]) == 0
        assert capsys.readouterr().out == expected, engine
    # ONNX Runtime's logits against the model's (the exported graphs, run through OnnxSeq2SeqLM.forward)
    model = reference_model
    engine = load_engine(tmp_path / "onnx", "onnx", intra_threads=1)
    assert isinstance(engine, OnnxEngine)
    source = torch.tensor(tiny_tokenizer(["And God saw the light."])["input_ids"])
    tokens = torch.tensor([[1, 20, 30, 40]])
    with torch.no_grad():
        logits = model(input_ids=source, decoder_input_ids=tokens).logits
        torch.testing.assert_close(engine.model(input_ids=source, decoder_input_ids=tokens).logits, logits,
                                   atol=1e-4, rtol=0)
    # marian: a stock MarianMTModel folder that the torch engine runs to the same output
    assert main(["export", str(tiny_folder), str(tmp_path / "marian"), "--format", "marian"]) == 0
    assert json.loads((tmp_path / "marian" / "config.json").read_text())["model_type"] == "marian"
    out = tmp_path / "marian.txt"
    assert main(["translate", "--model", str(tmp_path / "marian"), "--output", str(out), *common]) == 0
    assert out.read_text(encoding="utf-8") == expected


def test_evaluate_scores_an_export_with_the_engine_that_runs_it(tiny_folder, tmp_path, capsys):
    """Issue 66 item 3: `deepnmt evaluate` on a CTranslate2 or ONNX export folder scores it with its own engine (it
    failed with transformers' tracebacks: "Unrecognized model" and "no model.safetensors"), translating exactly as
    `deepnmt translate` with that engine does; source reliance, which needs the torch model, is said to be left out.
    ``--engine onnx`` scores a model folder's onnx/ export; an engine the folder lacks is one sentence."""
    from conftest import PARALLEL

    test = tmp_path / "test.jsonl"
    test.write_text("".join(json.dumps({"translation": {"en": en, "es": es}}) + "\n" for en, es in PARALLEL),
                    encoding="utf-8")
    (tmp_path / "in.txt").write_text("".join(en + "\n" for en, _ in PARALLEL), encoding="utf-8")
    common = ["--test_file", str(test), "--source_lang", "en", "--target_lang", "es", "--num_beams", "2",
              "--threads", "1"]
    for engine in ("ctranslate2", "onnx"):
        folder = tmp_path / engine
        assert main(["export", str(tiny_folder), str(folder), "--format", engine]) == 0
        capsys.readouterr()
        scores, hypotheses = tmp_path / f"{engine}.json", tmp_path / f"{engine}.hyp"
        assert main(["evaluate", str(folder), *common, "--output_json", str(scores), "--hypotheses",
                     str(hypotheses)]) == 0
        out = capsys.readouterr().out
        assert f"the {engine} engine ({folder})" in out and "source reliance: not measured" in out
        report = json.loads(scores.read_text())
        assert report["sentences"] == len(PARALLEL) and report["source_reliance"] is None
        assert main(["translate", str(folder), "--input", str(tmp_path / "in.txt"), "--output",
                     str(tmp_path / f"{engine}.txt"), "--num_beams", "2", "--threads", "1"]) == 0
        assert hypotheses.read_text(encoding="utf-8") == (tmp_path / f"{engine}.txt").read_text(encoding="utf-8")
    model_folder = tmp_path / "with_onnx"
    shutil.copytree(tiny_folder, model_folder)
    shutil.copytree(tmp_path / "onnx", model_folder / "onnx")
    assert main(["evaluate", str(model_folder), *common, "--engine", "onnx"]) == 0
    assert f"the onnx engine ({model_folder / 'onnx'})" in capsys.readouterr().out
    assert main(["evaluate", str(model_folder), *common]) == 0  # a model folder: torch, with source reliance
    out = capsys.readouterr().out
    assert f"the torch engine ({model_folder})" in out and "nats/token" in out
    assert main(["evaluate", str(tmp_path / "onnx"), *common, "--engine", "ctranslate2"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "`--engine` = 'ctranslate2' is not allowed for" in error[0]


def test_deepnmt_export_and_translate_a_dtmt_model_with_onnx(tiny_tokenizer, tmp_path):
    """meng2019 DTMT, which no other engine serves: `deepnmt export --format onnx` and `translate --engine onnx`
    give the torch engine's translations."""
    model = case_model("dtmt", len(tiny_tokenizer))
    model.save_pretrained(tmp_path / "dtmt")
    tiny_tokenizer.save_pretrained(tmp_path / "dtmt")
    (tmp_path / "in.txt").write_text("In the beginning God created the heavens.\nAnd God saw the light.\n",
                                     encoding="utf-8")
    common = ["--input", str(tmp_path / "in.txt"), "--num_beams", "4", "--max_new_tokens", "8", "--threads", "1"]
    assert main(["translate", "--model", str(tmp_path / "dtmt"), "--output", str(tmp_path / "torch.txt"),
                 *common]) == 0
    assert main(["export", str(tmp_path / "dtmt"), str(tmp_path / "onnx"), "--format", "onnx"]) == 0
    assert main(["translate", "--model", str(tmp_path / "onnx"), "--engine", "onnx", "--output",
                 str(tmp_path / "onnx.txt"), *common]) == 0
    assert (tmp_path / "onnx.txt").read_text(encoding="utf-8") == (tmp_path / "torch.txt").read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------------ refusals
def test_refusals_name_the_mechanism(tiny_folder, tmp_path, capsys):
    config = tiny_model().config
    assert export_blockers(config, "ctranslate2") == [] and export_blockers(config, "onnx") == []
    config.encoder_layer_aggregation = "hierarchical"  # dou2018 fields, read with defaults until they exist
    config.multi_layer_attention_k = 2
    blockers = export_blockers(config, "ctranslate2")
    assert len(blockers) == 2 and all("dou2018" in reason for reason in blockers)
    assert "layer aggregation" in blockers[0] and "multi-layer attention" in blockers[1]
    assert export_blockers(config, "onnx") == []  # ONNX takes every model of the package
    dtmt = SimpleNamespace(model_type="dtmt")
    assert export_blockers(dtmt, "onnx") == [] and "DTMT" in export_blockers(dtmt, "ctranslate2")[0]
    # DTMT is the CPU defaults' model: its refusal names the exportable Transformer of those defaults
    with pytest.raises(ValueError, match=r"DTMT.*--format onnx.*`deepnmt train --model_type deep_transformer`"):
        check_exportable(dtmt, "marian")
    assert "'t5'" in export_blockers(SimpleNamespace(model_type="t5"), "onnx")[0]
    mish = tiny_model(activation_function="mish")
    assert "activation_function='mish'" in export_blockers(mish.config, "ctranslate2")[0]
    assert export_blockers(mish.config, "onnx") == []
    pre = tiny_model(layer_norm_position="pre")
    assert export_blockers(pre.config, "ctranslate2") == [] and "pre" in export_blockers(pre.config, "marian")[0]
    with pytest.raises(ValueError, match=r"^cannot export to ctranslate2: the model uses dou2018 .*--format onnx"):
        export_model(SimpleNamespace(config=config), None, tmp_path / "x", "ctranslate2")
    with pytest.raises(ValueError, match="`quantization` = 'int8' is not allowed for marian"):
        export_model(tiny_model(), None, tmp_path / "y", "marian", "int8")
    with pytest.raises(ValueError, match="`quantization` = 'bfloat16' is not allowed for onnx; use int8"):
        export_model(tiny_model(), None, tmp_path / "z", "onnx", "bfloat16")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert main(["export", str(tiny_folder), str(tmp_path / "full"), "--format", "onnx"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "not empty" in error[0]
    assert main(["translate", "--model", str(tiny_folder), "--engine", "ctranslate2"]) == 2
    assert "serves a CTranslate2 export folder, and" in capsys.readouterr().err
    assert main(["translate", "--model", str(tiny_folder), "--engine", "onnx"]) == 2
    assert "needs an ONNX export, and" in capsys.readouterr().err
