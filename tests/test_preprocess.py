"""training/preprocess.py: a corpus read and tokenized into Arrow once, cached outside --output_dir, reused by a second
run and by every other process; the same examples as the in-memory path; errors that still name the file and line."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_data import PAIRS, _jsonl

import hf_deepnmt_training.preprocess as preprocess
from hf_deepnmt_training.data import (DataArguments, DataError, TokenBudgetBatchSampler, length_column, read_parallel_file,
                           tokenize_corpus)

RUN = SimpleNamespace(main_process_first=lambda desc="": contextlib.nullcontext())  # one process, no launcher


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private datasets cache: what a run prepares lands here (and nowhere near --output_dir)."""
    import datasets

    folder = tmp_path / "datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(folder))
    return folder / "hf_deepnmt"


def _corpus(tmp_path: Path, n: int = 40) -> Path:
    """n pairs of varied lengths (short, long, lopsided) and two with an empty side."""
    words = "light darkness water earth heaven day night".split()
    pairs = []
    for i in range(n):
        source = " ".join(words[j % len(words)] for j in range(1 + (i * 7) % 30))
        target = " ".join(words[(j + 3) % len(words)] for j in range(1 + (i * 11) % 9))
        pairs.append((source, target))
    pairs[5] = ("", "luz")
    pairs[9] = ("light", "  ")
    path = tmp_path / "train.jsonl"
    path.write_text(_jsonl(pairs), encoding="utf-8")
    return path


def _args(path: Path, **options) -> DataArguments:
    return DataArguments(train_file=str(path), **options)


def _rows(dataset) -> list[tuple]:
    return [(list(row["input_ids"]), list(row["labels"]), int(row["length"])) for row in dataset]


@pytest.mark.parametrize("options", [
    {},
    {"max_source_length": 8, "max_target_length": 6},
    {"filter_max_length": 20, "filter_max_ratio": 2.0, "max_source_length": 16},
    {"source_prefix": ">>es<< "},
])
def test_the_arrow_path_gives_the_examples_of_the_in_memory_path(tmp_path, cache, tiny_tokenizer, options):
    path = _corpus(tmp_path)
    args = _args(path, **options)
    read = preprocess.read_split(args, "train", str(path), None, RUN)
    tokenized = preprocess.tokenize_split(read, tiny_tokenizer, args, RUN, "train", filters=True)

    corpus = read_parallel_file(path, "en", "es")
    expected = tokenize_corpus(corpus, tiny_tokenizer, args.max_source_length, args.max_target_length,
                               args.filter_max_length, args.filter_max_ratio, args.source_prefix)
    assert read.dropped_empty == corpus.dropped_empty == 2
    assert tokenized.dropped_length == corpus.dropped_length
    assert _rows(tokenized.dataset) == _rows(expected)
    if "filter_max_length" in options:
        assert 0 < tokenized.dropped_length < len(read)  # the filters really dropped some and kept some


def test_a_second_run_reuses_both_stages_and_says_so(tmp_path, cache, tiny_tokenizer, monkeypatch, capsys):
    path = _corpus(tmp_path)
    args = _args(path)
    first = preprocess.tokenize_split(preprocess.read_split(args, "train", str(path), None, RUN), tiny_tokenizer,
                                      args, RUN, "train", filters=True)
    assert not first.reused and not first.read.reused

    def no_tokenizing(*_, **__):
        raise AssertionError("the second run tokenized again")

    monkeypatch.setattr(preprocess, "tokenize_batch", no_tokenizing)
    monkeypatch.setattr(preprocess, "_pair_rows", no_tokenizing)
    capsys.readouterr()
    read = preprocess.read_split(args, "train", str(path), None, RUN)
    second = preprocess.tokenize_split(read, tiny_tokenizer, args, RUN, "train", filters=True)
    assert read.reused and second.reused
    err = capsys.readouterr().err
    assert "reusing the prepared pairs" in err and "reusing the tokenized corpus" in err
    assert _rows(second.dataset) == _rows(first.dataset)
    # memory-mapped from the datasets cache, not held in memory and not under any --output_dir
    assert all(Path(entry["filename"]).is_relative_to(cache) for entry in second.dataset.cache_files)
    assert second.dataset.cache_files


def test_a_changed_file_or_another_tokenizer_setting_is_prepared_again(tmp_path, cache, tiny_tokenizer):
    path = _corpus(tmp_path)
    args = _args(path)
    read = preprocess.read_split(args, "train", str(path), None, RUN)
    preprocess.tokenize_split(read, tiny_tokenizer, args, RUN, "train", filters=True)
    shorter = _args(path, max_target_length=5)
    assert not preprocess.tokenize_split(read, tiny_tokenizer, shorter, RUN, "train", filters=True).reused

    path.write_text(_jsonl(PAIRS), encoding="utf-8")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    again = preprocess.read_split(args, "train", str(path), None, RUN)
    assert not again.reused and len(again) == len(PAIRS)
    assert again.dataset["source"] == [source for source, _ in PAIRS]


