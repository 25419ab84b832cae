"""Translating and scoring with a trained model: length-sorted batches, bounded-memory windows over a stream of lines,
resumable output files, BLEU/chrF/TER of a test file, and li2022's source reliance on a corpus. Used by `deepnmt
translate`, `deepnmt evaluate`, the end of `deepnmt train`, and the benchmarks.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_deepnmt  # noqa: F401  (registers the model types)
from hf_deepnmt import load_ensemble
from hf_deepnmt.errors import UserInputError
from hf_deepnmt.pipeline_translation import BUDGET_STEP, new_token_budget  # noqa: F401  (re-exported)

from .data import iter_local_pairs, read_parallel_file
from .errors import CommandLineError, hub_lookup
from .metrics import TranslationScores, score_translations
from .recipes import resolve_path


# A sentence ends at . ! ? … (and closing quotes or brackets after them) followed by white space, or at a CJK full
# stop, exclamation or question mark (no space follows those).
SENTENCE_END = re.compile(r"[.!?…]+[\"'”’»)\]]*\s+|[。！？]+[」』”’)）]*\s*")


def split_sentences(text: str) -> list[str]:
    """The sentences of ``text`` (`SENTENCE_END`), white space at their ends removed; empty ones dropped."""
    sentences, start = [], 0
    for match in SENTENCE_END.finditer(text):
        sentences.append(text[start:match.end()].strip())
        start = match.end()
    sentences.append(text[start:].strip())
    return [sentence for sentence in sentences if sentence]


@dataclass(frozen=True)
class LongInputSplit:
    """An input longer than the model accepts, cut into pieces that fit (`split_long_input`)."""

    pieces: list[str]
    """The pieces in input order, each within the model's limit."""
    inside_sentences: int
    """How many pieces were cut between the words (or, for a word longer than the limit, the characters) of one
    sentence: a token window of a sentence longer than the model accepts on its own."""


# How `split_long_input` cuts, coarsest first: sentences (joined by a space), words (joined by a space), characters.
_SPLIT_LEVELS: tuple[tuple[Callable[[str], list[str]], str], ...] = (
    (split_sentences, " "), (str.split, " "), (list, ""))


def split_long_input(text: str, fits: Callable[[str], bool]) -> LongInputSplit:
    """``text`` cut into as few pieces as fit (``fits(piece)``: the piece's tokens are within the model's limit):
    consecutive sentences are packed into one piece as long as it fits; a sentence that does not fit alone is cut
    between words into the longest windows that fit, and a word that does not fit alone between characters. Each
    piece is the longest that fits from where the previous one ended (a binary search over how many sentences,
    words or characters it takes), so a line of n tokens needs about n / limit pieces and a few tokenizer calls
    per piece (docs/training.md, "An input longer than the model accepts")."""
    pieces: list[tuple[str, int]] = []

    def cut(part: str, level: int) -> None:
        split, joiner = _SPLIT_LEVELS[level]
        units = split(part)
        start = 0
        while start < len(units):
            if level + 1 < len(_SPLIT_LEVELS) and not fits(units[start]):
                cut(units[start], level + 1)  # one unit longer than the limit: its words (or characters)
                start += 1
                continue
            low, high = start + 1, len(units)  # units[start:low] fits; find the longest run that does
            while low < high:
                middle = (low + high + 1) // 2
                if fits(joiner.join(units[start:middle])):
                    low = middle
                else:
                    high = middle - 1
            pieces.append((joiner.join(units[start:low]), level))
            start = low

    cut(text.strip(), 0)
    return LongInputSplit([piece for piece, _ in pieces], sum(1 for _, level in pieces if level > 0))


