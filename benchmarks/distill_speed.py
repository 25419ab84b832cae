"""Decoding speed of issue 37's teachers and distilled student, and translation of a corpus by 1 vs 2 processes.

Reads the folders ``python -m benchmarks.experiments.distill_bible`` leaves in ``--work_dir`` and measures, on a quiet
machine:

* ``decode``: sentences/s of beam-4 translation of the first ``--sentences`` test verses (the embedded corpus'
  held-out books) in length-sorted batches of 16 and of 1 (`hf_deepnmt_training.translate.translate_sentences`, the path of
  `deepnmt translate`), for teacher A (torch; ONNX Runtime int8 and CTranslate2 int8, exported here once into
  ``WORK_DIR/teacher-a-onnx-int8`` and ``WORK_DIR/teacher-a-ctranslate2-int8``), the ensemble A + B (torch: an
  ensemble runs on torch only) and the distilled student (torch; its ONNX and CTranslate2 int8 exports). The
  contenders run interleaved (A, B, C, …, A, B, C, …) ``--repeats`` times; each figure is the median, and the table
  gives each one's speed-up over the ensemble and over teacher A (torch);
* ``shards``: wall-clock sentences/s of ``deepnmt translate`` of the first ``--shard_sentences`` training sources
  (teacher A, beam 4, its fastest engine: torch) by one process with 1 thread, one process with 2 threads, and
  ``torchrun --nproc_per_node 2`` with 1 thread per process, end to end (interpreter start and model load
  included, as a user sees it).

Writes ``speed`` into ``benchmarks/experiments/results/distill_bible.json`` (``--results``; with ``--student_steps N``,
the study's ``distill_bible_<N>steps.json``) and re-renders its markdown.

    python -m benchmarks.distill_speed --work_dir runs/distill_bible                   # both sections
    python -m benchmarks.distill_speed --work_dir runs/distill_bible --sections shards  # one
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .common import REPO, machine_info  # noqa: E402
from .experiments.common import RESULTS  # noqa: E402

TEST_FILE = "corpus:web-sparv/test.jsonl.gz"
TRAIN_FILE = "corpus:web-sparv/train.jsonl.gz"
BATCH_SIZES = (16, 1)


def log(message: str) -> None:
    print(f"[distill_speed] {message}", file=sys.stderr, flush=True)


def export_teacher(work: Path, export_format: str) -> Path:
    """Teacher A's int8 export of ``export_format`` (made once)."""
    folder = work / f"teacher-a-{export_format}-int8"
    if not (folder / "deepnmt_export.json").is_file():
        log(f"exporting teacher A to {export_format} int8")
        subprocess.run([sys.executable, "-m", "hf_deepnmt_training.cli", "export", str(work / "teacher-a"), str(folder),
                        "--format", export_format, "--quantization", "int8", "--force"], check=True)
    return folder


def contenders(work: Path, threads: int) -> dict[str, tuple[object, object]]:
    """Name → (engine, tokenizer) of every contender."""
    from hf_deepnmt.export import TorchEngine, load_engine
    from hf_deepnmt_training.translate import load_models_and_tokenizer

    distill = work / "distill"
    found = {}
    for name, folders in (("teacher A, torch", [work / "teacher-a"]),
                          ("ensemble A + B, torch", [work / "teacher-a", work / "teacher-b"]),
                          ("student, torch", [distill / "student"])):
        model, tokenizer = load_models_and_tokenizer([str(folder) for folder in folders])
        found[name] = (TorchEngine(model), tokenizer)
    from transformers import AutoTokenizer

    for name, folder, engine in (("teacher A, ONNX int8", export_teacher(work, "onnx"), "onnx"),
                                 ("teacher A, CTranslate2 int8", export_teacher(work, "ctranslate2"), "ctranslate2"),
                                 ("student, ONNX int8", distill / "student" / "onnx", "onnx"),
                                 ("student, CTranslate2 int8", distill / "student-ctranslate2", "ctranslate2")):
        found[name] = (load_engine(folder, engine, intra_threads=threads), AutoTokenizer.from_pretrained(folder))
    return found


def decode_section(work: Path, sentences: int, repeats: int, threads: int) -> dict:
    """Interleaved medians of sentences/s per contender and batch size."""
    import torch

    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.recipes import resolve_path
    from hf_deepnmt_training.translate import translate_sentences

    torch.set_num_threads(threads)
    sources = read_parallel_file(resolve_path(TEST_FILE), "en", "es", sentences).sources
    engines = contenders(work, threads)
    timings: dict[str, dict[int, list[float]]] = {name: {size: [] for size in BATCH_SIZES} for name in engines}
    for name, (engine, tokenizer) in engines.items():  # warm-up, not timed
        translate_sentences(engine, tokenizer, sources[:4], num_beams=4, batch_size=4, progress=False)
    for repeat in range(repeats):
        for size in BATCH_SIZES:
            for name, (engine, tokenizer) in engines.items():
                started = time.perf_counter()
                translate_sentences(engine, tokenizer, sources, num_beams=4, batch_size=size, progress=False)
                timings[name][size].append(time.perf_counter() - started)
                log(f"repeat {repeat + 1}/{repeats}, batch {size}: {name} {len(sources) / timings[name][size][-1]:.1f} "
                    "sentences/s")
    speeds = {name: {str(size): round(len(sources) / statistics.median(values), 2) for size, values in by_size.items()}
              for name, by_size in timings.items()}
    return {"sentences": len(sources), "repeats": repeats, "threads": threads, "sentences_per_s": speeds,
            "seconds": {name: {str(size): values for size, values in by_size.items()}
                        for name, by_size in timings.items()}}


