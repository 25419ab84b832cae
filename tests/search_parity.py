"""What "the same output" means when two computations of one model search for a translation.

Two engines (torch and ONNX Runtime or CTranslate2), cached and uncached decoding, or one batch size and another
compute the same log-probabilities up to float32 rounding (the parity tests hold teacher-forced log-probabilities to
``TIE_TOLERANCE``). Where the search is decided by a margin wider than that, their outputs must be identical. Where
two hypotheses are tied within it, either engine may keep either one, and a different output is no defect — the issue
that made this module (a near tie in a beam of the shallow GRU flipped between torch and ONNX Runtime on one CPU).

`assert_same_search` compares outputs per source sentence (its n-best list as one unit). Identical sentences pass.
A sentence that differs passes only when the reference's own search is decided by a tie there, shown constructively:
re-running the reference with every step's log-probabilities moved by at most ε (uniform noise, ε = 1e-6, 1e-5,
1e-4 = ``TIE_TOLERANCE``, eight seeds each, smallest first) must produce exactly the candidate's output for that
sentence. A difference the reference never reaches within the tolerance is a real disagreement and fails, and so
does a case where more than a quarter of the sentences move under a ``TIE_TOLERANCE`` perturbation
(`assert_decided_by_margins`: then the case tests too little, and another model must be chosen or trained).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList

TIE_TOLERANCE = 1e-4
JITTER_SCALES = (1e-6, 1e-5, TIE_TOLERANCE)
JITTER_SEEDS = 8
MAX_TIED_FRACTION = 0.25

Outputs = list[tuple[int, ...]]
"""One tuple of token ids per output row (n-best rows of a sentence consecutive): no start token, cut after </s>,
no padding."""


class LogProbJitter(LogitsProcessor):
    """Adds uniform noise in [-scale, scale] to every step's scores (beam search: the log-probabilities before they
    join the beams' running scores; greedy: the logits), from a fixed seed: a float-rounding-sized perturbation."""

    def __init__(self, scale: float, seed: int) -> None:
        self.scale = scale
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        noise = torch.rand(scores.shape, generator=self.generator, dtype=torch.float32) * 2 - 1
        return scores + (noise * self.scale).to(scores.device, scores.dtype)


def trim(rows: torch.Tensor | Sequence[Sequence[int]], eos_token_id: int, pad_token_id: int,
         start_token_id: int | None = None) -> Outputs:
    """Rows of `generate` (a start token first, padding after </s>) or of an engine (lists) as `Outputs`."""
    rows = rows.tolist() if isinstance(rows, torch.Tensor) else [list(row) for row in rows]
    trimmed = []
    for row in rows:
        if start_token_id is not None and row and row[0] == start_token_id:
            row = row[1:]
        tokens: list[int] = []
        for token in row:
            tokens.append(token)
            if token == eos_token_id:
                break
        while tokens and tokens[-1] == pad_token_id and pad_token_id != eos_token_id:
            tokens.pop()
        trimmed.append(tuple(tokens))
    return trimmed


def generate_search(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                    **generate_kwargs) -> Callable[[LogitsProcessor | None], Outputs]:
    """The reference search of a transformers model (ours or `OnnxSeq2SeqLM`), optionally under a jitter."""
    config = model.config

    def search(jitter: LogitsProcessor | None) -> Outputs:
        processors = LogitsProcessorList([jitter] if jitter is not None else [])
        with torch.no_grad():
            output = model.generate(**inputs, logits_processor=processors, **generate_kwargs)
        sequences = output.sequences if hasattr(output, "sequences") else output
        return trim(sequences, config.eos_token_id, config.pad_token_id, config.decoder_start_token_id)

    return search


def tied_sentences(reference: Callable[[LogitsProcessor | None], Outputs], expected: Outputs, got: Outputs,
                   n_best: int = 1, what: str = "") -> list[int]:
    """Asserts that ``got`` equals ``expected`` (the reference's unperturbed output) on every sentence whose search
    is not decided by a tie within ``TIE_TOLERANCE``, and returns the sentences that differ by a tie."""
    assert len(got) == len(expected), f"{what}: {len(got)} output rows, expected {len(expected)}"
    groups = [slice(start, start + n_best) for start in range(0, len(expected), n_best)]
    differing = {index for index, rows in enumerate(groups) if got[rows] != expected[rows]}
    if not differing:
        return []
    unexplained, reached = set(differing), {index: False for index in differing}
    for scale in JITTER_SCALES:
        for seed in range(JITTER_SEEDS):
            outcome = reference(LogProbJitter(scale, seed))
            for index in list(unexplained):
                rows = groups[index]
                reached[index] |= outcome[rows] != expected[rows]
                if outcome[rows] == got[rows]:
                    unexplained.discard(index)
            if not unexplained:
                break
        if not unexplained:
            break
    for index in sorted(unexplained):
        rows = groups[index]
        kind = ("the reference's search moves there, but never to this output" if reached[index]
                else "not a tie: the reference's output does not move under any perturbation")
        raise AssertionError(f"{what}: sentence {index} differs ({kind}, ε ≤ {TIE_TOLERANCE}):\n"
                             f"  expected {expected[rows]}\n  got      {got[rows]}")
    return sorted(differing)


def assert_decided_by_margins(reference: Callable[[LogitsProcessor | None], Outputs], n_best: int = 1,
                              what: str = "", expected: Outputs | None = None) -> Outputs:
    """Asserts that the case tests something: at most a quarter of its sentences change when the reference's
    log-probabilities move by ``TIE_TOLERANCE`` (two seeds). Returns the unperturbed output."""
    expected = reference(None) if expected is None else expected
    groups = range(0, len(expected), n_best)
    fragile = set()
    for seed in (101, 102):
        outcome = reference(LogProbJitter(TIE_TOLERANCE, seed))
        fragile |= {start for start in groups if outcome[start:start + n_best] != expected[start:start + n_best]}
    assert len(fragile) <= MAX_TIED_FRACTION * len(groups), (
        f"{what}: {len(fragile)} of {len(groups)} sentences change when the log-probabilities move by "
        f"{TIE_TOLERANCE}: their search is decided by ties, so the case tests too little (choose or train a model "
        "whose hypotheses are separated by wider margins)")
    return expected


def assert_same_search(reference: Callable[[LogitsProcessor | None], Outputs], got: Outputs, n_best: int = 1,
                       what: str = "", expected: Outputs | None = None) -> list[int]:
    """The whole rule: the case's search is decided by margins (`assert_decided_by_margins`), and ``got`` equals
    the reference's unperturbed output (``expected``, computed when not given) except on sentences decided by a tie
    (`tied_sentences`), which are returned."""
    expected = assert_decided_by_margins(reference, n_best, what, expected)
    return tied_sentences(reference, expected, got, n_best, what)