@torch.no_grad()
def translate_sentences(
    model,
    tokenizer,
    sentences: Sequence[str],
    num_beams: int = 4,
    batch_size: int = 32,
    max_new_tokens: int | None = None,
    progress: bool = True,
    desc: str = "translating",
    bf16: bool = False,
    search: str = "retiring",
    numbers: Sequence[int] | None = None,
    what: str = "line",
) -> list[str]:
    """Translate in length-sorted batches (original order restored); an empty line translates to "".

    Each sentence's translation is what it would be alone (up to float32 rounding at exact ties): its new-token
    budget is its own (`new_token_budget`, unless ``max_new_tokens`` sets one for all), and a batch only holds
    sentences of one budget, so neither ``batch_size`` nor the other sentences change a result — or, with
    ``search="retiring"`` (the default) and an engine that takes it (`TorchEngine.takes_budgets`: torch float32 and
    ONNX models of the package), a batch holds sentences of any budget, decoded in one search that retires each
    sentence once its result is final (`hf_deepnmt.retiring_search`: the same tokens as one call per budget).

    An input longer than the model accepts is never cut short: it is split into pieces that fit, at sentence ends
    and, for a sentence too long on its own, between words (`split_long_input`); the pieces are translated as
    sentences of their own and their translations joined by spaces, and one line on stderr names the input —
    ``what`` and its number in ``numbers`` (default 1, 2, … in ``sentences``' order) — its length and its pieces
    (docs/training.md, "An input longer than the model accepts").

    ``model`` is a PyTorch model (run with `generate`, under bf16 autocast with ``bf16``) or an engine of
    `hf_deepnmt.export.load_engine` (CTranslate2, ONNX Runtime): the batching and the output are the same.
    """
    from hf_deepnmt.export import TorchEngine

    engine = TorchEngine(model, bf16=bf16) if isinstance(model, torch.nn.Module) else model
    limit = min(tokenizer.model_max_length, engine.max_positions)
    if search not in ("retiring", "generate"):
        raise ValueError(f"search = {search!r} is not allowed; use 'retiring' or 'generate'.")
    owner, encoded = _encode_units(tokenizer, sentences, limit, numbers, what)
    budget = {u: max_new_tokens or new_token_budget(len(ids), limit) for u, ids in encoded.items()}
    mixed = (search == "retiring" and max_new_tokens is None and callable(getattr(engine, "takes_budgets", None))
             and engine.takes_budgets(num_beams))
    batches = _batches_by_budget(encoded, budget, batch_size, mixed)
    translated = _translate_batches(engine, tokenizer, batches, encoded, budget, num_beams, mixed, search,
                                    progress, desc)
    results = [""] * len(sentences)
    for i, group in itertools.groupby(range(len(owner)), key=owner.__getitem__):  # a sentence's units are adjacent
        results[i] = " ".join(text for text in (translated[u] for u in group) if text)
    return results


def _encode_units(tokenizer: Any, sentences: Sequence[str], limit: int, numbers: Sequence[int] | None,
                  what: str) -> tuple[list[int], dict[int, list[int]]]:
    """The token ids of each unit to translate — a non-empty sentence, or a piece of one longer than ``limit``
    (`split_long_input`, said on stderr) — and the sentence each unit belongs to."""
    from tqdm.auto import tqdm

    kept = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    whole = tokenizer([sentences[i] for i in kept], verbose=False)["input_ids"] if kept else []
    owner: list[int] = []  # the sentence of each unit translated: the sentence itself, or one piece of it
    encoded: dict[int, list[int]] = {}

    def fits(text: str) -> bool:
        return len(tokenizer(text, verbose=False)["input_ids"]) <= limit

    for i, ids in zip(kept, whole):
        if len(ids) <= limit:
            encoded[len(owner)] = ids
            owner.append(i)
            continue
        split = split_long_input(sentences[i], fits)
        for piece in split.pieces:  # truncation only guards a character longer than the limit, which no model has
            encoded[len(owner)] = tokenizer(piece, truncation=True, max_length=limit, verbose=False)["input_ids"]
            owner.append(i)
        number = numbers[i] if numbers is not None else i + 1
        windows = (f" and, inside a sentence longer than that, between words ({split.inside_sentences} of the "
                   "pieces)" if split.inside_sentences else "")
        tqdm.write(f"[deepnmt] {what} {number} has {len(ids)} tokens, more than the {limit} the model accepts: "
                   f"translated whole in {len(split.pieces)} pieces, cut at sentence ends{windows}, their "
                   "translations joined (docs/training.md, \"An input longer than the model accepts\")",
                   file=sys.stderr)
    return owner, encoded


