"""`hf_deepnmt.EnsembleForConditionalGeneration`: an ensemble of one is the model; two members of different families
(a Transformer and a DTMT) decode exactly as a combination computed here by hand, step by step; members that do not
share a vocabulary or a language pair are refused in one sentence."""

from __future__ import annotations

import math
import re

import pytest
import torch
from conftest import PARALLEL, tiny_model
from export_cases import source_batch, trained_variant

import hf_deepnmt
from hf_deepnmt import EnsembleForConditionalGeneration, UserInputError, load_ensemble
from hf_deepnmt.ensemble import EnsembleCache

NEW_TOKENS = 24
MARGIN = 1e-4  # a greedy step whose two best tokens are closer than this may go either way (tests/search_parity.py)


def dtmt_member(vocab_size: int, seed: int = 4) -> hf_deepnmt.DTMTForConditionalGeneration:
    """A tiny random DTMT whose hypotheses end at varied lengths (weights from ±0.5 and a bias toward </s>, as the
    ONNX parity tests draw theirs)."""
    torch.manual_seed(seed)
    config = hf_deepnmt.DTMTConfig(vocab_size=vocab_size, d_model=16, attention_heads=2, transition_depth=2,
                                   max_position_embeddings=64, init_range=0.5)
    model = hf_deepnmt.DTMTForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.bias[config.eos_token_id] += 1.4
    return model


# The (combination, weights) settings of the hand-combination test.
COMBINATIONS = [("mean", (0.3, 0.7)), ("mean", (1.0, 1.0)), ("log_linear", (0.6, 0.9))]


@pytest.fixture(scope="module")
def members(tiny_tokenizer, batch):
    """The briefly trained Transformer and the first DTMT seed (from 4) with which the ensemble's greedy hypotheses
    end at ≥ 3 different lengths under every setting of `COMBINATIONS`: the property the hand-combination test needs,
    chosen rather than left to one seed (the members' logits, and so the lengths, move with the CPU's float kernels)."""
    transformer = trained_variant("post_ln", tiny_tokenizer)
    eos, pad = 2, tiny_tokenizer.pad_token_id
    for seed in range(4, 24):
        dtmt = dtmt_member(len(tiny_tokenizer), seed)
        if all(len({len(trimmed(row.tolist(), eos, pad)) for row in generated(
                EnsembleForConditionalGeneration([transformer, dtmt], weights=weights, combination=combination),
                batch, num_beams=1, do_sample=False).sequences}) >= 3 for combination, weights in COMBINATIONS):
            return {"transformer": transformer, "dtmt": dtmt}
    raise AssertionError("no DTMT seed in 4..23 gives the ensemble hypotheses of ≥ 3 lengths")


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    """Six sentences of different lengths, right-padded into one batch."""
    texts = [source for source, _ in PARALLEL]
    return source_batch(tiny_tokenizer(texts)["input_ids"], tiny_tokenizer.pad_token_id)


def generated(model, batch, **kwargs):
    with torch.no_grad():
        return model.generate(**batch, max_new_tokens=NEW_TOKENS, output_scores=True, return_dict_in_generate=True,
                              **kwargs)


def trimmed(row: list[int], eos: int, pad: int) -> list[int]:
    """A generated row without its start token, cut after </s>."""
    tokens = []
    for token in row[1:]:
        if token == pad and pad != eos:
            break
        tokens.append(token)
        if token == eos:
            break
    return tokens


