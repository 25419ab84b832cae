"""bf16 on the CPU: the miniature recipe (the quickstart's until 2026-11-23) trained in float32 and under bf16 autocast, then translated both ways.

Two `deepnmt train --recipe miniature` runs that differ only in ``--bf16`` (same data, seed, batches, steps), one
after the other with the same thread count, then the float32 run's model translates the test set with and without
``deepnmt translate --bf16``. Writes ``bf16_cpu.json`` and ``bf16_cpu.md`` under ``results/`` next to this script:
training wall time and final losses of both runs, test BLEU of both models, and float32 vs bf16 decoding of one model.

    python -m benchmarks.experiments.bf16_cpu                     # 400 steps each, the committed result
    python -m benchmarks.experiments.bf16_cpu --max_steps 20 --test_samples 16    # smoke

bf16 autocast on a CPU without native bf16 instructions is emulated and slow: run this where it is meant to help.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import experiment_parser, history, render_only, series


def train_command(args: argparse.Namespace, output_dir: Path, bf16: bool) -> list[str]:
    return [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", "miniature", "--output_dir", str(output_dir),
        "--max_steps", str(args.max_steps), "--eval_steps", str(args.max_steps), "--save_strategy", "no",
        "--logging_steps", "10", "--max_eval_samples", "200", "--max_predict_samples", str(args.test_samples),
        "--disable_tqdm", "true", "--report_to", "none", "--seed", "1", "--bf16", "true" if bf16 else "false",
    ]


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/bf16_cpu", threads=2, max_steps=400, test_samples=200)
    args = parser.parse_args()
    results_dir = Path(args.results)
    if render_only(args, "bf16_cpu", render):
        return
    work = Path(args.work_dir)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1")
    report: dict[str, object] = {"max_steps": args.max_steps, "threads": args.threads, "runs": {}}
    for label, bf16 in (("fp32", False), ("bf16", True)):
        folder = work / label
        command = train_command(args, folder, bf16)
        print(f"[bf16_cpu] {label}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
        started = time.time()
        subprocess.run(command, check=True, env=env)
        log = history(folder)
        metrics = json.loads((folder / "metrics.json").read_text())
        losses = series(log, "loss")[-5:] or [(0, float("nan"))]
        report["runs"][label] = {
            "command": "deepnmt " + " ".join(command[3:]),
            "wall_s": time.time() - started,
            "train_s": metrics["timings_seconds"]["train_seconds"],
            "final_train_loss": sum(value for _, value in losses) / len(losses),
            "eval_loss": metrics["validation"].get("eval_loss"),
            "test_bleu": metrics["test"]["bleu"],
            "test_chrf": metrics["test"]["chrf"],
        }
    # decoding: the float32 model, translated in float32 and under bf16 autocast
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import torch

    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.metrics import score_translations
    from hf_deepnmt_training.recipes import resolve_path
    from hf_deepnmt_training.translate import translate_sentences

    torch.set_num_threads(args.threads)
    folder = work / "fp32"
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    test = read_parallel_file(resolve_path("corpus:web-sparv/test.jsonl.gz"), "en", "es", args.test_samples)
    decoding = {}
    for label, bf16 in (("fp32", False), ("bf16", True)):
        started = time.perf_counter()
        hypotheses = translate_sentences(model, tokenizer, test.sources, num_beams=4, batch_size=32, bf16=bf16,
                                         progress=False)
        seconds = time.perf_counter() - started
        scores = score_translations(hypotheses, test.targets)
        decoding[label] = {"seconds": seconds, "bleu": scores.bleu, "chrf": scores.chrf, "hypotheses": hypotheses}
    same = sum(a == b for a, b in zip(decoding["fp32"].pop("hypotheses"), decoding["bf16"].pop("hypotheses")))
    report["decoding"] = {**decoding, "identical": same / len(test.sources), "sentences": len(test.sources)}
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "bf16_cpu.json").write_text(json.dumps(report, indent=2) + "\n")
    render(report, results_dir)


def render(report: dict, results_dir: Path) -> None:
    runs, decoding = report["runs"], report["decoding"]
    lines = ["# bf16 on the CPU: miniature recipe (the quickstart's until 2026-11-23), float32 vs bf16 autocast", "",
             f"`python -m benchmarks.experiments.bf16_cpu` ({report['max_steps']} steps per run, {report['threads']} "
             "threads, same seed and batches; the two runs one after the other).", "",
             "| run | training time (s) | train loss (last 50 steps) | validation loss | test BLEU | test chrF |",
             "|---|---|---|---|---|---|"]
    for label, run in runs.items():
        lines.append(f"| {label} | {run['train_s']:.0f} | {run['final_train_loss']:.3f} | {run['eval_loss']:.3f} | "
                     f"{run['test_bleu']:.2f} | {run['test_chrf']:.2f} |")
    speed = runs["fp32"]["train_s"] / runs["bf16"]["train_s"]
    lines += ["", f"Training speed bf16 / fp32: **{speed:.2f}×**; validation loss difference "
              f"{runs['bf16']['eval_loss'] - runs['fp32']['eval_loss']:+.3f}.", "",
              f"Decoding the float32 model's test translations ({decoding['sentences']} sentences, beam 4, batch 32): "
              f"fp32 {decoding['fp32']['seconds']:.1f} s, BLEU {decoding['fp32']['bleu']:.2f}; bf16 autocast "
              f"{decoding['bf16']['seconds']:.1f} s, BLEU {decoding['bf16']['bleu']:.2f} "
              f"({decoding['fp32']['seconds'] / decoding['bf16']['seconds']:.2f}×, "
              f"{100 * decoding['identical']:.1f} % identical outputs).", "",
              f"{_commands_heading(runs)}:", ""] + [f"    {run['command']}" for run in runs.values()] + [""]
    (results_dir / "bf16_cpu.md").write_text("\n".join(lines))


def _commands_heading(runs: dict) -> str:
    """"Commands", and for runs of before the recipe rename (their commands say `--recipe quickstart`), how to
    reproduce them now."""
    if not any("--recipe quickstart" in run["command"] for run in runs.values()):
        return "Commands"
    return ("Commands (as they ran, before the old quickstart recipe was renamed `miniature` on 2026-11-23: to "
            "reproduce, write `--recipe miniature`, which is that file unchanged; `python -m "
            "benchmarks.experiments.bf16_cpu` does)")


if __name__ == "__main__":
    main()
