"""Public checkpoints as models of this package: OPUS-MT / Marian, FSMT and fairseq Transformers, converted exactly
(docs/public-checkpoints.md; ``deepnmt convert``).

Each source is Vaswani et al.'s Transformer with Marian/BART/fairseq names, which are ours (docs/transformer.md), so
the weights are copied name for name; what differs between the sources becomes a field of `DeepTransformerConfig`:

=====================  ==========================================  =============================================
fact of the source     OPUS-MT / Marian                            fairseq / FSMT
=====================  ==========================================  =============================================
LayerNorm placement    post-LN                                     post-LN, or pre-LN with a final LN per stack
activation             ``swish`` (SiLU) in OPUS-MT, or ReLU        ``--activation-fn`` (ReLU by default)
positions              sinusoids 10000^(−2i/d), from 0             sinusoids 10000^(−i/(d/2−1)) from pad + 1, or
                       (``position_encoding="sinusoidal"``)        learned (``"sinusoidal_fairseq"``/``"learned"``,
                                                                   ``position_offset=pad+1``)
output bias            ``final_logits_bias`` → ``lm_head.bias``    none
vocabularies           shared, or separate (``decoder_vocab_size``) two dictionaries; shared when equal
special tokens         ``</s>``=0, ``<unk>``=1, ``<pad>`` last,    ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3,
                       decoding starts from ``<pad>``, no ``<s>``  decoding starts from ``</s>``
=====================  ==========================================  =============================================

Nothing is approximated: a source with something the package's Transformer cannot compute (a LayerNorm on the
embeddings, adaptive softmax, a decoder whose output width differs, attention biases on keys, mixed pre/post-LN, ...)
is refused in one sentence that names what differs, and every weight of the source must find its place (a weight
left over is refused by name, never dropped). A Marian or FSMT source is loaded with transformers' own class as well,
and the converted model's teacher-forced logits are compared with it on a probe batch before anything is written
(``converted_from.max_abs_logit_difference`` in the saved config); fairseq itself is not a dependency, so a fairseq
checkpoint's conversion is checked by the tests against transformers' independent ports of fairseq's Transformer
(FSMT for post-LN, M2M100 for pre-LN).

The tokenizer is the source's own, kept as it is (a `MarianTokenizer` with its sentencepiece models and vocabularies),
or for Moses + BPE the same files under `FairseqMosesBPETokenizer` (an `FSMTTokenizer` whose ``text_target=`` side
uses the target language and dictionary: transformers' encodes targets with the source's); a fairseq checkpoint's
dictionaries and BPE files become one of these (fastBPE / subword-nmt codes with Moses: `FairseqMosesBPETokenizer`;
sentencepiece: `MarianTokenizer` with the two dictionaries as its separate vocabularies), ids identical to fairseq's. They are slow (Python) tokenizers and need
the ``convert`` extra (``sentencepiece``, ``sacremoses``).

Not copied next to the weights (nothing a saved model runs imports it); transformers' Marian and FSMT classes are
imported inside the functions.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .configuration_deep_transformer import DeepTransformerConfig
from .errors import UserInputError
from .modeling_common import PositionEncoding
from .pipeline_translation import record_language_pair

__all__ = ["SOURCE_FORMATS", "Converted", "convert_checkpoint", "convert_model", "detect_source_format",
           "read_fairseq_dictionary"]

SOURCE_FORMATS: tuple[str, ...] = ("marian", "fsmt", "fairseq")
# What `deepnmt convert` names when a source is none of these.
SUPPORTED = ("a MarianMTModel folder or Hub id (OPUS-MT), an FSMT folder, or a fairseq checkpoint directory "
             "(checkpoint*.pt or model.pt with dict.<src>.txt, dict.<tgt>.txt and its BPE files)")
FAIRSEQ_CHECKPOINTS = ("checkpoint_best.pt", "checkpoint_last.pt", "model.pt")
# fairseq's `Dictionary` specials, in index order (fairseq/data/dictionary.py)
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
# Activations of fairseq's `--activation-fn` as transformers' ACT2FN names (fairseq/utils.py get_activation_fn)
FAIRSEQ_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_new", "gelu_fast": "gelu_new",
                       "tanh": "tanh", "swish": "silu", "silu": "silu"}
# Tolerance of the conversion's own check of a Marian / FSMT source (float32 logits on a probe batch)
LOGIT_TOLERANCE = 1e-4


@dataclass
class Converted:
    """A converted model with its tokenizer and what the conversion found."""

    model: nn.Module
    tokenizer: Any
    source_format: str
    source: str
    source_lang: str | None = None
    target_lang: str | None = None
    notes: list[str] = field(default_factory=list)
    max_abs_logit_difference: float | None = None
    reference: str | None = None
    """The transformers class the logits were checked against (None: no reference, a fairseq checkpoint)."""

    def provenance(self) -> dict[str, Any]:
        """What the saved config records under ``converted_from``."""
        found = {"format": self.source_format, "source": self.source}
        if self.max_abs_logit_difference is not None:
            found["max_abs_logit_difference"] = self.max_abs_logit_difference
            found["checked_against"] = self.reference
        if self.notes:
            found["notes"] = list(self.notes)
        return found


# ------------------------------------------------------------------------------------------------ detection
def detect_source_format(source: str | os.PathLike) -> str:
    """``"marian"``, ``"fsmt"`` or ``"fairseq"`` for a local folder (or a fairseq ``.pt`` file), from its
    ``config.json``'s ``model_type`` or its checkpoint files; a name that is not a local path is a Hub id, read
    through transformers (which needs the Hub). Anything else is refused in one sentence naming what was found."""
    path = Path(source)
    if path.is_file() and path.suffix == ".pt":
        return "fairseq"
    if path.is_dir():
        config_file = path / "config.json"
        if config_file.is_file():
            model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
            return _format_of_model_type(model_type, str(source))
        if _fairseq_checkpoints(path):
            return "fairseq"
        raise UserInputError(f"convert: {source} holds neither a config.json nor a fairseq checkpoint (*.pt); pass "
                             f"{SUPPORTED}.")
    if path.exists():
        raise UserInputError(f"convert: {source} is a file but not a fairseq checkpoint (*.pt); pass {SUPPORTED}.")
    from transformers import AutoConfig  # a Hub id

    return _format_of_model_type(AutoConfig.from_pretrained(str(source)).model_type, str(source))


def _format_of_model_type(model_type: str | None, source: str) -> str:
    from .registry import MODEL_TYPES

    if model_type in ("marian", "fsmt"):
        return model_type
    if model_type in MODEL_TYPES:
        raise UserInputError(f"convert: {source} is already a model of hf_deepnmt (model_type {model_type!r}); use it "
                             "as it is.")
    raise UserInputError(f"convert: {source} is a {model_type!r} model; hf_deepnmt converts {SUPPORTED}.")


def _fairseq_checkpoints(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.pt") if path.is_file())


# ------------------------------------------------------------------------------------------------ entry points
def convert_checkpoint(source: str | os.PathLike, output_dir: str | os.PathLike, *, checkpoint: str | None = None,
                       source_lang: str | None = None, target_lang: str | None = None, bpe: str | None = None,
                       tokenizer: str | None = None, trust_checkpoint: bool = False) -> Path:
    """Convert a public checkpoint into a saved folder of this package: ``from_pretrained``, the translation
    pipeline, remote code, ``deepnmt translate / evaluate / serve / export / push``, ensembles and ``distill`` take
    it as one of their own.

    Args:
        source: a MarianMTModel folder or Hub id (e.g. ``Helsinki-NLP/opus-mt-en-de``), an FSMT folder, or a fairseq
            checkpoint directory (or ``.pt`` file) with its dictionaries and BPE files.
        output_dir: the new folder (it must not exist, or be empty); written atomically.
        checkpoint: the ``.pt`` file of a fairseq directory holding several (default: ``checkpoint_best.pt``,
            ``checkpoint_last.pt``, ``model.pt`` or the only one).
        source_lang, target_lang: the language pair to record when the source does not (fairseq records it; Marian
            folders often do not); given ones must agree with a recorded pair.
        bpe, tokenizer: a fairseq checkpoint's BPE (``fastbpe``, ``subword_nmt``, ``sentencepiece``) and
            pre-tokenizer (``moses`` or ``none``) when its options do not record them (BPE applied outside fairseq).
        trust_checkpoint: unpickle a fairseq checkpoint that holds Python objects beyond tensors and its options
            (only for files you trust: unpickling runs code).

    Returns the folder. The saved config records ``converted_from`` (format, source, the logit check).
    """
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UserInputError(f"convert: `--output_dir` {output} exists and is not an empty folder; choose a new one "
                             "(a conversion never writes into an existing model).")
    converted = convert_model(source, checkpoint=checkpoint, source_lang=source_lang, target_lang=target_lang,
                              bpe=bpe, tokenizer=tokenizer, trust_checkpoint=trust_checkpoint)
    return save_converted(converted, output)


def save_converted(converted: Converted, output_dir: str | os.PathLike) -> Path:
    """Write ``converted`` (model, tokenizer, ``converted_from``) into ``output_dir``, atomically: a staging folder
    beside it is renamed once everything is written."""
    output = Path(output_dir)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-", dir=output.parent))
    try:
        converted.model.config.converted_from = converted.provenance()
        converted.model.save_pretrained(staging)
        converted.tokenizer.save_pretrained(staging)
        if output.exists():
            output.rmdir()  # empty (checked by convert_checkpoint)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output


def convert_model(source: Any, *, tokenizer_object: Any = None, checkpoint: str | None = None,
                  source_lang: str | None = None, target_lang: str | None = None, bpe: str | None = None,
                  tokenizer: str | None = None, trust_checkpoint: bool = False) -> Converted:
    """The converted model and tokenizer of ``source`` in memory (`convert_checkpoint` without the folder).

    ``source`` may also be a loaded `MarianMTModel` or `FSMTForConditionalGeneration` (then ``tokenizer_object`` is
    its tokenizer, which the converted model keeps)."""
    from transformers import PreTrainedModel

    if isinstance(source, PreTrainedModel):
        kind = _format_of_model_type(getattr(source.config, "model_type", None), type(source).__name__)
        if tokenizer_object is None:
            raise UserInputError("convert_model: pass the source model's tokenizer as `tokenizer_object` (the "
                                 "converted model keeps it).")
        name = getattr(source, "name_or_path", "") or type(source).__name__
        converted = (_from_marian if kind == "marian" else _from_fsmt)(source.eval(), tokenizer_object, name)
    else:
        kind = detect_source_format(source)
        if kind == "fairseq":
            converted = _from_fairseq(Path(source), checkpoint, bpe, tokenizer, trust_checkpoint)
        else:
            converted = _from_transformers(kind, str(source))
    _record_pair(converted, source_lang, target_lang)
    return converted


def _record_pair(converted: Converted, source_lang: str | None, target_lang: str | None) -> None:
    """The language pair the source records, the given one, or both where they agree (`record_language_pair`)."""
    for name, given, found in (("--source_lang", source_lang, converted.source_lang),
                               ("--target_lang", target_lang, converted.target_lang)):
        if given is not None and found is not None and given != found:
            raise UserInputError(f"convert: `{name}` = {given!r} is not allowed; the source records {found!r}.")
    converted.source_lang = source_lang or converted.source_lang
    converted.target_lang = target_lang or converted.target_lang
    if converted.source_lang and converted.target_lang:
        record_language_pair(converted.model.config, converted.source_lang, converted.target_lang)


# ------------------------------------------------------------------------------------------------ transformers sources
def _from_transformers(kind: str, source: str) -> Converted:
    """A Marian or FSMT folder / Hub id, loaded with transformers' own classes."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except ImportError as error:
        raise UserInputError(f"convert: the tokenizer of {source} needs {_missing_module(error)}, which the `convert` "
                             "extra installs: pip install 'hf_deepnmt[convert]'.") from error
    model = AutoModelForSeq2SeqLM.from_pretrained(source).eval()
    return (_from_marian if kind == "marian" else _from_fsmt)(model, tokenizer, source)