def _batches_by_budget(encoded: dict[int, list[int]], budget: dict[int, int], batch_size: int,
                       mixed: bool) -> list[list[int]]:
    """The units in batches of at most ``batch_size``, longest first, each of one new-token budget unless ``mixed``."""
    order = sorted(encoded, key=lambda u: (budget[u], len(encoded[u])), reverse=True)
    batches: list[list[int]] = []
    for u in order:  # consecutive runs of one budget (of any, when mixed), cut every batch_size units
        if batches and len(batches[-1]) < batch_size and (mixed or budget[batches[-1][0]] == budget[u]):
            batches[-1].append(u)
        else:
            batches.append([u])
    return batches


def _translate_batches(engine: Any, tokenizer: Any, batches: list[list[int]], encoded: dict[int, list[int]],
                       budget: dict[int, int], num_beams: int, mixed: bool, search: str, progress: bool,
                       desc: str) -> list[str]:
    """The translation of every unit, batch by batch: one search over mixed budgets, or a `generate` call each."""
    from tqdm.auto import tqdm

    translated = [""] * len(encoded)
    model = getattr(engine, "model", None)
    loop = search == "generate" and getattr(model, "generate_by_retiring_search", False)
    if loop:  # transformers' own loop per budget (a model's `generate` would otherwise run the retiring search)
        model.generate_by_retiring_search = False
    try:
        for batch in tqdm(batches, desc=desc, disable=not progress, file=sys.stderr):
            if mixed:
                output = engine.generate_budgets([encoded[u] for u in batch], [budget[u] for u in batch], num_beams)
            else:
                output = engine.generate([encoded[u] for u in batch], num_beams=num_beams,
                                         max_new_tokens=budget[batch[0]])
            for u, text in zip(batch, tokenizer.batch_decode(output, skip_special_tokens=True)):
                translated[u] = text.strip()
    finally:
        if loop:
            del model.generate_by_retiring_search  # the class's value again
    return translated


def translate_windows(model, tokenizer, lines: Iterable[str], window: int = 10_000, batch_size: int = 32,
                      progress: Any = None, first_line: int = 1, line_step: int = 1,
                      **options: Any) -> Iterator[str]:
    """`translate_sentences` over a stream of lines of any length, with bounded memory: reads ``window`` lines,
    sorts them by length into batches (the speed of sorted batching), yields their translations in input order,
    then reads on. At most ``window`` lines and their translations are held at a time; ``window = batch_size`` is
    the lowest latency (pipes, interactive use). ``progress``, a tqdm bar, is advanced by the lines translated.
    ``first_line`` and ``line_step``: the input's line numbers of the first line and between two lines of
    ``lines`` (a resumed run, a process's strided share), which name an over-long line in its note."""
    if window < 1 or batch_size < 1:
        raise UserInputError(f"`window` = {window} and `batch_size` = {batch_size} must both be ≥ 1.")
    chunk: list[str] = []
    read = 0

    def translated() -> list[str]:
        start = first_line + (read - len(chunk)) * line_step
        numbers = range(start, start + len(chunk) * line_step, line_step)
        return translate_sentences(model, tokenizer, chunk, batch_size=batch_size, progress=False, numbers=numbers,
                                   **options)

    for line in lines:
        chunk.append(line.rstrip("\r\n"))
        read += 1
        if len(chunk) == window:
            yield from translated()
            if progress is not None:
                progress.update(len(chunk))
            chunk = []
    if chunk:
        yield from translated()
        if progress is not None:
            progress.update(len(chunk))


