"""training/data.py: formats, errors that name file and line, cleaning, token-budget batching."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from hf_deepnmt_training.data import DataArguments, DataError, TokenBudgetBatchSampler, read_parallel_file, tokenize_corpus

PAIRS = [("Hello world.", "Hola mundo."), ("Good night.", "Buenas noches."), ("Thank you.", "Gracias.")]


def _jsonl(pairs, src="en", tgt="es") -> str:
    return "".join(json.dumps({"translation": {src: s, tgt: t}}) + "\n" for s, t in pairs)


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "json-list", "tsv", "aligned", "aligned.gz"])
def test_every_local_format_reads_the_same_pairs(tmp_path, fmt):
    if fmt == "jsonl":
        path = tmp_path / "d.jsonl"
        path.write_text(_jsonl(PAIRS), encoding="utf-8")
    elif fmt == "jsonl.gz":
        path = tmp_path / "d.jsonl.gz"
        path.write_bytes(gzip.compress(_jsonl(PAIRS).encode()))
    elif fmt == "json-list":
        path = tmp_path / "d.json"
        path.write_text(json.dumps([{"translation": {"en": s, "es": t}} for s, t in PAIRS]), encoding="utf-8")
    elif fmt == "tsv":
        path = tmp_path / "d.tsv"
        path.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    else:
        path = tmp_path / "train"
        suffix = ".gz" if fmt.endswith(".gz") else ""
        for lang, side in (("en", 0), ("es", 1)):
            text = "\n".join(p[side] for p in PAIRS) + "\n"
            target = tmp_path / f"train.{lang}{suffix}"
            target.write_bytes(gzip.compress(text.encode()) if suffix else text.encode())
    corpus = read_parallel_file(path, "en", "es")
    assert list(zip(corpus.sources, corpus.targets)) == PAIRS


def test_languages_can_be_swapped(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(_jsonl(PAIRS), encoding="utf-8")
    corpus = read_parallel_file(path, "es", "en")
    assert corpus.sources[0] == "Hola mundo." and corpus.targets[0] == "Hello world."


def test_empty_sides_and_whitespace_are_cleaned(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(_jsonl([("  Hello   world. ", "Hola\tmundo."), ("", "vacío"), ("empty", "  ")]), encoding="utf-8")
    corpus = read_parallel_file(path, "en", "es")
    assert corpus.sources == ["Hello world."] and corpus.targets == ["Hola mundo."]
    assert corpus.dropped_empty == 2


def test_max_samples(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(_jsonl(PAIRS), encoding="utf-8")
    assert len(read_parallel_file(path, "en", "es", max_samples=2)) == 2


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("bad.jsonl", _jsonl(PAIRS[:1]) + '{"translation": {"en": "x", "es": }\n', r"bad\.jsonl line 2: not valid JSON"),
        ("lang.jsonl", _jsonl(PAIRS[:2]) + _jsonl(PAIRS[:1], tgt="fr"), r"lang\.jsonl line 3: no 'es' in 'translation' \(found: en, fr\)"),
        ("shape.jsonl", '{"en": "x", "es": "y"}\n', r"shape\.jsonl line 1: expected an object with a 'translation'"),
        ("type.jsonl", '{"translation": {"en": 3, "es": "y"}}\n', r"type\.jsonl line 1: 'translation.en' must be a string"),
        ("empty.jsonl", "\n\n", r"empty\.jsonl is empty"),
        ("cols.tsv", "a\tb\nc\td\te\n", r"cols\.tsv line 2: expected 2 tab-separated columns, found 3"),
        ("empty.tsv", "", r"empty\.tsv is empty"),
        ("blank.tsv", " \t \n", r"blank\.tsv has no sentence pair"),
        ("data.csv", "a,b\n", r"unknown format '\.csv'"),
    ],
)
def test_malformed_files_name_the_file_and_line(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=match):
        read_parallel_file(path, "en", "es")


@pytest.mark.parametrize("name, data, match", [
    ("fake.jsonl.gz", b"not gzip at all", r"fake\.jsonl\.gz is not a complete gzip file"),
    ("cut.tsv.gz", gzip.compress(b"a\tb\n" * 50)[:-12], r"cut\.tsv\.gz is not a complete gzip file"),
    ("latin1.jsonl", _jsonl(PAIRS[:2]).encode() + '{"translation": {"en": "caf\u00e9", "es": "x"}}\n'.encode("latin1"),
     r"latin1\.jsonl line 3: not UTF-8 text \(byte 0xe9\)"),
    ("binary.tsv", b"a\tb\n\xff\xfe\x00\x01", r"binary\.tsv line 2: not UTF-8 text \(byte 0xff\)"),
])
def test_undecodable_files_name_the_file_and_line(tmp_path, name, data, match):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(DataError, match=match):
        read_parallel_file(path, "en", "es")


def test_a_missing_data_file_is_not_taken_for_a_prefix(tmp_path):
    with pytest.raises(DataError, match=r"train\.jsonl does not exist\.$"):
        read_parallel_file(tmp_path / "train.jsonl", "en", "es")


def test_misaligned_and_missing_text_files(tmp_path):
    (tmp_path / "t.en").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "t.es").write_text("a\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"t\.en has 2 lines but .*t\.es has 1; they must align"):
        read_parallel_file(tmp_path / "t", "en", "es")
    with pytest.raises(DataError, match=r"u\.en does not exist"):
        read_parallel_file(tmp_path / "u", "en", "es")


@pytest.mark.parametrize(
    "kwargs,field",
    [(dict(max_source_length=1), "max_source_length"), (dict(max_tokens=0), "max_tokens"),
     (dict(filter_max_ratio=0.5), "filter_max_ratio"), (dict(source_lang="en", target_lang="en"), "target_lang")],
)
def test_bad_data_arguments_are_named(kwargs, field):
    with pytest.raises(ValueError, match=f"--{field}"):
        DataArguments(**kwargs)


def test_tokenize_truncates_filters_and_records_lengths(tiny_tokenizer):
    from hf_deepnmt_training.data import ParallelCorpus

    long = " ".join(["light"] * 60)
    corpus = ParallelCorpus(["Let there be light.", long, "light"], ["Sea la luz.", "luz", "luz " * 10], "mem")
    data = tokenize_corpus(corpus, tiny_tokenizer, max_source_length=16, max_target_length=16)
    assert len(data) == 3
    assert max(len(ids) for ids in data["input_ids"]) == 16
    assert all(ids[-1] == tiny_tokenizer.eos_token_id for ids in list(data["input_ids"]) + list(data["labels"]))
    assert list(data["length"]) == [max(len(s), len(t)) for s, t in zip(list(data["input_ids"]), list(data["labels"]))]
    filtered = tokenize_corpus(corpus, tiny_tokenizer, 64, 64, filter_max_length=40, filter_max_ratio=3.0)
    assert len(filtered) == 1 and corpus.dropped_length == 2


# ------------------------------------------------------------------------------------------------ batching
def _lengths(n=500, seed=0):
    return np.random.default_rng(seed).integers(3, 80, size=n).tolist()


def test_token_budget_is_respected_and_every_example_appears_once():
    lengths = _lengths()
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=400, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(max(lengths[i] for i in batch) * len(batch) <= 400 for batch in batches)
    # length-bucketed: each batch spans a narrow length range
    spreads = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert np.mean(spreads) < 5


def test_batches_are_deterministic_per_seed_and_epoch_and_shuffled_across_epochs():
    lengths = _lengths()
    first = TokenBudgetBatchSampler(lengths, 400, seed=5)
    again = TokenBudgetBatchSampler(lengths, 400, seed=5)
    assert list(first) == list(again)  # epoch 0, both
    second_epoch = list(first)  # no set_epoch(): the next pass is epoch 1
    assert second_epoch != list(TokenBudgetBatchSampler(lengths, 400, seed=5))
    again.set_epoch(1)
    assert list(again) == second_epoch
    other_seed = TokenBudgetBatchSampler(lengths, 400, seed=6)
    assert list(other_seed) != list(TokenBudgetBatchSampler(lengths, 400, seed=5))
    assert len(first) == len(other_seed)  # the number of batches does not depend on the shuffle


def test_an_example_longer_than_the_budget_gets_its_own_batch():
    sampler = TokenBudgetBatchSampler([10, 500, 10], max_tokens=100, seed=0)
    assert sorted(map(sorted, sampler)) == [[0, 2], [1]]


def test_a_datasets_corpus_by_name(tmp_path):
    """`--dataset_name` goes through `datasets.load_dataset` (here a local dataset folder: no network)."""
    from hf_deepnmt_training.data import load_splits

    for split, pairs in (("train", PAIRS), ("validation", PAIRS[:2])):
        (tmp_path / f"{split}.jsonl").write_text(_jsonl(pairs), encoding="utf-8")
    args = DataArguments(dataset_name=str(tmp_path), source_lang="en", target_lang="es", max_train_samples=2)
    corpora = load_splits(args, ["train", "validation"])
    assert corpora["train"].sources == ["Hello world.", "Good night."]
    assert corpora["validation"].targets == ["Hola mundo.", "Buenas noches."]
