"""Section ``data_scale``: memory and time from `deepnmt train` to its first training step at WMT corpus sizes.

    python -m benchmarks.data_scale --before /path/to/old/checkout --merge      # the table of benchmarks/RESULTS.md
    python -m benchmarks.data_scale --render_only --out-dir DIR --merge         # re-render DIR/results.json

``--merge`` writes the block ``<!-- generated:data_scale -->`` of benchmarks/RESULTS.md and the measurements it is
rendered from to benchmarks/data_scale.json (tests/test_results_files.py re-renders one from the other).
    python -m benchmarks.data_scale --sizes 20000 --procs 1 --out-dir runs/ds   # a quick look

The corpus is the embedded training set (`training/corpus`, 9.6k pairs) repeated to 100k, 300k, 1M and 4.5M pairs
(4.5M stands in for WMT14 En→De) as JSON lines. Each row runs the real command — ``deepnmt train`` with a tiny model,
``--max_steps 1`` and no evaluation — in one process or two (``torchrun --nproc_per_node 2``, gloo, one thread each),
twice: the **first** run from an empty `datasets` cache and a **cached** second run with another ``--output_dir``.
It measures, by sampling every process of the run every 0.2 s (psutil):

* **peak RSS of a process** (the largest worker; file-backed pages of memory-mapped Arrow files count) and its
  **anonymous** part (``RssAnon``: memory the process owns; what a larger corpus would multiply);
* **to first step**: wall time from the command's start to the first logged training loss (the data stages, the
  model, one step); and the whole command.

``--before DIR`` runs the same rows with the checkout in DIR (the code before `hf_deepnmt_training.preprocess`: Python lists
tokenized in every process, no cache) with this machine's virtual environment; rows that would not fit this machine's
memory are skipped with the reason (``--before_max_pairs``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = (100_000, 300_000, 1_000_000, 4_500_000)
TINY = ("d_model=32,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,decoder_attention_heads=2,"
        "encoder_ffn_dim=64,decoder_ffn_dim=64,max_position_embeddings=256")
GOALS = {"rss_gib_1m": 1.5, "two_over_one": 1.3, "cached_s_4_5m": 60.0, "first_min_4_5m": 15.0}
LOSS_LINE = re.compile(r"['\"]loss['\"]\s*:")
GIB = 2**30


def write_corpus(path: Path, pairs: int) -> Path:
    """The embedded training pairs repeated to ``pairs`` lines of run_translation JSON (written once)."""
    if path.exists():
        return path
    sys.path.insert(0, str(ROOT))
    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.recipes import resolve_path

    corpus = read_parallel_file(resolve_path("corpus:web-sparv/train.jsonl.gz"), "en", "es")
    lines = [json.dumps({"translation": {"en": s, "es": t}}, ensure_ascii=False) + "\n"
             for s, t in zip(corpus.sources, corpus.targets)]
    staged = path.with_suffix(".partial")
    with open(staged, "w", encoding="utf-8") as handle:
        for index in range(pairs):
            handle.write(lines[index % len(lines)])
    os.replace(staged, path)
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _memory(process: Any) -> tuple[int, int]:
    """(RSS, RssAnon) in bytes of one process (0, 0 once it is gone)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{process.pid}/status").read_text().splitlines()
                      if line.startswith(("VmRSS", "RssAnon")))
        return (int(fields.get("VmRSS", "0 kB").split()[0]) * 1024, int(fields.get("RssAnon", "0 kB").split()[0]) * 1024)
    except (OSError, ValueError):
        return 0, 0


