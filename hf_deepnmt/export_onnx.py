"""ONNX export of every model of the package, traced from the model's own modules.

Two graphs per model, made by `torch.onnx.export` (the dynamo exporter) from small programs that only call the
model's modules and move tensors in and out of its cache objects — no layer, attention or recurrence is written a
second time here:

* ``encoder.onnx``: ``input_ids``, ``attention_mask`` ``(B, S)`` → ``encoder_hidden_states`` and everything the
  decoder computes once per source sentence (its *memory*): for a Transformer the keys and values of every
  cross-attention (`DeepTransformerDecoder.project_memory`, what the first decoding step does lazily); for DTMT the
  attention keys projected once, the annotations split into heads, the source mask and the initial state s_0
  (`DTMTDecoder.start`).
* ``decoder.onnx``: one decoding step. Inputs: ``decoder_input_ids`` ``(N, 1)``, the memory, and the decoder's
  *past* — the state carried from step to step: the self-attention keys/values of every slot the model uses (dou2018
  multi-layer attention keeps one slot per attended layer), or DTMT's state s_{t-1} — and, where the family needs
  them, ``encoder_attention_mask`` ``(N, S)`` (Transformer) or ``position`` (a 0-d int64, DTMT's positional
  encoding). Outputs: ``logits`` ``(N, V)`` and the past after the step (``present.*``).

Every tensor has the (beam-expanded) batch first. Batch, source length and past length are symbolic dimensions of
the graphs; DTMT's encoder recurrence is traced as one loop (ONNX ``Scan``, `modeling_dtmt.exported_recurrence`).
`hf_deepnmt.ort_generation.OnnxSeq2SeqLM` runs the two graphs under transformers' own ``generate``.

The description of both graphs (which memory and past tensors, how the past starts) goes into the export's manifest
(`onnx_manifest`), which the runtime reads; it never imports this module (and ``torch.onnx`` is only imported here).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from .cache_dtmt import DTMTCache
from .errors import UserInputError

ONNX_OPSET = 18
# example sizes of the traced call: none is 0 or 1, which torch.export would specialise
EXAMPLE_BATCH, EXAMPLE_SOURCE, EXAMPLE_PAST = 2, 5, 3


# ------------------------------------------------------------------------------------------------ Transformer
def self_attention_slots(model: nn.Module) -> list[int]:
    """The self-attention cache slots a Transformer decoder writes: one per layer, plus one per attended lower layer
    of dou2018 multi-layer attention (`attention.multi_layer_cache_slot`); slots the numbering skips are left out."""
    slots = []
    for layer in model.get_decoder().layers:
        slots.append(layer.self_attn.layer_idx)
        for attention in layer.multi_layer_attns or ():
            slots.append(attention.layer_idx)
    return sorted(slots)


def cross_attention_layers(model: nn.Module) -> list[int]:
    """The decoder layers that have a cross-attention (li2022 CAD with p_net = 1.0 builds layers without)."""
    return [layer.layer_idx for layer in model.get_decoder().layers if layer.encoder_attn is not None]


class TransformerEncoderProgram(nn.Module):
    """``encoder.onnx`` of a Transformer: the encoder, then every cross-attention's keys and values."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.cross_layers = cross_attention_layers(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        self.model.get_decoder().project_memory(states, cache)
        memory = []
        for index in self.cross_layers:
            layer = cache.cross_attention_cache.layers[index]
            memory += [layer.keys, layer.values]  # (B, H, S, d_h) each
        return (states, *memory)


