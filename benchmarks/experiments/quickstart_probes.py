"""How the quickstart's model was chosen: variants of the old quickstart recipe trained for the same steps.

Each probe is `deepnmt train --recipe miniature` (the quickstart recipe as it stood before this search, kept under
that name: 6-layer encoder, 2-layer decoder, d_model 128, dropout 0.1, lr 3e-3, 2048-token batches, 1400 steps,
seed 42; the probes of 2026-11-23 ran it as `--recipe quickstart`, the same file then) with a few options changed,
one CPU thread, no checkpoints. The table reports validation BLEU (greedy, 200 verses) at every evaluation and the
final test BLEU (998 verses, beam 4) — equal steps; equal time is the quickstart's own measurement (README).

    python -m benchmarks.experiments.quickstart_probes --probes dropout0,dropout0-4-4     # train these probes
    python -m benchmarks.experiments.quickstart_probes --collect                          # table of what finished
    python -m benchmarks.experiments.quickstart_probes --render_only                      # markdown from the JSON

Writes ``quickstart_probes.json`` / ``.md`` under ``results/`` next to this script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .common import experiment_parser, history, render_only, series

# name -> the options added to the old quickstart recipe
OLD_RECIPE = ["--config_overrides", "dropout=0.1,encoder_layers=6,decoder_layers=2"]
PROBES: dict[str, list[str]] = {
    "old-quickstart-6-2": OLD_RECIPE,
    "dropout0": ["--config_overrides", "dropout=0.0,encoder_layers=6,decoder_layers=2"],
    "dropout0-lr6e-3": ["--config_overrides", "dropout=0.0,encoder_layers=6,decoder_layers=2",
                        "--learning_rate", "0.006"],
    "dropout0-4-4": ["--config_overrides", "dropout=0.0,encoder_layers=4,decoder_layers=4"],
    "dropout0-3-5": ["--config_overrides", "dropout=0.0,encoder_layers=3,decoder_layers=5"],
    "dropout0-2-6": ["--config_overrides", "dropout=0.0,encoder_layers=2,decoder_layers=6"],
}


# Probes whose folder this table cannot read, with where their figures come from.
NOT_IN_A_FOLDER = {
    "old-quickstart-6-2": "the quickstart as README reports it (2 threads, same recipe and seed): validation BLEU "
                          "350: 0.3, 700: 1.3, 1050: 2.5, 1400: 4.5; test BLEU 4.93, chrF 23.56. Re-run on 2026-11-23 from "
                          "a clean clone on the quiet machine, 2 threads (`deepnmt quickstart --config_overrides "
                          "encoder_layers=6,decoder_layers=2,dropout=0.1 --eval_steps 350 --save_steps 350`): test "
                          "BLEU 5.15, chrF 23.92, 10.1 min",
    "dropout0-lr6e-3": "stopped at step ~870 as clearly worse (its log): validation BLEU 350: 0.62, 700: 1.46",
}


def command(name: str, work: Path) -> list[str]:
    return [sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", "miniature", "--output_dir",
            str(work / name), "--max_steps", "1400", "--eval_steps", "350", "--max_eval_samples", "200",
            "--learning_rate", "0.003", "--seed", "42", "--save_strategy", "no", "--disable_tqdm", "true",
            *PROBES[name]]


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/probe", threads=1)
    parser.add_argument("--probes", default="", help=f"Comma-separated probes to train, of {list(PROBES)}.")
    parser.add_argument("--collect", action="store_true", help="Only build the table from finished probes.")
    args = parser.parse_args()
    if render_only(args, "quickstart_probes", render):
        return
    work = Path(args.work_dir)
    names = [name for name in args.probes.split(",") if name]
    unknown = [name for name in names if name not in PROBES]
    if unknown:
        parser.error(f"--probes: {unknown} are not probes; use some of {list(PROBES)}.")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1")
    if not args.collect:
        for name in names:
            with (work / f"{name}.log").open("w") as log:
                subprocess.run(command(name, work), env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    rows = {}
    for name in PROBES:
        folder = work / name
        if not (folder / "trainer_state.json").exists():
            continue
        log = history(folder)
        metrics = json.loads((folder / "metrics.json").read_text()) if (folder / "metrics.json").exists() else {}
        rows[name] = {"command": " ".join(["deepnmt", *command(name, Path("runs/probe"))[3:]]),
                      "eval_bleu": series(log, "eval_bleu"), "eval_loss": series(log, "eval_loss"),
                      "steps": json.loads((folder / "trainer_state.json").read_text())["global_step"],
                      "test": metrics.get("test"), "timings_seconds": metrics.get("timings_seconds")}
    results = Path(args.results)
    previous = results / "quickstart_probes.json"
    # step times are measured by `python -m benchmarks.quickstart_probe_steps` (the benchmark harness) and kept here
    timed = json.loads(previous.read_text()).get("step_seconds", {}) if previous.exists() else {}
    report = {"probes": rows, "step_seconds": timed}
    (results / "quickstart_probes.json").write_text(json.dumps(report, indent=2) + "\n")
    render(report, results)


def render(report: dict, results_dir: Path) -> None:
    """``quickstart_probes.md`` from the results' JSON: one row per probe that has a folder, the probes known only
    from elsewhere (``NOT_IN_A_FOLDER``) with where their figures come from, and the step-time ratios."""
    rows, timed = report["probes"], report["step_seconds"]
    lines = ["# Quickstart probes: variants of the old quickstart recipe (now `miniature`) at equal steps", "",
             "One CPU thread each, on the shared 2-core machine (other runs beside them), seed 42, 1400 steps, "
             "2048-token batches, lr 3e-3 inverse-sqrt unless the row says otherwise. Validation: 200 verses, greedy; "
             "test: the 998 held-out verses, beam 4. Command of each row below the table "
             "(`python -m benchmarks.experiments.quickstart_probes --probes NAME`; the probes of 2026-11-23 ran the "
             "same recipe file as `--recipe quickstart`, its name then).", "",
             "| probe | steps | validation BLEU (step: value) | validation loss (last) | test BLEU | test chrF | "
             "step time vs old |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        curve = ", ".join(f"{step}: {value}" for step, value in row["eval_bleu"])
        loss = f"{row['eval_loss'][-1][1]:.3f}" if row["eval_loss"] else "–"
        test = row["test"] or {}
        lines.append(f"| {name} | {row['steps']} | {curve} | {loss} | {test.get('bleu', '– (stopped)')} | "
                     f"{test.get('chrf', '–')} | {_ratio(timed, name)} |")
    for name, note in NOT_IN_A_FOLDER.items():
        if name not in rows:
            lines.append(f"| {name} | {note} | | | | | {_ratio(timed, name)} |")
    if timed:
        lines += ["", "*step time vs old*: median time of one training step (forward, backward, AdamW) of the probe's "
                  "model over that of the old quickstart model: the benchmark harness's synthetic batch of 2048 source "
                  "tokens (8000-token vocabulary), 1 thread, median of 8 interleaved repeats "
                  "(`python -m benchmarks.quickstart_probe_steps`)."]
    lines += [""] + [f"- {name}: `{row['command']}`" for name, row in rows.items()]
    (results_dir / "quickstart_probes.md").write_text("\n".join(lines) + "\n")


def _ratio(timed: dict[str, float], name: str) -> str:
    base = timed.get("old-quickstart-6-2")
    return f"{timed[name] / base:.2f}×" if base and name in timed else "–"


if __name__ == "__main__":
    main()
