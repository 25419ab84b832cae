"""Fast inference outside `generate`: export to CTranslate2, ONNX Runtime or a stock `MarianMTModel`, and run them.

Every Transformer variant of this package that is mathematically a standard Transformer exports exactly:

* post-LN and pre-LN (with the final LayerNorm of each pre-LN stack), scaled or unscaled embeddings, tied or untied
  output projection, sinusoidal positions in Marian's layout (written out as a table, so no engine has to agree on
  a layout);
* liu2020 ADMIN, after `fold_admin` (ω folded into the LayerNorms and input projections: a standard post-LN model
  with the same function);
* li2022 CAD: at inference every existing cross-attention runs; a layer built without one (p_net = 1.0) is written
  for CTranslate2 as a cross-attention whose output projection (weight and bias) is zero. Its contribution is then
  exactly 0: post-LN gives LN(Ĥ + 0) = LN(Ĥ), the layer's H̃ = LN(Ĥ) of li2022 §3.3, with the layer's own LayerNorm;
  pre-LN gives Ĥ + 0 = Ĥ, the sub-layer that disappeared (its LayerNorm, which only feeds the zero branch, is
  written as the identity LN). CTranslate2's decoder spec has one layer type for all layers, hence this encoding;
  the ONNX graph skips the sub-layer instead.

Mechanisms that no engine can express are refused with one sentence naming them (`export_blockers`): dou2018
layer aggregation and multi-layer attention, meng2019 DTMT (a recurrent model: no converter exists), and anything
of a ``model_type`` this module does not know.

Formats (``deepnmt export --format ...``; `export_model`):

* ``ctranslate2``: a `ctranslate2.specs.TransformerSpec` filled from the model's weights and written by
  CTranslate2's own converter machinery (validation, quantization, ``model.bin`` + vocabulary); the decoder starts
  from the real ``<s>`` embedding like ours (not Marian's zero embedding).
* ``onnx``: ``encoder.onnx`` (source → cross-attention keys/values of every decoder layer) and ``decoder.onnx``
  (one step with the self-attention cache as inputs and outputs, logits out), made by `torch.onnx.export`, run by
  `OnnxEngine`, whose beam search re-implements `transformers`' beam search decision for decision.
* ``marian``: `export_marian` (a `transformers.MarianMTModel` folder, no custom code).

The tokenizer travels with every export (``tokenizer.json`` beside the weights); ``deepnmt_export.json`` records
the format, the special tokens and the generation defaults. ``ctranslate2``, ``onnxruntime`` and ``onnx`` are
optional (``pip install hf_deepnmt[export]``) and imported inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .admin import fold_admin, non_standard_features
from .errors import UserInputError
from .modeling_common import unwrap_model
from .modeling_deep_transformer import PreLNResidual
from .registry import TRANSFORMER, model_type_names

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
ONNX_OPSET = 18
NEG_INF = -1e9  # additive mask value of the ONNX graphs: exp underflows to exactly 0, as with -inf


# ------------------------------------------------------------------------------------------------ what can be exported
def export_blockers(config: Any, export_format: str) -> list[str]:
    """The mechanisms of ``config`` that ``export_format`` cannot express exactly (empty: exportable).

    ADMIN is never a blocker (it folds away), nor are li2022's CAD, DDR and ALD (CAD acts only in training or
    builds layers without cross-attention, which every format encodes exactly; DDR and ALD are losses).
    """
    if export_format not in EXPORT_FORMATS:
        raise UserInputError(f"`export_format` = {export_format!r} is not allowed; use one of {', '.join(EXPORT_FORMATS)}.")
    model_type = getattr(config, "model_type", None)
    if model_type == "dtmt":
        return ["meng2019 DTMT's deep-transition recurrent layers (L-GRU/T-GRU encoder and decoder; no converter "
                "exists for them)"]
    if model_type not in STANDARD_MODEL_TYPES:
        return [f"model_type {model_type!r}, which is not one of this package's Transformer types "
                f"({', '.join(STANDARD_MODEL_TYPES)})"]
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
                         f"Transformer cannot express exactly; translate it with the torch engine instead.")


def standard_model(model: nn.Module) -> nn.Module:
    """The model as a standard Transformer in eval mode: ADMIN folded (`fold_admin`), float32, on the CPU."""
    model = unwrap_model(model)
    if getattr(model.config, "residual_scaling", "none") == "admin":
        model = fold_admin(model)
    return model.float().cpu().eval()


def _positions(model: nn.Module) -> torch.Tensor:
    """The sinusoidal position table the model adds, ``(max_position_embeddings, d)``, Marian's layout."""
    from .modeling_common import sinusoidal_positions

    config = model.config
    return sinusoidal_positions(0, config.max_position_embeddings, config.d_model, torch.device("cpu"), torch.float32)


