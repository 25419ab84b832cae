"""Issue 41: `deepnmt train`'s defaults against a small sweep, at several corpus sizes and time budgets.

Every run is the command a user types — training, validation and test files, a language pair and
``--max_train_minutes`` — and a row adds one setting: ``defaults`` adds nothing (the NMT defaults of
training/defaults.py, docs/defaults.md: since 2026-11-26 their dropout follows the run's length in passes over the
data), the other rows change one regularization, size, learning-rate or vocabulary setting each (`ROWS`);
``dropout0.0`` is the defaults of before that rule (the runs of the row ``defaults`` measured before it are renamed
to it, `migrate`, and their folders are kept aside as ``…-defaults-before-rule``).
A budget run validates by the clock and keeps its best checkpoint by validation BLEU (docs/defaults.md), so each
row's test score is its best checkpoint's, beam 4, on the first ``--test_samples`` verses of the held-out books. Each
run also records its passes over the training data and its step time without the validations, from which the page
shows the dropout the rule chooses where the ``defaults`` row was not run.

The corpora are ones no default was tuned on (``--corpora``, `CORPORA`): the embedded Bible corpus in the direction
the project never tuned, Spanish → English, at several sizes (``--sizes``: a seeded random sample of the 29,024
training pairs, written to ``WORK_DIR/corpora``; ``full`` is all of them; validation: the 983 held-out validation
verses, the defaults' sample); and, for issue 63, English software messages of this machine's gettext catalogs into
Spanish and into German (``gettext-en-es``, ``gettext-en-de``: built under ``runs/corpora`` by
training/corpus/build_gettext_corpus.py, byte-identically on the same catalogs; every test pair scored, seed 42).
Issue 63's tables (`corpora_section`) put the rows measured on all training pairs of several corpora side by side,
with the verdict on each paper's mechanism (`mechanism_verdicts`) and the leave-one-corpus-out check of the other
rows (`leave_one_corpus_out`):

    python -m benchmarks.experiments.defaults_budget --corpora bible,gettext-en-es,gettext-en-de --sizes full \
        --budgets 25 --rows defaults,cad,dou2018-dense,admin-6-6,dtmt1 --average_last 0

Runs go ``--parallel`` at a time with ``--threads`` CPU threads each (two at a time, one thread each, on a 2-core
machine: a budget is then CPU-minutes), longest budget first; a run the results' JSON already holds with a test score is
not run again (nor one whose folder holds a finished run the study did not record: it is recorded), so a killed
study continues where it stopped and ``--budgets``/``--sizes``/``--rows`` can be run in parts, in several sessions.

    python -m benchmarks.experiments.defaults_budget                                  # the whole study
    python -m benchmarks.experiments.defaults_budget --budgets 10                      # one budget of it
    python -m benchmarks.experiments.defaults_budget --sizes 400 --budgets 0.3 --rows defaults --test_samples 8 \\
        --work_dir /tmp/defaults-smoke --results /tmp/defaults-smoke                   # smoke: measures nothing

With ``--average_last K`` (default 2; 0: off) each finished run's last K checkpoints are also averaged (`deepnmt
average-checkpoints`) and the average scored on the same test verses (`deepnmt evaluate`, beam 4): issue 41 asks that
averaging be applied by default only where it is measured to help.

Writes ``defaults_budget.json`` and ``defaults_budget.md`` under ``--results``; the JSON keeps every run ever
finished in ``WORK_DIR`` (runs of one study may come from several sessions).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .common import chosen_rows, experiment_parser, history, render_only, series

NAME = "defaults_budget"
# meng2019's DTMT#1 at the defaults' width: the recipe meng2019-bible-dtmt4's shape and init, transition depth 1
# with the row's dropouts between (the order the runs were typed in)
DTMT1 = "d_model=128,attention_heads=4,transition_depth=1,rnn_cell=lgru,init_range=0.23,{},max_position_embeddings=256"
# Row -> the `deepnmt train` options it adds to the user's command (`defaults`: none).
ROWS: dict[str, list[str]] = {
    "defaults": [],
    # the `cpu-small` row's Transformer (2-6 pre-LN, d 128): the defaults until issue 63 made DTMT#1 theirs
    # (2026-11-28); their `defaults` runs are this row's (`migrate`). The rows below measured before that date add
    # their setting to this Transformer (their runs record `model.model_type`); measured since, a row whose fields
    # only the Transformer has (cad, dou2018-dense, admin-6-6, ffn1024) still does, the others add it to DTMT#1.
    "transformer": ["--model_type", "deep_transformer"],
    "dropout0.0": ["--config_overrides", "dropout=0.0"],
    "dropout0.1": ["--config_overrides", "dropout=0.1"],
    "dropout0.3": ["--config_overrides", "dropout=0.3"],
    "d256-dropout0.3": ["--config_overrides", "d_model=256,encoder_ffn_dim=1024,decoder_ffn_dim=1024,dropout=0.3"],
    # the defaults with one other setting changed (their dropout still follows the run's length)
    "attn-act-dropout0.1": ["--config_overrides", "attention_dropout=0.1,activation_dropout=0.1"],
    "lr1.5e-3": ["--learning_rate", "0.0015"],
    "vocab2000": ["--vocab_size", "2000"],
    "ls0.2": ["--label_smoothing_factor", "0.2"],
    "warmup400": ["--warmup_steps", "400"],
    "warmup200": ["--warmup_steps", "200"],
    # issue 63: the rules' sweep on three corpora, on the defaults' DTMT#1 (one rule changed each; named `dtmt1-…`
    # because issue 41's `ls0.2`, `vocab2000`, … runs on the Bible are the Transformer's). The width row scales the
    # init range with it as the defaults' does (meng2019's ±0.08 at d 1024 times sqrt(1024 / d): 0.18 at d 192).
    # The sweep ran before the defaults' DTMT#1 took label smoothing 0.2 from its row `dtmt1-ls0.2` (2026-12-07):
    # every other DTMT#1 row pins the 0.1 its runs trained with (`LS_BEFORE`), so that another seed of the row trains
    # what its first did; a rule measured on today's defaults needs a row of its own.
    "dtmt1-ls0.2": ["--model_type", "dtmt", "--label_smoothing_factor", "0.2"],
    "dtmt1-ls0.0": ["--model_type", "dtmt", "--label_smoothing_factor", "0.0"],
    # the defaults' DTMT#1 before the label-smoothing rule (2026-12-07): their runs are this row's since (`migrate`)
    "dtmt1-ls0.1": ["--model_type", "dtmt", "--label_smoothing_factor", "0.1"],
    "dtmt1-warmup200": ["--model_type", "dtmt", "--warmup_steps", "200", "--label_smoothing_factor", "0.1"],
    "dtmt1-warmup800": ["--model_type", "dtmt", "--warmup_steps", "800", "--label_smoothing_factor", "0.1"],
    # the defaults' DTMT#1 before the warm-up rule (2026-11-29): the row's 400 at every length; their runs of fewer
    # than ~2,000 estimated steps (where the rule now chooses less) are this row's since (`migrate`)
    "dtmt1-warmup400": ["--model_type", "dtmt", "--warmup_steps", "400", "--label_smoothing_factor", "0.1"],
    # the label-smoothing rows' runs of before the warm-up rule, likewise (`migrate`): two rules changed each, the
    # label smoothing and the warm-up, so the leave-one-corpus-out check leaves them out (`TWO_RULES`)
    "dtmt1-ls0.2-warmup400": ["--model_type", "dtmt", "--label_smoothing_factor", "0.2", "--warmup_steps", "400"],
    "dtmt1-ls0.0-warmup400": ["--model_type", "dtmt", "--label_smoothing_factor", "0.0", "--warmup_steps", "400"],
    "dtmt1-vocab8000": ["--model_type", "dtmt", "--vocab_size", "8000", "--label_smoothing_factor", "0.1"],
    "dtmt1-d192": ["--model_type", "dtmt", "--config_overrides", "d_model=192,init_range=0.18",
                   "--label_smoothing_factor", "0.1"],
    # measured on today's defaults (label smoothing 0.2; `SINCE_LS_RULE`): a narrower model and a smaller vocabulary,
    # where a short budget could favour them (init range 0.08 · sqrt(1024 / 96) = 0.26)
    "dtmt1-d96": ["--model_type", "dtmt", "--config_overrides", "d_model=96,init_range=0.26"],
    "dtmt1-vocab2000": ["--model_type", "dtmt", "--vocab_size", "2000"],
    # issue 41's Transformer runs with the warm-up of their time (200) that stayed above the DTMT#1 defaults on the
    # Bible at 10 minutes, as rows pinning that model and warm-up so that another seed trains the same thing
    # (`migrate` makes issue 41's runs their first seed's)
    "transformer-warmup200": ["--model_type", "deep_transformer", "--warmup_steps", "200"],
    "transformer-warmup200-ls0.2": ["--model_type", "deep_transformer", "--warmup_steps", "200",
                                    "--label_smoothing_factor", "0.2"],
    # issue 63: the papers' mechanisms on top of the defaults (docs/defaults.md, "Round two")
    "cad": ["--config_overrides", "cross_attention_drop_depth=5,cross_attention_drop_ratio=0.5"],  # li2022 §3.3
    "dou2018-dense": ["--config_overrides", "encoder_layer_aggregation=dense,decoder_layer_aggregation=dense"],
    "admin-6-6": ["--config_overrides", "residual_scaling=admin,encoder_layers=6"],  # liu2020: post-LN, 6 encoder layers
    "dtmt1": ["--model_type", "dtmt", "--config_overrides", DTMT1.format("dropout=0.2,rnn_dropout=0.1,readout_dropout=0.2"),
              "--learning_rate", "0.002", "--label_smoothing_factor", "0.1"],
    # (meng2019 DTMT#1 at the recipe meng2019-bible-dtmt4's width and dropouts)
    # what of dtmt1's win is the architecture: the defaults' Transformer with dtmt1's learning rate and dropout, and
    # DTMT#1 with the defaults' learning rate and dropout
    "lr2e-3-dropout0.2": ["--learning_rate", "0.002", "--config_overrides", "dropout=0.2"],
    "dtmt1-lr3e-3-dropout0.1": ["--model_type", "dtmt", "--config_overrides",
                                DTMT1.format("dropout=0.1,rnn_dropout=0.1,readout_dropout=0.1"),
                                "--label_smoothing_factor", "0.1"],
    # DTMT#1 with the dropout the run-length rule gives a run under 5 passes (the Bible at 25 minutes: 4.4 passes)
    "dtmt1-lr3e-3-dropout0.0": ["--model_type", "dtmt", "--config_overrides",
                                DTMT1.format("dropout=0.0,rnn_dropout=0.0,readout_dropout=0.0"),
                                "--label_smoothing_factor", "0.1"],
}
# The rows of issue 41's sweep, on the Transformer defaults of its time (`issue41_view`).
ISSUE41_ROWS = ("dropout0.0", "dropout0.1", "dropout0.3", "d256-dropout0.3", "attn-act-dropout0.1", "lr1.5e-3",
                "vocab2000", "ls0.2", "warmup400", "warmup200")
# The rows of issue 63 that add a paper's mechanism to the defaults: one enters them where it wins by at least
# `MECHANISM_MARGIN` BLEU on at least `MECHANISM_WINS` of the corpora (`mechanism_verdicts`).
MECHANISMS = ("cad", "dou2018-dense", "admin-6-6", "dtmt1", "dtmt1-lr3e-3-dropout0.1", "dtmt1-lr3e-3-dropout0.0")
MECHANISM_MARGIN, MECHANISM_WINS = 0.5, 2
# The rows whose DTMT#1 runs at warm-up 400, from before the DTMT warm-up rule (2026-11-29) where it now chooses less,
# are recorded as another row's (`migrate`, `set_aside_before_rule`): the row pinning that warm-up.
BEFORE_WARMUP_RULE = {"defaults": "dtmt1-warmup400", "dtmt1-ls0.2": "dtmt1-ls0.2-warmup400",
                      "dtmt1-ls0.0": "dtmt1-ls0.0-warmup400"}
# Rows that changed two rules of the defaults of their time (both label smoothing and the warm-up the DTMT warm-up
# rule had replaced): in the tables, not in the leave-one-corpus-out check, whose rows change one rule each of the
# defaults they were measured against (`corpora_section`).
TWO_RULES = ("dtmt1-ls0.2-warmup400", "dtmt1-ls0.0-warmup400")
# The DTMT#1 rows added since the label-smoothing rule: one rule changed on today's defaults, label smoothing not
# pinned (`ROWS`).
SINCE_LS_RULE = ("dtmt1-d96", "dtmt1-vocab2000")
# The label smoothing every run trained with before the defaults' DTMT#1 took 0.2 (2026-12-07): the package's, 0.1.
# Such `defaults` runs are the `dtmt1-ls0.1` row's since, and `dtmt1-ls0.2` runs the defaults' (`migrate`).
LS_BEFORE, LS_ROW_BEFORE, LS_ROW_NOW = 0.1, "dtmt1-ls0.1", "dtmt1-ls0.2"
# The `cpu-small` warm-up of the defaults before this study made it 400 (2026-11-26): `defaults` runs that resolved
# to it are the `warmup200` row's, and `warmup400` runs are the defaults' since then (`migrate`).
WARMUP_BEFORE, WARMUP_NOW = 200, 400
TRAIN = "corpus:web-sparv/train.jsonl.gz"
VALIDATION = "corpus:web-sparv/valid.jsonl.gz"
TEST = "corpus:web-sparv/test.jsonl.gz"


@dataclass(frozen=True)
class Corpus:
    """One tuning corpus of the study: its files, its direction (None: ``--source_lang``/``--target_lang``), the
    test pairs scored (None: ``--test_samples``; 0: all of them) and the seed of its runs."""

    train: str
    validation: str
    test: str
    source: str | None
    target: str | None
    test_samples: int | None
    seed: int
    build: str  # how a user gets the files


GETTEXT_BUILD = "python training/corpus/build_gettext_corpus.py --language {target} --output_dir runs/corpora/{name}"
# The embedded Bible corpus (issue 41's study: es→en by default, 500 test verses, seed 1) and issue 63's software
# messages of this machine's gettext catalogs, into Spanish and German (every test pair; seed 42, transformers'
# default, as the first runs of issue 63 were typed: docs/defaults.md).
CORPORA: dict[str, Corpus] = {
    "bible": Corpus(TRAIN, VALIDATION, TEST, None, None, None, 1, "embedded in the package"),
    **{f"gettext-en-{target}": Corpus(*(f"runs/corpora/gettext-en-{target}/{split}.jsonl.gz"
                                         for split in ("train", "valid", "test")), "en", target, 0, 42,
                                       GETTEXT_BUILD.format(target=target, name=f"gettext-en-{target}"))
       for target in ("es", "de")},
}


def corpus_file(path: str) -> Path:
    """The local file of a study corpus's ``path`` (``corpus:`` names the embedded corpus)."""
    if path.startswith("corpus:"):
        from hf_deepnmt_training.corpus import corpus_dir

        return corpus_dir() / path.split("/", 1)[1]
    return Path(path)


