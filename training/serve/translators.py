"""What the server needs of an engine (`Translator`) and what passes between them: a request's checked parameters
(`Settings`: requests with equal ones share batches), one tokenized text (`Source`), the parameters a request may
give and their checks, and the refusal of a text that is too long (`InputTooLong`, answered with 413)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# The parameters a request may give, with their JSON types: the translation pipeline's own (languages, decoding
# spaces) and `generate`'s arguments that are plain values. Anything else is refused with 400 (an unknown name
# would otherwise reach `generate`, which refuses it with a transformers message, or silently ignores it).
PIPELINE_PARAMETERS: dict[str, str] = {"src_lang": "string", "tgt_lang": "string",
                                       "clean_up_tokenization_spaces": "boolean"}
GENERATION_PARAMETERS: dict[str, str] = {
    "num_beams": "integer", "num_return_sequences": "integer", "max_new_tokens": "integer",
    "min_new_tokens": "integer", "max_length": "integer", "min_length": "integer", "length_penalty": "number",
    "early_stopping": "boolean or 'never'", "length_penalty_form": "string", "do_sample": "boolean",
    "temperature": "number", "top_k": "integer",
    "top_p": "number", "min_p": "number", "typical_p": "number", "repetition_penalty": "number",
    "encoder_repetition_penalty": "number", "no_repeat_ngram_size": "integer",
    "encoder_no_repeat_ngram_size": "integer",
}
# CTranslate2Engine.generate's settings (a CTranslate2 export has no transformers model to run `generate`)
CTRANSLATE2_PARAMETERS: tuple[str, ...] = ("num_beams", "max_new_tokens", "min_new_tokens", "length_penalty",
                                           "early_stopping", "clean_up_tokenization_spaces")



class InputTooLong(ValueError):
    """A text longer than ``--max_input_tokens``: the request is answered with 413."""


@dataclass(frozen=True)
class Settings:
    """A request's checked parameters. ``key`` is their canonical JSON: requests with equal keys share batches."""

    key: str
    parameters: dict[str, Any]
    num_return_sequences: int  # how many translations per text the answer holds (the pipeline's rule)
    preprocess: dict[str, Any] = field(default_factory=dict)
    forward: dict[str, Any] = field(default_factory=dict)
    postprocess: dict[str, Any] = field(default_factory=dict)
    mixes_budgets: bool = False
    """Texts of every new-token budget share a batch: the engine decodes them in one search that retires each
    sentence when it is done (`hf_deepnmt.retiring_search`; the torch and ONNX engines, for the settings it takes)."""


@dataclass
class Source:
    """One tokenized text: its length in tokens and what the engine's ``translate`` takes."""

    length: int
    inputs: Any
    budget: int | None = None
    """Its new-token budget when the request sets no length (`hf_deepnmt.pipeline_translation.new_token_budget`):
    the batcher batches texts of one budget, which the engine decodes in one call."""


def budget_of(length: int, forward: dict[str, Any], positions: int) -> int | None:
    """A source's new-token budget, or None when the request's parameters set the length themselves."""
    from hf_deepnmt.pipeline_translation import new_token_budget

    return None if {"max_new_tokens", "max_length"} & forward.keys() else new_token_budget(length, positions)


More = Callable[[int], Sequence[Source]]
"""``more(searched)``: the sources that join a running search now, given how many sentences it holds (continuous
batching: `Batcher.admit`); they take the batch's next indices."""


class Translator(Protocol):
    """What the server needs of an engine. ``prepare`` and ``encode`` run on the event loop (cheap, they raise
    `UserInputError` / `InputTooLong` sentences); ``translate`` runs on the worker thread and may hand a source's
    translations to ``deliver(i, translations)`` before the batch is over (the retiring search does), and take more
    sources between decoder steps from ``more`` (continuous batching; an engine without it ignores ``more``)."""

    engine: str
    max_input_tokens: int

    def prepare(self, parameters: dict[str, Any]) -> Settings: ...

    def encode(self, text: str, index: int, settings: Settings) -> Source: ...

    def continuous_refused(self) -> str | None: ...

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]: ...


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    return isinstance(value, bool) or value == "never"  # early_stopping


def check_parameter_types(parameters: dict[str, Any], allowed: dict[str, str], engine: str) -> None:
    """One `UserInputError` sentence for a parameter the server does not take or a value of the wrong JSON type."""
    from hf_deepnmt.errors import UserInputError

    for name, value in parameters.items():
        if name not in allowed:
            raise UserInputError(f"`parameters.{name}` is not a parameter this server takes (engine {engine}); use "
                                 f"{', '.join(sorted(allowed))}.")
        if not _type_ok(value, allowed[name]):
            raise UserInputError(f"`parameters.{name}` = {json.dumps(value)[:60]} is not allowed; it must be "
                                 f"{'an' if allowed[name][0] in 'aeiou' else 'a'} {allowed[name]}.")


def settings_key(parameters: dict[str, Any]) -> str:
    return json.dumps(parameters, sort_keys=True)


def first_line(message: str) -> str:
    """The first line of an error message (transformers' messages may run over several)."""
    lines = str(message).strip().splitlines()
    return lines[0] if lines else type(message).__name__


def too_long(index: int, length: int, limit: int, model_limit: int) -> InputTooLong:
    where = "" if limit == model_limit else f" (--max_input_tokens; the model accepts {model_limit})"
    return InputTooLong(f"`inputs[{index}]` has {length} tokens, more than the {limit} this server accepts{where}; "
                        "split it into shorter texts.")