def vocabulary_tokens(tokenizer: Any, vocab_size: int) -> list[str]:
    """Token strings for ids 0 .. vocab_size-1 (ids the tokenizer lacks get unique placeholder names)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(min(vocab_size, len(tokenizer)))))
    tokens += [f"<deepnmt_unused_{i}>" for i in range(len(tokens), vocab_size)]
    if len(set(tokens)) != len(tokens):
        raise UserInputError("the tokenizer maps two ids to the same token string; CTranslate2 needs unique tokens.")
    return tokens


# ------------------------------------------------------------------------------------------------ CTranslate2
def _copy(tensor: torch.Tensor) -> torch.Tensor:
    """A float32 copy: CTranslate2's quantization scales the arrays it is given in place, which must never be the
    model's own parameters."""
    return tensor.detach().to(torch.float32, copy=True).contiguous()


def _ct2_linear(spec: Any, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    spec.weight = _copy(weight)
    if bias is not None:
        spec.bias = _copy(bias)


def _ct2_norm(spec: Any, norm: nn.LayerNorm | None, d_model: int) -> None:
    """A LayerNorm, or the identity LN (γ = 1, β = 0) for a pre-LN CAD layer's absent one (it only feeds a zero
    branch, see the module docstring)."""
    spec.gamma = _copy(norm.weight) if norm is not None else torch.ones(d_model)
    spec.beta = _copy(norm.bias) if norm is not None else torch.zeros(d_model)


def _ct2_attention(spec: Any, attention: nn.Module, self_attention: bool) -> None:
    """CTranslate2 fuses the projections: self-attention [q; k; v] then out, cross-attention q, [k; v], out."""
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    if self_attention:
        _ct2_linear(spec.linear[0], torch.cat([q.weight, k.weight, v.weight]), torch.cat([q.bias, k.bias, v.bias]))
    else:
        _ct2_linear(spec.linear[0], q.weight, q.bias)
        _ct2_linear(spec.linear[1], torch.cat([k.weight, v.weight]), torch.cat([k.bias, v.bias]))
    _ct2_linear(spec.linear[-1], attention.out_proj.weight, attention.out_proj.bias)


def _ct2_absent_cross_attention(spec: Any, d_model: int) -> None:
    """li2022 CAD with p_net = 1.0: a cross-attention with zero output projection adds exactly 0."""
    zeros = torch.zeros(d_model, d_model)
    _ct2_linear(spec.linear[0], zeros, torch.zeros(d_model))
    _ct2_linear(spec.linear[1], torch.zeros(2 * d_model, d_model), torch.zeros(2 * d_model))
    _ct2_linear(spec.linear[2], zeros, torch.zeros(d_model))


def _ct2_stack(spec: Any, stack: nn.Module, positions: torch.Tensor, shared: torch.Tensor) -> None:
    spec.scale_embeddings = float(stack.embed_tokens.embed_scale)  # Vaswani et al. §3.4: sqrt(d) or 1
    spec.position_encodings.encodings = positions  # Vaswani et al. §3.5, our table (Marian layout), row = position
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = shared
    if stack.layer_norm is not None:  # pre-LN: the stack's final LayerNorm
        _ct2_norm(spec.layer_norm, stack.layer_norm, positions.size(1))


def ctranslate2_spec(model: nn.Module, tokenizer: Any) -> Any:
    """A `ctranslate2.specs.TransformerSpec` with the weights, vocabulary and conventions of ``model`` (a standard
    Transformer: see `standard_model`), ready for CTranslate2's converter to validate, quantize and save."""
    from ctranslate2.specs import common_spec, transformer_spec

    config = model.config
    check_exportable(config, "ctranslate2")
    pre_norm = config.layer_norm_position == "pre"
    activation = getattr(common_spec.Activation, CT2_ACTIVATIONS[config.activation_function])
    encoder_spec = transformer_spec.TransformerEncoderSpec(config.encoder_layers, config.encoder_attention_heads,
                                                           pre_norm=pre_norm, activation=activation)
    decoder_spec = transformer_spec.TransformerDecoderSpec(config.decoder_layers, config.decoder_attention_heads,
                                                           pre_norm=pre_norm, activation=activation)
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)
    base, d_model = model.model, config.d_model
    positions = _positions(model)
    shared = _copy(base.shared.weight)
    _ct2_stack(spec.encoder, base.encoder, positions, shared)
    _ct2_stack(spec.decoder, base.decoder, positions, shared)
    for layer_spec, layer in zip(spec.encoder.layer, base.encoder.layers):
        _ct2_attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _ct2_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm, d_model)
        _ct2_linear(layer_spec.ffn.linear_0, layer.fc1.weight, layer.fc1.bias)
        _ct2_linear(layer_spec.ffn.linear_1, layer.fc2.weight, layer.fc2.bias)
        _ct2_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm, d_model)
    for layer_spec, layer in zip(spec.decoder.layer, base.decoder.layers):
        _ct2_attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _ct2_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm, d_model)
        if layer.encoder_attn is not None:
            _ct2_attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
        else:
            _ct2_absent_cross_attention(layer_spec.attention, d_model)
        # post-LN CAD layer: its own LN, H̃ = LN(Ĥ + 0) (li2022 §3.3); pre-LN: identity LN feeding the zero branch
        _ct2_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm, d_model)
        _ct2_linear(layer_spec.ffn.linear_0, layer.fc1.weight, layer.fc1.bias)
        _ct2_linear(layer_spec.ffn.linear_1, layer.fc2.weight, layer.fc2.bias)
        _ct2_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm, d_model)
    head = model.get_output_embeddings()
    _ct2_linear(spec.decoder.projection, head.weight, head.bias)  # no final logits bias: ours has none
    tokens = vocabulary_tokens(tokenizer, config.vocab_size)
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    spec.config.unk_token = tokens[config.unk_token_id] if config.unk_token_id is not None else "<unk>"
    spec.config.bos_token = tokens[config.bos_token_id]
    spec.config.eos_token = tokens[config.eos_token_id]
    spec.config.decoder_start_token = tokens[config.decoder_start_token_id]  # a real <s> embedding, as ours
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    return spec


