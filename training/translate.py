"""Translating and scoring with a trained model: length-sorted batches, bounded-memory windows over a stream of lines,
resumable output files, BLEU/chrF/TER of a test file, and li2022's source reliance on a corpus. Used by `deepnmt
translate`, `deepnmt evaluate`, the end of `deepnmt train`, and the benchmarks.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import hf_deepnmt  # noqa: F401  (registers the model types)
from hf_deepnmt.errors import UserInputError

from .data import read_parallel_file
from .metrics import TranslationScores, score_translations
from .recipes import resolve_path


BUDGET_STEP = 8  # new-token budgets are multiples of this, so that sentences of similar length share one search


def new_token_budget(source_tokens: int, limit: int) -> int:
    """How many tokens a translation of a ``source_tokens``-token source may have: 1.5 × the source + 10, rounded up
    to a multiple of ``BUDGET_STEP``, at most ``limit`` − 1 (the decoder start token takes one position). It
    depends on the sentence alone, never on the sentences translated with it (docs/training.md, "Translating"):
    `deepnmt translate`'s and `deepnmt evaluate`'s default and, applied to the longest validation source, the NMT
    default ``generation_max_length`` (= this + 1) of evaluation in training."""
    budget = -(-(int(1.5 * source_tokens) + 10) // BUDGET_STEP) * BUDGET_STEP
    return min(limit - 1, budget)


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
) -> list[str]:
    """Translate in length-sorted batches (original order restored); an empty line translates to "".

    Each sentence's translation is what it would be alone (up to float32 rounding at exact ties): its new-token
    budget is its own (`new_token_budget`, unless ``max_new_tokens`` sets one for all), and a batch only holds
    sentences of one budget, so neither ``batch_size`` nor the other sentences change a result.

    ``model`` is a PyTorch model (run with `generate`, under bf16 autocast with ``bf16``) or an engine of
    `hf_deepnmt.export.load_engine` (CTranslate2, ONNX Runtime): the batching and the output are the same.
    """
    from tqdm.auto import tqdm

    from hf_deepnmt.export import TorchEngine

    engine = TorchEngine(model, bf16=bf16) if isinstance(model, torch.nn.Module) else model
    limit = min(tokenizer.model_max_length, engine.max_positions)
    kept = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    encoded = dict(zip(kept, tokenizer([sentences[i] for i in kept], truncation=True, max_length=limit)["input_ids"]
                       if kept else []))
    budget = {i: max_new_tokens or new_token_budget(len(ids), limit) for i, ids in encoded.items()}
    order = sorted(kept, key=lambda i: (budget[i], len(encoded[i])), reverse=True)
    batches: list[list[int]] = []
    for i in order:  # consecutive runs of one budget, cut every batch_size sentences
        if batches and len(batches[-1]) < batch_size and budget[batches[-1][0]] == budget[i]:
            batches[-1].append(i)
        else:
            batches.append([i])
    results = [""] * len(sentences)
    for batch in tqdm(batches, desc=desc, disable=not progress, file=sys.stderr):
        output = engine.generate([encoded[i] for i in batch], num_beams=num_beams, max_new_tokens=budget[batch[0]])
        for i, text in zip(batch, tokenizer.batch_decode(output, skip_special_tokens=True)):
            results[i] = text.strip()
    return results


def translate_windows(model, tokenizer, lines: Iterable[str], window: int = 10_000, batch_size: int = 32,
                      progress: Any = None, **options: Any) -> Iterator[str]:
    """`translate_sentences` over a stream of lines of any length, with bounded memory: reads ``window`` lines,
    sorts them by length into batches (the speed of sorted batching), yields their translations in input order,
    then reads on. At most ``window`` lines and their translations are held at a time; ``window = batch_size`` is
    the lowest latency (pipes, interactive use). ``progress``, a tqdm bar, is advanced by the lines translated."""
    if window < 1 or batch_size < 1:
        raise UserInputError(f"`window` = {window} and `batch_size` = {batch_size} must both be ≥ 1.")
    chunk: list[str] = []
    for line in lines:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) == window:
            yield from translate_sentences(model, tokenizer, chunk, batch_size=batch_size, progress=False, **options)
            if progress is not None:
                progress.update(len(chunk))
            chunk = []
    if chunk:
        yield from translate_sentences(model, tokenizer, chunk, batch_size=batch_size, progress=False, **options)
        if progress is not None:
            progress.update(len(chunk))


def completed_lines(path: str | os.PathLike) -> int:
    """How many complete lines (ending in a newline) an interrupted output file holds; a torn last line, written
    when the run was killed, is cut off so that appending continues at a line boundary."""
    path = Path(path)
    if not path.exists():
        return 0
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep < len(data):
        with open(path, "r+b") as handle:
            handle.truncate(keep)
    return data[:keep].count(b"\n")


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
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    hypotheses = translate_sentences(model, tokenizer, corpus.sources, num_beams=num_beams, batch_size=batch_size,
                                     desc=f"evaluating (beam {num_beams})")
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
