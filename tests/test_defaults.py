"""`deepnmt train` from scratch without a recipe: NMT defaults (training/defaults.py, docs/defaults.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model, train_argv

from hf_deepnmt.errors import UserInputError
from hf_deepnmt_training.cli import main
from hf_deepnmt_training.train import UNBOUNDED_STEPS
from hf_deepnmt_training.defaults import (CPU_SIZES, DROPOUT_BY_EPOCHS, DROPOUT_FIELDS, GPU_SIZES,
                                         LABEL_SMOOTHING_BY_TYPE, PARSE_TIME_DEFAULTS, WARMUP_BY_LENGTH_TYPES,
                                         describe_dropout_rule, dropout_for_epochs, given_options, resolve,
                                         size_class, warmup_for_length)
from hf_deepnmt_training.run_length import measure_step_seconds, plan_run_length, steps_per_epoch
from hf_deepnmt_training.train_arguments import apply_scratch_defaults, parse_train_args


def test_the_model_size_follows_the_data_size_and_the_device():
    assert size_class(29_024, "cpu").name == "cpu-small"
    assert size_class(300_000, "cpu").name == "cpu-medium"
    assert size_class(160_000, "gpu").name == "gpu-low-resource"
    assert size_class(4_500_000, "gpu").name == "gpu-base"
    assert size_class(36_000_000, "gpu").name == "gpu-big"
    for table in (CPU_SIZES, GPU_SIZES):  # every model of every row is complete and valid
        for row in table:
            from transformers import AutoConfig

            for model in (row.model, *row.alternatives):
                fields = {key: value for key, value in model.items() if key != "model_type"}
                AutoConfig.for_model(model["model_type"], vocab_size=row.vocab_size, **fields)


def test_the_cpu_row_trains_dtmt1_and_keeps_the_transformer_as_its_alternative():
    """Issue 63: meng2019's DTMT#1 at d_model 128 won on all three corpora at 25 minutes (docs/defaults.md); the 2-6
    pre-LN Transformer it replaced is one --model_type away."""
    small = size_class(29_024, "cpu")
    assert small.model["model_type"] == "dtmt" and small.model["transition_depth"] == 1
    assert (small.model["d_model"], small.model["attention_heads"], small.model["rnn_cell"]) == (128, 4, "lgru")
    assert small.model["init_range"] == 0.23  # the paper's 0.08 at d 1024, scaled by sqrt(1024 / 128)
    assert {small.model[key] for key in DROPOUT_FIELDS["dtmt"]} == {0.0}
    transformer = small.model_for("deep_transformer")
    assert (transformer["encoder_layers"], transformer["decoder_layers"], transformer["d_model"]) == (2, 6, 128)
    assert small.model_for(None) is small.model and small.model_for("admin_transformer") is None
    assert resolve(29_024, "cpu", set(), False, 0, "deep_transformer").model == transformer
    assert resolve(29_024, "cpu", set(), False, 0, "dtmt").model == small.model
    assert resolve(29_024, "cpu", set(), False, 0, "admin_transformer").model == {}  # the type's own defaults
    assert resolve(29_024, "cpu", set(), True, 0).model == {}  # --config_name: its model
    assert resolve(300_000, "cpu", set(), False, 0).model["model_type"] == "deep_transformer"  # not measured


def test_given_options_reads_both_spellings():
    assert given_options(["--learning_rate=1e-4", "--max-steps", "3", "x"]) == {"learning_rate", "max_steps"}


def test_resolve_never_changes_what_the_command_line_set():
    chosen = resolve(29_024, "cpu", given={"learning_rate", "vocab_size"}, model_fields_given=False, max_steps=1400)
    assert "learning_rate" not in chosen.options and "vocab_size" not in chosen.options
    assert chosen.options["warmup_steps"] == 280 and chosen.options["eval_steps"] == 350  # 400, a fifth of 1400
    assert chosen.options["max_tokens"] == 2048 and chosen.model["d_model"] == 128
    short = resolve(29_024, "cpu", given=set(), model_fields_given=True, max_steps=100)
    assert short.model == {} and short.options["warmup_steps"] == 20  # a fifth of a short run at most
    sentences = resolve(29_024, "cpu", given={"per_device_train_batch_size"}, model_fields_given=False, max_steps=0)
    assert "max_tokens" not in sentences.options and sentences.options["eval_steps"] == 1000


def _argv(tmp_path, *extra):
    return ["--train_file", "t.jsonl", "--output_dir", str(tmp_path / "run"), *extra]


def _defaults_run(small_corpus, out, *extra: str) -> list[str]:
    """`deepnmt train` on the small corpus with the NMT defaults, a tiny vocabulary and short lines, plus ``extra``."""
    return ["train", "--train_file", str(small_corpus / "train.jsonl"),
            "--validation_file", str(small_corpus / "valid.jsonl"), "--output_dir", str(out),
            "--vocab_size", "200", "--bpe_min_frequency", "1", "--max_eval_samples", "4",
            "--max_source_length", "48", "--max_target_length", "48", "--report_to", "none", "--disable_tqdm", "true",
            *extra]


def test_from_scratch_without_a_recipe_parses_nmt_defaults(tmp_path):
    model_args, _, args, _ = parse_train_args(_argv(tmp_path, "--validation_file", "v.jsonl"))
    assert model_args.nmt_defaults
    assert args.lr_scheduler_type == "inverse_sqrt" and args.adam_beta2 == 0.98
    assert args.eval_strategy == "steps" and args.predict_with_generate and args.generation_num_beams == 1
    assert args.label_smoothing_factor == 0.1
    # no validation data: nothing to evaluate on
    assert parse_train_args(_argv(tmp_path))[2].eval_strategy == "no"
    # the command line wins
    assert parse_train_args(_argv(tmp_path, "--lr_scheduler_type", "cosine"))[2].lr_scheduler_type == "cosine"


@pytest.mark.parametrize("extra", [["--nmt_defaults", "false"], ["--recipe", "quickstart"],
                                   ["--model_name_or_path", "some/model"], ["--warm_start_from", "some/model"]])
def test_nmt_defaults_only_for_a_new_model_without_a_recipe(tmp_path, extra):
    model_args, _, args, _ = parse_train_args(_argv(tmp_path, *extra))
    assert not model_args.nmt_defaults
    if extra[0] != "--recipe":  # transformers' own defaults
        assert args.lr_scheduler_type == "linear" and args.adam_beta2 == 0.999 and args.learning_rate == 5e-5
    else:  # the recipe's values
        assert args.learning_rate == 0.003 and args.max_steps == 1400


def test_apply_sets_the_data_dependent_defaults_and_prints_them(tmp_path, capsys):
    argv = _argv(tmp_path, "--validation_file", "v.jsonl", "--max_steps", "800", "--learning_rate", "1e-3",
                 "--config_overrides", "d_model=64")
    model_args, data_args, args, recipe = parse_train_args(argv)
    apply_scratch_defaults(model_args, data_args, args, recipe, 29_024, given_options(argv))
    assert args.learning_rate == 1e-3  # given: kept
    assert args.warmup_steps == 160 and args.eval_steps == 200 and args.save_steps == 200
    assert data_args.max_tokens == 2048 and data_args.max_eval_samples == 500 and model_args.vocab_size == 4000
    assert recipe["model"]["model_type"] == "dtmt" and recipe["model"]["transition_depth"] == 1
    printed = capsys.readouterr().err
    assert "NMT defaults for 29,024 pairs on CPU" in printed
    # the model as it will be built, --config_overrides applied
    assert "model: dtmt DTMT#1 (transition depth 1, lgru), d_model 64, 4 heads" in printed
    # the row's other model, one option away (the exportable Transformer)
    assert "; --model_type deep_transformer for the row's deep_transformer 2-6 layers, d_model 128" in printed
    assert "--warmup_steps 160" in printed and "--learning_rate" not in printed  # only what was chosen here
    assert "--lr_scheduler_type inverse_sqrt" in printed


def test_the_dropout_grows_with_the_runs_length_in_passes():
    """The CPU rows' dropout is a step function of the planned passes over the training data, never falling as
    the run grows longer, from the row's dropout (0.0, the quickstart's ~3 passes) up."""
    limits = [below for below, _ in DROPOUT_BY_EPOCHS]
    values = [dropout for _, dropout in DROPOUT_BY_EPOCHS]
    assert limits == sorted(limits) and limits[-1] == float("inf") and values == sorted(values)
    assert dropout_for_epochs(3.0) == CPU_SIZES[0].model["dropout"] == 0.0  # the quickstart: 1400 steps ≈ 3 passes
    for below, dropout in DROPOUT_BY_EPOCHS[:-1]:
        assert dropout_for_epochs(below - 1e-6) == dropout and dropout_for_epochs(below) != dropout
        assert f"{below:g}" in describe_dropout_rule()
    assert dropout_for_epochs(1e6) == values[-1]


def test_the_dropout_is_chosen_by_length_only_where_the_command_line_left_it(tmp_path):
    cases = [((), "cpu", True), (("--config_overrides", "dropout=0.1"), "cpu", False),
             (("--config_overrides", "d_model=64"), "cpu", True), (("--model_type", "dtmt"), "cpu", True),
             (("--config_overrides", "rnn_dropout=0.2"), "cpu", False),  # any of DTMT's dropouts keeps all three
             (("--model_type", "deep_transformer"), "cpu", True), (("--model_type", "admin_transformer"), "cpu", False),
             (("--config_name", "transformer-base"), "cpu", False), ((), "gpu", False)]
    for extra, device, by_length in cases:
        argv = _argv(tmp_path, *extra)
        model_args, data_args, args, recipe = parse_train_args(argv)
        if device == "gpu":
            args.use_cpu = False
            import unittest.mock

            with unittest.mock.patch("torch.cuda.is_available", return_value=True):
                resolution = apply_scratch_defaults(model_args, data_args, args, recipe, 1_000, given_options(argv))
        else:
            resolution = apply_scratch_defaults(model_args, data_args, args, recipe, 1_000, given_options(argv))
        assert resolution.dropout_by_length is by_length, (extra, device)


def test_the_cpu_rows_dtmt_gets_label_smoothing_0_2_and_every_other_model_keeps_0_1(tmp_path, capsys):
    """Issue 63: label smoothing 0.2 on the CPU row's DTMT#1 (docs/defaults.md, "Label smoothing 0.2 for DTMT#1");
    the row's Transformer, a --config_name model, a GPU row and a command line that sets it keep their own."""
    assert LABEL_SMOOTHING_BY_TYPE == {"dtmt": 0.2}

    def smoothing(*extra: str, device: str = "cpu") -> tuple[float, str]:
        argv = _argv(tmp_path, *extra)
        model_args, data_args, args, recipe = parse_train_args(argv)
        import unittest.mock

        with unittest.mock.patch("torch.cuda.is_available", return_value=device == "gpu"):
            args.use_cpu = device == "cpu"
            apply_scratch_defaults(model_args, data_args, args, recipe, 29_024, given_options(argv))
        return args.label_smoothing_factor, capsys.readouterr().err

    value, printed = smoothing()
    assert value == 0.2
    assert "[deepnmt]   --label_smoothing_factor 0.2 (the CPU row's dtmt model's; 0.1 for the others)" in printed
    assert printed.count("--label_smoothing_factor") == 1
    assert smoothing("--config_overrides", "d_model=64")[0] == 0.2  # still the row's DTMT
    assert smoothing("--model_type", "dtmt")[0] == 0.2
    for extra in (("--model_type", "deep_transformer"), ("--config_overrides", "cross_attention_drop_depth=5"),
                  ("--config_name", "transformer-base"), ("--label_smoothing_factor", "0.15")):
        value, printed = smoothing(*extra)
        assert value == (0.15 if "0.15" in extra else 0.1), extra
        assert printed.count("--label_smoothing_factor") == 1 and "(the CPU row's" not in printed, extra
    assert smoothing(device="gpu")[0] == 0.1  # the GPU rows' Transformers
    for extra in (("--nmt_defaults", "false"), ("--recipe", "quickstart")):  # no NMT defaults: parsed, not resolved
        assert parse_train_args(_argv(tmp_path, *extra))[2].label_smoothing_factor == 0.1


