"""`deepnmt train` from scratch without a recipe: the NMT defaults against transformers' old defaults, equal time.

Both runs are the same command — training data, validation and test files, language pair, seed — and differ only
in ``--nmt_defaults``: ``true`` (the defaults of training/defaults.py, docs/defaults.md: model size and batch from
the data size and device, inverse-sqrt schedule with warm-up, lr for the model, label smoothing 0.1, validation
BLEU) or ``false --label_smoothing_factor 0`` (what `deepnmt train` did before these defaults: transformers'
fine-tuning defaults — lr 5e-5, linear decay, no warm-up, 8-sentence batches — on the 6-6 d_model-512 post-LN model
of `DeepTransformerConfig`'s defaults, no label smoothing). Each gets the same wall-clock training budget
(``--max_train_minutes``); they run at the same time, one CPU thread each, so they share the machine alike.

The corpus is one the defaults were not tuned on: the embedded Bible corpus in the direction the project never
trained, Spanish → English (RV1909 → WEB; every tuning run, the quickstart included, was English → Spanish).
Test: the first ``--test_samples`` verses of the held-out test books, beam 4.

    python -m benchmarks.experiments.train_defaults                          # 10 minutes each, the committed result
    python -m benchmarks.experiments.train_defaults --minutes 0.3 --test_samples 8    # smoke

Writes ``train_defaults.json`` and ``train_defaults.md`` under ``results/`` next to this script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .common import experiment_parser, history, render_only, series

SETUPS = {
    "nmt_defaults": ["--nmt_defaults", "true"],
    "old_defaults": ["--nmt_defaults", "false", "--label_smoothing_factor", "0"],
}


def train_command(args: argparse.Namespace, output_dir: Path, setup: str) -> list[str]:
    return [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--train_file", "corpus:web-sparv/train.jsonl.gz",
        "--validation_file", "corpus:web-sparv/valid.jsonl.gz", "--test_file", "corpus:web-sparv/test.jsonl.gz",
        "--source_lang", args.source_lang, "--target_lang", args.target_lang, "--output_dir", str(output_dir),
        "--max_train_minutes", str(args.minutes), "--max_predict_samples", str(args.test_samples),
        "--save_strategy", "no", "--disable_tqdm", "true", "--report_to", "none", "--seed", "1",
        *SETUPS[setup],
    ]


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/train_defaults", threads=1, test_samples=500,
                               helps={"threads": "CPU threads of each run (they run at once)."})
    parser.add_argument("--minutes", type=float, default=10.0, help="Training budget of each run (wall clock).")
    parser.add_argument("--source_lang", default="es")
    parser.add_argument("--target_lang", default="en")
    args = parser.parse_args()
    results_dir = Path(args.results)
    if render_only(args, "train_defaults", render):
        return
    work = Path(args.work_dir) / time.strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1")
    started = time.time()
    processes = {}
    for setup in SETUPS:
        log = (work / f"{setup}.log").open("w")
        processes[setup] = (subprocess.Popen(train_command(args, work / setup, setup), env=env, stdout=log,
                                             stderr=subprocess.STDOUT), log)
    runs = {}
    for setup, (process, log) in processes.items():
        code = process.wait()
        log.close()
        runs[setup] = describe_run(work / setup, work / f"{setup}.log", code)
    report = {"command": " ".join([sys.executable, "-m", "benchmarks.experiments.train_defaults", *sys.argv[1:]]),
              "setup": {key: value for key, value in vars(args).items() if key != "render_only"},
              "wall_minutes": round((time.time() - started) / 60, 1),
              "commands": {setup: " ".join(train_command(args, Path("OUT"), setup)[3:]) for setup in SETUPS},
              "runs": runs}
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "train_defaults.json").write_text(json.dumps(report, indent=2) + "\n")
    render(report, results_dir)


def describe_run(folder: Path, log_path: Path, code: int) -> dict:
    text = log_path.read_text(errors="replace")
    run: dict = {"exit_code": code, "resolved": [line.split("]", 1)[1].strip() for line in text.splitlines()
                                                 if line.startswith("[deepnmt]   ")]}  # the printed defaults
    if code != 0 or not (folder / "metrics.json").exists():
        run["log_tail"] = text[-2000:]
        return run
    metrics = json.loads((folder / "metrics.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    log = history(folder)
    run.update({
        "test": metrics.get("test"),
        "steps": json.loads((folder / "trainer_state.json").read_text())["global_step"],
        "train_minutes": round(metrics.get("timings_seconds", {}).get("train_seconds", 0) / 60, 1),
        "model": {key: config.get(key) for key in ("model_type", "d_model", "encoder_layers", "decoder_layers",
                                                    "encoder_ffn_dim", "layer_norm_position", "transition_depth",
                                                    "dropout", "vocab_size", "label_smoothing")},
        "eval_bleu": series(log, "eval_bleu"), "loss": series(log, "loss"),
    })
    match = re.search(r"train: (\d+) pairs", text)
    run["train_pairs"] = int(match.group(1)) if match else None
    return run


def render(report: dict, results_dir: Path) -> None:
    setup = report["setup"]
    lines = [
        "# `deepnmt train` without a recipe: NMT defaults vs the old (transformers') defaults, equal training time",
        "",
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall). Corpus: the embedded Bible corpus "
        f"{setup['source_lang']}→{setup['target_lang']} (a direction no default was tuned on); both runs at once, "
        f"{setup['threads']} CPU thread each, {setup['minutes']} min of training each (`--max_train_minutes`); test: "
        f"first {setup['test_samples']} verses of the held-out books, beam 4. The two commands differ only in their "
        "last options:",
        "",
    ]
    for name, command in report["commands"].items():
        lines.append(f"- {name}: `deepnmt {command}`")
    lines += ["", "| setup | model | steps | training + evaluation min | test BLEU | test chrF | validation BLEU (step: value) |",
              "|---|---|---|---|---|---|---|"]
    for name, run in report["runs"].items():
        if run.get("test") is None:
            lines.append(f"| {name} | failed (exit {run['exit_code']}) | | | | | |")
            continue
        m = run["model"]
        shape = (f"DTMT#{m['transition_depth']} d{m['d_model']}" if m.get("model_type") == "dtmt" else
                 f"{m['encoder_layers']}-{m['decoder_layers']} d{m['d_model']} FFN {m['encoder_ffn_dim']} "
                 f"{m['layer_norm_position']}-LN")  # DTMT: the CPU defaults' model since issue 63
        model = f"{shape}, dropout {m['dropout']}, vocab {m['vocab_size']}, label smoothing {m['label_smoothing']}"
        curve = ", ".join(f"{step}: {value}" for step, value in run["eval_bleu"]) or "not evaluated"
        lines.append(f"| {name} | {model} | {run['steps']} | {run['train_minutes']} | {run['test']['bleu']} | "
                     f"{run['test']['chrf']} | {curve} |")
    resolved = report["runs"].get("nmt_defaults", {}).get("resolved")
    if resolved:
        lines += ["", "What `deepnmt train` printed for the defaults run:", "", "```"]
        lines += resolved
        lines += ["```"]
    (results_dir / "train_defaults.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
