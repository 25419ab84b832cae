"""Stand-ins for public checkpoints, built offline with random weights (tests/test_conversion.py).

* OPUS-MT / Marian: a `transformers.MarianMTModel` folder with a `MarianTokenizer` (sentencepiece models trained here
  on a small multilingual sample, ``vocab.json`` with ``<pad>`` last), in every variant `deepnmt convert` takes:
  shared vocabulary with a nonzero output bias (OPUS-MT), separate vocabularies, a multi-target model (``>>xx<<``),
  an untied output projection, ReLU.
* FSMT: a `transformers.FSMTForConditionalGeneration` folder with an `FSMTTokenizer`.
* fairseq: a checkpoint directory as fairseq writes it — ``checkpoint_best.pt`` (``{"args": Namespace, "model": ...}``
  or ``{"cfg": {...}, "model": ...}``), ``dict.<lang>.txt`` and the BPE files (subword-nmt codes learned here with the
  `subword_nmt` package, or a sentencepiece model) — whose weights are those of a transformers port of fairseq's
  Transformer: FSMT (post-LN) or M2M100 (pre-LN), the references the converted model is compared with.

The fairseq files are written in fairseq's own formats (its state-dict names are FSMT's without the ``model.``
prefix, and M2M100's); the references' computations are transformers' code, never this package's.
"""

from __future__ import annotations

import argparse
import io
import json
import os
from collections import Counter
from pathlib import Path

import pytest
import torch


def require_convert_extra() -> None:
    """sentencepiece and sacremoses are the `convert` extra (subword-nmt the dev extra's reference of fairseq's BPE):
    without them a test module using these fixtures skips, unless DEEPNMT_REQUIRE_CONVERT=1 (set by `bash run.sh
    test`, which installs them) makes that a failure."""
    for module in ("sentencepiece", "sacremoses", "subword_nmt"):
        if os.environ.get("DEEPNMT_REQUIRE_CONVERT") == "1":
            __import__(module)
        else:
            pytest.importorskip(module)

# A multilingual sample: the tokenizers are trained on it and the id comparisons read it.
SAMPLE = [
    "Hello world, this is a small test of the translation system.",
    "The quick brown fox jumps over the lazy dog.",
    "Das ist ein kleiner Test, und er ist schön.",
    "Ich möchte drei Äpfel und zwei Birnen kaufen.",
    "¿Dónde está la biblioteca? Está cerca de la estación.",
    "El niño comió una manzana en el jardín.",
    "Ceci est une phrase française avec des accents: été, garçon.",
    "Nous avons 12 chats et 3 chiens à la maison.",
    "Numbers like 3.14 and 2026 should survive tokenization.",
    "In the beginning God created the heavens and the earth.",
]
SOURCE_SAMPLE, TARGET_SAMPLE = SAMPLE[0::2], SAMPLE[1::2]
TINY = dict(d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=32, decoder_ffn_dim=32)


# ------------------------------------------------------------------------------------------------ sentencepiece
def train_sentencepiece(folder: Path, name: str, lines: list[str], size: int, **options) -> Path:
    """A sentencepiece unigram model trained on ``lines`` (repeated, so the trainer has enough sentences)."""
    import sentencepiece as spm

    corpus = folder / f"{name}.txt"
    corpus.write_text("\n".join(lines * 20) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / name), vocab_size=size,
                                   model_type="unigram", hard_vocab_limit=False, minloglevel=2, **options)
    return folder / f"{name}.model"