@pytest.mark.parametrize("name, content, match", [
    ("bad.jsonl", _jsonl(PAIRS[:2]) + '{"translation": {"en": "x", "es": }\n', r"bad\.jsonl line 3: not valid JSON"),
    ("cols.tsv", "a\tb\nc\td\te\n", r"cols\.tsv line 2: expected 2 tab-separated columns, found 3"),
    ("blank.tsv", " \t \n", r"blank\.tsv has no sentence pair"),
])
def test_a_malformed_line_is_still_named_with_file_and_line(tmp_path, cache, name, content, match):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataError, match=match):
        preprocess.read_split(_args(path), "train", str(path), None, RUN)
    # nothing half-written is taken for a prepared corpus next time
    assert not list(cache.glob("pairs-*/complete.json"))


def test_tokenizing_with_worker_processes_gives_the_same_examples(tmp_path, cache, tiny_tokenizer):
    path = _corpus(tmp_path, n=12_000)
    one = _args(path)
    two = _args(path, preprocessing_num_workers=2, max_target_length=255)  # another key: tokenized again
    read = preprocess.read_split(one, "train", str(path), None, RUN)
    single = preprocess.tokenize_split(read, tiny_tokenizer, one, RUN, "train", filters=True)
    parallel = preprocess.tokenize_split(read, tiny_tokenizer, two, RUN, "train", filters=True)
    assert len({entry["filename"] for entry in parallel.dataset.cache_files}) == 2  # one shard per worker
    assert _rows(parallel.dataset) == _rows(single.dataset)


def test_batching_reads_the_length_column_as_numpy(tmp_path, cache, tiny_tokenizer):
    path = _corpus(tmp_path)
    args = _args(path)
    tokenized = preprocess.tokenize_split(preprocess.read_split(args, "train", str(path), None, RUN),
                                          tiny_tokenizer, args, RUN, "train", filters=True)
    lengths = length_column(tokenized.dataset)
    assert isinstance(lengths, np.ndarray) and lengths.dtype == np.int32
    assert lengths.tolist() == [len(row["input_ids"]) if len(row["input_ids"]) > len(row["labels"])
                                else len(row["labels"]) for row in tokenized.dataset]
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=64, seed=1)
    seen = sorted(i for batch in sampler for i in batch)
    assert seen == list(range(len(tokenized)))
    assert all(len(batch) * max(lengths[batch]) <= 64 or len(batch) == 1 for batch in sampler)


def test_bpe_sample_is_seeded_and_bounded(tmp_path, cache):
    path = _corpus(tmp_path, n=200)
    read = preprocess.read_split(_args(path), "train", str(path), None, RUN)
    texts, pairs = preprocess.bpe_texts(read, sample_pairs=50, seed=3)
    first = list(texts)
    assert pairs == 50 and len(first) == 100
    assert list(preprocess.bpe_texts(read, 50, seed=3)[0]) == first
    assert list(preprocess.bpe_texts(read, 50, seed=4)[0]) != first
    everything, all_pairs = preprocess.bpe_texts(read, sample_pairs=10_000, seed=3)
    assert all_pairs == len(read) and next(everything) == read.dataset[0]["source"]


def test_the_joint_bpe_is_reused_by_a_run_with_another_output_dir(tmp_path, cache, capsys):
    from hf_deepnmt_training.build import load_or_train_tokenizer
    from hf_deepnmt_training.train_arguments import ModelArguments

    path = _corpus(tmp_path, n=200)
    args = _args(path)
    read = preprocess.read_split(args, "train", str(path), None, RUN)
    model_args = ModelArguments(vocab_size=120, bpe_min_frequency=1)
    runs = []
    for name in ("first", "second"):
        training_args = SimpleNamespace(output_dir=str(tmp_path / name), seed=42, local_process_index=0,
                                        disable_tqdm=True, main_process_first=RUN.main_process_first)
        runs.append(load_or_train_tokenizer(model_args, args, training_args, read))
        assert (tmp_path / name / "tokenizer.json").exists()
    assert "reusing the joint BPE" in capsys.readouterr().err
    assert runs[0].get_vocab() == runs[1].get_vocab()
    assert json.loads((tmp_path / "first" / "tokenizer.json").read_text())["model"] == \
        json.loads((tmp_path / "second" / "tokenizer.json").read_text())["model"]