def corpus(work: Path, size: str, name: str = "bible") -> str:
    """The training file of ``size`` (a number of pairs, or ``full``) of the study corpus ``name``: a seeded sample
    of its training pairs (same seed for every size, so a smaller corpus is not a subset of a larger one by
    construction), in their order."""
    chosen_corpus = CORPORA[name]
    if not corpus_file(chosen_corpus.train).is_file():
        raise SystemExit(f"--corpora {name}: {chosen_corpus.train} does not exist; build it with: {chosen_corpus.build}")
    if size == "full":
        return chosen_corpus.train
    path = work / "corpora" / (f"train-{size}.jsonl" if name == "bible" else f"{name}-train-{size}.jsonl")
    if not path.is_file():
        with gzip.open(corpus_file(chosen_corpus.train), "rt", encoding="utf-8") as handle:
            lines = handle.readlines()
        if int(size) > len(lines):
            raise SystemExit(f"--sizes {size}: the corpus {name} has {len(lines)} training pairs")
        chosen = sorted(random.Random(0).sample(range(len(lines)), int(size)))
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text("".join(lines[index] for index in chosen), encoding="utf-8")
        partial.replace(path)
    return str(path)


def direction(args: argparse.Namespace, name: str) -> tuple[str, str]:
    """The source and target language of the study corpus ``name``."""
    chosen = CORPORA[name]
    return chosen.source or args.source_lang, chosen.target or args.target_lang