def complete_lines(path: str | os.PathLike) -> tuple[int, int]:
    """``(lines, bytes)``: how many complete lines (ending in a newline) ``path`` holds and where the last one ends,
    read in chunks (an output of millions of lines is never held in memory); ``(0, 0)`` for a missing file."""
    path = Path(path)
    if not path.exists():
        return 0, 0
    lines = end = offset = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            count = chunk.count(b"\n")
            if count:
                lines += count
                end = offset + chunk.rfind(b"\n") + 1
            offset += len(chunk)
    return lines, end


def completed_lines(path: str | os.PathLike) -> int:
    """How many complete lines (ending in a newline) an interrupted output file holds; a torn last line, written
    when the run was killed, is cut off so that appending continues at a line boundary."""
    path = Path(path)
    lines, end = complete_lines(path)
    if path.exists() and end < path.stat().st_size:
        with open(path, "r+b") as handle:
            handle.truncate(end)
    return lines


# ------------------------------------------------------------------------------------------------ corpus scale
def training_file_sources(path: str | os.PathLike, source_lang: str, target_lang: str) -> Iterator[str]:
    """The source side of a training file — run_translation JSON lines, TSV, or ``PREFIX.<src>`` / ``PREFIX.<tgt>``
    (`hf_deepnmt_training.data.iter_local_pairs`, ``corpus:`` paths included) — one sentence per record, in file order and
    whitespace-normalised; a record with an empty source gives ``""`` (translated to ``""``), so that line i of a
    translation is record i of the file."""
    for source, _ in iter_local_pairs(Path(resolve_path(str(path))), source_lang, target_lang):
        yield source


@dataclass(frozen=True)
class Shard:
    """This process's share of a corpus when ``world`` processes translate it (``torchrun`` / ``accelerate
    launch`` set ``RANK`` and ``WORLD_SIZE``): the lines ``rank``, ``rank + world``, ``rank + 2·world``, … of the
    lines still to translate. Strided rather than contiguous, so that a corpus sorted by length (or by book) loads
    every process alike and the processes finish together (docs/distillation.md, "Translating a corpus")."""

    rank: int = 0
    world: int = 1

    @classmethod
    def from_environment(cls) -> Shard:
        """The launcher's ``RANK`` / ``WORLD_SIZE`` (one process when they are unset)."""
        try:
            rank, world = int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)
        except ValueError:
            raise UserInputError(f"RANK={os.environ.get('RANK')!r} and WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} "
                                 "must be integers (a launcher such as torchrun sets them).") from None
        if world < 1 or not 0 <= rank < world:
            raise UserInputError(f"RANK={rank} and WORLD_SIZE={world} are not allowed; a launcher gives each of "
                                 "WORLD_SIZE ≥ 1 processes a RANK from 0 to WORLD_SIZE − 1.")
        return cls(rank, world)

    def part(self, output: Path, base: int) -> Path:
        """This process's part of ``output``, for a run that continues after ``base`` complete lines of it."""
        return output.with_name(f"{output.name}.from{base}.part{self.rank}-of-{self.world}")

    def rendezvous(self) -> None:
        """Return once every process of the launch has called this (a ``torch.distributed`` barrier on the
        launcher's rendezvous: an existing process group, else a gloo group made for it and released after, so
        that a later ``Trainer`` makes its own). `translate_corpus` calls it once every process has read what it
        resumes from, before any process changes a file: without it, rank 0 could merge (and rewrite the output)
        before a slower-starting process has read the output's length, which that process would then take as a
        different starting point (docs/distillation.md, "Several processes"). One process returns at once."""
        if self.world == 1:
            return
        import datetime

        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            return
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
        if missing or not dist.is_available():
            raise UserInputError(f"WORLD_SIZE={self.world} without {' and '.join(missing) or 'torch.distributed'}: "
                                 "several processes translate one file only when started by a launcher "
                                 "(torchrun or accelerate launch), which sets MASTER_ADDR and MASTER_PORT.")
        # The processes meet right after loading the model; the two hours cover a slow load from a shared file system
        # (gloo's default is 30 minutes).
        dist.init_process_group("gloo", rank=self.rank, world_size=self.world, timeout=datetime.timedelta(hours=2))
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def _done_marker(part: Path) -> Path:
    return part.with_name(part.name + ".done")


