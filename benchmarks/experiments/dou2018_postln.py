"""dou2018 in its own setting: post-LN Transformer, every Table 1 row warm-started from one trained vanilla model,
3 paired seeds per row, each row trained two ways (new parameters at the full and at a scaled learning rate).

dou2018 (§4.1, Table 1) trains Transformer-Base — post-LN (its Eq. 1), 6-6 layers, FFN = 4·d — and initialises
every variant from it. This script does the same with the Base proportions at a width of ``--d_model``
(FFN 4·d, d/64 heads but at least 4, dropout 0.1, label smoothing 0.1), on the embedded corpus:

1. ``base``: one vanilla post-LN model trained ``--base_steps`` steps (its command is recorded in the JSON);
2. the **step-0 change of function** of every row: the warm-started model, before any training, against the base on
   ``--step0_pairs`` validation pairs (teacher forcing, evaluation mode): mean per-token KL(base ‖ row) and ΔNLL;
3. every row × seed × way trains ``--max_steps`` more steps from the base with the same data order and schedule
   (`deepnmt train --warm_start_from`), the vanilla row too (one per seed: it has no new parameters, so it is the
   reference of both ways); a way is ``plain`` (new parameters like the rest, as dou2018), ``lr<x>``
   (``--warm_start_new_lr_scale x``) or ``freeze<n>`` (``--warm_start_freeze_steps n``);
4. per row and way: test BLEU/chrF (beam 4) minus the vanilla row's of the same seed (paired differences), their
   mean ± sd, the validation loss difference, the measured layer diversity (Eq. 10) and parameters.

    python -m benchmarks.experiments.dou2018_postln --device cuda --parallel 13         # the committed d128 table
    python -m benchmarks.experiments.dou2018_postln --base_steps 20 --max_steps 10 --rows vanilla,linear --seeds 1 \\
        --step0_pairs 8 --test_samples 8 --name smoke --results /tmp/smoke                # a CPU smoke run
    python -m benchmarks.experiments.dou2018_postln --render_only --name dou2018_postln_d128  # md from the JSON

Writes ``<results>/<name>.{json,md}``. Every run is one `deepnmt train` process; the device changes only speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from .common import chosen_rows, experiment_parser, history, series
from .dou2018_miniature import DOU2018_VARIANTS, measured_diversity, run_queue

# dou2018 Table 1: every row as config switches, with the paper's BLEU (Base, WMT14 En-De).
TABLE_1: dict[str, tuple[str, dict[str, object], float]] = {
    "vanilla": ("TRANSFORMER-BASE (vanilla)", DOU2018_VARIANTS["vanilla"], 27.64),
    "dense": ("+ Dense Connection", DOU2018_VARIANTS["dense"], 27.94),
    "linear": ("+ Linear Combination", DOU2018_VARIANTS["linear"], 28.09),
    "iterative": ("+ Iterative Aggregation", DOU2018_VARIANTS["iterative"], 28.61),
    "hierarchical": ("+ Hierarchical Aggregation", DOU2018_VARIANTS["hierarchical"], 28.63),
    "mla2": ("+ Multi-Layer Attention (k=2)", DOU2018_VARIANTS["mla2"], 28.58),
    "mla3": ("+ Multi-Layer Attention (k=3)", DOU2018_VARIANTS["mla3"], 28.62),
    "iterative+div": ("+ Iterative Aggregation + L_div", {**DOU2018_VARIANTS["iterative"], "diversity_weight": 1.0},
                      28.76),
    "hierarchical+div": ("+ Hierarchical Aggregation + L_div", DOU2018_VARIANTS["hierarchical+div"], 28.78),
    "mla2+div": ("+ Multi-Layer Attention (k=2) + L_div", {**DOU2018_VARIANTS["mla2"], "diversity_weight": 1.0},
                 28.75),
}


def way_arguments(way: str) -> list[str]:
    """The `deepnmt train` arguments of a way: ``plain``, ``lr<scale>`` or ``freeze<steps>``."""
    if way == "plain":
        return []
    if way.startswith("lr"):
        return ["--warm_start_new_lr_scale", str(float(way[2:]))]
    if way.startswith("freeze"):
        return ["--warm_start_freeze_steps", str(int(way[6:]))]
    raise ValueError(f"--ways: {way!r} is not a way; use plain, lr<scale> (e.g. lr0.1) or freeze<steps>.")


def backbone(args: argparse.Namespace) -> dict[str, object]:
    """Transformer-Base proportions at width ``d_model``: 6-6 post-LN, FFN 4·d, d/64 heads (at least 4)."""
    heads = max(4, args.d_model // 64)
    return {"d_model": args.d_model, "encoder_layers": args.layers, "decoder_layers": args.layers,
            "encoder_attention_heads": heads, "decoder_attention_heads": heads, "encoder_ffn_dim": 4 * args.d_model,
            "decoder_ffn_dim": 4 * args.d_model, "layer_norm_position": "post", "dropout": 0.1,
            "label_smoothing": 0.1}


def overrides(row: str, args: argparse.Namespace, extra: dict[str, object] | None = None) -> str:
    return ",".join(f"{key}={value}" for key, value in {**backbone(args), **TABLE_1[row][1], **(extra or {})}.items())


def train_command(folder: Path, row: str, steps: int, args: argparse.Namespace, seed: int, warm_start: Path | None,
                  way: str = "plain", learning_rate: float | None = None, warmup: int | None = None,
                  extra: dict[str, object] | None = None) -> list[str]:
    command = [
        sys.executable, "-m", "hf_deepnmt_training.cli", "train", "--recipe", "miniature", "--output_dir", str(folder),
        "--config_overrides", overrides(row, args, extra), "--max_steps", str(steps), "--max_tokens", str(args.max_tokens),
        "--learning_rate", str(learning_rate or args.learning_rate),
        "--warmup_steps", str(warmup if warmup is not None else args.warmup_steps),
        "--eval_steps", str(args.eval_steps), "--save_strategy", "no", "--logging_steps", "10",
        "--max_eval_samples", str(args.eval_samples), "--max_predict_samples", str(args.test_samples),
        "--eval_num_beams", "4", "--disable_tqdm", "true", "--seed", str(seed), *way_arguments(way),
    ]
    if args.device == "cpu":
        command += ["--use_cpu", "true"]
    return command + (["--warm_start_from", str(warm_start)] if warm_start is not None else [])


def fold_base(trained: Path, folded: Path) -> None:
    """The ADMIN-trained base as the plain post-LN model computing the same function (`hf_deepnmt.fold_admin`,
    liu2020): ``folded`` = ``trained``'s folder (tokenizer, metrics) with the folded weights and config."""
    import shutil

    import torch
    from transformers import AutoModelForSeq2SeqLM

    from hf_deepnmt import fold_admin

    if folded.exists():
        shutil.rmtree(folded)
    shutil.copytree(trained, folded, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    admin = AutoModelForSeq2SeqLM.from_pretrained(trained).eval()
    plain = fold_admin(admin).eval()
    ids = torch.tensor([[5, 6, 7, 8, 2]])
    with torch.no_grad():  # the fold is exact up to float rounding: check it on one pair before anything uses it
        gap = (admin(input_ids=ids, labels=ids).logits - plain(input_ids=ids, labels=ids).logits).abs().max()
    if gap > 1e-3:
        raise SystemExit(f"fold_admin changed the base's logits by {float(gap):.2e}; not using it.")
    plain.save_pretrained(folded)


def step0_changes(base: Path, rows: list[str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Per row: the warm-started model before training against the base — mean per-token KL(base ‖ row) and
    NLL(row) − NLL(base) — on the first ``--step0_pairs`` validation pairs (teacher forcing, evaluation mode)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_deepnmt import warm_start
    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.recipes import resolve_path

    device = torch.device("cuda" if args.device == "cuda" and torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    reference = AutoModelForSeq2SeqLM.from_pretrained(base).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(base)
    corpus = read_parallel_file(resolve_path("corpus:web-sparv/valid.jsonl.gz"), "en", "es", args.step0_pairs)
    batch = tokenizer(corpus.sources, text_target=corpus.targets, padding=True, truncation=True, max_length=128,
                      return_tensors="pt").to(device)
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    real = labels != -100  # (batch, target length)

    def log_probs(model: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).logits
        return torch.log_softmax(logits.float(), dim=-1)  # (batch, target length, vocab)

    def nll(log_p: torch.Tensor) -> float:
        picked = log_p.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # (batch, target length)
        return float(-picked[real].mean())

    base_log_p = log_probs(reference)
    changes = {}
    for row in rows:
        if row == "vanilla":
            continue
        torch.manual_seed(0)  # the new modules' initialisation, as `deepnmt train --seed` would draw it differs only
        model = warm_start(reference, model_type=reference.config.model_type,
                           **{**backbone(args), **TABLE_1[row][1]}).to(device).eval()
        row_log_p = log_probs(model)
        kl = (base_log_p.exp() * (base_log_p - row_log_p)).sum(-1)  # (batch, target length)
        changes[row] = {"kl": float(kl[real].mean()), "delta_nll": nll(row_log_p) - nll(base_log_p),
                        "base_nll": nll(base_log_p), "pairs": args.step0_pairs}
        print(f"step 0 {row}: KL {changes[row]['kl']:.4f}  ΔNLL {changes[row]['delta_nll']:+.4f}", file=sys.stderr)
    return changes


def collect_run(folder: Path, args: argparse.Namespace) -> dict:
    entry: dict = {"folder": str(folder)}
    if (folder / "trainer_state.json").exists():
        log = history(folder)
        entry["nll"] = series(log, "nll")
        entry["eval_loss"] = series(log, "eval_loss")
    if (folder / "metrics.json").exists():
        entry["test"] = json.loads((folder / "metrics.json").read_text()).get("test")
    entry["diversity"] = measured_diversity(folder, args.diversity_pairs)
    return entry


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/dou2018_postln", threads=1, rows=",".join(TABLE_1),
                               row_names=TABLE_1, seeds="1,2,3", max_steps=300, max_tokens=2048, learning_rate=1e-3,
                               warmup_steps=100, eval_steps=150, eval_samples=100, test_samples=300, device=True,
                               parallel=2, helps={"max_steps": "Steps of every row after the warm start.",
                                                  "threads": "Torch threads of each row's run."})
    parser.add_argument("--ways", default="plain,lr0.1", help="Comma-separated: plain, lr<scale>, freeze<steps>.")
    parser.add_argument("--d_model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--base_steps", type=int, default=2000)
    parser.add_argument("--base_learning_rate", type=float, default=1e-3)
    parser.add_argument("--base_warmup_steps", type=int, default=400)
    parser.add_argument("--base_admin", action="store_true",
                        help="Train the base with ADMIN (liu2020) and fold it into the plain post-LN model of the same "
                             "function before any warm start: plain post-LN stalls at this batch size.")
    parser.add_argument("--diversity_pairs", type=int, default=100)
    parser.add_argument("--step0_pairs", type=int, default=200)
    parser.add_argument("--base_threads", type=int, default=2, help="Torch threads of the base run (it runs alone).")
    parser.add_argument("--base_dir", default=None, help="Reuse a base this script trained (its folder).")
    parser.add_argument("--collect", action="store_true",
                        help="Train nothing: build the results from the finished runs in --work_dir (needs --base_dir).")
    parser.add_argument("--name", default=None, help="Results file name (default dou2018_postln_d<d_model>).")
    args = parser.parse_args()
    name = args.name or f"dou2018_postln_d{args.d_model}"
    results = Path(args.results)
    if args.render_only:
        write_markdown(json.loads((results / f"{name}.json").read_text()), results / f"{name}.md")
        return
    rows = chosen_rows(parser, args.rows, TABLE_1)
    ways = [way.strip() for way in args.ways.split(",") if way.strip()]
    for way in ways:
        try:
            way_arguments(way)
        except ValueError as error:
            parser.error(str(error))
    seeds = [int(seed) for seed in args.seeds.split(",")]
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
    started = time.time()
    trained_base = Path(args.base_dir) if args.base_dir else work / "base"
    base_command = train_command(trained_base, "vanilla", args.base_steps, args, seeds[0], None,
                                 learning_rate=args.base_learning_rate, warmup=args.base_warmup_steps,
                                 extra={"residual_scaling": "admin"} if args.base_admin else None)
    base = trained_base.with_name(trained_base.name + "-folded") if args.base_admin else trained_base
    if args.base_dir:
        if not (trained_base / "metrics.json").exists():
            parser.error(f"--base_dir {trained_base} holds no finished run (metrics.json); leave it out to train the "
                         "base.")
    elif run_queue([("base", base_command, trained_base)], 1, {**env, "OMP_NUM_THREADS": str(args.base_threads)},
                   work)["base"]["exit_code"] != 0:
        raise SystemExit(f"the vanilla base run failed; see {work}/{trained_base.name}.log")
    if args.base_admin and not (args.collect and base.exists()):
        fold_base(trained_base, base)
    changes = step0_changes(base, rows, args)
    jobs = []
    for seed in seeds:
        for row in rows:
            for way in (["plain"] if row == "vanilla" else ways):
                key = f"{row}/{way}/seed{seed}"
                folder = work / key.replace("/", "-")
                jobs.append((key, train_command(folder, row, args.max_steps, args, seed, base, way), folder))
    jobs.sort(key=lambda job: job[0].startswith(("vanilla", "dense", "linear")))  # the slow rows first
    if args.collect:
        finished = {key: {"exit_code": 0, "folder": str(folder), "minutes": None}
                    for key, _, folder in jobs if (folder / "metrics.json").exists()}
    else:
        finished = run_queue(jobs, args.parallel, env, work)
    report = {
        "command": " ".join([sys.executable, "-m", "benchmarks.experiments.dou2018_postln", *sys.argv[1:]]),
        "base_command": " ".join(base_command[1:]).replace(sys.executable, "python"),
        "setup": {**vars(args), "backbone": backbone(args), "rows": rows, "ways": ways, "seeds": seeds},
        "device": device_name(args.device), "wall_minutes": round((time.time() - started) / 60, 1),
        "base": {"folder": str(base), **collect_run(base, args)}, "step0": changes, "runs": {},
    }
    for key, entry in sorted(finished.items()):
        report["runs"][key] = {**entry, **collect_run(Path(entry["folder"]), args)}
    (results / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    write_markdown(report, results / f"{name}.md")


def device_name(device: str) -> str:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "CPU"


def _mean_sd(values: list[float], digits: int = 2) -> str:
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:+.{digits}f} (1 run)"
    return f"{statistics.mean(values):+.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def paired(report: dict, row: str, way: str, metric: str) -> list[tuple[int, float]]:
    """``(seed, row − vanilla)`` of a test metric for every seed where both finished."""
    out = []
    for seed in report["setup"]["seeds"]:
        run = (report["runs"].get(f"{row}/{way}/seed{seed}") or {}).get("test")
        reference = (report["runs"].get(f"vanilla/plain/seed{seed}") or {}).get("test")
        if run and reference:
            out.append((seed, run[metric] - reference[metric]))
    return out


def valid_delta(report: dict, row: str, way: str) -> list[float]:
    out = []
    for seed in report["setup"]["seeds"]:
        run = report["runs"].get(f"{row}/{way}/seed{seed}") or {}
        reference = report["runs"].get(f"vanilla/plain/seed{seed}") or {}
        if run.get("eval_loss") and reference.get("eval_loss"):
            out.append(run["eval_loss"][-1][1] - reference["eval_loss"][-1][1])
    return out


def write_markdown(report: dict, path: Path) -> None:
    setup, base = report["setup"], report["base"]
    bb = setup["backbone"]
    base_test = base.get("test") or {}
    vanilla = [((report["runs"].get(f"vanilla/plain/seed{seed}") or {}).get("test") or {}).get("bleu")
               for seed in setup["seeds"]]
    lines = [
        f"# dou2018 in its own setting: {bb['encoder_layers']}-{bb['decoder_layers']} post-LN Transformer, "
        f"d_model {bb['d_model']}, every Table 1 row warm-started from one trained vanilla model",
        "",
        f"Command: `{report['command']}` ({report['wall_minutes']} min wall on {report['device']}, "
        f"{setup['parallel']} runs at a time). Rendered from [{path.stem}.json]({path.stem}.json) by "
        f"`python -m benchmarks.experiments.dou2018_postln --render_only --name {path.stem}`.",
        "",
        f"Model: dou2018's Transformer-Base proportions at width {bb['d_model']} — post-LN (its Eq. 1), "
        f"{bb['encoder_layers']}-{bb['decoder_layers']} layers, {bb['encoder_attention_heads']} heads, FFN "
        f"{bb['encoder_ffn_dim']}, dropout 0.1, label smoothing 0.1 — on the embedded WEB→RV1909 corpus (en→es, 29k "
        f"pairs), {setup['max_tokens']}-token batches, AdamW inverse-sqrt. Base: `{report['base_command']}` "
        f"(test BLEU {base_test.get('bleu', 'n/a')}, chrF {base_test.get('chrf', 'n/a')} on "
        f"{setup['test_samples']} verses, beam 4)" + (
            ", trained with ADMIN (liu2020) because plain post-LN barely leaves the unigram level at this batch size "
            "(docs/dou2018.md, 'Warm start')"
            ", "
            "then folded (`hf_deepnmt.fold_admin`) into the plain post-LN model computing the same function: every "
            "row starts from, and trains as, a plain post-LN Transformer" if setup.get("base_admin") else "") + (
        f". Every row then trains {setup['max_steps']} more steps from it "
        f"(lr {setup['learning_rate']}, {setup['warmup_steps']} warm-up steps), seeds {setup['seeds']}; the vanilla "
        f"row too (test BLEU per seed {', '.join('n/a' if v is None else f'{v:.2f}' for v in vanilla)}), the "
        "reference of every paired difference."),
        "",
        "Ways: " + "; ".join({"plain": "`plain` = the new parameters train like the rest (dou2018)"}.get(
            way, f"`{way}` = `deepnmt train {' '.join(way_arguments(way))}`") for way in setup["ways"]) + ".",
        "",
        "## Step 0: how much each warm start changes the trained function",
        "",
        f"Warm-started model before any training against the base, {setup['step0_pairs']} validation pairs, teacher "
        "forcing, evaluation mode: mean per-token KL(base ‖ row) in nats and the change of NLL "
        f"(base NLL {next(iter(report['step0'].values()), {}).get('base_nll', float('nan')):.3f}).",
        "",
        "| row | KL(base ‖ row) | ΔNLL |",
        "|---|---|---|",
    ]
    for row in setup["rows"]:
        if row in report["step0"]:
            change = report["step0"][row]
            lines.append(f"| {TABLE_1[row][0]} | {change['kl']:.4f} | {change['delta_nll']:+.4f} |")
    lines += [
        "",
        "## Test BLEU: paired differences to the vanilla row (same base, same seed)",
        "",
        "Each Δ is the row's test BLEU minus the vanilla row's of the same seed; mean ± sd over the seeds. Paper Δ: "
        "dou2018 Table 1 (Base, WMT14 En→De).",
        "",
        "| row | params | way | Δ BLEU per seed | mean Δ BLEU | mean Δ chrF | mean Δ valid loss | "
        "layer diversity enc / dec | paper Δ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    paper_vanilla = TABLE_1["vanilla"][2]
    summary: dict[str, list[float]] = {}
    for row in setup["rows"]:
        if row == "vanilla":
            continue
        for way in setup["ways"]:
            runs = [report["runs"].get(f"{row}/{way}/seed{seed}") or {} for seed in setup["seeds"]]
            bleu, chrf = paired(report, row, way, "bleu"), paired(report, row, way, "chrf")
            summary.setdefault(way, []).extend(delta for _, delta in bleu)
            params = next((run["diversity"]["parameters"] for run in runs if run.get("diversity")), None)
            diversity = [run["diversity"] for run in runs if run.get("diversity")]
            enc = statistics.mean(d["encoder"] for d in diversity) if diversity else None
            dec = statistics.mean(d["decoder"] for d in diversity) if diversity else None
            lines.append(
                f"| {TABLE_1[row][0]} | {'–' if params is None else f'{params / 1e6:.2f}M'} | {way} | "
                f"{', '.join(f'{delta:+.2f}' for _, delta in bleu) or '–'} | {_mean_sd([d for _, d in bleu])} | "
                f"{_mean_sd([d for _, d in chrf])} | {_mean_sd(valid_delta(report, row, way), 3)} | "
                f"{'–' if enc is None else f'{enc:.3f} / {dec:.3f}'} | {TABLE_1[row][2] - paper_vanilla:+.2f} |")
    lines += ["", "Dense connection adds no parameters, so its ways are the same run twice (the same scores: the runs "
              "are deterministic).", "", "Over all rows and seeds (paired Δ BLEU): " + "; ".join(
        f"{way}: mean {statistics.mean(values):+.2f}, {sum(value > 0 for value in values)} of {len(values)} above "
        "vanilla" for way, values in summary.items() if values) + ".", ""]
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
