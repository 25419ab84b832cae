"""Beam and greedy search that retires each sentence from the batch as soon as its result is final.

transformers' ``generate`` decodes a fixed batch: every sentence stays in every decoder step until the last sentence
of the call is done, and a call has one length limit. A server that batches sentences of several lengths therefore
either decodes each new-token budget in its own call (more calls, small batches) or pays, in one call, the decoder
steps of its longest sentence for every row. This search gives both at once (docs/serving.md, "One call, every
budget"): one call takes sentences with different new-token budgets, and once a sentence's search is over, its rows
leave the batch — the decoder state, the encoder states and the source mask lose them — so later steps cost only
what is still being searched. CTranslate2 decodes the same way.

Its results are transformers' own, sentence by sentence: the same hypotheses and scores as ``generate`` on each
budget's sentences alone (tests/test_retiring_search.py compares them for every family and search setting it takes).
That holds because in transformers' beam search a sentence's result no longer changes once the sentence is done —
``num_beams`` finished hypotheses with ``early_stopping=True``; the early-stopping heuristic unsatisfiable otherwise;
or its budget reached — and because nothing of one sentence's search depends on another's. So the search below is
transformers' rule, step for step (top 2 × ``num_beams`` continuations, the unfinished best ``num_beams`` go on, the
finished ones merge into the sentence's ``num_beams`` best by length-normalised score), with one change: a sentence
whose result is final leaves the batch instead of being carried along.

What it takes: deterministic search (``num_beams`` ≥ 1, no sampling) with ``length_penalty`` (transformers' or the
GNMT form), ``early_stopping`` (True, False, ``"never"``), ``num_return_sequences`` and one budget per sentence. Any
generation setting that would add a logits processor or a stopping criterion (repetition penalties, n-gram blocking,
minimum lengths, forced or suppressed tokens, sampling, ...) is outside it: `unsupported` names the first such setting
and the caller uses ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.nn import functional as F
from transformers import GenerationConfig
from transformers.modeling_outputs import ModelOutput

from .modeling_common import CACHE_NAME

# Settings (of a merged generation config) that this search reproduces; each other one must be at the value that
# adds nothing to transformers' search (`unsupported`).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "do_sample": (False, None),
    "num_beam_groups": (1, None),
    "diversity_penalty": (0.0, None),
    "penalty_alpha": (None,),
    "repetition_penalty": (1.0, None),
    "encoder_repetition_penalty": (1.0, None),
    "no_repeat_ngram_size": (0, None),
    "encoder_no_repeat_ngram_size": (0, None),
    "bad_words_ids": (None,),
    "force_words_ids": (None,),
    "constraints": (None,),
    "min_length": (0, None),
    "min_new_tokens": (None, 0),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "sequence_bias": (None,),
    "exponential_decay_length_penalty": (None,),
    "remove_invalid_values": (False, None),
    "renormalize_logits": (False, None),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
    "stop_strings": (None,),
    "max_time": (None,),
    "assistant_model": (None,),
    "prompt_lookup_num_tokens": (None,),
    "low_memory": (None, False),
    "output_scores": (False, None),
    "output_logits": (False, None),
    "output_attentions": (False, None),
    "output_hidden_states": (False, None),
    "return_dict_in_generate": (False, None),
}


# The model classes (by name, so that a saved folder's remote-code copy counts) whose state this search is tested to
# retire rows of (tests/test_retiring_search.py, tests/test_serve.py): both families and their paper subclasses, an
# ONNX export under `OnnxSeq2SeqLM`, and an ensemble of them (`EnsembleForConditionalGeneration`: its encoder output
# keeps each member's states as extra keys and its cache each member's cache, so rows are selected in every member).
TESTED_CLASSES = {"DeepTransformerForConditionalGeneration", "DTMTForConditionalGeneration", "OnnxSeq2SeqLM",
                  "EnsembleForConditionalGeneration"}


@dataclass(frozen=True)
class SearchSettings:
    """What the search needs of a generation config."""

    num_beams: int
    length_penalty: float
    early_stopping: bool | str
    num_return_sequences: int
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    decoder_start_token_id: int


def unsupported(model: Any, settings: dict[str, Any]) -> str | None:
    """Why ``settings`` (the call's generation arguments, merged over ``model.generation_config``) need transformers'
    ``generate`` instead of this search, or None when this search gives its results."""
    if not {cls.__name__ for cls in type(model).__mro__} & TESTED_CLASSES:
        return f"{type(model).__name__} is not a class the retiring search is tested with"
    merged = {**model.generation_config.to_dict(), **settings}
    for name, neutral in _NEUTRAL.items():
        if name in merged and merged[name] not in neutral:
            return f"{name}={merged[name]!r}"
    if merged.get("logits_processor") or merged.get("stopping_criteria"):
        return "a logits processor or stopping criterion was given"
    known = set(GenerationConfig().to_dict()) | {"length_penalty_form", "generation_config"}
    extra = sorted(set(settings) - known)
    return f"{extra[0]}={settings[extra[0]]!r}" if extra else None


def search_settings(model: Any, settings: dict[str, Any]) -> SearchSettings:
    """The search's settings from ``settings`` over ``model.generation_config`` (and the model config's token ids)."""
    config = model.generation_config
    merged = {**config.to_dict(), **settings}
    eos = merged.get("eos_token_id", model.config.eos_token_id)
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
    pad = merged.get("pad_token_id")
    pad = model.config.pad_token_id if pad is None else pad
    start = merged.get("decoder_start_token_id")
    start = model.config.decoder_start_token_id if start is None else start
    num_beams = int(merged.get("num_beams") or 1)
    penalty = merged.get("length_penalty")
    penalty = 1.0 if penalty is None else penalty
    form = settings.get("length_penalty_form") or getattr(model.config, "length_penalty_form", None) or "power"
    if form == "gnmt":  # the same normalisation `TranslationGenerationMixin.generate` puts in place
        from .modeling_common import GNMTLengthPenalty

        penalty = GNMTLengthPenalty(penalty)
    early = merged.get("early_stopping")
    return SearchSettings(num_beams=num_beams, length_penalty=penalty, early_stopping=False if early is None else early,
                          num_return_sequences=int(merged.get("num_return_sequences") or 1),
                          eos_token_ids=eos_ids, pad_token_id=int(pad if pad is not None else (eos_ids or (0,))[0]),
                          decoder_start_token_id=int(start))


def _select_rows(value: Any, rows: torch.Tensor) -> Any:
    """``value`` with only the given rows (dim 0) of every tensor in it (tensors, tuples, model outputs)."""
    if isinstance(value, torch.Tensor):
        return value.index_select(0, rows)
    if isinstance(value, ModelOutput):  # item by item: an output may carry extra keys (an ONNX encoder's memory)
        selected = type(value)()
        for key, item in value.items():
            selected[key] = _select_rows(item, rows)
        return selected
    if isinstance(value, (tuple, list)):
        return type(value)(_select_rows(item, rows) for item in value)
    return value


@dataclass
class Hypotheses:
    """One sentence's result: ``sequences`` ``(num_return_sequences, T)`` token ids (the decoder start token first,
    as ``generate`` returns them, then its filling after a shorter hypothesis' end) and, for beam search, their
    ``scores`` ``(num_return_sequences,)`` — ``generate``'s ``sequences_scores`` (length-normalised log-probability)."""

    sequences: torch.Tensor
    scores: torch.Tensor | None = None