def write_atomically(path: Path, text: str) -> None:
    """``path`` holds ``text`` completely or not at all (written beside it, flushed to disk, then renamed)."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _parts_of(output: Path) -> list[Path]:
    """Every part file of ``output`` left by sharded runs (any base, any number of processes), markers excluded."""
    prefix = f"{output.name}.from"
    return sorted(path for path in output.parent.glob(f"{glob.escape(output.name)}.from*.part*-of-*")
                  if path.name.startswith(prefix) and not path.name.endswith(".done"))


@dataclass
class CorpusTranslation:
    """What `translate_corpus` did in this process."""

    resumed_from: int
    """Lines of the output (one process) or of this process's part (several) that were complete before."""
    translated: int
    """Lines this process translated now."""
    merged: bool = False
    """Whether this process wrote the final output (one process, or rank 0 after the merge)."""


def translate_corpus(model: Any, tokenizer: Any, lines: Iterable[str], output: str | os.PathLike, resume: bool = False,
                     shard: Shard | None = None, window: int = 10_000, batch_size: int = 32,
                     progress: Any = None, poll_seconds: float = 0.5,
                     rendezvous: Callable[[], None] | None = None, **options: Any) -> CorpusTranslation:
    """Translate ``lines`` (an iterable of sentences, read once) into the file ``output``, one line per input line,
    in input order — by one process, or by ``shard.world`` processes each translating its strided share (`Shard`).

    One process appends to ``output`` itself; ``resume`` keeps its complete lines and translates from the next
    input line on (a torn last line is cut off). Several processes: each writes its share to its own part file
    (``OUTPUT.from<K>.part<r>-of-<W>``, K the output's complete lines when the run started) and, once its share is
    translated, an atomically written ``.done`` marker; rank 0 then waits for every marker and writes ``output`` —
    its first K lines followed by the parts interleaved back into input order — beside it and renames it into place,
    so ``output`` is never half-written; the parts are removed after. ``resume`` continues every part after its
    complete lines (a part with its marker is not translated again); parts of a run with another number of
    processes are refused in one sentence. The other processes return once their share is done.

    ``rendezvous`` (several processes; default `Shard.rendezvous`) is called by every process after it has read its
    starting point (the output's complete lines, its part, its marker) and before any file is changed, so that all
    processes resume from the same K even when one starts late; tests pass their own."""
    shard = shard or Shard()
    output = Path(output)
    lines = iter(lines)
    options = dict(options, window=window, batch_size=batch_size, progress=progress)
    if shard.world == 1:
        return _translate_alone(model, tokenizer, lines, output, resume, **options)

    base = complete_lines(output)[0] if resume and output.exists() else 0
    part = shard.part(output, base)
    marker = _done_marker(part)
    stale = [path for path in _parts_of(output) if not path.name.startswith(f"{output.name}.from{base}.part")
             or not path.name.endswith(f"-of-{shard.world}")]
    if resume and stale:
        raise UserInputError(f"{output} has parts of a run with another number of processes or starting point "
                             f"({stale[0].name}); resume with the processes that run had, or start again without "
                             "--resume.")
    if not resume:
        for path in (part, marker):
            path.unlink(missing_ok=True)
    done = completed_lines(part) if resume else 0
    finished = resume and marker.exists()
    (rendezvous or shard.rendezvous)()  # every process has read its starting point; files change only after this
    count = 0
    if finished:
        done = json.loads(marker.read_text(encoding="utf-8"))["lines"]
        print(f"[deepnmt] rank {shard.rank}/{shard.world}: its {done} lines are translated already", file=sys.stderr)
    else:
        count = _translate_share(model, tokenizer, lines, part, base, done, resume, shard, **options)
    if shard.rank != 0:
        return CorpusTranslation(done, count)
    _merge_when_every_share_is_done(output, base, shard, poll_seconds)
    return CorpusTranslation(done, count, merged=True)