def scored_test_pairs(args: argparse.Namespace, name: str) -> int:
    """How many test pairs the runs on corpus ``name`` score (0: all)."""
    chosen = CORPORA[name].test_samples
    return args.test_samples if chosen is None else chosen


def train_arguments(args: argparse.Namespace, train_file: str, output_dir: Path, budget: str, row: str,
                    name: str = "bible", seed: int | None = None) -> list[str]:
    """The user's command on the study corpus ``name`` with the options of ``row``, at ``seed`` (None: the corpus's
    own)."""
    chosen = CORPORA[name]
    source, target = direction(args, name)
    samples = scored_test_pairs(args, name)
    return ["train", "--train_file", train_file, "--validation_file", chosen.validation, "--test_file", chosen.test,
            "--source_lang", source, "--target_lang", target, "--output_dir", str(output_dir),
            "--max_train_minutes", budget, *(["--max_predict_samples", str(samples)] if samples else []),
            "--disable_tqdm", "true", "--report_to", "none", "--seed", str(chosen.seed if seed is None else seed),
            *ROWS[row]]


def sibling(run: dict, row: str) -> str:
    """The name of the run of ``row`` in the cell of the recorded ``run`` (its corpus, size, budget and seed)."""
    return run_name(run["size"], f"{run['budget_minutes']:g}", row, run.get("corpus", "bible"), run.get("seed"))


def run_name(size: str, budget: str, row: str, name: str = "bible", seed: int | None = None) -> str:
    """A run's name: ``SIZE-BUDGETmin-ROW``, prefixed with its corpus but for the Bible (issue 41's runs), suffixed
    ``-seedN`` when it ran at another seed than its corpus's own (``--seeds``)."""
    base = f"{size}-{budget}min-{row}" if name == "bible" else f"{name}-{size}-{budget}min-{row}"
    return base if seed is None or seed == CORPORA[name].seed else f"{base}-seed{seed}"


def describe(folder: Path, log_path: Path, code: int, arguments: list[str], minutes: float | None) -> dict:
    """What a finished run reports: its test scores, steps, the checkpoint it kept, its validation curve."""
    text = log_path.read_text(errors="replace") if log_path.is_file() else ""
    run: dict = {"exit_code": code, "command": "deepnmt " + " ".join(arguments),
                 "wall_minutes": round(minutes, 1) if minutes is not None else None}
    if code != 0 or not (folder / "metrics.json").is_file():
        run["log_tail"] = text[-2000:]
        return run
    metrics = json.loads((folder / "metrics.json").read_text())
    state = json.loads((folder / "trainer_state.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    run.update({
        "test": {key: metrics["test"].get(key) for key in ("bleu", "chrf", "ter")} if metrics.get("test") else None,
        "steps": state["global_step"], "best_checkpoint": state.get("best_model_checkpoint"),
        "best_metric": state.get("best_metric"),
        "model": {key: config.get(key) for key in ("model_type", "d_model", "encoder_layers", "decoder_layers",
                                                    "encoder_ffn_dim", "transition_depth", "dropout", "vocab_size")},
        "eval_bleu": series(history(folder), "eval_bleu"),
        "kept": next((line.split("]", 1)[1].strip() for line in text.splitlines() if "kept the best" in line), None),
    })
    run.update(run_length(state))
    rule = RULE_LINE.search(text)
    if rule:  # the defaults chose the dropout from the run's length (hf_deepnmt_training.run_length)
        run["rule"] = {"dropout": float(rule[1]), "passes": float(rule[2]), "line": rule[0].strip()}
    warmup = warmup_of(arguments, text)
    if warmup is not None:
        run["warmup_steps"] = warmup
    if LS_LINE.search(text):
        run["label_smoothing"] = logged_label_smoothing(text)
    return run


# The line `deepnmt train` prints for the label smoothing of a run with NMT defaults: chosen ("--label_smoothing_factor
# 0.2 (the CPU row's dtmt model's; …)", since 2026-12-07) or the package's ("--label_smoothing_factor 0.1").
LS_LINE = re.compile(r"^\[deepnmt\]\s+--label_smoothing_factor ([0-9.]+)", re.MULTILINE)


def logged_label_smoothing(log_text: str) -> float:
    """The label smoothing a run's log says it trained with: the last line (a resumed run's "--label_smoothing_factor
    0.1: the checkpoint's" comes after the choice); `LS_BEFORE` in a log without one."""
    printed = LS_LINE.findall(log_text)
    return float(printed[-1]) if printed else LS_BEFORE


def label_smoothing_of(run: dict) -> float:
    """The label smoothing a recorded run trained with: its command's ``--label_smoothing_factor``, else the one its
    log printed (recorded since 2026-12-07), else `LS_BEFORE` (every run recorded before then that did not set it)."""
    command = (run.get("command") or "").split()
    if "--label_smoothing_factor" in command:
        return float(command[command.index("--label_smoothing_factor") + 1])
    return run.get("label_smoothing", LS_BEFORE)


def trains_todays_label_smoothing(run: dict) -> bool:
    """Whether a DTMT#1 run of the `defaults` trained with the label smoothing the defaults choose for it today
    (`hf_deepnmt_training.defaults.label_smoothing_for`); a Transformer run: True (its 0.1 did not change)."""
    from hf_deepnmt_training.defaults import label_smoothing_for

    model_type = run_model_type(run)
    return label_smoothing_of(run) == (label_smoothing_for({"model_type": model_type}, "cpu") or LS_BEFORE)


# The lines `deepnmt train` prints for a warm-up its defaults chose: "--warmup_steps 400" (the size row's), and
# since the DTMT warm-up rule "--warmup_steps 213: the row's 400, at most a fifth of …" after the row's
# "--warmup_steps 400 at most: …" (which is not the choice, and does not match).
WARMUP_LINE = re.compile(r"^\[deepnmt\]\s+--warmup_steps (\d+)(?::|\s*$)", re.MULTILINE)
# The run-length estimate in the dropout rule's line: "… ≈ 1,066 steps = 3.7 passes …".
ESTIMATED_STEPS = re.compile(r"≈ ([0-9,]+) steps")


def warmup_of(arguments: list[str], log_text: str) -> int | None:
    """The warm-up a run trained with: the command line's ``--warmup_steps``, else the last one the defaults chose
    (its log line), else None (neither: not a run of the defaults' warm-up)."""
    if "--warmup_steps" in arguments:
        return int(arguments[arguments.index("--warmup_steps") + 1])
    chosen = WARMUP_LINE.findall(log_text)
    return int(chosen[-1]) if chosen else None


def estimated_steps(run: dict) -> float | None:
    """The steps `deepnmt train` estimated for a budget run like ``run``: its printed estimate (the dropout rule's
    line), else the budget over the run's own step time (validations not counted); None without either."""
    printed = ESTIMATED_STEPS.search((run.get("rule") or {}).get("line", ""))
    return float(printed[1].replace(",", "")) if printed else steps_at_own_speed(run)