def _missing_module(error: ImportError) -> str:
    text = str(error)
    for module in ("sentencepiece", "sacremoses"):
        if module in text.lower():
            return module
    return getattr(error, "name", None) or "a module that is not installed"


def _common_fields(config: Any) -> dict[str, Any]:
    """The fields Marian and FSMT spell as we do (Marian/BART names, docs/transformer.md)."""
    names = ("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
             "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "dropout", "attention_dropout",
             "activation_dropout", "max_position_embeddings", "scale_embedding", "pad_token_id", "eos_token_id",
             "decoder_start_token_id")
    return {name: getattr(config, name) for name in names}


def _layer_drop_notes(config: Any) -> list[str]:
    """LayerDrop acts only in training: the converted network computes the same; fine-tuning runs without it."""
    notes = []
    for stack in ("encoder", "decoder"):
        rate = getattr(config, f"{stack}_layerdrop", 0.0) or 0.0
        if rate:
            notes.append(f"{stack}_layerdrop={rate} is a training-time regulariser the package does not implement; "
                         "inference is unchanged, fine-tuning runs without it")
    return notes


def _from_marian(marian: nn.Module, tokenizer: Any, source: str) -> Converted:
    """OPUS-MT / MarianMTModel (transformers' modeling_marian): post-LN, Marian's sinusoids from 0, the output bias
    ``final_logits_bias``, shared or separate vocabularies, decoding from ``<pad>``."""
    config = marian.config
    state = marian.state_dict()
    # what the source computes with, whatever its config says of tying (transformers #26216: a config without
    # tie_word_embeddings leaves encoder, decoder and output embeddings apart): one matrix only where they are one
    source_embedding = state["model.encoder.embed_tokens.weight"]
    target_embedding = state["model.decoder.embed_tokens.weight"]
    shared = source_embedding.shape == target_embedding.shape and torch.equal(source_embedding, target_embedding)
    fields = _common_fields(config)
    fields.update(
        vocab_size=source_embedding.size(0),
        share_encoder_decoder_embeddings=shared,
        decoder_vocab_size=None if shared else target_embedding.size(0),
        tie_word_embeddings=bool(torch.equal(state["lm_head.weight"], target_embedding)),
        position_encoding="sinusoidal", position_offset=0,  # Marian's table, from position 0 (module docstring)
        output_bias=True,  # Marian's decoder_ff_logit_out_b
        layer_norm_position="post", layer_norm_eps=1e-5,  # transformers' Marian: nn.LayerNorm's default
        bos_token_id=config.bos_token_id,
        unk_token_id=_token_id(tokenizer, "unk", source),
    )
    weights = {"lm_head.weight": state["lm_head.weight"], "lm_head.bias": state["final_logits_bias"][0],
               "model.shared.weight": source_embedding}
    if not shared:
        weights["model.decoder.embed_tokens.weight"] = target_embedding
    positions = {f"model.{stack}.embed_positions.weight": state[f"model.{stack}.embed_positions.weight"]
                 for stack in ("encoder", "decoder")}
    ignored = {"final_logits_bias", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
               "model.shared.weight", *positions}
    layers = {name: tensor for name, tensor in state.items() if name not in ignored and name not in weights}
    model = _build(fields, {**weights, **layers}, source)
    _check_position_table(model, positions, 0, "Marian")
    converted = Converted(model, tokenizer, "marian", source, getattr(tokenizer, "source_lang", None),
                          getattr(tokenizer, "target_lang", None), _layer_drop_notes(config))
    model.generation_config = _in_new_tokens(marian.generation_config)  # Marian's search: beams, [[<pad>]] banned, …
    converted.max_abs_logit_difference = _check_logits(model, marian, config.vocab_size, fields)
    converted.reference = type(marian).__name__
    _note_language_codes(converted, tokenizer)
    return converted


