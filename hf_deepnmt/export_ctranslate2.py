"""CTranslate2 export and engine: this package's Transformers get a loader in CTranslate2's own converter structure
(`ctranslate2_loader`: a `ctranslate2.converters.transformers.BartLoader` subclass, registered with its
``register_loader`` for our config classes, as its ``MarianMTLoader`` is for Marian), `export_ctranslate2` writes
its spec with CTranslate2's converter machinery, and `CTranslate2Engine` runs the result.

The loader reuses BART's walk through the layers (``set_encoder``, ``set_decoder``, ``set_attention``: our weights
carry BART/Marian names) and overrides only our conventions: the decoder starts from the real ``<s>`` embedding
(``decoder_start_token_id``; Marian's loader starts from a zero one and drops the last vocabulary row, we do neither),
positions are the model's own table (`hf_deepnmt.modeling_common.PositionEncoding.table`: Vaswani et al.'s or
fairseq's sinusoids, or the learned one), separate source and target vocabularies are CTranslate2's two, pre-LN is ``pre_norm=True`` with
each stack's final LayerNorm, liu2020 ADMIN is folded first (`hf_deepnmt.export.standard_model`), and:

li2022 CAD: at inference every existing cross-attention runs; a layer built without one (p_net = 1.0) is written as a
cross-attention whose output projection (weight and bias) is zero. Its contribution is then exactly 0: post-LN gives
LN(Ĥ + 0) = LN(Ĥ), the layer's H̃ = LN(Ĥ) of li2022 §3.3, with the layer's own LayerNorm; pre-LN gives Ĥ + 0 = Ĥ, the
sub-layer that disappeared (its LayerNorm, which only feeds the zero branch, is written as the identity LN).
CTranslate2's decoder spec has one layer type for all layers, hence this encoding.

Once `ctranslate2_loader` has run (``export_ctranslate2`` calls it), CTranslate2's stock
``TransformersConverter(folder, trust_remote_code=True)`` converts a saved model folder of ours too.

``ctranslate2`` is optional (``pip install hf_deepnmt[export]``) and imported inside the functions that need it.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from transformers.utils import logging

from .errors import UserInputError
from .export_formats import CT2_ACTIVATIONS, MANIFEST, check_exportable, standard_model
from .registry import MODEL_TYPES, TRANSFORMER

logger = logging.get_logger(__name__)


# The config classes our loader is registered for: every model type that can be written to CTranslate2.
CT2_CONFIG_NAMES: tuple[str, ...] = tuple(entry.config_class.__name__ for entry in MODEL_TYPES.values()
                                          if entry.family == TRANSFORMER and "ctranslate2" in entry.export_formats)


def vocabulary_tokens(tokenizer: Any, vocab_size: int, side: str | None = None) -> list[str]:
    """Token strings for ids 0 .. vocab_size-1 (ids the tokenizer lacks get unique placeholder names). ``side``
    ``"source"`` / ``"target"``: that vocabulary of a tokenizer with two (Marian's and FSMT's ``get_src_vocab`` /
    ``get_tgt_vocab``; docs/public-checkpoints.md); None: the one vocabulary of a model that shares it."""
    if side == "target" and isinstance(getattr(tokenizer, "target_encoder", None), dict):
        vocabulary = tokenizer.target_encoder  # token → id (MarianTokenizer's get_tgt_vocab fails on added tokens)
    else:
        vocabulary = getattr(tokenizer, {"source": "get_src_vocab", "target": "get_tgt_vocab"}.get(side or "",
                                                                                                 "get_vocab"))()
    names: dict[int, str] = {}
    for key, value in vocabulary.items():
        index, token = (key, value) if isinstance(key, int) else (value, key)  # FSMT's target side maps id → token
        names.setdefault(int(index), str(getattr(token, "content", token)))
    tokens = [names.get(index, f"<deepnmt_unused_{index}>") for index in range(vocab_size)]
    if len(set(tokens)) != len(tokens):
        raise UserInputError("the tokenizer maps two ids to the same token string; CTranslate2 needs unique tokens.")
    return tokens


def _zero_attention(d_model: int) -> SimpleNamespace:
    """li2022 CAD with p_net = 1.0: projections that are all zero, so the cross-attention adds exactly 0."""
    linears = {name: nn.Linear(d_model, d_model) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    for linear in linears.values():
        nn.init.zeros_(linear.weight)
        nn.init.zeros_(linear.bias)
    return SimpleNamespace(**linears)


def _own_copy(layer: Any, name: str, value: Any) -> None:
    """Replace a spec tensor by a copy: CTranslate2's quantization scales the arrays it is given in place, which
    must never be the model's own parameters."""
    if isinstance(value, torch.Tensor):
        setattr(layer, name.rsplit("/", 1)[-1], value.detach().clone().contiguous())


