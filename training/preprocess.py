"""A parallel corpus of any size, prepared once: read into Arrow, tokenized into Arrow, memory-mapped by every process.

The data path of `deepnmt train` (docs/data.md):

1. **Reading** (`prepare_pairs`): a local file (JSON lines, a JSON list, TSV, two aligned ``PREFIX.<lang>`` files,
   ``.gz`` of each) is streamed line by line into an Arrow table of ``source`` / ``target`` strings by
   `datasets.Dataset.from_generator` — never held as Python objects — with the whitespace normalisation, the
   empty-side drop and the one-sentence errors (file and line) of `hf_deepnmt_training.data`. A `datasets` corpus
   (``--dataset_name``) is normalised by a batched `map` into the same two columns.
2. **Tokenizing** (`tokenize_pairs`): a batched `Dataset.map` (``num_proc`` = ``--preprocessing_num_workers``) writes
   ``input_ids``, ``attention_mask``, ``labels`` and ``length``, applying the length filters and the truncation of
   `hf_deepnmt_training.data.tokenize_batch`, the rule of `hf_deepnmt_training.data.tokenize_corpus` (the same examples).
3. **Batching** reads the ``length`` column as a numpy array (`hf_deepnmt_training.data.TokenBudgetBatchSampler`).

Both stages are cached under ``<datasets cache>/hf_deepnmt`` (``HF_DATASETS_CACHE``), each in a folder named by a key:
reading by the file's absolute path, size and modification time (a changed file is read again; an unchanged one is
not re-hashed, which at WMT size would cost minutes) and the languages and sample limit; tokenizing by the reading
key, the tokenizer's serialized JSON and every length option. A second run on the same data — with another
``--output_dir`` too — memory-maps the Arrow files and says so. Under torchrun / accelerate one process prepares
(`main_process_first`) and the others then find the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .data import DataError, iter_hub_pairs, iter_kept_pairs, local_source_files, tokenize_batch

# Bumped when what a stage writes changes, so that old caches are not reused.
FORMAT_VERSION = 1


@dataclass
class ReadSplit:
    """One split read into Arrow: ``source`` / ``target`` strings of every non-empty pair."""

    dataset: Any
    key: str
    origin: str
    dropped_empty: int
    reused: bool
    seconds: float
    bpe_seconds: float = 0.0  # set when a joint BPE is trained on (or reused for) this split

    def __len__(self) -> int:
        return len(self.dataset)


@dataclass
class TokenizedSplit:
    """One split tokenized into Arrow (``input_ids``, ``attention_mask``, ``labels``, ``length``)."""

    dataset: Any
    read: ReadSplit
    dropped_length: int
    reused: bool
    seconds: float

    def __len__(self) -> int:
        return len(self.dataset)


def cache_root() -> Path:
    """``<datasets cache>/hf_deepnmt``: where the prepared corpora live (``HF_DATASETS_CACHE`` moves it)."""
    import datasets

    return Path(datasets.config.HF_DATASETS_CACHE) / "hf_deepnmt"


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps([FORMAT_VERSION, *parts], sort_keys=True, default=str).encode()).hexdigest()[:24]


def source_key(path: str | None, dataset_name: str | None, dataset_config: str | None, split: str, source_lang: str,
               target_lang: str, max_samples: int | None) -> str:
    """The reading key: a local file by its absolute path, size and modification time; a Hub corpus by its name."""
    if path is not None:
        files = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns)
                 for f in local_source_files(Path(path), source_lang, target_lang)]
        return _key("file", files, source_lang, target_lang, max_samples)
    return _key("hub", dataset_name, dataset_config, split, source_lang, target_lang, max_samples)


def _load_files(files: list[str]) -> Any:
    import datasets

    parts = [datasets.Dataset.from_file(name) for name in files]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _stored(folder: Path) -> dict[str, Any] | None:
    """A completed stage's record (its Arrow files and counts), or None when the folder is not complete."""
    try:
        record = json.loads((folder / "complete.json").read_text())
    except (OSError, ValueError):
        return None
    return record if all(Path(name).is_file() for name in record["files"]) else None