def test_a_resumed_run_keeps_its_checkpoints_label_smoothing(tmp_path, tiny_tokenizer, capsys):
    """A run begun at another label smoothing (an older hf_deepnmt's 0.1) goes on with it when resumed."""
    from datasets import Dataset

    import hf_deepnmt_training.train as train_module

    rows = Dataset.from_dict({"input_ids": [[5, 6, 7, 2]] * 40, "attention_mask": [[1] * 4] * 40,
                              "labels": [[8, 9, 2]] * 40, "length": [4] * 40})
    checkpoint = tmp_path / "run" / "checkpoint-100"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps({"dropout": 0.0, "label_smoothing": 0.1}))
    for extra, expected in (((), 0.1), (("--label_smoothing_factor", "0.3"), 0.3)):  # the command line still wins
        argv = _argv(tmp_path, "--max_steps", "50", "--config_overrides", "dropout=0.0", *extra)
        model_args, data_args, args, recipe = parse_train_args(argv)
        defaults = apply_scratch_defaults(model_args, data_args, args, recipe, 40, given_options(argv))
        train_module.resolve_by_length(model_args, data_args, args, recipe, tiny_tokenizer, rows, defaults,
                                       str(checkpoint))
        assert args.label_smoothing_factor == expected
        assert ("--label_smoothing_factor 0.1: the checkpoint's" in capsys.readouterr().err) is (not extra)