def run_command(command: list[str], env: dict[str, str], cwd: Path, log: Path, timeout: float) -> dict[str, Any]:
    """Run ``command``, sampling the memory of it and its children; the time of the first logged loss."""
    import psutil

    started = time.time()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, bufsize=1)
    first_step: list[float] = []

    def read() -> None:
        with open(log, "w") as out:
            for line in process.stdout:
                out.write(line)
                if not first_step and LOSS_LINE.search(line):
                    first_step.append(time.time() - started)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak_rss = peak_anon = peak_total = 0
    parent = psutil.Process(process.pid)
    while process.poll() is None:
        if time.time() - started > timeout:
            process.kill()
            break
        try:
            members = [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        # the workers (torchrun's agent holds no data: the largest process is a worker in either case)
        samples = [_memory(member) for member in members]
        peak_rss = max(peak_rss, *(rss for rss, _ in samples))
        peak_anon = max(peak_anon, *(anon for _, anon in samples))
        peak_total = max(peak_total, sum(rss for rss, _ in samples))
        time.sleep(0.2)
    process.wait()
    reader.join(timeout=10)
    return {"returncode": process.returncode, "seconds": round(time.time() - started, 1),
            "first_step_s": round(first_step[0], 1) if first_step else None,
            "peak_rss_gib": round(peak_rss / GIB, 2), "peak_anon_gib": round(peak_anon / GIB, 2),
            "peak_total_gib": round(peak_total / GIB, 2), "log": str(log)}


def train_command(code: Path, corpus: Path, output_dir: Path, procs: int, after: bool) -> list[str]:
    argv = ["-m", "hf_deepnmt_training.cli", "train", "--train_file", str(corpus), "--source_lang", "en", "--target_lang", "es",
            "--output_dir", str(output_dir), "--max_steps", "1", "--logging_steps", "1", "--use_cpu",
            "--model_type", "deep_transformer", "--config_overrides", TINY, "--vocab_size", "8000",
            "--max_tokens", "4096", "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
            "--disable_tqdm", "false"]
    if procs == 1:
        return [sys.executable, *argv]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_port",
            str(_free_port()), *argv]


def measure(code: Path, label: str, corpus: Path, pairs: int, procs: int, work: Path,
            timeout: float, log: Any, runs: tuple[str, ...] = ("first", "cached")) -> list[dict[str, Any]]:
    """The first and the cached run of one row (a fresh datasets cache for the first)."""
    cache = work / f"cache-{label}-{pairs}-{procs}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache), "OMP_NUM_THREADS": str(2 // procs),
           "TOKENIZERS_PARALLELISM": "true" if procs == 1 else "false", "PYTHONPATH": str(code),
           "DEEPNMT_CACHE": str(work / "cli-cache")}
    rows = []
    for run in runs:
        output_dir = work / f"out-{label}-{pairs}-{procs}-{run}"
        shutil.rmtree(output_dir, ignore_errors=True)
        result = run_command(train_command(code, corpus, output_dir, procs, label == "after"), env, code,
                             work / f"{label}-{pairs}-{procs}-{run}.log", timeout)
        metrics = output_dir / "metrics.json"
        if metrics.exists():
            result["timings"] = json.loads(metrics.read_text()).get("timings_seconds", {})
        row = {"code": label, "pairs": pairs, "procs": procs, "run": run, **result}
        log(json.dumps(row))
        rows.append(row)
        shutil.rmtree(output_dir, ignore_errors=True)
        if result["returncode"] != 0:
            break
    shutil.rmtree(cache, ignore_errors=True)
    return rows


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    if row.get("skipped"):
        return f"not run: {row['skipped']}"
    if row["returncode"] != 0:
        return f"failed (exit {row['returncode']}, {row['log']})"
    step = row["first_step_s"] if row["first_step_s"] is not None else row["seconds"]
    return f"{row['peak_rss_gib']:.2f} GB ({row['peak_anon_gib']:.2f} anon), {step:.0f} s"


