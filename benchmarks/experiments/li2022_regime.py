"""li2022 at CPU scale, step 1: search for the regime in which a deep decoder collapses.

li2022 (Table 1, §3) reports that a deep decoder trained normally can degenerate into an unconditional language
model: low training loss, BLEU near 0, the source ignored. Its §3 blames post-LN, the learning rate and warm-up, the
depth ratio and a target side that can be memorised. This script trains a grid of CPU-sized models (d_model 128,
the miniature recipe's width) that vary exactly those, with equal budgets, and tabulates for each: final training
NLL, validation loss, test BLEU/chrF (beam 4), and li2022's collapse monitor, source reliance (mean per-token KL
between predictions with the real and with an all-``<unk>`` source, at every evaluation; ≈ 0 = collapsed).

Step 2, in the regime found, compares DEEP with CAD, CRT and both: ``--rows`` of the ``cad*`` / ``crt*`` kind below.

    python -m benchmarks.experiments.li2022_regime --rows shallow,deep-post --max_steps 3000      # CPU (hours)
    python -m benchmarks.experiments.li2022_regime --device cuda --parallel 6 ...                   # one GPU
    python -m benchmarks.experiments.li2022_regime --render_only --results DIR
    python -m benchmarks.experiments.li2022_regime --render_report      # the tables of li2022-cpu-scale.md

Every run is one `deepnmt train` process; the device only changes speed, not the recipe. Results:
``<results>/li2022_regime.{json,md,png}`` (or ``--name``). Negative results stay in the table. The hand-written report
of the three steps, ``li2022-cpu-scale.md``, holds its tables in generated blocks that ``--render_report`` rewrites
from the committed JSONs (``CPU_SCALE_RESULTS``); the text around them is not generated.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import experiment_parser, history, merge_generated, plot_runs, series

DEEP = 16  # the deep decoder's depth (li2022 collapses at 15 and 27 decoder layers)
SMALL_DATA = 3000  # training pairs of the small-data rows (the target side can be memorised)
CAD = {"cross_attention_drop_depth": round(21 / 27 * DEEP), "cross_attention_drop_ratio": 0.5}
CRT = {"ddr_weight": 1.0, "ald_weight": 1.0}

# name: (model overrides on top of the miniature recipe, extra `deepnmt train` arguments, description)
ROWS: dict[str, tuple[dict, list[str], str]] = {
    "shallow": ({"decoder_layers": 2, "layer_norm_position": "pre"}, ["--learning_rate", "3e-3"],
                "6-2 pre-LN, lr 3e-3 (the miniature recipe's model, the quickstart's until 2026-11-23)"),
    "deep-pre": ({"decoder_layers": DEEP, "layer_norm_position": "pre"}, ["--learning_rate", "3e-3"],
                 f"6-{DEEP} pre-LN, lr 3e-3"),
    "deep-post": ({"decoder_layers": DEEP, "layer_norm_position": "post"},
                  ["--learning_rate", "1e-3", "--warmup_steps", "1000"], f"6-{DEEP} post-LN, lr 1e-3, warm-up 1000"),
    "deep-post-hot": ({"decoder_layers": DEEP, "layer_norm_position": "post"},
                      ["--learning_rate", "3e-3", "--warmup_steps", "200"], f"6-{DEEP} post-LN, lr 3e-3, warm-up 200"),
    "shallow-small": ({"decoder_layers": 2, "layer_norm_position": "pre"},
                      ["--learning_rate", "3e-3", "--max_train_samples", str(SMALL_DATA)],
                      f"6-2 pre-LN, lr 3e-3, {SMALL_DATA} training pairs"),
    "deep-post-small": ({"decoder_layers": DEEP, "layer_norm_position": "post"},
                        ["--learning_rate", "1e-3", "--warmup_steps", "1000", "--max_train_samples", str(SMALL_DATA)],
                        f"6-{DEEP} post-LN, lr 1e-3, {SMALL_DATA} training pairs"),
    "deep-pre-small": ({"decoder_layers": DEEP, "layer_norm_position": "pre"},
                       ["--learning_rate", "3e-3", "--max_train_samples", str(SMALL_DATA)],
                       f"6-{DEEP} pre-LN, lr 3e-3, {SMALL_DATA} training pairs"),
    "enc1-deep-post": ({"encoder_layers": 1, "decoder_layers": DEEP, "layer_norm_position": "post"},
                       ["--learning_rate", "1e-3", "--warmup_steps", "1000"],
                       f"1-{DEEP} post-LN (depth ratio), lr 1e-3"),
}
# Step 2: the collapse-prone setting (filled in from step 1) with li2022's remedies. Each is "<base row>+<remedy>".
REMEDIES = {"cad": CAD, "crt": CRT, "cad-crt": {**CAD, **CRT}, "admin": {"residual_scaling": "admin"},
            "admin-cad-crt": {**CAD, **CRT, "residual_scaling": "admin"}}
# The hand-written report of the three steps and the results its generated blocks (its tables) are rendered from.
CPU_SCALE_REPORT = "li2022-cpu-scale.md"
CPU_SCALE_RESULTS = {"step1": "li2022_regime_step1", "step2": "li2022_regime_step2", "step3": "li2022_cad_crt_cost"}


def row_spec(name: str) -> tuple[dict, list[str], str]:
    base, _, remedy = name.partition("+")
    if base not in ROWS or (remedy and remedy not in REMEDIES):
        raise ValueError(f"--rows: {name!r} is not a row; use one of {list(ROWS)}, optionally +{'/+'.join(REMEDIES)}.")
    overrides, extra, description = ROWS[base]
    if remedy:
        overrides = {**overrides, **REMEDIES[remedy]}
        description += f" + {remedy.upper().replace('-', '+')}"
    return overrides, extra, description


def train_command(name: str, folder: Path, args: argparse.Namespace, seed: int) -> list[str]:
    overrides, extra, _ = row_spec(name)
    fields = ",".join(f"{key}={value}" for key, value in overrides.items())
    command = [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", "miniature", "--output_dir", str(folder),
        "--config_overrides", fields, "--max_steps", str(args.max_steps), "--max_tokens", str(args.max_tokens),
        "--eval_steps", str(args.eval_steps), "--save_strategy", "no", "--logging_steps", "25",
        "--max_eval_samples", str(args.eval_samples), "--max_predict_samples", str(args.test_samples),
        "--eval_num_beams", "4", "--disable_tqdm", "true", "--seed", str(seed), "--warmup_steps", "200", *extra,
    ]
    if args.device == "cuda":
        command += ["--use_cpu", "false"]
    return command


def main() -> None:
    parser = experiment_parser(
        __doc__, work_dir="runs/li2022_regime", threads=2, plots=True,
        rows="shallow,deep-pre,deep-post,deep-post-hot,shallow-small,deep-post-small", seeds="1", max_steps=3000,
        max_tokens=2048, eval_steps=500, eval_samples=100, test_samples=300, device=True, parallel=1,
        helps={"rows": f"Comma-separated rows: each one of {list(ROWS)}, optionally +{'/+'.join(REMEDIES)}."})
    parser.add_argument("--name", default="li2022_regime", help="Base name of the result files.")
    parser.add_argument("--render_report", action="store_true",
                        help=f"Rewrite the tables of {CPU_SCALE_REPORT} in --results from its JSONs, nothing else.")
    parser.add_argument("--from_logs", default=None, help="Build the report from a folder of run logs (the "
                        "stdout of each `deepnmt train`, named <row>-seed<N>-<time>.log) instead of training, e.g. "
                        "for runs a time limit cut short.")
    args = parser.parse_args()
    results = Path(args.results)
    if args.from_logs:
        report_from_logs(Path(args.from_logs), args, results)
        return
    if args.render_report:
        render_cpu_scale(results)
        return
    if args.render_only:
        report = json.loads((results / f"{args.name}.json").read_text())
        write_markdown(report, results / f"{args.name}.md")
        plot(report, results / f"{args.name}.png")
        return
    rows = [row.strip() for row in args.rows.split(",") if row.strip()]
    for row in rows:
        row_spec(row)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    started = time.time()
    pending = [(row, seed) for seed in seeds for row in rows]
    running, finished = {}, {}
    while pending or running:
        while pending and len(running) < args.parallel:
            row, seed = pending.pop(0)
            folder = work / f"{row.replace('+', '_')}-seed{seed}-{int(started)}"
            log = open(work / f"{folder.name}.log", "w")
            running[(row, seed)] = (folder, subprocess.Popen(train_command(row, folder, args, seed), env=env,
                                                             stdout=log, stderr=log), time.time())
        time.sleep(3)
        done = [key for key, (_, process, _) in running.items() if process.poll() is not None]
        for key in done:
            folder, process, begun = running.pop(key)
            finished[key] = {"exit_code": process.returncode, "folder": str(folder),
                             "minutes": round((time.time() - begun) / 60, 1)}
            print(f"{key}: exit {process.returncode} after {finished[key]['minutes']} min", file=sys.stderr, flush=True)
        if done:  # results so far: a run cut short by a time limit still leaves the finished rows
            write_report(finished, args, started, results)


def write_report(finished: dict, args: argparse.Namespace, started: float, results: Path) -> None:
    report = {"command": " ".join([sys.executable, "-m", "benchmarks.experiments.li2022_regime", *sys.argv[1:]]),
              "setup": vars(args), "wall_minutes": round((time.time() - started) / 60, 1), "runs": {}}
    for (row, seed), entry in finished.items():
        folder = Path(entry["folder"])
        overrides, extra, description = row_spec(row)
        entry.update(row=row, seed=seed, description=description, overrides=overrides, arguments=extra)
        if (folder / "trainer_state.json").exists():
            log = history(folder)
            for key in ("nll", "ddr", "ald", "eval_loss", "eval_bleu", "eval_source_reliance"):
                entry[key] = series(log, key)
        if (folder / "metrics.json").exists():
            metrics = json.loads((folder / "metrics.json").read_text())
            entry["test"] = {k: metrics["test"][k] for k in ("bleu", "chrf", "ter", "sentences")} if metrics.get(
                "test") else None
            entry["train_seconds"] = metrics.get("timings_seconds", {}).get("train_seconds")
        report["runs"][f"{row}/seed{seed}"] = entry
    (results / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, results / f"{args.name}.md")
    plot(report, results / f"{args.name}.png")


def report_from_logs(folder: Path, args: argparse.Namespace, results: Path) -> None:
    """The report of runs known only from their logs: every logged training and evaluation entry, and whether the
    run reached its end. A cut-short run has no test score."""
    import ast

    report = {"command": " ".join([sys.executable, "-m", "benchmarks.experiments.li2022_regime", *sys.argv[1:]]),
              "setup": vars(args), "wall_minutes": None, "runs": {}}
    for log in sorted(folder.glob("*.log")):
        name, seed = log.stem.rsplit("-seed", 1)
        row, seed = name.replace("_", "+"), int(seed.split("-")[0])
        entries = []
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{'"):
                entries.append({key: float(value) for key, value in ast.literal_eval(line).items()})
        steps = [entry for entry in entries if "loss" in entry]
        for number, entry in enumerate(steps, start=1):
            entry["step"] = number * 25  # logging_steps 25
        evaluations = [entry for entry in entries if "eval_loss" in entry]
        for number, entry in enumerate(evaluations, start=1):
            entry["step"] = number * args.eval_steps
        _, _, description = row_spec(row)
        finished = any("train_runtime" in entry for entry in entries)
        report["runs"][f"{row}/seed{seed}"] = {
            "row": row, "seed": seed, "description": description, "exit_code": 0 if finished else None,
            "status": "finished" if finished else f"cut short at step {steps[-1]['step'] if steps else 0}",
            "nll": series(steps, "nll"), "ald": series(steps, "ald"), "ddr": series(steps, "ddr"),
            "eval_loss": series(evaluations, "eval_loss"), "eval_bleu": series(evaluations, "eval_bleu"),
            "eval_source_reliance": series(evaluations, "eval_source_reliance"),
        }
    (results / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, results / f"{args.name}.png")


def _mean_last(points: list, count: int = 5) -> float | None:
    values = [value for _, value in points[-count:]]
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def write_markdown(report: dict, path: Path) -> None:
    setup = report["setup"]
    lines = [
        f"# li2022 regime search: {setup['max_steps']} steps per row, {setup['max_tokens']}-token batches, "
        f"device {setup['device']}",
        "",
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall, {setup['parallel']} runs at a time). "
        "Embedded WEB→RV1909 corpus (en→es), quickstart width (d_model 128, 4 heads, FFN 512), 6-layer encoder unless "
        "stated, AdamW inverse-sqrt; every row the same data order, batches and steps.",
        "",
        "Source reliance = mean per-token KL(P(y|X) ‖ P(y|all-<unk> X)) in nats on validation pairs (docs/li2022.md): "
        "≈ 0 means the decoder ignores the source — li2022's collapse.",
        "",
        f"| row | setting | seed | train NLL (last logs) | valid loss | test BLEU / chrF (beam 4, {setup['test_samples']}) "
        "| source reliance over evals | train min |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["runs"].values():
        test = entry.get("test") or {}
        reliance = " → ".join(f"{value:.2f}" for _, value in entry.get("eval_source_reliance", []))
        lines.append(
            f"| {entry['row']} | {entry['description']} | {entry['seed']} | {_fmt(_mean_last(entry.get('nll', [])))} | "
            f"{_fmt(entry['eval_loss'][-1][1] if entry.get('eval_loss') else None)} | "
            f"{test.get('bleu', 'n/a')} / {test.get('chrf', 'n/a')} | {reliance or 'n/a'} | "
            f"{_fmt((entry.get('train_seconds') or 0) / 60, 1)} |"
            if entry["exit_code"] == 0 else
            f"| {entry['row']} | {entry['description']} | {entry['seed']} | failed (exit {entry['exit_code']}) | | | | |")
    lines += ["", f"![curves]({path.stem}.png)", ""]
    path.write_text("\n".join(lines))


def render_cpu_scale(results: Path) -> None:
    """Rewrite the generated blocks of ``<results>/li2022-cpu-scale.md`` from the JSONs of ``CPU_SCALE_RESULTS``."""
    reports = {step: json.loads((results / f"{name}.json").read_text()) for step, name in CPU_SCALE_RESULTS.items()}
    path = results / CPU_SCALE_REPORT
    path.write_text(merge_generated(path.read_text(encoding="utf-8"), cpu_scale_blocks(**reports)), encoding="utf-8")


def cpu_scale_blocks(step1: dict, step2: dict, step3: dict) -> list[tuple[str, str]]:
    """The generated blocks of li2022-cpu-scale.md, ``(name, markdown)``: the table of each step, rendered from its
    results alone (step 2's also shows the step-1 rows it starts from): every number in them is a JSON's value, or
    a mean or difference of such values, printed as the table prints it."""
    return [("step1", _step1_table(step1)), ("step2", _step2_table(step1, step2)), ("step3", _step3_table(step3))]


def _step1_table(report: dict) -> str:
    setup = report["setup"]
    lines = [
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall, {setup['parallel']} runs at a time, "
        f"device {setup['device']}).",
        "",
        f"| row | setting | train NLL (last 5 logs) | valid loss | valid BLEU (greedy, {setup['eval_samples']} pairs) "
        f"| test BLEU / chrF (beam 4, {setup['test_samples']}) | source reliance at each evaluation (every "
        f"{setup['eval_steps']} steps) |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in _ordered(report):
        reliance = " → ".join(_num(value) for _, value in entry.get("eval_source_reliance", []))
        lines.append(f"| {entry['row']} | {entry['description']} | {_num(_mean_last(entry.get('nll', [])))} | "
                     f"{_last_value(entry, 'eval_loss')} | {_last_value(entry, 'eval_bleu')} | {_test(entry)} | "
                     f"{reliance or 'n/a'} |")
    return "\n".join(lines)


def _step2_table(step1: dict, step2: dict) -> str:
    """Step 2's rows, each group after the step-1 row it adds a remedy to; the last evaluation's step in brackets."""
    setup = step2["setup"]
    lines = [
        f"Built from the runs' logs by `{step2['command']}`.",
        "",
        "| row | setting | train NLL (last 5 logs) | last evaluation (step) | valid loss | valid BLEU (greedy, "
        f"{setup['eval_samples']} pairs) | source reliance | test BLEU / chrF (beam 4, {setup['test_samples']}) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    references = {entry["row"]: entry for entry in step1["runs"].values()}
    added = _ordered(step2)
    for base in dict.fromkeys(entry["row"].partition("+")[0] for entry in added):
        group = [("step 1", references[base])] if base in references else []
        group += [("step 2", entry) for entry in added if entry["row"].partition("+")[0] == base]
        for step, entry in group:
            nll = _num(_mean_last(entry.get("nll", [])))
            finished = entry.get("status", "finished") == "finished"
            if not finished:
                nll += f" (to step {entry['nll'][-1][0]})"
            test = _test(entry) if entry.get("test") else ("not recorded" if finished else entry["status"])
            evaluations = entry.get("eval_loss", [])
            lines.append(f"| {entry['row']} ({step}) | {entry['description']} | {nll} | "
                         f"{evaluations[-1][0] if evaluations else 'n/a'} | {_last_value(entry, 'eval_loss')} | "
                         f"{_last_value(entry, 'eval_bleu')} | {_last_value(entry, 'eval_source_reliance')} | "
                         f"{test} |")
    return "\n".join(lines)


def _step3_table(report: dict) -> str:
    """One line per row with its seeds side by side (and their mean), then per remedy row its paired differences to
    its base row (same seed) and their mean."""
    setup = report["setup"]
    by_row: dict[str, dict[int, dict]] = {}
    for entry in _ordered(report):
        by_row.setdefault(entry["row"], {})[entry["seed"]] = entry
    lines = [
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall, {setup['parallel']} runs at a time, "
        f"device {setup['device']}).",
        "",
        f"| row | setting | seeds | test BLEU (beam 4, {setup['test_samples']}; mean) | test chrF (mean) | valid loss | "
        "source reliance (last evaluation) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row, runs in by_row.items():
        entries = list(runs.values())
        lines.append(
            f"| {row} | {entries[0]['description']} | {', '.join(str(seed) for seed in runs)} | "
            f"{_seeds([(entry.get('test') or {}).get('bleu') for entry in entries])} | "
            f"{_seeds([(entry.get('test') or {}).get('chrf') for entry in entries])} | "
            f"{', '.join(_last_value(entry, 'eval_loss') for entry in entries)} | "
            f"{', '.join(_last_value(entry, 'eval_source_reliance') for entry in entries)} |")
    for row, runs in by_row.items():
        base = row.partition("+")[0]
        plain = by_row.get(base, {}) if base != row else {}
        pairs = [(runs[seed], plain[seed]) for seed in runs
                 if seed in plain and runs[seed].get("test") and plain[seed].get("test")]
        if not pairs:
            continue
        bleu = [remedy["test"]["bleu"] - reference["test"]["bleu"] for remedy, reference in pairs]
        chrf = [remedy["test"]["chrf"] - reference["test"]["chrf"] for remedy, reference in pairs]
        loss = [remedy["eval_loss"][-1][1] - reference["eval_loss"][-1][1] for remedy, reference in pairs]
        lines.append(f"| {row} − {base}, same seed | | {', '.join(str(remedy['seed']) for remedy, _ in pairs)} | "
                     f"{_seeds(bleu, signed=True)} | {_seeds(chrf, signed=True)} | "
                     f"{', '.join(f'{value:+.2f}' for value in loss)} | |")
    return "\n".join(lines)


def _ordered(report: dict) -> list[dict]:
    """The runs of ``report`` by base row (``ROWS`` order), remedy (none first, then ``REMEDIES`` order) and seed."""
    def key(entry: dict) -> tuple[int, int, int]:
        base, _, remedy = entry["row"].partition("+")
        return list(ROWS).index(base), ["", *REMEDIES].index(remedy), entry["seed"]

    return sorted(report["runs"].values(), key=key)


def _num(value: float | None, digits: int = 2) -> str:
    """``value`` to ``digits`` decimals, without the sign of a value that rounds to zero (the logs hold −0.0)."""
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text


def _last_value(entry: dict, key: str) -> str:
    points = entry.get(key) or []
    return _num(points[-1][1]) if points else "n/a"


def _test(entry: dict) -> str:
    test = entry.get("test") or {}
    return f"{_num(test.get('bleu'))} / {_num(test.get('chrf'))}" if test else "n/a"


def _seeds(values: list[float | None], signed: bool = False) -> str:
    """The values of the seeds side by side and their mean in brackets."""
    known = [value for value in values if value is not None]
    if not known:
        return "n/a"
    show = (lambda value: f"{value:+.2f}") if signed else _num  # noqa: E731
    return f"{', '.join(show(value) for value in known)} ({show(sum(known) / len(known))})"


def plot(report: dict, path: Path) -> None:
    runs = {f"{entry['row']} (s{entry['seed']})": entry for entry in report["runs"].values()}
    plot_runs(runs, [("nll", "training NLL"), ("eval_loss", "validation loss"),
                     ("eval_source_reliance", "source reliance (nats/token)")], path,
              f"li2022 regime search ({report['setup']['max_steps']} steps each)",
              markers=("eval_loss", "eval_source_reliance"))


if __name__ == "__main__":
    main()