def _in_new_tokens(generation_config: Any) -> Any:
    """A copy of a source model's generation config with its length limit ``max_length`` (the decoder's whole
    sequence, start token included) said as ``max_new_tokens = max_length - 1``: the same limit for `generate`,
    and one that `deepnmt translate`'s own per-batch ``max_new_tokens`` replaces without transformers warning, at
    every batch, that both are set (docs/public-checkpoints.md)."""
    config = copy.deepcopy(generation_config)
    if config.max_length is not None and config.max_new_tokens is None:
        config.max_new_tokens, config.max_length = config.max_length - 1, None
    return config


def _note_language_codes(converted: Converted, tokenizer: Any) -> None:
    """A multi-target OPUS-MT model (``>>xx<<`` tokens in its vocabulary) needs the target's code at the start of
    every source: recorded as ``target_language_codes`` so that the pipeline adds it for ``tgt_lang``."""
    codes = sorted(getattr(tokenizer, "supported_language_codes", None) or [])
    if codes:
        converted.model.config.target_language_codes = codes
        converted.target_lang = None  # many targets: no one pair is recorded unless --target_lang gives one
        converted.notes.append(f"multi-target model: a source starts with its target's code, one of {', '.join(codes[:8])}"
                               + (" …" if len(codes) > 8 else ""))


def _from_fsmt(fsmt: nn.Module, tokenizer: Any, source: str) -> Converted:
    """transformers' FSMT (its port of fairseq's WMT19 Transformers): post-LN, fairseq's sinusoids from pad + 1,
    separate dictionaries (one matrix when they hold the same embedding), decoding from ``</s>``."""
    config = fsmt.config
    state = {name.removeprefix("model."): tensor for name, tensor in fsmt.state_dict().items()}
    fields = _common_fields(config)
    fields.update(layer_norm_position="post", bos_token_id=config.bos_token_id,
                  unk_token_id=_token_id(tokenizer, "unk", source))
    converted = _from_fairseq_layout(state, fields, source, "fsmt", learned=False,
                                     ignored={"encoder.embed_positions.weight", "decoder.embed_positions.weight"})
    langs = list(getattr(config, "langs", None) or [])
    converted.source_lang, converted.target_lang = (langs + [None, None])[:2]
    converted.tokenizer = _fsmt_with_targets(tokenizer)
    converted.notes += _layer_drop_notes(config)
    model = converted.model
    positions = {f"model.{stack}.embed_positions.weight": fsmt.state_dict()[f"model.{stack}.embed_positions.weight"]
                 for stack in ("encoder", "decoder")}
    _check_position_table(model, positions, model.config.position_offset, "FSMT")
    model.generation_config = _in_new_tokens(fsmt.generation_config)
    converted.max_abs_logit_difference = _check_logits(model, fsmt, model.config.vocab_size, fields)
    converted.reference = type(fsmt).__name__
    return converted


