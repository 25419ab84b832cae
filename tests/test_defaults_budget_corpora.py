"""Issue 63's defaults study on three corpora (benchmarks/experiments/defaults_budget.py): the commands it runs on
each corpus, the verdict that lets a paper's mechanism into the defaults, and the leave-one-corpus-out check."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks.experiments import defaults_budget as db


def arguments(**overrides: object) -> argparse.Namespace:
    return argparse.Namespace(**{"source_lang": "es", "target_lang": "en", "test_samples": 500, **overrides})


def test_each_corpus_runs_the_users_command_in_its_own_direction_and_test_set(tmp_path: Path) -> None:
    bible = db.train_arguments(arguments(), db.TRAIN, tmp_path / "b", "25", "defaults")
    gettext = db.train_arguments(arguments(), "runs/corpora/gettext-en-de/train.jsonl.gz", tmp_path / "g", "25",
                                 "dou2018-dense", "gettext-en-de")

    def option(command: list[str], name: str) -> str | None:
        return command[command.index(name) + 1] if name in command else None

    # the Bible keeps issue 41's command (its runs stay comparable): es→en, 500 test verses, seed 1
    assert (option(bible, "--source_lang"), option(bible, "--target_lang")) == ("es", "en")
    assert option(bible, "--max_predict_samples") == "500" and option(bible, "--seed") == "1"
    assert option(bible, "--test_file") == db.TEST and "--config_overrides" not in bible
    # a software-message corpus: its own direction and files, every test pair, seed 42, and the row's options
    assert (option(gettext, "--source_lang"), option(gettext, "--target_lang")) == ("en", "de")
    assert option(gettext, "--test_file") == "runs/corpora/gettext-en-de/test.jsonl.gz"
    assert option(gettext, "--validation_file") == "runs/corpora/gettext-en-de/valid.jsonl.gz"
    assert "--max_predict_samples" not in gettext and option(gettext, "--seed") == "42"
    assert option(gettext, "--config_overrides") == "encoder_layer_aggregation=dense,decoder_layer_aggregation=dense"
    # the Bible's runs keep their names; the others carry their corpus
    assert db.run_name("full", "25", "defaults") == "full-25min-defaults"
    assert db.run_name("full", "25", "cad", "gettext-en-es") == "gettext-en-es-full-25min-cad"


def test_a_missing_corpus_names_the_command_that_builds_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no runs/corpora here
    with pytest.raises(SystemExit, match=r"gettext-en-es: runs/corpora/gettext-en-es/train\.jsonl\.gz does not exist; "
                                         r"build it with: python training/corpus/build_gettext_corpus\.py --language es"):
        db.corpus(tmp_path, "full", "gettext-en-es")


def test_a_mechanism_enters_the_defaults_only_where_it_wins_by_half_a_point_on_two_corpora() -> None:
    scores = {
        "bible": {"defaults": 17.0, "cad": 17.6, "dou2018-dense": 17.4, "admin-6-6": 16.0},
        "gettext-en-es": {"defaults": 34.0, "cad": 34.5, "dou2018-dense": 35.0, "admin-6-6": 34.6},
        "gettext-en-de": {"defaults": 26.0, "cad": 25.0, "dtmt1": 20.0},
    }
    verdicts = db.mechanism_verdicts(scores, list(db.CORPORA))
    assert verdicts["cad"] == {"deltas": {"bible": 0.6, "gettext-en-es": 0.5, "gettext-en-de": -1.0}, "wins": 2,
                               "verdict": "enters"}  # exactly 0.5 counts
    assert verdicts["dou2018-dense"]["wins"] == 1 and verdicts["dou2018-dense"]["verdict"] == "open"  # de unmeasured
    assert verdicts["admin-6-6"]["verdict"] == "open"
    assert verdicts["dtmt1"]["verdict"] == "open"  # one loss, two corpora left that could still be wins
    scores["bible"]["dtmt1"] = 17.0
    assert db.mechanism_verdicts(scores, list(db.CORPORA))["dtmt1"]["verdict"] == "stays out"  # two losses of three


def test_leave_one_corpus_out_picks_a_rule_on_two_corpora_and_scores_it_on_the_third() -> None:
    scores = {
        "a": {"defaults": 10.0, "ls0.2": 10.8, "vocab8000": 9.0},
        "b": {"defaults": 20.0, "ls0.2": 20.9, "vocab8000": 21.0},
        "c": {"defaults": 30.0, "ls0.2": 28.5, "vocab8000": 30.2},
    }
    result = db.leave_one_corpus_out(scores, ["defaults", "ls0.2", "vocab8000"])
    # held out a: on b and c, vocab8000's worst distance to the best is 0 → picked; on a it is 1.8 below ls0.2
    assert result["a"] == {"picked": "vocab8000", "gap": -1.8, "best_row": "ls0.2"}
    # held out b: on a and c, defaults' worst distance is 0.8 (a), ls0.2's 1.7 (c), vocab8000's 1.8 (a)
    assert result["b"] == {"picked": "defaults", "gap": -1.0, "best_row": "vocab8000"}
    assert result["c"]["picked"] == "ls0.2" and result["c"]["gap"] == -1.7
    # a row not measured on every corpus does not compete (held out a: defaults' worst distance 0.9, ls0.2's 1.5),
    # and fewer than three corpora give no check
    del scores["c"]["vocab8000"]
    assert db.leave_one_corpus_out(scores, ["defaults", "ls0.2", "vocab8000"])["a"] == {
        "picked": "defaults", "gap": -0.8, "best_row": "ls0.2"}
    assert db.leave_one_corpus_out({"a": scores["a"], "b": scores["b"]}, ["defaults", "ls0.2"]) == {}
    assert db.leave_one_corpus_out(scores, ["defaults"]) == {}  # one row is no choice


def test_the_transformer_defaults_become_their_row_and_dtmt1_at_the_rules_dropout_the_defaults() -> None:
    """Issue 63 switched the CPU defaults to DTMT#1: the recorded `defaults` runs that trained the Transformer are the
    `transformer` row's (the same training as --model_type deep_transformer), a DTMT#1 run at the dropout the
    run-length rule gives its passes was the new defaults' (at label smoothing 0.1: the `dtmt1-ls0.1` row's since
    the defaults' DTMT#1 takes 0.2), and issue 41's page keeps comparing with the Transformer."""
    def run(row: str, bleu: float, corpus: str, passes: float, **model: object) -> dict:
        # 3,000 steps in 1,500 s at 0.5 s a step: the rule's estimate is the run's own passes (and the DTMT warm-up
        # rule's a fifth of 3,000 steps is more than the row's 400)
        return {"row": row, "corpus": corpus, "size": "full", "budget_minutes": 25.0, "test": {"bleu": bleu},
                "steps": 3000, "passes": passes, "step_seconds": 0.5, "model": model}

    report = {"runs": {
        "gettext-en-es-full-25min-defaults": run("defaults", 34.0, "gettext-en-es", 9.0, encoder_layers=2,
                                                 dropout=0.1),
        "gettext-en-es-full-25min-dtmt1-lr3e-3-dropout0.1": run("dtmt1-lr3e-3-dropout0.1", 41.0, "gettext-en-es",
                                                                9.0, dropout=0.1),
        "full-25min-defaults": {**run("defaults", 15.0, "bible", 4.4, encoder_layers=2, dropout=0.0),
                                "rule": {"dropout": 0.0}},
        # at 9 passes the rule gives 0.1, not this row's 0.0: not the defaults' training
        "full-25min-dtmt1-lr3e-3-dropout0.0": run("dtmt1-lr3e-3-dropout0.0", 17.0, "bible", 9.0, dropout=0.0),
    }}
    for entry in report["runs"].values():
        entry["warmup_steps"] = db.WARMUP_NOW
        if entry["row"] == "defaults":  # the Transformer defaults' runs printed the rule's line
            entry.setdefault("rule", {"dropout": 0.1})
    runs = db.migrate(report)["runs"]
    assert runs["gettext-en-es-full-25min-transformer"]["test"]["bleu"] == 34.0
    # the defaults' training from then to the label-smoothing rule (2026-12-07): the `dtmt1-ls0.1` row since
    before = "gettext-en-es-full-25min-dtmt1-ls0.1"
    assert runs[before]["test"]["bleu"] == 41.0 and "dtmt1-lr3e-3-dropout0.1 run" in runs[before]["ran_as"]
    assert "to the label-smoothing rule (2026-12-07)" in runs[before]["ran_as"]
    assert runs["full-25min-transformer"]["test"]["bleu"] == 15.0 and "full-25min-defaults" not in runs
    assert db.run_model_type(runs[before]) == "dtmt" and "gettext-en-es-full-25min-defaults" not in runs
    # once more, as every study command does on load: nothing moves (a DTMT#1 copy has no rule line, yet it is not
    # the `dropout0.0` row of the defaults before that rule)
    again = db.migrate({"runs": {name: dict(entry) for name, entry in runs.items()}})["runs"]
    assert sorted(again) == sorted(runs) and again[before]["test"]["bleu"] == 41.0
    view = db.issue41_view(runs)  # the Transformer in the defaults' column, DTMT#1's defaults left out
    assert view["full-25min-defaults"]["test"]["bleu"] == 15.0 and "full-25min-transformer" not in view
    assert view["gettext-en-es-full-25min-defaults"]["test"]["bleu"] == 34.0
    # the mechanisms are judged against the defaults they were added to: the Transformer
    scores = {"gettext-en-es": {"defaults": 41.0, "transformer": 34.0, "cad": 34.6}}
    assert db.mechanism_verdicts(scores, ["gettext-en-es"], ("cad",))["cad"]["deltas"] == {"gettext-en-es": 0.6}


def test_the_results_page_names_every_invocation_of_the_study_not_only_the_last() -> None:
    # a report from before the list was kept has only its last command; each new invocation is added once, in order
    old = {"command": "python -m benchmarks.experiments.defaults_budget --budgets 25"}
    kept = db.invocations(old, "python -m benchmarks.experiments.defaults_budget --budgets 10")
    assert kept == [old["command"], "python -m benchmarks.experiments.defaults_budget --budgets 10"]
    assert db.invocations({"commands": kept}, kept[0]) == kept
    assert db.invocations({}) == []


def test_the_rules_sweep_rows_change_one_rule_of_the_defaults_dtmt1() -> None:
    # issue 41's `ls0.2`, `vocab2000`, ... runs on the Bible trained the Transformer: the sweep on DTMT#1 has its own
    # rows, each pinning the defaults' DTMT (--model_type dtmt) and changing one rule of the defaults they were
    # measured against: the label-smoothing rows that of the defaults before 0.2 (2026-12-07), the others, measured
    # then, pin that 0.1 beside their rule, so that another seed of theirs trains what the first did
    sweep = [row for row in db.ROWS if row.startswith("dtmt1-") and not row.startswith("dtmt1-lr")
             and row not in db.TWO_RULES]
    assert {"dtmt1-ls0.2", "dtmt1-ls0.1", "dtmt1-warmup800", "dtmt1-vocab8000", "dtmt1-d192"} <= set(sweep)
    for row in sweep:
        options = db.ROWS[row]
        assert options[:2] == ["--model_type", "dtmt"], row
        if row.startswith("dtmt1-ls"):
            assert len(options) == 4 and options[2] == "--label_smoothing_factor", row
        elif row in db.SINCE_LS_RULE:  # measured on today's defaults: their label smoothing
            assert len(options) == 4 and "--label_smoothing_factor" not in options, row
        else:
            assert len(options) == 6 and options[4:] == ["--label_smoothing_factor", "0.1"], row
    for row, options in db.ROWS.items():  # every DTMT row measured before the rule pins the 0.1 it trained with
        if "dtmt" in options and row not in db.SINCE_LS_RULE:
            assert "--label_smoothing_factor" in options, row
    # the width row scales the init range as the defaults' does: meng2019's ±0.08 at d 1024 times sqrt(1024 / d)
    assert db.ROWS["dtmt1-d192"][3] == "d_model=192,init_range=0.18" and round(0.08 * (1024 / 192) ** 0.5, 2) == 0.18
    assert db.ROWS["dtmt1-d96"][3] == "d_model=96,init_range=0.26" and round(0.08 * (1024 / 96) ** 0.5, 2) == 0.26


def test_a_cell_run_at_other_seeds_is_named_by_its_seed_and_scored_by_the_mean(tmp_path: Path) -> None:
    # --seeds: the corpus's own seed keeps the run's name, another one is added to it and to the command
    assert db.run_name("full", "10", "defaults", "bible", 1) == "full-10min-defaults"
    assert db.run_name("full", "10", "defaults", "bible", 2) == "full-10min-defaults-seed2"
    assert db.run_name("full", "10", "defaults", "gettext-en-es", 42) == "gettext-en-es-full-10min-defaults"
    command = db.train_arguments(arguments(), db.TRAIN, tmp_path / "b", "10", "defaults", "bible", 2)
    assert command[command.index("--seed") + 1] == "2"
    args = argparse.Namespace(**vars(arguments()), average_last=0)
    recorded = {"full-10min-defaults": {"row": "defaults", "size": "full", "budget_minutes": 10.0, "test": {"bleu": 9}}}
    todo, averaging = db.planned_runs(args, {"runs": recorded}, tmp_path, ["defaults"], ["bible"], ["full"], ["10"],
                                      [1, 2, 3])
    # the recorded seed is not trained again; the others are, each recording its seed
    assert [(name, key.get("seed")) for name, _, _, key in todo] == [("full-10min-defaults-seed2", 2),
                                                                     ("full-10min-defaults-seed3", 3)]
    assert averaging == []
    # the tables score a cell by the mean of its seeds, the corpus's own seed's run first
    runs = {
        "full-10min-defaults-seed2": {"row": "defaults", "size": "full", "budget_minutes": 10.0, "seed": 2,
                                      "test": {"bleu": 10.0}, "steps": 800},
        "full-10min-defaults": {"row": "defaults", "size": "full", "budget_minutes": 10.0, "test": {"bleu": 8.94},
                                "steps": 778},
        "full-10min-transformer": {"row": "transformer", "size": "full", "budget_minutes": 10.0,
                                   "test": {"bleu": 10.59}},
        "full-25min-defaults": {"row": "defaults", "size": "full", "budget_minutes": 25.0, "test": {"bleu": 17.09}},
    }
    assert db.corpus_scores(runs, 10.0) == {"bible": {"defaults": 9.47, "transformer": 10.59}}
    assert [run["steps"] for run in db.cell_runs(runs, 10.0, "defaults", "bible")] == [778, 800]
    runs["gettext-en-es-full-10min-defaults"] = {"row": "defaults", "corpus": "gettext-en-es", "size": "full",
                                                 "budget_minutes": 10.0, "test": {"bleu": 32.11}, "steps": 985}
    table = "\n".join(db.corpora_section(runs, dict(db.ROWS)))
    assert "| `defaults` | 9.47 (mean of 2 seeds: 8.94 / 10.0), 778 / 800 steps | 32.11, 985 steps |" in table


def test_issue41s_transformer_runs_are_the_first_seed_of_the_rows_that_pin_their_model_and_warmup() -> None:
    """Issue 41's `dropout0.0` and `ls0.2` runs trained the Transformer at warm-up 200 (the defaults of that time):
    where their dropout is the one the run-length rule gives them, they are the seed-1 runs of the rows that pin that
    training (so that another seed trains the same thing, not DTMT#1); the issue-63 table shows each run once, under
    its row of now, and says which of the rows it shows trained the Transformer; issue 41's tables keep only its
    own rows."""
    def run(row: str, bleu: float, passes: float, dropout: float, **extra: object) -> dict:
        # 1,000 steps in 600 s at 0.6 s a step: the rule's estimate is the run's own passes
        return {"row": row, "size": "full", "budget_minutes": 10.0, "test": {"bleu": bleu}, "steps": 1000,
                "passes": passes, "step_seconds": 0.6, "command": f"deepnmt train --{row} {passes}",
                "model": {"encoder_layers": 2, "decoder_layers": 6, "dropout": dropout}, **extra}

    report = {"runs": {
        "full-10min-dropout0.0": run("dropout0.0", 10.67, 2.2, 0.0),
        "full-10min-ls0.2": run("ls0.2", 10.46, 2.1, 0.0),
        "full-10min-dropout0.1": run("dropout0.1", 8.93, 2.0, 0.1),  # not the rule's dropout at 2 passes
        "10000-10min-dropout0.0": {**run("dropout0.0", 8.7, 6.2, 0.0), "size": "10000"},  # the rule gives 0.1
        "20000-10min-ls0.2": {**run("ls0.2", 11.0, 3.2, 0.0), "size": "20000", "warmup_steps": 400},
        "full-10min-dtmt1-ls0.0": run("dtmt1-ls0.0", 9.0, 1.8, 0.0, corpus="bible"),
        "full-10min-transformer-warmup200-seed2": {**run("transformer-warmup200", 8.8, 2.1, 0.0), "seed": 2,
                                                   "command": "deepnmt train --seed 2"},
    }}
    runs = db.migrate(report)["runs"]
    assert runs["full-10min-transformer-warmup200"]["test"]["bleu"] == 10.67
    assert "dropout0.0 run of issue 41" in runs["full-10min-transformer-warmup200"]["ran_as"]
    assert runs["full-10min-transformer-warmup200-ls0.2"]["test"]["bleu"] == 10.46
    assert "10000-10min-transformer-warmup200" not in runs and "20000-10min-transformer-warmup200-ls0.2" not in runs
    assert db.ROWS["transformer-warmup200-ls0.2"][:4] == ["--model_type", "deep_transformer", "--warmup_steps", "200"]
    # the cell is scored by the mean of both seeds of the row that pins the Transformer
    assert db.corpus_scores(runs, 10.0)["bible"]["transformer-warmup200"] == round((10.67 + 8.8) / 2, 2)
    runs["gettext-en-es-full-10min-defaults"] = {**run("defaults", 32.1, 3.0, 0.0), "corpus": "gettext-en-es",
                                                 "model": {"model_type": "dtmt", "dropout": 0.0}}
    runs["full-10min-defaults"] = {**runs["gettext-en-es-full-10min-defaults"], "corpus": "bible", "test": {"bleu": 9}}
    table = [line for line in db.corpora_section(runs, dict(db.ROWS)) if line.startswith("| `")]
    assert not any(line.startswith(("| `dropout0.0`", "| `ls0.2`")) for line in table)  # shown under their rows of now
    assert any(line.startswith("| `transformer-warmup200` | 9.73 (+0.73) (mean of 2 seeds: 10.67 / 8.8)")
               for line in table)
    assert any(line.startswith("| `dropout0.1` (on the Transformer) | 8.93") for line in table)
    assert any(line.startswith("| `dtmt1-ls0.0` | 9.0") for line in table)
    view = db.issue41_view({name: entry for name, entry in runs.items() if entry.get("corpus", "bible") == "bible"})
    assert {entry["row"] for entry in view.values()} == {"dropout0.0", "dropout0.1", "ls0.2"}


def test_the_dtmt_defaults_at_warmup_400_where_the_rule_now_chooses_less_are_the_dtmt1_warmup400_row(
        tmp_path: Path) -> None:
    """Since the DTMT warm-up rule (2026-11-29: the row's 400, at most a fifth of the estimated steps) a `defaults`
    run of DTMT#1 at warm-up 400 whose estimate was under 2,000 steps is not today's defaults: its folder is set aside
    before the cell's defaults train again, and its record is the `dtmt1-warmup400` row's (seed kept); where the rule
    still gives 400 (25 minutes), or the run chose by the rule, it stays."""
    def rule(steps: str) -> str:
        return ("[deepnmt]   dropout = rnn_dropout = readout_dropout 0.0: the run is a 10-minute budget at 0.5 s "
                f"a step (…): ≈ {steps} steps = 3.7 passes over the training data (289 steps each); …")

    new_log = ("[deepnmt]   --warmup_steps 400 at most: a fifth of the run's length (below)\n" + rule("1,066") +
               "\n[deepnmt]   --warmup_steps 213: the row's 400, at most a fifth of the run's ≈ 1,066 steps (a dtmt "
               "row's rule, docs/defaults.md)\n")
    smoothing = "[deepnmt]   --label_smoothing_factor 0.2 (the CPU row's dtmt model's; 0.1 for the others)\n"
    logs = {"a-10min-defaults": "[deepnmt]   --warmup_steps 400\n" + rule("1,066"),
            "a-25min-defaults": "[deepnmt]   --warmup_steps 400\n" + rule("2,665") + "\n" + smoothing,
            "b-10min-defaults": new_log + smoothing}  # today's label smoothing: only the warm-up is at stake here
    for name, text in logs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text("{}")
        (tmp_path / name / "config.json").write_text('{"model_type": "dtmt"}')
        (tmp_path / f"{name}.log").write_text(text)
    assert db.warmup_of([], new_log) == 213 and db.warmup_of([], logs["a-10min-defaults"]) == 400
    assert db.set_aside_before_rule(tmp_path, "a-10min-defaults")
    assert (tmp_path / "a-10min-defaults-warmup400" / "metrics.json").is_file()
    assert (tmp_path / "a-10min-defaults-warmup400.log").is_file() and not (tmp_path / "a-10min-defaults").exists()
    assert not db.set_aside_before_rule(tmp_path, "a-25min-defaults")
    assert not db.set_aside_before_rule(tmp_path, "b-10min-defaults")
    # a `defaults` folder of the Transformer (the defaults before issue 63) is set aside too: it is not today's
    (tmp_path / "b-10min-defaults" / "config.json").write_text('{"model_type": "deep_transformer"}')
    assert db.set_aside_before_rule(tmp_path, "b-10min-defaults")
    assert (tmp_path / "b-10min-defaults-transformer" / "metrics.json").is_file()

    def run(row: str, bleu: float, budget: float, steps: str, warmup: int, **extra: object) -> dict:
        return {"row": row, "corpus": "gettext-en-es", "size": "full", "budget_minutes": budget,
                "test": {"bleu": bleu}, "steps": 1000, "passes": 3.4, "step_seconds": 0.57, "warmup_steps": warmup,
                "rule": {"dropout": 0.0, "passes": 3.7, "line": rule(steps)}, "model": {"model_type": "dtmt"},
                "command": f"deepnmt train --{row} {bleu}", **extra}

    report = {"runs": {
        "gettext-en-es-full-10min-defaults": run("defaults", 32.11, 10.0, "1,066", 400),
        "gettext-en-es-full-10min-defaults-seed2": run("defaults", 26.5, 10.0, "1,208", 400, seed=2),
        "gettext-en-es-full-25min-defaults": run("defaults", 41.3, 25.0, "2,665", 400, label_smoothing=0.2),
        # DTMT#1 at the rule's dropout, warm-up 400 (no rule line: its dropout was given): the defaults of before
        "gettext-en-es-full-10min-dtmt1-lr3e-3-dropout0.0": {**run("dtmt1-lr3e-3-dropout0.0", 32.11, 10.0, "", 400),
                                                             "rule": None},
    }}
    runs = db.migrate(report)["runs"]
    assert runs["gettext-en-es-full-10min-dtmt1-warmup400"]["test"]["bleu"] == 32.11
    assert "before the DTMT warm-up rule" in runs["gettext-en-es-full-10min-dtmt1-warmup400"]["ran_as"]
    assert runs["gettext-en-es-full-10min-dtmt1-warmup400-seed2"]["seed"] == 2
    assert "gettext-en-es-full-10min-defaults" not in runs and "gettext-en-es-full-10min-defaults-seed2" not in runs
    assert runs["gettext-en-es-full-25min-defaults"]["test"]["bleu"] == 41.3  # ≈ 2,665 steps: the rule gives 400
    assert db.estimated_steps(runs["gettext-en-es-full-10min-dtmt1-lr3e-3-dropout0.0"]) == pytest.approx(600 / 0.57)
    assert db.migrate({"runs": {name: dict(entry) for name, entry in runs.items()}})["runs"] == runs  # once
    runs["gettext-en-es-full-10min-defaults"] = run("defaults", 33.0, 10.0, "1,066", 213,  # the rules' choices
                                                    label_smoothing=0.2)
    assert db.migrate({"runs": dict(runs)})["runs"]["gettext-en-es-full-10min-defaults"]["test"]["bleu"] == 33.0
    assert db.corpus_scores(runs, 10.0)["gettext-en-es"]["dtmt1-warmup400"] == round((32.11 + 26.5) / 2, 2)


def test_the_label_smoothing_rows_at_warmup_400_from_before_the_rule_are_two_rule_rows_out_of_leave_one_out(
        tmp_path: Path) -> None:
    """A `dtmt1-ls0.0` / `dtmt1-ls0.2` run from before the DTMT warm-up rule trained at warm-up 400 where the rule now
    chooses less: it is recorded (and its folder set aside) as the row pinning both settings, so that the row itself
    is measured again beside today's defaults; the pinning row changes two rules of the defaults and so takes no part
    in the leave-one-corpus-out check, whose rows change one each."""
    def run(row: str, corpus: str, bleu: float, budget: float, steps: str, warmup: int, **extra: object) -> dict:
        line = (f"dropout 0.0: the run is a {budget:g}-minute budget at 0.5 s a step (…): ≈ {steps} steps = 3.7 "
                "passes over the training data (289 steps each)")
        return {"row": row, "corpus": corpus, "size": "full", "budget_minutes": budget, "test": {"bleu": bleu},
                "steps": 1000, "passes": 3.4, "step_seconds": 0.57, "warmup_steps": warmup,
                "rule": {"dropout": 0.0, "passes": 3.7, "line": line}, "model": {"model_type": "dtmt"},
                "command": f"deepnmt train --{row} {corpus} {budget}", **extra}

    corpora = ("bible", "gettext-en-es", "gettext-en-de")
    runs = {}
    for corpus, defaults, old_ls, new_ls in zip(corpora, (9.3, 32.2, 21.4), (12.0, 36.0, 17.0), (9.0, 32.0, 21.0)):
        prefix = "" if corpus == "bible" else f"{corpus}-"
        runs[f"{prefix}full-10min-defaults"] = run("defaults", corpus, defaults, 10.0, "1,066", 213,
                                                   label_smoothing=0.2)  # today's defaults (their log says so)
        runs[f"{prefix}full-10min-dtmt1-ls0.0"] = run("dtmt1-ls0.0", corpus, old_ls, 10.0, "1,066", 400)
        runs[f"{prefix}full-25min-dtmt1-ls0.0"] = run("dtmt1-ls0.0", corpus, old_ls, 25.0, "2,665", 400)
    migrated = db.migrate({"runs": {name: dict(entry) for name, entry in runs.items()}})["runs"]
    for prefix in ("", "gettext-en-es-", "gettext-en-de-"):
        assert f"{prefix}full-10min-dtmt1-ls0.0" not in migrated
        moved = migrated[f"{prefix}full-10min-dtmt1-ls0.0-warmup400"]
        assert moved["row"] == "dtmt1-ls0.0-warmup400" and "the dtmt1-ls0.0 row before" in moved["ran_as"]
        assert migrated[f"{prefix}full-25min-dtmt1-ls0.0"]["row"] == "dtmt1-ls0.0"  # the rule gives 400 there
    # the old runs would win two folds of three; as a two-rule row they are in the table, not in the check
    table = "\n".join(db.corpora_section(migrated, dict(db.ROWS)))
    assert "| `dtmt1-ls0.0-warmup400` | 12.0 (+2.70)" in table
    assert "Leave one corpus out" not in table  # one row (`defaults`) is left in the check: no choice
    for corpus, new_ls in zip(corpora, (9.0, 32.0, 21.0)):  # today's row, measured again
        prefix = "" if corpus == "bible" else f"{corpus}-"
        # the same command as the run set aside (same folder, same seed): it is shown as today's row all the same
        migrated[f"{prefix}full-10min-dtmt1-ls0.0"] = run("dtmt1-ls0.0", corpus, new_ls, 10.0, "1,066", 213)
    table = "\n".join(db.corpora_section(migrated, dict(db.ROWS)))
    assert "over the rows `defaults`, `dtmt1-ls0.0` measured on all three" in table
    assert "| bible | `defaults` | +0.00 | `defaults` |" in table
    # the folder of such a run is set aside under the pinning row's name before the row trains again
    text = ("[deepnmt]   --warmup_steps 400\n[deepnmt]   dropout = rnn_dropout = readout_dropout " +
            runs["full-10min-dtmt1-ls0.0"]["rule"]["line"] + "\n")
    for name in ("full-10min-dtmt1-ls0.0", "full-25min-dtmt1-ls0.0"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text("{}")
        (tmp_path / name / "config.json").write_text('{"model_type": "dtmt"}')
        (tmp_path / f"{name}.log").write_text(text.replace("10-minute", "25-minute").replace("1,066", "2,665")
                                              if name.startswith("full-25") else text)
    assert db.set_aside_before_rule(tmp_path, "full-10min-dtmt1-ls0.0", "dtmt1-ls0.0")
    assert (tmp_path / "full-10min-dtmt1-ls0.0-warmup400" / "metrics.json").is_file()
    assert db.run_name("full", "10", "dtmt1-ls0.0-warmup400") == "full-10min-dtmt1-ls0.0-warmup400"
    assert not db.set_aside_before_rule(tmp_path, "full-25min-dtmt1-ls0.0", "dtmt1-ls0.0")


def test_the_defaults_dtmt1_runs_at_label_smoothing_0_1_are_the_ls0_1_rows_and_the_ls0_2_runs_the_defaults(
        tmp_path: Path) -> None:
    """Since 2026-12-07 the defaults give DTMT#1 on a CPU label smoothing 0.2 (hf_deepnmt_training.defaults.
    LABEL_SMOOTHING_BY_TYPE): the `defaults` runs recorded before trained 0.1 and are the `dtmt1-ls0.1` row's, the
    `dtmt1-ls0.2` runs (under the warm-up rule) the defaults' — at every seed; a run whose log shows the 0.2 the
    defaults chose stays the defaults'; a run at the rule's dropout of a fixed-dropout row is the `dtmt1-ls0.1`
    row's, and the folder of an old `defaults` run is set aside as ``NAME-ls0.1`` before the row trains again."""
    def run(row: str, bleu: float, seed: int | None = None, **extra: object) -> dict:
        line = ("dropout 0.0: the run is a 10-minute budget at 0.5 s a step (…): ≈ 1,066 steps = 3.7 passes over the "
                "training data (289 steps each)")
        return {"row": row, "corpus": "gettext-en-es", "size": "full", "budget_minutes": 10.0, "test": {"bleu": bleu},
                "steps": 1000, "passes": 3.4, "step_seconds": 0.57, "warmup_steps": 213,
                "rule": {"dropout": 0.0, "passes": 3.7, "line": line}, "model": {"model_type": "dtmt"},
                "command": f"deepnmt train --{row} {seed}" + (
                    f" --label_smoothing_factor {row[8:]}" if row.startswith("dtmt1-ls") else ""),
                **({"seed": seed} if seed else {}), **extra}

    prefix = "gettext-en-es-full-10min-"
    runs = {f"{prefix}defaults": run("defaults", 33.0), f"{prefix}defaults-seed2": run("defaults", 31.4, 2),
            f"{prefix}dtmt1-ls0.2": run("dtmt1-ls0.2", 34.3), f"{prefix}dtmt1-ls0.2-seed2": run("dtmt1-ls0.2", 33.9, 2),
            f"{prefix}defaults-seed3": run("defaults", 35.0, 3, label_smoothing=0.2),  # a run of today's defaults
            "gettext-en-de-full-10min-dtmt1-lr3e-3-dropout0.0": {**run("dtmt1-lr3e-3-dropout0.0", 20.7),
                                                                 "corpus": "gettext-en-de"}}
    migrated = db.migrate({"runs": {name: dict(entry) for name, entry in runs.items()}})["runs"]
    for suffix, bleu in (("", 33.0), ("-seed2", 31.4)):
        before = migrated[f"{prefix}dtmt1-ls0.1{suffix}"]
        assert before["row"] == "dtmt1-ls0.1" and before["test"]["bleu"] == bleu
        assert "the defaults before the label-smoothing rule (2026-12-07): 0.1" in before["ran_as"]
    for suffix, bleu in (("", 34.3), ("-seed2", 33.9)):
        now = migrated[f"{prefix}defaults{suffix}"]
        assert now["row"] == "defaults" and now["test"]["bleu"] == bleu and "the dtmt1-ls0.2 run" in now["ran_as"]
    assert migrated[f"{prefix}defaults-seed3"] == runs[f"{prefix}defaults-seed3"]
    assert "gettext-en-de-full-10min-defaults" not in migrated  # a fixed-dropout row's run trained 0.1
    assert migrated["gettext-en-de-full-10min-dtmt1-ls0.1"]["row"] == "dtmt1-ls0.1"
    assert db.migrate({"runs": {name: dict(entry) for name, entry in migrated.items()}})["runs"] == migrated  # once
    # the table shows the runs under their rows now, once: `dtmt1-ls0.2`'s are all the defaults'
    table = "\n".join(db.corpora_section({**migrated, **{
        f"bible-{name}": {**entry, "corpus": "bible"} for name, entry in migrated.items()
        if name.startswith(prefix)}}, dict(db.ROWS)))
    assert "| `defaults` | –" not in table and "| `dtmt1-ls0.1` | " in table and "| `dtmt1-ls0.2` |" not in table
    assert "(mean of 3 seeds: 34.3 / 33.9 / 35.0)" in table
    # what a run printed decides a finished folder of the defaults: 0.1 (or no line, before the rule) is set aside
    for name, printed in (("full-10min-defaults", "--label_smoothing_factor 0.1"), ("full-25min-defaults", None),
                          ("full-30min-defaults", "--label_smoothing_factor 0.2 (the CPU row's dtmt model's; …)")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text("{}")
        (tmp_path / name / "config.json").write_text('{"model_type": "dtmt"}')
        (tmp_path / f"{name}.log").write_text(f"[deepnmt]   --warmup_steps 213: the row's 400, at most a fifth\n"
                                               f"[deepnmt]   dropout 0.0: {runs[prefix + 'defaults']['rule']['line']}\n"
                                               + (f"[deepnmt]   {printed}\n" if printed else ""))
    assert db.set_aside_before_rule(tmp_path, "full-10min-defaults")
    assert (tmp_path / "full-10min-defaults-ls0.1" / "metrics.json").is_file()
    assert (tmp_path / "full-10min-defaults-ls0.1.log").is_file() and not (tmp_path / "full-10min-defaults").exists()
    assert db.set_aside_before_rule(tmp_path, "full-25min-defaults")
    assert not db.set_aside_before_rule(tmp_path, "full-30min-defaults")
    assert db.logged_label_smoothing((tmp_path / "full-30min-defaults.log").read_text()) == 0.2