def steps_at_own_speed(run: dict) -> float | None:
    """A budget run's length in steps at its own step time, validations not counted (what `deepnmt train` would
    estimate had it measured that time); None without a step time."""
    return run["budget_minutes"] * 60.0 / run["step_seconds"] if run.get("step_seconds") else None


def before_warmup_rule(run: dict) -> bool:
    """Whether ``run`` trained DTMT#1 at the row's warm-up where the defaults' warm-up rule (2026-11-29: at most a
    fifth of the estimated steps, `hf_deepnmt_training.defaults.warmup_for_length`) now chooses another."""
    from hf_deepnmt_training.defaults import warmup_for_length

    steps = estimated_steps(run)
    return run_model_type(run) == "dtmt" and run.get("warmup_steps") == WARMUP_NOW and steps is not None \
        and warmup_for_length(WARMUP_NOW, steps) != WARMUP_NOW


# The line `deepnmt train` prints when its defaults choose the dropout from the run's length.
RULE_LINE = re.compile(r"dropout ([0-9.]+): the run is [^\n]*?= ([0-9.]+) passes over the training data[^\n]*")


def set_aside_before_rule(work: Path, name: str, row: str = "defaults") -> bool:
    """A finished `defaults` run from before the run-length dropout rule (its log has no rule line) is the
    `dropout0.0` row's run (`migrate`), and one from before the warm-up change (its log shows the defaults choosing
    ``--warmup_steps 200``) the `warmup200` row's, one of the Transformer (its config says so) from before issue 63
    made DTMT#1 the defaults the `transformer` row's, and a DTMT#1 one at warm-up 400 from before the DTMT warm-up
    rule, where it now chooses less, the `dtmt1-warmup400` row's, and a DTMT#1 one at label smoothing 0.1 from before
    the label-smoothing rule (2026-12-07) the `dtmt1-ls0.1` row's; none is one of today's defaults: its folder and
    log are renamed to ``NAME-before-rule`` / ``NAME-warmup200`` / ``NAME-transformer`` / ``NAME-warmup400`` /
    ``NAME-ls0.1`` so that the study records today's defaults instead (the `warmup400` run of the cell, `migrate`,
    or a new run). For another ``row`` of `BEFORE_WARMUP_RULE` (a label-smoothing row) only the warm-up applies: its
    run at warm-up 400 becomes ``NAME-warmup400``, the name of the row pinning that warm-up. Returns whether it did."""
    folder, log = work / name, work / f"{name}.log"
    finished = (folder / "metrics.json").is_file() and log.is_file()  # an unfinished run is trained again whole
    if not finished:
        return False
    text = log.read_text(errors="replace")
    rule = RULE_LINE.search(text)
    config = folder / "config.json"
    model = {"model_type": json.loads(config.read_text()).get("model_type")} if config.is_file() else {}
    if row != "defaults":
        suffix = "warmup400" if rule and before_warmup_rule(
            {"rule": {"line": rule[0]}, "warmup_steps": warmup_of([], text), "model": model}) else None
        if suffix is None:
            return False
    elif not rule:
        suffix = "before-rule"
    elif warmup_of([], text) == WARMUP_BEFORE:
        suffix = "warmup200"
    elif model.get("model_type") == "deep_transformer":  # the defaults before issue 63 made DTMT#1 theirs
        suffix = "transformer"
    elif before_warmup_rule({"rule": {"line": rule[0]}, "warmup_steps": warmup_of([], text),
                             "model": model}):
        suffix = "warmup400"
    elif model.get("model_type") == "dtmt" and not trains_todays_label_smoothing(
            {"model": model, "label_smoothing": (smoothing := logged_label_smoothing(text))}):  # before that rule
        suffix = f"ls{smoothing:g}"
    else:
        return False
    for path in (folder, log):
        kept = path.with_name(path.name.replace(name, f"{name}-{suffix}", 1))
        if kept.exists():
            raise SystemExit(f"{path}: a run of the defaults of before, and {kept} exists already; move one away")
        path.rename(kept)
    return True


def run_length(state: dict) -> dict:
    """How long a finished run was: ``passes`` over its training data, and ``step_seconds``, the seconds of a
    training step with the validations taken out — the quantity `deepnmt train` measures before a budget run to
    estimate its length (hf_deepnmt_training.run_length)."""
    log = state.get("log_history", [])
    runtime = next((entry["train_runtime"] for entry in log if "train_runtime" in entry), None)
    validations = sum(entry.get("eval_runtime", 0.0) for entry in log)
    steps = state.get("global_step") or 0
    return {"passes": round(state.get("epoch") or 0.0, 2),
            "step_seconds": round((runtime - validations) / steps, 4) if runtime and steps else None}


def estimated_passes(run: dict) -> float | None:
    """The passes `deepnmt train` estimates for a budget run like ``run`` (its budget over the measured step time,
    validations not counted), from the run's own step time; None without one."""
    if not run.get("step_seconds") or not run.get("passes") or not run.get("steps"):
        return None
    return steps_at_own_speed(run) / (run["steps"] / run["passes"])