def marian_vocabulary(model: Path, extra: tuple[str, ...] = ()) -> dict[str, int]:
    """Marian's vocab.json: the sentencepiece pieces by id (``</s>``=0, ``<unk>``=1), ``extra`` tokens, ``<pad>`` last."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    vocabulary = {processor.id_to_piece(index): index for index in range(processor.get_piece_size())}
    for token in (*extra, "<pad>"):
        vocabulary[token] = len(vocabulary)
    return vocabulary


MARIAN_VARIANTS = ("opus_mt", "separate_vocabularies", "multi_target", "untied", "relu")


def marian_source(folder: Path, variant: str = "opus_mt", seed: int = 0) -> Path:
    """A MarianMTModel + MarianTokenizer folder of ``variant`` (`MARIAN_VARIANTS`), random weights and a random
    nonzero ``final_logits_bias``; OPUS-MT's generation settings (``<pad>`` banned and decoding from it, ``</s>``
    forced at the limit)."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    spm_options = dict(eos_id=0, unk_id=1, bos_id=-1, pad_id=-1)
    separate = variant == "separate_vocabularies"
    if separate:
        source_spm = train_sentencepiece(folder, "src", SOURCE_SAMPLE, 70, **spm_options)
        target_spm = train_sentencepiece(folder, "tgt", TARGET_SAMPLE, 60, **spm_options)
    else:
        source_spm = target_spm = train_sentencepiece(folder, "joint", SAMPLE, 80, **spm_options)
    codes = (">>de<<", ">>es<<", ">>fr<<") if variant == "multi_target" else ()
    out = folder / "model"
    out.mkdir()
    (out / "source.spm").write_bytes(source_spm.read_bytes())
    (out / "target.spm").write_bytes(target_spm.read_bytes())
    vocabulary = marian_vocabulary(source_spm, codes)
    (out / "vocab.json").write_text(json.dumps(vocabulary), encoding="utf-8")
    options = {}
    target_size = len(vocabulary)
    if separate:
        target_vocabulary = marian_vocabulary(target_spm)
        # one <pad> id serves both embeddings (transformers' Marian): the target vocabulary is padded up to it
        while len(target_vocabulary) < len(vocabulary) - 1:
            target_vocabulary[f"<unused{len(target_vocabulary)}>"] = len(target_vocabulary)
        target_vocabulary.pop("<pad>")
        target_vocabulary["<pad>"] = vocabulary["<pad>"]
        for number in range(5):  # a larger target vocabulary than the source's (decoder_vocab_size differs)
            target_vocabulary[f"<target{number}>"] = len(target_vocabulary)
        (out / "target_vocab.json").write_text(json.dumps(target_vocabulary), encoding="utf-8")
        options = dict(target_vocab_file=str(out / "target_vocab.json"), separate_vocabs=True)
        target_size = len(target_vocabulary)
    tokenizer = MarianTokenizer(str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"),
                                source_lang="en", target_lang="es", model_max_length=60, **options)
    tokenizer.save_pretrained(out)
    pad = vocabulary["<pad>"]
    config = MarianConfig(vocab_size=len(vocabulary), decoder_vocab_size=target_size,
                          share_encoder_decoder_embeddings=not separate, **TINY, max_position_embeddings=64,
                          activation_function="relu" if variant == "relu" else "swish", scale_embedding=True,
                          pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, bos_token_id=None,
                          forced_eos_token_id=0, tie_word_embeddings=variant != "untied")
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    # an OPUS-MT generation_config.json
    model.generation_config = GenerationConfig(bad_words_ids=[[pad]], decoder_start_token_id=pad, eos_token_id=0,
                                               forced_eos_token_id=0, max_length=60, num_beams=4, pad_token_id=pad)
    with torch.no_grad():
        varied_weights(model)
        model.final_logits_bias.normal_(0.0, 1.0)
    model.save_pretrained(out)
    return out


def varied_weights(model: torch.nn.Module, embedding_std: float = 1.0, matrix_std: float = 0.5) -> None:
    """Random weights whose translations depend on the input (transformers' small init makes every source give
    the same tokens): embeddings N(0, embedding_std²) with zero padding rows, matrices N(0, matrix_std²). (Chosen per
    reference so that the sources translate differently and float32 rounding stays well inside the 1e-5 bound.)"""
    for name, parameter in model.named_parameters():
        if parameter.dim() == 2 and "embed_positions" not in name:
            parameter.normal_(0.0, embedding_std if ("embed" in name or "shared" in name) else matrix_std)
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding) and module.padding_idx is not None and module.weight.requires_grad:
            module.weight[module.padding_idx].zero_()