class _SpecSteps:
    """The `TransformerSpec` of a model, its config and vocabularies: the steps of `ctranslate2_loader`'s loader that
    read the model as a whole (the module docstring says which conventions)."""

    @property
    def architecture_name(self) -> str:
        return "AutoModelForSeq2SeqLM"  # the stock converter loads our folders through the Auto class

    def get_model_spec(self, model: nn.Module) -> Any:
        from ctranslate2.specs import common_spec, model_spec, transformer_spec

        check_exportable(model.config, "ctranslate2")  # dou2018, DTMT, activations CTranslate2 lacks
        model = standard_model(model)  # liu2020 ADMIN folded (nothing to do for a standard model)
        config = model.config
        pre_norm = config.layer_norm_position == "pre"  # pre-LN: LN before each sub-layer, final LN per stack
        activation = getattr(common_spec.Activation, CT2_ACTIVATIONS[config.activation_function])
        spec = transformer_spec.TransformerSpec(  # BART's spec, with each stack's own number of heads
            transformer_spec.TransformerEncoderSpec(config.encoder_layers, config.encoder_attention_heads,
                                                    pre_norm=pre_norm, activation=activation),
            transformer_spec.TransformerDecoderSpec(config.decoder_layers, config.decoder_attention_heads,
                                                    pre_norm=pre_norm, activation=activation))
        self.set_encoder(spec.encoder, model.model.encoder)
        self.set_decoder(spec.decoder, model.model.decoder)
        self.set_linear(spec.decoder.projection, model.lm_head)  # with Marian's output bias when it has one
        model_spec.visit_spec(spec, _own_copy)
        return spec

    def __call__(self, model: nn.Module, tokenizer: Any) -> Any:
        spec = self.get_model_spec(model)
        self.set_config(spec.config, model, tokenizer)
        config = model.config  # two vocabularies where the model has two (docs/public-checkpoints.md)
        target = self.get_vocabulary(model, tokenizer)
        spec.register_source_vocabulary(target if config.share_encoder_decoder_embeddings else
                                        vocabulary_tokens(tokenizer, config.vocab_size, "source"))
        spec.register_target_vocabulary(target)
        return spec

    def get_vocabulary(self, model: nn.Module, tokenizer: Any) -> list[str]:
        # every row kept (Marian's loader drops the last); the target side of two vocabularies
        config = model.config
        return vocabulary_tokens(tokenizer, config.target_vocab_size,
                                 None if config.share_encoder_decoder_embeddings else "target")

    def set_config(self, config: Any, model: nn.Module, tokenizer: Any) -> None:
        ids, tokens = model.config, self.get_vocabulary(model, tokenizer)  # the model's ids, as `generate`'s
        # CTranslate2 reads <s> only to prepend it to sources, which we never ask; Marian's vocabulary has none
        config.bos_token = tokens[ids.bos_token_id if ids.bos_token_id is not None else ids.eos_token_id]
        config.eos_token = tokens[ids.eos_token_id]
        config.unk_token = tokens[ids.unk_token_id] if ids.unk_token_id is not None else "<unk>"
        config.decoder_start_token = tokens[ids.decoder_start_token_id]  # a real <s> embedding (Marian: zero)
        config.layer_norm_epsilon = ids.layer_norm_eps  # the model's (CTranslate2's default is 1e-6)


