"""What the configurations of both families share: the field → rule tables that validate them, the rules every
encoder-decoder of the package has (sizes, dropouts, special tokens), and the pipeline entry a loaded config leaves
out.

A config class lists its fields with their rules (`FieldRules`: field → the rules its value must pass, in order; a
rule may read fields listed before it) and `check_config` runs the table once, when the config is built, before
transformers' own validators see a value; the models run it again on the config they are built from, so that a config
changed after construction cannot slip through. A value that breaks a rule raises one `UserInputError` sentence that
names the config, the field, the value and what is allowed.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only transformers and
same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import UserInputError
from .papers import foreign_fields


def fail(config_name: str, field: str, value: Any, allowed: str) -> None:
    """Raise the project's one-sentence validation error."""
    raise UserInputError(f"{config_name}: `{field}` = {value!r} is not allowed; {allowed}.")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class Rule:
    """What one field allows: ``test(value, config)`` and the words that say it (a string, or a function of the
    config for words that quote another field)."""

    test: Callable[[Any, Any], bool]
    allowed: str | Callable[[Any], str]

    def words(self, config: Any) -> str:
        return self.allowed(config) if callable(self.allowed) else self.allowed


FieldRules = Mapping[str, tuple[Rule, ...]]


def check_config(config: Any, rules: FieldRules) -> None:
    """Run ``rules`` over ``config``'s fields in table order; the first value that breaks a rule raises."""
    name = type(config).__name__
    for field, field_rules in rules.items():
        value = getattr(config, field, None)
        for rule in field_rules:
            if not rule.test(value, config):
                fail(name, field, value, rule.words(config))


class ValidatedConfigMixin:
    """For a `PreTrainedConfig` (put before it): ``field_rules`` checked once, at the end of ``__init__``, before the
    fields transformers validates itself reach `PreTrainedConfig.__init__`."""

    field_rules: ClassVar[FieldRules] = {}
    family: ClassVar[str] = ""
    """The config's family (`hf_deepnmt.papers`): the fields of the other families' papers are refused by name."""
    foreign_preamble: ClassVar[str] = ""
    """Words before a foreign field's reason in its refusal (``"DTMT is a recurrent model and "``)."""

    def check_fields(self) -> None:
        """Validate every field (`field_rules`); raise one `ValueError` sentence naming the field, the value and what
        is allowed."""
        check_config(self, self.field_rules)

    def _validate_and_init(self, kwargs: dict[str, Any], **transformers_fields: Any) -> None:
        """Set ``transformers_fields`` (special token ids, ``is_encoder_decoder``, ...), check every field, then run
        `PreTrainedConfig.__init__` with them and the remaining ``kwargs``. A field of another family's paper
        (`hf_deepnmt.papers.foreign_fields`) is refused by name: `PreTrainedConfig` would store it silently as an
        attribute no layer reads."""
        foreign = foreign_fields(self.family)
        for field in kwargs:
            if field in foreign:
                fail(type(self).__name__, field, kwargs[field], self.foreign_preamble + foreign[field])
        for field, value in transformers_fields.items():
            setattr(self, field, value)
        self.check_fields()  # once, in our words, before transformers' own validators see a value (docs/training.md)
        super().__init__(**transformers_fields, **without_pipelines_served_in_process(type(self), kwargs))


# ------------------------------------------------------------------------------------------------ the rules
def one_of(choices: tuple[str, ...]) -> Rule:
    return Rule(lambda value, config: value in choices, f"use one of {list(choices)}")


def number_in(low: float, high: float, *, low_open: bool = False, high_open: bool = False,
              allowed: str | None = None) -> Rule:
    """A finite number between ``low`` and ``high`` (``math.inf``: unbounded), each end closed unless said open."""
    def test(value: Any, config: Any) -> bool:
        return (is_number(value) and (value > low if low_open else value >= low)  # nan compares False
                and (value < high if high_open else value <= high) and math.isfinite(value))

    span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return Rule(test, allowed or f"it must be a number in {span}")


POSITIVE_INT = Rule(lambda value, config: is_int(value) and value >= 1, "it must be a positive integer")
FLAG = Rule(lambda value, config: isinstance(value, bool), "it must be True or False")
PROBABILITY = number_in(0.0, 1.0, high_open=True, allowed="it must be a probability in [0, 1)")
NON_NEGATIVE_WEIGHT = number_in(0.0, math.inf, high_open=True,
                                allowed="it must be a finite number ≥ 0 (0 switches it off)")
EVEN_WIDTH = Rule(lambda value, config: value % 2 == 0, "it must be even (sinusoidal positions pair sin and cos)")
ALWAYS_ENCODER_DECODER = Rule(lambda value, config: value is True, "this model is always an encoder-decoder (True)")


