r"""Parallel data: loading (Hub datasets or local files), cleaning, tokenization and token-budget batching.

Local formats (chosen by file name; ``.gz`` is read transparently):

* ``*.jsonl`` / ``*.json`` — transformers' run_translation format, one ``{"translation": {"en": …, "es": …}}`` per
  line (a ``.json`` file may also hold one JSON list of such records);
* ``*.tsv`` — ``source<TAB>target`` per line;
* two aligned plain-text files given by their common prefix (fairseq style): ``--train_file data/train`` with
  ``--source_lang en --target_lang es`` reads ``data/train.en`` and ``data/train.es``.

Lines end at ``\n``, ``\r\n`` or ``\r``; other Unicode separators (``\f``, U+2028, …) are part of the sentence. Every
malformed record is reported with its file and line. Each side is whitespace-normalised (runs of Unicode whitespace
become one space, the ends are trimmed); pairs with an empty side are dropped (and counted).

Batching follows fairseq's ``--max-tokens``: examples are sorted by length (ties broken randomly), cut into
batches whose padded size ``max_len × n`` stays under the budget, and the batches are shuffled; deterministic for
a given seed and epoch.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
from torch.utils.data import Sampler

from hf_deepnmt.errors import UserInputError

SPLITS: tuple[str, ...] = ("train", "validation", "test")


class DataError(UserInputError):
    """A problem with the user's data, stated in one sentence that names the file and line."""


@dataclass
class ParallelCorpus:
    """Aligned source/target sentences of one split, with what cleaning removed."""

    sources: list[str]
    targets: list[str]
    origin: str
    dropped_empty: int = 0
    dropped_length: int = 0

    def __len__(self) -> int:
        return len(self.sources)