class TransformerStepProgram(nn.Module):
    """``decoder.onnx`` of a Transformer: one step of the model's forward on a cache rebuilt from the inputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.cross_layers = cross_attention_layers(model)
        self.slots = self_attention_slots(model)

    def forward(self, decoder_input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        memory, past = tensors[: 2 * len(self.cross_layers)], tensors[2 * len(self.cross_layers):]
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for number, index in enumerate(self.cross_layers):
            cache.cross_attention_cache.update(memory[2 * number], memory[2 * number + 1], index)
            cache.is_updated[index] = True  # the memory: the decoder does not project the encoder states again
        for number, slot in enumerate(self.slots):
            cache.self_attention_cache.update(past[2 * number], past[2 * number + 1], slot)  # (N, H, t, d_h)
        output = self.model(decoder_input_ids=decoder_input_ids, attention_mask=encoder_attention_mask,
                            encoder_outputs=BaseModelOutput(last_hidden_state=None), past_key_values=cache,
                            use_cache=True)
        present = []
        for slot in self.slots:
            layer = cache.self_attention_cache.layers[slot]
            present += [layer.keys, layer.values]  # (N, H, t + 1, d_h)
        return (output.logits[:, -1], *present)  # (N, V)


def _transformer_description(model: nn.Module) -> dict[str, Any]:
    config = model.config
    heads = config.decoder_attention_heads
    memory = [f"memory.{kind}.{index}" for index in cross_attention_layers(model) for kind in ("key", "value")]
    past = [{"name": f"past.{kind}.{slot}", "present": f"present.{kind}.{slot}", "initial": None,
             "empty_shape": [heads, 0, config.d_model // heads]}
            for slot in self_attention_slots(model) for kind in ("key", "value")]
    return {"memory": memory, "past": past, "decoder_inputs": ["decoder_input_ids", "encoder_attention_mask"]}


# ------------------------------------------------------------------------------------------------ DTMT
class DTMTEncoderProgram(nn.Module):
    """``encoder.onnx`` of DTMT: the bidirectional deep transition encoder, then `DTMTDecoder.start` (keys, values,
    mask and s_0, computed once per sentence)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states = self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        start = self.model.get_decoder().start(states, attention_mask)
        return states, start.keys, start.values, start.mask_bias, start.state


class DTMTStepProgram(nn.Module):
    """``decoder.onnx`` of DTMT: one step of the model's forward on a `DTMTCache` rebuilt from the inputs."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids: torch.Tensor, position: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, mask_bias: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cache = DTMTCache(state, keys, values, mask_bias, seen_tokens=position)  # position: 0-d, the step's token
        output = self.model(decoder_input_ids=decoder_input_ids, encoder_outputs=BaseModelOutput(
            last_hidden_state=None), past_key_values=cache, use_cache=True)
        return output.logits[:, -1], cache.state  # (N, V), s_t (N, d)


def _dtmt_description(model: nn.Module) -> dict[str, Any]:
    return {"memory": ["memory.keys", "memory.values", "memory.mask_bias"],
            "past": [{"name": "past.state", "present": "present.state", "initial": "initial.state",
                      "empty_shape": None}],
            "decoder_inputs": ["decoder_input_ids", "position"]}


# ------------------------------------------------------------------------------------------------ export
def _programs(model: nn.Module) -> tuple[nn.Module, nn.Module, dict[str, Any]]:
    """The encoder and step programs of ``model``'s family and the graphs' description."""
    if model.config.model_type == "dtmt":
        return DTMTEncoderProgram(model), DTMTStepProgram(model), _dtmt_description(model)
    return TransformerEncoderProgram(model), TransformerStepProgram(model), _transformer_description(model)


def onnx_manifest(description: dict[str, Any]) -> dict[str, Any]:
    """The ``onnx`` section of the export manifest from a family's graph description: the graphs' inputs and outputs
    and how the runtime starts the past (``initial``: an encoder output, or None for an empty tensor of
    ``empty_shape`` after the batch)."""
    encoder_outputs = ["encoder_hidden_states", *description["memory"],
                       *(entry["initial"] for entry in description["past"] if entry["initial"])]
    decoder_inputs = [*description["decoder_inputs"], *description["memory"],
                      *(entry["name"] for entry in description["past"])]
    return {"opset": ONNX_OPSET, "memory": description["memory"], "past": description["past"],
            "encoder": {"inputs": ["input_ids", "attention_mask"], "outputs": encoder_outputs},
            "decoder": {"inputs": decoder_inputs,
                        "outputs": ["logits", *(entry["present"] for entry in description["past"])]}}


class _Silenced(logging.Filter):
    """Drops log records no user can act on: torch.onnx's "torchvision is not installed. Skipping torchvision::nms"
    (four per graph) and ONNX Runtime's "Please consider to run pre-processing before quantization" (per graph)."""

    MESSAGES = ("torchvision is not installed", "consider to run pre-processing before quantization")

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in self.MESSAGES)


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """`_Silenced` on the loggers that emit those records (torch.onnx's registration module, the root logger that
    onnxruntime.quantization logs to), for the duration of an export."""
    silenced = _Silenced()
    loggers = [logging.getLogger("torch.onnx._internal.exporter._registration"), logging.getLogger()]
    for logger in loggers:
        logger.addFilter(silenced)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(silenced)