# ------------------------------------------------------------------------------------------------ fairseq files
def fairseq_dictionary(tokens: Counter) -> str:
    """A fairseq ``dict.<lang>.txt``: one ``token count`` line per token, most frequent first (fairseq-preprocess)."""
    return "".join(f"{token} {count}\n" for token, count in sorted(tokens.items(), key=lambda item: (-item[1], item[0])))


def moses_bpe_files(folder: Path, merges: int = 60) -> tuple[Path, dict[str, Counter]]:
    """subword-nmt codes learned on the Moses-tokenised sample (both languages jointly) and each side's BPE token
    counts: fairseq's ``--tokenizer moses --bpe subword_nmt`` preprocessing, with the `sacremoses` and `subword_nmt`
    packages."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE
    from subword_nmt.learn_bpe import learn_bpe

    tokenized = {lang: [MosesTokenizer(lang).tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
                        for line in lines] for lang, lines in (("en", SOURCE_SAMPLE), ("de", TARGET_SAMPLE))}
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(tokenized["en"] + tokenized["de"]) + "\n"), codes, merges, min_frequency=1)
    path = folder / "bpecodes"
    path.write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()))
    counts = {lang: Counter(token for line in lines for token in bpe.process_line(line).split())
              for lang, lines in tokenized.items()}
    return path, counts


def fsmt_reference(dictionaries: dict[str, int], layer_norm: str = "post", seed: int = 0):
    """The reference model: FSMT (post-LN) for the sizes of two dictionaries."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    config = FSMTConfig(langs=["en", "de"], src_vocab_size=dictionaries["en"], tgt_vocab_size=dictionaries["de"],
                        **TINY, max_position_embeddings=64, scale_embedding=True, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = FSMTForConditionalGeneration(config).eval()
    with torch.no_grad():
        varied_weights(model, embedding_std=0.5, matrix_std=0.3)
        for stack in (model.model.encoder, model.model.decoder):
            stack.embed_tokens.weight[1].zero_()  # fairseq's padding_idx
        model.model.decoder.output_projection.weight.copy_(model.model.decoder.embed_tokens.weight)
    return model