# ------------------------------------------------------------------------------------------------ reading
def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    r"""``(line number, text)`` of every line of a file, streamed (``.gz`` decompressed on the fly), as Python's text
    mode and editors see them: each line ends at ``\n``, ``\r\n`` or ``\r``. Not ``str.splitlines()``, which also
    breaks at ``\v``, ``\f``, ``\x1c``-``\x1e``, ``\x85``, ``\u2028`` and ``\u2029``: characters found inside
    sentences of crawled text, and left unescaped in JSON strings by ``json.dumps(..., ensure_ascii=False)``. A file
    that is not gzip or not UTF-8 is named with the line."""
    number = 0
    try:
        with _open_binary(path) as handle:
            for chunk in handle:  # split at b"\n" only
                if chunk.endswith(b"\n"):
                    chunk = chunk[:-1]
                if chunk.endswith(b"\r"):
                    chunk = chunk[:-1]  # \r\n, or a last line ending in a lone \r
                for piece in chunk.split(b"\r"):  # a lone \r inside ends a line too
                    number += 1
                    try:
                        yield number, piece.decode("utf-8")
                    except UnicodeDecodeError as error:
                        raise DataError(f"{path} line {number}: not UTF-8 text (byte 0x{piece[error.start]:02x}); "
                                        "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise DataError(f"{path} is not a complete gzip file, though its name ends in .gz ({error}).") from None


def _read_text(path: Path) -> str:
    """The whole file as text (only for a file holding one JSON list, which must be parsed whole)."""
    return "\n".join(line for _, line in _iter_lines(path))


def _starts_with_list(path: Path) -> bool:
    """Whether the file's first non-blank character is ``[`` (one JSON list of records, or JSON lines of lists)."""
    for _, line in _iter_lines(path):
        if line.strip():
            return line.lstrip().startswith("[")
    return False


def _lines(text: str) -> list[str]:
    r"""The lines of a text file as Python's text mode and editors see them: each ends at ``\n``, ``\r\n`` or
    ``\r``. Not ``str.splitlines()``, which also breaks at ``\v``, ``\f``, ``\x1c``-``\x1e``, ``\x85``,
    ``\u2028`` and ``\u2029``: characters found inside sentences of crawled text, and left unescaped in JSON
    strings by ``json.dumps(..., ensure_ascii=False)``."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":  # the last line's terminator (or an empty file)
        lines.pop()
    return lines


def _base_suffix(path: Path) -> str:
    return Path(path.stem).suffix if path.suffix == ".gz" else path.suffix


def _record_pair(record: Any, where: str, source_lang: str, target_lang: str) -> tuple[str, str]:
    if not isinstance(record, dict) or not isinstance(record.get("translation"), dict):
        raise DataError(f"{where}: expected an object with a 'translation' mapping, got {str(record)[:80]!r}.")
    translation = record["translation"]
    for lang in (source_lang, target_lang):
        if lang not in translation:
            found = ", ".join(sorted(translation)) or "nothing"
            raise DataError(f"{where}: no {lang!r} in 'translation' (found: {found}).")
        if not isinstance(translation[lang], str):
            raise DataError(f"{where}: 'translation.{lang}' must be a string, got {type(translation[lang]).__name__}.")
        try:  # JSON can escape half of a UTF-16 pair ("\ud83d"): a str that no tokenizer can encode
            translation[lang].encode("utf-8")
        except UnicodeEncodeError as error:
            raise DataError(f"{where}: 'translation.{lang}' holds the lone surrogate "
                            f"{ascii(error.object[error.start])[1:-1]} (half of a UTF-16 pair), which is not text; "
                            "repair or drop the record.") from None
    return translation[source_lang], translation[target_lang]


def _read_json_records(path: Path, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    if _starts_with_list(path):  # one JSON list of records: parsed whole
        text = _read_text(path)
        try:
            records = json.loads(text)
        except json.JSONDecodeError as error:
            # More values after a first one that fills one line: JSON lines (whose first record is a list); read
            # below, line by line, so that the first bad record is the one reported.
            one_line_first = error.msg == "Extra data" and len(_lines(text[: error.pos].strip())) == 1
            if not one_line_first:
                raise DataError(f"{path} line {error.lineno}: not valid JSON ({error.msg}).") from None
        except RecursionError:
            raise DataError(f"{path}: not valid JSON (nested too deeply).") from None
        else:
            for index, record in enumerate(records):
                yield _record_pair(record, f"{path} record {index + 1}", source_lang, target_lang)
            return
    empty = True
    for number, line in _iter_lines(path):  # JSON lines, streamed
        if not line.strip():
            continue
        empty = False
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path} line {number}: not valid JSON ({error.msg}).") from None
        except RecursionError:
            raise DataError(f"{path} line {number}: not valid JSON (nested too deeply).") from None
        yield _record_pair(record, f"{path} line {number}", source_lang, target_lang)
    if empty:
        raise DataError(f"{path} is empty.")


def _read_tsv(path: Path) -> Iterator[tuple[str, str]]:
    empty = True
    for number, line in _iter_lines(path):
        if not line:
            continue
        empty = False
        columns = line.split("\t")
        if len(columns) != 2:
            raise DataError(f"{path} line {number}: expected 2 tab-separated columns, found {len(columns)}.")
        yield columns[0], columns[1]
    if empty:
        raise DataError(f"{path} is empty.")


def _read_aligned_text(prefix: Path, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    source_path = _find_side(prefix, source_lang)
    target_path = _find_side(prefix, target_lang)
    sources, targets = _iter_lines(source_path), _iter_lines(target_path)
    count = 0
    for count, (source, target) in enumerate(itertools.zip_longest(sources, targets), start=1):
        if source is None or target is None:  # one file ended first: count the other's remaining lines
            longer = targets if source is None else sources
            rest = 1 + sum(1 for _ in longer)
            lengths = (count - 1, count - 1 + rest) if source is None else (count - 1 + rest, count - 1)
            raise DataError(f"{source_path} has {lengths[0]} lines but {target_path} has {lengths[1]}; they must "
                            "align.")
        yield source[1], target[1]
    if count == 0:
        raise DataError(f"{source_path} is empty.")


def _find_side(prefix: Path, lang: str) -> Path:
    if _base_suffix(prefix) in (".jsonl", ".json", ".tsv"):  # a data file's name, not a prefix
        raise DataError(f"{prefix} does not exist.")
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.exists():
            return candidate
    raise DataError(f"{prefix}.{lang} does not exist (two aligned text files are read as PREFIX.{lang}).")


def local_source_files(path: Path, source_lang: str, target_lang: str) -> list[Path]:
    """The file(s) a local split is read from: the file itself, or ``PREFIX.<src>`` and ``PREFIX.<tgt>``."""
    if path.exists():
        if path.is_dir():
            raise DataError(f"{path} is a directory; give a file (or a PREFIX of PREFIX.{source_lang}/.{target_lang}).")
        return [path]
    return [_find_side(path, source_lang), _find_side(path, target_lang)]


def iter_local_pairs(path: Path, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    """Every pair of a local split in any supported format, streamed, each side whitespace-normalised (runs of
    Unicode whitespace become one space, the ends trimmed); a side may be empty (the caller drops and counts those)."""
    if path.exists() and not path.is_dir():
        suffix = _base_suffix(path)
        if suffix in (".jsonl", ".json"):
            pairs = _read_json_records(path, source_lang, target_lang)
        elif suffix == ".tsv":
            pairs = _read_tsv(path)
        else:
            raise DataError(
                f"{path}: unknown format {suffix!r}; use .jsonl/.json (run_translation), .tsv, or a prefix of two "
                f"aligned text files PREFIX.{source_lang} and PREFIX.{target_lang}."
            )
    else:
        local_source_files(path, source_lang, target_lang)  # a directory or a missing PREFIX.<lang> is named
        pairs = _read_aligned_text(path, source_lang, target_lang)
    for source, target in pairs:
        yield " ".join(source.split()), " ".join(target.split())


def iter_kept_pairs(path: str | os.PathLike, source_lang: str, target_lang: str, max_samples: int | None = None,
                    counts: dict[str, int] | None = None) -> Iterator[tuple[str, str]]:
    """The pairs of a local split that training keeps: `iter_local_pairs` without the pairs with an empty side
    (counted in ``counts["dropped_empty"]``), at most ``max_samples``; a split with none left is an error."""
    path = Path(path)
    counts = {} if counts is None else counts
    counts["dropped_empty"] = 0
    kept = 0
    for source, target in iter_local_pairs(path, source_lang, target_lang):
        if not source or not target:
            counts["dropped_empty"] += 1
            continue
        yield source, target
        kept += 1
        if max_samples is not None and kept >= max_samples:
            return
    if not kept:
        raise DataError(f"{path} has no sentence pair with both sides non-empty.")


def read_parallel_file(
    path: str | os.PathLike, source_lang: str, target_lang: str, max_samples: int | None = None
) -> ParallelCorpus:
    """Read one local split into memory (test sets, `deepnmt evaluate` / `translate`; training data goes through
    `hf_deepnmt_training.preprocess`): `iter_kept_pairs` into lists."""
    counts: dict[str, int] = {}
    pairs = list(iter_kept_pairs(path, source_lang, target_lang, max_samples, counts))
    return ParallelCorpus([source for source, _ in pairs], [target for _, target in pairs], origin=str(Path(path)),
                          dropped_empty=counts["dropped_empty"])


def load_hub_dataset(
    name: str, config_name: str | None, source_lang: str, target_lang: str, split: str,
    max_samples: int | None = None,
) -> ParallelCorpus:
    """A `datasets` corpus in the run_translation layout (a ``translation`` column), e.g. ``wmt14`` / ``de-en``, read
    into memory (small splits; training data goes through `hf_deepnmt_training.preprocess`)."""
    import datasets

    dataset = datasets.load_dataset(name, config_name, split=split)
    pairs = iter_hub_pairs(dataset, source_lang, target_lang, max_samples)
    corpus = ParallelCorpus(pairs["source"], pairs["target"], origin=f"{name}/{config_name or ''}:{split}")
    corpus.dropped_empty = min(len(dataset), max_samples or len(dataset)) - len(pairs)
    return corpus


def iter_hub_pairs(dataset: Any, source_lang: str, target_lang: str, max_samples: int | None = None,
                   cache_file: str | None = None) -> Any:
    """A run_translation-layout `datasets.Dataset` as ``source`` / ``target`` columns (normalised like a local file,
    pairs with an empty side dropped), by a batched `map` written to ``cache_file`` (Arrow, memory-mapped)."""
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    origin = getattr(dataset, "info", None) and dataset.info.dataset_name or "dataset"

    def normalise(batch: dict[str, list], indices: list[int]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {"source": [], "target": []}
        for index, translation in zip(indices, batch["translation"]):
            source, target = _record_pair({"translation": translation}, f"{origin} record {index}", source_lang,
                                          target_lang)
            source, target = " ".join(source.split()), " ".join(target.split())
            if source and target:
                out["source"].append(source)
                out["target"].append(target)
        return out

    return dataset.map(normalise, batched=True, with_indices=True, remove_columns=dataset.column_names,
                       cache_file_name=cache_file, desc="reading pairs")


# ------------------------------------------------------------------------------------------------ arguments
@dataclass
class DataArguments:
    """Data options; names follow transformers' examples/pytorch/translation/run_translation.py."""

    source_lang: str = field(default="en", metadata={"help": "Source language code (key in the 'translation' records)."})
    target_lang: str = field(default="es", metadata={"help": "Target language code."})
    dataset_name: str | None = field(default=None, metadata={"help": "A `datasets` corpus on the Hub, e.g. wmt14."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration, e.g. de-en."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: .jsonl/.json/.tsv or a PREFIX of PREFIX.<lang> files."})
    validation_file: str | None = field(default=None, metadata={"help": "Validation data (same formats)."})
    test_file: str | None = field(default=None, metadata={"help": "Test data (same formats)."})
    max_source_length: int = field(default=256, metadata={"help": "Truncate sources to this many tokens (</s> included)."})
    max_target_length: int = field(default=256, metadata={"help": "Truncate targets to this many tokens."})
    val_max_target_length: int | None = field(default=None, metadata={"help": "Target truncation for evaluation (default: max_target_length)."})
    filter_max_length: int | None = field(default=None, metadata={"help": "Drop training pairs longer than this many tokens on either side (instead of truncating them)."})
    filter_max_ratio: float | None = field(default=None, metadata={"help": "Drop training pairs whose token-length ratio exceeds this (e.g. 3.0)."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only the first N test pairs."})
    max_tokens: int | None = field(default=None, metadata={"help": "Token-budget batching (fairseq --max-tokens): padded tokens per training batch per device; replaces per_device_train_batch_size."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    source_prefix: str | None = field(default=None, metadata={"help": "Text prepended to every source (e.g. a language tag)."})

    def __post_init__(self) -> None:
        for name in ("max_source_length", "max_target_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 2:
                raise UserInputError(f"`--{name}` = {value!r} is not allowed; use an integer ≥ 2 (room for a token and </s>).")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise UserInputError(f"`--max_tokens` = {self.max_tokens!r} is not allowed; use a positive integer.")
        if self.filter_max_ratio is not None and self.filter_max_ratio < 1.0:
            raise UserInputError(f"`--filter_max_ratio` = {self.filter_max_ratio!r} is not allowed; use a number ≥ 1.")
        if self.source_lang == self.target_lang:
            raise UserInputError(f"`--target_lang` = {self.target_lang!r} is not allowed; it must differ from --source_lang.")

    def split_file(self, split: str) -> str | None:
        return {"train": self.train_file, "validation": self.validation_file, "test": self.test_file}[split]


def load_splits(args: DataArguments, splits: Sequence[str] = SPLITS) -> dict[str, ParallelCorpus]:
    """Read the requested splits from local files (preferred when given) or from ``--dataset_name``."""
    limits = {"train": args.max_train_samples, "validation": args.max_eval_samples, "test": args.max_predict_samples}
    corpora: dict[str, ParallelCorpus] = {}
    for split in splits:
        path = args.split_file(split)
        if path is not None:
            corpora[split] = read_parallel_file(path, args.source_lang, args.target_lang, limits[split])
        elif args.dataset_name is not None:
            corpora[split] = load_hub_dataset(args.dataset_name, args.dataset_config_name, args.source_lang,
                                              args.target_lang, split, limits[split])
    return corpora


# ------------------------------------------------------------------------------------------------ tokenization
def encode_pair_ids(source_ids: list[int], target_ids: list[int], eos: int, max_source_length: int,
                    max_target_length: int, filter_max_length: int | None = None,
                    filter_max_ratio: float | None = None) -> dict[str, Any] | None:
    """The training example of one tokenized pair, or None when a length filter drops it: a pair longer than
    ``filter_max_length`` on either side, or whose token-length ratio exceeds ``filter_max_ratio``, is dropped;
    whatever remains is truncated to the maximum lengths (keeping ``</s>`` last). ``length`` = the longer side, for
    batching. The one rule of both data paths (`tokenize_corpus`, `hf_deepnmt_training.preprocess`)."""
    longest, shortest = max(len(source_ids), len(target_ids)), min(len(source_ids), len(target_ids))
    if filter_max_length is not None and longest > filter_max_length:
        return None
    if filter_max_ratio is not None and longest > filter_max_ratio * shortest:
        return None
    if len(source_ids) > max_source_length:
        source_ids = source_ids[: max_source_length - 1] + [eos]
    if len(target_ids) > max_target_length:
        target_ids = target_ids[: max_target_length - 1] + [eos]
    return {"input_ids": source_ids, "attention_mask": [1] * len(source_ids), "labels": target_ids,
            "length": max(len(source_ids), len(target_ids))}


def tokenize_batch(batch: dict[str, list[str]], tokenizer: Any, max_source_length: int, max_target_length: int,
                   filter_max_length: int | None = None, filter_max_ratio: float | None = None,
                   source_prefix: str | None = None) -> dict[str, list]:
    """One batch of ``source`` / ``target`` strings -> the ``input_ids``, ``attention_mask``, ``labels`` and
    ``length`` columns of the pairs the length filters keep (`encode_pair_ids`; rows may be dropped). The batched
    `Dataset.map` function of `hf_deepnmt_training.preprocess`."""
    sources = [source_prefix + s for s in batch["source"]] if source_prefix else batch["source"]
    # verbose=False: over-long pairs are filtered or truncated right below, not an error.
    source_ids = tokenizer(sources, add_special_tokens=True, verbose=False)["input_ids"]
    target_ids = tokenizer(text_target=batch["target"], add_special_tokens=True, verbose=False)["input_ids"]
    columns: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "length": []}
    for src, tgt in zip(source_ids, target_ids):
        example = encode_pair_ids(src, tgt, tokenizer.eos_token_id, max_source_length, max_target_length,
                                  filter_max_length, filter_max_ratio)
        if example is not None:
            for name, value in example.items():
                columns[name].append(value)
    return columns


def tokenize_corpus(
    corpus: ParallelCorpus,
    tokenizer: Any,
    max_source_length: int,
    max_target_length: int,
    filter_max_length: int | None = None,
    filter_max_ratio: float | None = None,
    source_prefix: str | None = None,
) -> Any:
    """Tokenize an in-memory corpus into a `datasets.Dataset` (`tokenize_batch`; the pairs the filters drop are
    counted in ``corpus.dropped_length``). For small corpora and tests; `deepnmt train` prepares its data with
    `hf_deepnmt_training.preprocess` (Arrow, cached)."""
    import datasets

    columns = tokenize_batch({"source": corpus.sources, "target": corpus.targets}, tokenizer, max_source_length,
                             max_target_length, filter_max_length, filter_max_ratio, source_prefix)
    corpus.dropped_length += len(corpus) - len(columns["input_ids"])
    if not columns["input_ids"]:
        raise DataError(f"{corpus.origin}: every pair was removed by the length filters.")
    return datasets.Dataset.from_dict(columns)


# ------------------------------------------------------------------------------------------------ batching
def length_column(dataset: Any) -> np.ndarray:
    """The ``length`` column of a tokenized dataset as one int32 numpy array (4 bytes per pair), read from Arrow in
    one slice: indexing the column instead builds a Python object per row (130 s for 3M rows on this machine)."""
    return np.asarray(dataset.with_format("numpy", columns=["length"])[:]["length"], dtype=np.int32)


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """fairseq-style ``--max-tokens`` batches: each batch's padded size ``max_len × n`` is ≤ ``max_tokens``.

    Per epoch: indices are sorted by length with a seeded random tie-break, cut greedily into batches, and the
    batches are shuffled with ``np.random.default_rng((seed, epoch))``. The batch boundaries depend only on the
    lengths, so ``len()`` is the same every epoch. A single example longer than the budget gets a batch alone.
    ``lengths`` is kept as one int32 numpy array and an epoch's order as another (a few bytes per pair: a corpus of
    millions of pairs is batched without a Python object per example); a batch becomes a list only when yielded.
    """

    def __init__(self, lengths: Sequence[int] | np.ndarray, max_tokens: int, seed: int = 0, shuffle: bool = True):
        if max_tokens < 1:
            raise DataError(f"TokenBudgetBatchSampler: `max_tokens` = {max_tokens!r} is not allowed; use ≥ 1.")
        self.lengths = np.asarray(lengths, dtype=np.int32)
        self.max_tokens = int(max_tokens)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0  # the epoch the next pass uses; set_epoch() overrides it
        self._num_batches = len(self._boundaries(np.argsort(self.lengths, kind="stable"))) - 1

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _boundaries(self, order: np.ndarray) -> np.ndarray:
        """Where the greedy cut of ``order`` (ascending lengths) starts each batch, plus the end: ``(batches + 1,)``.
        A batch grows while its longest length × size stays within the budget."""
        sorted_lengths = self.lengths[order].tolist()
        starts, size, longest = [0], 0, 0
        for position, length in enumerate(sorted_lengths):
            if size and max(longest, length) * (size + 1) > self.max_tokens:
                starts.append(position)
                size, longest = 0, 0
            size += 1
            longest = max(longest, length)
        starts.append(len(sorted_lengths))
        return np.asarray(starts, dtype=np.int64)

    def _epoch_plan(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(order, boundaries, batch order)`` of one epoch (deterministic in ``seed`` and ``epoch``)."""
        rng = np.random.default_rng((self.seed, epoch))
        if self.shuffle:
            tie_break = rng.permutation(len(self.lengths))
            order = tie_break[np.argsort(self.lengths[tie_break], kind="stable")]
        else:
            order = np.argsort(self.lengths, kind="stable")
        boundaries = self._boundaries(order)
        batches = len(boundaries) - 1
        return order, boundaries, rng.permutation(batches) if self.shuffle else np.arange(batches)

    def batches_for_epoch(self, epoch: int) -> list[list[int]]:
        """The batches of one epoch, in order (deterministic in ``seed`` and ``epoch``)."""
        return list(self._iter_epoch(epoch))

    def _iter_epoch(self, epoch: int) -> Iterator[list[int]]:
        order, boundaries, batch_order = self._epoch_plan(epoch)
        for batch in batch_order:
            yield order[boundaries[batch]:boundaries[batch + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        self.epoch += 1  # without a set_epoch() call, the next pass is the next epoch
        return self._iter_epoch(epoch)

    def __len__(self) -> int:
        return self._num_batches
