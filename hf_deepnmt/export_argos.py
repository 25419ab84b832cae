"""Argos Translate export: a model of the package as an ``.argosmodel`` package that ``argostranslate`` (and the
LibreTranslate servers built on it) install and translate with (``deepnmt export --format argos``;
`hf_deepnmt.export.export_model`).

An Argos package is a zip archive of one folder holding ``metadata.json`` (the language pair), ``model/`` (a
CTranslate2 model) and ``sentencepiece.model`` (the one tokenizer Argos runs on sources and, with
``decode_pieces``, on the pieces the model writes). The model part is our CTranslate2 export
(`hf_deepnmt.export_ctranslate2`), with one change: Argos passes the source pieces without ``</s>``, so the model's
``config.json`` asks CTranslate2 to append it (``add_source_eos``), which gives the source ids our tokenizer gives.

The tokenizer part is where the format is narrow. Our tokenizer (`hf_deepnmt_training.tokenizer.train_joint_bpe`)
is a `tokenizers` BPE: NFKC, words split at spaces and marked with ``▁`` (Metaspace), merges applied by rank.
SentencePiece's BPE model applies, among the adjacent pairs whose concatenation is a vocabulary piece, the one
with the highest score first; with each merged piece scored minus the rank of the merge that made it (the alphabet
below every merge) and SentencePiece's ``nfkc`` rule, it makes our merges in our order (`sentencepiece_model`) —
except that it would also join two pieces whose concatenation is a piece that our BPE forms from another pair
(``a`` + ``bc`` where ``abc`` was learnt as ``ab`` + ``c``), which our BPE never does. Measured on every sentence of
the embedded corpus (both languages, 62,010 texts) that never happens and the ids are identical; they differ in two
places, both documented in docs/fast-inference.md ("Argos Translate packages"): a text that starts with a space
(SentencePiece always adds its ``▁``, the tokenizer only when the text has none), and a run of two or more
characters outside the vocabulary (SentencePiece writes one ``<unk>`` for the run, the tokenizer one per character).
Other tokenizers (a converted OPUS-MT model's
two SentencePiece models, FSMT's Moses + BPE) are refused in one sentence: Argos has one tokenizer for both
languages.

What Argos then does is Argos's own, not ours: its sentence splitter (a MiniSBD model it downloads on first use
unless the package carries one), a beam of 4 with length penalty 0.2, ``replace_unknowns``, and a decoder that also
turns ``_`` into a space. ``sentencepiece`` (its ``sentencepiece_model_pb2``, with ``protobuf``) and ``ctranslate2``
are the `export` extra's and imported inside the functions.
"""

from __future__ import annotations

import json
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from torch import nn

from .errors import UserInputError
from .export_ctranslate2 import export_ctranslate2
from .export_formats import standard_model
from .pipeline_translation import recorded_language_pairs

__all__ = ["ARGOS_VERSION", "package_name", "sentencepiece_model", "write_argos"]

# The Argos Translate release whose package format (metadata fields, folder layout) the export writes.
ARGOS_VERSION = "1.9"
# Argos's search leaves CTranslate2's max_decoding_length at its default: the positions the decoder reaches.
ARGOS_DECODING_LENGTH = 256
# The special tokens of our tokenizers, ids 0-3 (`hf_deepnmt_training.tokenizer.SPECIAL_TOKENS`).
SPECIALS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")


def package_name(source: str, target: str) -> str:
    """The package's folder (and archive stem): Argos's ``translate-<from>_<to>``."""
    return f"translate-{source}_{target}"


def _tokenizer_refusal(what: str) -> UserInputError:
    return UserInputError(f"cannot export to argos: the model's tokenizer {what}; an Argos package carries one "
                          "SentencePiece model for both languages, which only this package's BPE tokenizer (NFKC, "
                          "Metaspace, BPE merges; `deepnmt train`'s) converts to exactly.")


def _tokenizer_json(tokenizer: Any) -> dict[str, Any]:
    """The `tokenizers` JSON of ``tokenizer``, checked to be the shape `train_joint_bpe` writes; anything else is
    refused in one sentence naming what differs."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise _tokenizer_refusal(f"is a {type(tokenizer).__name__} (no `tokenizers` BPE)")
    data = json.loads(backend.to_str())
    model = data["model"]
    if model.get("type") != "BPE":
        raise _tokenizer_refusal(f"is a {model.get('type')} model, not BPE")
    for field, wanted in (("dropout", None), ("continuing_subword_prefix", None), ("end_of_word_suffix", None),
                          ("fuse_unk", False), ("byte_fallback", False), ("unk_token", "<unk>")):
        if model.get(field, wanted) != wanted:
            raise _tokenizer_refusal(f"sets BPE {field}={model.get(field)!r} (SentencePiece has {wanted!r})")
    normalizer = data.get("normalizer") or {}
    if normalizer.get("type") != "NFKC":
        raise _tokenizer_refusal(f"normalizes with {normalizer.get('type')}, not NFKC")
    pre = data.get("pre_tokenizer") or {}
    if (pre.get("type"), pre.get("replacement"), pre.get("prepend_scheme"), pre.get("split", True)) != (
            "Metaspace", "▁", "always", True):
        raise _tokenizer_refusal(f"splits words with {pre.get('type')} {pre}, not Metaspace('▁', always)")
    vocab = model["vocab"]
    if [vocab.get(token) for token in SPECIALS] != [0, 1, 2, 3]:
        raise _tokenizer_refusal(f"does not give {', '.join(SPECIALS)} the ids 0-3")
    added = sorted(token["content"] for token in data.get("added_tokens", []) if token["content"] not in SPECIALS)
    if added:
        raise _tokenizer_refusal(f"has added tokens ({', '.join(added[:5])})")
    return data


def _nfkc_normalizer() -> Any:
    """SentencePiece's ``nfkc`` normalizer spec (its precompiled character map), taken from a throw-away model
    trained with that rule: SentencePiece's public API compiles the rule only while training."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    with tempfile.TemporaryDirectory() as scratch:
        text = Path(scratch) / "text.txt"
        text.write_text("the normalizer of this model is all that is used\n" * 20, encoding="utf-8")
        spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(Path(scratch) / "nfkc"), vocab_size=30,
                                       model_type="char", normalization_rule_name="nfkc", minloglevel=2)
        proto = model_pb2.ModelProto()
        proto.ParseFromString((Path(scratch) / "nfkc.model").read_bytes())
    return proto.normalizer_spec