@torch.no_grad()
def retiring_generate(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      max_new_tokens: Sequence[int], settings: SearchSettings,
                      on_result: Callable[[int, Hypotheses], None] | None = None) -> list[Hypotheses]:
    """Translate a batch in one search where sentence ``i`` may generate ``max_new_tokens[i]`` tokens; its
    `Hypotheses`, in input order. ``on_result(i, hypotheses)`` is called as soon as sentence ``i``'s result is final
    (the step it leaves the batch), before the rest of the batch is done: a server answers with it early."""
    batch = input_ids.size(0)
    if len(max_new_tokens) != batch:
        raise ValueError(f"max_new_tokens has {len(max_new_tokens)} budgets for a batch of {batch} sentences.")
    device = input_ids.device
    beams = settings.num_beams
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
    # a model whose cross-attention groups a sentence's beams over one copy of its source (`beams_share_memory`)
    # keeps one encoder row per sentence; any other gets one per beam
    shared = beams > 1 and getattr(model, "beams_share_memory", False)
    mask = attention_mask
    if not shared:
        rows = torch.arange(batch, device=device).repeat_interleave(beams)  # (B·k,): each sentence's rows
        encoder_outputs = _select_rows(encoder_outputs, rows)
        mask = attention_mask.index_select(0, rows)
    limits = torch.tensor([1 + int(budget) for budget in max_new_tokens], device=device)  # max_length per sentence
    width = int(limits.max())
    results: list[Hypotheses | None] = [None] * batch
    search = _Beams(settings, batch, width, limits, device) if beams > 1 else _Greedy(settings, batch, width, limits,
                                                                                      device)
    # a model may give a cache made for beam search (the Transformer's defers each reorder to the next append)
    cache = model.beam_search_cache() if beams > 1 and hasattr(model, "beam_search_cache") else None
    tokens = torch.full((batch * beams, 1), settings.decoder_start_token_id, dtype=torch.long, device=device)
    reorder = getattr(model, "_reorder_cache", None)
    while True:
        outputs = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tokens,
                        use_cache=True, return_dict=True, **{CACHE_NAME: cache})
        cache = getattr(outputs, CACHE_NAME)
        logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)  # (A·k, V)
        del outputs
        source_rows, tokens, done = search.step(logits)  # (A·k,) rows to continue from, (A·k, 1), (A,)
        if source_rows is not None:  # beam search: the hypotheses that go on come from these rows of the state
            if reorder is not None:  # the model's own reorder (it may leave the per-sentence encoder part alone)
                cache = reorder(cache, source_rows)
            else:
                cache.reorder_cache(source_rows)
        if bool(done.any()):
            for position, sentence in enumerate(search.sentences.tolist()):
                if done[position]:
                    results[sentence] = search.result(position)
                    if on_result is not None:
                        on_result(sentence, results[sentence])
            keep = (~done).nonzero().squeeze(1)  # (A',) sentences still searched
            if keep.numel() == 0:
                break
            keep_rows = (keep[:, None] * beams + torch.arange(beams, device=device)).reshape(-1)  # (A'·k,)
            search.keep(keep)
            tokens = tokens.index_select(0, keep_rows)
            if shared:  # the decoder's rows per beam, the source's per sentence
                cache.self_attention_cache.reorder_cache(keep_rows)
                cache.cross_attention_cache.reorder_cache(keep)
                encoder_outputs = _select_rows(encoder_outputs, keep)
                mask = mask.index_select(0, keep)
            else:
                cache.reorder_cache(keep_rows)  # every row-indexed tensor of the state, the encoder's included
                encoder_outputs = _select_rows(encoder_outputs, keep_rows)
                mask = mask.index_select(0, keep_rows)
    return [result for result in results if result is not None]