def shards_section(work: Path, sentences: int) -> dict:
    """Wall-clock sentences/s of `deepnmt translate` of training sources: 1 process (1 and 2 threads), 2 processes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    base = ["-m", "hf_deepnmt_training.cli", "translate", "--model", str(work / "teacher-a"), "--input", TRAIN_FILE,
            "--source_lang", "en", "--target_lang", "es", "--max_samples", str(sentences), "--num_beams", "4"]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    runs = {"1 process, 1 thread": [sys.executable, *base, "--threads", "1"],
            "1 process, 2 threads": [sys.executable, *base, "--threads", "2"],
            "2 processes (torchrun), 1 thread each": [sys.executable, "-m", "torch.distributed.run",
                                                       "--nproc_per_node", "2", "--master_port", str(port), *base,
                                                       "--threads", "1"]}
    results = {}
    outputs = {}
    for name, command in runs.items():
        output = work / f"shards-{len(results)}.txt"
        started = time.perf_counter()
        subprocess.run([*command, "--output", str(output)], env={**env, "OMP_NUM_THREADS": command[-1]},
                       check=True, capture_output=True)
        seconds = time.perf_counter() - started
        outputs[name] = output.read_text(encoding="utf-8")
        results[name] = {"seconds": round(seconds, 1), "sentences_per_s": round(sentences / seconds, 2),
                         "command": " ".join(["python" if part == sys.executable else part for part in command])}
        log(f"{name}: {results[name]['sentences_per_s']} sentences/s")
    first = next(iter(outputs.values()))
    return {"sentences": sentences, "runs": results,
            "same_output": all(text == first for text in outputs.values())}


def table(speed: dict) -> list[str]:
    lines = []
    decode = speed.get("decode")
    if decode:
        speeds = decode["sentences_per_s"]
        lines += [f"Beam 4 on the first {decode['sentences']} test verses, {decode['threads']} thread(s), median of "
                  f"{decode['repeats']} interleaved repeats; × = speed-up.", "",
                  "| model, engine | sentences/s, batch 16 | × ensemble | × teacher A | sentences/s, batch 1 | "
                  "× ensemble | × teacher A |", "|---|---|---|---|---|---|---|"]
        for name, by_size in speeds.items():
            cells = [name]
            for size in ("16", "1"):
                value = by_size[size]
                cells += [f"{value:.2f}", f"{value / speeds['ensemble A + B, torch'][size]:.2f}",
                          f"{value / speeds['teacher A, torch'][size]:.2f}"]
            lines.append("| " + " | ".join(cells) + " |")
    shards = speed.get("shards")
    if shards:
        lines += ["", f"`deepnmt translate` of the first {shards['sentences']} training sources, teacher A, beam 4, "
                  f"wall clock end to end (outputs identical: {shards['same_output']}):", "",
                  "| processes | seconds | sentences/s | command |", "|---|---|---|---|"]
        for name, run in shards["runs"].items():
            lines.append(f"| {name} | {run['seconds']} | {run['sentences_per_s']} | `{run['command']}` |")
    return lines


def build_parser() -> argparse.ArgumentParser:
    """The command line; the study's options that name its results file are the study's own
    (`benchmarks.experiments.distill_bible.results_name_of`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", default="runs/distill_bible")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--sections", default="decode,shards")
    parser.add_argument("--sentences", type=int, default=200, help="Test verses per decode timing (default: 200).")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shard_sentences", type=int, default=1000)
    parser.add_argument("--student_steps", type=int, default=None,
                        help="The study's --student_steps (its results file's name).")
    parser.add_argument("--teacher_steps", type=int, default=None,
                        help="The study's --teacher_steps (its results file's name).")
    parser.add_argument("--student_dropout", type=float, default=None,
                        help="The study's --student_dropout (its results file's name).")
    parser.add_argument("--teacher_dropout", type=float, default=None,
                        help="The study's --teacher_dropout (its results file's name).")
    parser.add_argument("--teacher_warmup_steps", type=int, default=None,
                        help="The study's --teacher_warmup_steps (its results file's name).")
    parser.add_argument("--keep_original_targets", action="store_true",
                        help="The study's --keep_original_targets (its results file's name).")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="The study's --device (its results file's name; the timings run on the CPU).")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    work, results = Path(args.work_dir), Path(args.results)
    from benchmarks.experiments.distill_bible import results_name_of

    name = results_name_of(args)
    path = results / f"{name}.json"
    report = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    speed = report.get("speed") or {}
    sections = [section.strip() for section in args.sections.split(",") if section.strip()]
    if "decode" in sections:
        speed["decode"] = decode_section(work, args.sentences, args.repeats, args.threads)
    if "shards" in sections:
        speed["shards"] = shards_section(work, args.shard_sentences)
    info = machine_info()
    speed["machine"] = f"{info.get('cpu', 'CPU')}, {os.cpu_count()} cores" if isinstance(info, dict) else str(info)
    speed["command"] = " ".join(["python", "-m", "benchmarks.distill_speed", *sys.argv[1:]])
    speed["table"] = table(speed)
    report["speed"] = speed
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    from benchmarks.experiments.distill_bible import render

    (results / f"{name}.md").write_text(render(report), encoding="utf-8")
    print("\n".join(speed["table"]))


if __name__ == "__main__":
    main()
