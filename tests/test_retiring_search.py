"""`hf_deepnmt.retiring_search`: one search over sentences of different new-token budgets, each sentence leaving the
batch once its result is final, gives transformers' own results — the sequences and scores of ``generate`` on each
sentence alone with its budget — for both families and every search setting it takes.

The Transformers are briefly trained (export_cases.train_until) so that hypotheses end with </s> at varied lengths as
well as at their budgets (both ways of retiring are exercised, checked below); the DTMT is random and runs to its
budgets. All are turned to float64: a sentence's
float32 log-probabilities then do not depend on which other sentences share its batch, so the comparison is exact.
"""

from __future__ import annotations

import pytest
import torch
from conftest import dtmt_model, tiny_model
from export_cases import shared_sources, source_batch, train_until, variant_model

from hf_deepnmt.retiring_search import (
    ContinuousSearch,
    retiring_generate,
    search_settings,
    unsupported,
)

SETTINGS = [
    {"num_beams": 4},
    {"num_beams": 4, "num_return_sequences": 3, "length_penalty": 0.6},
    {"num_beams": 3, "early_stopping": False, "length_penalty": -0.5},
    {"num_beams": 3, "early_stopping": "never", "length_penalty": 1.3},
    {"num_beams": 4, "length_penalty_form": "gnmt", "length_penalty": 0.6},
    {"num_beams": 1},
]
BUDGETS = (3, 6, 9, 14)


def ends_early(model, sources) -> bool:
    """Whether beam-4 search ends at least two of ``sources`` with </s> within 9 new tokens (the budgets 3 and 6
    of `BUDGETS` then end others at their budget: the test checks that both happen)."""
    batch = source_batch(sources, model.config.pad_token_id)
    with torch.no_grad():
        output = model.generate(**batch, num_beams=4, max_new_tokens=9)
    ended = (output == model.config.eos_token_id).any(dim=-1)
    return int(ended.sum()) >= 2


@pytest.fixture(scope="module", params=["transformer", "cad_post_ln", "dou2018_mla", "dtmt", "ensemble"])
def trained(request, tiny_tokenizer):
    torch.set_num_threads(1)
    sources = shared_sources(tiny_tokenizer)
    if request.param == "dou2018_mla":  # random, to its budgets: dou2018's extra cache slots (k = 2) and aggregation
        model = tiny_model(seed=3, vocab_size=len(tiny_tokenizer), init_std=0.5, multi_layer_attention_k=2,
                           encoder_layers=3, decoder_layers=3,
                           encoder_layer_aggregation="hierarchical", decoder_layer_aggregation="linear")
        return model.double(), sources, False
    if request.param == "ensemble":  # a trained Transformer with a random DTMT: each member's own state retires rows
        from hf_deepnmt import EnsembleForConditionalGeneration

        transformer = train_until(lambda: variant_model("post_ln", len(tiny_tokenizer)), tiny_tokenizer,
                                  lambda model: ends_early(model, sources)).double()
        dtmt = dtmt_model(seed=3, vocab_size=len(tiny_tokenizer)).double()
        return EnsembleForConditionalGeneration([transformer, dtmt], weights=[2.0, 1.0]).double(), sources, False
    if request.param == "dtmt":
        # 60 steps of the tiny corpus teach the tiny DTMT to stop at once or never (seeds 1-11 tried): a random one
        # that runs to its budgets checks the DTMT state's retirement; stopping by </s> is the Transformers' check
        return dtmt_model(seed=3, vocab_size=len(tiny_tokenizer)).double(), sources, False
    name = "post_ln" if request.param == "transformer" else "cad_p1_post_ln"
    model = train_until(lambda: variant_model(name, len(tiny_tokenizer)), tiny_tokenizer,
                        lambda model: ends_early(model, sources)).double()
    return model, sources, True


def settings_id(settings: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in settings.items())


@pytest.mark.parametrize("settings", SETTINGS, ids=settings_id)
def test_one_call_over_every_budget_gives_generate_s_results_sentence_by_sentence(trained, settings):
    model, sources, ends_by_eos = trained
    assert unsupported(model, settings) is None
    batch = source_batch(sources, model.config.pad_token_id)
    budgets = [BUDGETS[index % len(BUDGETS)] for index in range(len(sources))]
    got = retiring_generate(model, batch["input_ids"], batch["attention_mask"], budgets, search_settings(model, settings))
    assert_results_alone(model, batch, budgets, settings, got, ends_by_eos)


@pytest.mark.parametrize("minimum", [{"num_beams": 4, "min_new_tokens": 9}, {"num_beams": 1, "min_length": 10},
                                     {"num_beams": 3, "min_new_tokens": 7, "length_penalty": 0.6}], ids=settings_id)
