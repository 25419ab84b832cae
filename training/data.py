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
import zlib
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Sampler

SPLITS: tuple[str, ...] = ("train", "validation", "test")


class DataError(ValueError):
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
def _read_text(path: Path) -> str:
    """The whole file as text (``.gz`` decompressed); a file that is not gzip or not UTF-8 is named with the line."""
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise DataError(f"{path} is not a complete gzip file, though its name ends in .gz ({error}).") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(f"{path} line {line}: not UTF-8 text (byte 0x{data[error.start]:02x}); convert the file to "
                        "UTF-8 (e.g. iconv -f latin1 -t utf-8).") from None


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
    text = _read_text(path)
    if not text.strip():
        raise DataError(f"{path} is empty.")
    if text.lstrip().startswith("["):  # one JSON list of records
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
    for number, line in enumerate(_lines(text), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(f"{path} line {number}: not valid JSON ({error.msg}).") from None
        except RecursionError:
            raise DataError(f"{path} line {number}: not valid JSON (nested too deeply).") from None
        yield _record_pair(record, f"{path} line {number}", source_lang, target_lang)


def _read_tsv(path: Path) -> Iterator[tuple[str, str]]:
    empty = True
    for number, line in enumerate(_lines(_read_text(path)), start=1):
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
    sources, targets = _lines(_read_text(source_path)), _lines(_read_text(target_path))
    if not sources:
        raise DataError(f"{source_path} is empty.")
    if len(sources) != len(targets):
        raise DataError(f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}; they must align.")
    yield from zip(sources, targets)


def _find_side(prefix: Path, lang: str) -> Path:
    if _base_suffix(prefix) in (".jsonl", ".json", ".tsv"):  # a data file's name, not a prefix
        raise DataError(f"{prefix} does not exist.")
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.exists():
            return candidate
    raise DataError(f"{prefix}.{lang} does not exist (two aligned text files are read as PREFIX.{lang}).")


def read_parallel_file(
    path: str | os.PathLike, source_lang: str, target_lang: str, max_samples: int | None = None
) -> ParallelCorpus:
    """Read one local split in any supported format, drop pairs with an empty side, keep at most ``max_samples``."""
    path = Path(path)
    if path.exists():
        if path.is_dir():
            raise DataError(f"{path} is a directory; give a file (or a PREFIX of PREFIX.{source_lang}/.{target_lang}).")
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
        pairs = _read_aligned_text(path, source_lang, target_lang)
    corpus = ParallelCorpus([], [], origin=str(path))
    for source, target in pairs:
        source, target = " ".join(source.split()), " ".join(target.split())
        if not source or not target:
            corpus.dropped_empty += 1
            continue
        corpus.sources.append(source)
        corpus.targets.append(target)
        if max_samples is not None and len(corpus) >= max_samples:
            break
    if not corpus.sources:
        raise DataError(f"{path} has no sentence pair with both sides non-empty.")
    return corpus


def load_hub_dataset(
    name: str, config_name: str | None, source_lang: str, target_lang: str, split: str,
    max_samples: int | None = None,
) -> ParallelCorpus:
    """A `datasets` corpus in the run_translation layout (a ``translation`` column), e.g. ``wmt14`` / ``de-en``."""
    import datasets

    hub_split = {"validation": "validation", "test": "test", "train": "train"}[split]
    dataset = datasets.load_dataset(name, config_name, split=hub_split)
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    corpus = ParallelCorpus([], [], origin=f"{name}/{config_name or ''}:{hub_split}")
    for index, record in enumerate(dataset):
        source, target = _record_pair(record, f"{corpus.origin} record {index}", source_lang, target_lang)
        source, target = " ".join(source.split()), " ".join(target.split())
        if source and target:
            corpus.sources.append(source)
            corpus.targets.append(target)
        else:
            corpus.dropped_empty += 1
    return corpus


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
                raise ValueError(f"`--{name}` = {value!r} is not allowed; use an integer ≥ 2 (room for a token and </s>).")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"`--max_tokens` = {self.max_tokens!r} is not allowed; use a positive integer.")
        if self.filter_max_ratio is not None and self.filter_max_ratio < 1.0:
            raise ValueError(f"`--filter_max_ratio` = {self.filter_max_ratio!r} is not allowed; use a number ≥ 1.")
        if self.source_lang == self.target_lang:
            raise ValueError(f"`--target_lang` = {self.target_lang!r} is not allowed; it must differ from --source_lang.")

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
def tokenize_corpus(
    corpus: ParallelCorpus,
    tokenizer: Any,
    max_source_length: int,
    max_target_length: int,
    filter_max_length: int | None = None,
    filter_max_ratio: float | None = None,
    source_prefix: str | None = None,
) -> Any:
    """Tokenize a corpus into a `datasets.Dataset` with ``input_ids``, ``attention_mask``, ``labels`` and
    ``length`` (max of source and target tokens, for batching). Over-long pairs are dropped by the filters
    (counted in ``corpus.dropped_length``) and whatever remains is truncated to the maximum lengths."""
    import datasets

    sources = [source_prefix + s for s in corpus.sources] if source_prefix else corpus.sources
    # verbose=False: over-long pairs are filtered or truncated right below, not an error.
    source_ids = tokenizer(sources, add_special_tokens=True, verbose=False)["input_ids"]
    target_ids = tokenizer(text_target=corpus.targets, add_special_tokens=True, verbose=False)["input_ids"]
    eos = tokenizer.eos_token_id
    columns: dict[str, list] = {"input_ids": [], "attention_mask": [], "labels": [], "length": []}
    for src, tgt in zip(source_ids, target_ids):
        if filter_max_length is not None and max(len(src), len(tgt)) > filter_max_length:
            corpus.dropped_length += 1
            continue
        if filter_max_ratio is not None and max(len(src), len(tgt)) > filter_max_ratio * min(len(src), len(tgt)):
            corpus.dropped_length += 1
            continue
        src = src if len(src) <= max_source_length else src[: max_source_length - 1] + [eos]
        tgt = tgt if len(tgt) <= max_target_length else tgt[: max_target_length - 1] + [eos]
        columns["input_ids"].append(src)
        columns["attention_mask"].append([1] * len(src))
        columns["labels"].append(tgt)
        columns["length"].append(max(len(src), len(tgt)))
    if not columns["input_ids"]:
        raise DataError(f"{corpus.origin}: every pair was removed by the length filters.")
    return datasets.Dataset.from_dict(columns)