def _fsmt_with_targets(tokenizer: Any) -> Any:
    """An `FSMTTokenizer` as `FairseqMosesBPETokenizer`: the same files and source ids, targets encoded with the
    target dictionary (`hf_deepnmt.tokenization_fairseq`); any other tokenizer as it is."""
    if type(tokenizer).__name__ != "FSMTTokenizer":
        return tokenizer
    staging = Path(tempfile.mkdtemp(prefix="hf_deepnmt_fsmt_tokenizer_"))
    try:
        tokenizer.save_pretrained(staging)
        return _target_aware(staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _token_id(tokenizer: Any, name: str, source: str) -> int:
    value = getattr(tokenizer, f"{name}_token_id", None)
    if value is None:
        raise UserInputError(f"convert: the tokenizer of {source} has no <{name}> token; hf_deepnmt needs one.")
    return int(value)


# ------------------------------------------------------------------------------------------------ fairseq layout
def _from_fairseq_layout(state: Mapping[str, torch.Tensor], fields: dict[str, Any], source: str, kind: str,
                         learned: bool, ignored: set[str]) -> Converted:
    """A state dict with fairseq's names (``encoder.embed_tokens.weight``, ``decoder.output_projection.weight``,
    ``encoder.layers.N.self_attn.k_proj.weight``, …; FSMT's without its ``model.`` prefix) as our model: one
    embedding matrix when the two dictionaries hold the same one (``--share-all-embeddings``), the output
    projection tied when it equals the decoder's embedding (``--share-decoder-input-output-embed``)."""
    source_embedding = state["encoder.embed_tokens.weight"]
    target_embedding = state["decoder.embed_tokens.weight"]
    projection = state.get("decoder.output_projection.weight", state.get("decoder.embed_out"))
    if projection is None:  # fairseq before 0.10 stored no projection when it was the embedding
        projection = target_embedding
    if projection.shape != target_embedding.shape:
        raise UserInputError(f"convert: the output projection of {source} has shape {tuple(projection.shape)} but the "
                             f"target embedding {tuple(target_embedding.shape)}; hf_deepnmt's output projection "
                             "reads the decoder width into the target vocabulary.")
    shared = source_embedding.shape == target_embedding.shape and torch.equal(source_embedding, target_embedding)
    offset = fields["pad_token_id"] + 1  # fairseq's make_positions: the first token stands at padding_idx + 1
    fields.update(
        vocab_size=source_embedding.size(0),
        share_encoder_decoder_embeddings=shared,
        decoder_vocab_size=None if shared else target_embedding.size(0),
        tie_word_embeddings=bool(torch.equal(projection, target_embedding)),
        position_encoding="learned" if learned else "sinusoidal_fairseq",
        position_offset=offset,
        output_bias=False,
        layer_norm_eps=1e-5,  # fairseq's and FSMT's LayerNorm
    )
    weights = {"model.shared.weight": source_embedding, "lm_head.weight": projection}
    if not shared:
        weights["model.decoder.embed_tokens.weight"] = target_embedding
    used = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight",
            "decoder.embed_out", *ignored}
    for name, tensor in state.items():
        if name in used:
            continue
        if name.startswith(("encoder.", "decoder.")):
            weights[f"model.{name}"] = tensor  # layers, final pre-LN norms and learned positions: the same names
        else:
            weights[name] = tensor  # refused by name in _build
    model = _build(fields, weights, source)
    return Converted(model, None, kind, source)


def _build(fields: dict[str, Any], weights: Mapping[str, torch.Tensor], source: str) -> nn.Module:
    """Our model of ``fields`` with exactly ``weights``: a weight with no place in it, or a place no weight fills, is
    refused in one sentence naming it (nothing dropped, nothing left at its initialisation)."""
    from .modeling_deep_transformer import DeepTransformerForConditionalGeneration

    config = DeepTransformerConfig(**fields)
    model = DeepTransformerForConditionalGeneration(config).eval()
    expected = model.state_dict()
    for name, tensor in weights.items():
        if name not in expected:
            raise UserInputError(f"convert: the weight `{name}` of {source} has no place in hf_deepnmt's Transformer "
                                 "(a mechanism it does not compute), so the conversion would not be exact.")
        if tuple(expected[name].shape) != tuple(tensor.shape):
            raise UserInputError(f"convert: the weight `{name}` of {source} has shape {tuple(tensor.shape)}, hf_deepnmt's "
                                 f"Transformer of the same configuration {tuple(expected[name].shape)}.")
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = [name for name in expected if name not in weights and name not in tied]
    if missing:
        raise UserInputError(f"convert: {source} has no weight for `{missing[0]}`, which hf_deepnmt's Transformer of this "
                             "configuration needs; the source is not a standard Transformer of the kinds converted.")
    with torch.no_grad():
        model.load_state_dict({name: tensor.detach().to(torch.float32) for name, tensor in weights.items()
                               if name not in tied}, strict=False)
    model.tie_weights()
    if config.tie_word_embeddings and not torch.equal(model.lm_head.weight, weights["lm_head.weight"].float()):
        raise UserInputError(f"convert: {source} ties its output projection to the target embedding, but the two "
                             "weights differ.")
    return model


def _check_position_table(model: nn.Module, tables: Mapping[str, torch.Tensor], offset: int, name: str) -> None:
    """The source's own position table must be the one our config computes (rows ``offset`` … of it)."""
    for key, table in tables.items():
        stack = model.get_encoder() if ".encoder." in key else model.get_decoder()
        rows = min(table.size(0) - offset, stack.config.max_position_embeddings)
        ours = stack.embed_positions.table(rows)
        if not torch.allclose(table[offset:offset + rows].float(), ours, atol=1e-5, rtol=0):
            raise UserInputError(f"convert: the position table `{key}` is not {name}'s sinusoids as documented, so the "
                                 "conversion would not be exact.")