def test_a_minimum_length_forbids_the_end_as_generate_does(trained, minimum):
    """``min_new_tokens`` / ``min_length`` (transformers' two minimum-length processors: ``</s>`` at −inf until then)
    give ``generate``'s results sentence by sentence, and change some sentence's result (the case tests them)."""
    model, sources, ends_by_eos = trained
    batch = source_batch(sources, model.config.pad_token_id)
    budgets = [BUDGETS[index % len(BUDGETS)] for index in range(len(sources))]
    got = retiring_generate(model, batch["input_ids"], batch["attention_mask"], budgets, search_settings(model, minimum))
    assert_results_alone(model, batch, budgets, minimum, got, ends_by_eos=False)
    if ends_by_eos:
        free = {key: value for key, value in minimum.items() if not key.startswith("min_")}
        unconstrained = retiring_generate(model, batch["input_ids"], batch["attention_mask"], budgets,
                                          search_settings(model, free))
        assert any(not torch.equal(a.sequences, b.sequences) for a, b in zip(got, unconstrained))


@pytest.mark.parametrize("processors", [{"num_beams": 4, "forced_eos_token_id": "eos", "bad_words_ids": "chosen"},
                                        {"num_beams": 1, "forced_eos_token_id": "eos", "bad_words_ids": "chosen"},
                                        {"num_beams": 3, "bad_words_ids": "chosen", "length_penalty": 0.6}],
                         ids=settings_id)
def test_banned_tokens_and_a_forced_end_are_generate_s(trained, processors):
    """Single-token ``bad_words_ids`` (Marian's ``[[<pad>]]``: never chosen) and ``forced_eos_token_id`` (``</s>``
    at a hypothesis' last position), which every converted OPUS-MT and fairseq model's generation config carries
    (docs/public-checkpoints.md), give ``generate``'s results sentence by sentence, and the banned tokens change
    some result (the tokens banned are ones the unconstrained search chooses)."""
    model, sources, _ = trained
    batch = source_batch(sources, model.config.pad_token_id)
    budgets = [BUDGETS[index % len(BUDGETS)] for index in range(len(sources))]
    free = {key: value for key, value in processors.items() if key not in ("bad_words_ids", "forced_eos_token_id")}
    unconstrained = retiring_generate(model, batch["input_ids"], batch["attention_mask"], budgets,
                                      search_settings(model, free))
    chosen = sorted({int(result.sequences[0, 1]) for result in unconstrained} - {model.config.eos_token_id})[:2]
    settings = dict(free, bad_words_ids=[[token] for token in chosen])
    if "forced_eos_token_id" in processors:
        settings["forced_eos_token_id"] = model.config.eos_token_id
    assert unsupported(model, settings) is None
    got = retiring_generate(model, batch["input_ids"], batch["attention_mask"], budgets, search_settings(model, settings))
    assert_results_alone(model, batch, budgets, settings, got, ends_by_eos=False)
    assert any(not torch.equal(a.sequences, b.sequences) for a, b in zip(got, unconstrained))
    assert not any(bool(torch.isin(result.sequences[:, 1:], torch.tensor(chosen)).any()) for result in got)
    if "forced_eos_token_id" in settings:  # a hypothesis that reaches its budget ends with </s>
        for result, budget in zip(got, budgets):
            for row in result.sequences:
                if row.numel() == budget + 1:
                    assert int(row[-1]) == model.config.eos_token_id


def assert_results_alone(model, batch, budgets, settings, got, ends_by_eos) -> None:
    """``got[i]`` is what ``generate`` gives sentence i alone with its budget: the same sequences, the same scores."""
    pad, eos = model.config.pad_token_id, model.config.eos_token_id
    ended_early = at_budget = 0
    for index, budget in enumerate(budgets):
        alone = {name: value[index:index + 1] for name, value in batch.items()}
        width = int(alone["attention_mask"].sum())
        alone = {name: value[:, :width] for name, value in alone.items()}
        with torch.no_grad():
            reference = model.generate(**alone, **settings, max_new_tokens=budget, output_scores=True,
                                       return_dict_in_generate=True)
        expected = reference.sequences
        width = max(expected.size(1), got[index].sequences.size(1))
        assert torch.equal(torch.nn.functional.pad(got[index].sequences, (0, width - got[index].sequences.size(1)),
                                                   value=pad),
                           torch.nn.functional.pad(expected, (0, width - expected.size(1)), value=pad)), (index, budget)
        if settings["num_beams"] > 1:
            torch.testing.assert_close(got[index].scores, reference.sequences_scores, rtol=1e-6, atol=1e-6)
        else:
            assert got[index].scores is None
        for row in expected:
            if (row == eos).any() and int((row == eos).nonzero()[0]) < budget:
                ended_early += 1
            else:
                at_budget += 1
    assert at_budget and (ended_early or not ends_by_eos), "the case must end hypotheses with </s> and at budgets"


