"""Fast inference (hf_deepnmt.export): CTranslate2 and ONNX exports of every standard Transformer variant give
`generate`'s beam-4 output and its logits; refusals name the mechanism; `deepnmt export` / `translate --engine`.

ctranslate2 and onnxruntime are the `export` extra: without them these tests skip, unless DEEPNMT_REQUIRE_EXPORT=1
(set by `bash run.sh test`, i.e. CI), where a missing extra fails.
"""

from __future__ import annotations

import io
import json
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import PARALLEL, tiny_model

from hf_deepnmt.export import (
    CTranslate2Engine,
    OnnxDecoderGraph,
    OnnxEncoderGraph,
    OnnxEngine,
    TorchEngine,
    beam_search,
    export_blockers,
    export_model,
    load_engine,
    standard_model,
)
from training.cli import main

if os.environ.get("DEEPNMT_REQUIRE_EXPORT") == "1":
    import ctranslate2  # noqa: F401
    import onnxruntime  # noqa: F401
else:
    pytest.importorskip("ctranslate2")
    pytest.importorskip("onnxruntime")

# Every variant that is mathematically a standard Transformer (the module docstring of hf_deepnmt.export).
VARIANTS = {
    "post_ln": {},
    "pre_ln": {"layer_norm_position": "pre"},
    "admin_folded": {"residual_scaling": "admin", "admin_init": "closed_form"},
    "cad_p1_post_ln": {"cross_attention_drop_depth": 1, "cross_attention_drop_ratio": 1.0},
    "cad_p1_pre_ln": {"cross_attention_drop_depth": 1, "cross_attention_drop_ratio": 1.0, "layer_norm_position": "pre"},
    "untied_unscaled_gelu": {"tie_word_embeddings": False, "scale_embedding": False, "activation_function": "gelu",
                             "layer_norm_eps": 1e-6},
}
NEW_TOKENS = 16


def variant_model(name: str, vocab_size: int, eos_boost: float = 1.0):
    """A tiny random model of a variant; ADMIN gets random ω (so folding is not the identity). ``eos_boost`` scales
    the output row of </s>: > 1 makes hypotheses end early, where the beam stopping rule matters."""
    model = tiny_model(seed=3, vocab_size=vocab_size, init_std=0.5, **VARIANTS[name])
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("_omega"):
                parameter.copy_(torch.rand_like(parameter) + 0.5)
        model.get_output_embeddings().weight[model.config.eos_token_id] *= eos_boost
    return model


_TRAINED: dict[str, torch.nn.Module] = {}


def trained_variant(name: str, tokenizer) -> torch.nn.Module:
    """`variant_model` after 60 Adam steps on the tiny corpus: it ends hypotheses at varied lengths, so the beam
    search's stopping rule decides outputs (a random model runs every hypothesis to the length limit)."""
    if name not in _TRAINED:
        model = variant_model(name, len(tokenizer)).train()
        sources, targets = zip(*PARALLEL)
        batch = tokenizer(list(sources), text_target=list(targets), padding=True, return_tensors="pt")
        labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(60):
            loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        _TRAINED[name] = model.eval()
    return _TRAINED[name]


@pytest.fixture(scope="module")
def sources(tiny_tokenizer) -> list[list[int]]:
    """The tiny corpus' sentences (both languages) and random id sequences, each ending in </s>."""
    texts = [text for pair in PARALLEL for text in pair]
    encoded = tiny_tokenizer(texts)["input_ids"]
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(2, 14, (6,), generator=generator).tolist()
    encoded += [torch.randint(4, len(tiny_tokenizer), (n,), generator=generator).tolist() + [2] for n in lengths]
    return encoded


def teacher_forced_log_probs(model, source: list[int], target: list[int]) -> np.ndarray:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source]),
                       decoder_input_ids=torch.tensor([[model.config.decoder_start_token_id, *target[:-1]]])).logits
    return logits.log_softmax(-1)[0, torch.arange(len(target)), torch.tensor(target)].numpy()


def same_fraction(expected: list[list[int]], got: list[list[int]]) -> float:
    return sum(a == b for a, b in zip(expected, got, strict=True)) / len(expected)


# ------------------------------------------------------------------------------------------------ CTranslate2
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


