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
GNMT form), ``early_stopping`` (True, False, ``"never"``), ``num_return_sequences``, a minimum length (``min_length``,
``min_new_tokens``: ``</s>`` is forbidden before it, as transformers' two minimum-length processors do), single-token
``bad_words_ids`` (those tokens are never chosen: Marian's ``[[<pad>]]``), ``forced_eos_token_id`` (a hypothesis that
reaches its length limit ends with ``</s>``, as Marian's and fairseq's generation configs ask) and one budget per
sentence. Any other generation setting that would add a logits processor or a stopping criterion (repetition
penalties, n-gram blocking, forced beginnings, multi-token bad words, sampling, ...) is outside it: `unsupported`
names the first such setting and the caller uses ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.nn import functional as F
from transformers import GenerationConfig
from transformers.modeling_outputs import ModelOutput

from .attention import (
    add_empty_rows,
    drop_leading_columns,
    join_rows,
    keep_leading_columns,
)
from .generation_common import CACHE_NAME

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
    "force_words_ids": (None,),
    "constraints": (None,),
    "forced_bos_token_id": (None,),
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
    min_length: int = 0
    """``</s>`` is forbidden while a hypothesis (its start token included) is shorter: ``1 + min_new_tokens`` when
    that is set, else ``min_length`` — transformers' `MinLengthLogitsProcessor` and
    `MinNewTokensLengthLogitsProcessor`, which set ``</s>``'s score to −inf (after the log-softmax in beam search)."""
    banned_token_ids: tuple[int, ...] = ()
    """Tokens never chosen: the single-token entries of ``bad_words_ids`` (transformers' `NoBadWordsLogitsProcessor`
    sets their scores to −inf)."""
    forced_eos_token_id: int | None = None
    """At a hypothesis' last allowed position every score but this token's is −inf and its own 0 (transformers'
    `ForcedEOSTokenLogitsProcessor`)."""


def unsupported(model: Any, settings: dict[str, Any]) -> str | None:
    """Why ``settings`` (the call's generation arguments, merged over ``model.generation_config``) need transformers'
    ``generate`` instead of this search, or None when this search gives its results."""
    if not {cls.__name__ for cls in type(model).__mro__} & TESTED_CLASSES:
        return f"{type(model).__name__} is not a class the retiring search is tested with"
    merged = {**model.generation_config.to_dict(), **settings}
    for name, neutral in _NEUTRAL.items():
        if name in merged and merged[name] not in neutral:
            return f"{name}={merged[name]!r}"
    bad_words = merged.get("bad_words_ids")
    if bad_words is not None and not (isinstance(bad_words, (list, tuple)) and all(
            isinstance(words, (list, tuple)) and len(words) == 1 for words in bad_words)):
        return f"bad_words_ids={bad_words!r} (only single-token entries are reproduced)"
    forced = merged.get("forced_eos_token_id")
    if forced is not None and not isinstance(forced, int):
        return f"forced_eos_token_id={forced!r} (one token id is reproduced)"
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
        from .generation_common import GNMTLengthPenalty

        penalty = GNMTLengthPenalty(penalty)
    early = merged.get("early_stopping")
    min_new = merged.get("min_new_tokens")  # transformers: it takes precedence and sets min_length = 1 + it
    minimum = 1 + int(min_new) if min_new is not None else int(merged.get("min_length") or 0)
    banned = tuple(int(words[0]) for words in merged.get("bad_words_ids") or ())
    forced = merged.get("forced_eos_token_id")
    return SearchSettings(num_beams=num_beams, length_penalty=penalty, early_stopping=False if early is None else early,
                          num_return_sequences=int(merged.get("num_return_sequences") or 1),
                          eos_token_ids=eos_ids, pad_token_id=int(pad if pad is not None else (eos_ids or (0,))[0]),
                          decoder_start_token_id=int(start), min_length=minimum, banned_token_ids=banned,
                          forced_eos_token_id=None if forced is None else int(forced))


def _map_tensors(value: Any, function: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``function`` applied to every tensor in it (tensors, tuples, model outputs item by item: an
    output may carry extra keys, an ONNX encoder's memory)."""
    if isinstance(value, torch.Tensor):
        return function(value)
    if isinstance(value, ModelOutput):
        mapped = type(value)()
        for key, item in value.items():
            mapped[key] = _map_tensors(item, function)
        return mapped
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(item, function) for item in value)
    return value


def _select_rows(value: Any, rows: torch.Tensor) -> Any:
    """``value`` with only the given rows (dim 0) of every tensor in it."""
    return _map_tensors(value, lambda tensor: tensor.index_select(0, rows))


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
    search = ContinuousSearch(model, settings)
    search.admit(input_ids, attention_mask, max_new_tokens, range(batch))
    results: list[Hypotheses | None] = [None] * batch
    while len(search):
        for sentence, hypotheses in search.step():
            results[sentence] = hypotheses
            if on_result is not None:
                on_result(sentence, hypotheses)
    return [result for result in results if result is not None]


class ContinuousSearch:
    """The retiring search as a running state: `admit` sentences, `step` the decoder once for every sentence
    searched, collect the sentences whose result became final. `retiring_generate` admits one batch and steps until
    it is empty; ``deepnmt serve --continuous_batching`` admits the sentences that arrived while it steps —
    continuous batching, as text-generation-inference does (docs/serving.md, "Continuous batching", with what it costs
    on a CPU: a row that joins late attends over the positions of the oldest row's hypotheses).

    Sentences join an empty search with any model the search takes. A model whose class sets ``admits_mid_search``
    (the Transformer family) also takes sentences while others are half-way: their decoder rows start at the current
    cache column (the columns before are zeros their mask hides, and ``decoder_position_ids`` gives each row its own
    positions, so a row sees exactly what it would alone), their source joins the cross-attention's memory (padded to
    the longest source) and the columns no remaining row needs are dropped as rows leave. A sentence's result is the
    one it gets alone (tests/test_retiring_search.py)."""

    def __init__(self, model: Any, settings: SearchSettings) -> None:
        self.model, self.settings = model, settings
        self.beams = settings.num_beams
        # a model whose cross-attention groups a sentence's beams over one copy of its source (`beams_share_memory`)
        # keeps one encoder row per sentence; any other gets one per beam
        self.shared = self.beams > 1 and getattr(model, "beams_share_memory", False)
        self.admits_mid_search = bool(getattr(model, "admits_mid_search", False))
        self._reorder = getattr(model, "_reorder_cache", None)
        self._tags: dict[int, Any] = {}  # sentence number -> the caller's tag
        self._numbers = 0
        self._clear()

    def _clear(self) -> None:
        self.state: _Beams | _Greedy | None = None
        self.encoder_outputs: Any = None
        self.mask: torch.Tensor | None = None  # (memory rows, S)
        self.cache: Any = None
        self.tokens: torch.Tensor | None = None  # (A·k, 1) the next decoder input
        self.columns = 0  # self-attention cache positions (each row's own occupy the last ones)

    def __len__(self) -> int:
        return 0 if self.state is None else int(self.state.sentences.numel())

    def can_admit(self) -> bool:
        """Whether `admit` takes sentences now: into an empty search always, into a running one if the model can."""
        return self.state is None or self.admits_mid_search

    @torch.no_grad()
    def admit(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: Sequence[int],
              tags: Sequence[Any]) -> None:
        """Add sentences ``(n, S)`` with their new-token budgets; `step` reports each with its tag."""
        count = input_ids.size(0)
        if len(max_new_tokens) != count or len(tags) != count:
            raise ValueError(f"{count} sentences need {count} budgets and tags, got {len(max_new_tokens)} and "
                             f"{len(tags)}.")
        if not self.can_admit():
            raise RuntimeError(f"{type(self.model).__name__} takes new sentences only into an empty search "
                               "(`admits_mid_search`); wait until `len(search) == 0`.")
        if count == 0:
            return
        device, beams = input_ids.device, self.beams
        numbers = torch.arange(self._numbers, self._numbers + count, device=device)  # (n,) sentence numbers
        self._tags.update(zip(range(self._numbers, self._numbers + count), tags))
        self._numbers += count
        encoder_outputs = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                                                   return_dict=True)
        mask = attention_mask
        if not self.shared:
            rows = torch.arange(count, device=device).repeat_interleave(beams)  # (n·k,): each sentence's rows
            encoder_outputs = _select_rows(encoder_outputs, rows)
            mask = attention_mask.index_select(0, rows)
        limits = torch.tensor([1 + int(budget) for budget in max_new_tokens], device=device)  # max_length each
        state = (_Beams if beams > 1 else _Greedy)(self.settings, numbers, limits, device)
        tokens = torch.full((count * beams, 1), self.settings.decoder_start_token_id, dtype=torch.long, device=device)
        if self.state is None:
            self.state, self.encoder_outputs, self.mask, self.tokens = state, encoder_outputs, mask, tokens
            # a model may give a cache made for beam search (the Transformer's defers each reorder to the next append)
            maker = getattr(self.model, "beam_search_cache", None)
            self.cache = maker() if beams > 1 and maker is not None else None
            return
        # sentences join half-way (`admits_mid_search`): rows after the running ones, no past, their own source
        self.state.extend(state)
        self.tokens = torch.cat((self.tokens, tokens))
        if self.cache is not None:
            for layer in self.cache.self_attention_cache.layers:
                add_empty_rows(layer, count * beams)  # (R, H, t, d_h) -> (R + n·k, H, t, d_h)
            self._join_memory(encoder_outputs.last_hidden_state, mask)
        self.encoder_outputs = _join_rows(self.encoder_outputs, encoder_outputs)
        self.mask = _join_rows(self.mask, mask)

    def _join_memory(self, states: torch.Tensor, mask: torch.Tensor) -> None:
        """Project the joining sentences' encoder states into every cross-attention's keys and values and add them
        to the cache's rows (padded to the longer source; the source mask hides the padding)."""
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        cache = self.cache
        if not any(cache.is_updated.values()):
            return  # not projected yet: the next step projects every row
        joining = EncoderDecoderCache(DynamicCache(), DynamicCache())
        self.model.get_decoder().project_memory(states, joining)
        for index, layer in enumerate(cache.cross_attention_cache.layers):
            if cache.is_updated.get(index):
                new = joining.cross_attention_cache.layers[index]
                join_rows(layer, new.keys, new.values)  # (M, H, S, d_h) + (n, H, S', d_h) -> (M + n, H, max, d_h)

    @torch.no_grad()
    def step(self) -> list[tuple[Any, Hypotheses]]:
        """One decoder step for every sentence searched; the ``(tag, hypotheses)`` of those whose result is now final
        (they have left the search)."""
        state, beams = self.state, self.beams
        if state is None:
            return []
        device = self.tokens.device
        # each row's own position: the tokens of its hypothesis so far minus the one fed now
        positions = (state.lengths - 1).repeat_interleave(beams)  # (A·k,)
        extra: dict[str, torch.Tensor] = {}
        if self.admits_mid_search and bool((positions != self.columns).any()):
            # rows that joined later: their first columns are not theirs (left padding of the cache)
            first = self.columns - positions  # (A·k,) the first column of each row
            extra["decoder_attention_mask"] = (torch.arange(self.columns + 1, device=device)[None, :]
                                               >= first[:, None]).long()  # (A·k, t + 1)
            extra["decoder_position_ids"] = positions[:, None]  # (A·k, 1)
        outputs = self.model(encoder_outputs=self.encoder_outputs, attention_mask=self.mask,
                             decoder_input_ids=self.tokens, use_cache=True, return_dict=True,
                             **{CACHE_NAME: self.cache}, **extra)
        self.cache = getattr(outputs, CACHE_NAME)
        self.columns += 1
        # (A·k, V) in float32; greedy search changes its logits in place (`_forbid_end`), so it gets its own copy;
        # beam search reads them once into a new tensor (its log-softmax) and needs none
        logits = outputs.logits[:, -1, :].to(copy=self.beams == 1, dtype=torch.float32)
        del outputs
        source_rows, self.tokens, done = state.step(logits)  # (A·k,) rows to continue from, (A·k, 1), (A,)
        if source_rows is not None:  # beam search: the hypotheses that go on come from these rows of the state
            if self._reorder is not None:  # the model's own reorder (it may leave the per-sentence encoder part alone)
                self.cache = self._reorder(self.cache, source_rows)
            else:
                self.cache.reorder_cache(source_rows)
        if not bool(done.any()):
            return []
        finished = []
        for position, number in enumerate(state.sentences.tolist()):
            if done[position]:
                finished.append((self._tags.pop(number), state.result(position)))
        keep = (~done).nonzero().squeeze(1)  # (A',) sentences still searched
        if keep.numel() == 0:
            self._clear()
            return finished
        self._keep(keep)
        return finished

    def _keep(self, keep: torch.Tensor) -> None:
        """Only the sentences ``keep`` ``(A',)`` stay: every row-indexed tensor of the search loses the others, and
        the cache positions and source positions no remaining row needs are dropped."""
        beams, state = self.beams, self.state
        keep_rows = (keep[:, None] * beams + torch.arange(beams, device=keep.device)).reshape(-1)  # (A'·k,)
        state.keep(keep)
        self.tokens = self.tokens.index_select(0, keep_rows)
        if self.shared:  # the decoder's rows per beam, the source's per sentence
            self.cache.self_attention_cache.reorder_cache(keep_rows)
            self.cache.cross_attention_cache.reorder_cache(keep)
            self.encoder_outputs = _select_rows(self.encoder_outputs, keep)
            self.mask = self.mask.index_select(0, keep)
        else:
            self.cache.reorder_cache(keep_rows)  # every row-indexed tensor of the state, the encoder's included
            self.encoder_outputs = _select_rows(self.encoder_outputs, keep_rows)
            self.mask = self.mask.index_select(0, keep_rows)
        if not self.admits_mid_search:
            return
        unused = self.columns - int(state.lengths.max()) + 1  # cache columns before every row's first one
        if unused > 0:
            for layer in self.cache.self_attention_cache.layers:
                drop_leading_columns(layer, unused)
            self.columns -= unused
        longest = int(self.mask.sum(dim=1).max()) if self.mask.dim() == 2 else self.mask.size(-1)
        if longest < self.mask.size(-1) and bool(self.mask[:, longest:].eq(0).all()):
            # the longest source left: its padding columns go from the memory, its mask and its projections
            self.mask = self.mask[:, :longest]
            self.encoder_outputs = _cut_memory(self.encoder_outputs, longest)
            for index, layer in enumerate(self.cache.cross_attention_cache.layers):
                if self.cache.is_updated.get(index):
                    keep_leading_columns(layer, longest)


def _join_rows(old: Any, new: Any, dim: int = 1) -> Any:
    """``old`` with ``new``'s rows after its own (dim 0), tensor by tensor (model outputs item by item); tensors
    whose ``dim`` (the source positions) differ are padded with zeros to the longer one first."""
    if isinstance(old, torch.Tensor):
        if old.dim() > dim and old.size(dim) != new.size(dim):
            width = max(old.size(dim), new.size(dim))
            old, new = (F.pad(t, (0, 0) * (t.dim() - dim - 1) + (0, width - t.size(dim))) for t in (old, new))
        return torch.cat((old, new))
    if isinstance(old, ModelOutput):
        joined = type(old)()
        for key, item in old.items():
            joined[key] = _join_rows(item, new[key], dim)
        return joined
    if isinstance(old, (tuple, list)):
        return type(old)(_join_rows(a, b, dim) for a, b in zip(old, new))
    return old


def _cut_memory(value: Any, width: int) -> Any:
    """``value`` with its source positions (dim 1 of its 3-D tensors) cut to ``width`` (the encoder states)."""
    return _map_tensors(value, lambda tensor: tensor[:, :width] if tensor.dim() > 2 else tensor)


def _pad_width(tensor: torch.Tensor, width: int, fill: int) -> torch.Tensor:
    """``tensor`` ``(..., W)`` filled to ``(..., width)`` with ``fill`` (hypothesis tokens of a narrower state)."""
    return F.pad(tensor, (0, width - tensor.size(-1)), value=fill) if tensor.size(-1) < width else tensor


def _forbid_end(scores: torch.Tensor, lengths: torch.Tensor, minimum: int, eos: torch.Tensor,
                rows_per_sentence: int) -> torch.Tensor:
    """``scores`` ``(A·k, V)`` (changed in place: the callers' own copies) with every ``</s>`` at −inf in the rows of
    sentences whose hypotheses (``lengths`` ``(A,)`` tokens, the start token included) are shorter than ``minimum``:
    transformers' minimum-length processors."""
    if minimum <= 1 or eos.numel() == 0:
        return scores
    short = (lengths < minimum).repeat_interleave(rows_per_sentence)  # (A·k,)
    if not bool(short.any()):
        return scores
    scores[:, eos] = scores[:, eos].masked_fill(short[:, None], float("-inf"))  # (A·k, |eos|)
    return scores


def _process_scores(scores: torch.Tensor, settings: SearchSettings, lengths: torch.Tensor, limits: torch.Tensor,
                    eos: torch.Tensor, rows_per_sentence: int) -> torch.Tensor:
    """transformers' logits processors that this search reproduces, in transformers' order, on ``scores``
    ``(A·k, V)`` (changed in place): the minimum length (`_forbid_end`), the banned tokens (single-token
    ``bad_words_ids``) and the forced ``</s>`` at each sentence's last position (``lengths + 1 == limits``)."""
    scores = _forbid_end(scores, lengths, settings.min_length, eos, rows_per_sentence)
    if settings.banned_token_ids:
        scores[:, list(settings.banned_token_ids)] = float("-inf")
    if settings.forced_eos_token_id is not None:
        last = (lengths + 1 >= limits).repeat_interleave(rows_per_sentence)  # (A·k,) rows at their last position
        if bool(last.any()):
            forced = torch.full_like(scores[0], float("-inf"))  # (V,)
            forced[settings.forced_eos_token_id] = 0.0
            scores[last] = forced
    return scores


class _Greedy:
    """transformers' greedy search (``num_beams=1``, no sampling), one row per sentence."""

    def __init__(self, settings: SearchSettings, sentences: torch.Tensor, limits: torch.Tensor,
                 device: torch.device) -> None:
        self.settings = settings
        self.sentences = sentences  # (A,) the number of each searched sentence
        self.sequences = torch.full((sentences.numel(), int(limits.max())), settings.pad_token_id, dtype=torch.long,
                                    device=device)
        self.sequences[:, 0] = settings.decoder_start_token_id
        self.limits = limits
        self.lengths = torch.ones_like(limits)  # (A,) tokens in each sequence so far
        self.eos = torch.tensor(settings.eos_token_ids, dtype=torch.long, device=device)

    def step(self, logits: torch.Tensor) -> tuple[None, torch.Tensor, torch.Tensor]:
        logits = _process_scores(logits, self.settings, self.lengths, self.limits, self.eos, 1)
        chosen = logits.argmax(dim=-1)  # (A,) transformers' greedy choice, on the (processed) logits
        self.sequences.scatter_(1, self.lengths[:, None], chosen[:, None])  # each row's next position
        self.lengths = self.lengths + 1
        done = torch.isin(chosen, self.eos) | (self.lengths >= self.limits)
        return None, chosen[:, None], done

    def result(self, position: int) -> Hypotheses:
        return Hypotheses(self.sequences[position:position + 1, :int(self.lengths[position])])  # (1, T)

    def keep(self, keep: torch.Tensor) -> None:
        for name in ("sentences", "sequences", "limits", "lengths"):
            setattr(self, name, getattr(self, name)[keep])

    def extend(self, other: _Greedy) -> None:
        """Add ``other``'s sentences after these (sentences joining a running search)."""
        width = max(self.sequences.size(1), other.sequences.size(1))
        fill = self.settings.pad_token_id
        self.sequences = torch.cat((_pad_width(self.sequences, width, fill), _pad_width(other.sequences, width, fill)))
        for name in ("sentences", "limits", "lengths"):
            setattr(self, name, torch.cat((getattr(self, name), getattr(other, name))))


class _Beams:
    """transformers' beam search, sentence by sentence: the state of the ``A`` sentences still searched. Each
    sentence has its own length (sentences may join a running search), so each step's normalisation divides by its
    own ``length ** length_penalty`` — the same float transformers divides by (`_divisors`)."""

    _ROWS = ("sentences", "limits", "lengths", "running", "running_scores", "finished", "finished_scores",
             "finished_flags", "finished_lengths", "can_improve")

    def __init__(self, settings: SearchSettings, sentences: torch.Tensor, limits: torch.Tensor,
                 device: torch.device) -> None:
        k = settings.num_beams
        batch, width = sentences.numel(), int(limits.max())
        self.settings, self.k, self.device = settings, k, device
        self.candidates = max(2, 1 + len(settings.eos_token_ids)) * k  # continuations kept per step
        self.sentences = sentences  # (A,)
        self.limits = limits  # (A,) the max_length (1 + budget) of each sentence
        self.lengths = torch.ones_like(limits)  # (A,) tokens in each sentence's running hypotheses
        # running hypotheses: tokens and accumulated log-probabilities; only the first beam starts alive
        # transformers fills beam search's unused positions with the pad token, or with </s> when the pad id is 0
        self.fill = settings.pad_token_id or (settings.eos_token_ids[0] if settings.eos_token_ids else -1)
        self.running = torch.full((batch, k, width), self.fill, dtype=torch.long, device=device)
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
        self._divisors = self._divisor_table(width)

    def _divisor_table(self, width: int) -> torch.Tensor:
        """``length ** length_penalty`` for every length 0 … ``width`` ``(width + 1,)``, each computed as transformers
        does (a Python ``int ** float``, `GNMTLengthPenalty` included) and divided by as a float32."""
        penalty = self.settings.length_penalty
        return torch.tensor([float(length ** penalty) if length else 1.0 for length in range(width + 1)],
                            dtype=torch.float32, device=self.device)

    def step(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        k, cur = self.k, self.lengths  # cur (A,): tokens in each sentence's hypotheses
        log_probs = _process_scores(F.log_softmax(logits, dim=-1), self.settings, cur, self.limits, self.eos,
                                    k)  # (A·k, V)
        active = self.running.size(0)
        vocab = log_probs.size(-1)
        # accumulated scores of every continuation of every running hypothesis, per sentence
        # (in place: the log-probabilities are this step's own tensor, read nowhere else)
        scores = log_probs.view(active, k, vocab).add_(self.running_scores[:, :, None]).view(active, k * vocab)
        top_scores, top_index = torch.topk(scores, k=self.candidates)  # (A, 2k)
        parent = top_index // vocab  # (A, 2k) the running hypothesis each continuation extends
        token = top_index % vocab
        extended = torch.take_along_dim(self.running, parent[:, :, None], dim=1)  # (A, 2k, W)
        extended.scatter_(2, cur[:, None, None].expand(active, self.candidates, 1), token[:, :, None])
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
        divisor = self._divisors[cur][:, None]  # (A, 1) transformers' (cur_len + 1 - 1) ** length_penalty
        normalised = top_scores / divisor
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
            torch.cat((self.finished_lengths, (cur + 1)[:, None].expand_as(just_finished)), dim=1), keep, dim=1)

        self.lengths = cur = cur + 1
        # can a running hypothesis still beat the worst finished one? (transformers' early-stopping heuristic)
        if self.settings.early_stopping == "never" and self.settings.length_penalty > 0.0:
            divisor = self._divisors[self.limits - 1][:, None]  # (A, 1): the longest each sentence may grow
        # otherwise (cur - 1) ** length_penalty: the divisor above
        best_possible = self.running_scores[:, :1] / divisor
        worst_finished = torch.where(self.finished_flags, self.finished_scores.min(dim=1, keepdim=True)[0], -1.0e9)
        self.can_improve = self.can_improve & (best_possible > worst_finished).any(dim=-1, keepdim=True)

        done = ~self.can_improve[:, 0] | ends.all(dim=-1)
        if self.settings.early_stopping is True:
            done = done | self.finished_flags.all(dim=-1)
        last = torch.take_along_dim(self.running, (cur - 1)[:, None, None].expand(active, k, 1), dim=2)  # (A, k, 1)
        return source_rows, last.reshape(-1, 1), done

    def result(self, position: int) -> Hypotheses:
        n = self.settings.num_return_sequences
        longest = int(self.finished_lengths[position, :n].max())
        return Hypotheses(self.finished[position, :n, :max(longest, 1)], self.finished_scores[position, :n])

    def keep(self, keep: torch.Tensor) -> None:
        for name in self._ROWS:
            setattr(self, name, getattr(self, name)[keep])

    def extend(self, other: _Beams) -> None:
        """Add ``other``'s sentences after these (sentences joining a running search)."""
        width = max(self.running.size(-1), other.running.size(-1))
        for name in self._ROWS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if name in ("running", "finished"):
                mine, theirs = _pad_width(mine, width, self.fill), _pad_width(theirs, width, self.fill)
            setattr(self, name, torch.cat((mine, theirs)))
        if self._divisors.numel() <= width:
            self._divisors = self._divisor_table(width)