class _LayerSteps:
    """The weights of the stacks: the steps of `ctranslate2_loader`'s loader that differ from BART's walk
    (positions, pre-LN's final norms, li2022 CAD's absent cross-attentions)."""

    def set_common_layers(self, spec: Any, module: nn.Module) -> None:
        spec.scale_embeddings = float(module.embed_tokens.embed_scale)  # Vaswani et al. §3.4: sqrt(d) or 1
        self.set_position_encodings(spec.position_encodings, module)
        self.set_embeddings(spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings,
                            module.embed_tokens)
        if module.layer_norm is not None:  # pre-LN: the stack's final LayerNorm
            self.set_layer_norm(spec.layer_norm, module.layer_norm)

    def set_position_encodings(self, spec: Any, module: nn.Module) -> None:
        # row t: what the t-th token gets (Vaswani et al.'s or fairseq's sinusoids, or the learned table, from
        # position_offset on; modeling_common.PositionEncoding)
        spec.encodings = module.embed_positions.table(module.config.max_position_embeddings)

    def set_decoder(self, spec: Any, decoder: nn.Module) -> None:
        super().set_decoder(spec, decoder)  # BART's walk; it leaves a CAD layer's absent modules to us
        d_model = decoder.config.d_model
        for layer_spec, layer in zip(spec.layer, decoder.layers):
            if layer.encoder_attn is None:  # li2022 CAD, p_net = 1.0: a zero cross-attention adds exactly 0
                self.set_attention(layer_spec.attention, _zero_attention(d_model))
            if layer.encoder_attn_layer_norm is None:  # pre-LN CAD: identity LN, it only feeds the zero branch
                self.set_layer_norm(layer_spec.attention.layer_norm, nn.LayerNorm(d_model))
            # post-LN CAD keeps its own LN: H̃ = LN(Ĥ + 0) = LN(Ĥ) (li2022 §3.3)

    def set_attention(self, spec: Any, attention: nn.Module | None, self_attention: bool = False) -> None:
        if attention is not None:  # None: a CAD layer's absent cross-attention, written by set_decoder
            super().set_attention(spec, attention, self_attention=self_attention)

    def set_layer_norm(self, spec: Any, module: nn.Module | None) -> None:
        if module is not None:  # None: a pre-LN CAD layer's absent LayerNorm, written by set_decoder
            super().set_layer_norm(spec, module)


@functools.cache
def ctranslate2_loader() -> Any:
    """Our `ctranslate2.converters.transformers.ModelLoader`, registered (once) with CTranslate2's
    ``register_loader`` for every config class in `CT2_CONFIG_NAMES`; ``loader(model, tokenizer)`` gives the
    `TransformerSpec` of a model (ADMIN is folded, mechanisms CTranslate2 lacks are refused in one sentence).
    BART's loader with the steps of `_SpecSteps` and `_LayerSteps` (CTranslate2 is imported here, not with the
    module)."""
    from ctranslate2.converters.transformers import BartLoader, register_loader

    class DeepTransformerLoader(_SpecSteps, _LayerSteps, BartLoader):
        """BART's loader with this package's conventions (see the module docstring)."""

    for name in CT2_CONFIG_NAMES:
        register_loader(name)(DeepTransformerLoader)
    return DeepTransformerLoader()


def export_ctranslate2(model: nn.Module, tokenizer: Any, output_dir: str | os.PathLike,
                       quantization: str | None = None, add_source_eos: bool = False) -> Path:
    """Write ``model`` (a standard Transformer, `hf_deepnmt.export_formats.standard_model`) as a CTranslate2 model into
    ``output_dir``: the spec from `ctranslate2_loader`, saved by CTranslate2's own converter machinery
    (``model.bin``, ``config.json``, ``shared_vocabulary.json``). ``add_source_eos``: CTranslate2 appends ``</s>``
    to every source itself (for callers that pass the tokenizer's pieces without it, as Argos Translate does;
    `hf_deepnmt.export_argos`); our engines pass the tokenizer's ids, ``</s>`` included."""
    import ctranslate2.converters

    spec = ctranslate2_loader()(model, tokenizer)
    spec.config.add_source_eos = add_source_eos

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


def search_settings(manifest: dict[str, Any], length_penalty: float | None,
                     early_stopping: bool | None) -> tuple[float, bool]:
    """The length penalty and early stopping of a search: the arguments where given, else the export's generation
    defaults (``deepnmt_export.json``), else `generate`'s (1.0, False); anything but True/False is refused."""
    generation = manifest.get("generation", {})
    if length_penalty is None:
        length_penalty = generation.get("length_penalty", 1.0)
    if early_stopping is None:
        early_stopping = generation.get("early_stopping", False)
    if early_stopping not in (True, False):
        raise UserInputError(f"`early_stopping` = {early_stopping!r} is not supported by the exported engines; use "
                         "True or False.")
    return float(length_penalty), bool(early_stopping)


