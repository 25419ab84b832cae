"""dou2018 in miniature: do layer aggregation, multi-layer attention and layer diversity help on the embedded corpus?

dou2018 (Table 1) trains Transformer-Base, then initialises every variant from it ("The parameters of the proposed
models were initialized by the pre-trained model", §4.1) and reports +0.3 (dense) to +1.14 BLEU (hierarchical +
diversity). This script does the same at a size this machine can train, with equal budgets:

1. ``base``: one vanilla 6-6 Transformer (d_model 128, the miniature recipe's optimiser) trained for
   ``--base_steps`` steps;
2. every row: a model warm-started from ``base`` (`hf_deepnmt.warm_start`, ``deepnmt train --warm_start_from``) and
   trained ``--max_steps`` more steps with the same data order, batches and schedule — the vanilla row too, so every
   row gets the same total budget;
3. per row: test BLEU/chrF (beam 4), training and validation loss, the measured layer diversity of the trained model
   (mean 1 − cos² between adjacent layers' outputs, dou2018 Eq. (10), on test pairs, per stack), parameters and the
   time per step.

Rows (`--rows`): ``vanilla``, ``dense``, ``linear``, ``iterative``, ``hierarchical``, ``mla2`` (multi-layer attention,
k = 2), ``hierarchical-div`` (hierarchical + L_div, λ = 1: the paper's "+ Deep Representations").

    python -m benchmarks.experiments.dou2018_miniature                       # the committed result
    python -m benchmarks.experiments.dou2018_miniature --base_steps 20 --max_steps 10 --rows vanilla,linear  # smoke
    python -m benchmarks.experiments.dou2018_miniature --render_only         # rewrite md/png from the JSON

Writes ``results/dou2018_miniature.{json,md,png}``. Report whatever happens.
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

from .common import chosen_rows, experiment_parser, history, plot_runs, series

# dou2018 Table 1 rows as config switches (benchmarks/measure.py times the same rows)
DOU2018_VARIANTS: dict[str, dict[str, object]] = {
    "vanilla": {},
    "dense": {"encoder_layer_aggregation": "dense", "decoder_layer_aggregation": "dense"},
    "linear": {"encoder_layer_aggregation": "linear", "decoder_layer_aggregation": "linear"},
    "iterative": {"encoder_layer_aggregation": "iterative", "decoder_layer_aggregation": "iterative"},
    "hierarchical": {"encoder_layer_aggregation": "hierarchical", "decoder_layer_aggregation": "hierarchical"},
    "mla2": {"multi_layer_attention_k": 2},
    "mla3": {"multi_layer_attention_k": 3},
    "hierarchical+div": {"encoder_layer_aggregation": "hierarchical", "decoder_layer_aggregation": "hierarchical",
                         "diversity_weight": 1.0},
}
# dou2018 Table 1 (Base, P40): training steps/s and decoding sentences/s, for the ratios against row 1.
DOU2018_TABLE_1 = {"vanilla": (1.82, 1.33), "dense": (1.69, 1.28), "linear": (1.59, 1.26), "iterative": (1.32, 1.22),
                   "hierarchical": (1.46, 1.25), "mla2": (1.19, 1.05), "mla3": (1.12, 1.00),
                   "hierarchical+div": (1.41, 1.25)}

ROWS = ("vanilla", "dense", "linear", "iterative", "hierarchical", "mla2", "hierarchical-div")
LABELS = {"vanilla": "TRANSFORMER (vanilla)", "dense": "+ Dense Connection", "linear": "+ Linear Combination",
          "iterative": "+ Iterative Aggregation", "hierarchical": "+ Hierarchical Aggregation",
          "mla2": "+ Multi-Layer Attention (k=2)", "hierarchical-div": "+ Hierarchical Aggregation + L_div"}
# dou2018 Table 1 (Base, WMT14 en-de) BLEU of each row
PAPER_BLEU = {"vanilla": 27.64, "dense": 27.94, "linear": 28.09, "iterative": 28.61, "hierarchical": 28.63,
              "mla2": 28.58, "hierarchical-div": 28.78}
# the model switches of each row: the benchmark's definitions (one place for both)
SWITCHES = {row: DOU2018_VARIANTS["hierarchical+div" if row == "hierarchical-div" else row] for row in ROWS}


def model_overrides(row: str, args: argparse.Namespace) -> str:
    fields = {"encoder_layers": args.layers, "decoder_layers": args.layers,
              "layer_norm_position": args.layer_norm_position, **SWITCHES[row]}
    return ",".join(f"{key}={value}" for key, value in fields.items())


def train_command(output_dir: Path, overrides: str, steps: int, args: argparse.Namespace, seed: int,
                  warm_start: Path | None) -> list[str]:
    command = [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", "miniature", "--output_dir", str(output_dir),
        "--config_overrides", overrides, "--max_steps", str(steps), "--max_tokens", str(args.max_tokens),
        "--learning_rate", str(args.learning_rate), "--warmup_steps", str(args.warmup_steps),
        "--eval_steps", str(args.eval_steps), "--save_strategy", "no", "--logging_steps", "10",
        "--max_eval_samples", str(args.eval_samples), "--max_predict_samples", str(args.test_samples),
        "--eval_num_beams", "4", "--disable_tqdm", "true", "--seed", str(seed),
    ]
    if warm_start is not None:
        command += ["--warm_start_from", str(warm_start)]
    return command


def measured_diversity(folder: Path, pairs: int) -> dict[str, float] | None:
    """dou2018 Eq. (10) on the trained model: per stack, mean over real positions of 1/(L−1) Σ_l (1 − cos²) between
    adjacent layer outputs, on the first ``pairs`` test verses (teacher forcing, evaluation mode); and the model's
    parameter count."""
    if not (folder / "model.safetensors").exists():
        return None
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_deepnmt  # noqa: F401
    from hf_deepnmt.losses import layer_diversity_sum, target_mask
    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.recipes import resolve_path

    torch.set_num_threads(1)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    corpus = read_parallel_file(resolve_path("corpus:web-sparv/test.jsonl.gz"), "en", "es", pairs)
    batch = tokenizer(corpus.sources, text_target=corpus.targets, padding=True, truncation=True, max_length=128,
                      return_tensors="pt")
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                    output_hidden_states=True)
    source_mask = batch["attention_mask"].bool()
    target = target_mask(labels, tokenizer.pad_token_id)
    return {
        "encoder": float(layer_diversity_sum(out.encoder_hidden_states[1:], source_mask) / source_mask.sum()),
        "decoder": float(layer_diversity_sum(out.decoder_hidden_states[1:], target) / target.sum()),
        "parameters": model.num_parameters(),
    }


def run_queue(jobs: list[tuple[str, list[str], Path]], parallel: int, env: dict, work: Path) -> dict[str, dict]:
    """Run ``(name, command, folder)`` jobs ``parallel`` at a time; return exit codes and minutes per name."""
    pending, running, finished = list(jobs), {}, {}
    while pending or running:
        while pending and len(running) < parallel:
            name, command, folder = pending.pop(0)
            log = open(work / f"{folder.name}.log", "w")
            running[name] = (folder, subprocess.Popen(command, env=env, stdout=log, stderr=log), time.time())
        time.sleep(5)
        for name in [name for name, (_, process, _) in running.items() if process.poll() is not None]:
            folder, process, begun = running.pop(name)
            finished[name] = {"exit_code": process.returncode, "folder": str(folder),
                              "minutes": round((time.time() - begun) / 60, 1)}
            print(f"{name}: exit {process.returncode} after {finished[name]['minutes']} min, {folder}", file=sys.stderr)
    return finished


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/dou2018_miniature", threads=1, plots=True,
                               rows=",".join(ROWS), row_names=ROWS, seeds="1", max_steps=600, max_tokens=2048,
                               learning_rate=2e-3, warmup_steps=200, eval_steps=200, eval_samples=100,
                               test_samples=300, parallel=2,
                               helps={"max_steps": "Steps of every row after the warm start.",
                                      "seeds": "Comma-separated seeds of the rows."})
    parser.add_argument("--layers", type=int, default=6, help="Layers of each stack.")
    parser.add_argument("--layer_norm_position", default="pre", choices=("pre", "post"))
    parser.add_argument("--base_steps", type=int, default=800, help="Steps of the vanilla model every row starts from.")
    parser.add_argument("--base_seed", type=int, default=None,
                        help="Seed of the vanilla base run (default: the first of --seeds). With --append and no "
                             "--base_dir, the base is trained again and must score exactly the test BLEU recorded in "
                             "the results' JSON, or nothing else runs.")
    parser.add_argument("--diversity_pairs", type=int, default=100)
    parser.add_argument("--base_dir", default=None,
                        help="Reuse a vanilla model this script trained before (its output folder) instead of "
                             "training the base again.")
    parser.add_argument("--order", choices=("slow_first", "rows"), default="slow_first",
                        help="Queue order: the slowest rows first (shortest wall time), or seed by seed in --rows order "
                             "(a run cut short still has whole seeds; see --collect).")
    parser.add_argument("--collect", action="store_true",
                        help="Train nothing: build the results from the finished runs already in --work_dir for "
                             "--rows and --seeds (with --base_dir), e.g. after a queue was stopped.")
    parser.add_argument("--append", action="store_true",
                        help="Keep the runs already in the results' JSON (e.g. add seeds with --seeds 2,3 and the "
                             "same --base_dir) and add these.")
    args = parser.parse_args()
    results = Path(args.results)
    if args.render_only:
        report = json.loads((results / "dou2018_miniature.json").read_text())
        write_markdown(report, results / "dou2018_miniature.md")
        plot(report, results / "dou2018_miniature.png")
        return
    rows = chosen_rows(parser, args.rows, ROWS)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    base_seed = seeds[0] if args.base_seed is None else args.base_seed
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    started = time.time()

    if args.base_dir:
        base = Path(args.base_dir)
        metrics = base / "metrics.json"
        if not metrics.exists() or json.loads(metrics.read_text()).get("global_step") != args.base_steps:
            parser.error(f"--base_dir {base} holds no finished {args.base_steps}-step run of this script (metrics.json "
                         "with that global_step); leave --base_dir out to train the base.")
        base_minutes = round(json.loads(metrics.read_text())["timings_seconds"]["total_seconds"] / 60, 1)
        base_run = {"exit_code": 0, "folder": str(base), "minutes": base_minutes, "reused": True}
    else:
        base = work / f"base-{int(started)}"
        base_command = train_command(base, model_overrides("vanilla", args), args.base_steps, args, base_seed, None)
        base_run = {**run_queue([("base", base_command, base)], 1, env, work)["base"],
                    "command": " ".join(["deepnmt", *base_command[3:]])}
    if base_run["exit_code"] != 0:
        raise SystemExit(f"the vanilla base run failed; see {work}/{base.name}.log")
    previous_path = results / "dou2018_miniature.json"
    if args.append and not args.base_dir and previous_path.exists():
        # Adding seeds to a table needs the very base the table was built on: a retrained base must score exactly
        # the recorded test BLEU (a cheap check that it is the same model).
        recorded, retrained = json.loads(previous_path.read_text())["base"]["test"], _test(base)
        if (recorded or {}).get("bleu") != (retrained or {}).get("bleu"):
            raise SystemExit(f"the retrained base scores test BLEU {(retrained or {}).get('bleu')}, the table's base "
                             f"{(recorded or {}).get('bleu')}: not the same model, so no rows were added.")
    jobs = []
    for seed in seeds:
        for row in rows:
            folder = work / f"{row}-seed{seed}-{int(started)}"
            jobs.append((f"{row}/seed{seed}", train_command(folder, model_overrides(row, args), args.max_steps, args,
                                                            seed, base), folder))
    if args.order == "rows":  # every row once per seed, in --rows order, before the next seed starts
        jobs.sort(key=lambda job: (int(job[0].split("seed")[1]), rows.index(job[0].split("/")[0])))
    else:
        jobs.sort(key=lambda job: job[0].startswith(("vanilla", "dense", "linear")))  # the slow rows start first
    if args.collect:
        finished = {}
        for name, _, _ in jobs:
            row, seed = name.split("/")
            done = sorted(folder for folder in work.glob(f"{row}-{seed}-*")
                          if folder.is_dir() and (folder / "metrics.json").exists())
            if done:
                finished[name] = {"exit_code": 0, "folder": str(done[-1]), "minutes": None, "collected": True}
    else:
        finished = run_queue(jobs, args.parallel, env, work)

    report = {"command": " ".join([sys.executable, "-m", "benchmarks.experiments.dou2018_miniature", *sys.argv[1:]]),
              "setup": vars(args), "wall_minutes": round((time.time() - started) / 60, 1),
              "base": {**base_run, "test": _test(Path(base_run["folder"]))}, "runs": {}}
    for name, entry in sorted(finished.items(), key=lambda item: (ROWS.index(item[0].split("/")[0]), item[0])):
        folder = Path(entry["folder"])
        entry["overrides"] = model_overrides(name.split("/")[0], args)
        if (folder / "trainer_state.json").exists():
            log = history(folder)
            for key in ("loss", "nll", "div_encoder", "div_decoder", "eval_loss", "eval_bleu"):
                entry[key] = series(log, key)
            runtime = [item["train_runtime"] for item in log if "train_runtime" in item]
            entry["seconds_per_step"] = round(runtime[-1] / args.max_steps, 3) if runtime else None
        if (folder / "metrics.json").exists():
            metrics = json.loads((folder / "metrics.json").read_text())
            entry["test"] = metrics.get("test")
        entry["diversity"] = measured_diversity(folder, args.diversity_pairs)
        entry["parameters"] = entry["diversity"]["parameters"] if entry["diversity"] else None
        report["runs"][name] = entry
    if args.append and previous_path.exists():
        previous = json.loads(previous_path.read_text())
        seeds_all = sorted({int(seed) for seed in previous["setup"]["seeds"].split(",")} | set(seeds))
        report = {**previous, "command": f"{previous['command']} && {report['command']}",
                  "setup": {**previous["setup"], "seeds": ",".join(str(seed) for seed in seeds_all)},
                  "wall_minutes": round(previous["wall_minutes"] + report["wall_minutes"], 1),
                  "runs": {**previous["runs"], **report["runs"]}}
        report["runs"] = dict(sorted(report["runs"].items(),
                                     key=lambda item: (ROWS.index(item[0].split("/")[0]), item[0])))
    (results / "dou2018_miniature.json").write_text(json.dumps(report, indent=2) + "\n")
    write_markdown(report, results / "dou2018_miniature.md")
    plot(report, results / "dou2018_miniature.png")


def _test(folder: Path) -> dict | None:
    path = folder / "metrics.json"
    return json.loads(path.read_text()).get("test") if path.exists() else None


def _tail_mean(points: list, count: int = 5) -> float | None:
    values = [value for _, value in points[-count:]]
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def write_markdown(report: dict, path: Path) -> None:
    setup = report["setup"]
    by_row: dict[str, list[dict]] = {}
    for name, run in report["runs"].items():
        by_row.setdefault(name.split("/")[0], []).append(run)
    seeds = setup["seeds"].split(",")
    base_test = report["base"].get("test") or {}
    lines = [
        f"# dou2018 in miniature: {setup['layers']}-{setup['layers']} {setup['layer_norm_position']}-LN Transformer, "
        "d_model 128, every variant warm-started from one trained vanilla model",
        "",
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall, {setup['parallel']} runs at a time, "
        f"{setup['threads']} CPU thread each). Embedded WEB→RV1909 corpus (en→es); the miniature recipe's model "
        "(the quickstart's until 2026-11-23) "
        "width (d_model 128, 4 heads, FFN 512) and the rows' optimiser (AdamW, "
        f"lr {setup['learning_rate']}, inverse-sqrt, {setup['warmup_steps']} warm-up steps, {setup['max_tokens']}-token "
        f"batches). A vanilla model is trained {setup['base_steps']} steps (test BLEU {base_test.get('bleu', 'n/a')}; "
        "what is recorded of it is below), then every row — the vanilla one "
        f"too — starts from it (`deepnmt train --warm_start_from`, as dou2018 §4.1) and trains {setup['max_steps']} "
        f"more steps; seeds {', '.join(seeds)} (the seed of the second stage).",
        "",
        *base_lines(report),
        "",
        "Layer diversity = dou2018 Eq. (10) measured on the trained model, mean over real positions of "
        "1/(L−1) Σ_l (1 − cos²(h^l, h^{l+1})) between adjacent layer outputs, on "
        f"{setup['diversity_pairs']} test verses (higher = more diverse layers).",
        "",
        f"| row | params | train NLL (last 5 logs) | valid loss | test BLEU (beam 4, {setup['test_samples']}) | "
        "test chrF | layer diversity enc / dec | s/step (wall, shared CPU) | paper BLEU (Δ) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    vanilla_paper = PAPER_BLEU["vanilla"]
    for row in ROWS:
        runs = by_row.get(row)
        if not runs:
            continue
        bleus = [run["test"]["bleu"] for run in runs if run.get("test")]
        chrfs = [run["test"]["chrf"] for run in runs if run.get("test")]
        nll = [v for v in (_tail_mean(run.get("nll", [])) for run in runs) if v is not None]
        valid = [run["eval_loss"][-1][1] for run in runs if run.get("eval_loss")]
        enc = [run["diversity"]["encoder"] for run in runs if run.get("diversity")]
        dec = [run["diversity"]["decoder"] for run in runs if run.get("diversity")]
        step = [run["seconds_per_step"] for run in runs if run.get("seconds_per_step")]
        mean = lambda values: sum(values) / len(values) if values else None  # noqa: E731
        spread = (f" ({min(bleus):.2f}–{max(bleus):.2f}, {len(bleus)} seeds)" if len(bleus) > 1 else "")
        params = runs[0].get("parameters")
        paper_bleu = PAPER_BLEU[row]
        lines.append(
            f"| {LABELS[row]} | {params / 1e6:.2f}M | {_fmt(mean(nll), 3)} | {_fmt(mean(valid), 3)} | "
            f"{_fmt(mean(bleus))}{spread} | {_fmt(mean(chrfs))} | {_fmt(mean(enc), 3)} / {_fmt(mean(dec), 3)} | "
            f"{_fmt(mean(step), 3)} | {paper_bleu} ({paper_bleu - vanilla_paper:+.2f}) |"
            if params else f"| {LABELS[row]} | failed (exit {runs[0]['exit_code']}) | | | | | | | |")
    lines += [
        "",
        "*s/step* is wall time per step of the second stage under whatever else ran on the 2 cores; the clean speed "
        "ratios against the vanilla model are in `benchmarks/RESULTS.md`, section `dou2018`.",
        "",
        "![curves](dou2018_miniature.png)",
        "",
    ]
    second = path.parent / "dou2018_miniature_base2.json"
    if second.exists():
        lines += second_base_section(report, json.loads(second.read_text()))
    path.write_text("\n".join(lines))


def base_lines(report: dict) -> list[str]:
    """What the results record about the vanilla base every row starts from. A base this script trained has its
    command recorded; for one reused through ``--base_dir`` the results hold no command, so the lines say so and give,
    labelled as such, the command this script would use now for a base of the recorded setup."""
    setup, base = report["setup"], report["base"]
    test = base.get("test") or {}
    lines = [
        f"The vanilla base: `{base['folder']}`"
        + (f", reused through `--base_dir` (which requires its `metrics.json` to record {setup['base_steps']} steps)"
           if base.get("reused") else "")
        + f"; {base.get('minutes', 'n/a')} min of its own run, test BLEU {test.get('bleu', 'n/a')} / chrF "
        f"{test.get('chrf', 'n/a')} ({test.get('sentences', 'n/a')} verses, beam {test.get('num_beams', 'n/a')})."
    ]
    if base.get("command"):
        return lines + ["", f"    {base['command']}"]
    args = argparse.Namespace(**setup)
    seed = setup.get("base_seed") or int(setup["seeds"].split(",")[0])
    command = train_command(Path(base["folder"]), model_overrides("vanilla", args), setup["base_steps"], args, seed,
                            None)
    lines[0] += (" Its training command was not recorded. For reference only — not known to be the command that "
                 "trained it — the command this script would use now for a base of the recorded setup "
                 f"(`train_command` of the vanilla row, {setup['base_steps']} steps, seed {seed}):")
    return lines + ["", f"    {' '.join(['deepnmt', *command[3:]])}"]


def second_base_section(report: dict, second: dict) -> list[str]:
    """Paired differences to the vanilla row of the same base and seed: seeds 1-2 (and 3 where the table has it)
    from the table's base, seed 3 of the other rows from a second, retrained base (``dou2018_miniature_base2.json``,
    written by this script with ``--base_dir`` that base and ``--results`` elsewhere)."""
    def bleu(runs: dict, row: str, seed: int) -> float | None:
        test = runs.get(f"{row}/seed{seed}", {}).get("test")
        return test["bleu"] if test else None

    first_runs, second_runs = report["runs"], second["runs"]
    base_a, base_b = (report["base"].get("test") or {}).get("bleu"), (second["base"].get("test") or {}).get("bleu")
    lines = [
        "## Three runs per row: seed 3 from a second base",
        "",
        f"The base of the table above was lost before every row had a third seed, and training it again with the "
        f"table's settings gave a different model (test BLEU {base_b} against {base_a}: the table's base was trained "
        "by an earlier command that the results do not record). So seed 3 of the rows that had two seeds ran from "
        "that second base, with the vanilla row on the same base as their reference "
        f"(`{second['command']}`). Each cell is a row's test BLEU minus the vanilla row's, same base and same seed; "
        "the mean ± standard deviation is over the three paired differences.",
        "",
        *([f"The note of `dou2018_miniature_base2.json`: {second['note']}", ""] if second.get("note") else []),
        "| row | Δ seed 1 (base 1) | Δ seed 2 (base 1) | Δ seed 3 (base 1 or 2) | mean Δ ± sd (3 runs) | paper Δ |",
        "|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        if row == "vanilla":
            continue
        deltas: list[float] = []
        cells = []
        for seed in (1, 2, 3):
            runs = first_runs if (seed < 3 or f"{row}/seed3" in first_runs) else second_runs
            value, reference = bleu(runs, row, seed), bleu(runs, "vanilla", seed)
            if value is None or reference is None:
                cells.append("–")
                continue
            deltas.append(value - reference)
            cells.append(f"{value - reference:+.2f}" + (" (base 2)" if runs is second_runs else ""))
        summary = (f"{statistics.mean(deltas):+.2f} ± {statistics.stdev(deltas):.2f} ({len(deltas)} runs)"
                   if len(deltas) > 1 else "–")
        lines.append(f"| {LABELS[row]} | {' | '.join(cells)} | {summary} | {PAPER_BLEU[row] - PAPER_BLEU['vanilla']:+.2f} |")
    return lines + [""]


def plot(report: dict, path: Path) -> None:
    setup = report["setup"]
    first_seed = setup["seeds"].split(",")[0]
    runs = {LABELS[name.split("/")[0]]: run for name, run in report["runs"].items() if name.endswith(f"seed{first_seed}")}
    plot_runs(runs, [("nll", "training NLL"), ("eval_loss", "validation loss"), ("eval_bleu", "validation BLEU (greedy)")],
              path, f"dou2018 in miniature: {setup['max_steps']} steps after a {setup['base_steps']}-step vanilla start "
              f"(seed {first_seed})", markers=("eval_loss", "eval_bleu"))


if __name__ == "__main__":
    main()
