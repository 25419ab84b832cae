"""The translate path of `deepnmt translate` / `deepnmt evaluate` (hf_deepnmt_training.translate): a sentence's translation does
not depend on how sentences are batched."""

from __future__ import annotations

import contextlib
import functools

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


def test_translations_do_not_depend_on_the_batch_size(tiny_tokenizer):
    """Beam-4 translations of sentences of many lengths are the same for batch sizes 1, 7 and 64 (all 40 in one
    batch), as float32 noise allows (tests/search_parity.py). Before each sentence had its own new-token budget, a batch took
    its longest source's: a short sentence whose hypotheses run long was cut at its own budget alone and not in a
    batch with a long one (BLEU 0.81 vs 0.67 for one model at the default batch size and 64)."""
    words = [text.split() for pair in PARALLEL for text in pair]
    sentences = [" ".join(sentence[:n]) for n in (1, 2, 3, 5, 8, 12) for sentence in words][:40]
    encoded = tiny_tokenizer(sentences)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    assert len({new_token_budget(n, 64) for n in lengths}) >= 4  # the batches mix budgets

    def unfinished(model) -> int:
        """How many sentences' beam-4 translations run to their budget without ending."""
        engine = TorchEngine(model)
        return sum(engine.generate([ids], num_beams=4, max_new_tokens=new_token_budget(len(ids), 64))[0][-1]
                   != model.config.eos_token_id for ids in encoded)

    # some translations run to their budget without ending (there the budget decides the output), most end
    model = train_until(lambda: variant_model("post_ln", len(tiny_tokenizer)), tiny_tokenizer,
                        lambda model: 3 <= unfinished(model) <= len(encoded) - 3)

    def translate(batch_size: int, jitter=None) -> list[tuple[str]]:
        with jittered(model, jitter):
            texts = translate_sentences(model, tiny_tokenizer, sentences, num_beams=4, batch_size=batch_size,
                                        progress=False)
        return [(text,) for text in texts]

    alone = translate(1)
    assert unfinished(model) >= 3
    for batch_size in (7, 64):
        assert_same_search(functools.partial(translate, 1), translate(batch_size), what=f"batch size {batch_size}",
                           expected=alone)