def test_steps_per_epoch_counts_the_trainers_batches():
    from hf_deepnmt_training.data import TokenBudgetBatchSampler

    lengths = np.array([10] * 95 + [40] * 5, dtype=np.int32)
    batches = len(TokenBudgetBatchSampler(lengths, 100))
    assert batches == 10 + 3  # 10 pairs of 10 tokens a batch, then 2 + 2 + 1 of 40
    assert steps_per_epoch(lengths, 100, 8, processes=1, accumulation=1) == batches
    assert steps_per_epoch(lengths, 100, 8, processes=2, accumulation=2) == 4  # ceil(13 / 4)
    assert steps_per_epoch(lengths, None, 8, processes=1, accumulation=1) == 13  # sentence batches: ceil(100 / 8)


def test_the_run_length_comes_from_steps_then_the_budget_then_epochs():
    def never() -> float:
        raise AssertionError("a run of known steps must not be measured")

    known = plan_run_length(1400, 10**9, 30.0, 3.0, per_epoch=466, step_seconds=never)
    assert known.steps == 1400 and abs(known.epochs - 1400 / 466) < 1e-9 and known.how == "--max_steps 1400"
    budget = plan_run_length(10**9, 10**9, 30.0, 3.0, per_epoch=178, step_seconds=lambda: 0.5)
    assert budget.steps == 3600 and abs(budget.epochs - 3600 / 178) < 1e-9 and "30-minute budget" in budget.how
    epochs = plan_run_length(-1, 10**9, None, 3.0, per_epoch=178, step_seconds=never)
    assert epochs.epochs == 3.0


def test_measuring_a_step_leaves_the_random_state_alone(tiny_tokenizer):
    """The budget's step time is measured on a throw-away model under a forked random state: the model that then
    trains is initialised exactly as without the measurement."""
    import copy

    from datasets import Dataset

    rows = {"input_ids": [[5, 6, 7, 2]] * 12, "attention_mask": [[1, 1, 1, 1]] * 12, "labels": [[8, 9, 2]] * 12,
            "length": [4] * 12}
    built, initial = [], []

    def build():
        built.append(tiny_model(vocab_size=len(tiny_tokenizer)))
        initial.append(copy.deepcopy(built[-1].state_dict()))
        return built[-1]

    torch.manual_seed(0)
    before = torch.get_rng_state()
    seconds = measure_step_seconds(build, Dataset.from_dict(rows), tiny_tokenizer, np.array(rows["length"]), 8, 8,
                                   seed=0)
    assert seconds > 0 and torch.equal(torch.get_rng_state(), before)
    with pytest.raises(Exception, match="no pairs left"):  # one sentence, not a statistics traceback
        measure_step_seconds(build, Dataset.from_dict({key: [] for key in rows}), tiny_tokenizer,
                             np.array([], dtype=np.int32), 8, 8, seed=0)
    trained = built[0].state_dict()
    assert len(built) == 1 and not all(torch.equal(trained[name], initial[0][name]) for name in trained)  # it stepped


