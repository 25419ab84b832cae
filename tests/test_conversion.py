"""`hf_deepnmt.convert_checkpoint` / ``deepnmt convert``: public checkpoints — OPUS-MT / Marian in every variant, FSMT,
fairseq (post-LN with Moses + subword-nmt, pre-LN with sentencepiece, old and new checkpoint layouts) — become models
of the package that compute exactly what the source computes (docs/public-checkpoints.md).

The references are never this package's code: transformers' MarianMTModel and FSMT for their folders; for fairseq
checkpoints, transformers' independent ports of fairseq's Transformer (FSMT post-LN, M2M100 pre-LN) whose weights
the checkpoints hold (tests/public_checkpoints.py), and fairseq's text pipeline rebuilt from sacremoses, subword-nmt
and sentencepiece. Random weights (tests/public_checkpoints.py.varied_weights), float32.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from public_checkpoints import (
    MARIAN_VARIANTS,
    SAMPLE,
    SOURCE_SAMPLE,
    TARGET_SAMPLE,
    fairseq_bpe_checkpoint,
    fairseq_bpe_ids,
    fairseq_sentencepiece_checkpoint,
    fairseq_sentencepiece_ids,
    fsmt_source,
    marian_source,
    require_convert_extra,
)
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_deepnmt import DeepTransformerForConditionalGeneration
from hf_deepnmt.conversion import convert_checkpoint, convert_model
from hf_deepnmt.errors import UserInputError

require_convert_extra()

TOLERANCE = 1e-5  # teacher-forced logits, float32 (the bound)
BUDGET = 12


def teacher_forced_difference(ours, reference, batch, target_ids) -> float:
    """Max |logit difference| over every decoder position of a padded batch (``use_cache=False``: FSMT builds its
    causal mask only without a cache)."""
    start = torch.full((target_ids.size(0), 1), reference.config.decoder_start_token_id)
    decoder_input_ids = torch.cat([start, target_ids[:, :-1]], dim=1)
    with torch.no_grad():
        got = ours(**batch, decoder_input_ids=decoder_input_ids).logits
        expected = reference(**batch, decoder_input_ids=decoder_input_ids, use_cache=False).logits
    return float((got - expected).abs().max())


def assert_same_search(ours, reference, batch, **settings) -> None:
    """Greedy and beam-4 ids identical (the beam n-best lists and their scores too), with the converted model's
    generation settings given to both; the case varies (not every sentence gives the same tokens)."""
    shared = {key: getattr(ours.generation_config, key) for key in ("bad_words_ids", "forced_eos_token_id",
                                                                   "early_stopping", "length_penalty")
              if getattr(ours.generation_config, key) is not None}
    shared.update(settings)
    with torch.no_grad():
        for beams in (1, 4):
            extra = {"num_return_sequences": 4, "output_scores": True, "return_dict_in_generate": True} if beams > 1 \
                else {}
            got = ours.generate(**batch, num_beams=beams, max_new_tokens=BUDGET, **shared, **extra)
            expected = reference.generate(**batch, num_beams=beams, max_new_tokens=BUDGET, **shared, **extra)
            if beams > 1:
                assert torch.equal(got.sequences, expected.sequences)
                torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, rtol=1e-5, atol=1e-5)
                got = got.sequences
            else:
                assert torch.equal(got, expected)
            assert len({tuple(row) for row in got.tolist()}) > 1, "the case must translate sources differently"


def target_ids(tokenizer, lines, pad):
    """Padded target ids of ``lines`` (the tokenizer's target side), pads replaced by an ordinary token."""
    ids = tokenizer(text_target=lines, padding=True, return_tensors="pt").input_ids
    return ids.masked_fill(ids == pad, 5)


# ------------------------------------------------------------------------------------------------ Marian / OPUS-MT
@pytest.mark.parametrize("variant", MARIAN_VARIANTS)
def test_an_opus_mt_marian_folder_converts_exactly(variant, tmp_path):
    source = marian_source(tmp_path / "source", variant)
    folder = convert_checkpoint(source, tmp_path / "converted")
    reference = AutoModelForSeq2SeqLM.from_pretrained(source).eval()
    ours = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    assert isinstance(ours, DeepTransformerForConditionalGeneration)
    config = ours.config
    assert (config.activation_function, config.output_bias, config.position_encoding) == (
        "relu" if variant == "relu" else "swish", True, "sinusoidal")
    assert config.decoder_start_token_id == config.pad_token_id == reference.config.pad_token_id
    assert config.share_encoder_decoder_embeddings == (variant not in ("separate_vocabularies", "untied"))
    assert ours.generation_config.bad_words_ids == [[config.pad_token_id]]
    # Marian's length limit said as new tokens: the same limit, and no "both are set" warning per batch
    limit = reference.generation_config.max_length
    assert (ours.generation_config.max_new_tokens, ours.generation_config.max_length) == (limit - 1, None)
    saved = json.loads((folder / "config.json").read_text())["converted_from"]
    assert saved["format"] == "marian" and saved["max_abs_logit_difference"] <= TOLERANCE
    # tying survives save and load (transformers #26216): tied stays one tensor, untied two
    tied = ours.lm_head.weight.data_ptr() == ours.get_decoder().embed_tokens.weight.data_ptr()
    assert tied == (variant != "untied")

    tokenizer, converted_tokenizer = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(folder)
    prefix = ">>es<< " if variant == "multi_target" else ""
    lines = [prefix + line for line in SOURCE_SAMPLE]
    for side in ({"text": SAMPLE}, {"text_target": SAMPLE}, {"text": lines}):
        assert converted_tokenizer(**side).input_ids == tokenizer(**side).input_ids
    batch = tokenizer(lines, padding=True, return_tensors="pt")
    targets = target_ids(tokenizer, TARGET_SAMPLE, config.pad_token_id)
    assert teacher_forced_difference(ours, reference, batch, targets) <= TOLERANCE
    assert_same_search(ours, reference, batch)
    with torch.no_grad():  # each model's own search settings and length limit, nothing given
        assert torch.equal(ours.generate(**batch), reference.generate(**batch))
    if variant == "multi_target":
        assert config.target_language_codes == [">>de<<", ">>es<<", ">>fr<<"]


def test_a_converted_opus_mt_model_exports_back_to_the_same_marian(tmp_path):
    """Output bias, SiLU and separate vocabularies survive `export_marian`: the stock MarianMTModel it writes equals
    the source."""
    from hf_deepnmt import export_marian

    for variant in ("opus_mt", "separate_vocabularies"):
        source = marian_source(tmp_path / variant, variant)
        ours = convert_model(str(source)).model
        reference = AutoModelForSeq2SeqLM.from_pretrained(source).eval()
        marian = export_marian(ours).eval()
        tokenizer = AutoTokenizer.from_pretrained(source)
        batch = tokenizer(SOURCE_SAMPLE, padding=True, return_tensors="pt")
        targets = target_ids(tokenizer, TARGET_SAMPLE, ours.config.pad_token_id)
        assert teacher_forced_difference(marian, reference, batch, targets) == 0.0


def test_fairseq_positions_are_not_marian_s_so_that_export_is_refused(tmp_path):
    from hf_deepnmt import export_marian

    directory, _ = fairseq_sentencepiece_checkpoint(tmp_path / "fairseq")
    with pytest.raises(UserInputError, match="position_encoding='sinusoidal_fairseq' \\(position_offset=2\\)"):
        export_marian(convert_model(directory).model)


# ------------------------------------------------------------------------------------------------ FSMT and fairseq
def test_an_fsmt_folder_converts_exactly(tmp_path):
    source = fsmt_source(tmp_path)
    folder = convert_checkpoint(source, tmp_path / "converted")
    reference = AutoModelForSeq2SeqLM.from_pretrained(source).eval()
    ours = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    config = ours.config
    assert (config.position_encoding, config.position_offset, config.decoder_start_token_id) == (
        "sinusoidal_fairseq", 2, 2)
    assert not config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    tokenizer, converted_tokenizer = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(folder)
    assert converted_tokenizer(SAMPLE).input_ids == tokenizer(SAMPLE).input_ids
    # transformers' FSMTTokenizer encodes targets with the source dictionary; the converted one with the target's
    assert converted_tokenizer(text_target=TARGET_SAMPLE).input_ids != tokenizer(text_target=TARGET_SAMPLE).input_ids
    batch = tokenizer(SOURCE_SAMPLE, padding=True, return_tensors="pt")
    targets = target_ids(converted_tokenizer, TARGET_SAMPLE, config.pad_token_id)
    assert teacher_forced_difference(ours, reference, batch, targets) <= TOLERANCE
    assert_same_search(ours, reference, batch)


@pytest.mark.parametrize("style", ["args", "cfg", "old_names"])
def test_a_fairseq_checkpoint_converts_exactly(style, tmp_path):
    """A post-LN fairseq checkpoint with separate dictionaries, Moses + subword-nmt: its FSMT twin's logits and
    searches; ``args`` (fairseq < 0.10), ``cfg`` (≥ 0.10) and pre-0.7 names (``layer_norms.N``, ``in_proj_weight``)."""
    directory, reference = fairseq_bpe_checkpoint(tmp_path / "fairseq", style=style)
    folder = convert_checkpoint(directory, tmp_path / "converted")
    ours = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(tokenizer).__name__ == "FairseqMosesBPETokenizer"  # FSMTTokenizer, targets in the target dictionary
    assert ours.config.task_specific_params == {"translation_en_to_de": {}}  # the pair fairseq recorded
    generation = ours.generation_config
    assert (generation.num_beams, generation.early_stopping, generation.bad_words_ids,
            generation.forced_eos_token_id) == (5, True, [[1]], 2)  # fairseq-generate's search
    batch = tokenizer(SOURCE_SAMPLE, padding=True, return_tensors="pt")
    targets = target_ids(tokenizer, TARGET_SAMPLE, 1)
    assert teacher_forced_difference(ours, reference, batch, targets) <= TOLERANCE
    assert_same_search(ours, reference, batch)


def test_a_pre_ln_fairseq_checkpoint_with_sentencepiece_converts_exactly(tmp_path):
    """A pre-LN checkpoint (``--encoder/decoder-normalize-before``, a final LayerNorm per stack) with one joined
    dictionary (``--share-all-embeddings``) and sentencepiece: its M2M100 twin's logits and searches."""
    directory, reference = fairseq_sentencepiece_checkpoint(tmp_path / "fairseq")
    folder = convert_checkpoint(directory, tmp_path / "converted")
    ours = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    assert ours.config.layer_norm_position == "pre" and ours.config.share_encoder_decoder_embeddings
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(SOURCE_SAMPLE, padding=True, return_tensors="pt")
    targets = target_ids(tokenizer, TARGET_SAMPLE, 1)
    assert teacher_forced_difference(ours, reference, batch, targets) <= TOLERANCE
    assert_same_search(ours, reference, batch, decoder_start_token_id=2)


def test_fairseq_tokenizers_give_fairseq_s_ids(tmp_path):
    """The converted tokenizers' ids are fairseq's: Moses + subword-nmt + the dictionaries (FSMTTokenizer; on text
    that Moses' punctuation normalisation, which FSMTTokenizer adds as WMT19 did, leaves as it is), and
    sentencepiece + the dictionary (MarianTokenizer over fairseq's ids), on a multilingual sample."""
    from sacremoses import MosesPunctNormalizer

    bpe_directory, _ = fairseq_bpe_checkpoint(tmp_path / "bpe")
    bpe = AutoTokenizer.from_pretrained(convert_checkpoint(bpe_directory, tmp_path / "bpe-converted"))
    for line in SAMPLE:
        assert MosesPunctNormalizer("en").normalize(line) == line  # the sample's precondition
        assert bpe(line).input_ids == fairseq_bpe_ids(bpe_directory, line), line
        assert bpe(text_target=line).input_ids == fairseq_bpe_ids(bpe_directory, line, "de"), line
    spm_directory, _ = fairseq_sentencepiece_checkpoint(tmp_path / "spm")
    pieces = AutoTokenizer.from_pretrained(convert_checkpoint(spm_directory, tmp_path / "spm-converted"))
    for line in SAMPLE + ["Ünïcödé «quotes» — and unknown 字"]:
        assert pieces(line).input_ids == fairseq_sentencepiece_ids(spm_directory, line), line
        assert pieces(text_target=line).input_ids == fairseq_sentencepiece_ids(spm_directory, line, "de"), line


def test_learned_positions_are_fairseq_s(tmp_path):
    """``position_encoding="learned"`` reads row ``position_offset + t`` for token t, as fairseq's
    LearnedPositionalEmbedding (and BART's port of it, offset 2) do, and a fairseq checkpoint trained with
    ``--encoder/decoder-learned-pos`` lands its tables there."""
    from transformers.models.bart.modeling_bart import BartLearnedPositionalEmbedding

    from hf_deepnmt.modeling_common import PositionEncoding

    ours = PositionEncoding("learned", 2, 30, 8)
    bart = BartLearnedPositionalEmbedding(30, 8)
    with torch.no_grad():
        ours.weight.normal_()
        bart.weight.copy_(ours.weight)
    for past in (0, 3):
        expected = bart(torch.zeros(1, 5, dtype=torch.long), past)
        assert torch.equal(ours(past, 5, torch.device("cpu"), torch.float32)[0], expected.reshape(5, 8))

    directory, _ = fairseq_bpe_checkpoint(tmp_path / "fairseq")
    checkpoint = torch.load(directory / "checkpoint_best.pt", weights_only=False)
    checkpoint["args"].encoder_learned_pos = checkpoint["args"].decoder_learned_pos = True
    tables = {}
    for stack in ("encoder", "decoder"):
        del checkpoint["model"][f"{stack}.embed_positions._float_tensor"]
        tables[stack] = checkpoint["model"][f"{stack}.embed_positions.weight"] = torch.randn(64 + 2, 16)
    torch.save(checkpoint, directory / "checkpoint_best.pt")
    converted = convert_model(directory).model
    assert converted.config.position_encoding == "learned"
    for stack, table in tables.items():
        assert torch.equal(getattr(converted.model, stack).embed_positions.weight, table)


# ------------------------------------------------------------------------------------------------ refusals
def _rewrite(directory: Path, change) -> None:
    checkpoint = torch.load(directory / "checkpoint_best.pt", weights_only=False)
    change(checkpoint)
    torch.save(checkpoint, directory / "checkpoint_best.pt")


class NotATensor:
    """An object a checkpoint may pickle (fairseq's extra state) that torch's safe loader does not know."""


REFUSALS = {
    "layernorm_embedding": (lambda c: setattr(c["args"], "layernorm_embedding", True), "a LayerNorm on the embeddings"),
    "mixed_layer_norm": (lambda c: setattr(c["args"], "encoder_normalize_before", True), "sets both stacks alike"),
    "widths": (lambda c: setattr(c["args"], "decoder_output_dim", 32), "one width"),
    "extra_weight": (lambda c: c["model"].__setitem__("encoder.layers.0.self_attn.bias_k", torch.zeros(1, 1, 16)),
                     "`model.encoder.layers.0.self_attn.bias_k`"),
    "no_bpe": (lambda c: (setattr(c["args"], "bpe", None), setattr(c["args"], "tokenizer", None)), "--bpe"),
    "gpt2_bpe": (lambda c: setattr(c["args"], "bpe", "gpt2"), "converts fastbpe, subword_nmt and sentencepiece"),
    "task": (lambda c: setattr(c["args"], "task", "translation_multi_simple_epoch"), "'translation' models"),
    "pickled_object": (lambda c: c.__setitem__("extra_state", NotATensor()), "--trust_checkpoint"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_cannot_be_converted_exactly_is_refused_in_one_sentence(case, tmp_path):
    directory, _ = fairseq_bpe_checkpoint(tmp_path / "fairseq")
    change, named = REFUSALS[case]
    _rewrite(directory, change)
    with pytest.raises(UserInputError) as error:
        convert_checkpoint(directory, tmp_path / "out")
    assert named in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "out").exists()
    if case == "pickled_object":  # a trusted checkpoint converts
        assert convert_checkpoint(directory, tmp_path / "out", trust_checkpoint=True).is_dir()


def test_other_sources_and_folders_are_refused_in_one_sentence(tmp_path, tiny_tokenizer):
    from transformers import BartConfig, BartForConditionalGeneration

    from conftest import tiny_model

    bart = tmp_path / "bart"
    BartForConditionalGeneration(BartConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
                                            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=8,
                                            decoder_ffn_dim=8)).save_pretrained(bart)
    ours = tmp_path / "ours"
    tiny_model().save_pretrained(ours)
    marian = marian_source(tmp_path / "marian")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    for source, output, named in ((bart, tmp_path / "o1", "is a 'bart' model"),
                                  (ours, tmp_path / "o2", "already a model of hf_deepnmt"),
                                  (tmp_path / "empty_dir", tmp_path / "o3", "neither a config.json"),
                                  (marian, tmp_path / "full", "exists and is not an empty folder")):
        source.mkdir(exist_ok=True)
        with pytest.raises(UserInputError, match=named):
            convert_checkpoint(source, output)
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"


def test_a_source_whose_network_differs_from_what_its_config_says_is_refused(tmp_path):
    """The conversion checks the source's own position table and its logits before anything is written."""
    source = marian_source(tmp_path / "marian")
    reference = AutoModelForSeq2SeqLM.from_pretrained(source).eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    with torch.no_grad():
        reference.model.encoder.embed_positions.weight.mul_(1.5)
    with pytest.raises(UserInputError, match="position table"):
        convert_model(reference, tokenizer_object=tokenizer)


def test_a_language_pair_given_must_agree_with_the_recorded_one(tmp_path):
    directory, _ = fairseq_bpe_checkpoint(tmp_path / "fairseq")
    with pytest.raises(UserInputError, match="`--target_lang` = 'fr' is not allowed; the source records 'de'"):
        convert_checkpoint(directory, tmp_path / "out", target_lang="fr")
    marian = convert_model(str(marian_source(tmp_path / "marian")), source_lang="en", target_lang="es").model
    assert marian.config.task_specific_params == {"translation_en_to_es": {}}


def test_a_fairseq_directory_with_several_checkpoints_asks_for_one(tmp_path):
    directory, _ = fairseq_bpe_checkpoint(tmp_path / "fairseq")
    (directory / "checkpoint_best.pt").rename(directory / "checkpoint3.pt")
    (directory / "checkpoint4.pt").write_bytes((directory / "checkpoint3.pt").read_bytes())
    with pytest.raises(UserInputError, match="choose one with --checkpoint"):
        convert_model(directory)
    assert convert_model(directory, checkpoint="checkpoint4.pt").source_format == "fairseq"
    namespace = argparse.Namespace  # the options object a fairseq checkpoint holds, loaded without trust
    assert isinstance(torch.load(directory / "checkpoint4.pt", weights_only=False)["args"], namespace)