def export_ctranslate2(model: nn.Module, tokenizer: Any, output_dir: str | os.PathLike,
                       quantization: str | None = None) -> Path:
    """Write ``model`` (any exportable variant; ADMIN is folded first) as a CTranslate2 model into ``output_dir``
    with CTranslate2's own converter machinery (``model.bin``, ``config.json``, ``shared_vocabulary.json``)."""
    import ctranslate2.converters

    spec = ctranslate2_spec(standard_model(model), tokenizer)

    class _SpecConverter(ctranslate2.converters.Converter):
        def _load(self) -> Any:
            return spec

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir) as scratch:  # the converter replaces its folder wholesale
        written = Path(_SpecConverter().convert(str(Path(scratch) / "ct2"), quantization=quantization))
        for path in written.iterdir():
            path.replace(output_dir / path.name)
    return output_dir


# ------------------------------------------------------------------------------------------------ ONNX graphs
def _heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    batch, length, d_model = x.shape
    return x.view(batch, length, num_heads, d_model // num_heads).transpose(1, 2)  # (B, H, T, d_h)


def _attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(Q Kᵀ / sqrt(d_h) + M) V, Vaswani et al. Eq. (1), on ``(B, H, T, d_h)`` tensors."""
    scores = torch.matmul(query, key.transpose(-1, -2)) * query.size(-1) ** -0.5  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores + mask
    return torch.matmul(torch.softmax(scores, dim=-1), value)  # (B, H, Tq, d_h)


def _merge_heads(x: torch.Tensor) -> torch.Tensor:
    batch, heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, heads * head_dim)  # (B, T, d)


def _sublayer(layer: nn.Module, x: torch.Tensor, norm: nn.LayerNorm, branch) -> torch.Tensor:
    """x + f(LN(x)) (pre-LN) or LN(x + f(x)) (post-LN), as the layer's residual rules."""
    if isinstance(layer.ffn_residual, PreLNResidual):
        return x + branch(norm(x))
    return norm(x + branch(x))


def _feed_forward(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return _sublayer(layer, x, layer.final_layer_norm, lambda h: layer.fc2(layer.activation_fn(layer.fc1(h))))


def _require_standard(model: nn.Module) -> None:
    if getattr(model.config, "residual_scaling", "none") != "none":
        raise UserInputError("the ONNX graphs need a standard Transformer: fold ADMIN first (`standard_model(model)`).")


class OnnxEncoderGraph(nn.Module):
    """source ids, mask → the cross-attention keys and values of every decoder layer that has a cross-attention,
    each ``(B, H, S, d_h)``: the decoder graph never re-projects the encoder states. ``model`` must be standard
    (`standard_model`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        _require_standard(model)
        self.model = model
        self.register_buffer("positions", _positions(model), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        encoder, decoder = self.model.model.encoder, self.model.model.decoder
        heads = self.model.config.encoder_attention_heads
        x = encoder.embed_tokens(input_ids) + self.positions[: input_ids.size(1)]  # (B, S, d)
        mask = torch.where(attention_mask[:, None, None, :] > 0, 0.0, NEG_INF)  # (B, 1, 1, S)
        for layer in encoder.layers:
            attention = layer.self_attn

            def self_attention(h: torch.Tensor, attention: nn.Module = attention) -> torch.Tensor:
                q, k, v = (_heads(p(h), heads) for p in (attention.q_proj, attention.k_proj, attention.v_proj))
                return attention.out_proj(_merge_heads(_attend(q, k, v, mask)))

            x = _feed_forward(layer, _sublayer(layer, x, layer.self_attn_layer_norm, self_attention))
        if encoder.layer_norm is not None:
            x = encoder.layer_norm(x)
        outputs = []
        for layer in decoder.layers:
            if layer.encoder_attn is not None:
                dec_heads = self.model.config.decoder_attention_heads
                outputs += [_heads(layer.encoder_attn.k_proj(x), dec_heads), _heads(layer.encoder_attn.v_proj(x), dec_heads)]
        return tuple(outputs)


class OnnxDecoderGraph(nn.Module):
    """One decoding step for B sentences × K hypotheses.

    Inputs: ``input_ids`` ``(B, K)`` (the last token of every hypothesis), ``step`` (its position, a 1-element
    int64 tensor), ``encoder_attention_mask`` ``(B, S)``, then per decoder layer the self-attention cache
    ``(B, K, H, t, d_h)`` keys and values, then the cross-attention keys/values of the encoder graph ``(B, H, S, d_h)``
    (shared by the K hypotheses of a sentence: the K queries of a sentence attend together, so nothing is copied
    per hypothesis). Outputs: logits ``(B, K, V)`` and the caches grown to ``t + 1``.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        _require_standard(model)
        self.model = model
        self.register_buffer("positions", _positions(model), persistent=False)
        self.num_layers = model.config.decoder_layers
        self.cross_layers = [i for i, layer in enumerate(model.model.decoder.layers) if layer.encoder_attn is not None]

    def forward(self, input_ids: torch.Tensor, step: torch.Tensor, encoder_attention_mask: torch.Tensor,
                *caches: torch.Tensor) -> tuple[torch.Tensor, ...]:
        decoder = self.model.model.decoder
        heads = self.model.config.decoder_attention_heads
        batch, beams = input_ids.shape
        self_caches, cross_caches = caches[: 2 * self.num_layers], caches[2 * self.num_layers:]
        position = torch.index_select(self.positions, 0, step.reshape(1))  # (1, d)
        x = decoder.embed_tokens(input_ids.reshape(batch * beams, 1)) + position  # (B·K, 1, d)
        cross_mask = torch.where(encoder_attention_mask[:, None, None, :] > 0, 0.0, NEG_INF)  # (B, 1, 1, S)
        presents: list[torch.Tensor] = []
        for index, layer in enumerate(decoder.layers):
            attention = layer.self_attn
            past_key, past_value = self_caches[2 * index], self_caches[2 * index + 1]

            def self_attention(h: torch.Tensor, attention: nn.Module = attention, past_key: torch.Tensor = past_key,
                               past_value: torch.Tensor = past_value) -> torch.Tensor:
                q = _heads(attention.q_proj(h), heads)  # (B·K, H, 1, d_h)
                k = torch.cat([past_key.flatten(0, 1), _heads(attention.k_proj(h), heads)], dim=2)  # (B·K, H, t+1, d_h)
                v = torch.cat([past_value.flatten(0, 1), _heads(attention.v_proj(h), heads)], dim=2)
                presents.extend((k.unflatten(0, (batch, beams)), v.unflatten(0, (batch, beams))))  # (B, K, H, t+1, d_h)
                return attention.out_proj(_merge_heads(_attend(q, k, v, None)))  # one query: no mask needed

            x = _sublayer(layer, x, layer.self_attn_layer_norm, self_attention)
            if layer.encoder_attn is not None:
                cross = layer.encoder_attn
                slot = self.cross_layers.index(index)
                key, value = cross_caches[2 * slot], cross_caches[2 * slot + 1]  # (B, H, S, d_h)

                def cross_attention(h: torch.Tensor, cross: nn.Module = cross, key: torch.Tensor = key,
                                    value: torch.Tensor = value) -> torch.Tensor:
                    q = cross.q_proj(h).reshape(batch, beams, heads, -1).transpose(1, 2)  # (B, H, K, d_h)
                    out = _attend(q, key, value, cross_mask).transpose(1, 2)  # (B, K, H, d_h)
                    return cross.out_proj(out.reshape(batch * beams, 1, -1))  # (B·K, 1, d)

                x = _sublayer(layer, x, layer.encoder_attn_layer_norm, cross_attention)
            elif layer.encoder_attn_layer_norm is not None:  # post-LN CAD layer: H̃ = LN(Ĥ) (li2022 §3.3)
                x = layer.encoder_attn_layer_norm(x)
            x = _feed_forward(layer, x)
        if decoder.layer_norm is not None:
            x = decoder.layer_norm(x)
        logits = self.model.get_output_embeddings()(x).reshape(batch, beams, -1)  # (B, K, V)
        return (logits, *presents)


def _onnx_names(model: nn.Module) -> dict[str, list[str]]:
    layers = model.config.decoder_layers
    cross = [i for i, layer in enumerate(model.model.decoder.layers) if layer.encoder_attn is not None]
    self_cache = [f"{kind}_{i}" for i in range(layers) for kind in ("self_key", "self_value")]
    cross_cache = [f"{kind}_{i}" for i in cross for kind in ("cross_key", "cross_value")]
    return {"self_cache": self_cache, "cross_cache": cross_cache,
            "present": [f"present_{name}" for name in self_cache]}


def export_onnx(model: nn.Module, output_dir: str | os.PathLike, quantization: str | None = None) -> Path:
    """Write ``encoder.onnx`` and ``decoder.onnx`` (see `OnnxEncoderGraph`, `OnnxDecoderGraph`) into
    ``output_dir`` with `torch.onnx.export`; ``quantization="int8"`` then quantizes the weights of every MatMul
    with ONNX Runtime's dynamic quantization."""
    import warnings

    model = standard_model(model)
    check_exportable(model.config, "onnx")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config, names = model.config, _onnx_names(model)
    heads, head_dim = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    batch, beams, source_length, past = 2, 3, 5, 4  # example sizes: none is 0 or 1 (they would be specialised)
    source = torch.randint(4, config.vocab_size, (batch, source_length))
    mask = torch.ones(batch, source_length, dtype=torch.long)
    b, s, k, t = (torch.export.Dim(name, min=1, max=4096) for name in ("batch", "source", "beams", "past"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder_program = torch.onnx.export(
            OnnxEncoderGraph(model), (source, mask), dynamo=True, opset_version=ONNX_OPSET,
            input_names=["input_ids", "attention_mask"], output_names=names["cross_cache"],
            dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}), verbose=False)
        encoder_program.save(str(output_dir / "encoder.onnx"))
        cross = OnnxEncoderGraph(model)(source, mask)
        self_cache = [torch.zeros(batch, beams, heads, past, head_dim) for _ in names["self_cache"]]
        inputs = (torch.randint(4, config.vocab_size, (batch, beams)), torch.tensor([past]), mask, *self_cache, *cross)
        shapes = ({0: b, 1: k}, None, {0: b, 1: s},  # the cache tensors are one *args entry
                  (*({0: b, 1: k, 3: t} for _ in self_cache), *({0: b, 2: s} for _ in cross)))
        decoder_program = torch.onnx.export(
            OnnxDecoderGraph(model), inputs, dynamo=True, opset_version=ONNX_OPSET,
            input_names=["input_ids", "step", "encoder_attention_mask", *names["self_cache"], *names["cross_cache"]],
            output_names=["logits", *names["present"]], dynamic_shapes=shapes, verbose=False)
        decoder_program.save(str(output_dir / "decoder.onnx"))
    if quantization == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        for name in ("encoder", "decoder"):
            path = output_dir / f"{name}.onnx"
            quantized = output_dir / f"{name}.int8.onnx"
            quantize_dynamic(str(path), str(quantized), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
            quantized.replace(path)
    elif quantization is not None:
        raise UserInputError(f"`quantization` = {quantization!r} is not allowed for onnx; use int8 or none.")
    return output_dir


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
    output_dir = Path(output_dir)
    if export_format == "ctranslate2":
        export_ctranslate2(model, tokenizer, output_dir, quantization)
    elif export_format == "onnx":
        export_onnx(model, output_dir, quantization)
    else:
        from .admin import export_marian

        marian = export_marian(model)
        if quantization == "bfloat16":
            marian = marian.to(torch.bfloat16)
        marian.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)  # the tokenizer travels with the export
    config = standard_model(model).config if export_format != "marian" else model.config
    generation = model.generation_config
    manifest = {
        "format": export_format,
        "quantization": quantization or "float32",
        "source_model_type": model.config.model_type,
        "admin_folded": getattr(model.config, "residual_scaling", "none") == "admin",
        "d_model": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "encoder_attention_heads": config.encoder_attention_heads,
        "decoder_attention_heads": config.decoder_attention_heads,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "pad_token_id": config.pad_token_id,
        "eos_token_id": config.eos_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
        "generation": {
            "num_beams": generation.num_beams,
            "max_new_tokens": generation.max_new_tokens,
            # transformers' defaults where the config leaves them unset (None)
            "length_penalty": 1.0 if generation.length_penalty is None else generation.length_penalty,
            "early_stopping": False if generation.early_stopping is None else generation.early_stopping,
        },
    }
    if export_format == "onnx":
        manifest["onnx"] = {"opset": ONNX_OPSET, **_onnx_names(standard_model(model))}
    (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return output_dir


# ------------------------------------------------------------------------------------------------ search
def _log_softmax(logits: Any) -> Any:
    import numpy as np

    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def greedy_search(decoder: Any, batch_size: int, max_new_tokens: int, start_id: int, eos_id: int,
                  min_new_tokens: int = 0) -> list[list[int]]:
    """Argmax decoding until ``</s>`` or ``max_new_tokens`` (what `generate` does with one beam); ``</s>`` is
    suppressed for the first ``min_new_tokens`` tokens.

    ``decoder`` is a step function object: ``step(tokens (A, K), position) -> logits (A, K, V)`` and
    ``select(keep (A',), origins (A', K))``, which keeps sentences ``keep`` of the current ones and, for each, the
    hypotheses ``origins`` of the last step, in that order.
    """
    import numpy as np

    outputs: list[list[int]] = [[] for _ in range(batch_size)]
    active = np.arange(batch_size)
    tokens = np.full((batch_size, 1), start_id, dtype=np.int64)
    for position in range(max_new_tokens):
        logits = decoder.step(tokens, position)
        if position < min_new_tokens:
            logits[..., eos_id] = -np.inf
        best = logits.argmax(axis=-1)  # (A, 1)
        for row, sentence in enumerate(active):
            outputs[sentence].append(int(best[row, 0]))
        keep = np.flatnonzero(best[:, 0] != eos_id)
        if keep.size == 0 or position + 1 == max_new_tokens:
            break
        active, tokens = active[keep], best[keep]
        decoder.select(keep, np.zeros((keep.size, 1), dtype=np.int64))
    return outputs


def beam_search(decoder: Any, batch_size: int, num_beams: int, max_new_tokens: int, start_id: int, eos_id: int,
                length_penalty: float = 1.0, early_stopping: bool = False, min_new_tokens: int = 0) -> list[list[int]]:
    """`transformers`' beam search (``GenerationMixin._beam_search``, transformers 5), decision for decision, over
    a step function (see `greedy_search` for ``decoder``); returns the best hypothesis of each sentence.

    Per sentence: the 2K best continuations of the K running hypotheses (accumulated log-probabilities, the
    first step expands hypothesis 0 only); among the first K of them, those ending in ``</s>`` or reaching
    ``max_new_tokens`` are finished with score / length^length_penalty (length = generated tokens, ``</s>``
    included) and the K best finished are kept; the K best unfinished continue. A sentence is done when its K
    finished slots are full and the best running hypothesis, scored at its current length, cannot beat the
    worst finished one (``early_stopping=False``; ``True``: as soon as the K slots are full). Done sentences leave
    the batch (``decoder.select``); `generate` keeps computing them without changing their result.
    ``min_new_tokens``: ``</s>`` gets log-probability -inf before that many tokens (transformers' processor).
    """
    import numpy as np

    if num_beams == 1:
        return greedy_search(decoder, batch_size, max_new_tokens, start_id, eos_id, min_new_tokens)
    k = num_beams
    finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch_size)]
    active = np.arange(batch_size)
    sequences = np.zeros((batch_size, k, 0), dtype=np.int64)  # (A, K, generated)
    running = np.full((batch_size, k), -1e9, dtype=np.float32)
    running[:, 0] = 0.0
    tokens = np.full((batch_size, k), start_id, dtype=np.int64)
    for position in range(max_new_tokens):
        log_probs = _log_softmax(decoder.step(tokens, position).astype(np.float32))  # (A, K, V)
        if position < min_new_tokens:
            log_probs[..., eos_id] = -np.inf
        vocab = log_probs.shape[-1]
        scores = (log_probs + running[:, :, None]).reshape(len(active), k * vocab)  # (A, K·V)
        top = np.argpartition(-scores, 2 * k, axis=-1)[:, : 2 * k]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, -1), axis=-1, kind="stable"), -1)
        top_scores = np.take_along_axis(scores, top, -1)  # (A, 2K), best first
        origins, words = top // vocab, top % vocab
        last = position + 1 == max_new_tokens
        keep, next_origins, next_words, next_running = [], [], [], []
        normaliser = float(position + 1) ** length_penalty
        for row, sentence in enumerate(active):
            hits = (words[row] == eos_id) | last
            slots = finished[sentence]
            full = early_stopping and len(slots) == k  # early_stopping=True: a full sentence takes no more
            for j in range(k):  # only the first K candidates may finish
                if hits[j] and not full:
                    candidate = (float(np.float32(top_scores[row, j]) / np.float32(normaliser)),
                                 [*sequences[row, origins[row, j]].tolist(), int(words[row, j])])
                    slots.append(candidate)
            slots.sort(key=lambda item: -item[0])
            del slots[k:]
            alive = np.flatnonzero(~hits)[:k]
            if last or alive.size < k:
                continue
            best_running = np.float32(top_scores[row, alive[0]]) / np.float32(float(position + 1) ** length_penalty)
            improvable = len(slots) < k or best_running > min(score for score, _ in slots)
            if (early_stopping and len(slots) == k) or not improvable:
                continue
            keep.append(row)
            next_origins.append(origins[row, alive])
            next_words.append(words[row, alive])
            next_running.append(top_scores[row, alive])
        if not keep:
            break
        keep_rows = np.asarray(keep)
        next_origins_array = np.stack(next_origins)  # (A', K)
        sequences = np.concatenate([np.take_along_axis(sequences[keep_rows], next_origins_array[:, :, None], 1),
                                    np.stack(next_words)[:, :, None]], axis=2)
        running = np.stack(next_running).astype(np.float32)
        tokens = np.stack(next_words)
        active = active[keep_rows]
        decoder.select(keep_rows, next_origins_array)
    return [slots[0][1] if slots else [] for slots in finished]