def divides_d_model() -> Rule:
    return Rule(lambda value, config: config.d_model % value == 0, lambda config: f"it must divide d_model ({config.d_model})")


def token_id_limit(config: Any) -> int:
    """The smallest vocabulary of ``config``: a special token id must exist on both sides (one ``<pad>`` is the padding
    row of both embeddings, ``</s>`` ends sources and targets). Without a separate ``decoder_vocab_size`` it is
    ``vocab_size``."""
    decoder = getattr(config, "decoder_vocab_size", None)
    return config.vocab_size if decoder is None else min(config.vocab_size, decoder)


def _token_id_range(config: Any) -> str:
    decoder = getattr(config, "decoder_vocab_size", None)
    if decoder is None or decoder == config.vocab_size:
        return f"[0, vocab_size={config.vocab_size})"
    return f"[0, {token_id_limit(config)}) (vocab_size={config.vocab_size}, decoder_vocab_size={decoder})"


TOKEN_ID = Rule(lambda value, config: is_int(value) and 0 <= value < token_id_limit(config),
                lambda config: f"it must be a token id in {_token_id_range(config)}")
# `<s>` may be absent: a Marian (OPUS-MT) vocabulary has none (its decoder starts from `<pad>`'s zero embedding).
OPTIONAL_TOKEN_ID = Rule(lambda value, config: value is None or (is_int(value) and 0 <= value < token_id_limit(config)),
                         lambda config: f"it must be None (no such token) or a token id in {_token_id_range(config)}")


def differs_from(other: str, why: str) -> Rule:
    """A special token id that must not equal the token id field ``other``."""
    return Rule(lambda value, config: value != getattr(config, other), f"it must differ from {other}{why}")


# The special tokens of both families: ids in the vocabulary; `</s>` and the decoder start are never padding.
SPECIAL_TOKEN_RULES: FieldRules = {
    "pad_token_id": (TOKEN_ID,),
    "bos_token_id": (TOKEN_ID,),
    "eos_token_id": (TOKEN_ID, differs_from("pad_token_id", ", which is masked out")),
    "unk_token_id": (TOKEN_ID,),
    "decoder_start_token_id": (TOKEN_ID, differs_from("pad_token_id", " (padding is never a decoder input)")),
}

# The fields every encoder-decoder of the package has, whatever its layers are (a family adds its own: its widths,
# dropouts and paper switches).
ENCODER_DECODER_RULES: FieldRules = {
    "vocab_size": (POSITIVE_INT,),
    "d_model": (POSITIVE_INT, EVEN_WIDTH),
    "max_position_embeddings": (POSITIVE_INT,),
    "dropout": (PROBABILITY,),
    "label_smoothing": (number_in(0.0, 1.0, high_open=True),),
    "layer_norm_eps": (number_in(0.0, 1.0, low_open=True, high_open=True),),
    "tie_word_embeddings": (FLAG,),
    "use_cache": (FLAG,),
    "is_encoder_decoder": (FLAG, ALWAYS_ENCODER_DECODER),
}


# ------------------------------------------------------------------------------------------------ loading
# The `impl` that save_pretrained writes under config.json's `custom_pipelines`: TRANSLATION_PIPELINE_SPEC["impl"] of
# pipeline_translation.py, repeated here so that this file imports no pipeline code.
OUR_PIPELINE_IMPL = "pipeline_translation.TranslationPipeline"


def without_pipelines_served_in_process(config_class: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` without the ``custom_pipelines`` entries of our translation pipeline when this process serves
    ``pipeline("translation")`` itself, so that a saved folder works there without ``trust_remote_code``.

    transformers' `pipeline` demands ``trust_remote_code=True`` for every task a config lists in ``custom_pipelines``,
    even when the task is registered in-process. So when ``config_class`` is the installed package's class (not a
    copy that remote code loaded from a ``transformers_modules`` folder, the same test transformers uses to prefer
    local code) and the ``translation`` task is registered (``import hf_deepnmt`` does it), the entries are left out
    of the loaded config and `pipeline` takes the registered pipeline. ``save_pretrained`` of every model of the
    package writes them again (``HubReadyMixin``), so saved folders keep working where hf_deepnmt is not installed.
    """
    pipelines = kwargs.get("custom_pipelines")
    if not isinstance(pipelines, dict) or config_class.__module__.startswith("transformers_modules"):
        return kwargs
    from transformers.pipelines import PIPELINE_REGISTRY

    if "translation" not in PIPELINE_REGISTRY.supported_tasks:
        return kwargs
    kept = {task: spec for task, spec in pipelines.items()
            if not (isinstance(spec, dict) and spec.get("impl") == OUR_PIPELINE_IMPL)}
    kwargs = {key: value for key, value in kwargs.items() if key != "custom_pipelines"}
    if kept:
        kwargs["custom_pipelines"] = kept
    return kwargs