def sentencepiece_model(tokenizer: Any) -> bytes:
    """A serialized SentencePiece BPE model that splits text into the pieces ``tokenizer`` (our BPE) does: the same
    vocabulary and ids, each merged piece scored −(rank of the merge that makes it), the alphabet below every merge,
    NFKC, ``▁`` prefixed and spaces kept (see the module docstring for the two places where it differs)."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    data = _tokenizer_json(tokenizer)
    vocab: dict[str, int] = data["model"]["vocab"]
    if sorted(vocab.values()) != list(range(len(vocab))):  # a SentencePiece model's ids are its pieces' positions
        raise _tokenizer_refusal("has gaps in its ids")
    merges = [tuple(merge.split(" ")) if isinstance(merge, str) else tuple(merge) for merge in data["model"]["merges"]]
    rank = {left + right: index for index, (left, right) in enumerate(merges)}
    proto = model_pb2.ModelProto()
    trainer = proto.trainer_spec
    trainer.model_type = model_pb2.TrainerSpec.BPE
    trainer.vocab_size = len(vocab)
    trainer.pad_id, trainer.bos_id, trainer.eos_id, trainer.unk_id = 0, 1, 2, 3
    trainer.pad_piece, trainer.bos_piece, trainer.eos_piece, trainer.unk_piece = SPECIALS
    proto.normalizer_spec.CopyFrom(_nfkc_normalizer())
    proto.normalizer_spec.add_dummy_prefix = True  # Metaspace's prepend_scheme="always"
    proto.normalizer_spec.remove_extra_whitespaces = False  # Metaspace keeps every space
    proto.normalizer_spec.escape_whitespaces = True  # " " → "▁"
    piece_type = model_pb2.ModelProto.SentencePiece
    lowest = -float(len(merges) + 1)  # the alphabet: never the result of a merge
    for token, index in sorted(vocab.items(), key=lambda item: item[1]):
        piece = proto.pieces.add()
        piece.piece = token
        if index < len(SPECIALS):
            piece.type = piece_type.UNKNOWN if token == "<unk>" else piece_type.CONTROL
            piece.score = 0.0
        else:
            piece.type = piece_type.NORMAL
            piece.score = -float(rank[token]) if token in rank else lowest
    return proto.SerializeToString()


def write_argos(model: nn.Module, tokenizer: Any, output_dir: Path, quantization: str | None) -> dict[str, Any]:
    """Write ``<output_dir>/translate-<from>_<to>.argosmodel`` (`package_name`) for ``model`` (its one recorded
    language pair, a standard Transformer as for CTranslate2) and return the manifest's ``argos`` section."""
    pairs = recorded_language_pairs(model.config)
    if len(pairs) != 1:
        raise UserInputError(f"cannot export to argos: an Argos package translates one language pair and the model "
                             f"records {len(pairs)} ({', '.join(f'{s}→{t}' for s, t in pairs) or 'none'}); train or "
                             "fine-tune it with --source_lang and --target_lang.")
    (source, target), = pairs
    positions = model.config.max_position_embeddings
    if positions < ARGOS_DECODING_LENGTH:  # decoding step t reads position t: 0 … 255
        raise UserInputError(f"`max_position_embeddings` = {positions} is too small for argos: Argos Translate decodes "
                             f"up to {ARGOS_DECODING_LENGTH} tokens (CTranslate2's default max_decoding_length), which "
                             f"needs at least {ARGOS_DECODING_LENGTH} positions.")
    pieces = sentencepiece_model(tokenizer)  # refused before anything is written
    name = package_name(source, target)
    with tempfile.TemporaryDirectory(dir=output_dir) as scratch:
        folder = Path(scratch) / name
        export_ctranslate2(standard_model(model), tokenizer, folder / "model", quantization, add_source_eos=True)
        (folder / "sentencepiece.model").write_bytes(pieces)
        metadata = {
            "package_version": "1.0",
            "argos_version": ARGOS_VERSION,
            "from_code": source,
            "from_name": source,  # Argos shows the name; we record codes only
            "to_code": target,
            "to_name": target,
            "type": "translate",
            "links": [],
        }
        (folder / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
        (folder / "README.md").write_text(
            f"# {source} → {target}\n\nA {model.config.model_type} model exported by hf_deepnmt "
            "(`deepnmt export --format argos`).\n", encoding="utf-8")
        archive = output_dir / f"{name}.argosmodel"
        with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
            for path in sorted(folder.rglob("*")):
                zipped.write(path, path.relative_to(Path(scratch)).as_posix())
    return {"package": archive.name, "from_code": source, "to_code": target, "argos_version": ARGOS_VERSION}