class CTranslate2Engine:
    """Runs a ``ctranslate2`` export with `ctranslate2.Translator` on the CPU.

    Search settings follow `generate`: ``min_decoding_length=min_new_tokens`` (0: ``</s>`` may come first; CTranslate2's
    default is 1), the ``</s>`` counted
    in the length that the length penalty divides by (``return_end_token=True``), no input truncation beyond the
    model's positions. CTranslate2's beam search stops a sentence once K hypotheses have finished and then ranks
    them (`generate(early_stopping=True)`, which it reproduces exactly, and the package's models' default);
    transformers' own default (``early_stopping=False``) goes on while a running hypothesis could still beat the
    worst finished one, which changed 14 % of the embedded test set's outputs of a trained model (BLEU +0.03 for
    CTranslate2; benchmarks/RESULTS.md, "Output quality through each engine"). An explicit ``early_stopping=False``
    is therefore refused here, and an export of a model whose generation config says ``early_stopping=False`` (saved
    before the package made True its default) is loaded with a warning that its beams can differ from `generate`'s.
    """

    def __init__(self, folder: str | os.PathLike, intra_threads: int = 2, compute_type: str = "default",
                 patience: float = 1.0) -> None:
        import ctranslate2

        folder = Path(folder)
        self.manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        if self.manifest["format"] != "ctranslate2":
            raise UserInputError(f"{folder} holds a {self.manifest['format']} export, not a ctranslate2 one.")
        self.translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type,
                                                 inter_threads=1, intra_threads=intra_threads)
        # one vocabulary, or the source's and the target's (a converted model with two, docs/public-checkpoints.md)
        shared = folder / "shared_vocabulary.json"
        self.source_tokens = json.loads((shared if shared.is_file() else folder / "source_vocabulary.json")
                                        .read_text(encoding="utf-8"))
        self.tokens = json.loads((shared if shared.is_file() else folder / "target_vocabulary.json")
                                 .read_text(encoding="utf-8"))
        self.ids = {token: index for index, token in enumerate(self.tokens)}
        # single-token bad words (Marian's [[<pad>]]): never produced, as generate's search (`suppress_sequences`)
        banned = self.manifest.get("generation", {}).get("bad_words_ids") or []
        self.suppressed = [[self.tokens[words[0]]] for words in banned if len(words) == 1] or None
        self.patience = patience
        if self.manifest.get("generation", {}).get("early_stopping") is False:
            logger.warning_once(
                f"{folder}: the model's generation config searches with early_stopping=False, which CTranslate2 cannot "
                "do (it stops a sentence once num_beams hypotheses have finished); its beam outputs can differ from "
                "the torch and onnx engines' — set \"early_stopping\": true in the model's generation_config.json "
                "and export again for identical outputs.")

    @property
    def max_positions(self) -> int:
        """The longest sequence the model's positions cover (``max_position_embeddings``)."""
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
        length_penalty, _ = search_settings(self.manifest, length_penalty, None)
        results = self.translator.translate_batch(
            [[self.source_tokens[i] for i in ids] for ids in sources], beam_size=num_beams,
            length_penalty=length_penalty, max_decoding_length=min(max_new_tokens, self.max_positions),
            patience=self.patience, min_decoding_length=min_new_tokens, return_end_token=True, max_input_length=0,
            suppress_sequences=self.suppressed)
        return [[self.ids[token] for token in result.hypotheses[0]] for result in results]

    def score(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]]) -> list[list[float]]:
        """Per-token log-probabilities of ``targets`` (ids ending in ``</s>``) under teacher forcing."""
        eos = self.manifest["eos_token_id"]
        ends = [bool(ids) and ids[-1] == eos for ids in targets]
        results = self.translator.score_batch(  # CTranslate2 appends </s> to every target itself
            [[self.source_tokens[i] for i in ids] for ids in sources],
            [[self.tokens[i] for i in (ids[:-1] if end else ids)] for ids, end in zip(targets, ends)],
            max_input_length=0)
        return [list(result.log_probs)[: None if end else -1] for result, end in zip(results, ends)]
