"""Argos Translate export (hf_deepnmt.export_argos): our BPE tokenizer as a SentencePiece model that splits the
embedded corpus into the same ids, and an ``.argosmodel`` package that ``argostranslate`` installs offline and
translates with exactly as CTranslate2 runs our own export.

ctranslate2 and sentencepiece are in the `export` extra, argostranslate in `dev`: without them these tests skip,
unless DEEPNMT_REQUIRE_EXPORT=1 (set by `bash run.sh test`, i.e. CI), where a missing package fails.
"""

from __future__ import annotations

import gzip
import importlib
import json
import os
import zipfile

import pytest
from conftest import PARALLEL, tiny_model
from export_cases import train_until_lengths_vary, variant_model

from benchmarks.argos_parity import argos_translations, ctranslate2_translations

from hf_deepnmt.errors import UserInputError
from hf_deepnmt.export import export_model
from hf_deepnmt.pipeline_translation import record_language_pair
from hf_deepnmt_training.errors import CommandLineError
from hf_deepnmt_training.serve import choose_engine

REQUIRED = ("ctranslate2", "sentencepiece", "argostranslate")
if os.environ.get("DEEPNMT_REQUIRE_EXPORT") == "1":
    for module in REQUIRED:
        importlib.import_module(module)  # CI: a missing extra fails
else:
    for module in REQUIRED:
        pytest.importorskip(module)


def _pieces(tokenizer):
    import sentencepiece as spm

    from hf_deepnmt.export_argos import sentencepiece_model

    return spm.SentencePieceProcessor(model_proto=sentencepiece_model(tokenizer))


def test_the_sentencepiece_model_splits_the_embedded_corpus_into_our_tokenizers_ids():
    """The tokenizer `deepnmt train` makes for the embedded corpus (8,000 BPE pieces) and its SentencePiece form give
    the same ids on every sentence of the corpus, both languages, all splits; the two documented departures
    (docs/fast-inference.md, "Argos Translate packages") are where they are said to be."""
    from hf_deepnmt_training.corpus import corpus_dir
    from hf_deepnmt_training.tokenizer import train_joint_bpe

    def pairs(split):
        with gzip.open(corpus_dir() / f"{split}.jsonl.gz", "rt", encoding="utf-8") as handle:
            return [(record["translation"]["en"], record["translation"]["es"]) for record in map(json.loads, handle)]

    train = pairs("train")
    tokenizer = train_joint_bpe([en for en, _ in train], [es for _, es in train], vocab_size=8000)
    processor = _pieces(tokenizer)
    texts = [text for split in ("train", "valid", "test") for pair in pairs(split) for text in pair]
    assert len(texts) > 60_000
    different = [text for text in texts if processor.encode(text) != tokenizer(text, add_special_tokens=False)[
        "input_ids"]]
    assert different == []
    # NFKC (ligature, circled and full-width digits) and inner runs of spaces agree too
    for text in ("ﬁne ① ２ café", "two  spaces inside", "tab\tand end "):
        assert processor.encode(text) == tokenizer(text, add_special_tokens=False)["input_ids"], text
    # the departures: a leading space, and a run of characters outside the vocabulary
    assert processor.encode(" leading") != tokenizer(" leading", add_special_tokens=False)["input_ids"]
    unknown = tokenizer.convert_tokens_to_ids("<unk>")
    assert tokenizer("中文", add_special_tokens=False)["input_ids"].count(unknown) == 2
    assert processor.encode("中文").count(unknown) == 1


def test_only_our_bpe_tokenizer_is_carried(tiny_tokenizer, tmp_path):
    """Argos runs one SentencePiece model for both languages: a tokenizer that is not our BPE shape is refused in one
    sentence naming what differs, as is a model without one recorded language pair; nothing is written."""
    from tokenizers import normalizers

    model = tiny_model(vocab_size=len(tiny_tokenizer), max_position_embeddings=320)
    with pytest.raises(UserInputError, match="translates one language pair and the model records 0"):
        export_model(model, tiny_tokenizer, tmp_path / "none", "argos")
    record_language_pair(model.config, "en", "es")
    changed = tiny_tokenizer.__class__(tokenizer_object=tiny_tokenizer.backend_tokenizer.__class__.from_str(
        tiny_tokenizer.backend_tokenizer.to_str()))
    changed.backend_tokenizer.normalizer = normalizers.NFC()
    with pytest.raises(UserInputError, match="normalizes with NFC, not NFKC"):
        export_model(model, changed, tmp_path / "nfc", "argos")
    short = tiny_model(vocab_size=len(tiny_tokenizer))
    record_language_pair(short.config, "en", "es")
    with pytest.raises(UserInputError, match="`max_position_embeddings` = 64 is too small for argos"):
        export_model(short, tiny_tokenizer, tmp_path / "short", "argos")
    assert not any((tmp_path / name).exists() for name in ("none", "nfc", "short"))


@pytest.mark.integration
@pytest.mark.parametrize("variant, trained", [("post_ln", True), ("admin_folded", True), ("post_ln", False)])
def test_argostranslate_installs_the_package_and_translates_as_ctranslate2_runs_our_export(variant, trained,
                                                                                           tiny_tokenizer, tmp_path):
    """The package installs with ``argostranslate.package.install_from_path`` into an empty packages folder, offline,
    and Argos's translations (its search: beam 4, length penalty 0.2, 2 hypotheses) are what CTranslate2 gives for
    our own export with our tokenizer's ids and the same search — trained models (hypotheses end at varied lengths)
    and a random one (every hypothesis runs to the 256-token limit, which 256 positions reach)."""
    # Argos decodes up to CTranslate2's default 256 tokens: 256 positions (the quickstart model's) reach that far
    make = lambda: variant_model(variant, len(tiny_tokenizer), max_position_embeddings=256)  # noqa: E731
    model = train_until_lengths_vary(make, tiny_tokenizer) if trained else make()
    record_language_pair(model.config, "en", "es")
    export_model(model, tiny_tokenizer, tmp_path / "argos", "argos")
    export_model(model, tiny_tokenizer, tmp_path / "ct2", "ctranslate2")
    package = tmp_path / "argos" / "translate-en_es.argosmodel"
    manifest = json.loads((tmp_path / "argos" / "deepnmt_export.json").read_text())
    assert manifest["format"] == "argos" and manifest["argos"]["package"] == package.name
    with pytest.raises(CommandLineError, match="holds an Argos Translate package"):  # not one of our engines
        choose_engine(tmp_path / "argos", None, command="translate")
    names = zipfile.ZipFile(package).namelist()
    assert {"translate-en_es/metadata.json", "translate-en_es/sentencepiece.model",
            "translate-en_es/model/model.bin"} <= set(names)

    texts = [source for source, _ in PARALLEL[:4]] + ["The light was good."]
    languages, argos = argos_translations(package, texts, "en", "es", 2, tmp_path)
    assert languages == ["en", "es"]
    tokens, expected = ctranslate2_translations(tmp_path / "ct2", tiny_tokenizer, texts, 2)
    assert argos == expected
    assert any(len(set(hypotheses)) == 2 for hypotheses in expected)  # the searches have something to agree on
    if not trained:  # random weights run to Argos's 256-token limit: the model's 256 positions are all read
        assert max(len(hypothesis) for hypotheses in tokens for hypothesis in hypotheses) == 256