def _export(program: nn.Module, args: tuple, dynamic_shapes: tuple, input_names: list[str],
            output_names: list[str], path: Path) -> None:
    with warnings.catch_warnings(), _quiet_exporters():
        warnings.simplefilter("ignore")  # the exporter's own deprecation and tracing chatter
        onnx_program = torch.onnx.export(program, args, dynamo=True, opset_version=ONNX_OPSET,
                                         input_names=input_names, output_names=output_names,
                                         dynamic_shapes=dynamic_shapes, verbose=False)
    onnx_program.save(str(path))


def export_onnx(model: nn.Module, output_dir: str | Path, quantization: str | None = None) -> dict[str, Any]:
    """Write ``encoder.onnx`` and ``decoder.onnx`` of ``model`` (any model of the package, in eval mode, float32,
    on the CPU) into ``output_dir``; ``quantization="int8"`` then quantizes the weights of every MatMul and Gemm with
    ONNX Runtime's dynamic quantization. Returns the manifest's ``onnx`` section (`onnx_manifest`)."""
    if quantization not in (None, "int8"):
        raise UserInputError(f"`quantization` = {quantization!r} is not allowed for onnx; use int8 or none.")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    encoder, step, description = _programs(model)
    manifest = onnx_manifest(description)
    config = model.config
    limit = config.max_position_embeddings
    batch = torch.export.Dim("batch", min=1, max=65536)
    source = torch.export.Dim("source", min=1, max=limit)
    past_length = torch.export.Dim("past", min=1, max=limit - 1)  # runs with 0 too: nothing branches on it
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, config.vocab_size, (EXAMPLE_BATCH, EXAMPLE_SOURCE), generator=generator)
    attention_mask = torch.ones(EXAMPLE_BATCH, EXAMPLE_SOURCE, dtype=torch.long)
    attention_mask[1, -1] = 0
    with torch.no_grad():
        _export(encoder, (input_ids, attention_mask), ({0: batch, 1: source}, {0: batch, 1: source}),
                manifest["encoder"]["inputs"], manifest["encoder"]["outputs"], output_dir / "encoder.onnx")
        encoded = dict(zip(manifest["encoder"]["outputs"], encoder(input_ids, attention_mask)))
        tokens = torch.randint(4, getattr(config, "target_vocab_size", config.vocab_size), (EXAMPLE_BATCH, 1),
                               generator=generator)
        memory = [encoded[name] for name in description["memory"]]
        past = [encoded[entry["initial"]] if entry["initial"] else
                torch.randn(EXAMPLE_BATCH, *_example_shape(entry["empty_shape"]), generator=generator)
                for entry in description["past"]]
        memory_shapes = [{0: batch, 2: source} for _ in memory]  # (B, H, S, ·) keys/values, DTMT's mask (B, 1, S)
        past_shapes = [{0: batch, 2: past_length} if entry["initial"] is None else {0: batch}
                       for entry in description["past"]]
        if config.model_type == "dtmt":
            args = (tokens, torch.tensor(EXAMPLE_PAST), *memory, *past)
            shapes = ({0: batch}, None, *memory_shapes, *past_shapes)
        else:
            args = (tokens, attention_mask, *memory, *past)
            shapes = ({0: batch}, {0: batch, 1: source}, (*memory_shapes, *past_shapes))  # *tensors: one entry
        _export(step, args, shapes, manifest["decoder"]["inputs"], manifest["decoder"]["outputs"],
                output_dir / "decoder.onnx")
    if quantization == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        for name in ("encoder", "decoder"):
            path = output_dir / f"{name}.onnx"
            quantized = output_dir / f"{name}.int8.onnx"
            with _quiet_exporters():
                quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8,
                                 op_types_to_quantize=["MatMul", "Gemm"], extra_options={"EnableSubgraph": True})
            quantized.replace(path)
    return manifest


def _example_shape(empty_shape: list[int]) -> list[int]:
    """An empty past's shape with the example past length in place of its 0."""
    return [EXAMPLE_PAST if size == 0 else size for size in empty_shape]
