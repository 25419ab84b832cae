"""The joint BPE tokenizer (training/tokenizer.py)."""

from __future__ import annotations

import json

import pytest
from conftest import PARALLEL
from transformers import AutoTokenizer

from hf_deepnmt_training.tokenizer import train_joint_bpe


def test_specials_have_the_ids_the_model_config_expects(tiny_tokenizer):
    assert tiny_tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]
    assert (tiny_tokenizer.pad_token_id, tiny_tokenizer.bos_token_id, tiny_tokenizer.eos_token_id,
            tiny_tokenizer.unk_token_id) == (0, 1, 2, 3)
    assert tiny_tokenizer.padding_side == "right"


def test_one_vocabulary_covers_both_languages(tiny_tokenizer):
    for source, target in PARALLEL:
        for text in (source, target):
            ids = tiny_tokenizer(text)["input_ids"]
            assert ids[-1] == tiny_tokenizer.eos_token_id
            assert tiny_tokenizer.unk_token_id not in ids  # every character of either language is known
            assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == text  # exact round trip


def test_targets_become_labels(tiny_tokenizer):
    batch = tiny_tokenizer(["la luz"], text_target=["the light"])
    assert batch["labels"][0][-1] == tiny_tokenizer.eos_token_id
    assert tiny_tokenizer.decode(batch["labels"][0], skip_special_tokens=True) == "the light"


def test_unknown_characters_map_to_unk(tiny_tokenizer):
    assert tiny_tokenizer.unk_token_id in tiny_tokenizer("日本")["input_ids"]


def test_vocabulary_size_is_configurable():
    sources, targets = zip(*PARALLEL)
    small = train_joint_bpe(sources, targets, vocab_size=100, min_frequency=1)
    large = train_joint_bpe(sources, targets, vocab_size=200, min_frequency=1)
    assert len(small) == 100 and 100 < len(large) <= 200


def test_reloads_with_auto_tokenizer_and_no_custom_code(tmp_path, tiny_tokenizer):
    tiny_tokenizer.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert "auto_map" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = PARALLEL[0][1]
    assert reloaded(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert reloaded.model_max_length == 64 and reloaded.unk_token == "<unk>"


@pytest.mark.parametrize("kwargs,field", [(dict(vocab_size=10), "vocab_size"), (dict(min_frequency=0), "min_frequency")])
def test_bad_arguments_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        train_joint_bpe(["a"], ["b"], **kwargs)


def test_empty_training_text_is_a_clear_error():
    with pytest.raises(ValueError, match="empty"):
        train_joint_bpe([""], [""], vocab_size=100)