def migrate(report: dict) -> dict:
    """Runs of the row `defaults` from before the run-length dropout rule (2026-11-26: no rule line in the log) are
    runs of the `dropout0.0` row: the defaults of that time, the same training as ``--config_overrides
    dropout=0.0``; `defaults` runs from before the warm-up change (warm-up 200, recorded or not) are the `warmup200`
    row's. Renamed in place, once. A cell without a `defaults` run then takes its `warmup400` run as the defaults'
    (the same command once the defaults choose that warm-up), marked ``ran_as``. Issue 63's: the Transformer
    defaults' runs are the `transformer` row's; DTMT#1 runs at the rule's dropout are the `dtmt1-ls0.1` row's (the
    defaults' until 2026-12-07); DTMT#1 runs of the defaults at warm-up 400 where the DTMT warm-up rule now chooses
    less are the `dtmt1-warmup400` row's, and those of the label-smoothing rows the rows pinning that warm-up as
    well (`BEFORE_WARMUP_RULE`); the defaults' other DTMT#1 runs at label smoothing 0.1, from before the
    label-smoothing rule (2026-12-07), are the `dtmt1-ls0.1` row's, and the `dtmt1-ls0.2` runs the defaults'; issue
    41's Transformer runs at warm-up 200 are the rows pinning it."""
    for name in list(report.get("runs", {})):
        run = report["runs"][name]
        if run.get("row") == "defaults" and run.get("test") and not run.get("rule") \
                and run_model_type(run) == "deep_transformer" and not run.get("ran_as"):  # not issue 63's DTMT#1
            renamed = sibling(run, "dropout0.0")
            report["runs"].setdefault(renamed, {**run, "row": "dropout0.0", "ran_as": (
                "the defaults before the run-length dropout rule: dropout 0.0, as --config_overrides dropout=0.0")})
            del report["runs"][name]
    for name in list(report.get("runs", {})):  # then: the defaults before the warm-up change
        run = report["runs"][name]
        if run.get("row") == "defaults" and run.get("test") and run.get("warmup_steps", WARMUP_BEFORE) == WARMUP_BEFORE \
                and run_model_type(run) == "deep_transformer":
            renamed = sibling(run, "warmup200")
            report["runs"].setdefault(renamed, {**run, "row": "warmup200", "warmup_steps": WARMUP_BEFORE, "ran_as": (
                "the defaults before the warm-up change: warm-up 200, as --warmup_steps 200")})
            del report["runs"][name]
    for name in list(report.get("runs", {})):  # the warmup400 runs are the defaults' own since the change
        run = report["runs"][name]
        defaults = sibling(run, "defaults")
        if run.get("row") == "warmup400" and run.get("test") and defaults not in report["runs"]:
            report["runs"][defaults] = {**run, "row": "defaults", "warmup_steps": WARMUP_NOW, "ran_as": (
                "the warmup400 run: --warmup_steps 400 is what the defaults choose since the warm-up change")}
    for name in list(report.get("runs", {})):  # issue 63: the defaults' Transformer runs are the `transformer` row's
        run = report["runs"][name]
        if run.get("row") == "defaults" and run.get("test") and run_model_type(run) == "deep_transformer":
            renamed = sibling(run, "transformer")
            report["runs"].setdefault(renamed, {**run, "row": "transformer", "ran_as": (
                f"the defaults before issue 63 (2026-11-28): {run.get('ran_as') or 'the cpu-small Transformer'}; "
                "--model_type deep_transformer trains it since")})
            del report["runs"][name]
    from hf_deepnmt_training.defaults import dropout_for_epochs

    # and DTMT#1 runs at the rule's dropout were the defaults' from then until the label-smoothing rule: the
    # `dtmt1-ls0.1` row's
    for name in list(report.get("runs", {})):
        run = report["runs"][name]
        before = sibling(run, LS_ROW_BEFORE)
        passes = estimated_passes(run)
        if run.get("row") in DTMT1_AT_RULE_DROPOUT and run.get("test") and passes is not None \
                and before not in report["runs"] and DTMT1_AT_RULE_DROPOUT[run["row"]] == dropout_for_epochs(passes) \
                and not before_warmup_rule(run):
            report["runs"][before] = {**run, "row": LS_ROW_BEFORE, "ran_as": (
                f"the {run['row']} run: DTMT#1 with dropout {DTMT1_AT_RULE_DROPOUT[run['row']]} in all three dropouts "
                f"is what the defaults chose from issue 63 (2026-11-28) to the label-smoothing rule (2026-12-07) for "
                f"a run of ≈ {passes:.1f} passes")}
    # DTMT#1 runs at warm-up 400 where the DTMT warm-up rule now chooses less: the defaults' are the
    # `dtmt1-warmup400` row's, the label-smoothing rows' the rows pinning that warm-up too (`BEFORE_WARMUP_RULE`)
    for name in list(report.get("runs", {})):
        run = report["runs"][name]
        row = BEFORE_WARMUP_RULE.get(run.get("row"))
        if row and run.get("test") and before_warmup_rule(run):
            what = "the defaults" if run["row"] == "defaults" else f"the {run['row']} row"
            report["runs"].setdefault(sibling(run, row), {**run, "row": row, "ran_as": (
                (f"{run['ran_as']}; " if run.get("ran_as") else "")
                + f"{what} before the DTMT warm-up rule (2026-11-29): warm-up 400, as --warmup_steps 400")})
            del report["runs"][name]
    # DTMT#1 runs of the defaults at the label smoothing of before the rule are the `dtmt1-ls0.1` row's, and the
    # `dtmt1-ls0.2` runs the defaults' (a DTMT#1 at the rules' warm-up: those before it were moved above)
    for name in list(report.get("runs", {})):
        run = report["runs"][name]
        if run.get("row") == "defaults" and run.get("test") and run_model_type(run) == "dtmt" \
                and not trains_todays_label_smoothing(run):
            report["runs"].setdefault(sibling(run, LS_ROW_BEFORE), {**run, "row": LS_ROW_BEFORE, "ran_as": (
                (f"{run['ran_as']}; " if run.get("ran_as") else "")
                + f"the defaults before the label-smoothing rule (2026-12-07): {label_smoothing_of(run)}, as "
                f"--label_smoothing_factor {label_smoothing_of(run)}")})
            del report["runs"][name]
    for name in list(report.get("runs", {})):
        run = report["runs"][name]
        defaults = sibling(run, "defaults")
        if run.get("row") == LS_ROW_NOW and run.get("test") and run_model_type(run) == "dtmt" \
                and trains_todays_label_smoothing(run) and not before_warmup_rule(run) \
                and defaults not in report["runs"]:
            report["runs"][defaults] = {**run, "row": "defaults", "ran_as": (
                f"the {LS_ROW_NOW} run: label smoothing {label_smoothing_of(run)} is what the defaults choose for "
                "DTMT#1 on a CPU since 2026-12-07")}
    for name in list(report.get("runs", {})):  # issue 41's Transformer runs at warm-up 200 and the rule's dropout
        run = report["runs"][name]
        row = TRANSFORMER_WARMUP200.get(run.get("row"))
        passes = estimated_passes(run)
        if row and run.get("test") and run_model_type(run) == "deep_transformer" and passes is not None \
                and run.get("warmup_steps", WARMUP_BEFORE) == WARMUP_BEFORE \
                and sibling(run, row) not in report["runs"] \
                and (run.get("model") or {}).get("dropout") == dropout_for_epochs(passes):
            report["runs"][sibling(run, row)] = {**run, "row": row, "ran_as": (
                f"the {run['row']} run of issue 41: the Transformer at warm-up 200 with the dropout the run-length "
                f"rule gives an estimated {passes:.1f} passes ({run['model']['dropout']})")}
    return report


# The rows that train the `cpu-small` DTMT#1 of the defaults from issue 63 to the label-smoothing rule at a fixed
# dropout (`migrate`).
DTMT1_AT_RULE_DROPOUT = {"dtmt1-lr3e-3-dropout0.1": 0.1, "dtmt1-lr3e-3-dropout0.0": 0.0}
# Issue 41's rows whose runs trained the Transformer at warm-up 200 (the defaults of that time) -> the row that pins
# that training since issue 63 (`migrate`: where the run's dropout is the one the run-length rule gives it)
TRANSFORMER_WARMUP200 = {"warmup200": "transformer-warmup200", "dropout0.0": "transformer-warmup200",
                         "dropout0.1": "transformer-warmup200", "ls0.2": "transformer-warmup200-ls0.2"}


def run_folder(run: dict, default: Path) -> Path:
    """The folder a recorded run trained into: its command's ``--output_dir`` (a run recorded under another row's
    name, `migrate`, keeps its own), else ``default``."""
    command = (run.get("command") or "").split()
    return Path(command[command.index("--output_dir") + 1]) if "--output_dir" in command else default


def run_model_type(run: dict) -> str:
    """The model type a recorded run trained: recorded since issue 63; else a Transformer when its config had encoder
    layers or no config was recorded (every run before DTMT's rows), else DTMT."""
    model = run.get("model") or {}
    return model.get("model_type") or ("deep_transformer" if model.get("encoder_layers") or not model else "dtmt")


def average(folder: Path, last: int, args: argparse.Namespace, env: dict, log_path: Path,
            name: str = "bible") -> dict | None:
    """Average the run's last ``last`` checkpoints and score the average like the run's own test (on the study
    corpus ``name``); None when the run kept fewer checkpoints."""
    if len(list(folder.glob("checkpoint-*"))) < last:
        return None
    averaged = folder / f"averaged-last{last}"
    scores = averaged / "scores.json"
    source, target = direction(args, name)
    samples = scored_test_pairs(args, name)
    commands = [["average-checkpoints", str(folder), "--last", str(last), "--output", str(averaged)],
                ["evaluate", str(averaged), "--test_file", CORPORA[name].test, "--source_lang", source,
                 "--target_lang", target, "--num_beams", "4", *(["--max_samples", str(samples)] if samples else []),
                 "--output_json", str(scores)]]
    with log_path.open("a") as log:
        for command in commands:
            if command[0] == "average-checkpoints" and (averaged / "model.safetensors").is_file():
                continue
            if subprocess.run([sys.executable, "-m", "hf_deepnmt_training.cli", *command], env=env, stdout=log,
                              stderr=subprocess.STDOUT, check=False).returncode != 0:
                return {"failed": "deepnmt " + " ".join(command)}
    test = json.loads(scores.read_text())
    return {"last": last, "test": {key: test.get(key) for key in ("bleu", "chrf", "ter")},
            "commands": ["deepnmt " + " ".join(command) for command in commands]}


