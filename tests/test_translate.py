"""The translate path of `deepnmt translate` / `deepnmt evaluate` (hf_deepnmt_training.translate): a sentence's translation does
not depend on how sentences are batched."""

from __future__ import annotations

import contextlib
import functools
import json

import pytest

from conftest import PARALLEL
from export_cases import train_until, variant_model
from search_parity import assert_same_search
from transformers import LogitsProcessorList

from hf_deepnmt.export import TorchEngine
from hf_deepnmt_training.translate import BUDGET_STEP, new_token_budget, translate_sentences


def test_new_token_budget_is_the_sentences_own():
    assert [new_token_budget(n, 1024) for n in (0, 1, 4, 5, 20, 100)] == [16, 16, 16, 24, 40, 160]
    assert all(new_token_budget(n, 1024) % BUDGET_STEP == 0 for n in range(300))
    assert new_token_budget(100, 64) == 63  # the decoder start token takes one of the model's positions


@contextlib.contextmanager
def jittered(model, jitter):
    """``model.generate`` with ``jitter`` among its logits processors (tests/search_parity.py)."""
    original = model.generate
    if jitter is not None:
        model.generate = functools.partial(original, logits_processor=LogitsProcessorList([jitter]))
    try:
        yield
    finally:
        model.generate = original


SENTENCES = [" ".join(sentence[:n]) for n in (1, 2, 3, 5, 8, 12)
             for sentence in [text.split() for pair in PARALLEL for text in pair]][:40]


def unfinished(model, encoded: list[list[int]]) -> int:
    """How many sentences' beam-4 translations run to their budget without ending."""
    engine = TorchEngine(model)
    return sum(engine.generate([ids], num_beams=4, max_new_tokens=new_token_budget(len(ids), 64))[0][-1]
               != model.config.eos_token_id for ids in encoded)


@pytest.fixture(scope="module")
def budget_model(tiny_tokenizer):
    """A briefly trained model some of whose translations of `SENTENCES` run to their budget without ending (there
    the budget decides the output) while most end: chosen by that property (`export_cases.train_until`)."""
    encoded = tiny_tokenizer(SENTENCES)["input_ids"]
    return train_until(lambda: variant_model("post_ln", len(tiny_tokenizer)), tiny_tokenizer,
                       lambda model: 3 <= unfinished(model, encoded) <= len(encoded) - 3)


def test_translations_do_not_depend_on_the_batch_size(budget_model, tiny_tokenizer):
    """Beam-4 translations of sentences of many lengths are the same for batch sizes 1, 7 and 64 (all 40 in one
    batch), as float32 noise allows (tests/search_parity.py). Before each sentence had its own new-token budget, a batch took
    its longest source's: a short sentence whose hypotheses run long was cut at its own budget alone and not in a
    batch with a long one (BLEU 0.81 vs 0.67 for one model at the default batch size and 64)."""
    model, sentences = budget_model, SENTENCES
    encoded = tiny_tokenizer(sentences)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    assert len({new_token_budget(n, 64) for n in lengths}) >= 4  # the batches mix budgets

    def translate(batch_size: int, jitter=None, search: str = "retiring") -> list[tuple[str]]:
        with jittered(model, jitter):
            texts = translate_sentences(model, tiny_tokenizer, sentences, num_beams=4, batch_size=batch_size,
                                        progress=False, search=search)
        return [(text,) for text in texts]

    # the reference: each sentence alone, transformers' generate (which the jitter reaches); the candidates: batches
    # of one budget (generate) and of every budget (the retiring search, the default)
    alone = translate(1, search="generate")
    assert unfinished(model, encoded) >= 3
    for batch_size in (7, 64):
        for search in ("generate", "retiring"):
            assert_same_search(functools.partial(translate, 1, search="generate"), translate(batch_size, search=search),
                               what=f"batch size {batch_size}, {search}", expected=alone)