# ------------------------------------------------------------------------------------------------ batching
class TokenBudgetBatchSampler(Sampler[list[int]]):
    """fairseq-style ``--max-tokens`` batches: each batch's padded size ``max_len × n`` is ≤ ``max_tokens``.

    Per epoch: indices are sorted by length with a seeded random tie-break, cut greedily into batches, and the
    batches are shuffled with ``np.random.default_rng((seed, epoch))``. The batch boundaries depend only on the
    lengths, so ``len()`` is the same every epoch. A single example longer than the budget gets a batch alone.
    """

    def __init__(self, lengths: Sequence[int], max_tokens: int, seed: int = 0, shuffle: bool = True):
        if max_tokens < 1:
            raise ValueError(f"TokenBudgetBatchSampler: `max_tokens` = {max_tokens!r} is not allowed; use ≥ 1.")
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.max_tokens = int(max_tokens)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.epoch = 0  # the epoch the next pass uses; set_epoch() overrides it
        self._num_batches = len(self._batches(np.argsort(self.lengths, kind="stable")))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _batches(self, order: np.ndarray) -> list[list[int]]:
        batches: list[list[int]] = []
        current: list[int] = []
        longest = 0
        for index in order.tolist():
            length = int(self.lengths[index])
            if current and max(longest, length) * (len(current) + 1) > self.max_tokens:
                batches.append(current)
                current, longest = [], 0
            current.append(index)
            longest = max(longest, length)
        if current:
            batches.append(current)
        return batches

    def batches_for_epoch(self, epoch: int) -> list[list[int]]:
        """The batches of one epoch, in order (deterministic in ``seed`` and ``epoch``)."""
        rng = np.random.default_rng((self.seed, epoch))
        if self.shuffle:
            tie_break = rng.permutation(len(self.lengths))
            order = tie_break[np.argsort(self.lengths[tie_break], kind="stable")]
        else:
            order = np.argsort(self.lengths, kind="stable")
        batches = self._batches(order)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        self.epoch += 1  # without a set_epoch() call, the next pass is the next epoch
        return iter(self.batches_for_epoch(epoch))

    def __len__(self) -> int:
        return self._num_batches

    def padded_tokens_per_batch(self) -> float:
        """Mean padded batch size in tokens (for logging)."""
        batches = self._batches(np.argsort(self.lengths, kind="stable"))
        return float(np.mean([max(int(self.lengths[i]) for i in b) * len(b) for b in batches])) if batches else math.nan