def planned_runs(args: argparse.Namespace, report: dict, work: Path, rows: list[str], corpora: list[str],
                 sizes: list[str], budgets: list[str], seeds: list[int | None]) -> tuple[list, list]:
    """The runs still to train — ``(name, folder, deepnmt arguments, what the report records)``, the long budgets
    first so that the end comes sooner — and the recorded runs whose checkpoint average is still to score
    ``(name, folder, corpus)``."""
    todo, averaging = [], []
    for budget in sorted(budgets, key=float, reverse=True):
        for size in sizes:
            for row in rows:
                for corpus_name in corpora:
                    for seed in seeds:
                        name = run_name(size, budget, row, corpus_name, seed)
                        folder = work / name
                        measured = report["runs"].get(name) or {}
                        if measured.get("test"):
                            # measured (in this work folder or, from the committed JSON, in an earlier session); its
                            # average is still to score when the run's checkpoints are here and it has none of this K
                            trained_in = run_folder(measured, folder)  # a run recorded under another name: its own
                            if args.average_last > 0 and trained_in.is_dir() \
                                    and (measured.get("averaged") or {}).get("last") != args.average_last:
                                averaging.append((name, trained_in, corpus_name))
                            continue
                        key = {"corpus": corpus_name, "size": size, "budget_minutes": float(budget), "row": row}
                        if name != run_name(size, budget, row, corpus_name):
                            key["seed"] = seed
                        todo.append((name, folder, train_arguments(args, corpus(work, size, corpus_name), folder,
                                                                   budget, row, corpus_name, seed), key))
    return todo, averaging


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/defaults_budget", threads=1, rows=",".join(ROWS),
                               row_names=ROWS, test_samples=500, parallel=2)
    parser.add_argument("--sizes", default="10000,20000,full", help="Comma-separated training-set sizes (pairs, or "
                        "full = all 29,024).")
    parser.add_argument("--budgets", default="10,30", help="Comma-separated --max_train_minutes of the runs.")
    parser.add_argument("--average_last", type=int, default=2, help="Also score the average of each run's last "
                        "this many checkpoints (0: no averaging).")
    parser.add_argument("--source_lang", default="es", help="The Bible corpus's source language.")
    parser.add_argument("--target_lang", default="en", help="The Bible corpus's target language.")
    parser.add_argument("--seeds", default="", help="Comma-separated seeds each cell runs at (empty: each corpus's "
                        "own, 1 on the Bible, 42 on the others); a run at another seed is named ...-seedN, and the "
                        "tables score a cell by the mean of its seeds.")
    parser.add_argument("--corpora", default="bible", help="Comma-separated study corpora, of: " + ", ".join(CORPORA)
                        + " (issue 63's study: all three, --sizes full).")
    args = parser.parse_args()
    if render_only(args, NAME, render):
        return
    rows = chosen_rows(parser, args.rows, ROWS)
    corpora = [name.strip() for name in args.corpora.split(",") if name.strip()]
    for value in corpora:
        if value not in CORPORA:
            parser.error(f"--corpora: {value!r} is not a study corpus; choose from {', '.join(CORPORA)}")
    sizes = [size.strip() for size in args.sizes.split(",") if size.strip()]
    budgets = [budget.strip() for budget in args.budgets.split(",") if budget.strip()]
    for value in sizes:
        if value != "full" and not value.isdigit():
            parser.error(f"--sizes: {value!r} is neither a number of pairs nor 'full'")
    for value in budgets:
        try:
            float(value)
        except ValueError:
            parser.error(f"--budgets: {value!r} is not a number of minutes")
    try:
        seeds: list[int | None] = [int(seed) for seed in args.seeds.split(",") if seed.strip()] or [None]
    except ValueError:
        parser.error(f"--seeds: {args.seeds!r} is not a comma-separated list of whole numbers")
    work, results = Path(args.work_dir), Path(args.results)
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{NAME}.json"
    report = migrate(json.loads(path.read_text())) if path.is_file() else {"runs": {}}
    for run in report["runs"].values():  # runs described before passes and step times were recorded
        command = (run.get("command") or "").split()
        state = Path(command[command.index("--output_dir") + 1]) / "trainer_state.json" \
            if "--output_dir" in command else None
        if "passes" not in run and run.get("test") and state is not None and state.is_file():
            run.update(run_length(json.loads(state.read_text())))
    invocation = " ".join(["python", "-m", f"benchmarks.experiments.{NAME}", *sys.argv[1:]])
    report["commands"] = invocations(report, invocation)
    report.update(command=invocation, threads=args.threads, parallel=args.parallel, direction=f"{args.source_lang}-{args.target_lang}",
                  test_samples=args.test_samples, rows={row: ROWS[row] for row in ROWS})
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    todo, averaging = planned_runs(args, report, work, rows, corpora, sizes, budgets, seeds)

    def write() -> None:
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")

    # A run's checkpoint average is scored in a thread that takes one of the --parallel slots, so that the next
    # training run does not wait for it (and a training run is never timed beside more than --parallel jobs).
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    scoring: dict[Future, str] = {}

    def score_average(name: str, folder: Path, corpus_name: str) -> None:
        scoring[pool.submit(average, folder, args.average_last, args, env, work / f"{name}.log", corpus_name)] = name

    for name, folder, corpus_name in averaging:
        score_average(name, folder, corpus_name)
    running: list[tuple[str, Path, list[str], dict, subprocess.Popen, object, float]] = []
    while todo or running or scoring:
        while todo and len(running) + len(scoring) < args.parallel:
            name, folder, arguments, key = todo.pop(0)
            if key["row"] in BEFORE_WARMUP_RULE:
                set_aside_before_rule(work, name, key["row"])
            if (folder / "metrics.json").is_file() and (work / f"{name}.log").is_file():
                # it finished after its study process had been stopped: recorded, not trained again
                report["runs"][name] = {**key, **describe(folder, work / f"{name}.log", 0, arguments, None)}
                write()
                if report["runs"][name].get("test") and args.average_last > 0:
                    score_average(name, folder, key["corpus"])
                continue
            if folder.exists() and not (folder / "metrics.json").is_file():
                import shutil

                shutil.rmtree(folder)  # a run killed half-way starts again: a budget run is measured whole
            log = (work / f"{name}.log").open("w")
            process = subprocess.Popen([sys.executable, "-m", "hf_deepnmt_training.cli", *arguments], env=env,
                                       stdout=log, stderr=subprocess.STDOUT)
            running.append((name, folder, arguments, key, process, log, time.time()))
            print(f"started {name}", file=sys.stderr, flush=True)
        time.sleep(2)
        for future in [future for future in scoring if future.done()]:
            name = scoring.pop(future)
            report["runs"][name]["averaged"] = future.result()
            write()
            print(f"{name}: averaged {((future.result() or {}).get('test') or {}).get('bleu')}", file=sys.stderr,
                  flush=True)
        for entry in list(running):
            name, folder, arguments, key, process, log, started = entry
            if process.poll() is None:
                continue
            running.remove(entry)
            log.close()
            run = describe(folder, work / f"{name}.log", process.returncode, arguments, (time.time() - started) / 60)
            report["runs"][name] = {**key, **run}
            write()
            print(f"{name}: test {(run.get('test') or {}).get('bleu')}", file=sys.stderr, flush=True)
            if run.get("test") and args.average_last > 0:
                score_average(name, folder, key["corpus"])
    pool.shutdown()
    report = migrate(report)  # the runs recorded now, under the rows they are the runs of (as the next load would)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    render(report, results)


