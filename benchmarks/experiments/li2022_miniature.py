"""li2022 in miniature: does a deep decoder collapse on the embedded corpus, and do CAD and CRT change that?

li2022 (Table 1, Fig. 1, Table 3) reports that deepening the decoder makes it *collapse*: training perplexity keeps
falling while BLEU drops to ~0, because the decoder degenerates into an unconditional language model; cross-attention
drop (CAD) repairs it and the DDR / ALD losses (CRT) add to that. This script runs that comparison at a size this
machine can train, with equal budgets (same data, seed, token batches, steps and schedule): one `deepnmt train` run per
row, differing only in the model's decoder depth and li2022 switches, then writes ``li2022_miniature.json``,
``li2022_miniature.md`` and ``li2022_miniature.png`` (training NLL, validation BLEU, source reliance) under
``results/``.

Rows (`--rows`, in this order by default):

* ``shallow``   the baseline: ENC-2 (a 2-layer decoder);
* ``deep``      DEEP: ENC-D;
* ``cad``       DEEP+CAD (Table 3 "+CAD"): decoder layers 1..round(0.78·D) drop cross-attention with p_net;
* ``full``      DEEP+CAD+CRT (Table 3 "DEEP-30L-Full"): CAD + DDR + ALD (weights 1.0, p_ALD 0.3, τ 0.1);
* ``crt``       DEEP+CRT without CAD (Table 3 "−CAD");
* ``full-ddr``  / ``full-ald``: Table 3's "−DDR" / "−ALD" (optional; not in the default set).

"Source reliance" (docs/li2022.md, `hf_deepnmt.losses.source_reliance`) is the mean per-token KL between the model's
predictions with the real source and with an all-``<unk>`` source: ≈ 0 for a collapsed decoder.

    python -m benchmarks.experiments.li2022_miniature                                   # the committed result
    python -m benchmarks.experiments.li2022_miniature --max_steps 20 --eval_steps 10 --rows shallow,full   # smoke

Rows run ``--parallel`` at a time, one CPU thread each. Report whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import chosen_rows, experiment_parser, history, miniature_recipe, plot_runs, series

ROWS = ("shallow", "deep", "cad", "full", "crt", "full-ddr", "full-ald")
DEFAULT_ROWS = "shallow,deep,cad,full,crt"
LABELS = {"shallow": "shallow", "deep": "DEEP", "cad": "DEEP+CAD", "full": "DEEP+CAD+CRT", "crt": "DEEP+CRT (−CAD)",
          "full-ddr": "DEEP+CAD+ALD (−DDR)", "full-ald": "DEEP+CAD+DDR (−ALD)"}


def row_overrides(row: str, args: argparse.Namespace) -> str:
    """The model config of one row (on top of the miniature recipe's d_model 128, pre-LN, 6-layer encoder)."""
    depth = 2 if row == "shallow" else args.decoder_layers
    drop_depth = round(0.78 * depth)  # li2022 Fig. 2: best L_dr = 21 of 27
    cad = row in ("cad", "full", "full-ddr", "full-ald")
    ddr = row in ("full", "crt", "full-ald")
    ald = row in ("full", "crt", "full-ddr")
    fields = {
        "encoder_layers": args.encoder_layers, "decoder_layers": depth,
        "layer_norm_position": args.layer_norm_position,
        "cross_attention_drop_depth": drop_depth if cad else 0,
        "cross_attention_drop_ratio": args.drop_ratio if cad else 0.0,
        "ddr_weight": 1.0 if ddr else 0.0, "ald_weight": 1.0 if ald else 0.0,
    }
    return ",".join(f"{key}={value}" for key, value in fields.items())


def run_args(row: str, args: argparse.Namespace, output_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", "miniature", "--output_dir", str(output_dir),
        "--config_overrides", row_overrides(row, args), "--max_steps", str(args.max_steps),
        "--max_tokens", str(args.max_tokens), "--learning_rate", str(args.learning_rate),
        "--warmup_steps", str(args.warmup_steps), "--eval_steps", str(args.eval_steps), "--save_strategy", "no",
        "--logging_steps", "10", "--max_eval_samples", str(args.eval_samples), "--max_predict_samples", str(args.test_samples),
        "--eval_num_beams", "4", "--disable_tqdm", "true", "--seed", "1",
    ]


def final_source_reliance(folder: Path, pairs: int) -> float | None:
    """Source reliance of the saved model on the first ``pairs`` test verses (teacher forcing)."""
    if not (folder / "model.safetensors").exists():
        return None
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_deepnmt  # noqa: F401
    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.recipes import resolve_path
    from hf_deepnmt_training.translate import corpus_source_reliance

    torch.set_num_threads(1)
    corpus = read_parallel_file(resolve_path("corpus:web-sparv/test.jsonl.gz"), "en", "es", pairs)
    return corpus_source_reliance(AutoModelForSeq2SeqLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder),
                                  corpus.sources, corpus.targets, max_pairs=pairs)


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/li2022_miniature", threads=1, plots=True, rows=DEFAULT_ROWS,
                               row_names=ROWS, max_steps=600, max_tokens=1024, learning_rate=3e-3, warmup_steps=200,
                               eval_steps=200, eval_samples=100, test_samples=300, parallel=2)
    parser.add_argument("--encoder_layers", type=int, default=6)
    parser.add_argument("--decoder_layers", type=int, default=12, help="D, the deep decoder's depth.")
    parser.add_argument("--layer_norm_position", default="pre", choices=("pre", "post"))
    parser.add_argument("--drop_ratio", type=float, default=0.5, help="CAD's p_net.")
    parser.add_argument("--reliance_pairs", type=int, default=200)
    args = parser.parse_args()
    if args.render_only:
        results = Path(args.results)
        report = json.loads((results / "li2022_miniature.json").read_text())
        write_markdown(report, results / "li2022_miniature.md")
        plot(report, results / "li2022_miniature.png")
        return
    rows = chosen_rows(parser, args.rows, ROWS)

    work, results = Path(args.work_dir), Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    started = time.time()
    pending = sorted(rows, key=lambda row: row in ("shallow", "deep", "cad"))  # the slow CRT rows start first
    running: dict[str, tuple[Path, subprocess.Popen, float]] = {}
    finished: dict[str, dict] = {}
    while pending or running:
        while pending and len(running) < args.parallel:
            row = pending.pop(0)
            folder = work / f"{row}-{int(started)}"
            log = open(work / f"{folder.name}.log", "w")
            running[row] = (folder, subprocess.Popen(run_args(row, args, folder), env=env, stdout=log, stderr=log),
                            time.time())
        time.sleep(5)
        for row in [row for row, (_, process, _) in running.items() if process.poll() is not None]:
            folder, process, begun = running.pop(row)
            finished[row] = {"exit_code": process.returncode, "folder": str(folder),
                             "minutes": round((time.time() - begun) / 60, 1)}
            print(f"{row}: exit {process.returncode} after {finished[row]['minutes']} min, {folder}", file=sys.stderr)

    report = {"command": " ".join([sys.executable, "-m", "benchmarks.experiments.li2022_miniature", *sys.argv[1:]]),
              "setup": vars(args), "wall_minutes": round((time.time() - started) / 60, 1), "runs": {}}
    for row in sorted(rows, key=ROWS.index):
        entry = finished[row]
        folder = Path(entry["folder"])
        entry["overrides"] = row_overrides(row, args)
        if (folder / "trainer_state.json").exists():
            log = history(folder)
            for key in ("loss", "nll", "ddr", "ald", "eval_loss", "eval_bleu", "eval_source_reliance"):
                entry[key] = series(log, key)
        if (folder / "metrics.json").exists():
            metrics = json.loads((folder / "metrics.json").read_text())
            entry["test"] = metrics.get("test")
            entry["parameters"] = metrics.get("parameters")
        entry["test_source_reliance"] = final_source_reliance(folder, args.reliance_pairs)
        report["runs"][row] = entry
    (results / "li2022_miniature.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, results / "li2022_miniature.md")
    plot(report, results / "li2022_miniature.png")


def _tail_mean(points: list, count: int = 5) -> str:
    """Mean of the last ``count`` logged values (training logs are noisy)."""
    values = [value for _, value in points[-count:]]
    return f"{sum(values) / len(values):.3f}" if values else "n/a"


def _last(points: list) -> str:
    return f"{points[-1][1]:.3f}" if points else "n/a"


def write_markdown(report: dict, path: Path) -> None:
    setup = report["setup"]
    lines = [
        f"# li2022 in miniature: {setup['encoder_layers']}-layer encoder, decoders of 2 and {setup['decoder_layers']} "
        f"layers, d_model 128, {setup['layer_norm_position']}-LN",
        "",
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall, {setup['parallel']} rows at a time, "
        f"{setup['threads']} CPU thread each). Embedded WEB→RV1909 corpus (en→es), recipe "
        f"{miniature_recipe(run['folder'] for run in report['runs'].values())}: its model "
        f"(d_model 128, 4 heads, FFN 512) and optimizer (lr {setup['learning_rate']}, inverse-sqrt, "
        f"{setup['warmup_steps']} warm-up steps), {setup['max_tokens']}-token batches, {setup['max_steps']} steps for "
        f"every row, seed 1. CAD: p_net = {setup['drop_ratio']} on decoder layers 1..round(0.78·D); CRT: DDR and ALD "
        "weights 1.0, p_ALD 0.3, τ 0.1.",
        "",
        "Source reliance = mean per-token KL(P(y|X) ‖ P(y|all-<unk> X)) in nats (docs/li2022.md): ≈ 0 means the decoder "
        "ignores the source (collapse).",
        "",
        f"| row | exit | minutes | train NLL (last 5 logs) | valid loss | valid BLEU (greedy, {setup['eval_samples']}) | "
        f"test BLEU / chrF (beam 4, {setup['test_samples']}) | source reliance: valid (last eval) / test |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row, run in report["runs"].items():
        test = run.get("test") or {}
        reliance = run.get("test_source_reliance")
        lines.append(
            f"| {LABELS[row]} | {run['exit_code']} | {run['minutes']} | {_tail_mean(run.get('nll', []))} | "
            f"{_last(run.get('eval_loss', []))} | {_last(run.get('eval_bleu', []))} | "
            f"{test.get('bleu', 'n/a')} / {test.get('chrf', 'n/a')} | {_last(run.get('eval_source_reliance', []))} / "
            f"{'n/a' if reliance is None else f'{reliance:.3f}'} |"
        )
    lines += [
        "",
        "How to read it: *minutes* is wall time under whatever else ran on the 2 cores at the time (the CRT rows ran "
        "beside two other trainings and a benchmark), not a step-cost comparison — that is `benchmarks/RESULTS.md`, "
        "section `crt_cost`. ALD trains the model on `<unk>`-masked sources, the very input source reliance probes, so "
        "the CRT rows' reliance measures that training as much as use of the source; compare it between rows without "
        "ALD.",
        "",
        "![curves](li2022_miniature.png)",
        "",
    ]
    path.write_text("\n".join(lines))


def plot(report: dict, path: Path) -> None:
    setup = report["setup"]
    plot_runs({LABELS[row]: run for row, run in report["runs"].items()},
              [("nll", "training NLL"), ("eval_bleu", "validation BLEU (greedy)"),
               ("eval_source_reliance", "source reliance (nats/token)")], path,
              f"li2022 in miniature: decoder depth 2 vs {setup['decoder_layers']}, CAD and CRT "
              f"({setup['max_steps']} steps each)", markers=("eval_bleu", "eval_source_reliance"))


if __name__ == "__main__":
    main()