def _complete(folder: Path, dataset: Any, **counts: Any) -> None:
    record = {"files": [entry["filename"] for entry in dataset.cache_files], **counts}
    staged = folder / f".complete-{os.getpid()}.json"
    staged.write_text(json.dumps(record))
    os.replace(staged, folder / "complete.json")


def _pair_rows(path: str, source_lang: str, target_lang: str, max_samples: int | None,
               counts_file: str) -> Iterator[dict[str, str]]:
    """The rows of `Dataset.from_generator`: `hf_deepnmt_training.data.iter_kept_pairs`; the empty-side count goes to a file."""
    counts: dict[str, int] = {}
    for source, target in iter_kept_pairs(Path(path), source_lang, target_lang, max_samples, counts):
        yield {"source": source, "target": target}
    Path(counts_file).write_text(json.dumps(counts))


def prepare_pairs(args: Any, split: str, path: str | None, max_samples: int | None,
                  log: bool = True) -> tuple[Any, str, dict[str, Any], bool]:
    """``(dataset of source/target strings, key, counts, reused)`` for one split (see the module docstring)."""
    import datasets
    from datasets.exceptions import DatasetGenerationError

    key = source_key(path, args.dataset_name, args.dataset_config_name, split, args.source_lang, args.target_lang,
                     max_samples)
    folder = cache_root() / f"pairs-{key}"
    stored = _stored(folder)
    if stored is not None:
        if log:
            print(f"[deepnmt] {split}: reusing the prepared pairs of {path or args.dataset_name} ({folder})",
                  file=sys.stderr)
        return _load_files(stored["files"]), key, stored, True
    folder.mkdir(parents=True, exist_ok=True)
    features = datasets.Features({"source": datasets.Value("string"), "target": datasets.Value("string")})
    if path is not None:
        counts_file = folder / "counts.json"
        try:
            dataset = datasets.Dataset.from_generator(
                _pair_rows, features=features, cache_dir=str(folder / "builder"), fingerprint=key,
                gen_kwargs={"path": str(path), "source_lang": args.source_lang, "target_lang": args.target_lang,
                            "max_samples": max_samples, "counts_file": str(counts_file)})
        except DatasetGenerationError as error:  # datasets wraps the reader's one-sentence error: unwrap it
            if isinstance(error.__cause__, DataError):
                raise error.__cause__ from None
            raise
        counts = json.loads(counts_file.read_text())
    else:
        raw = datasets.load_dataset(args.dataset_name, args.dataset_config_name, split=split)
        dataset = iter_hub_pairs(raw, args.source_lang, args.target_lang, max_samples, str(folder / "pairs.arrow"))
        counts = {"dropped_empty": min(len(raw), max_samples or len(raw)) - len(dataset)}
    _complete(folder, dataset, **counts)
    return dataset, key, {"files": [], **counts}, False


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What identifies a tokenizer's ids: a fast tokenizer's ``tokenizer.json``; for a slow one (a converted
    OPUS-MT's MarianTokenizer, a converted fairseq model's FairseqMosesBPETokenizer) its class and the files
    ``save_pretrained`` writes (sentencepiece models, vocabularies, merges, settings)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return hashlib.sha256(backend.to_str().encode()).hexdigest()
    import tempfile

    digest = hashlib.sha256(type(tokenizer).__name__.encode())
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        for path in sorted(Path(folder).iterdir()):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def tokenize_pairs(pairs: Any, key: str, tokenizer: Any, max_source_length: int, max_target_length: int,
                   filter_max_length: int | None, filter_max_ratio: float | None, source_prefix: str | None,
                   num_proc: int | None = None, split: str = "train") -> tuple[Any, bool]:
    """``(tokenized dataset, reused)``: ``input_ids``, ``attention_mask``, ``labels``, ``length`` of every pair the
    length filters keep, truncated to the maximum lengths (`hf_deepnmt_training.data.tokenize_corpus`'s rules)."""
    options = dict(max_source_length=max_source_length, max_target_length=max_target_length,
                   filter_max_length=filter_max_length, filter_max_ratio=filter_max_ratio, source_prefix=source_prefix)
    folder = cache_root() / f"tokens-{_key(key, tokenizer_fingerprint(tokenizer), options)}"
    stored = _stored(folder)
    if stored is not None:
        print(f"[deepnmt] {split}: reusing the tokenized corpus ({folder})", file=sys.stderr)
        return _load_files(stored["files"]), True
    folder.mkdir(parents=True, exist_ok=True)
    workers = num_proc if num_proc and num_proc > 1 and len(pairs) >= 10_000 else None
    dataset = pairs.map(
        tokenize_batch, batched=True, batch_size=1000, num_proc=workers, remove_columns=["source", "target"],
        fn_kwargs={"tokenizer": tokenizer, **options}, cache_file_name=str(folder / "tokens.arrow"),
        load_from_cache_file=False, desc=f"tokenizing {split}")
    _complete(folder, dataset)
    return dataset, False


