"""The one list of this package's model types.

Each entry ties a ``model_type`` to its config class, its two model classes and what the rest of the package needs to
know about it: its family (one Transformer implementation serves four types; DTMT is a family of its own), the
paper it follows, a one-line summary for ``--help``, its model-card template and the export formats the family can
be written to. `hf_deepnmt.__init__` registers the Auto classes from it; export, the command line, the model cards
and ``--help`` read it instead of keeping lists of their own.

Not copied next to the weights: a saved model's code never needs it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from .configuration_deep_transformer import (
    AdminTransformerConfig,
    DeepDecoderTransformerConfig,
    DeepRepresentationTransformerConfig,
    DeepTransformerConfig,
)
from .configuration_dtmt import DTMTConfig
from .errors import UserInputError
from .papers import DTMT, PAPERS, TRANSFORMER  # noqa: F401  (the families, and the papers' descriptions)
from .modeling_deep_transformer import (
    AdminTransformerForConditionalGeneration,
    AdminTransformerModel,
    DeepDecoderTransformerForConditionalGeneration,
    DeepDecoderTransformerModel,
    DeepRepresentationTransformerForConditionalGeneration,
    DeepRepresentationTransformerModel,
    DeepTransformerForConditionalGeneration,
    DeepTransformerModel,
)
from .modeling_dtmt import DTMTForConditionalGeneration, DTMTModel



@dataclass(frozen=True)
class ModelTypeEntry:
    """One model type of the package."""

    model_type: str
    family: str
    """``"transformer"`` (modeling_deep_transformer.py) or ``"dtmt"`` (modeling_dtmt.py)."""
    paper: str | None
    """The key of the paper (`hf_deepnmt.papers.PAPERS`) whose defaults the type carries (None: the plain
    Transformer baseline)."""
    summary: str
    """One line for ``--help`` and error messages."""
    config_class: type
    base_model_class: type
    seq2seq_class: type
    card_template: str
    """The file name (without ``.md``) of its template in ``model_cards/templates``."""
    export_formats: tuple[str, ...]
    """The formats of `hf_deepnmt.export` the family can be written to: the export decides from this entry alone
    whether a model type can be written to a format at all; within a family that can, the switches a format cannot
    express are refused by name (`hf_deepnmt.export_formats.mechanism_blockers`)."""
    export_refusal: str = ""
    """What the other formats cannot express, as their refusal names it (``hf_deepnmt.export_formats.format_blockers``)."""


MODEL_TYPES: dict[str, ModelTypeEntry] = {
    entry.model_type: entry
    for entry in (
        ModelTypeEntry("deep_transformer", TRANSFORMER, None,
                       "the Transformer with every deep-NMT switch (post/pre-LN, li2022, liu2020, dou2018)",
                       DeepTransformerConfig, DeepTransformerModel, DeepTransformerForConditionalGeneration,
                       "deep_transformer", ("ctranslate2", "onnx", "marian")),
        ModelTypeEntry("admin_transformer", TRANSFORMER, "liu2020",
                       "liu2020's very deep post-LN Transformer with ADMIN (60L-12L defaults)",
                       AdminTransformerConfig, AdminTransformerModel, AdminTransformerForConditionalGeneration,
                       "deep_transformer", ("ctranslate2", "onnx", "marian")),
        ModelTypeEntry("deep_decoder_transformer", TRANSFORMER, "li2022",
                       "li2022's deep decoder with cross-attention drop and the DDR/ALD losses (15L-15L defaults)",
                       DeepDecoderTransformerConfig, DeepDecoderTransformerModel,
                       DeepDecoderTransformerForConditionalGeneration, "deep_transformer",
                       ("ctranslate2", "onnx", "marian")),
        ModelTypeEntry("deep_representation_transformer", TRANSFORMER, "dou2018",
                       "dou2018's layer aggregation, multi-layer attention and layer diversity (Base defaults)",
                       DeepRepresentationTransformerConfig, DeepRepresentationTransformerModel,
                       DeepRepresentationTransformerForConditionalGeneration, "deep_transformer",
                       ("ctranslate2", "onnx", "marian")),
        ModelTypeEntry("dtmt", DTMT, "meng2019",
                       "meng2019's DTMT deep-transition GRU encoder-decoder (L-GRU, T-GRU, multi-head additive "
                       "attention)", DTMTConfig, DTMTModel, DTMTForConditionalGeneration, "dtmt", ("onnx",),
                       "meng2019 DTMT's deep-transition recurrent layers, an L-GRU/T-GRU encoder and decoder"),
    )
}


def model_type_names(family: str | None = None) -> tuple[str, ...]:
    """Every model type of the package (of one family when ``family`` is given), in registry order."""
    return tuple(name for name, entry in MODEL_TYPES.items() if family is None or entry.family == family)


def model_type_entry(model_type: str, what: str = "`model_type`") -> ModelTypeEntry:
    """The entry of ``model_type``; one sentence naming the closest types when there is none."""
    entry = MODEL_TYPES.get(model_type)
    if entry is None:
        close = difflib.get_close_matches(str(model_type), list(MODEL_TYPES), n=2, cutoff=0.6)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise UserInputError(f"{what} = {model_type!r} is not a model type of hf_deepnmt{hint}; use one of "
                             f"{', '.join(MODEL_TYPES)}.")
    return entry