# ------------------------------------------------------------------------------------------------ engines
class OnnxEngine:
    """Runs an ``onnx`` export with ONNX Runtime (``intra_threads`` threads) and `beam_search`."""

    def __init__(self, folder: str | os.PathLike, intra_threads: int = 2):
        import onnxruntime as ort

        folder = Path(folder)
        self.manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if self.manifest["format"] != "onnx":
            raise UserInputError(f"{folder} holds a {self.manifest['format']} export, not an onnx one.")
        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        providers = ["CPUExecutionProvider"]
        self.encoder = ort.InferenceSession(str(folder / "encoder.onnx"), options, providers=providers)
        self.decoder = ort.InferenceSession(str(folder / "decoder.onnx"), options, providers=providers)
        self.names = self.manifest["onnx"]
        self.heads = self.manifest["decoder_attention_heads"]
        self.head_dim = self.manifest["d_model"] // self.heads

    def encode(self, input_ids: Any, attention_mask: Any) -> list[Any]:
        return self.encoder.run(self.names["cross_cache"], {"input_ids": input_ids, "attention_mask": attention_mask})

    def stepper(self, input_ids: Any, attention_mask: Any, num_beams: int) -> _OnnxSteps:
        return _OnnxSteps(self, self.encode(input_ids, attention_mask), attention_mask, num_beams)

    @property
    def max_positions(self) -> int:
        return self.manifest["max_position_embeddings"]

    def generate(self, sources: Sequence[Sequence[int]], num_beams: int = 4, max_new_tokens: int = 256,
                 length_penalty: float | None = None, early_stopping: bool | None = None,
                 min_new_tokens: int = 0) -> list[list[int]]:
        """Token ids of the best hypothesis per source (``</s>`` included when produced, no start token);
        ``length_penalty`` / ``early_stopping`` default to the exported model's generation config."""
        input_ids, attention_mask = pad_batch(sources, self.manifest["pad_token_id"])
        length_penalty, early_stopping = _search_settings(self.manifest, length_penalty, early_stopping)
        return beam_search(self.stepper(input_ids, attention_mask, num_beams), len(sources), num_beams,
                           min(max_new_tokens, self.max_positions), self.manifest["decoder_start_token_id"],
                           self.manifest["eos_token_id"], length_penalty, early_stopping, min_new_tokens)