def _translate_alone(model: Any, tokenizer: Any, lines: Iterator[str], output: Path, resume: bool,
                     **options: Any) -> CorpusTranslation:
    """`translate_corpus` by one process: append to ``output`` itself, after its complete lines with ``resume``."""
    done = completed_lines(output) if resume else 0
    if done:
        print(f"[deepnmt] resuming: {done} lines of {output} are complete; translating from line {done + 1}",
              file=sys.stderr)
    count = 0
    with open(output, "a" if resume else "w", encoding="utf-8") as handle:
        for translation in translate_windows(model, tokenizer, itertools.islice(lines, done, None),
                                             first_line=done + 1, **options):
            handle.write(translation + "\n")
            count += 1
    return CorpusTranslation(done, count, merged=True)


def _translate_share(model: Any, tokenizer: Any, lines: Iterator[str], part: Path, base: int, done: int,
                     resume: bool, shard: Shard, **options: Any) -> int:
    """Translate this process's strided share of the lines after ``base`` into its part file, after the part's
    ``done`` complete lines, then write its ``.done`` marker; the lines translated now."""
    if done:
        print(f"[deepnmt] rank {shard.rank}/{shard.world}: resuming after the {done} complete lines of {part}",
              file=sys.stderr)
    count = 0
    share = itertools.islice(itertools.islice(lines, base, None), shard.rank, None, shard.world)
    with open(part, "a" if resume else "w", encoding="utf-8") as handle:
        for translation in translate_windows(model, tokenizer, itertools.islice(share, done, None),
                                             first_line=base + shard.rank + done * shard.world + 1,
                                             line_step=shard.world, **options):
            handle.write(translation + "\n")
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    write_atomically(_done_marker(part), json.dumps({"lines": done + count}) + "\n")
    return count


def _merge_when_every_share_is_done(output: Path, base: int, shard: Shard, poll_seconds: float) -> None:
    """Rank 0: wait for every process's ``.done`` marker, then write ``output`` (`merge_parts`)."""
    parts = [Shard(rank, shard.world).part(output, base) for rank in range(shard.world)]
    waited = False
    while not all(_done_marker(path).exists() for path in parts):
        if not waited:
            print(f"[deepnmt] rank 0: waiting for the other {shard.world - 1} process(es) to finish their shares",
                  file=sys.stderr)
            waited = True
        time.sleep(poll_seconds)
    merge_parts(output, base, parts)


