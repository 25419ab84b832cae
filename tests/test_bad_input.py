"""Bad input gets one clear sentence naming the argument and its value (docs/training.md, "Bad input")."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from hf_deepnmt.errors import UserInputError
from hf_deepnmt import DeepDecoderTransformerConfig, DeepTransformerConfig, DTMTConfig, DTMTForConditionalGeneration

IDS = torch.tensor([[5, 6, 2], [7, 2, 0]])
MASK = (IDS != 0).long()
LABELS = torch.tensor([[8, 2], [9, 2]])


def family_model(family: str) -> torch.nn.Module:
    """A tiny model of each family (vocabulary 99, like `tiny_model`)."""
    if family == "dtmt":
        torch.manual_seed(0)
        return DTMTForConditionalGeneration(DTMTConfig(vocab_size=99, d_model=16, attention_heads=2,
                                                       transition_depth=1, max_position_embeddings=64)).eval()
    return tiny_model()


@pytest.mark.parametrize("arguments, words", [
    (dict(input_ids=torch.tensor([[5, -1, 2]]), labels=LABELS[:1]), "`input_ids` holds the id -1"),
    (dict(input_ids=torch.tensor([[5, 99, 2]]), labels=LABELS[:1]), "`input_ids` holds the id 99"),
    (dict(input_ids=IDS.float(), labels=LABELS), "`input_ids` has dtype torch.float32"),
    (dict(input_ids=IDS[0], labels=LABELS), "`input_ids` has shape (3,); it must be 2-D"),
    (dict(input_ids=IDS[None], labels=LABELS), "`input_ids` has shape (1, 2, 3); it must be 2-D"),
    (dict(input_ids=IDS, attention_mask=MASK[:, :2], labels=LABELS), "`attention_mask` has shape (2, 2) but `input_ids` has shape (2, 3)"),
    (dict(input_ids=IDS[:0], labels=LABELS[:0]), "has shape (0, 2): an empty batch"),
    (dict(input_ids=IDS[:, :0], labels=LABELS), "`input_ids` has shape (2, 0)"),
    (dict(input_ids=IDS, labels=torch.tensor([[8, -5], [9, 2]])), "`labels` holds the id -5"),
    (dict(input_ids=IDS, labels=torch.tensor([[8, 120], [9, 2]])), "`labels` holds the id 120"),
    (dict(input_ids=IDS, decoder_input_ids=torch.tensor([[1, 500]])), "`decoder_input_ids` holds the id 500"),
    (dict(input_ids=IDS, decoder_input_ids=torch.tensor([[1, 8], [1, 9]]), decoder_attention_mask=torch.ones(2, 3)),
     "`decoder_attention_mask` has shape (2, 3)"),
])
@pytest.mark.parametrize("family", ["deep_transformer", "dtmt"])
def test_bad_model_inputs_raise_one_sentence(arguments, words, family):
    if family == "dtmt" and "decoder_attention_mask" in arguments:
        pytest.skip("DTMT's decoder is recurrent and takes no decoder attention mask")
    model = family_model(family)
    with pytest.raises(ValueError) as error:
        model(**arguments)
    assert words in str(error.value) and len(str(error.value).splitlines()) == 1


@pytest.mark.parametrize("arguments, words", [
    (dict(num_beams=0), "`num_beams` = 0"),
    (dict(num_return_sequences=-2), "`num_return_sequences` = -2"),
    (dict(max_new_tokens=0), "`max_new_tokens` = 0"),
    (dict(max_length=-1), "`max_length` = -1"),
    (dict(input_ids=torch.tensor([[5, 700, 2]])), "`input_ids` holds the id 700"),
])
@pytest.mark.parametrize("family", ["deep_transformer", "dtmt"])
def test_bad_generate_arguments_raise_one_sentence(arguments, words, family):
    kwargs = {"input_ids": IDS, "attention_mask": MASK, **arguments}
    if "input_ids" in arguments:
        kwargs.pop("attention_mask")
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        family_model(family).generate(**kwargs)


def test_a_fully_padded_row_gives_finite_outputs():
    model = tiny_model()
    input_ids = torch.tensor([[5, 6, 2], [0, 0, 0]])
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=(input_ids != 0).long(),
                    labels=torch.tensor([[8, 2], [-100, -100]]))
        generated = model.generate(input_ids=input_ids, attention_mask=(input_ids != 0).long(), max_new_tokens=4)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    assert generated.shape[0] == 2


@pytest.mark.parametrize("field, value, words", [
    ("vocab_size", "100", "`vocab_size` = '100' is not allowed; it must be a positive integer"),
    ("d_model", 16.0, "`d_model` = 16.0 is not allowed"),
    ("pad_token_id", "0", "`pad_token_id` = '0' is not allowed"),
    ("dropout", "0.1", "`dropout` = '0.1' is not allowed"),
    ("layer_norm_position", "middle", "use one of ['post', 'pre']"),
    ("tie_word_embeddings", "yes", "it must be True or False"),
])
def test_wrong_config_types_get_our_sentence_before_transformers_validators(field, value, words):
    with pytest.raises(ValueError) as error:
        DeepTransformerConfig(**{field: value})
    assert words in str(error.value) and type(error.value) is UserInputError  # ours, not transformers' validator


def test_deep_decoder_config_with_a_shallower_decoder_just_works():
    config = DeepDecoderTransformerConfig(decoder_layers=6)
    assert config.cross_attention_drop_depth == 5 and config.decoder_layers == 6


def test_training_data_that_cannot_be_read_leaves_no_empty_run_folder(tmp_path, monkeypatch, capsys):
    """`deepnmt train` without --output_dir names a new folder under runs/; when the data then turns out missing, the
    command answers in one sentence and removes the folders it created (they would hold nothing)."""
    from hf_deepnmt_training.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "valid.jsonl").write_text('{"translation": {"en": "a", "es": "b"}}\n', encoding="utf-8")
    code = main(["train", "--train_file", "missing.jsonl", "--validation_file", "valid.jsonl", "--source_lang", "en",
                 "--target_lang", "es", "--max_steps", "1"])
    assert code == 2
    assert "missing.jsonl" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["valid.jsonl"]
