"""What decoding shares below the models: the name transformers gives the decoding cache, and GNMT's length
normalisation as a float transformers' beam search divides by. `modeling_common` (the models) and
`retiring_search` (the search behind their `generate`) both import it, so neither imports the other's module for it."""

from __future__ import annotations

from typing import Any

from transformers.modeling_outputs import Seq2SeqLMOutput

from .errors import UserInputError

# transformers 5.24 renamed the decoding cache from `past_key_values` to `cache`: in the arguments `generate` passes to
# `forward` and in the output dataclasses (the old name still works there, with a deprecation warning). Our models
# accept both names and write whichever field the installed transformers defines, so 5.17 (the GPU machines) and
# 5.24+ both run without warnings.
CACHE_NAME: str = "cache" if "cache" in getattr(Seq2SeqLMOutput, "__dataclass_fields__", {}) else "past_key_values"


def cache_field(value: Any) -> dict[str, Any]:
    """``{name: value}`` for an output dataclass, under the installed transformers' name of the cache field."""
    return {CACHE_NAME: value}


def output_cache(outputs: Any) -> Any:
    """The decoding cache of a model output (either transformers naming)."""
    return getattr(outputs, CACHE_NAME, None)


def merge_cache_arguments(cache: Any, past_key_values: Any) -> Any:
    """The cache a forward was given, as ``cache`` (transformers >= 5.24) or ``past_key_values`` (earlier)."""
    if cache is not None and past_key_values is not None:
        raise UserInputError("pass the decoding cache once, as `cache` (transformers >= 5.24) or `past_key_values`, "
                             "not both.")
    return cache if cache is not None else past_key_values


LENGTH_PENALTY_FORMS: tuple[str, ...] = ("power", "gnmt")


class GNMTLengthPenalty(float):
    """A length penalty α that normalises a hypothesis' log-probability by GNMT's lp(Y) = ((5 + |Y|) / 6) ** α
    (Wu et al. 2016, Eq. (14); meng2019 decodes with α = 0.6 in this form) instead of transformers' |Y| ** α.

    transformers' beam search divides by ``length ** length_penalty`` with an int ``length`` (the hypothesis' tokens,
    ``</s>`` included) wherever it normalises — finished hypotheses and the early-stopping estimate. ``int ** float``
    leaves the operation to the float's ``__rpow__``, so this float subclass turns every one of those divisions into
    GNMT's while comparing, printing and saving as α. `TranslationGenerationMixin.generate` puts it in place when the
    model config (DTMT's default) or the call says ``length_penalty_form="gnmt"``; tests/test_dtmt.py checks the returned scores against the
    formula, so a transformers release that normalised differently would fail there, not silently."""

    def __rpow__(self, length: float) -> float:  # type: ignore[override]
        return ((5.0 + length) / 6.0) ** float(self)