def merge_parts(output: Path, base: int, parts: Sequence[Path]) -> None:
    """Write ``output``: its first ``base`` complete lines, then the lines of ``parts`` (strided shares, part r
    holding lines r, r + W, … of the rest) interleaved back into input order; written beside it and renamed into
    place, then the parts and their markers are removed. Part sizes that strided shares cannot have (a part was
    changed by hand, or one process read another input) are one sentence."""
    counts = [json.loads(_done_marker(path).read_text(encoding="utf-8"))["lines"] for path in parts]
    total = sum(counts)
    expected = [len(range(rank, total, len(parts))) for rank in range(len(parts))]
    if counts != expected:
        raise UserInputError(f"the parts of {output} hold {counts} lines, not the {expected} that {len(parts)} "
                             "strided shares of one input hold; start again without --resume.")
    temporary = output.with_name(f".{output.name}.merging")
    with open(temporary, "wb") as merged:
        if base:
            with open(output, "rb") as previous:
                remaining = complete_lines(output)[1]  # the bytes of the first `base` lines
                while remaining and (chunk := previous.read(min(remaining, 1 << 20))):
                    merged.write(chunk)
                    remaining -= len(chunk)
        handles = [open(path, "rb") for path in parts]
        try:
            for index in range(total):
                line = handles[index % len(parts)].readline()
                if not line.endswith(b"\n"):
                    raise UserInputError(f"{parts[index % len(parts)]} ends before its {counts[index % len(parts)]} "
                                         "lines; start again without --resume.")
                merged.write(line)
        finally:
            for handle in handles:
                handle.close()
        merged.flush()
        os.fsync(merged.fileno())
    os.replace(temporary, output)
    for path in parts:
        _done_marker(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    for path in _parts_of(output):  # parts of abandoned runs (another number of processes) are stale now
        _done_marker(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)


def evaluate_model(
    model_dir: str | os.PathLike,
    test_file: str,
    source_lang: str,
    target_lang: str,
    num_beams: int = 4,
    batch_size: int = 32,
    max_samples: int | None = None,
    model=None,
    tokenizer=None,
    corpus=None,
) -> tuple[TranslationScores, list[str]]:
    """BLEU/chrF/TER of a saved model on a test file (any format `hf_deepnmt_training.data` reads), with beam search.
    ``model``, ``tokenizer`` and ``corpus`` (the file already read) save loading them again."""
    if corpus is None:
        corpus = read_parallel_file(resolve_path(test_file), source_lang, target_lang, max_samples)
    if model is None:
        model = place(AutoModelForSeq2SeqLM.from_pretrained(model_dir), translation_device())
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hypotheses = translate_sentences(model, tokenizer, corpus.sources, num_beams=num_beams, batch_size=batch_size,
                                     desc=f"evaluating (beam {num_beams})", what="test pair")
    return score_translations(hypotheses, corpus.targets), hypotheses


def corpus_source_reliance(model, tokenizer, sources: Sequence[str], targets: Sequence[str],
                           max_pairs: int = 64) -> float:
    """li2022's collapse monitor (docs/li2022.md, `hf_deepnmt.losses.source_reliance`) on the first ``max_pairs``
    non-empty pairs: ≈ 0 nats/token for a decoder that ignores its source, clearly positive for one that uses it."""
    from hf_deepnmt.losses import source_reliance

    pairs = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()][:max_pairs]
    if not pairs:
        raise UserInputError("source reliance needs at least one non-empty sentence pair.")
    limit = min(tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", 1024))
    encoded = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True, truncation=True,
                        max_length=limit, return_tensors="pt").to(model.device)
    labels = encoded["labels"].masked_fill(encoded["labels"] == tokenizer.pad_token_id, -100)
    return source_reliance(model, {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
                                   "labels": labels})


# ------------------------------------------------------------------------------------------------ loading
DEVICES = "auto, cpu, cuda, cuda:N or mps"


def translation_device(requested: str | None = None) -> torch.device:
    """Where the torch engine translates (``--device`` of `deepnmt translate`, `evaluate` and `distill`).

    ``None`` or ``"auto"``: this process's GPU when torch sees CUDA — ``cuda:LOCAL_RANK`` (the process' number on its
    machine, which torchrun and accelerate launch set; modulo the devices, so that several processes may share
    one) — else the CPU. ``"cuda"`` alone is that GPU too; ``"cuda:N"``, ``"cpu"`` and ``"mps"`` are taken as
    given. A device this machine does not have, or a name torch does not know, is one sentence
    (docs/distillation.md, "Translating a corpus")."""
    def local_gpu() -> torch.device:
        value = os.environ.get("LOCAL_RANK", "0") or "0"
        if not value.isdigit():
            raise UserInputError(f"LOCAL_RANK={value!r} is not allowed; a launcher such as torchrun sets it to the "
                                 "process' number on its machine, 0 or more.")
        return torch.device("cuda", int(value) % torch.cuda.device_count())

    if requested in (None, "auto"):
        return local_gpu() if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise UserInputError(f"`--device` = {requested!r} is not allowed; use {DEVICES}.")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserInputError(f"`--device` = {requested!r} is not available: torch {torch.__version__} sees no "
                                 "CUDA device on this machine; use --device cpu (or auto).")
        count = torch.cuda.device_count()
        if device.index is None:
            return local_gpu()
        if device.index >= count:
            raise UserInputError(f"`--device` = {requested!r} is not available: this machine has {count} CUDA "
                                 f"device(s), cuda:0 to cuda:{count - 1}.")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserInputError(f"`--device` = {requested!r} is not available: torch sees no Apple GPU (MPS) on this "
                             "machine; use --device cpu (or auto).")
    return device