def test_a_long_run_over_little_data_gets_the_dropout_for_many_passes(tmp_path, tiny_tokenizer, capsys):
    from datasets import Dataset

    from hf_deepnmt_training.train import resolve_by_length

    rows = {"input_ids": [[5, 6, 7, 2]] * 40, "attention_mask": [[1] * 4] * 40, "labels": [[8, 9, 2]] * 40,
            "length": [4] * 40}
    for steps, dropout in ((2, DROPOUT_BY_EPOCHS[0][1]), (4000, DROPOUT_BY_EPOCHS[-1][1])):
        argv = _argv(tmp_path, "--max_steps", str(steps))
        model_args, data_args, args, recipe = parse_train_args(argv)
        defaults = apply_scratch_defaults(model_args, data_args, args, recipe, 40, given_options(argv))
        assert defaults.dropout_by_length and not defaults.warmup_by_length  # --max_steps capped the warm-up
        assert resolve_by_length(model_args, data_args, args, recipe, tiny_tokenizer, Dataset.from_dict(rows),
                                 defaults) == {}
        # 40 pairs of 4 tokens: one 2048-token batch a pass; every dropout of the default DTMT gets the rule's value
        assert [recipe["model"][key] for key in DROPOUT_FIELDS["dtmt"]] == [dropout] * 3
        assert f"dropout {dropout}: the run is --max_steps {steps}: ≈ {steps:,} steps = {steps:.1f} passes" \
            in capsys.readouterr().err
    checkpoint = tmp_path / "run" / "checkpoint-100"  # a resumed run keeps the dropout it started with
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps({"dropout": 0.1, "rnn_dropout": 0.1, "readout_dropout": 0.1}))
    resolve_by_length(model_args, data_args, args, recipe, tiny_tokenizer, Dataset.from_dict(rows), defaults,
                      str(checkpoint))
    assert [recipe["model"][key] for key in DROPOUT_FIELDS["dtmt"]] == [0.1] * 3
    assert "dropout 0.1: the checkpoint's, whose run this resumes" in capsys.readouterr().err


def test_the_dtmt_rows_warmup_is_chosen_by_length_only_where_nothing_else_set_it(tmp_path):
    """The warm-up rule of issue 63 (docs/defaults.md, "Label smoothing and warm-up on DTMT#1"): a CPU row's DTMT
    without --warmup_steps, in a run of no --max_steps (whose warm-up `resolve` caps already); the Transformer row
    keeps its warm-up at every budget (issue 41 measured 400 above 200 at ~1,100 steps)."""
    assert WARMUP_BY_LENGTH_TYPES == ("dtmt",) and CPU_SIZES[0].model["model_type"] == "dtmt"
    cases = [(("--max_train_minutes", "10"), True), ((), True),  # --num_train_epochs: a planned length too
             (("--max_train_minutes", "10", "--warmup_steps", "400"), False),
             (("--max_train_minutes", "10", "--max_steps", "2000"), False),
             (("--max_train_minutes", "10", "--model_type", "deep_transformer"), False),
             (("--max_train_minutes", "10", "--config_overrides", "dropout=0.1"), True),  # the dropout is the user's
             (("--max_train_minutes", "10", "--config_name", "transformer-base"), False)]
    for extra, by_length in cases:
        argv = _argv(tmp_path, *extra)
        model_args, data_args, args, recipe = parse_train_args(argv)
        resolution = apply_scratch_defaults(model_args, data_args, args, recipe, 1_000, given_options(argv))
        assert resolution.warmup_by_length is by_length, extra
        assert args.warmup_steps == 400  # the row's (a fifth of --max_steps 2000 too), until the length rule
    assert [warmup_for_length(400, steps) for steps in (3, 1_000, 1_066, 1_999, 2_000, 2_500, 10**9)] == \
        [1, 200, 213, 399, 400, 400, 400]