def render(results: dict[str, Any]) -> str:
    """The markdown block of RESULTS.md (``<!-- generated:data_scale -->``)."""
    rows = results["rows"]

    def find(code: str, pairs: int, procs: int, run: str) -> dict[str, Any] | None:
        return next((r for r in rows if (r["code"], r["pairs"], r["procs"], r["run"]) == (code, pairs, procs, run)),
                    None)

    lines = [
        "## Data at scale: peak memory and time to the first training step",
        "",
        f"`{results['command']}` ({results['machine']}; {results['date']}). `deepnmt train` with a tiny model, "
        "`--max_steps 1`, on the embedded training set repeated to N pairs of JSON lines. Each cell: **peak RSS of "
        "one process** (its anonymous part, RssAnon, in brackets; the rest are pages of memory-mapped files), "
        "**wall seconds to the first logged training loss**. *first*: empty cache; *cached*: the same command again "
        "with another `--output_dir`. *before*: the code before `hf_deepnmt_training.preprocess` (commit "
        f"{results.get('before_commit') or '?'}: the corpus in Python lists in every process, nothing cached); "
        "*after*: this code.",
        "",
        "| pairs | procs | before, first | before, cached | after, first | after, cached |",
        "|---:|---:|---|---|---|---|",
    ]
    for pairs in sorted({r["pairs"] for r in rows}):
        for procs in sorted({r["procs"] for r in rows}):
            cells = [_cell(find(code, pairs, procs, run)) for code in ("before", "after") for run in ("first", "cached")]
            if any(cell != "—" for cell in cells):
                lines.append(f"| {pairs:,} | {procs} | " + " | ".join(cells) + " |")
    stages = [r for r in rows if r["code"] == "after" and r.get("timings") and r["procs"] == 1]
    if stages:
        lines += ["", "Data stages of the *after* runs, one process (seconds, from the run's `metrics.json`):", "",
                  "| pairs | run | read | joint BPE | tokenize | batching |", "|---:|---|---:|---:|---:|---:|"]
        for r in stages:
            t = r["timings"]
            lines.append(f"| {r['pairs']:,} | {r['run']} | {t.get('read_seconds', 0):.1f} | "
                         f"{t.get('bpe_seconds', 0):.1f} | {t.get('tokenize_seconds', 0):.1f} | "
                         f"{t.get('batching_seconds', 0):.1f} |")
    lines += ["", *goal_lines(find)]
    return "\n".join(lines)


