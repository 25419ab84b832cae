"""Peak memory of `deepnmt translate` on long inputs: 10k vs 100k lines, read in windows vs all at once.

`deepnmt translate` reads ``--window`` lines (default 10,000), sorts them by length into batches, writes their
translations in input order and reads on, so its memory should not grow with the input. This script measures it:
a small random model (its translations are nonsense; only memory and time are measured), inputs of 10k and 100k
verses of the embedded corpus (repeated), one `deepnmt translate` child process per cell (peak RSS from
``os.wait4``), greedy search, 4 new tokens per sentence, 1 thread. ``--window`` equal to the line count is the
whole-file behaviour of earlier versions.

    python -m benchmarks.translate_memory            # writes benchmarks/translate_memory.md
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def build_model(folder: Path) -> None:
    """A 2+2-layer d_model 64 DeepTransformer (random weights) with a joint BPE of 1,000 tokens."""
    import torch

    import hf_deepnmt
    from hf_deepnmt_training.corpus import corpus_dir
    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.tokenizer import train_joint_bpe

    pairs = read_parallel_file(corpus_dir() / "valid.jsonl.gz", "en", "es")
    tokenizer = train_joint_bpe(pairs.sources, pairs.targets, vocab_size=1000)
    torch.manual_seed(0)
    config = hf_deepnmt.DeepTransformerConfig(
        vocab_size=len(tokenizer), d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id, unk_token_id=tokenizer.unk_token_id)
    hf_deepnmt.DeepTransformerForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def write_input(path: Path, lines: int) -> None:
    from hf_deepnmt_training.corpus import corpus_dir

    with gzip.open(corpus_dir() / "test.jsonl.gz", "rt", encoding="utf-8") as handle:
        verses = [json.loads(line)["translation"]["en"] for line in handle]
    with open(path, "w", encoding="utf-8") as out:
        for i in range(lines):
            out.write(verses[i % len(verses)] + "\n")


def measure(model: Path, source: Path, window: int, output: Path) -> dict:
    """One `deepnmt translate` child: its wall time and peak RSS (MiB)."""
    command = [sys.executable, "-m", "hf_deepnmt_training.cli", "translate", "--model", str(model), "--input", str(source),
               "--output", str(output), "--num_beams", "1", "--max_new_tokens", "4", "--batch_size", "64",
               "--window", str(window), "--threads", "1"]
    started = time.time()
    child = subprocess.Popen(command, stderr=subprocess.DEVNULL, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    _, status, usage = os.wait4(child.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed with status {status}")
    return {"wall_s": round(time.time() - started, 1), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
            "lines_out": sum(1 for _ in open(output, encoding="utf-8"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", default="10000,100000", help="Comma-separated input sizes.")
    parser.add_argument("--window", type=int, default=10_000, help="The windowed rows' --window.")
    parser.add_argument("--work_dir", default="runs/translate_memory")
    parser.add_argument("--output", default=str(HERE / "translate_memory.md"))
    args = parser.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if not (model / "model.safetensors").exists():
        build_model(model)
    rows = []
    for lines in (int(n) for n in args.lines.split(",")):
        source = work / f"input-{lines}.txt"
        write_input(source, lines)
        for label, window in ((f"window {args.window}", args.window), ("whole file (window = lines)", lines)):
            result = measure(model, source, window, work / f"output-{lines}-{window}.txt")
            assert result["lines_out"] == lines, result
            rows.append({"lines": lines, "mode": label, **result})
            print(rows[-1], flush=True)
    command = "python -m benchmarks.translate_memory" + (f" --lines {args.lines}" if args.lines != "10000,100000"
                                                          else "")
    text = ["# `deepnmt translate` on long inputs: peak memory", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
            f"Command: `{command}` (load average at the end {os.getloadavg()[0]:.2f}; the 2-core machine was "
            "shared with other work, so wall times are indicative only).", "",
            "| input lines | reading | peak RSS (MiB) | wall (s) |", "|---|---|---|---|"]
    text += [f"| {r['lines']:,} | {r['mode']} | {r['peak_rss_mib']} | {r['wall_s']} |" for r in rows]
    Path(args.output).write_text("\n".join(text) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