def test_a_short_budget_gives_dtmt_a_fifth_of_its_steps_as_warmup_and_a_resumed_run_keeps_its_own(
        tmp_path, tiny_tokenizer, capsys, monkeypatch):
    """10 minutes at 0.6 s a step: ≈ 1,000 steps, warm-up 200 (the row's 400 is 2/5 of the run); 25 minutes:
    ≈ 2,500 steps, the row's 400. The choice is returned for the checkpoints; a resumed run takes its checkpoint's
    without measuring, and a checkpoint without one (an older hf_deepnmt's) keeps the row's."""
    from datasets import Dataset

    import hf_deepnmt_training.train as train_module
    from hf_deepnmt_training.checkpoints import RUN_CHOICES, read_run_choices, write_run_choices

    rows = Dataset.from_dict({"input_ids": [[5, 6, 7, 2]] * 40, "attention_mask": [[1] * 4] * 40,
                              "labels": [[8, 9, 2]] * 40, "length": [4] * 40})
    monkeypatch.setattr(train_module, "measure_step_seconds", lambda *a, **k: 0.6)

    def resolved(*extra: str, resume: str | None = None):
        argv = _argv(tmp_path, *extra)
        model_args, data_args, args, recipe = parse_train_args(argv)
        defaults = apply_scratch_defaults(model_args, data_args, args, recipe, 40, given_options(argv))
        train_module.run_until_budget(model_args, args)
        chosen = train_module.resolve_by_length(model_args, data_args, args, recipe, tiny_tokenizer, rows, defaults,
                                                resume)
        return args, recipe, chosen, capsys.readouterr().err

    args, recipe, chosen, printed = resolved("--max_train_minutes", "10")
    assert args.warmup_steps == chosen["warmup_steps"] == 200
    assert "--warmup_steps 200: the row's 400, at most a fifth of the run's ≈ 1,000 steps (a dtmt row's " \
        "rule" in printed
    assert "dropout = rnn_dropout = readout_dropout 0.1: the run is a 10-minute budget" in printed  # 1,000 passes
    args, _, chosen, printed = resolved("--max_train_minutes", "25")
    assert args.warmup_steps == chosen["warmup_steps"] == 400 and "≈ 2,500 steps" in printed
    args, recipe, chosen, printed = resolved("--max_train_minutes", "10", "--config_overrides", "dropout=0.2")
    # the length measured for the warm-up alone: the dropout is the command line's (applied when the model is built)
    assert args.warmup_steps == 200 and "; the run is a 10-minute budget at" in printed and "rnn_dropout" not in printed
    args, _, chosen, printed = resolved("--max_train_minutes", "10", "--model_type", "deep_transformer")
    assert args.warmup_steps == 400 and chosen == {} and "--warmup_steps" not in printed.split("dropout 0.1")[1]

    monkeypatch.setattr(train_module, "measure_step_seconds", lambda *a, **k: pytest.fail("a resumed run measured"))
    checkpoint = tmp_path / "run" / "checkpoint-100"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text(json.dumps({"dropout": 0.1, "rnn_dropout": 0.1, "readout_dropout": 0.1}))
    args, _, chosen, printed = resolved("--max_train_minutes", "10", resume=str(checkpoint))
    assert args.warmup_steps == chosen["warmup_steps"] == 400 and "--warmup_steps 400: the checkpoint's" in printed
    write_run_choices(checkpoint, {"warmup_steps": 180})
    assert read_run_choices(checkpoint) == {"warmup_steps": 180}
    args, _, chosen, printed = resolved("--max_train_minutes", "10", resume=str(checkpoint))
    assert args.warmup_steps == chosen["warmup_steps"] == 180
    (checkpoint / RUN_CHOICES).write_text("[180]")
    with pytest.raises(UserInputError, match=f"{RUN_CHOICES}: holds list, not an object of option values"):
        read_run_choices(checkpoint)


def test_admin_overrides_get_the_post_ln_model_admin_is_defined_on(tmp_path, capsys):
    argv = _argv(tmp_path, "--config_overrides", "residual_scaling=admin")
    model_args, data_args, args, recipe = parse_train_args(argv)
    apply_scratch_defaults(model_args, data_args, args, recipe, 1_000, given_options(argv))
    # ADMIN is a Transformer field: the CPU row's Transformer, not its default DTMT, and post-LN
    assert recipe["model"]["model_type"] == "deep_transformer" and recipe["model"]["layer_norm_position"] == "post"
    assert ("--config_overrides residual_scaling: field(s) of deep_transformer, not of the default dtmt: the size "
            "row's deep_transformer model (as --model_type deep_transformer)") in capsys.readouterr().err


def test_overrides_pick_the_row_model_whose_fields_they_name(tmp_path):
    def model(*extra: str) -> dict:
        argv = _argv(tmp_path, *extra)
        model_args, data_args, args, recipe = parse_train_args(argv)
        apply_scratch_defaults(model_args, data_args, args, recipe, 1_000, given_options(argv))
        return recipe["model"]

    assert model("--config_overrides", "d_model=64,transition_depth=2")["model_type"] == "dtmt"  # DTMT's fields
    chosen = model("--config_overrides", "d_model=64,cross_attention_drop_depth=5")  # li2022's CAD: a Transformer
    assert chosen["model_type"] == "deep_transformer" and chosen["decoder_layers"] == 6
    # a field of no model of the row stays with the default, whose check names it (`check_override_keys`)
    with pytest.raises(Exception, match=r"^--config_overrides: `encoder_layerz` is not a field of DTMTConfig \(dtmt\)"):
        model("--config_overrides", "encoder_layerz=3")


