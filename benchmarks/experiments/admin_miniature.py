"""liu2020 in miniature: a deep post-LN Transformer at lr 1e-3, default init vs ADMIN, on the embedded corpus.

liu2020 (Table 1, Fig. 2a) reports that a 60L-12L post-LN Transformer with default init diverges while ADMIN trains.
This script runs the same comparison at a size this machine can train: two `deepnmt train` runs that differ only in
``residual_scaling`` (none vs admin, ω profiled on real data before the first step), same data, seed, batches and
steps, then writes ``admin_miniature.json``, ``admin_miniature.md`` and ``admin_miniature.png`` (training loss,
validation loss, gradient norm) next to this script under ``results/``.

    python -m benchmarks.experiments.admin_miniature                    # 24L-12L d256, the committed result
    python -m benchmarks.experiments.admin_miniature --encoder_layers 6 --decoder_layers 6 --max_steps 50   # smoke

Both runs go in parallel, one CPU thread each (set --threads to change). Report whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import experiment_parser, history, plot_runs, series


def run_args(args: argparse.Namespace, scaling: str, output_dir: Path) -> list[str]:
    overrides = (f"d_model={args.d_model},encoder_ffn_dim={4 * args.d_model},decoder_ffn_dim={4 * args.d_model},"
                 f"encoder_layers={args.encoder_layers},decoder_layers={args.decoder_layers},"
                 f"encoder_attention_heads=4,decoder_attention_heads=4,layer_norm_position=post,residual_scaling={scaling}")
    return [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", "miniature", "--output_dir", str(output_dir),
        "--config_overrides", overrides, "--max_steps", str(args.max_steps), "--max_tokens", str(args.max_tokens),
        "--learning_rate", str(args.learning_rate), "--warmup_steps", str(args.warmup_steps),
        "--lr_scheduler_type", "inverse_sqrt", "--max_grad_norm", "0.0",  # no clipping, as the authors' recipe
        "--eval_steps", str(args.eval_steps), "--save_strategy", "no", "--logging_steps", "10",
        "--max_eval_samples", "200", "--max_predict_samples", str(args.test_samples), "--eval_num_beams", "4",
        "--admin_profile_tokens", "4096", "--disable_tqdm", "true", "--seed", "1",
    ]


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/admin_miniature", threads=1, plots=True, max_steps=500,
                               max_tokens=1024, learning_rate=1e-3, warmup_steps=200, eval_steps=100, test_samples=300)
    parser.add_argument("--encoder_layers", type=int, default=24)
    parser.add_argument("--decoder_layers", type=int, default=12)
    parser.add_argument("--d_model", type=int, default=256)
    args = parser.parse_args()
    if args.render_only:
        results = Path(args.results)
        report = json.loads((results / "admin_miniature.json").read_text())
        write_markdown(report, results / "admin_miniature.md")
        plot(report, results / "admin_miniature.png")
        return

    work, results = Path(args.work_dir), Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    started = time.time()
    runs = {}
    work.mkdir(parents=True, exist_ok=True)
    for scaling in ("none", "admin"):
        folder = work / f"{args.encoder_layers}L-{args.decoder_layers}L-{scaling}-{int(started)}"
        log = open(work / f"{folder.name}.log", "w")
        runs[scaling] = (folder, subprocess.Popen(run_args(args, scaling, folder), env=env, stdout=log, stderr=log))
    for scaling, (folder, process) in runs.items():
        process.wait()
        print(f"{scaling}: exit {process.returncode}, {folder}", file=sys.stderr)

    report = {"command": " ".join([sys.executable, "-m", "benchmarks.experiments.admin_miniature", *sys.argv[1:]]),
              "setup": vars(args), "wall_minutes": round((time.time() - started) / 60, 1), "runs": {}}
    for scaling, (folder, process) in runs.items():
        entry = {"exit_code": process.returncode, "folder": str(folder)}
        if (folder / "trainer_state.json").exists():
            log = history(folder)
            entry["train_loss"] = series(log, "loss")
            entry["nll"] = series(log, "nll")
            entry["grad_norm"] = series(log, "grad_norm")
            entry["valid_loss"] = series(log, "eval_loss")
            entry["valid_bleu"] = series(log, "eval_bleu")
        if (folder / "metrics.json").exists():
            metrics = json.loads((folder / "metrics.json").read_text())
            entry["test"] = metrics.get("test")
            entry["seconds"] = metrics["timings_seconds"]
        log_file = work / f"{folder.name}.log"
        profile = [line for line in log_file.read_text().splitlines() if "ADMIN profile" in line]
        entry["admin_profile_log"] = profile[0] if profile else None
        if scaling == "admin" and (folder / "model.safetensors").exists():
            import hf_deepnmt
            from transformers import AutoModelForSeq2SeqLM

            entry["omega_after_training"] = hf_deepnmt.omega_values(AutoModelForSeq2SeqLM.from_pretrained(folder))
        report["runs"][scaling] = entry
    (results / "admin_miniature.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, results / "admin_miniature.md")
    plot(report, results / "admin_miniature.png")


def _last(points: list, default: str = "n/a") -> str:
    return f"{points[-1][1]:.3f}" if points else default


def write_markdown(report: dict, path: Path) -> None:
    setup = report["setup"]
    lines = [
        f"# liu2020 in miniature: {setup['encoder_layers']}L-{setup['decoder_layers']}L post-LN, d_model "
        f"{setup['d_model']}, lr {setup['learning_rate']}",
        "",
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall, both runs in parallel, "
        f"{setup['threads']} CPU thread each). Same data (embedded WEB→RV1909 corpus), seed, token batches "
        f"({setup['max_tokens']} tokens), inverse-sqrt schedule with {setup['warmup_steps']} warm-up steps, no gradient "
        f"clipping, {setup['max_steps']} steps; the runs differ only in `residual_scaling`.",
        "",
        "| init | exit | last train loss | last valid loss | last valid BLEU (greedy, 200) | test BLEU / chrF (beam 4) | "
        "max grad norm |",
        "|---|---|---|---|---|---|---|",
    ]
    for scaling, run in report["runs"].items():
        test = run.get("test") or {}
        norms = [value for _, value in run.get("grad_norm", [])]
        lines.append(
            f"| {'default' if scaling == 'none' else 'ADMIN'} | {run['exit_code']} | {_last(run.get('train_loss', []))} | "
            f"{_last(run.get('valid_loss', []))} | {_last(run.get('valid_bleu', []))} | "
            f"{test.get('bleu', 'n/a')} / {test.get('chrf', 'n/a')} | {f'{max(norms):.2f}' if norms else 'n/a'} |"
        )
    admin = report["runs"].get("admin", {})
    if admin.get("admin_profile_log"):
        lines += ["", f"ADMIN profile: `{admin['admin_profile_log'].split('] ', 1)[-1]}`"]
    if admin.get("omega_after_training"):
        omega = admin["omega_after_training"]
        lines += ["", "ω after training (mean over d): encoder first/last "
                  f"{omega['encoder'][0]:.3f} / {omega['encoder'][-1]:.3f}, decoder first/last "
                  f"{omega['decoder'][0]:.3f} / {omega['decoder'][-1]:.3f}."]
    lines += ["", "![curves](admin_miniature.png)", ""]
    path.write_text("\n".join(lines))


def plot(report: dict, path: Path) -> None:
    setup = report["setup"]
    runs = {"default init" if scaling == "none" else "ADMIN": run for scaling, run in report["runs"].items()}
    plot_runs(runs, [("train_loss", "training loss (label-smoothed)"), ("valid_loss", "validation NLL"),
                     ("grad_norm", "gradient norm")], path,
              f"{setup['encoder_layers']}L-{setup['decoder_layers']}L post-LN d{setup['d_model']}, "
              f"lr {setup['learning_rate']}: default init vs ADMIN", markers=("valid_loss",), log_scale=("grad_norm",))


if __name__ == "__main__":
    main()