class _OnnxSteps:
    """The decoder state of one batch: self-attention caches, cross keys/values, mask (see `greedy_search`)."""

    def __init__(self, engine: OnnxEngine, cross: list[Any], attention_mask: Any, num_beams: int):
        import numpy as np

        self.engine, self.cross, self.mask = engine, cross, attention_mask
        batch = attention_mask.shape[0]
        empty = np.zeros((batch, num_beams, engine.heads, 0, engine.head_dim), dtype=np.float32)
        self.self_cache = [empty] * len(engine.names["self_cache"])

    def step(self, tokens: Any, position: int) -> Any:
        import numpy as np

        names = self.engine.names
        feeds = {"input_ids": tokens, "step": np.array([position], dtype=np.int64),
                 "encoder_attention_mask": self.mask,
                 **dict(zip(names["self_cache"], self.self_cache)), **dict(zip(names["cross_cache"], self.cross))}
        logits, *self.self_cache = self.engine.decoder.run(None, feeds)
        return logits

    def select(self, keep: Any, origins: Any) -> None:
        if keep.size != self.mask.shape[0]:
            self.cross = [value[keep] for value in self.cross]
            self.mask = self.mask[keep]
        rows = keep[:, None]
        self.self_cache = [value[rows, origins] for value in self.self_cache]  # (A', K, H, t, d_h)