@pytest.mark.integration
def test_train_from_scratch_end_to_end_uses_and_records_the_defaults(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(_defaults_run(small_corpus, out, "--max_steps", "4", "--save_strategy", "no", "--config_overrides",
                              "d_model=16,encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64"))
    assert code == 0
    printed = capsys.readouterr().err
    assert "NMT defaults for 160 pairs" in printed
    config = json.loads((out / "config.json").read_text())
    assert (config["encoder_layers"], config["decoder_layers"], config["d_model"]) == (2, 6, 16)
    assert config["layer_norm_position"] == "pre" and config["label_smoothing"] == 0.1
    args = torch.load(out / "training_args.bin", weights_only=False)
    assert args.learning_rate == 3e-3 and args.lr_scheduler_type == "inverse_sqrt" and args.warmup_steps == 1
    assert args.eval_steps == 1
    # the dropout from the run's length: 4 steps are a pass or two over 160 pairs
    passes = float(re.search(r"dropout [0-9.]+: the run is --max_steps 4: ≈ 4 steps = ([0-9.]+) passes", printed)[1])
    assert passes < 3 and config["dropout"] == dropout_for_epochs(passes) == 0.0
    # translate's length rule for the longest validation source, under the truncation length
    assert f"--generation_max_length {args.generation_max_length} (translate's length rule" in printed
    assert 10 < args.generation_max_length <= 48
    state = json.loads((out / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "eval_bleu" in entry] == [1, 2, 3, 4]


@pytest.mark.integration
def test_the_default_cpu_model_is_dtmt1_with_the_rules_dropout_in_every_dropout(small_corpus, tmp_path, capsys):
    """Issue 63: with nothing but the data, `deepnmt train` on a CPU trains DTMT#1 (docs/defaults.md, "Round two"),
    its three dropouts from the run's length, and the saved folder loads back and translates."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    out = tmp_path / "run"
    assert main(_defaults_run(small_corpus, out, "--max_steps", "3", "--save_strategy", "no", "--config_overrides",
                              "d_model=16,attention_heads=2,max_position_embeddings=64")) == 0
    printed = capsys.readouterr().err
    assert "model: dtmt DTMT#1 (transition depth 1, lgru), d_model 16, 2 heads" in printed
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["transition_depth"], config["rnn_cell"]) == ("dtmt", 1, "lgru")
    assert config["init_range"] == 0.23 and config["label_smoothing"] == 0.2  # the DTMT row's (LABEL_SMOOTHING_BY_TYPE)
    passes = float(re.search(r"dropout = rnn_dropout = readout_dropout ([0-9.]+): the run is --max_steps 3: ≈ 3 "
                             r"steps = ([0-9.]+) passes", printed)[2])
    assert {config[key] for key in DROPOUT_FIELDS["dtmt"]} == {dropout_for_epochs(passes)}
    model = AutoModelForSeq2SeqLM.from_pretrained(out, trust_remote_code=True)
    assert type(model).__name__ == "DTMTForConditionalGeneration"
    batch = AutoTokenizer.from_pretrained(out)(["In the beginning"], return_tensors="pt")
    assert model.generate(**batch, max_new_tokens=4, num_beams=2).shape[0] == 1


@pytest.mark.integration
def test_a_ten_step_run_validates_four_times_and_records_its_best_checkpoint_where_it_is(small_corpus, tmp_path,
                                                                                      capsys):
    """Issue 66 items 6 and 4 through `deepnmt train`: a --max_steps 10 run with the NMT defaults validates at steps
    3, 6, 9 and 10 (it validated five times, from step 2), keeps the best of those, and every trainer_state.json
    names that checkpoint by its final path."""
    out = tmp_path / "run"
    assert main(_defaults_run(small_corpus, out, "--max_steps", "10", "--max_tokens", "600", "--config_overrides",
                              "d_model=16,encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64")) == 0
    printed = capsys.readouterr().err
    state = json.loads((out / "trainer_state.json").read_text())
    evaluations = [entry for entry in state["log_history"] if "eval_bleu" in entry]
    assert [entry["step"] for entry in evaluations] == [3, 6, 9, 10]
    best = max(evaluations, key=lambda entry: entry["eval_bleu"])["step"]  # the first of equal scores
    assert state["best_model_checkpoint"] == str(out / f"checkpoint-{best}")
    for checkpoint in out.glob("checkpoint-*"):
        recorded = json.loads((checkpoint / "trainer_state.json").read_text())["best_model_checkpoint"]
        assert recorded is None or (".incomplete" not in recorded and Path(recorded).is_dir()), recorded
    assert f"kept the best of 4 validations: checkpoint-{best}" in printed and "no --max_steps" not in printed


@pytest.mark.integration
def test_a_dtmt_budget_run_trains_with_the_warmup_it_chose_and_its_checkpoints_keep_it(small_corpus, tmp_path, capsys):
    """The DTMT row's warm-up from a budget's estimated length (docs/defaults.md) is the one the schedule uses, and
    every checkpoint records it for a resumed run (`checkpoints.read_run_choices`)."""
    from hf_deepnmt_training.checkpoints import read_run_choices
    from hf_deepnmt_training.train import train

    outcome = train(_defaults_run(small_corpus, tmp_path / "run", "--max_train_minutes", "0.2", "--save_total_limit",
                                  "10", "--config_overrides", "d_model=16,attention_heads=2,max_position_embeddings=64"
                                  )[1:])
    printed = capsys.readouterr().err
    found = re.search(r"--warmup_steps ([0-9]+): the row's 400, at most a fifth of the run's ≈ ([0-9,]+) steps",
                      printed)
    assert found, printed
    warmup = int(found[1])
    assert warmup == warmup_for_length(400, float(found[2].replace(",", ""))) == outcome.training_args.warmup_steps
    assert "--warmup_steps 400 at most: a fifth of the run's length (below)" in printed
    checkpoints = sorted((tmp_path / "run").glob("checkpoint-*"))
    assert checkpoints and all(read_run_choices(folder) == {"warmup_steps": warmup} for folder in checkpoints)
    scheduler = outcome.trainer.lr_scheduler  # transformers' inverse_sqrt: warm-up to the peak at step `warmup`
    assert scheduler.lr_lambdas[0](warmup) == pytest.approx(1.0) and scheduler.lr_lambdas[0](warmup // 2) < 0.6


@pytest.mark.integration
def test_the_papers_schedule_uses_the_warmup_the_nmt_defaults_chose(small_corpus, tmp_path):
    """meng2019's eq. (17) schedule is built after the NMT defaults set the warm-up: it was built before them, with
    transformers' warm-up 0, while the run printed and its card stated the row's."""
    from hf_deepnmt_training.schedules import rnnplus_warmup_decay
    from hf_deepnmt_training.train import train

    outcome = train(_defaults_run(small_corpus, tmp_path / "run", "--max_steps", "4", "--save_strategy", "no",
                                  "--logging_steps", "1", "--lr_schedule", "rnnplus_warmup_decay", "--lr_replicas", "2",
                                  "--lr_decay_start",
                                  "4", "--lr_decay_end", "8", "--config_overrides",
                                  "d_model=16,attention_heads=2,max_position_embeddings=64")[1:])
    assert outcome.training_args.warmup_steps == 1  # the row's 400, at most a fifth of --max_steps 4
    logged = [entry["learning_rate"] for entry in outcome.trainer.state.log_history if "learning_rate" in entry]
    assert logged == pytest.approx([3e-3 * rnnplus_warmup_decay(t, 1, 4, 8, 2) for t in range(4)], rel=1e-6)
    assert logged[0] == pytest.approx(3e-3)  # warm-up 0 would have started at the peak, 2 × 3e-3


def test_parse_time_defaults_are_real_training_arguments():
    from transformers import Seq2SeqTrainingArguments

    fields = set(Seq2SeqTrainingArguments.__dataclass_fields__)
    assert set(PARSE_TIME_DEFAULTS) <= fields


@pytest.mark.integration
def test_max_train_minutes_stops_training_at_the_budget(small_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *train_argv(small_corpus, out, "--max_steps", "50", "--max_train_minutes", "0.0001")]) == 0
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 1  # the first step already ends past a 6 ms budget; the run still finishes
    assert (out / "model.safetensors").exists() and (out / "metrics.json").exists()
    for bad in ("0", "nan"):  # refused before any data is read or a tokenizer trained
        code = main(["train", *train_argv(small_corpus, tmp_path / "bad", "--max_train_minutes", bad)])
        assert code == 2
        assert f"`--max_train_minutes` = {float(bad)!r} is not allowed; use a positive number of minutes." \
            in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
    for bad in ("1.5", "-0.1"):  # refused at the command line, not by the model config once the data is read
        assert main(["train", *train_argv(small_corpus, tmp_path / "bad", "--label_smoothing_factor", bad)]) == 2
        assert f"`--label_smoothing_factor` = {float(bad)!r} is not allowed; use a number in [0, 1)" \
            in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()


def test_train_help_names_the_defaults_the_paper_switches_recipes_and_presets(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "A new model without --recipe gets NMT defaults" in text and "docs/defaults.md" in text
    assert "li2022: cross_attention_drop_depth=0, cross_attention_drop_ratio=0.0, ddr_weight=0.0" in text
    assert "liu2020: residual_scaling=none" in text and "dou2018: encoder_layer_aggregation=none" in text
    assert "meng2019: rnn_cell=lgru, transition_depth=4" in text
    assert "quickstart" in text.split("Recipes (--recipe NAME):")[1].split("Presets")[0]
    assert "transformer-base" in text.split("Presets (--config_name NAME):")[1]


@pytest.mark.integration
def test_a_budget_run_validates_by_the_clock_and_keeps_its_best_checkpoint(small_corpus, tmp_path, capsys):
    """--max_train_minutes without --max_steps: validation every quarter of the budget (not every 1000 steps, which a
    short budget never reaches), the best checkpoint by validation BLEU is the saved and tested model, and the run
    says which one it kept."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    code = main(["train", "--train_file", str(small_corpus / "train.jsonl"),
                 "--validation_file", str(small_corpus / "valid.jsonl"), "--output_dir", str(out),
                 "--max_train_minutes", "0.3", "--vocab_size", "200", "--bpe_min_frequency", "1",
                 "--max_eval_samples", "8", "--max_source_length", "48", "--max_target_length", "48",
                 "--report_to", "none", "--disable_tqdm", "true", "--save_total_limit", "10",
                 "--config_overrides", "d_model=16,encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64"])
    assert code == 0
    printed = capsys.readouterr().err
    # it says so at start, instead of the --eval_steps 1000 / --save_steps 1000 that it never reaches
    assert "--eval_steps, --save_steps: none; a validation and a checkpoint at every quarter of --max_train_minutes, " \
           "by the clock" in printed
    assert "--eval_steps 1000" not in printed and "--save_steps 1000" not in printed
    args = torch.load(out / "training_args.bin", weights_only=False)
    assert args.load_best_model_at_end and args.metric_for_best_model == "bleu" and args.greater_is_better
    state = json.loads((out / "trainer_state.json").read_text())
    evaluations = [entry for entry in state["log_history"] if "eval_bleu" in entry]
    assert 3 <= len(evaluations) <= 6, evaluations  # a quarter of the budget apart, and one at its end
    # the dropout from the budget's length in passes, at a step time measured before training
    found = re.search(r"dropout ([0-9.]+): the run is a 0.3-minute budget at ([0-9.]+) s a step .*?: ≈ ([0-9,]+) steps = "
                      r"([0-9.]+) passes", printed)
    assert found, printed
    assert json.loads((out / "config.json").read_text())["dropout"] == float(found[1]) == dropout_for_epochs(
        float(found[4]))
    steps, seconds = float(found[3].replace(",", "")), float(found[2])  # 18 s of steps; 3 significant digits
    assert abs(steps * seconds - 18.0) <= 0.01 * 18.0 + seconds
    assert state["max_steps"] == UNBOUNDED_STEPS  # the budget, not --num_train_epochs, ends the run
    best = max(evaluations, key=lambda entry: entry["eval_bleu"])
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{best['step']}")
    assert f"kept the best of {len(evaluations)} validations: checkpoint-{best['step']}" in printed
    saved, kept = load_file(out / "model.safetensors"), load_file(Path(state["best_model_checkpoint"]) /
                                                                  "model.safetensors")
    assert all(torch.equal(saved[name], kept[name]) for name in kept)