@torch.no_grad()
def _check_logits(model: nn.Module, reference: nn.Module, vocab_size: int, fields: Mapping[str, Any]) -> float:
    """Teacher-forced logits of the converted model and the transformers source on a fixed probe batch (two
    sentences, one padded, ids avoiding the specials); refused when they differ by more than `LOGIT_TOLERANCE`."""
    generator = torch.Generator().manual_seed(0)
    specials = {fields.get(name) for name in ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id",
                                              "unk_token_id")}
    ordinary = torch.tensor([token for token in range(min(vocab_size, model.config.target_vocab_size))
                             if token not in specials])
    source = ordinary[torch.randint(len(ordinary), (2, 9), generator=generator)]
    source[:, -1] = fields["eos_token_id"]
    mask = torch.ones_like(source)
    source[1, 6:], mask[1, 6:] = fields["pad_token_id"], 0
    source[1, 5] = fields["eos_token_id"]
    target = ordinary[torch.randint(len(ordinary), (2, 7), generator=generator)]
    start = torch.full((2, 1), fields["decoder_start_token_id"])
    decoder_input_ids = torch.cat([start, target[:, :-1]], dim=1)
    ours = model(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_input_ids).logits
    # use_cache=False: FSMT builds its causal mask only without a cache (with one it expects one token per call)
    theirs = reference(input_ids=source, attention_mask=mask, decoder_input_ids=decoder_input_ids,
                       use_cache=False).logits
    difference = float((ours - theirs).abs().max())
    if not difference <= LOGIT_TOLERANCE:
        raise UserInputError(f"convert: the converted model's logits differ from the source's by {difference:.3g} "
                             f"(more than {LOGIT_TOLERANCE}); it uses something the conversion does not reproduce.")
    return difference


# ------------------------------------------------------------------------------------------------ fairseq
# fairseq's transformer base_architecture defaults (fairseq/models/transformer/transformer_legacy.py), for options a
# checkpoint's namespace leaves out
FAIRSEQ_DEFAULTS: dict[str, Any] = {
    "encoder_embed_dim": 512, "encoder_ffn_embed_dim": 2048, "encoder_layers": 6, "encoder_attention_heads": 8,
    "encoder_normalize_before": False, "encoder_learned_pos": False, "decoder_layers": 6,
    "decoder_attention_heads": 8, "decoder_normalize_before": False, "decoder_learned_pos": False,
    "attention_dropout": 0.0, "activation_dropout": 0.0, "activation_fn": "relu", "dropout": 0.1,
    "adaptive_softmax_cutoff": None, "share_decoder_input_output_embed": False, "share_all_embeddings": False,
    "no_token_positional_embeddings": False, "adaptive_input": False, "no_cross_attention": False,
    "cross_self_attention": False, "no_scale_embedding": False, "layernorm_embedding": False,
    "tie_adaptive_weights": False, "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "quant_noise_pq": 0.0,
    "max_source_positions": 1024, "max_target_positions": 1024, "no_decoder_final_norm": False,
}
# Options whose non-default value means a network hf_deepnmt's Transformer does not compute: (option, why)
FAIRSEQ_REFUSED: tuple[tuple[str, str], ...] = (
    ("layernorm_embedding", "a LayerNorm on the embeddings"),
    ("no_token_positional_embeddings", "no positions at all"),
    ("adaptive_softmax_cutoff", "an adaptive softmax"),
    ("adaptive_input", "adaptive input embeddings"),
    ("tie_adaptive_weights", "adaptive weights"),
    ("no_cross_attention", "a decoder without cross-attention"),
    ("cross_self_attention", "cross+self attention"),
    ("quant_noise_pq", "quantization noise"),
    ("no_decoder_final_norm", "a pre-LN decoder without its final LayerNorm"),
)


def read_fairseq_dictionary(path: str | os.PathLike) -> dict[str, int]:
    """A fairseq ``dict.<lang>.txt`` as token → id: the specials ``<s> <pad> </s> <unk>`` = 0…3, then one token per
    line in file order (``token count``; a line flagged ``#fairseq:overwrite`` replaces the token's earlier id), as
    `fairseq.data.Dictionary.load` reads it."""
    indices = {token: index for index, token in enumerate(FAIRSEQ_SPECIALS)}
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        line = line.rstrip()
        if not line:
            continue
        overwrite = line.endswith(" #fairseq:overwrite")
        if overwrite:
            line = line[: -len(" #fairseq:overwrite")]
        token, _, count = line.rpartition(" ")
        if not token or not count.lstrip("-").isdigit():
            raise UserInputError(f"convert: line {number} of {path} is {line!r}; a fairseq dictionary line is "
                                 "'<token> <count>'.")
        if token in indices and not overwrite:
            raise UserInputError(f"convert: {path} lists {token!r} twice (line {number}) without #fairseq:overwrite.")
        indices[token] = indices[token] if token in indices else len(indices)
    return indices


def _load_fairseq(path: Path, trust_checkpoint: bool) -> dict[str, Any]:
    """A fairseq checkpoint, unpickled with torch's safe loader (tensors and ``argparse.Namespace`` options); one
    holding other Python objects needs ``trust_checkpoint``."""
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 (torch raises UnpicklingError or RuntimeError)
        if not trust_checkpoint:
            reason = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:160]}"
            raise UserInputError(f"convert: {path} holds Python objects beyond tensors and its options ({reason}); if "
                                 "you trust the file, pass --trust_checkpoint (unpickling runs code).") from error
    return torch.load(path, map_location="cpu", weights_only=False)