# sentences join the running search in waves: (step it joins at, sentences), the later ones with longer sources
WAVES = ((0, (0, 1, 2)), (1, (5, 6)), (2, (3,)), (4, (7, 8, 9, 10)), (7, (4, 11, 12, 13, 14, 15, 16, 17)))


@pytest.mark.parametrize("settings", [SETTINGS[index] for index in (0, 1, 3, 4, 5)], ids=settings_id)
def test_sentences_that_join_a_running_search_get_what_they_get_alone(trained, settings):
    """Continuous batching (`ContinuousSearch.admit` between steps): each sentence's result is ``generate``'s on it
    alone, whenever it joined, while the others are half-way; models that cannot take sentences half-way say so."""
    model, sources, ends_by_eos = trained
    batch = source_batch(sources, model.config.pad_token_id)
    assert sorted(index for _, wave in WAVES for index in wave) == list(range(len(sources)))
    budgets = [BUDGETS[index % len(BUDGETS)] for index in range(len(sources))]
    search = ContinuousSearch(model, search_settings(model, settings))
    if not getattr(model, "admits_mid_search", False):
        first = {name: value[:2] for name, value in batch.items()}
        search.admit(first["input_ids"], first["attention_mask"], budgets[:2], [0, 1])
        search.step()
        assert not search.can_admit()
        with pytest.raises(RuntimeError, match="only into an empty search"):
            search.admit(first["input_ids"], first["attention_mask"], budgets[:2], [0, 1])
        return
    got: dict[int, object] = {}
    joined_running = trimmed = 0
    step = 0
    while len(got) < len(sources):
        for at, wave in WAVES:
            if at == step:
                rows = list(wave)
                part = {name: value[rows] for name, value in batch.items()}
                width = int(part["attention_mask"].sum(dim=1).max())  # each wave padded to its own longest source
                joined_running += len(search) > 0
                search.admit(part["input_ids"][:, :width], part["attention_mask"][:, :width],
                             [budgets[index] for index in rows], rows)
        columns = search.columns
        for index, hypotheses in search.step():
            got[index] = hypotheses
        trimmed += len(search) > 0 and search.columns <= columns  # a step whose leavers freed leading columns
        step += 1
    assert joined_running == 4 and trimmed, (joined_running, trimmed)
    assert_results_alone(model, batch, budgets, settings, [got[index] for index in range(len(sources))],
                         ends_by_eos)