# ------------------------------------------------------------------------------------------------ an ensemble of one
@pytest.mark.parametrize("family", ["transformer", "dtmt"])
def test_an_ensemble_of_one_is_exactly_the_model(members, batch, family):
    """Greedy and beam-4 sequences and scores, an n-best list, and a seeded sample are the model's own, bit for bit;
    so is the teacher-forced loss."""
    model = members[family]
    ensemble = EnsembleForConditionalGeneration([model])
    for settings in (dict(num_beams=1, do_sample=False), dict(num_beams=4, do_sample=False),
                     dict(num_beams=4, num_return_sequences=3, do_sample=False)):
        alone, together = generated(model, batch, **settings), generated(ensemble, batch, **settings)
        assert torch.equal(alone.sequences, together.sequences), settings
        assert all(torch.equal(a, b) for a, b in zip(alone.scores, together.scores)), settings
        if settings["num_beams"] > 1:
            assert torch.equal(alone.sequences_scores, together.sequences_scores), settings
    torch.manual_seed(7)
    alone = generated(model, batch, do_sample=True, num_beams=1, top_k=20)
    torch.manual_seed(7)
    together = generated(ensemble, batch, do_sample=True, num_beams=1, top_k=20)
    assert torch.equal(alone.sequences, together.sequences)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    with torch.no_grad():
        assert torch.equal(model(**batch, labels=labels).loss, ensemble(**batch, labels=labels).loss)


# ------------------------------------------------------------------------------------------------ two families
def reference_log_probs(models, weights, combination, source: list[int], tokens: list[int], start: int
                        ) -> torch.Tensor:
    """The combination written out for one sentence and its output ``tokens``: every member's uncached,
    teacher-forced forward gives its next-token log-probabilities at each step ``(T, V)``; they are combined step
    by step as fairseq does (log Σ w p, weights normalised) or Marian (Σ w log p, renormalised)."""
    per_member = []
    with torch.no_grad():
        for model in models:
            logits = model(input_ids=torch.tensor([source]), decoder_input_ids=torch.tensor([[start, *tokens[:-1]]]),
                           use_cache=False).logits
            per_member.append(logits[0].log_softmax(-1))  # (T, V)
    if combination == "mean":
        total = sum(weights)
        mixture = sum(weight / total * log_probs.exp() for weight, log_probs in zip(weights, per_member))
        return mixture.log()  # (T, V)
    return sum(weight * log_probs for weight, log_probs in zip(weights, per_member)).log_softmax(-1)  # (T, V)