def goal_lines(find: Any) -> list[str]:
    """The issue's goals, each with the measured figure it is judged on."""
    out = []
    one_m = find("after", 1_000_000, 1, "first")
    if one_m and one_m["returncode"] == 0:
        verdict = "met" if one_m["peak_rss_gib"] <= GOALS["rss_gib_1m"] else "missed"
        out.append(f"- peak RSS of a process at 1M pairs ≤ {GOALS['rss_gib_1m']} GB: {one_m['peak_rss_gib']:.2f} GB "
                   f"({verdict})")
    big = find("after", 4_500_000, 1, "first")
    if big and big["returncode"] == 0:
        verdict = "met" if big["first_step_s"] / 60 <= GOALS["first_min_4_5m"] else "missed"
        out.append(f"- first run to the first step at 4.5M pairs ≤ {GOALS['first_min_4_5m']:.0f} min: "
                   f"{big['first_step_s'] / 60:.1f} min, peak RSS {big['peak_rss_gib']:.2f} GB ({verdict})")
    cached = find("after", 4_500_000, 1, "cached")
    if cached and cached["returncode"] == 0:
        verdict = "met" if cached["first_step_s"] <= GOALS["cached_s_4_5m"] else "missed"
        out.append(f"- cached run to the first step at 4.5M pairs ≤ {GOALS['cached_s_4_5m']:.0f} s: "
                   f"{cached['first_step_s']:.0f} s ({verdict})")
    for pairs in SIZES:
        one, two = find("after", pairs, 1, "first"), find("after", pairs, 2, "first")
        if one and two and one["returncode"] == two["returncode"] == 0:
            ratio = two["peak_rss_gib"] / one["peak_rss_gib"]
            verdict = "met" if ratio < GOALS["two_over_one"] else "missed"
            out.append(f"- {pairs:,} pairs, two processes / one, peak RSS of a process < {GOALS['two_over_one']}×: "
                       f"{ratio:.2f}× ({verdict})")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="corpus sizes in pairs, comma-separated")
    parser.add_argument("--procs", default="1,2", help="process counts, comma-separated")
    parser.add_argument("--before", default=None, help="a checkout of the code before hf_deepnmt_training.preprocess")
    parser.add_argument("--before_max_pairs", type=int, default=1_000_000,
                        help="largest corpus the before code is run on (1M pairs peaked at 10.6 GB per process)")
    parser.add_argument("--before_max_pairs_two_procs", type=int, default=300_000,
                        help="largest corpus the before code is run on with two processes (two copies)")
    parser.add_argument("--before_second_max_pairs", type=int, default=300_000,
                        help="largest corpus the before code's second run is measured on")
    parser.add_argument("--out-dir", default="runs/data_scale")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--merge", action="store_true", help="write the block into benchmarks/RESULTS.md")
    parser.add_argument("--render_only", action="store_true",
                        help="measure nothing: render (and --merge) the rows already in OUT_DIR/results.json")
    args = parser.parse_args(argv)
    work = Path(args.out_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    results_file = work / "results.json"
    previous = json.loads(results_file.read_text()) if results_file.exists() else {"rows": []}

    def log(message: str) -> None:
        print(f"[data_scale] {message}", file=sys.stderr, flush=True)

    rows = previous["rows"]
    before_commit = previous.get("before_commit")
    if args.before and not args.render_only:
        before_commit = subprocess.run(["git", "-C", args.before, "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip() or None
        previous["command"] = "python -m benchmarks.data_scale " + " ".join(argv or sys.argv[1:])
    for pairs in [] if args.render_only else [int(s) for s in args.sizes.split(",")]:
        corpus = write_corpus(work / f"corpus-{pairs}.jsonl", pairs)
        for procs in [int(p) for p in args.procs.split(",")]:
            plans = [("after", ROOT)]
            if args.before:
                limit = args.before_max_pairs if procs == 1 else args.before_max_pairs_two_procs
                if pairs <= limit:
                    plans.insert(0, ("before", Path(args.before).resolve()))
                else:
                    rows = [r for r in rows if (r["code"], r["pairs"], r["procs"]) != ("before", pairs, procs)]
                    rows.append({"code": "before", "pairs": pairs, "procs": procs, "run": "first",
                                 "skipped": f"> {limit:,} pairs: the code before holds ~10 KB per pair in every "
                                            "process (10.6 GB at 1M pairs, row above); this machine has 24 GB"})
            for label, code in plans:
                rows = [r for r in rows if (r["code"], r["pairs"], r["procs"]) != (label, pairs, procs)]
                runs = ("first", "cached")
                if label == "before" and pairs > args.before_second_max_pairs:
                    runs = ("first",)  # the code before caches nothing: its second run repeats the first
                    rows.append({"code": "before", "pairs": pairs, "procs": procs, "run": "cached",
                                 "skipped": "nothing is cached, the second run repeats the first (measured up to "
                                            f"{args.before_second_max_pairs:,} pairs)"})
                rows += measure(code, label, corpus, pairs, procs, work, args.timeout, log, runs)
                results_file.write_text(json.dumps({**previous, "rows": rows, "before_commit": before_commit},
                                                   indent=1))
    import platform

    this_command = "python -m benchmarks.data_scale " + " ".join(argv or sys.argv[1:])
    command = previous.get("command")
    if not args.render_only and not args.before and command:  # rows added to an earlier table: name both commands
        command = f"{command.split('  #')[0].strip()}; later rows: {this_command}"
    results = {"rows": rows, "command": command or this_command,
               "machine": f"{os.cpu_count()} cores, {platform.machine()}, torch {_version('torch')}",
               "date": previous.get("date") if args.render_only else time.strftime("%Y-%m-%d"),
               "before_commit": before_commit}
    results_file.write_text(json.dumps(results, indent=1))
    block = render(results)
    print(block)
    if args.merge:
        from .report import merge_blocks

        target = ROOT / "benchmarks" / "RESULTS.md"
        target.write_text(merge_blocks(target.read_text(), [("data_scale", block)]))
        (ROOT / "benchmarks" / "data_scale.json").write_text(json.dumps(results, indent=1) + "\n")
        log(f"merged into {target}")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


if __name__ == "__main__":
    main()