def test_the_pipeline_and_the_server_decode_each_text_with_its_own_budget(budget_model, tiny_tokenizer):
    """Without a length of the call's own, ``pipeline("translation")`` (so ``handler.py`` and `deepnmt serve`) gives
    each text `new_token_budget` new tokens, as `deepnmt translate` does: the same translations, whatever the
    pipeline's batch size; texts that run on are cut at their own budget, not at the generation config's
    ``max_new_tokens``; an explicit ``max_new_tokens`` replaces the budget."""
    from hf_deepnmt.pipeline_translation import TranslationPipeline

    model = budget_model
    assert model.generation_config.max_new_tokens is None or model.generation_config.max_new_tokens > 40
    translate = TranslationPipeline(model=model, tokenizer=tiny_tokenizer)

    def reference(jitter=None) -> list[tuple[str]]:  # deepnmt translate's decoding
        with jittered(model, jitter):
            return [(text,) for text in translate_sentences(model, tiny_tokenizer, SENTENCES, num_beams=4,
                                                            progress=False, search="generate")]

    expected = reference()
    for batch_size in (1, 8):
        got = [row["translation_text"] for row in translate(SENTENCES, num_beams=4, batch_size=batch_size)]
        assert_same_search(reference, [(text,) for text in got], what=f"pipeline batch {batch_size}",
                           expected=expected)
    encoded = tiny_tokenizer(SENTENCES)["input_ids"]
    cut = [text for text, ids in zip(SENTENCES, encoded)
           if TorchEngine(model).generate([ids], num_beams=4, max_new_tokens=new_token_budget(len(ids), 64))[0][-1]
           != model.config.eos_token_id]
    longer = translate(cut, num_beams=4, max_new_tokens=62)
    assert any(len(tiny_tokenizer(row["translation_text"])["input_ids"]) > len(tiny_tokenizer(short)["input_ids"])
               for row, short in zip(longer, [row["translation_text"] for row in translate(cut, num_beams=4)]))


def test_search_generate_runs_transformers_own_loop(budget_model, tiny_tokenizer, monkeypatch):
    """``search="generate"`` (`deepnmt translate`'s fallback, the benchmarks' baseline) is one transformers `generate`
    loop per budget, although a model's `generate` otherwise runs the retiring search; the model is left as it was."""
    from hf_deepnmt import retiring_search

    monkeypatch.setattr(retiring_search, "retiring_generate", lambda *args, **kwargs: pytest.fail("retiring search"))
    texts = translate_sentences(budget_model, tiny_tokenizer, SENTENCES[:6], num_beams=4, progress=False,
                                search="generate")
    assert len(texts) == 6 and budget_model.generate_by_retiring_search is True
    assert "generate_by_retiring_search" not in vars(budget_model)


# ------------------------------------------------------------------------------------------------ over-long inputs
LONG_LINES = [" ".join(source for source, _ in PARALLEL * 4),  # 24 sentences, about 8 times the 64 tokens accepted
              " ".join(source.rstrip(".") for source, _ in PARALLEL * 2)]  # one sentence, about 4 times the limit