def load_models_and_tokenizer(values: Sequence[str], weights: Sequence[float] | None = None,
                              combination: str = "mean", device: str | None = None) -> tuple[Any, Any]:
    """One saved model and its tokenizer, or for several folders their ensemble (`hf_deepnmt.load_ensemble`: one
    vocabulary and language pair, checked before any weights load) and the first folder's tokenizer; the model on
    `translation_device` (``device``: ``--device``). A name that is no folder here and that the Hub does not
    provide is one sentence (`hf_deepnmt_training.errors.hub_lookup`)."""
    target = translation_device(device)
    if len(values) == 1:
        with hub_lookup(values[0]):
            model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(values[0]), AutoTokenizer.from_pretrained(values[0])
    else:
        missing = [value for value in values if not Path(value).expanduser().exists()]  # Hub ids, looked up
        with hub_lookup(missing[0] if missing else values[0]):
            model, tokenizer = load_ensemble(list(values), weights, combination)
    return place(model, target), tokenizer


def place(model: Any, device: torch.device) -> Any:
    """``model`` moved to ``device`` (where it already is: unchanged)."""
    return model if model.device == device else model.to(device)


def load_translation_engine(models: Sequence[str], engine: str | None = None, threads: int | None = None,
                            bf16: bool = False, weights: Sequence[float] | None = None, combination: str = "mean",
                            command: str = "translate", device: str | None = None) -> tuple[Any, Any, str]:
    """The engine, the tokenizer and a few words on what runs: one folder by the fastest engine it has (or
    ``engine``; `hf_deepnmt_training.serve.choose_engine`: torch where it runs on a GPU), several folders as an
    ensemble on torch (`TorchEngine`); torch on `translation_device` (``device``: ``--device``; a GPU is for the
    torch engine only)."""
    from hf_deepnmt.export import TorchEngine, load_engine

    from .serve import choose_engine

    target = translation_device(device)
    where = "" if target.type == "cpu" else f" on {target}"
    if len(models) > 1:
        if engine not in (None, "torch"):
            raise CommandLineError(f"`--engine` = {engine!r} is not allowed for an ensemble of {len(models)} models: "
                                   "their distributions are combined at every step inside torch's `generate`, which "
                                   "an exported engine does not expose; use --engine torch (the default).")
        model, tokenizer = load_models_and_tokenizer(models, weights, combination, device=str(target))
        return TorchEngine(model, bf16=bf16), tokenizer, (f"an ensemble of {len(models)} models on torch "
                                                          f"({combination}){where}")
    name, folder = choose_engine(models[0], engine, cuda=target.type == "cuda", command=command)
    if name != "torch" and target.type != "cpu" and device not in (None, "auto"):
        raise CommandLineError(f"`--device` = {device!r} runs the torch engine only, and {folder} is run by the "
                               f"{name} engine, on the CPU here; use --engine torch with the model folder, or "
                               "--device cpu.")
    with hub_lookup(models[0]):
        loaded = load_engine(folder, name, intra_threads=threads or torch.get_num_threads(), bf16=bf16)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    if name == "torch":
        loaded.model = place(loaded.model, target)
    return loaded, tokenizer, f"the {name} engine ({folder}){where if name == 'torch' else ''}"