def test_train_help_shows_what_a_new_models_run_uses(capsys):
    """Issue 66 item 5: `deepnmt train --help` said its (default: ...) values were those of a new model's run and
    listed --learning_rate 5e-05, --warmup_steps 0 and --vocab_size 8000 where the run used 0.003, 400 and 4000.
    Each option the NMT defaults choose from the data says so, with the size rows' values, before the parser's own
    default, which only a run without the NMT defaults keeps."""
    from hf_deepnmt_training.defaults import resolved_option_rules

    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    options = re.split(r" (?=--[a-z_]+ [A-Z_{\[])", text)

    def help_of(name: str) -> str:
        return next(entry for entry in options if entry.startswith(f"--{name} "))

    row = size_class(20_000, "cpu")
    where = "where the NMT defaults do not apply: --nmt_defaults false, --recipe, --model_name_or_path)"
    assert f"NMT default of a new model without --recipe: CPU {row.learning_rate:g} below 200,000 pairs" in \
        help_of("learning_rate") and f"(default: 5e-05 {where}" in help_of("learning_rate")
    assert f"CPU {row.warmup_steps} below 200,000 pairs" in help_of("warmup_steps") and \
        "at most a fifth of --max_steps" in help_of("warmup_steps") and \
        "dtmt at most a fifth of the steps planned without it" in help_of("warmup_steps") and \
        f"(default: 0 {where}" in help_of("warmup_steps")
    assert f"CPU {row.vocab_size:,} below 200,000 pairs" in help_of("vocab_size") and \
        "unused when --tokenizer_name gives the tokenizer" in help_of("vocab_size")
    assert "--max_steps / 4 rounded up (four validations" in help_of("eval_steps")
    for name in resolved_option_rules():
        assert "NMT default of a new model without --recipe" in help_of(name), name
    assert "The (default: ...) values below are those of such a run" not in text
    assert "every other (default: ...) below is that of such a run" in text


