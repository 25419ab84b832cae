"""`deepnmt diagnose`: source reliance and per-layer cross-attention share and entropy of a saved model."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import PARALLEL, tiny_model
from test_li2022 import without_cross_attention

from hf_deepnmt_training.cli import main
from hf_deepnmt_training.diagnose import diagnose

SOURCES, TARGETS = zip(*PARALLEL)


def test_a_decoder_without_source_access_is_diagnosed_as_such(tiny_tokenizer):
    blind = without_cross_attention(tiny_model(vocab_size=len(tiny_tokenizer), decoder_layers=2,
                                               cross_attention_drop_depth=1, cross_attention_drop_ratio=1.0))
    result = diagnose(blind, tiny_tokenizer, SOURCES, TARGETS)
    assert result.source_reliance == pytest.approx(0.0, abs=1e-4)
    assert result.cross_attention_share == [None, None] and "ignores its source" in result.report()


def test_share_and_entropy_are_measured_per_layer(tiny_tokenizer):
    model = tiny_model(vocab_size=len(tiny_tokenizer), decoder_layers=3, cross_attention_drop_depth=1,
                       cross_attention_drop_ratio=1.0)  # layer 1 has no cross-attention
    result = diagnose(model, tiny_tokenizer, SOURCES, TARGETS, max_pairs=4)
    assert result.pairs == 4 and result.source_reliance > 0
    assert result.cross_attention_share[0] is None and all(v > 0 for v in result.cross_attention_share[1:])
    assert all(0.0 < v <= 1.0 + 1e-6 for v in result.cross_attention_entropy[1:])
    # a layer whose attention is made uniform (zero queries) has entropy 1
    with torch.no_grad():
        model.model.decoder.layers[2].encoder_attn.q_proj.weight.zero_()
        model.model.decoder.layers[2].encoder_attn.q_proj.bias.zero_()
    uniform = diagnose(model, tiny_tokenizer, SOURCES, TARGETS, max_pairs=4)
    assert uniform.cross_attention_entropy[2] == pytest.approx(1.0, abs=1e-4)


def test_the_command_prints_and_writes_json(tiny_folder, tmp_path, small_corpus, capsys):
    out = tmp_path / "diagnosis.json"
    assert main(["diagnose", "--model", str(tiny_folder), "--test_file", str(small_corpus / "test.jsonl"),
                 "--pairs", "8", "--output_json", str(out), "--source_lang", "en", "--target_lang", "es"]) == 0
    printed = capsys.readouterr().out
    assert "source reliance" in printed and "attention entropy" in printed
    data = json.loads(out.read_text())
    assert data["pairs"] == 8 and len(data["cross_attention_share"]) == 2