def issue41_view(runs: dict) -> dict:
    """Issue 41's tables compare its sweep with the defaults of its time, the Transformer: its runs (the `transformer`
    row since issue 63) stand in the `defaults` column there, and issue 63's rows — DTMT#1's defaults, its sweep, the
    mechanisms, the runs at other seeds — are left to the Issue 63 section."""
    view = {}
    for name, run in runs.items():
        if run.get("seed") is not None:
            continue
        if run.get("row") == "transformer":
            view[sibling(run, "defaults")] = {**run, "row": "defaults"}
        elif run.get("row") in ISSUE41_ROWS:
            view[name] = run
    return view


def invocations(report: dict, invocation: str | None = None) -> list[str]:
    """Every invocation of the study recorded in ``report`` (the list kept since 2026-11-28; before it, only the
    last one, ``command``), oldest first, with ``invocation`` appended when it is new."""
    kept = list(report.get("commands") or ([report["command"]] if report.get("command") else []))
    return kept + [invocation] if invocation and invocation not in kept else kept


def render(report: dict, results: Path) -> None:
    """The results page: per budget, one line per corpus size with each sweep row's test BLEU, the sweep's best, the
    defaults' dropout (the run-length rule's choice) and score, and their distance to the best and to the defaults of
    before the rule (the `dropout0.0` row); then every run with its command."""
    from hf_deepnmt_training.defaults import describe_dropout_rule, dropout_for_epochs

    report = migrate(report)
    every_run = report["runs"]
    runs = issue41_view({name: run for name, run in every_run.items() if run.get("corpus", "bible") == "bible"})
    described = {**ROWS, **report.get("rows", {})}
    measured = {run.get("row") for run in runs.values()}
    rows = ["defaults"] + [row for row in described if row != "defaults" and row in measured]
    sweep = rows[1:]
    source, target = report.get("direction", "es-en").split("-")
    lines = ["# Defaults vs a small sweep, by corpus size and time budget (issue 41)", "",
             f"Commands: {', '.join(f'`{command}`' for command in invocations(report))} and the others of the "
             f"*Every run* table's runs ({report.get('parallel')} runs at a time, {report.get('threads')} CPU thread each). Corpus: the "
             f"embedded Bible corpus {source}→{target} (a direction no default was tuned on), a seeded sample of its "
             f"training pairs per size; test: the first {report.get('test_samples')} verses of the held-out books, "
             "beam 4, of the checkpoint each run kept (best validation BLEU). *defaults* here are those of issue 41's "
             "time, the 2-6 Transformer (the `transformer` row since issue 63 made DTMT#1 the defaults: section "
             "*Issue 63*). Rows (`deepnmt train` options added to the user's command):", ""]
    lines += [f"- `{row}`: `{' '.join(described[row]) or '(nothing: the defaults)'}`" for row in rows]
    lines += ["", f"The defaults choose the dropout from the run's length in passes over the training data "
              f"({describe_dropout_rule()}; docs/defaults.md). *defaults' dropout* gives the passes `deepnmt train` "
              "estimated (its printed line) or, where the defaults were not run, the estimate from the `dropout0.0` "
              "run's step time and the score of the sweep row with that dropout (*= row*). *before*: the defaults "
              "before the rule, which were the `dropout0.0` row."]
    budgets = sorted({run["budget_minutes"] for run in runs.values() if run.get("row") != "defaults"})
    sizes = sorted({run["size"] for run in runs.values()}, key=lambda size: float("inf") if size == "full" else
                   int(size))
    for budget in budgets:
        lines += ["", f"## {budget:g} minutes of training", "",
                  "| pairs | " + " | ".join(sweep) + " | best | defaults' dropout | defaults | defaults − best | "
                  "defaults − before |", "|---|" + "---|" * (len(sweep) + 5)]
        for size in sizes:
            cells, scores = [], {}
            for row in sweep:
                run = runs.get(run_name(size, f"{budget:g}", row)) or {}
                bleu = (run.get("test") or {}).get("bleu")
                if bleu is not None:
                    scores[row] = bleu
                cells.append("–" if not run else
                             f"{bleu} ({run.get('steps')} steps{passes_text(run)})" if bleu is not None
                             else f"failed (exit {run.get('exit_code')})")
            best = max(scores, key=scores.get) if scores else None
            defaults = runs.get(run_name(size, f"{budget:g}", "defaults")) or {}
            choice, score = "–", None
            if (defaults.get("test") or {}).get("bleu") is not None:
                rule = defaults.get("rule") or {}
                choice = f"{rule.get('dropout')} (≈ {rule.get('passes')} passes)" if rule else "?"
                score, shown = defaults["test"]["bleu"], f"{defaults['test']['bleu']}"
            else:
                estimate = estimated_passes(runs.get(run_name(size, f"{budget:g}", "dropout0.0")) or {})
                if estimate is not None:
                    dropout = dropout_for_epochs(estimate)
                    choice = f"{dropout} (≈ {estimate:.1f} passes)"
                    score = scores.get(f"dropout{dropout}")
                shown = f"= dropout{dropout}: {score}" if score is not None else "–"
            gap = f"{score - scores[best]:+.2f}" if score is not None and best is not None else "–"
            gain = f"{score - scores['dropout0.0']:+.2f}" if score is not None and "dropout0.0" in scores else "–"
            label = "29,024 (full)" if size == "full" else f"{int(size):,}"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {best or '–'} | {choice} | {shown} | {gap} | "
                         f"{gain} |")
        deltas = [run["averaged"]["test"]["bleu"] - run["test"]["bleu"] for run in runs.values()
                  if run["budget_minutes"] == budget and run.get("test") and (run.get("averaged") or {}).get("test")]
        if deltas:
            lines += ["", f"Averaging the last checkpoints instead of keeping the best one: test BLEU "
                      f"{min(deltas):+.2f} … {max(deltas):+.2f} (mean {sum(deltas) / len(deltas):+.2f}) over "
                      f"{len(deltas)} runs (column *averaged* below)."]
    lines += corpora_section(every_run, described)
    runs = every_run
    lines += ["", "## Every run", "",
              "| run | test BLEU | chrF | steps | passes | s/step | kept | averaged (last K: BLEU) | minutes (wall) | "
              "command |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        test = run.get("test") or {}
        averaged = run.get("averaged") or {}
        averaged_cell = (f"last {averaged['last']}: {averaged['test']['bleu']}" if averaged.get("test")
                         else averaged.get("failed", "–"))
        note = f" ({run['ran_as']})" if run.get("ran_as") else ""
        lines.append(f"| {name}{note} | {test.get('bleu', 'failed')} | {test.get('chrf', '')} | "
                     f"{run.get('steps', '')} | {run.get('passes', '')} | {run.get('step_seconds', '')} | "
                     f"{run.get('kept') or ''} | {averaged_cell} | {run.get('wall_minutes') or '–'} | "
                     f"`{run.get('command')}` |")
    (results / f"{NAME}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def corpus_scores(runs: dict, budget: float, size: str = "full") -> dict[str, dict[str, float]]:
    """Test BLEU by corpus and row of the runs at ``budget`` minutes on ``size`` pairs: the mean over the cell's
    seeds (`cell_runs`), to two decimals."""
    cells: dict[str, dict[str, list[float]]] = {}
    for run in runs.values():
        bleu = (run.get("test") or {}).get("bleu")
        if bleu is not None and run["budget_minutes"] == budget and run["size"] == size:
            cells.setdefault(run.get("corpus", "bible"), {}).setdefault(run["row"], []).append(bleu)
    return {name: {row: round(sum(values) / len(values), 2) for row, values in by_row.items()}
            for name, by_row in cells.items()}


def cell_runs(runs: dict, budget: float, row: str, name: str, size: str = "full") -> list[dict]:
    """The finished runs of one cell of the tables — ``row`` on corpus ``name`` at ``budget`` minutes — at the
    corpus's own seed first, then at the others of ``--seeds``."""
    cell = [run for run in runs.values() if run.get("row") == row and run.get("corpus", "bible") == name
            and run["budget_minutes"] == budget and run["size"] == size and (run.get("test") or {}).get("bleu")
            is not None]
    return sorted(cell, key=lambda run: (run.get("seed") is not None, run.get("seed") or 0))


def mechanism_verdicts(scores: dict[str, dict[str, float]], corpora: list[str],
                       mechanisms: tuple[str, ...] = MECHANISMS) -> dict[str, dict]:
    """Issue 63's rule for a paper's mechanism: it enters the defaults when it beats the defaults it was added to by
    at least `MECHANISM_MARGIN` BLEU on at least `MECHANISM_WINS` of ``corpora`` — the `transformer` row where the
    corpus has one (the defaults of the time: every mechanism row was measured against it), else the `defaults` row.
    Per measured mechanism: its differences by corpus, its wins, and the verdict — ``"enters"``, ``"stays out"`` (it
    can no longer reach the wins on the corpora left to measure) or ``"open"``."""
    def baseline(name: str) -> float | None:
        measured = scores.get(name, {})
        return measured.get("transformer", measured.get("defaults"))

    verdicts = {}
    for row in mechanisms:
        deltas = {name: round(scores[name][row] - baseline(name), 2) for name in corpora
                  if row in scores.get(name, {}) and baseline(name) is not None}
        if not deltas:
            continue
        wins = sum(delta >= MECHANISM_MARGIN for delta in deltas.values())
        left = len(corpora) - len(deltas)
        verdict = "enters" if wins >= MECHANISM_WINS else "stays out" if wins + left < MECHANISM_WINS else "open"
        verdicts[row] = {"deltas": deltas, "wins": wins, "verdict": verdict}
    return verdicts


def leave_one_corpus_out(scores: dict[str, dict[str, float]], rows: list[str]) -> dict[str, dict]:
    """Issue 63's validation of a rule: for each corpus, the row picked on the other corpora — the one whose worst
    distance to those corpora's best row is smallest (then the highest mean score) — and its distance to the held-out
    corpus's best row. Only rows measured on every corpus compete; fewer than three corpora or two such rows
    give nothing."""
    corpora = sorted(scores)
    rows = [row for row in rows if all(row in scores[name] for name in corpora)]
    if len(corpora) < 3 or len(rows) < 2:  # one row is no choice
        return {}
    best = {name: max(scores[name][row] for row in rows) for name in corpora}
    result = {}
    for held_out in corpora:
        others = [name for name in corpora if name != held_out]
        picked = min(rows, key=lambda row: (max(best[name] - scores[name][row] for name in others),
                                            -sum(scores[name][row] for name in others)))
        result[held_out] = {"picked": picked, "gap": round(scores[held_out][picked] - best[held_out], 2),
                            "best_row": max(rows, key=lambda row: scores[held_out][row])}
    return result


def corpora_section(runs: dict, described: dict) -> list[str]:
    """Issue 63's tables: per budget, the rows measured on the whole of more than one study corpus, test BLEU and
    the difference to that corpus's defaults; the mechanisms' verdicts; the leave-one-corpus-out check of the rows
    measured on all three corpora."""
    lines: list[str] = []
    for budget in sorted({run["budget_minutes"] for run in runs.values()}):
        scores = corpus_scores(runs, budget)
        corpora = [name for name in CORPORA if name in scores]
        if len(corpora) < 2 or not any(name != "bible" for name in corpora):
            continue
        rows = ["defaults"] + [row for row in described if row != "defaults" and any(row in scores[name]
                                                                                     for name in corpora)
                               and (row in MECHANISMS or not repeated(runs, budget, row))]
        lines += ["", f"## Issue 63: three corpora, {budget:g} minutes, all training pairs", "",
                  "Test BLEU (beam 4) of the checkpoint each run kept, and its difference to the defaults' run on the "
                  "same corpus. Corpora: " + "; ".join(corpus_description(name) for name in corpora) + ".", "",
                  "| row | " + " | ".join(corpora) + " |", "|---|" + "---|" * len(corpora)]
        for row in rows:
            cells = []
            for name in corpora:
                measured = cell_runs(runs, budget, row, name)
                bleu = scores[name].get(row)
                delta = f" ({bleu - scores[name]['defaults']:+.2f})" if bleu is not None and row != "defaults" \
                    and "defaults" in scores[name] else ""
                seeds = "" if len(measured) < 2 else (
                    f" (mean of {len(measured)} seeds: {' / '.join(str(run['test']['bleu']) for run in measured)})")
                steps = " / ".join(str(run.get("steps")) for run in measured)
                cells.append("–" if bleu is None else f"{bleu}{delta}{seeds}, {steps} steps")
            # a row without --model_type whose runs trained the Transformer (measured before DTMT#1 was the defaults')
            on_transformer = row != "defaults" and "--model_type" not in ROWS.get(row, []) and all(
                run_model_type(run) == "deep_transformer"
                for name in corpora for run in cell_runs(runs, budget, row, name))
            lines.append(f"| `{row}`{' (on the Transformer)' if on_transformer else ''} | " + " | ".join(cells) + " |")
        verdicts = mechanism_verdicts(scores, [name for name in CORPORA])
        if verdicts:
            lines += ["", f"A paper's mechanism enters the defaults where it wins by ≥ {MECHANISM_MARGIN} BLEU on "
                      f"≥ {MECHANISM_WINS} of the {len(CORPORA)} corpora over the defaults it was added to (the "
                      "`transformer` row, the defaults before issue 63):", ""]
            lines += [f"- `{row}`: {verdict['wins']} win(s) of {len(verdict['deltas'])} measured corpora "
                      f"({', '.join(f'{name} {delta:+.2f}' for name, delta in verdict['deltas'].items())}): "
                      f"**{verdict['verdict']}**" for row, verdict in verdicts.items()]
        rules = [row for row in rows if row not in MECHANISMS and row not in TWO_RULES
                 and all(row in scores[name] for name in corpora)]
        held_out = leave_one_corpus_out(scores, rules)
        if held_out:
            lines += ["", f"Leave one corpus out over the rows {', '.join(f'`{row}`' for row in rules)} measured on "
                      "all three: the row picked on the other two (smallest worst distance to their best rows), "
                      "scored on the held-out corpus:", "", "| held out | picked | its distance to the best | best |",
                      "|---|---|---|---|"]
            lines += [f"| {name} | `{check['picked']}` | {check['gap']:+.2f} | `{check['best_row']}` |"
                      for name, check in held_out.items()]
    return lines


def repeated(runs: dict, budget: float, row: str, size: str = "full") -> bool:
    """Whether every run of ``row`` at ``budget`` minutes on ``size`` pairs is recorded under another row's name as
    well (`migrate`: a copy marked ``ran_as``), so that issue 63's tables show it once, under the row it is the run
    of now."""
    own = [run for run in runs.values() if run.get("row") == row and run["budget_minutes"] == budget
           and run["size"] == size and run.get("test") and not run.get("ran_as")]
    def identity(run: dict) -> tuple:  # a copy keeps the run's command and results; a new run of the same command
        return run.get("command"), run.get("steps"), json.dumps(run.get("test"), sort_keys=True)  # differs in them

    copies = {identity(run) for run in runs.values() if run.get("ran_as") and run.get("row") != row}
    return bool(own) and all(identity(run) in copies for run in own)


def corpus_description(name: str) -> str:
    chosen = CORPORA[name]
    if name == "bible":
        return "bible: the embedded corpus (the direction and test verses of the page's first section)"
    return f"{name}: software messages {chosen.source}→{chosen.target}, every test pair ({chosen.build})"


def passes_text(run: dict) -> str:
    return f", {run['passes']:g} passes" if run.get("passes") else ""


if __name__ == "__main__":
    main()