def _fairseq_options(checkpoint: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The model options of a checkpoint: ``args`` (an ``argparse.Namespace``, fairseq < 0.10) or ``cfg["model"]``
    (fairseq ≥ 0.10; flat legacy names, or the nested ``encoder.embed_dim`` of `TransformerConfig`), with
    ``cfg["task"]``'s languages; fairseq's defaults for the options left out."""
    args = checkpoint.get("args")
    if args is not None:
        options = dict(vars(args))
    else:
        cfg = checkpoint.get("cfg") or {}
        model = cfg.get("model") if isinstance(cfg, Mapping) else None
        if model is None:
            raise UserInputError(f"convert: {path} records neither `args` nor `cfg['model']`; it is not a fairseq "
                                 "training checkpoint.")
        options = dict(vars(model)) if isinstance(model, argparse.Namespace) else dict(model)
        for stack in ("encoder", "decoder"):  # TransformerConfig's nested names, flattened as the legacy ones
            nested = options.pop(stack, None)
            if isinstance(nested, Mapping):
                for key, value in nested.items():
                    flat = f"{stack}_{key}" if key != "ffn_embed_dim" else f"{stack}_ffn_embed_dim"
                    options.setdefault(flat, value)
        task = cfg.get("task") if isinstance(cfg, Mapping) else None
        if isinstance(task, Mapping):
            options.setdefault("task", task.get("_name"))
            for key in ("source_lang", "target_lang"):
                options.setdefault(key, task.get(key))
        for key in ("bpe", "tokenizer"):
            section = cfg.get(key) if isinstance(cfg, Mapping) else None
            if isinstance(section, Mapping):
                options.setdefault(key, section.get("_name"))
                for name, value in section.items():
                    options.setdefault(name, value)
    merged = {**FAIRSEQ_DEFAULTS, **{key: value for key, value in options.items() if value is not None}}
    merged.setdefault("decoder_embed_dim", merged["encoder_embed_dim"])
    merged.setdefault("decoder_ffn_embed_dim", merged["encoder_ffn_embed_dim"])
    merged.setdefault("decoder_output_dim", merged["decoder_embed_dim"])
    merged.setdefault("decoder_input_dim", merged["decoder_embed_dim"])
    merged.setdefault("activation_dropout", merged.get("relu_dropout", 0.0))
    return merged


def _fairseq_checkpoint_file(folder: Path, checkpoint: str | None) -> Path:
    if checkpoint is not None:
        path = folder / checkpoint
        if not path.is_file():
            raise UserInputError(f"convert: `--checkpoint` = {checkpoint!r} is not a file in {folder}; its checkpoints "
                                 f"are {', '.join(p.name for p in _fairseq_checkpoints(folder)) or 'none'}.")
        return path
    found = _fairseq_checkpoints(folder)
    for name in FAIRSEQ_CHECKPOINTS:
        if folder / name in found:
            return folder / name
    if len(found) == 1:
        return found[0]
    raise UserInputError(f"convert: {folder} holds {len(found)} checkpoints ({', '.join(p.name for p in found[:6])}); "
                         "choose one with --checkpoint.")


def _from_fairseq(source: Path, checkpoint: str | None, bpe: str | None, pre_tokenizer: str | None,
                  trust_checkpoint: bool) -> Converted:
    """A fairseq Transformer checkpoint with its dictionaries and BPE files (module docstring)."""
    folder = source.parent if source.is_file() else source
    path = source if source.is_file() else _fairseq_checkpoint_file(folder, checkpoint)
    loaded = _load_fairseq(path, trust_checkpoint)
    if not isinstance(loaded, Mapping) or "model" not in loaded:
        raise UserInputError(f"convert: {path} holds no `model` state dict; it is not a fairseq checkpoint.")
    options = _fairseq_options(loaded, path)
    where = f"{path}"
    task = options.get("task", "translation")
    if task not in ("translation", None):
        raise UserInputError(f"convert: {where} was trained for fairseq's task {task!r}; hf_deepnmt converts "
                             "'translation' models (one source and one target language).")
    for option, what in FAIRSEQ_REFUSED:
        if options.get(option) not in (None, False, 0, 0.0, FAIRSEQ_DEFAULTS.get(option)):
            raise UserInputError(f"convert: {where} uses {what} (--{option.replace('_', '-')} = {options[option]!r}), "
                                 "which hf_deepnmt's Transformer does not compute; it cannot be converted exactly.")
    widths = {name: options[name] for name in ("encoder_embed_dim", "decoder_embed_dim", "decoder_output_dim",
                                               "decoder_input_dim")}
    if len(set(widths.values())) != 1:
        raise UserInputError(f"convert: {where} has widths {widths}; hf_deepnmt's Transformer has one width "
                             "(d_model) for every stack, input and output.")
    for pair in (("encoder_normalize_before", "decoder_normalize_before"), ("encoder_learned_pos", "decoder_learned_pos")):
        if bool(options[pair[0]]) != bool(options[pair[1]]):
            raise UserInputError(f"convert: {where} has --{pair[0].replace('_', '-')} {options[pair[0]]} but "
                                 f"--{pair[1].replace('_', '-')} {options[pair[1]]}; hf_deepnmt's Transformer sets "
                                 "both stacks alike.")
    activation = options["activation_fn"]
    if activation not in FAIRSEQ_ACTIVATIONS:
        raise UserInputError(f"convert: {where} uses --activation-fn {activation!r}; hf_deepnmt converts "
                             f"{', '.join(FAIRSEQ_ACTIVATIONS)}.")
    learned = bool(options["encoder_learned_pos"])
    if learned and options["max_source_positions"] != options["max_target_positions"]:
        raise UserInputError(f"convert: {where} learns position tables of {options['max_source_positions']} (source) and "
                             f"{options['max_target_positions']} (target) rows; hf_deepnmt's stacks share one "
                             "max_position_embeddings.")
    source_lang, target_lang = options.get("source_lang"), options.get("target_lang")
    dictionaries = _fairseq_dictionaries(folder, source_lang, target_lang)
    state = _upgrade_fairseq_state(loaded["model"])
    for stack, dictionary in zip(("encoder", "decoder"), dictionaries):
        rows = state[f"{stack}.embed_tokens.weight"].size(0)
        _pad_dictionary(dictionary, rows, folder, stack)
    fields = dict(
        d_model=options["encoder_embed_dim"], encoder_layers=options["encoder_layers"],
        decoder_layers=options["decoder_layers"], encoder_attention_heads=options["encoder_attention_heads"],
        decoder_attention_heads=options["decoder_attention_heads"],
        encoder_ffn_dim=options["encoder_ffn_embed_dim"], decoder_ffn_dim=options["decoder_ffn_embed_dim"],
        activation_function=FAIRSEQ_ACTIVATIONS[activation], dropout=options["dropout"],
        attention_dropout=options["attention_dropout"], activation_dropout=options["activation_dropout"],
        max_position_embeddings=min(options["max_source_positions"], options["max_target_positions"]),
        scale_embedding=not options["no_scale_embedding"],
        layer_norm_position="pre" if options["encoder_normalize_before"] else "post",
        bos_token_id=0, pad_token_id=1, eos_token_id=2, unk_token_id=3, decoder_start_token_id=2,
    )
    ignored = {name for name in state if name.endswith((".version", "embed_positions._float_tensor"))}
    converted = _from_fairseq_layout(state, fields, where, "fairseq", learned, ignored)
    converted.tokenizer = _fairseq_tokenizer(folder, options, dictionaries, bpe, pre_tokenizer, fields, where)
    converted.source_lang, converted.target_lang = source_lang, target_lang
    converted.notes += _layer_drop_notes(argparse.Namespace(**{key: options.get(key, 0.0) for key in
                                                               ("encoder_layerdrop", "decoder_layerdrop")}))
    converted.model.generation_config = _fairseq_generation_config(converted.model.config)
    return converted


def _upgrade_fairseq_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Older fairseq names as fairseq's own `upgrade_state_dict_named` renames them: ``layer_norms.0/1`` →
    ``self_attn_layer_norm`` / ``final_layer_norm`` (``layer_norms.0/1/2`` in the decoder, with
    ``encoder_attn_layer_norm``), and one ``in_proj_weight`` / ``in_proj_bias`` split into q, k, v."""
    upgraded: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        parts = name.split(".")
        if "layer_norms" in parts:
            index = parts.index("layer_norms")
            decoder = parts[0] == "decoder"
            names = (["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"] if decoder
                     else ["self_attn_layer_norm", "final_layer_norm"])
            name = ".".join(parts[:index] + [names[int(parts[index + 1])]] + parts[index + 2:])
        if name.endswith(("in_proj_weight", "in_proj_bias")):
            prefix, kind = name.rsplit(".", 1)
            suffix = "weight" if kind == "in_proj_weight" else "bias"
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3, dim=0)):
                upgraded[f"{prefix}.{part}.{suffix}"] = chunk
            continue
        upgraded[name] = tensor
    return upgraded