def m2m100_reference(vocab_size: int, seed: int = 0):
    """The pre-LN reference: M2M100 (fairseq's Transformer with ``--encoder/decoder-normalize-before``)."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    config = M2M100Config(vocab_size=vocab_size, **TINY, max_position_embeddings=64, scale_embedding=True,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                          activation_function="relu", dropout=0.1)
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config).eval()
    with torch.no_grad():
        varied_weights(model, matrix_std=0.3)
        model.model.shared.weight[1].zero_()
    return model


def fairseq_args(**overrides) -> argparse.Namespace:
    """The options fairseq-train saves for ``--arch transformer`` at the tiny sizes."""
    options = dict(arch="transformer", task="translation", source_lang="en", target_lang="de",
                   encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_layers=2, encoder_attention_heads=4,
                   decoder_embed_dim=16, decoder_ffn_embed_dim=32, decoder_layers=2, decoder_attention_heads=4,
                   decoder_output_dim=16, decoder_input_dim=16, encoder_normalize_before=False,
                   decoder_normalize_before=False, encoder_learned_pos=False, decoder_learned_pos=False,
                   activation_fn="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                   share_decoder_input_output_embed=True, share_all_embeddings=False, no_scale_embedding=False,
                   layernorm_embedding=False, max_source_positions=64, max_target_positions=64,
                   bpe="subword_nmt", tokenizer="moses", bpe_codes="/data/wmt/bpecodes", moses_source_lang="en",
                   moses_target_lang="de")
    options.update(overrides)
    return argparse.Namespace(**options)


def fairseq_state_from_fsmt(model) -> dict[str, torch.Tensor]:
    """FSMT's weights under fairseq's names (FSMT's without ``model.``; the sinusoidal tables are fairseq's
    ``_float_tensor`` placeholders)."""
    state = {name.removeprefix("model."): tensor.clone() for name, tensor in model.state_dict().items()
             if "embed_positions" not in name}
    state["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    state["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    state["encoder.version"] = state["decoder.version"] = torch.tensor([3.0])
    return state


def fairseq_state_from_m2m100(model) -> dict[str, torch.Tensor]:
    """M2M100's weights under fairseq's names (one embedding for both stacks: ``--share-all-embeddings``)."""
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            state["decoder.output_projection.weight"] = tensor.clone()
        elif name == "model.shared.weight":
            continue
        elif "embed_positions" not in name:
            state[name.removeprefix("model.")] = tensor.clone()
    state["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    state["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    return state


def fairseq_bpe_checkpoint(folder: Path, seed: int = 0, style: str = "args") -> tuple[Path, object]:
    """A fairseq checkpoint directory (post-LN, separate dictionaries, Moses + subword-nmt) and its FSMT reference.
    ``style``: ``"args"`` (fairseq < 0.10: an ``argparse.Namespace``), ``"cfg"`` (fairseq ≥ 0.10: ``cfg`` dicts),
    ``"old_names"`` (``layer_norms.N`` and one ``in_proj_weight`` per attention, fairseq before 0.7)."""
    folder.mkdir(parents=True, exist_ok=True)
    codes, counts = moses_bpe_files(folder)
    for lang, tokens in counts.items():
        (folder / f"dict.{lang}.txt").write_text(fairseq_dictionary(tokens), encoding="utf-8")
    sizes = {lang: 4 + len(tokens) for lang, tokens in counts.items()}
    sizes = {lang: size + (-size) % 8 for lang, size in sizes.items()}  # fairseq pads dictionaries to 8
    reference = fsmt_reference(sizes, seed=seed)
    state = fairseq_state_from_fsmt(reference)
    if style == "old_names":
        state = _old_fairseq_names(state)
    args = fairseq_args()
    checkpoint = ({"args": args, "model": state} if style != "cfg" else
                  {"args": None, "model": state,
                   "cfg": {"model": {key: value for key, value in vars(args).items()
                                     if key not in ("task", "source_lang", "target_lang", "bpe", "tokenizer")},
                           "task": {"_name": "translation", "source_lang": "en", "target_lang": "de"},
                           "bpe": {"_name": "subword_nmt", "bpe_codes": "/data/bpecodes"},
                           "tokenizer": {"_name": "moses", "source_lang": "en", "target_lang": "de"}}})
    torch.save(checkpoint, folder / "checkpoint_best.pt")
    return folder, reference


def _old_fairseq_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fairseq < 0.7 names: ``layer_norms.0/1(/2)`` and each attention's q, k, v as one ``in_proj_weight``."""
    old = {}
    renames = {"encoder": {"self_attn_layer_norm": "layer_norms.0", "final_layer_norm": "layer_norms.1"},
               "decoder": {"self_attn_layer_norm": "layer_norms.0", "encoder_attn_layer_norm": "layer_norms.1",
                           "final_layer_norm": "layer_norms.2"}}
    for name, tensor in state.items():
        stack = name.split(".")[0]
        for new, previous in renames.get(stack, {}).items():
            name = name.replace(f".{new}.", f".{previous}.")
        old[name] = tensor
    merged = {}
    for name in list(old):
        if ".q_proj." in name:
            prefix, kind = name.split(".q_proj.")
            merged[f"{prefix}.in_proj_{kind}"] = torch.cat([old.pop(f"{prefix}.{p}_proj.{kind}")
                                                            for p in ("q", "k", "v")])
    old.update(merged)
    return old


