"""Fast inference outside PyTorch: export to ONNX Runtime, CTranslate2 or a stock `MarianMTModel`, and run them.

Formats (``deepnmt export --format ...``; `export_model`):

* ``onnx`` — every model of the package: each Transformer variant (post-/pre-LN, liu2020 ADMIN, li2022 CAD, dou2018
  layer aggregation and multi-layer attention, in any combination) and meng2019 DTMT. `hf_deepnmt.export_onnx`
  traces ``encoder.onnx`` and ``decoder.onnx`` (one decoding step, its past state as inputs and outputs) from the
  model's own modules; `hf_deepnmt.ort_generation.OnnxSeq2SeqLM` runs them under transformers' own ``generate``.
  ``int8``: ONNX Runtime's dynamic quantization of the MatMul/Gemm weights.
* ``ctranslate2`` — the Transformer variants that are mathematically a standard Transformer: post-/pre-LN, scaled or
  unscaled embeddings, tied or untied output projection, liu2020 ADMIN after `fold_admin`, li2022 CAD
  (`hf_deepnmt.export_ctranslate2`). CTranslate2 has no layer aggregation, no multi-layer attention and no
  recurrent decoder, so dou2018's mechanisms and DTMT are refused with one sentence naming them (`export_blockers`)
  that points to ``--format onnx``. ``int8``, ``int8_float32``, ``bfloat16``.
* ``marian`` — the same standard variants as a `transformers.MarianMTModel` folder without custom code
  (`hf_deepnmt.export_marian`), float32 or ``bfloat16``.
* ``argos`` — the same standard variants as an Argos Translate package (``translate-<from>_<to>.argosmodel``: the
  CTranslate2 model and our BPE tokenizer as a SentencePiece model; `hf_deepnmt.export_argos`), which
  ``argostranslate`` and LibreTranslate install; the CTranslate2 weight types.

The tokenizer travels with every export (``tokenizer.json`` beside the weights); ``deepnmt_export.json`` records
the format, the special tokens and the generation defaults; an ONNX export also holds the model's ``config.json``
and ``generation_config.json``. ``ctranslate2``, ``onnxruntime`` and ``onnx`` are optional (``pip install
hf_deepnmt[export]``) and imported inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import UserInputError
from .export_argos import write_argos
from .export_ctranslate2 import CTranslate2Engine, export_ctranslate2
from .export_formats import (  # noqa: F401  (the public names of hf_deepnmt.export)
    ENGINES,
    EXPORT_FORMATS,
    MANIFEST,
    QUANTIZATIONS,
    STANDARD_MODEL_TYPES,
    check_exportable,
    check_modules,
    export_blockers,
    format_blockers,
    standard_model,
)
from .export_marian import write_marian
from .modeling_common import unwrap_model
from .pipeline_translation import recorded_language_pairs

# ------------------------------------------------------------------------------------------------ one entry point
def export_model(model: nn.Module, tokenizer: Any, output_dir: str | os.PathLike, export_format: str,
                 quantization: str | None = None) -> Path:
    """Export ``model`` to ``export_format`` (one of `EXPORT_FORMATS`) in ``output_dir``, with the tokenizer and a
    ``deepnmt_export.json`` manifest beside it. Unknown formats, quantizations the format cannot store and models
    with a mechanism the format cannot express raise one `ValueError` sentence (see `export_blockers`)."""
    if export_format not in EXPORT_FORMATS:
        raise UserInputError(f"`format` = {export_format!r} is not allowed; use one of {', '.join(EXPORT_FORMATS)}.")
    if quantization is not None and quantization not in QUANTIZATIONS[export_format]:
        raise UserInputError(f"`quantization` = {quantization!r} is not allowed for {export_format}; use "
                             f"{' or '.join(QUANTIZATIONS[export_format])}, or leave it unset for float32.")
    check_exportable(model.config, export_format)
    check_modules("export", export_format)
    model = unwrap_model(model)
    output_dir = Path(output_dir)
    # Written in a sibling folder and moved into place at the end: a failed or killed export leaves nothing (no empty
    # or half-written folder); into an existing folder the files are moved one by one, replacing those of the same
    # name, as writing them there directly would.
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    try:
        write_export(model, tokenizer, partial, export_format, quantization)
        if output_dir.is_dir() and not any(output_dir.iterdir()):
            output_dir.rmdir()
        if not output_dir.exists():
            partial.rename(output_dir)
        else:
            for path in partial.iterdir():
                target = output_dir / path.name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                path.replace(target)
            partial.rmdir()
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return output_dir


def write_export(model: nn.Module, tokenizer: Any, output_dir: Path, export_format: str,
                 quantization: str | None) -> None:
    """The files of an export (`export_model`) written into the existing folder ``output_dir``."""
    onnx_section = argos_section = None
    if export_format == "onnx":
        from .export_onnx import export_onnx

        exported = model.float().cpu().eval()  # ADMIN stays as trained: the graph runs the model's own modules
        onnx_section = export_onnx(exported, output_dir, quantization)
        exported.config.save_pretrained(output_dir)  # config.json and generation_config.json, read by OnnxSeq2SeqLM
        exported.generation_config.save_pretrained(output_dir)
    elif export_format == "ctranslate2":
        export_ctranslate2(standard_model(model), tokenizer, output_dir, quantization)
    elif export_format == "argos":
        argos_section = write_argos(model, tokenizer, output_dir, quantization)
    else:
        write_marian(model, output_dir, quantization)
    tokenizer.save_pretrained(output_dir)  # the tokenizer travels with the export
    config, generation = model.config, model.generation_config
    manifest = {
        "format": export_format,
        "quantization": quantization or "float32",
        "source_model_type": config.model_type,
        "admin_folded": export_format != "onnx" and getattr(config, "residual_scaling", "none") == "admin",
        "d_model": config.d_model,
        "vocab_size": config.vocab_size,
        "target_vocab_size": getattr(config, "target_vocab_size", config.vocab_size),
        "max_position_embeddings": config.max_position_embeddings,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        # the language pair the model translates, as its config records it (`record_language_pair`)
        "language_pairs": [f"translation_{source}_to_{target}" for source, target in recorded_language_pairs(config)],
        "generation": {
            "num_beams": generation.num_beams,
            "max_new_tokens": generation.max_new_tokens,
            # transformers' defaults where the config leaves them unset (None)
            "length_penalty": 1.0 if generation.length_penalty is None else generation.length_penalty,
            "early_stopping": False if generation.early_stopping is None else generation.early_stopping,
            # a converted OPUS-MT / fairseq model's: <pad> never produced, </s> at the length limit
            "bad_words_ids": generation.bad_words_ids,
            "forced_eos_token_id": generation.forced_eos_token_id,
        },
    }
    if onnx_section is not None:
        manifest["onnx"] = onnx_section
    if argos_section is not None:
        manifest["argos"] = argos_section
    (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------ engines
def pad_batch(sources: Sequence[Sequence[int]], pad_token_id: int) -> tuple[Any, Any]:
    """Right-padded ``input_ids`` and ``attention_mask`` (int64 numpy arrays) of token id lists."""
    import numpy as np

    length = max(len(ids) for ids in sources)
    input_ids = np.full((len(sources), length), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(sources), length), dtype=np.int64)
    for row, ids in enumerate(sources):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask


class TorchEngine:
    """`generate` of a model behind the engine interface: a PyTorch model (optionally under bf16 autocast on the
    CPU), or an ONNX export's `OnnxSeq2SeqLM` (`OnnxEngine`) — transformers' search either way."""

    def __init__(self, model: nn.Module, bf16: bool = False):
        self.model = model.eval()
        self.bf16 = bf16

    @property
    def max_positions(self) -> int:
        return getattr(self.model.config, "max_position_embeddings", 1024)

    @torch.no_grad()
    def generate(self, sources: Sequence[Sequence[int]], num_beams: int = 4, max_new_tokens: int = 256,
                 length_penalty: float | None = None, early_stopping: bool | None = None,
                 min_new_tokens: int = 0) -> list[list[int]]:
        """Token ids of the best hypothesis per source (``</s>`` included when produced, no start token); unset
        search settings (``length_penalty``, ``early_stopping``) come from the model's generation config."""
        input_ids, attention_mask = (torch.from_numpy(array) for array in
                                     pad_batch(sources, self.model.config.pad_token_id))
        device = self.model.device
        settings = {key: value for key, value in (("length_penalty", length_penalty),
                                                  ("early_stopping", early_stopping)) if value is not None}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
            output = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                         num_beams=num_beams, max_new_tokens=max_new_tokens, do_sample=False,
                                         num_return_sequences=1, min_new_tokens=min_new_tokens or None, **settings)
        return [self._tokens(row) for row in output[:, 1:].tolist()]  # without the decoder start token


    def takes_budgets(self, num_beams: int) -> bool:
        """Whether `generate_budgets` can decode this model's beam-``num_beams`` search (`hf_deepnmt.retiring_search`:
        float32, a class it is tested with, the model's generation settings inside it)."""
        from .retiring_search import unsupported

        return not self.bf16 and unsupported(self.model, {"num_beams": num_beams}) is None

    @torch.no_grad()
    def generate_budgets(self, sources: Sequence[Sequence[int]], budgets: Sequence[int],
                         num_beams: int = 4) -> list[list[int]]:
        """`generate`'s output for sources of different new-token ``budgets`` in one retiring search (each source
        leaves the batch once its hypotheses are final; the same tokens as `generate` on each budget's sources)."""
        from .retiring_search import retiring_generate, search_settings

        input_ids, attention_mask = (torch.from_numpy(array) for array in
                                     pad_batch(sources, self.model.config.pad_token_id))
        device = self.model.device
        found = retiring_generate(self.model, input_ids.to(device), attention_mask.to(device), budgets,
                                  search_settings(self.model, {"num_beams": num_beams}))
        return [self._tokens(hypotheses.sequences[0, 1:].tolist()) for hypotheses in found]

    def _tokens(self, row: list[int]) -> list[int]:
        """A row of token ids without the start token, cut after ``</s>`` and without padding."""
        pad, eos = self.model.config.pad_token_id, self.model.config.eos_token_id
        tokens = []
        for token in row:
            tokens.append(token)
            if token == eos:
                break
        while tokens and tokens[-1] == pad and pad != eos:
            tokens.pop()
        return tokens


