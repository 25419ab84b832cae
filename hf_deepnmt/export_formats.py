"""What each export format can hold: the formats, engines and weight types, which mechanisms a format cannot express
(`export_blockers`), and the standard Transformer a CTranslate2 or Marian export is written from (`standard_model`).
`hf_deepnmt.export` (the entry point) and the format modules read it; it imports neither.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .admin import fold_admin, non_standard_features
from .errors import UserInputError
from .modeling_common import unwrap_model
from .registry import MODEL_TYPES, TRANSFORMER, model_type_names

EXPORT_FORMATS: tuple[str, ...] = ("ctranslate2", "onnx", "marian")
ENGINES: tuple[str, ...] = ("torch", "ctranslate2", "onnx")
# Weight types each format can store (None = float32).
QUANTIZATIONS: dict[str, tuple[str, ...]] = {
    "ctranslate2": ("int8", "int8_float32", "bfloat16"),
    "onnx": ("int8",),
    "marian": ("bfloat16",),
}
# The Transformer model types of this package (one implementation, `modeling_deep_transformer`).
STANDARD_MODEL_TYPES: tuple[str, ...] = model_type_names(TRANSFORMER)
MANIFEST = "deepnmt_export.json"
# The optional modules (the `export` extra) that writing a format or running an engine imports.
REQUIRED_MODULES: dict[str, tuple[str, ...]] = {
    "export onnx": ("onnx", "onnxscript", "onnxruntime"),  # torch.onnx.export's dependencies; int8: ONNX Runtime
    "export ctranslate2": ("ctranslate2",),
    "export marian": (),
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


def export_blockers(config: Any, export_format: str) -> list[str]:
    """The mechanisms of ``config`` that ``export_format`` cannot express exactly (empty: exportable).

    ``onnx`` takes every model type of the package. For ``ctranslate2`` and ``marian``, ADMIN is never a blocker (it
    folds away), nor are li2022's CAD, DDR and ALD (CAD acts only in training or builds layers without
    cross-attention, which both formats encode exactly; DDR and ALD are losses).
    """
    if export_format not in EXPORT_FORMATS:
        raise UserInputError(f"`export_format` = {export_format!r} is not allowed; use one of {', '.join(EXPORT_FORMATS)}.")
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:
        return [f"model_type {model_type!r}, which is not one of this package's model types "
                f"({', '.join(MODEL_TYPES)})"]
    if export_format == "onnx":
        return []
    if model_type not in STANDARD_MODEL_TYPES:
        return ["meng2019 DTMT's deep-transition recurrent layers (L-GRU/T-GRU encoder and decoder)"]
    blockers = []
    for stack in ("encoder", "decoder"):
        aggregation = getattr(config, f"{stack}_layer_aggregation", "none")
        if aggregation not in (None, "none"):
            blockers.append(f"dou2018 {stack} layer aggregation ({stack}_layer_aggregation={aggregation!r}: the "
                            "stack's output combines every layer's output)")
    if (getattr(config, "multi_layer_attention_k", 1) or 1) > 1:
        blockers.append(f"dou2018 multi-layer attention (multi_layer_attention_k={config.multi_layer_attention_k}: "
                        "self-attention attends to several layers' outputs)")
    if export_format == "ctranslate2" and config.activation_function not in CT2_ACTIVATIONS:
        blockers.append(f"activation_function={config.activation_function!r} (CTranslate2 has "
                        f"{', '.join(sorted(CT2_ACTIVATIONS))})")
    if export_format == "marian":
        blockers.extend(non_standard_features(config))
    return blockers


def check_exportable(config: Any, export_format: str) -> None:
    """Raise one `ValueError` sentence naming every mechanism ``export_format`` cannot express."""
    blockers = export_blockers(config, export_format)
    if blockers:
        raise UserInputError(f"cannot export to {export_format}: the model uses {'; '.join(blockers)}, which a standard "
                             "Transformer cannot express exactly; export it with --format onnx (every model of the "
                             "package) or translate it with the torch engine.")


def standard_model(model: nn.Module) -> nn.Module:
    """The model as a standard Transformer in eval mode: ADMIN folded (`fold_admin`), float32, on the CPU."""
    model = unwrap_model(model)
    if getattr(model.config, "residual_scaling", "none") == "admin":
        model = fold_admin(model)
    return model.float().cpu().eval()