class _Greedy:
    """transformers' greedy search (``num_beams=1``, no sampling), one row per sentence."""

    def __init__(self, settings: SearchSettings, batch: int, width: int, limits: torch.Tensor,
                 device: torch.device) -> None:
        self.settings = settings
        self.sentences = torch.arange(batch, device=device)  # (A,) input position of each searched sentence
        self.sequences = torch.full((batch, width), settings.pad_token_id, dtype=torch.long, device=device)
        self.sequences[:, 0] = settings.decoder_start_token_id
        self.limits = limits
        self.length = 1  # tokens in every searched sequence so far
        self.eos = torch.tensor(settings.eos_token_ids, dtype=torch.long, device=device)

    def step(self, logits: torch.Tensor) -> tuple[None, torch.Tensor, torch.Tensor]:
        chosen = logits.argmax(dim=-1)  # (A,) transformers' greedy choice, on the logits
        self.sequences[:, self.length] = chosen
        self.length += 1
        done = torch.isin(chosen, self.eos) | (self.length >= self.limits)
        return None, chosen[:, None], done

    def result(self, position: int) -> Hypotheses:
        return Hypotheses(self.sequences[position:position + 1, :self.length])  # (1, T)

    def keep(self, keep: torch.Tensor) -> None:
        self.sentences, self.sequences, self.limits = (self.sentences[keep], self.sequences[keep], self.limits[keep])