def read_split(args: Any, split: str, path: str | None, max_samples: int | None, training_args: Any) -> ReadSplit:
    """Read one split (a local file or ``--dataset_name``) into Arrow, once: under torchrun / accelerate the main
    process reads and the others find the cache (`main_process_first`)."""
    with training_args.main_process_first(desc=f"reading {split}"):
        started = time.time()
        pairs, key, counts, reused = prepare_pairs(args, split, path, max_samples)
    origin = str(path) if path is not None else f"{args.dataset_name}/{args.dataset_config_name or ''}:{split}"
    return ReadSplit(pairs, key, origin, counts.get("dropped_empty", 0), reused, round(time.time() - started, 1))


def tokenize_split(read: ReadSplit, tokenizer: Any, args: Any, training_args: Any, split: str,
                   filters: bool) -> TokenizedSplit:
    """Tokenize one read split, once (`main_process_first`); the length filters apply when ``filters`` (training)."""
    limit = args.max_target_length if split == "train" else (args.val_max_target_length or args.max_target_length)
    with training_args.main_process_first(desc=f"tokenizing {split}"):
        started = time.time()
        dataset, reused = tokenize_pairs(
            read.dataset, read.key, tokenizer, args.max_source_length, limit,
            args.filter_max_length if filters else None, args.filter_max_ratio if filters else None,
            args.source_prefix, args.preprocessing_num_workers, split)
    if len(dataset) == 0:
        raise DataError(f"{read.origin}: every pair was removed by the length filters.")
    return TokenizedSplit(dataset, read, len(read) - len(dataset), reused, round(time.time() - started, 1))


def bpe_folder(read: ReadSplit, **options: Any) -> Path:
    """Where the joint BPE trained on ``read`` with ``options`` (vocabulary, frequency, sample, …) is kept."""
    return cache_root() / f"bpe-{_key(read.key, options)}"


def bpe_texts(read: ReadSplit, sample_pairs: int, seed: int) -> tuple[Iterator[str], int]:
    """The sentences a joint BPE is trained on: every pair in corpus order when the corpus has at most
    ``sample_pairs`` pairs, else a seeded random sample of ``sample_pairs`` pairs (read in corpus order);
    ``(source, target, source, …)`` and the number of pairs."""
    import numpy as np

    dataset = read.dataset
    if len(dataset) > sample_pairs:
        rows = np.sort(np.random.default_rng(seed).choice(len(dataset), size=sample_pairs, replace=False))
        dataset = dataset.select(rows)

    def texts() -> Iterator[str]:
        for batch in dataset.iter(batch_size=10_000):
            for source, target in zip(batch["source"], batch["target"]):
                yield source
                yield target

    return texts(), len(dataset)
