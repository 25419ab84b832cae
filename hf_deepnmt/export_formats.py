"""What each export format can hold: the formats, engines and weight types, the one list of mechanisms a format
cannot express (`mechanism_blockers`, read through `format_blockers` / `export_blockers` with the model type's registry
entry), and the standard Transformer a CTranslate2 export is written from (`standard_model`). `hf_deepnmt.export` (the
entry point) and the format modules (`export_onnx`, `export_ctranslate2`, `export_marian`) read it; it imports none
of them.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from .admin import fold_admin
from .errors import UserInputError
from .modeling_common import unwrap_model
from .papers import TRANSFORMER, Blocker, papers_of
from .registry import MODEL_TYPES, model_type_names

EXPORT_FORMATS: tuple[str, ...] = ("ctranslate2", "onnx", "marian", "argos")
ENGINES: tuple[str, ...] = ("torch", "ctranslate2", "onnx")
# Weight types each format can store (None = float32).
QUANTIZATIONS: dict[str, tuple[str, ...]] = {
    "ctranslate2": ("int8", "int8_float32", "bfloat16"),
    "onnx": ("int8",),
    "marian": ("bfloat16",),
    "argos": ("int8", "int8_float32", "bfloat16"),  # its model/ is a CTranslate2 model
}
# The Transformer model types of this package (one implementation, `modeling_deep_transformer`).
STANDARD_MODEL_TYPES: tuple[str, ...] = model_type_names(TRANSFORMER)
MANIFEST = "deepnmt_export.json"
# The optional modules (the `export` extra) that writing a format or running an engine imports.
REQUIRED_MODULES: dict[str, tuple[str, ...]] = {
    "export onnx": ("onnx", "onnxscript", "onnxruntime"),  # torch.onnx.export's dependencies; int8: ONNX Runtime
    "export ctranslate2": ("ctranslate2",),
    "export marian": (),
    "export argos": ("ctranslate2", "sentencepiece", "google.protobuf"),
    "engine torch": (),
    "engine onnx": ("onnxruntime",),
    "engine ctranslate2": ("ctranslate2",),
}


def check_modules(kind: str, name: str) -> None:
    """One sentence naming the extra when a module that the ``kind`` ("export" or "engine") ``name`` needs is not
    installed (checked without importing it)."""
    import importlib.util

    missing = [module for module in REQUIRED_MODULES[f"{kind} {name}"] if importlib.util.find_spec(module) is None]
    if missing:
        what = f"the {name} export" if kind == "export" else f"the {name} engine"
        raise UserInputError(f"{what} needs {' and '.join(missing)}, which the `export` extra installs: "
                             "pip install 'hf_deepnmt[export]'.")
# Activations CTranslate2 implements (names of `ctranslate2.specs.common_spec.Activation`); `quick_gelu` is
# x·σ(1.702x), CTranslate2's GELUSigmoid.
CT2_ACTIVATIONS: dict[str, str] = {
    "relu": "RELU",
    "gelu": "GELU",
    "gelu_new": "GELUTanh",
    "gelu_fast": "GELUTanh",
    "gelu_pytorch_tanh": "GELUTanh",
    "quick_gelu": "GELUSigmoid",
    "silu": "SWISH",
    "swish": "SWISH",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
}


def mechanism_blockers(config: Any) -> list[Blocker]:
    """Every switch of a Transformer ``config`` that some format cannot express, each named once, with the formats
    it blocks: the Transformer's own (pre-LN, LayerNorm epsilon, activation), then each paper's
    (`hf_deepnmt.papers.Paper.export_blockers`). ADMIN is never one (it folds away, `hf_deepnmt.admin.fold_admin`),
    nor are li2022's CAD at p_net < 1 (it acts only in training), DDR and ALD (losses); fields a config lacks read as
    their defaults."""
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    blockers = []
    # the Transformer's own structure (docs/fast-inference.md)
    if values.get("layer_norm_position", "post") != "post":
        blockers.append(Blocker(f"layer_norm_position={values['layer_norm_position']!r}", "pre-LN",
                                "Marian is post-LN", ("marian",)))
    positions, offset = values.get("position_encoding", "sinusoidal"), values.get("position_offset", 0)
    if positions != "sinusoidal" or offset != 0:
        blockers.append(Blocker(f"position_encoding={positions!r} (position_offset={offset})",
                                "positions other than Vaswani et al.'s sinusoids from 0",
                                "Marian's are those sinusoids from position 0", ("marian",)))
    eps = values.get("layer_norm_eps", 1e-5)
    if not math.isclose(eps, 1e-5):
        blockers.append(Blocker(f"layer_norm_eps={eps}", "a LayerNorm epsilon other than 1e-5",
                                "Marian's LayerNorms use 1e-5", ("marian",)))
    activation = values.get("activation_function", "relu")
    if activation not in CT2_ACTIVATIONS:
        blockers.append(Blocker(f"activation_function={activation!r}", "an activation CTranslate2 lacks",
                                f"CTranslate2 has {', '.join(sorted(CT2_ACTIVATIONS))}", ("ctranslate2",)))
    for paper in papers_of(TRANSFORMER):  # each paper's switches, as its description names them
        blockers += paper.export_blockers(values)
    return blockers


def format_blockers(config: Any, export_format: str) -> list[Blocker]:
    """What of ``config`` ``export_format`` cannot express (empty: exportable). The model type's registry entry
    decides whether the family can be written to the format at all (`ModelTypeEntry.export_formats`; DTMT only to
    ``onnx``); for a family that can, `mechanism_blockers` names the switches the format lacks."""
    if export_format not in EXPORT_FORMATS:
        raise UserInputError(f"`export_format` = {export_format!r} is not allowed; use one of {', '.join(EXPORT_FORMATS)}.")
    if export_format == "argos":  # an Argos package's model is a CTranslate2 model (hf_deepnmt.export_argos)
        return format_blockers(config, "ctranslate2")
    model_type = getattr(config, "model_type", None)
    entry = MODEL_TYPES.get(model_type)
    if entry is None:
        return [Blocker(f"model_type={model_type!r}", "a model type of another package",
                        f"hf_deepnmt's are {', '.join(MODEL_TYPES)}", EXPORT_FORMATS)]
    if export_format not in entry.export_formats:
        return [Blocker(f"model_type={model_type!r}", entry.export_refusal or f"the {entry.family} family", "",
                        (export_format,))]
    if export_format == "onnx":
        return []  # the graphs are traced from the model's own modules: every mechanism of the package
    return [blocker for blocker in mechanism_blockers(config) if export_format in blocker.formats]


def export_blockers(config: Any, export_format: str) -> list[str]:
    """The mechanisms of ``config`` that ``export_format`` cannot express, one phrase each (empty: exportable);
    ``onnx`` takes every model type of the package (`format_blockers`)."""
    return [str(blocker) for blocker in format_blockers(config, export_format)]


def check_exportable(config: Any, export_format: str) -> None:
    """Raise one `ValueError` sentence naming every mechanism ``export_format`` cannot express."""
    blockers = export_blockers(config, export_format)
    if blockers:
        # DTMT is also `deepnmt train`'s CPU default model (docs/defaults.md): say how to get its exportable alternative
        retrain = (" (`deepnmt train --model_type deep_transformer` trains the CPU defaults' Transformer instead, "
                   "which every format takes)") if getattr(config, "model_type", None) == "dtmt" else ""
        raise UserInputError(f"cannot export to {export_format}: the model uses {'; '.join(blockers)}, which a standard "
                             "Transformer cannot express exactly; export it with --format onnx (every model of the "
                             f"package) or translate it with the torch engine{retrain}.")


def standard_model(model: nn.Module) -> nn.Module:
    """The model as a standard Transformer in eval mode: ADMIN folded (`fold_admin`), float32, on the CPU."""
    model = unwrap_model(model)
    if getattr(model.config, "residual_scaling", "none") == "admin":
        model = fold_admin(model)
    return model.float().cpu().eval()