def test_a_run_of_known_length_validates_four_times_the_last_at_its_end():
    """Issue 66 item 6: a --max_steps 10 run validated five times (every 2 steps: 10 // 4), where docs/defaults.md
    says four, and kept checkpoint-2 as its best. --eval_steps is --max_steps / 4 rounded up; transformers also
    validates the last step, so a run of 10 steps or more validates exactly four times (at 3, 6, 9, 10 for 10) and
    never more, the first a quarter into the run."""
    def validations(max_steps: int) -> list[int]:
        every = resolve(1000, "cpu", set(), False, max_steps).options["eval_steps"]
        return sorted({step for step in range(every, max_steps + 1, every)} | {max_steps})

    assert validations(10) == [3, 6, 9, 10]
    assert all(len(validations(steps)) == 4 for steps in range(10, 600))
    assert all(len(validations(steps)) <= 4 and validations(steps)[0] >= steps / 4 for steps in range(1, 600))


def test_a_run_on_a_given_tokenizer_chooses_no_vocabulary_size(tmp_path, capsys):
    """Issue 66 item 6: a run with --tokenizer_name (an ensemble member trained on another model's tokenizer) trains
    no BPE, so the NMT defaults choose no --vocab_size and the run does not print one."""
    assert "vocab_size" not in resolve(1000, "cpu", {"tokenizer_name"}, False, 100).options
    argv = _argv(tmp_path, "--max_steps", "100", "--tokenizer_name", str(tmp_path))
    model_args, data_args, args, recipe = parse_train_args(argv)
    apply_scratch_defaults(model_args, data_args, args, recipe, 29_024, given_options(argv))
    printed = capsys.readouterr().err
    assert "NMT defaults for 29,024 pairs" in printed and "--vocab_size" not in printed


def test_overrides_are_checked_before_the_data_against_the_model_the_defaults_will_build(tmp_path):
    """`deepnmt train` checks --config_overrides before it reads the data or trains a tokenizer: against the size
    row's model they name (DTMT's fields pass, the Transformer's pick it), and a field of no such model fails."""
    from hf_deepnmt_training.train_arguments import provisional_row_model

    def provisional(*extra: str) -> dict:
        model_args, _, args, _ = parse_train_args(_argv(tmp_path, "--use_cpu", "true", *extra))
        return provisional_row_model(model_args, args)

    assert provisional("--config_overrides", "attention_heads=2")["model_type"] == "dtmt"
    assert provisional("--config_overrides", "encoder_ffn_dim=32")["model_type"] == "deep_transformer"
    assert provisional("--model_type", "deep_transformer")["decoder_layers"] == 6
    assert provisional("--config_name", "transformer-base") == {} and provisional("--nmt_defaults", "false") == {}


def test_an_override_typo_is_named_with_the_close_fields_of_every_model_the_defaults_may_build(tmp_path):
    """The CPU defaults build DTMT#1 or, for its fields, the Transformer: a misspelt Transformer field is suggested
    from the Transformer's fields, not only DTMT's (`encoder_layer` is not "is_encoder_decoder")."""
    from hf_deepnmt_training.train_arguments import provisional_row_model

    def provisional(overrides: str) -> dict:
        model_args, _, args, _ = parse_train_args(_argv(tmp_path, "--use_cpu", "true", "--config_overrides", overrides))
        return provisional_row_model(model_args, args)

    with pytest.raises(Exception, match=r"^--config_overrides: `encoder_layer` is a field of no model the NMT "
                                        r"defaults build here \(dtmt, deep_transformer\); did you mean encoder_layers"):
        provisional("encoder_layer=4")
    with pytest.raises(Exception, match=r"`encoder_layers`, `transition_depth` are not fields of one model .*"
                                        r"--model_type"):
        provisional("encoder_layers=4,transition_depth=2")