def _search_settings(manifest: dict[str, Any], length_penalty: float | None,
                     early_stopping: bool | None) -> tuple[float, bool]:
    generation = manifest.get("generation", {})
    if length_penalty is None:
        length_penalty = generation.get("length_penalty", 1.0)
    if early_stopping is None:
        early_stopping = generation.get("early_stopping", False)
    if early_stopping not in (True, False):
        raise UserInputError(f"`early_stopping` = {early_stopping!r} is not supported by the exported engines; use "
                         "True or False.")
    return float(length_penalty), bool(early_stopping)


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


class CTranslate2Engine:
    """Runs a ``ctranslate2`` export with `ctranslate2.Translator` on the CPU.

    Search settings follow `generate`: ``min_decoding_length=min_new_tokens`` (0: ``</s>`` may come first; CTranslate2's
    default is 1), the ``</s>`` counted
    in the length that the length penalty divides by (``return_end_token=True``), no input truncation beyond the
    model's positions. CTranslate2's beam search stops a sentence once K hypotheses have finished and then ranks
    them (`generate(early_stopping=True)`, which it reproduces exactly); `generate`'s default (``early_stopping=
    False``) goes on while a running hypothesis could still beat the worst finished one, which changed 14 % of the
    embedded test set's outputs of a trained model (BLEU +0.03 for CTranslate2; benchmarks/RESULTS.md, "Output
    quality through each engine"). An explicit ``early_stopping=False`` is therefore refused here.
    """

    def __init__(self, folder: str | os.PathLike, intra_threads: int = 2, compute_type: str = "default",
                 patience: float = 1.0):
        import ctranslate2

        folder = Path(folder)
        self.manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if self.manifest["format"] != "ctranslate2":
            raise UserInputError(f"{folder} holds a {self.manifest['format']} export, not a ctranslate2 one.")
        self.translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type,
                                                 inter_threads=1, intra_threads=intra_threads)
        self.tokens = json.loads((folder / "shared_vocabulary.json").read_text(encoding="utf-8"))
        self.ids = {token: index for index, token in enumerate(self.tokens)}
        self.patience = patience

    @property
    def max_positions(self) -> int:
        return self.manifest["max_position_embeddings"]

    def generate(self, sources: Sequence[Sequence[int]], num_beams: int = 4, max_new_tokens: int = 256,
                 length_penalty: float | None = None, early_stopping: bool | None = None,
                 min_new_tokens: int = 0) -> list[list[int]]:
        """As `OnnxEngine.generate`; CTranslate2's search is ``early_stopping=True``, so an explicit ``False`` is
        refused (None, the default, runs CTranslate2's search whatever the model's generation config says)."""
        if early_stopping is False:
            raise UserInputError("`early_stopping` = False is not available with the ctranslate2 engine: CTranslate2 stops "
                             "a sentence's beam once num_beams hypotheses have finished (early_stopping=True); use "
                             "the onnx or torch engine for generate's default search.")
        length_penalty, _ = _search_settings(self.manifest, length_penalty, None)
        results = self.translator.translate_batch(
            [[self.tokens[i] for i in ids] for ids in sources], beam_size=num_beams, length_penalty=length_penalty,
            max_decoding_length=min(max_new_tokens, self.max_positions), patience=self.patience,
            min_decoding_length=min_new_tokens, return_end_token=True, max_input_length=0)
        return [[self.ids[token] for token in result.hypotheses[0]] for result in results]

    def score(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[list[float]]:
        """Per-token log-probabilities of ``targets`` (ids ending in ``</s>``) under teacher forcing."""
        eos = self.manifest["eos_token_id"]
        ends = [bool(ids) and ids[-1] == eos for ids in targets]
        results = self.translator.score_batch(  # CTranslate2 appends </s> to every target itself
            [[self.tokens[i] for i in ids] for ids in sources],
            [[self.tokens[i] for i in (ids[:-1] if end else ids)] for ids, end in zip(targets, ends)],
            max_input_length=0)
        return [list(result.log_probs)[: None if end else -1] for result, end in zip(results, ends)]


class TorchEngine:
    """`generate` of a PyTorch model behind the engine interface (optionally under bf16 autocast on the CPU)."""

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
        """As `OnnxEngine.generate`; unset search settings come from the model's generation config."""
        input_ids, attention_mask = (torch.from_numpy(array) for array in
                                     pad_batch(sources, self.model.config.pad_token_id))
        device = next(self.model.parameters()).device
        settings = {key: value for key, value in (("length_penalty", length_penalty),
                                                  ("early_stopping", early_stopping)) if value is not None}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
            output = self.model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                         num_beams=num_beams, max_new_tokens=max_new_tokens, do_sample=False,
                                         num_return_sequences=1, min_new_tokens=min_new_tokens or None, **settings)
        pad, eos = self.model.config.pad_token_id, self.model.config.eos_token_id
        results = []
        for row in output[:, 1:].tolist():  # drop the decoder start token
            tokens = []
            for token in row:
                tokens.append(token)
                if token == eos:
                    break
            while tokens and tokens[-1] == pad and pad != eos:
                tokens.pop()
            results.append(tokens)
        return results


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
    if not (Path(folder) / MANIFEST).is_file():
        raise UserInputError(f"{folder} is not an hf_deepnmt export (no {MANIFEST}); make one with "
                         f"`deepnmt export --format {engine} MODEL OUT`.")
    if engine == "onnx":
        return OnnxEngine(folder, intra_threads)
    return CTranslate2Engine(folder, intra_threads, compute_type)