def test_an_input_longer_than_the_model_accepts_is_translated_whole(tiny_tokenizer, capsys):
    """Issue 66 item 2: a line over the model's 64 tokens is split into pieces that fit — at sentence ends, and
    between words inside a sentence longer than the limit — translated piece by piece and joined; an engine that
    echoes its source shows every word arrives (it was cut at 64 tokens: a 521-token line gave its first 63), and
    one line on stderr per over-long input names its line number (here those of a strided share: 5, 8, 11, 14)."""
    from test_corpus_translation import EchoEngine

    from hf_deepnmt_training.translate import split_long_input, translate_windows

    def fits(text: str) -> bool:
        return len(tiny_tokenizer(text)["input_ids"]) <= 64

    many, one = LONG_LINES
    lengths = [len(tiny_tokenizer(text)["input_ids"]) for text in LONG_LINES]
    assert min(lengths) > 3 * 64
    split = split_long_input(many, fits)
    assert " ".join(split.pieces) == many and split.inside_sentences == 0
    assert all(fits(piece) and piece.endswith(".") for piece in split.pieces)
    assert len(split.pieces) <= -(-lengths[0] // 50)  # packed: a few sentences per piece, not one each
    words = split_long_input(one, fits)
    assert " ".join(words.pieces) == one and words.inside_sentences == len(words.pieces) > 1
    assert all(fits(piece) for piece in words.pieces)

    lines = ["In the beginning.", many, "", one]
    assert list(translate_windows(EchoEngine(), tiny_tokenizer, lines, window=2, first_line=5, line_step=3)) == lines
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[deepnmt]")]
    assert notes == [
        f"[deepnmt] line 8 has {lengths[0]} tokens, more than the 64 the model accepts: translated whole in "
        f"{len(split.pieces)} pieces, cut at sentence ends, their translations joined (docs/training.md, \"An input "
        "longer than the model accepts\")",
        f"[deepnmt] line 14 has {lengths[1]} tokens, more than the 64 the model accepts: translated whole in "
        f"{len(words.pieces)} pieces, cut at sentence ends and, inside a sentence longer than that, between words "
        f"({len(words.pieces)} of the pieces), their translations joined (docs/training.md, \"An input longer than "
        "the model accepts\")"]


def test_translate_and_evaluate_translate_an_over_long_line_whole(tiny_folder, tiny_tokenizer, tmp_path, capsys):
    """Issue 66 item 2 through the command line: `deepnmt translate` and `deepnmt evaluate` give an over-long line
    the joined translations of its pieces (not the translation of its first 64 tokens), exit 0, and name the line
    (translate) or test pair (evaluate) on stderr."""
    from transformers import AutoModelForSeq2SeqLM

    from hf_deepnmt_training.cli import main
    from hf_deepnmt_training.translate import split_long_input

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_folder)
    many = LONG_LINES[0]
    pieces = split_long_input(many, lambda text: len(tiny_tokenizer(text)["input_ids"]) <= 64).pieces
    options = dict(num_beams=1, max_new_tokens=4, progress=False)
    expected = " ".join(text for text in translate_sentences(model, tiny_tokenizer, pieces, **options) if text)
    cut = translate_sentences(model, tiny_tokenizer, [tiny_tokenizer.decode(
        tiny_tokenizer(many, truncation=True, max_length=64)["input_ids"], skip_special_tokens=True)], **options)[0]
    assert expected != cut

    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text(f"In the beginning.\n{many}\n", encoding="utf-8")
    assert main(["translate", str(tiny_folder), "--input", str(source), "--output", str(output), "--num_beams", "1",
                 "--max_new_tokens", "4"]) == 0
    assert output.read_text(encoding="utf-8").splitlines()[1] == expected
    assert f"[deepnmt] line 2 has {len(tiny_tokenizer(many)['input_ids'])} tokens" in capsys.readouterr().err

    test, hypotheses = tmp_path / "test.jsonl", tmp_path / "hypotheses.txt"
    pairs = [PARALLEL[0], (many, " ".join(target for _, target in PARALLEL * 4))]
    test.write_text("".join(json.dumps({"translation": {"en": en, "es": es}}) + "\n" for en, es in pairs),
                    encoding="utf-8")
    assert main(["evaluate", str(tiny_folder), "--test_file", str(test), "--source_lang", "en", "--target_lang", "es",
                 "--num_beams", "1", "--reliance_pairs", "1", "--hypotheses", str(hypotheses)]) == 0
    assert "[deepnmt] test pair 2 has" in capsys.readouterr().err
    whole = translate_sentences(model, tiny_tokenizer, pieces, num_beams=1, progress=False)
    assert hypotheses.read_text(encoding="utf-8").splitlines()[1] == " ".join(text for text in whole if text)