def _fairseq_dictionaries(folder: Path, source_lang: str | None, target_lang: str | None) -> list[dict[str, int]]:
    """``dict.<source_lang>.txt`` and ``dict.<target_lang>.txt`` of the checkpoint's folder."""
    if not source_lang or not target_lang:
        found = sorted(folder.glob("dict.*.txt"))
        raise UserInputError(f"convert: the checkpoint in {folder} records no language pair, so its dictionaries "
                             f"cannot be told apart ({', '.join(p.name for p in found) or 'none found'}); pass "
                             "--source_lang and --target_lang.")
    paths = [folder / f"dict.{source_lang}.txt", folder / f"dict.{target_lang}.txt"]
    for path in paths:
        if not path.is_file():
            raise UserInputError(f"convert: {path} is missing; a fairseq checkpoint folder needs its dictionaries "
                                 "(the dict.*.txt files fairseq-preprocess wrote) beside the checkpoint.")
    return [read_fairseq_dictionary(path) for path in paths]


def _pad_dictionary(dictionary: dict[str, int], rows: int, folder: Path, stack: str) -> None:
    """fairseq pads a dictionary to a multiple of 8 with ``madeupwordNNNN`` entries when it builds the model
    (`Dictionary.pad_to_multiple_`): the same names fill the rows the file leaves out."""
    if len(dictionary) > rows:
        raise UserInputError(f"convert: the {stack} dictionary in {folder} has {len(dictionary)} tokens but the "
                             f"{stack} embedding {rows} rows; they do not belong together.")
    number = 0
    while len(dictionary) < rows:
        name = f"madeupword{number:04d}"
        number += 1
        if name not in dictionary:
            dictionary[name] = len(dictionary)


def _fairseq_generation_config(config: DeepTransformerConfig) -> Any:
    """fairseq-generate's defaults as a generation config: beam 5, a hypothesis ends once 5 have finished
    (``early_stopping=True``), length penalty 1, ``<pad>`` never produced, ``</s>`` forced at the length limit,
    at most 200 new tokens (``--max-len-b 200``) within the positions."""
    from transformers import GenerationConfig

    return GenerationConfig(num_beams=5, early_stopping=True, length_penalty=1.0,
                            max_new_tokens=min(200, config.max_position_embeddings - 1),
                            bad_words_ids=[[config.pad_token_id]], forced_eos_token_id=config.eos_token_id,
                            decoder_start_token_id=config.decoder_start_token_id, pad_token_id=config.pad_token_id,
                            eos_token_id=config.eos_token_id, bos_token_id=config.bos_token_id)


BPE_FILES = ("bpecodes", "codes", "code", "bpe.codes", "bpe_codes", "codes.bpe")
SENTENCEPIECE_FILES = ("sentencepiece.bpe.model", "spm.model", "sentencepiece.model", "spm.en.model")