def fairseq_sentencepiece_checkpoint(folder: Path, seed: int = 0) -> tuple[Path, object]:
    """A pre-LN fairseq checkpoint directory with a joined dictionary (``--share-all-embeddings``) and a
    sentencepiece model, and its M2M100 reference."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    model_file = train_sentencepiece(folder, "sentencepiece.bpe", SAMPLE, 90)
    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    counts = Counter(piece for line in SAMPLE for piece in processor.encode(line, out_type=str))
    text = fairseq_dictionary(counts)
    for lang in ("en", "de"):
        (folder / f"dict.{lang}.txt").write_text(text, encoding="utf-8")
    size = 4 + len(counts)
    reference = m2m100_reference(size + (-size) % 8, seed=seed)
    args = fairseq_args(encoder_normalize_before=True, decoder_normalize_before=True, share_all_embeddings=True,
                        bpe="sentencepiece", tokenizer=None, sentencepiece_model="/data/spm/sentencepiece.bpe.model",
                        dropout=0.1)
    torch.save({"args": args, "model": fairseq_state_from_m2m100(reference)}, folder / "checkpoint_best.pt")
    return folder, reference


def fsmt_source(folder: Path, seed: int = 0) -> Path:
    """An FSMT folder (model + FSMTTokenizer) whose tokenizer files are fairseq's BPE files as transformers' FSMT
    converter writes them."""
    from transformers import FSMTTokenizer

    work = folder / "fairseq"
    _, reference = fairseq_bpe_checkpoint(work, seed=seed)
    out = folder / "fsmt"
    out.mkdir(parents=True)
    for lang, name in (("en", "vocab-src.json"), ("de", "vocab-tgt.json")):
        vocabulary = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        for line in (work / f"dict.{lang}.txt").read_text(encoding="utf-8").splitlines():
            token = line.rsplit(" ", 1)[0]
            vocabulary[token[:-2] if token.endswith("@@") else f"{token}</w>"] = len(vocabulary)
        (out / name).write_text(json.dumps(vocabulary, ensure_ascii=False), encoding="utf-8")
    merges = [" ".join(line.split()[:2]) for line in (work / "bpecodes").read_text(encoding="utf-8").splitlines()
              if line and not line.startswith("#")]
    (out / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({"langs": ["en", "de"], "model_max_length": 60,
                                                           "do_lower_case": False}), encoding="utf-8")
    FSMTTokenizer.from_pretrained(str(out)).save_pretrained(out)
    reference.save_pretrained(out)
    return out


def plain_fairseq_dictionary(path: Path) -> dict[str, int]:
    """fairseq's ids of a dictionary these fixtures wrote (no overwrite flags): the four specials, then the lines."""
    tokens = ["<s>", "<pad>", "</s>", "<unk>"] + [line.rsplit(" ", 1)[0] for line in
                                                   path.read_text(encoding="utf-8").splitlines() if line]
    return {token: index for index, token in enumerate(tokens)}


def fairseq_bpe_ids(folder: Path, line: str, lang: str = "en") -> list[int]:
    """fairseq's ids of ``line``, computed as fairseq's hub interface does with ``--tokenizer moses --bpe
    subword_nmt``: Moses tokenisation (sacremoses), subword-nmt's BPE, the dictionary, ``</s>``."""
    from sacremoses import MosesTokenizer
    from subword_nmt.apply_bpe import BPE

    dictionary = plain_fairseq_dictionary(folder / f"dict.{lang}.txt")
    tokenized = MosesTokenizer(lang).tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True)
    with open(folder / "bpecodes", encoding="utf-8") as codes:
        pieces = BPE(codes).process_line(tokenized).split()
    return [dictionary.get(piece, 3) for piece in pieces] + [2]


def fairseq_sentencepiece_ids(folder: Path, line: str, lang: str = "en") -> list[int]:
    """fairseq's ids of ``line`` with ``--bpe sentencepiece``: the pieces, the dictionary, ``</s>``."""
    import sentencepiece as spm

    dictionary = plain_fairseq_dictionary(folder / f"dict.{lang}.txt")
    processor = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.bpe.model"))
    return [dictionary.get(piece, 3) for piece in processor.encode(line, out_type=str)] + [2]