class OnnxEngine(TorchEngine):
    """An ``onnx`` export run by ONNX Runtime (``intra_threads`` threads) under transformers' ``generate``
    (`hf_deepnmt.ort_generation.OnnxSeq2SeqLM`)."""

    def __init__(self, folder: str | os.PathLike, intra_threads: int = 2):
        from .ort_generation import OnnxSeq2SeqLM

        super().__init__(OnnxSeq2SeqLM.from_export(folder, intra_threads))


def load_engine(folder: str | os.PathLike, engine: str, intra_threads: int = 2, bf16: bool = False,
                compute_type: str = "default") -> Any:
    """The ``engine`` (one of `ENGINES`) for ``folder``: a saved model for ``torch``, an export of that format
    for the others. Each has ``generate(list of source id lists, num_beams, max_new_tokens, ...)``."""
    if engine not in ENGINES:
        raise UserInputError(f"`engine` = {engine!r} is not allowed; use one of {', '.join(ENGINES)}.")
    folder = Path(folder) if os.path.isdir(folder) else folder
    if engine == "torch":
        from transformers import AutoModelForSeq2SeqLM

        return TorchEngine(AutoModelForSeq2SeqLM.from_pretrained(folder), bf16=bf16)
    if bf16:
        raise UserInputError(f"`--bf16` is not allowed with the {engine} engine; it runs the weights the export stored.")
    check_modules("engine", engine)
    if not (Path(folder) / MANIFEST).is_file():
        raise UserInputError(f"{folder} is not an hf_deepnmt export (no {MANIFEST}); make one with "
                         f"`deepnmt export --format {engine} MODEL OUT`.")
    if engine == "onnx":
        return OnnxEngine(folder, intra_threads)
    return CTranslate2Engine(folder, intra_threads, compute_type)
