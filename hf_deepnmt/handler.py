"""`EndpointHandler`: the custom handler of Hugging Face Inference Endpoints for a saved hf_deepnmt model folder.

Inference Endpoints look for a ``handler.py`` with ``class EndpointHandler`` at the root of a model repository, build
it once with the repository's path and call it with each request's JSON body::

    handler = EndpointHandler("/repository")
    handler({"inputs": "In the beginning God created the heavens and the earth.",
             "parameters": {"num_beams": 4, "max_new_tokens": 64}})
    # -> [{"translation_text": "En el principio creó Dios los cielos y la tierra."}]

``inputs`` is a string or a list of strings (one ``{"translation_text": ...}`` per string, in order; a list of them
per string when ``num_return_sequences > 1``); ``parameters`` (optional) are the translation pipeline's arguments,
passed as they are (``num_beams``, ``max_new_tokens``, ``num_return_sequences``, ``src_lang``, ...).

Engine: on a CPU endpoint whose folder holds an ONNX export in ``onnx/`` (``deepnmt export --format onnx RUN
RUN/onnx``, recognised by its ``onnx/deepnmt_export.json``), the handler runs it with ONNX Runtime
(``ort_generation.py``: transformers' own ``generate`` over the exported graphs); otherwise — no export, or a GPU
visible, where the torch model on CUDA is the faster engine — it runs the torch model. ``handler.engine`` says which (``"onnx"`` or ``"torch"``). The ONNX path needs ``onnxruntime``, which the
endpoint installs from a ``requirements.txt`` in the repository. Either way the request goes through the folder's
own translation pipeline (``pipeline_translation.py``), so outputs and error sentences are the pipeline's.

``save_pretrained`` of every model of the package copies this file next to the weights, with ``ort_generation.py``
(as it copies the modeling code), so a folder written by ``deepnmt train`` or pushed by ``deepnmt push`` is an
endpoint as it stands. It imports only torch and transformers (and ONNX Runtime for an export): the endpoint does not
install hf_deepnmt, and imports this file as a top-level module; the folder's other files are then loaded as
transformers' remote code.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

ONNX_SUBFOLDER = "onnx"  # where the handler looks for an ONNX export inside the model folder
EXPORT_MANIFEST = "deepnmt_export.json"  # the file every `deepnmt export` writes (ort_generation.MANIFEST)


class EndpointHandler:
    """Translate the ``inputs`` of an Inference Endpoints request with the model saved in ``path``: its ONNX export
    in ``path/onnx`` when there is one, else its torch weights (``engine`` says which)."""

    def __init__(self, path: str = "") -> None:
        import torch

        folder = Path(path or ".")
        export = folder / ONNX_SUBFOLDER
        # an ONNX export serves CPU endpoints; on a GPU the torch model on CUDA is the faster engine
        has_export = (export / EXPORT_MANIFEST).is_file()
        self.engine = "onnx" if has_export and not torch.cuda.is_available() else "torch"
        if self.engine == "onnx":
            from transformers import AutoTokenizer

            if importlib.util.find_spec("onnxruntime") is None:
                raise ImportError(f"{export} holds an ONNX export, which needs ONNX Runtime: put a requirements.txt "
                                  "with the line `onnxruntime` next to handler.py (Inference Endpoints install it), "
                                  f"or remove {export} to serve the torch weights.")
            model = onnx_model_class(folder).from_export(export)
            pipeline_class = translation_pipeline_class(folder)
            tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
            self.pipeline = pipeline_class(model=model, tokenizer=tokenizer, task="translation")
        else:
            from transformers import pipeline

            self.pipeline = pipeline("translation", model=str(folder), trust_remote_code=True,
                                     device=0 if torch.cuda.is_available() else -1)

    def __call__(self, data: dict[str, Any]) -> list[Any]:
        """``{"inputs": str | list[str], "parameters": {...}}`` -> ``[{"translation_text": str}, ...]``."""
        inputs, parameters = check_request(data)
        outputs = self.pipeline(inputs, **parameters)
        return outputs if isinstance(outputs, list) else [outputs]


def onnx_model_class(folder: str | os.PathLike) -> type:
    """``OnnxSeq2SeqLM``: this package's when handler.py runs inside it, else the copy in ``folder`` loaded as
    transformers' remote code (the endpoint imports handler.py as a top-level module, where a relative import
    fails)."""
    try:
        from .ort_generation import OnnxSeq2SeqLM
    except ImportError:
        if __package__:
            raise
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        OnnxSeq2SeqLM = get_class_from_dynamic_module("ort_generation.OnnxSeq2SeqLM", str(folder))
    return OnnxSeq2SeqLM


def translation_pipeline_class(folder: str | os.PathLike) -> type:
    """``TranslationPipeline``: this package's when handler.py runs inside it, else the copy in ``folder`` loaded as
    transformers' remote code (see `onnx_model_class`)."""
    try:
        from .pipeline_translation import TranslationPipeline
    except ImportError:
        if __package__:
            raise
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        TranslationPipeline = get_class_from_dynamic_module("pipeline_translation.TranslationPipeline", str(folder))
    return TranslationPipeline


def check_request(data: Any) -> tuple[str | list[str], dict[str, Any]]:
    """The request's ``inputs`` and ``parameters``, or one `ValueError` sentence naming the field, its value and what
    is allowed."""
    if not isinstance(data, dict):
        raise ValueError(f"the request body is {type(data).__name__}; send a JSON object "
                         '{"inputs": "text" or ["text", ...], "parameters": {...}}.')
    unknown = sorted(set(data) - {"inputs", "parameters"})
    if unknown:
        raise ValueError(f"the request has fields {unknown}; only `inputs` and `parameters` are allowed.")
    if "inputs" not in data:
        raise ValueError('the request has no `inputs`; send {"inputs": "text" or ["text", ...]}.')
    inputs = data["inputs"]
    if not isinstance(inputs, (str, list)) or (isinstance(inputs, list) and (
            not inputs or not all(isinstance(item, str) for item in inputs))):
        raise ValueError(f"`inputs` = {inputs!r:.80} is not allowed; use a string or a non-empty list of strings.")
    parameters = data.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ValueError(f"`parameters` = {parameters!r:.80} is not allowed; use an object of generation arguments "
                         'such as {"num_beams": 4, "max_new_tokens": 64}.')
    return inputs, parameters