def _fairseq_tokenizer(folder: Path, options: Mapping[str, Any], dictionaries: list[dict[str, int]], bpe: str | None,
                       pre_tokenizer: str | None, fields: Mapping[str, Any], where: str) -> Any:
    """The checkpoint's text pipeline as a transformers tokenizer with fairseq's ids: Moses + fastBPE/subword-nmt
    codes → `FSMTTokenizer` (transformers' port of that pipeline); sentencepiece → `MarianTokenizer` with the two
    dictionaries as its separate vocabularies."""
    recorded_bpe, recorded_tokenizer = options.get("bpe"), options.get("tokenizer")
    for name, given, recorded in (("--bpe", bpe, recorded_bpe), ("--tokenizer", pre_tokenizer, recorded_tokenizer)):
        if given is not None and recorded is not None and given != recorded:
            raise UserInputError(f"convert: `{name}` = {given!r} is not allowed; {where} records {recorded!r}.")
    bpe = bpe or recorded_bpe
    pre_tokenizer = pre_tokenizer or recorded_tokenizer or ("none" if bpe == "sentencepiece" else None)
    if bpe is None:
        raise UserInputError(f"convert: {where} does not record its BPE (the text was segmented outside fairseq); pass "
                             "--bpe subword_nmt|fastbpe|sentencepiece and --tokenizer moses|none.")
    source_lang, target_lang = options.get("source_lang"), options.get("target_lang")
    limit = fields["max_position_embeddings"]
    if bpe in ("fastbpe", "subword_nmt"):
        if pre_tokenizer != "moses":
            raise UserInputError(f"convert: {where} uses {bpe} codes with --tokenizer {pre_tokenizer!r}; hf_deepnmt keeps "
                                 "BPE models as transformers' FSMTTokenizer, which runs Moses first (--tokenizer moses).")
        codes = _find_file(folder, options.get("bpe_codes"), BPE_FILES, "BPE codes")
        return _fsmt_tokenizer(codes, dictionaries, source_lang, target_lang, limit)
    if bpe == "sentencepiece":
        if pre_tokenizer not in (None, "none", "space"):
            raise UserInputError(f"convert: {where} runs --tokenizer {pre_tokenizer!r} before sentencepiece; hf_deepnmt "
                                 "converts sentencepiece models that read the raw text.")
        model = _find_file(folder, options.get("sentencepiece_model"), SENTENCEPIECE_FILES, "sentencepiece model")
        return _sentencepiece_tokenizer(model, dictionaries, source_lang, target_lang, limit)
    raise UserInputError(f"convert: {where} uses --bpe {bpe!r}; hf_deepnmt converts fastbpe, subword_nmt and "
                         "sentencepiece.")


def _find_file(folder: Path, recorded: str | None, names: tuple[str, ...], what: str) -> Path:
    candidates = ([folder / Path(recorded).name] if recorded else []) + [folder / name for name in names]
    for path in candidates:
        if path.is_file():
            return path
    raise UserInputError(f"convert: no {what} in {folder} (looked for {', '.join(p.name for p in candidates)}); put "
                         "the file the checkpoint was trained with beside it.")


def _fsmt_tokenizer(codes: Path, dictionaries: list[dict[str, int]], source_lang: str, target_lang: str,
                    limit: int) -> Any:
    """`FSMTTokenizer` files from fairseq's: a BPE token ending in ``@@`` continues a word (FSMT spells it without
    the marker), every other one ends a word (FSMT appends ``</w>``); the specials stay as they are; the merges are
    the codes' first two columns (a subword-nmt ``#version`` header is not a merge)."""
    def fsmt_vocabulary(dictionary: dict[str, int]) -> dict[str, int]:
        vocabulary = {}
        for token, index in dictionary.items():
            if token in FAIRSEQ_SPECIALS:
                vocabulary[token] = index
            elif token.endswith("@@"):
                vocabulary[token[:-2]] = index
            else:
                vocabulary[f"{token}</w>"] = index
        return vocabulary

    staging = Path(tempfile.mkdtemp(prefix="hf_deepnmt_fsmt_tokenizer_"))
    try:
        merges = [" ".join(line.split()[:2]) for line in codes.read_text(encoding="utf-8").splitlines()
                  if line.strip() and not line.startswith("#version")]
        (staging / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
        for name, dictionary in (("vocab-src.json", dictionaries[0]), ("vocab-tgt.json", dictionaries[1])):
            (staging / name).write_text(json.dumps(fsmt_vocabulary(dictionary), ensure_ascii=False), encoding="utf-8")
        config = {"langs": [source_lang, target_lang], "model_max_length": limit, "do_lower_case": False,
                  "tokenizer_class": "FSMTTokenizer"}
        (staging / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
        return _target_aware(staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _target_aware(folder: Path) -> Any:
    """FSMT tokenizer files as `FairseqMosesBPETokenizer` (targets in the target language and dictionary), saved
    with an ``auto_map`` entry and its code (``tokenization_fairseq.py``) so a folder loads where hf_deepnmt is not
    installed, with ``trust_remote_code=True``."""
    from .tokenization_fairseq import FairseqMosesBPETokenizer

    try:
        tokenizer = FairseqMosesBPETokenizer.from_pretrained(str(folder))
    except ImportError as error:
        raise UserInputError(f"convert: the BPE tokenizer needs {_missing_module(error)}, which the `convert` extra "
                             "installs: pip install 'hf_deepnmt[convert]'.") from error
    tokenizer.register_for_auto_class("AutoTokenizer")
    return tokenizer


def _sentencepiece_tokenizer(model: Path, dictionaries: list[dict[str, int]], source_lang: str, target_lang: str,
                             limit: int) -> Any:
    """`MarianTokenizer` over the checkpoint's sentencepiece model (both sides) with the two fairseq dictionaries as
    its separate vocabularies: the pieces sentencepiece gives, looked up in fairseq's ids (``<unk>`` for a piece a
    dictionary lacks), ``</s>`` appended — fairseq's ``SentencepieceBPE`` + ``Dictionary.encode_line``."""
    try:
        from transformers import MarianTokenizer

        staging = Path(tempfile.mkdtemp(prefix="hf_deepnmt_spm_tokenizer_"))
        try:
            for name in ("source.spm", "target.spm"):
                shutil.copyfile(model, staging / name)
            for name, dictionary in (("vocab.json", dictionaries[0]), ("target_vocab.json", dictionaries[1])):
                (staging / name).write_text(json.dumps(dictionary, ensure_ascii=False), encoding="utf-8")
            return MarianTokenizer(str(staging / "source.spm"), str(staging / "target.spm"),
                                   str(staging / "vocab.json"), target_vocab_file=str(staging / "target_vocab.json"),
                                   source_lang=source_lang, target_lang=target_lang, separate_vocabs=True,
                                   model_max_length=limit)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except ImportError as error:
        raise UserInputError(f"convert: the sentencepiece tokenizer needs {_missing_module(error)}, which the `convert` "
                             "extra installs: pip install 'hf_deepnmt[convert]'.") from error
