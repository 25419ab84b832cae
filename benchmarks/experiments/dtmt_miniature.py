"""meng2019 in miniature: does a deep transition RNN beat the shallow RNMT of the same width on the embedded corpus?

meng2019 (Tables 1, 3, 6) reports that deepening the transition between consecutive hidden states helps: ShallowRNMT
(GRU) < L-GRU < DTMT#1 < DTMT#4, and DTMT#4 beats a Transformer. This script runs those rows at a size this machine
can train, with equal budgets (same data, token batches, steps, evaluation schedule and seed): one `deepnmt train`
run per row and seed, rows one after the other, then writes ``dtmt_miniature.json``, ``dtmt_miniature.md`` and
``dtmt_miniature.png`` (training NLL, validation loss and BLEU) under ``results/``.

Rows (`--rows`, in this order by default), all d_model 128 on the `meng2019-bible-dtmt4` recipe unless stated:

* ``gru``          ShallowRNMT: GRU units, no T-GRU (``rnn_cell=gru, transition_depth=0``);
* ``lgru``         ShallowRNMT + L-GRU (Table 6 row 2, ``transition_depth=0``);
* ``dtmt1``        DTMT#1 (one T-GRU above every L-GRU);
* ``dtmt4``        DTMT#4;
* ``transformer``  a Transformer of about DTMT#4's parameter count: the miniature recipe's pre-LN d_model-128
                   model with a 6-layer decoder instead of 2 (its own optimiser: lr 3e-3, inverse-sqrt).

Tokens/s is source tokens (padded batches, length-bucketed) per second of training, evaluation time excluded, measured under whatever
else runs on the machine: a rough figure; `benchmarks/RESULTS.md` (section `dtmt`) has the interleaved ratios.

    python -m benchmarks.experiments.dtmt_miniature                                      # the committed result
    python -m benchmarks.experiments.dtmt_miniature --max_steps 20 --eval_steps 10 --rows gru,dtmt4   # smoke
    python -m benchmarks.experiments.dtmt_miniature --render_only                        # table and plot from JSON

Report whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from .common import chosen_rows, experiment_parser, history, miniature_recipe, plot_runs, series

ROWS = ("gru", "lgru", "dtmt1", "dtmt4", "transformer")
LABELS = {"gru": "ShallowRNMT (GRU)", "lgru": "ShallowRNMT + L-GRU", "dtmt1": "DTMT#1", "dtmt4": "DTMT#4",
          "transformer": "Transformer 6-6 (pre-LN)"}
NAME = "dtmt_miniature"


def row_command(row: str, seed: int, args: argparse.Namespace, output_dir: Path) -> list[str]:
    """The `deepnmt train` command of one row and seed."""
    if row == "transformer":
        recipe, overrides = "miniature", f"d_model={args.d_model},decoder_layers=6"
    else:
        cell, depth = {"gru": ("gru", 0), "lgru": ("lgru", 0), "dtmt1": ("lgru", 1), "dtmt4": ("lgru", 4)}[row]
        recipe, overrides = "meng2019-bible-dtmt4", f"d_model={args.d_model},rnn_cell={cell},transition_depth={depth}"
    return [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", recipe, "--output_dir", str(output_dir),
        "--config_overrides", overrides, "--max_steps", str(args.max_steps), "--max_tokens", str(args.max_tokens),
        "--eval_steps", str(args.eval_steps), "--save_strategy", "no", "--logging_steps", "10",
        "--max_eval_samples", str(args.eval_samples), "--max_predict_samples", str(args.test_samples),
        "--eval_num_beams", "4", "--disable_tqdm", "true", "--seed", str(seed),
        "--include_num_input_tokens_seen", "true",
    ]


def summarize_run(folder: Path) -> dict:
    """Curves, test scores, parameters and training speed of one finished run folder."""
    entry: dict = {}
    if (folder / "trainer_state.json").exists():
        log = history(folder)
        for key in ("nll", "eval_loss", "eval_bleu", "eval_chrf"):
            entry[key] = series(log, key)
        final = next((item for item in reversed(log) if "train_runtime" in item), {})
        evaluating = sum(item.get("eval_runtime", 0.0) for item in log)
        tokens = max((item.get("num_input_tokens_seen", 0) for item in log), default=0)
        training_seconds = final.get("train_runtime", 0.0) - evaluating
        entry["training_minutes"] = round(training_seconds / 60, 1)
        entry["source_tokens"] = tokens
        entry["source_tokens_per_s"] = round(tokens / training_seconds, 1) if training_seconds > 0 else None
    if (folder / "metrics.json").exists():
        metrics = json.loads((folder / "metrics.json").read_text())
        entry["test"] = metrics.get("test")
    if (folder / "model.safetensors").exists():
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), "pt") as handle:  # tied weights are stored once
            entry["parameters"] = sum(_numel(handle.get_slice(name).get_shape()) for name in handle.keys())
    return entry


def _numel(shape: list[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/dtmt_miniature", threads=1, plots=True, rows=",".join(ROWS),
                               row_names=ROWS, seeds="1", max_steps=1500, max_tokens=2048, eval_steps=500,
                               eval_samples=200, test_samples=500)
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--append", action="store_true",
                        help="Keep the runs already in the results' JSON (e.g. add seeds) and add these.")
    args = parser.parse_args()
    results = Path(args.results)
    if args.render_only:
        report = json.loads((results / f"{NAME}.json").read_text())
        write_markdown(report, results / f"{NAME}.md")
        plot(report, results / f"{NAME}.png")
        return
    rows = chosen_rows(parser, args.rows, ROWS)
    seeds = [int(seed) for seed in args.seeds.split(",")]

    work = Path(args.work_dir)
    results.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    command = " ".join(["python", "-m", "benchmarks.experiments.dtmt_miniature", *sys.argv[1:]])
    report = {"commands": [], "setup": vars(args), "wall_minutes": 0.0, "runs": {}}
    if args.append and (results / f"{NAME}.json").exists():
        report = json.loads((results / f"{NAME}.json").read_text())
    report["commands"].append(command)
    started = time.time()
    for seed in seeds:
        for row in rows:
            folder = work / f"{row}-seed{seed}-{int(started)}"
            begun = time.time()
            with open(work / f"{folder.name}.log", "w") as log:
                code = subprocess.run(row_command(row, seed, args, folder), env=env, stdout=log, stderr=log).returncode
            entry = {"row": row, "seed": seed, "exit_code": code, "folder": str(folder),
                     "wall_minutes": round((time.time() - begun) / 60, 1), **summarize_run(folder)}
            report["runs"][f"{row}/seed{seed}"] = entry
            print(f"{row} seed {seed}: exit {code} after {entry['wall_minutes']} min, test "
                  f"{(entry.get('test') or {}).get('bleu')}", file=sys.stderr, flush=True)
            report["wall_minutes"] = round(report.get("wall_minutes", 0.0) + entry["wall_minutes"], 1)
            (results / f"{NAME}.json").write_text(json.dumps(report, indent=2) + "\n")  # after every run
    write_markdown(report, results / f"{NAME}.md")
    plot(report, results / f"{NAME}.png")


def _tail_mean(points: list, count: int = 5) -> float | None:
    values = [value for _, value in points[-count:]]
    return sum(values) / len(values) if values else None


def _by_row(report: dict) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for entry in report["runs"].values():
        grouped.setdefault(entry["row"], []).append(entry)
    return {row: sorted(grouped[row], key=lambda e: e["seed"]) for row in ROWS if row in grouped}


def _fmt(values: list[float | None], digits: int = 2) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def write_markdown(report: dict, path: Path) -> None:
    setup = report["setup"]
    grouped = _by_row(report)
    transformer_recipe = miniature_recipe(entry["folder"] for entry in grouped.get("transformer", []))
    lines = [
        f"# meng2019 in miniature: ShallowRNMT, L-GRU, DTMT#1, DTMT#4 and a Transformer at d_model {setup['d_model']}",
        "",
        "Command(s): " + "; ".join(f"`{c}`" for c in report["commands"]) + f" ({report['wall_minutes']} min of runs in all, "
        f"{setup['threads']} CPU thread each, on the shared 2-core machine). Embedded "
        f"WEB→RV1909 corpus (en→es), joint BPE 4000, {setup['max_tokens']}-token batches, {setup['max_steps']} steps "
        f"for every row (equal data and steps), validation every {setup['eval_steps']} steps on "
        f"{setup['eval_samples']} verses (greedy), test on the first {setup['test_samples']} test verses (beam 4; "
        "DTMT rows with the paper's length penalty 0.6, the Transformer with 1.0). RNN rows: recipe "
        "`meng2019-bible-dtmt4` (Adam 0.9/0.999, eq. (17) schedule lr0 1e-3, n = 2, clip 5.0, dropouts "
        f"0.2/0.1/0.2, label smoothing 0.1); Transformer row: recipe {transformer_recipe} with a 6-layer decoder "
        "(pre-LN, 4 heads, FFN 512, lr 3e-3 inverse-sqrt, clip 1.0).",
        "",
        "Values are the mean ± standard deviation over seeds where a row ran with several.",
        "",
        *([report["note"], ""] if report.get("note") else []),
        "| row | seeds | parameters | training min | source tok/s | train NLL (last 5 logs) | valid loss | "
        "valid BLEU (greedy) | test BLEU (beam 4) | test chrF |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row, entries in grouped.items():
        params = entries[0].get("parameters")
        cells = [LABELS[row], ",".join(str(e["seed"]) for e in entries), f"{params / 1e6:.2f}M" if params else "n/a",
            _fmt([e.get("training_minutes") for e in entries], 1),
            _fmt([e.get("source_tokens_per_s") for e in entries], 0),
            _fmt([_tail_mean(e.get("nll", [])) for e in entries], 3),
            _fmt([e["eval_loss"][-1][1] if e.get("eval_loss") else None for e in entries], 3),
            _fmt([e["eval_bleu"][-1][1] if e.get("eval_bleu") else None for e in entries], 2),
            _fmt([(e.get("test") or {}).get("bleu") for e in entries], 2),
            _fmt([(e.get("test") or {}).get("chrf") for e in entries], 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Per run:", "", "| run | exit | wall min | test BLEU | test chrF |", "|---|---|---|---|---|"]
    for name, entry in report["runs"].items():
        test = entry.get("test") or {}
        lines.append(f"| {name} | {entry['exit_code']} | {entry['wall_minutes']} | {test.get('bleu', 'n/a')} | "
                     f"{test.get('chrf', 'n/a')} |")
    reading = report.get("reading")
    if reading:
        lines += ["", "## Reading", "", reading]
    lines += ["", f"![curves]({NAME}.png)", ""]
    path.write_text("\n".join(lines))


def plot(report: dict, path: Path) -> None:
    runs = {}
    for name, entry in report["runs"].items():
        label = f"{LABELS[entry['row']]} s{entry['seed']}"
        runs[label] = {key: entry.get(key, []) for key in ("nll", "eval_loss", "eval_bleu")}
    plot_runs(runs, [("nll", "training NLL"), ("eval_loss", "validation loss"), ("eval_bleu", "validation BLEU")],
              path, f"meng2019 in miniature (d_model {report['setup']['d_model']})", markers=("eval_loss", "eval_bleu"))


if __name__ == "__main__":
    main()