class _Beams:
    """transformers' beam search, sentence by sentence: the state of the ``A`` sentences still searched."""

    def __init__(self, settings: SearchSettings, batch: int, width: int, limits: torch.Tensor,
                 device: torch.device) -> None:
        k = settings.num_beams
        self.settings, self.k, self.device = settings, k, device
        self.candidates = max(2, 1 + len(settings.eos_token_ids)) * k  # continuations kept per step
        self.sentences = torch.arange(batch, device=device)  # (A,)
        self.limits = limits  # (A,) the max_length (1 + budget) of each sentence
        self.length = 1  # tokens in every running hypothesis
        # running hypotheses: tokens and accumulated log-probabilities; only the first beam starts alive
        # transformers fills beam search's unused positions with the pad token, or with </s> when the pad id is 0
        fill = settings.pad_token_id or (settings.eos_token_ids[0] if settings.eos_token_ids else -1)
        self.running = torch.full((batch, k, width), fill, dtype=torch.long, device=device)
        self.running[:, :, 0] = settings.decoder_start_token_id
        self.running_scores = torch.zeros(batch, k, device=device)
        self.running_scores[:, 1:] = -1e9
        # finished hypotheses: tokens, length-normalised scores, whether the slot holds one, their lengths
        self.finished = self.running.clone()
        self.finished_scores = torch.full((batch, k), -1e9, device=device)
        self.finished_flags = torch.zeros(batch, k, dtype=torch.bool, device=device)
        self.finished_lengths = torch.zeros(batch, k, dtype=torch.long, device=device)
        self.can_improve = torch.ones(batch, 1, dtype=torch.bool, device=device)
        self.eos = torch.tensor(settings.eos_token_ids, dtype=torch.long, device=device)
        self.top_k_mask = torch.arange(self.candidates, device=device) < k  # only these may finish

    def step(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        log_probs = F.log_softmax(logits, dim=-1)  # (A·k, V)
        k, cur = self.k, self.length
        active = self.running.size(0)
        vocab = log_probs.size(-1)
        # accumulated scores of every continuation of every running hypothesis, per sentence
        scores = (log_probs.view(active, k, vocab) + self.running_scores[:, :, None]).reshape(active, k * vocab)
        top_scores, top_index = torch.topk(scores, k=self.candidates)  # (A, 2k)
        parent = top_index // vocab  # (A, 2k) the running hypothesis each continuation extends
        token = top_index % vocab
        extended = torch.take_along_dim(self.running, parent[:, :, None], dim=1)  # (A, 2k, W)
        extended[:, :, cur] = token
        # a continuation ends with an end-of-sentence token or at its sentence's max_length
        ends = torch.isin(token, self.eos) | (cur + 1 >= self.limits)[:, None]  # (A, 2k)

        # the best k continuations that go on (ended ones pushed to the bottom)
        going_on = top_scores + ends.to(torch.float32) * -1.0e9
        best = torch.topk(going_on, k=k)[1]  # (A, k)
        self.running = torch.take_along_dim(extended, best[:, :, None], dim=1)
        self.running_scores = torch.take_along_dim(going_on, best, dim=1)
        source_rows = (torch.arange(active, device=self.device)[:, None] * k
                       + torch.take_along_dim(parent, best, dim=1)).reshape(-1)  # (A·k,) rows of the decoder state

        # merge the continuations that just ended among the top k into the finished ones (length-normalised)
        just_finished = ends & self.top_k_mask[None, :]
        normalised = top_scores / ((cur + 1 - 1) ** self.settings.length_penalty)
        full = self.finished_flags.all(dim=-1, keepdim=True) & (self.settings.early_stopping is True)
        normalised = normalised + full.to(torch.float32) * -1.0e9
        normalised = normalised + (~self.can_improve).to(torch.float32) * -1.0e9
        normalised = normalised + (~just_finished) * -1.0e9
        merged_scores = torch.cat((self.finished_scores, normalised), dim=1)  # (A, 3k)
        keep = torch.topk(merged_scores, k=k)[1]
        self.finished = torch.take_along_dim(torch.cat((self.finished, extended), dim=1), keep[:, :, None], dim=1)
        self.finished_scores = torch.take_along_dim(merged_scores, keep, dim=1)
        self.finished_flags = torch.take_along_dim(torch.cat((self.finished_flags, just_finished), dim=1), keep, dim=1)
        self.finished_lengths = torch.take_along_dim(
            torch.cat((self.finished_lengths, torch.full_like(just_finished, cur + 1, dtype=torch.long)), dim=1),
            keep, dim=1)

        self.length = cur = cur + 1
        # can a running hypothesis still beat the worst finished one? (transformers' early-stopping heuristic)
        penalty = self.settings.length_penalty
        if self.settings.early_stopping == "never" and penalty > 0.0:
            divisor = torch.tensor([(int(limit) - 1) ** penalty for limit in self.limits.tolist()],
                                   device=self.device)[:, None]  # (A, 1): the longest each sentence may grow
        else:
            divisor = (cur - 1) ** penalty
        best_possible = self.running_scores[:, :1] / divisor
        worst_finished = torch.where(self.finished_flags, self.finished_scores.min(dim=1, keepdim=True)[0], -1.0e9)
        self.can_improve = self.can_improve & (best_possible > worst_finished).any(dim=-1, keepdim=True)

        done = ~self.can_improve[:, 0] | ends.all(dim=-1)
        if self.settings.early_stopping is True:
            done = done | self.finished_flags.all(dim=-1)
        return source_rows, self.running[:, :, cur - 1].reshape(-1, 1), done

    def result(self, position: int) -> Hypotheses:
        n = self.settings.num_return_sequences
        longest = int(self.finished_lengths[position, :n].max())
        return Hypotheses(self.finished[position, :n, :max(longest, 1)], self.finished_scores[position, :n])

    def keep(self, keep: torch.Tensor) -> None:
        for name in ("sentences", "limits", "running", "running_scores", "finished", "finished_scores",
                     "finished_flags", "finished_lengths", "can_improve"):
            setattr(self, name, getattr(self, name)[keep])