# ------------------------------------------------------------------------------------------------ ONNX
class GraphSteps:
    """The ONNX graphs run in PyTorch behind `beam_search`'s step interface (what ONNX Runtime runs, minus the
    export): checks the graphs' arithmetic and the search on every variant without exporting each."""

    def __init__(self, model, input_ids: np.ndarray, attention_mask: np.ndarray, beams: int):
        model = standard_model(model)  # ADMIN folded, as `export_onnx` does
        self.decoder = OnnxDecoderGraph(model)
        self.mask = torch.from_numpy(attention_mask)
        with torch.no_grad():
            self.cross = list(OnnxEncoderGraph(model)(torch.from_numpy(input_ids), self.mask))
        heads = model.config.decoder_attention_heads
        empty = torch.zeros(len(input_ids), beams, heads, 0, model.config.d_model // heads)
        self.caches = [empty] * (2 * model.config.decoder_layers)

    def step(self, tokens: np.ndarray, position: int) -> np.ndarray:
        with torch.no_grad():
            logits, *self.caches = self.decoder(torch.from_numpy(tokens), torch.tensor([position]), self.mask,
                                                *self.caches, *self.cross)
        return logits.numpy()

    def select(self, keep: np.ndarray, origins: np.ndarray) -> None:
        keep_t, origins_t = torch.from_numpy(keep), torch.from_numpy(origins)
        self.cross = [value[keep_t] for value in self.cross]
        self.mask = self.mask[keep_t]
        self.caches = [value[keep_t[:, None], origins_t] for value in self.caches]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_onnx_graphs_and_beam_search_reproduce_generate(variant, tiny_tokenizer, sources):
    """On a trained model (hypotheses end at varied lengths), `beam_search` over the graphs gives `generate`'s
    output with both stopping rules, and greedy's; the decoder graph's logits are the model's."""
    from hf_deepnmt.export import pad_batch

    model = trained_variant(variant, tiny_tokenizer)
    reference = TorchEngine(model)
    input_ids, attention_mask = pad_batch(sources, model.config.pad_token_id)
    for beams, early_stopping in ((4, False), (4, True), (1, False)):
        expected = reference.generate(sources, beams, NEW_TOKENS, early_stopping=early_stopping)
        assert sum(ids[-1] == model.config.eos_token_id for ids in expected) >= 2
        got = beam_search(GraphSteps(model, input_ids, attention_mask, beams), len(sources), beams, NEW_TOKENS,
                          model.config.decoder_start_token_id, model.config.eos_token_id, 1.0, early_stopping)
        assert got == expected, (beams, early_stopping)
    target = expected[0]
    steps = GraphSteps(model, input_ids[:1], attention_mask[:1], 1)
    tokens = [model.config.decoder_start_token_id, *target[:-1]]
    logits = np.stack([steps.step(np.array([[token]]), t)[0, 0] for t, token in enumerate(tokens)])
    with torch.no_grad():
        expected_logits = model(input_ids=torch.from_numpy(input_ids[:1]),
                                attention_mask=torch.from_numpy(attention_mask[:1]),
                                decoder_input_ids=torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(logits, expected_logits, atol=1e-4, rtol=0)


# ------------------------------------------------------------------------------------------------ CLI end to end
def test_deepnmt_export_and_translate_with_every_engine(tiny_folder, tiny_tokenizer, tmp_path, monkeypatch, capsys):
    text = "In the beginning God created the heavens.\n\nAnd God saw the light.\nThe earth was void.\n"
    (tmp_path / "in.txt").write_text(text, encoding="utf-8")
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
    # ONNX Runtime's decoder logits against the model's (the exported graph, not its PyTorch twin)
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_folder)
    engine = load_engine(tmp_path / "onnx", "onnx", intra_threads=1)
    assert isinstance(engine, OnnxEngine)
    source = tiny_tokenizer(["And God saw the light."])["input_ids"]
    steps = engine.stepper(np.array(source), np.ones((1, len(source[0])), dtype=np.int64), 1)
    tokens = [1, 20, 30, 40]
    logits = np.stack([steps.step(np.array([[token]]), t)[0, 0] for t, token in enumerate(tokens)])
    with torch.no_grad():
        reference = model(input_ids=torch.tensor(source), decoder_input_ids=torch.tensor([tokens])).logits[0]
    np.testing.assert_allclose(logits, reference.numpy(), atol=1e-4, rtol=0)
    # marian: a stock MarianMTModel folder that the torch engine runs to the same output
    assert main(["export", str(tiny_folder), str(tmp_path / "marian"), "--format", "marian"]) == 0
    assert json.loads((tmp_path / "marian" / "config.json").read_text())["model_type"] == "marian"
    out = tmp_path / "marian.txt"
    assert main(["translate", "--model", str(tmp_path / "marian"), "--output", str(out), *common]) == 0
    assert out.read_text(encoding="utf-8") == expected


# ------------------------------------------------------------------------------------------------ refusals
def test_refusals_name_the_mechanism(tiny_folder, tmp_path, capsys):
    config = tiny_model().config
    assert export_blockers(config, "ctranslate2") == [] and export_blockers(config, "onnx") == []
    config.encoder_layer_aggregation = "hierarchical"  # dou2018 fields, read with defaults until they exist
    config.multi_layer_attention_k = 2
    blockers = export_blockers(config, "ctranslate2")
    assert len(blockers) == 2 and all("dou2018" in reason for reason in blockers)
    assert "layer aggregation" in blockers[0] and "multi-layer attention" in blockers[1]
    assert "DTMT" in export_blockers(SimpleNamespace(model_type="dtmt"), "onnx")[0]
    assert "'t5'" in export_blockers(SimpleNamespace(model_type="t5"), "ctranslate2")[0]
    mish = tiny_model(activation_function="mish")
    assert "activation_function='mish'" in export_blockers(mish.config, "ctranslate2")[0]
    assert export_blockers(mish.config, "onnx") == []
    pre = tiny_model(layer_norm_position="pre")
    assert export_blockers(pre.config, "ctranslate2") == [] and "pre" in export_blockers(pre.config, "marian")[0]
    with pytest.raises(ValueError, match=r"^cannot export to ctranslate2: the model uses dou2018 .*torch engine"):
        export_model(SimpleNamespace(config=config), None, tmp_path / "x", "ctranslate2")
    with pytest.raises(ValueError, match="`quantization` = 'int8' is not allowed for marian"):
        export_model(tiny_model(), None, tmp_path / "y", "marian", "int8")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    assert main(["export", str(tiny_folder), str(tmp_path / "full"), "--format", "onnx"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "not empty" in error[0]
    assert main(["translate", "--model", str(tiny_folder), "--engine", "ctranslate2"]) == 2
    assert "is not an hf_deepnmt export" in capsys.readouterr().err