def test_finished_sentences_leave_the_batch(trained):
    """The decoder is called on fewer rows as sentences finish: the short budgets' rows are not carried along."""
    model, sources, _ = trained
    batch = source_batch(sources, model.config.pad_token_id)
    budgets = [3] * (len(sources) - 1) + [14]
    rows: list[int] = []
    memory_rows: list[int] = []  # rows of the encoder output the decoder is given

    def spy(module, args, kwargs) -> None:
        rows.append(kwargs["decoder_input_ids"].size(0))
        memory_rows.append(kwargs["encoder_outputs"].last_hidden_state.size(0))

    hook = model.register_forward_pre_hook(spy, with_kwargs=True)
    reported: list[tuple[int, int, object]] = []  # (sentence, decoder calls so far, hypotheses) from on_result
    try:
        found = retiring_generate(model, batch["input_ids"], batch["attention_mask"], budgets,
                                  search_settings(model, {"num_beams": 4}),
                                  on_result=lambda index, hypotheses: reported.append((index, len(rows), hypotheses)))
    finally:
        hook.remove()
    # every sentence for 3 steps, then the long one alone (4 beams) until it ends
    assert rows[:3] == [4 * len(sources)] * 3 and len(rows) > 3 and set(rows[3:]) == {4}, rows
    # a Transformer's cross-attention reads one copy of each source for its 4 beams (`beams_share_memory`)
    shared = getattr(model, "beams_share_memory", False)
    assert memory_rows == [row // 4 if shared else row for row in rows], memory_rows
    assert shared == (type(model).__name__ == "DeepTransformerForConditionalGeneration")
    # each result is reported once, the step it is final: the short ones after 3 decoder calls, the long one last
    assert sorted(index for index, _, _ in reported) == list(range(len(sources)))
    assert all(calls == 3 for index, calls, _ in reported if index < len(sources) - 1)
    assert reported[-1][:2] == (len(sources) - 1, len(rows))
    assert all(hypotheses is found[index] for index, _, hypotheses in reported)


@pytest.mark.parametrize("settings, named", [
    ({"do_sample": True}, "do_sample"), ({"repetition_penalty": 1.2}, "repetition_penalty"),
    ({"no_repeat_ngram_size": 3}, "no_repeat_ngram_size"), ({"suppress_tokens": [5]}, "suppress_tokens"),
    ({"forced_bos_token_id": 5}, "forced_bos_token_id"), ({"output_scores": True}, "output_scores"),
    ({"bad_words_ids": [[5, 6]]}, "bad_words_ids"),
    ({"unheard_of": 1}, "unheard_of")])
def test_settings_outside_the_search_are_named_so_the_caller_uses_generate(settings, named):
    model = dtmt_model()
    reason = unsupported(model, settings)
    assert reason is not None and reason.startswith(named)
    assert unsupported(model, {"num_beams": 4, "max_new_tokens": 9, "length_penalty": 0.8}) is None


def test_an_ensemble_takes_the_search_and_other_models_are_left_to_generate():
    from hf_deepnmt import EnsembleForConditionalGeneration

    ensemble = EnsembleForConditionalGeneration([dtmt_model(seed=1), dtmt_model(seed=2)])
    assert unsupported(ensemble, {"num_beams": 4}) is None
    assert unsupported(torch.nn.Linear(2, 2), {}) == "Linear is not a class the retiring search is tested with"


@pytest.mark.parametrize("settings", [*SETTINGS, {"num_beams": 4, "min_new_tokens": 9},
                                      {"num_beams": 2, "num_return_sequences": 2, "early_stopping": True}],
                         ids=settings_id)
def test_generate_runs_the_retiring_search_and_returns_transformers_tensor(trained, settings, monkeypatch):
    """A `generate` call for sequences only, with settings the search reproduces, runs it: the same tensor as
    transformers' loop (shape, n-best order, fill after short rows), for every family; ``max_length`` too."""
    from hf_deepnmt import retiring_search

    model, sources, _ = trained
    batch = source_batch(sources, model.config.pad_token_id)
    calls = []
    real = retiring_search.retiring_generate
    monkeypatch.setattr(retiring_search, "retiring_generate", lambda *args, **kwargs: calls.append(1) or real(*args,
                                                                                                         **kwargs))
    labels = torch.full_like(batch["input_ids"], 5)  # as Seq2SeqTrainer's evaluation passes them along
    with torch.no_grad():
        routed = [model.generate(**batch, **settings, max_new_tokens=9),
                  model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **settings, max_length=7,
                                 labels=labels)]
    assert len(calls) == 2
    model.generate_by_retiring_search = False
    try:
        with torch.no_grad():
            reference = [model.generate(**batch, **settings, max_new_tokens=9),
                         model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], **settings,
                                        max_length=7, labels=labels)]
    finally:
        del model.generate_by_retiring_search
    assert len(calls) == 2
    for got, expected in zip(routed, reference):
        assert got.shape == expected.shape and torch.equal(got, expected)


def test_generate_leaves_to_transformers_what_the_search_does_not_give(trained, monkeypatch):
    """Scores or dict outputs, sampling, a logits processor, a given ``generation_config``, decoder inputs, no
    attention mask, no explicit length, training mode: transformers' loop, untouched."""
    from transformers import GenerationConfig, LogitsProcessorList

    from hf_deepnmt import retiring_search

    model, sources, _ = trained
    batch = source_batch(sources, model.config.pad_token_id)
    monkeypatch.setattr(retiring_search, "retiring_generate", lambda *args, **kwargs: pytest.fail("routed"))
    start = torch.full((batch["input_ids"].size(0), 1), model.config.decoder_start_token_id)
    config = GenerationConfig(**{**model.generation_config.to_dict(), "max_new_tokens": 4})
    with torch.no_grad():
        for call in ({**batch, "max_new_tokens": 4, "return_dict_in_generate": True, "output_scores": True},
                     {**batch, "max_new_tokens": 4, "do_sample": True, "num_beams": 1},
                     {**batch, "max_new_tokens": 4, "logits_processor": LogitsProcessorList([lambda ids, s: s])},
                     {**batch, "generation_config": config},
                     {**batch, "max_new_tokens": 4, "decoder_input_ids": start},
                     {"input_ids": batch["input_ids"], "max_new_tokens": 4}):
            model.generate(**call)
        model.train()
        try:
            model.generate(**batch, max_new_tokens=4)
        finally:
            model.eval()