@pytest.mark.parametrize("combination, weights", COMBINATIONS)
def test_a_transformer_and_a_dtmt_decode_as_the_hand_combination(members, batch, tiny_tokenizer, combination,
                                                                  weights):
    """Greedy: at every step the ensemble's scores are the reference combination of the members' uncached
    log-probabilities (each member on its own encoder output and cache, padded batch) and it picks their best
    token. Beam 4 with 4 returned hypotheses: every hypothesis's score is its reference log-probability divided by
    its length (length penalty 1.0, the first member's), which a cache that followed the wrong beams would miss."""
    models = [members["transformer"], members["dtmt"]]
    ensemble = EnsembleForConditionalGeneration(models, weights=weights, combination=combination)
    eos, pad, start = 2, tiny_tokenizer.pad_token_id, models[0].config.decoder_start_token_id
    sources = [row[mask.bool()].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]

    greedy = generated(ensemble, batch, num_beams=1, do_sample=False)
    steps_checked = 0
    for row, source in enumerate(sources):
        tokens = trimmed(greedy.sequences[row].tolist(), eos, pad)
        expected = reference_log_probs(models, weights, combination, source, tokens, start)  # (T, V)
        for step, token in enumerate(tokens):
            got = greedy.scores[step][row]
            assert torch.allclose(got, expected[step], atol=1e-5), (row, step, (got - expected[step]).abs().max())
            best, second = expected[step].topk(2).values
            if best - second > MARGIN:
                assert token == int(expected[step].argmax()), (row, step)
            steps_checked += 1
    assert steps_checked >= 20
    lengths = {len(trimmed(row.tolist(), eos, pad)) for row in greedy.sequences}
    assert len(lengths) >= 3  # hypotheses end at varied lengths: the stopping of each member's state is exercised

    beams = generated(ensemble, batch, num_beams=4, num_return_sequences=4, do_sample=False)
    for index, (sequence, score) in enumerate(zip(beams.sequences, beams.sequences_scores)):
        tokens = trimmed(sequence.tolist(), eos, pad)
        expected = reference_log_probs(models, weights, combination, sources[index // 4], tokens, start)  # (T, V)
        total = float(expected[torch.arange(len(tokens)), torch.tensor(tokens)].sum())
        assert float(score) == pytest.approx(total / len(tokens), abs=1e-4), (index, tokens)
    assert len({tuple(trimmed(row.tolist(), eos, pad)) for row in beams.sequences}) > len(sources)  # real n-best


def test_the_ensemble_cache_holds_each_members_own_cache(members, batch):
    from transformers.cache_utils import EncoderDecoderCache

    ensemble = EnsembleForConditionalGeneration([members["transformer"], members["dtmt"]])
    decoder_input_ids = torch.full((batch["input_ids"].size(0), 1), 1)
    with torch.no_grad():
        output = ensemble(**batch, decoder_input_ids=decoder_input_ids)
        cache = output.cache if hasattr(output, "cache") else output.past_key_values
        assert isinstance(cache, EnsembleCache) and cache.get_seq_length() == 1
        assert isinstance(cache.members[0], EncoderDecoderCache) and isinstance(cache.members[1], hf_deepnmt.DTMTCache)
        cache.batch_repeat_interleave(2)
        assert cache.members[1].batch_size == 2 * batch["input_ids"].size(0)
    torch.manual_seed(0)
    sampled = ensemble.generate(**batch, do_sample=True, num_return_sequences=2, max_new_tokens=NEW_TOKENS)
    assert sampled.size(0) == 2 * batch["input_ids"].size(0)
    assert int(sampled.max()) < ensemble.config.vocab_size


# ------------------------------------------------------------------------------------------------ refusals
def test_members_that_do_not_share_a_vocabulary_or_a_pair_are_refused(members, tiny_tokenizer):
    transformer = members["transformer"]
    with pytest.raises(UserInputError, match=r"member 2 \(DeepTransformerForConditionalGeneration\) has vocab_size "
                                             r"99 but member 1 \(\w+\) has \d+; the members of an ensemble must share"):
        EnsembleForConditionalGeneration([transformer, tiny_model()])
    other_eos = tiny_model(vocab_size=len(tiny_tokenizer), eos_token_id=3, unk_token_id=4)
    with pytest.raises(UserInputError, match=r"has eos_token_id = 3 but member 1 \(\w+\) has 2"):
        EnsembleForConditionalGeneration([transformer, other_eos])
    english_spanish, german_english = (tiny_model(vocab_size=len(tiny_tokenizer)) for _ in range(2))
    hf_deepnmt.record_language_pair(english_spanish.config, "en", "es")
    hf_deepnmt.record_language_pair(german_english.config, "de", "en")
    with pytest.raises(UserInputError, match="member 2 .* records the language pair de → en but member 1 .* records "
                                             "en → es; the members of an ensemble must translate the same pair"):
        EnsembleForConditionalGeneration([english_spanish, german_english])
    ensemble = EnsembleForConditionalGeneration([english_spanish, transformer])  # a member without a record agrees
    assert hf_deepnmt.recorded_language_pairs(ensemble.config) == [("en", "es")]
    for models, words in (([], "`models` is empty"), (["runs/a"], "is a str, not a loaded seq2seq model"),
                          (transformer, "must be a list of models")):
        with pytest.raises(UserInputError, match=words):
            EnsembleForConditionalGeneration(models)
    for weights, combination, words in (((1.0,), "mean", "`weights` has 1 values for 2 models"),
                                        ((1.0, 0.0), "mean", "holds 0.0, which is not allowed"),
                                        ((1.0, float("nan")), "mean", "holds nan"),
                                        (None, "geometric", "`combination` = 'geometric' is not allowed")):
        with pytest.raises(UserInputError, match=words):
            EnsembleForConditionalGeneration([transformer, transformer], weights=weights, combination=combination)
    with pytest.raises(UserInputError, match="an ensemble is not saved as one folder"):
        EnsembleForConditionalGeneration([transformer]).save_pretrained("unused")


def test_load_ensemble_compares_the_tokens_of_every_member(tiny_folder, tiny_tokenizer, tmp_path):
    from hf_deepnmt_training.tokenizer import train_joint_bpe

    ensemble, tokenizer = load_ensemble([tiny_folder, tiny_folder], weights=[2.0, 1.0])
    assert tokenizer.get_vocab() == tiny_tokenizer.get_vocab()
    assert ensemble.config.weights == pytest.approx([2 / 3, 1 / 3]) and math.isclose(sum(ensemble.config.weights), 1)
    other = tmp_path / "other"
    model = tiny_model(vocab_size=len(tiny_tokenizer))
    model.save_pretrained(other)
    targets = [target for _, target in PARALLEL]
    reversed_bpe = train_joint_bpe(targets * 3, targets * 3, vocab_size=len(tiny_tokenizer), min_frequency=1,
                                   model_max_length=64)
    reversed_bpe.save_pretrained(other)
    with pytest.raises(UserInputError) as refused:
        load_ensemble([tiny_folder, other])
    # issue 66 item 6: the sentence named neither folder where it compared a token ("id 5 there and 7 here")
    token, first, second = re.search(rf"\(the token '(.+)' is id (\d+) in {re.escape(str(tiny_folder))}'s tokenizer "
                                     rf"and (id \d+|absent) in {re.escape(str(other))}'s\)", str(refused.value)).groups()
    assert int(first) == tiny_tokenizer.get_vocab()[token]
    assert second == (f"id {reversed_bpe.get_vocab()[token]}" if token in reversed_bpe.get_vocab() else "absent")
    assert str(refused.value).startswith(f"{other} has a vocabulary of the same size as {tiny_folder} but other tokens")
    assert str(refused.value).endswith("the members of an ensemble must share one tokenizer (train the others on the "
                                       f"first's: `deepnmt train --tokenizer_name {tiny_folder}`).")


# ------------------------------------------------------------------------------------------------ the command line
def test_translate_and_evaluate_take_several_folders(tiny_folder, tiny_tokenizer, small_corpus, tmp_path, capsys):
    """`--model A B` is an ensemble (the first folder's tokenizer); a folder that is not a model, or members that
    do not share a vocabulary, are one sentence on stderr (exit 2) before anything is written."""
    from hf_deepnmt_training.cli import main

    second = tmp_path / "second"
    model = tiny_model(seed=5, vocab_size=len(tiny_tokenizer))
    model.save_pretrained(second)
    tiny_tokenizer.save_pretrained(second)
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("In the beginning.\nAnd God said.\n", encoding="utf-8")
    capsys.readouterr()
    argv = ["translate", "--model", str(tiny_folder), str(second), "--input", str(source), "--max_new_tokens", "4",
            "--num_beams", "2"]
    assert main([*argv, "--output", str(output), "--weights", "1", "3"]) == 0
    assert len(output.read_text(encoding="utf-8").splitlines()) == 2
    assert "an ensemble of 2 models on torch (mean)" in capsys.readouterr().err
    scores = tmp_path / "scores.json"
    assert main(["evaluate", "--model", str(tiny_folder), str(second), "--test_file", str(small_corpus / "test.jsonl"),
                 "--max_samples", "4", "--num_beams", "2", "--reliance_pairs", "2", "--output_json", str(scores),
                 "--combination", "log_linear", "--source_lang", "en", "--target_lang", "es"]) == 0
    assert "an ensemble of 2 models (log_linear, weights 1, 1)" in capsys.readouterr().out
    import json

    report = json.loads(scores.read_text())
    assert report["ensemble"]["models"] == [str(tiny_folder), str(second)] and report["sentences"] == 4

    empty, other_vocab = tmp_path / "empty", tmp_path / "other_vocab"
    empty.mkdir()
    tiny_model(vocab_size=len(tiny_tokenizer) + 1).save_pretrained(other_vocab)
    tiny_tokenizer.save_pretrained(other_vocab)
    for folders, words in (([tiny_folder, empty], f"`--model` = '{empty}' is a folder without a saved model"),
                           ([tiny_folder, other_vocab], f"{other_vocab} has vocab_size 121 but {tiny_folder} has 120; the members of an "
                                                        "ensemble must share one vocabulary")):
        refused = tmp_path / "refused.txt"
        capsys.readouterr()
        assert main(["translate", "--model", *map(str, folders), "--input", str(source), "--output",
                     str(refused)]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and words in error[0], error
        assert not refused.exists()
