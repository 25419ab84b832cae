"""The retiring search (`hf_deepnmt.retiring_search`) against one transformers ``generate`` call per new-token budget,
on a trained model's test translations: `deepnmt translate`'s decoding (``translate_sentences``) both ways.

One model folder (default ``runs/quickstart``, made by ``bash run.sh quickstart``), the first ``--test_samples``
verses of the embedded test set (English → Spanish, the quickstart's direction), beam 4, batch sizes 32 and 8 (the
server's default batch and a small one), ``--threads`` torch threads, ``--rounds`` interleaved rounds of both searches
after a warm-up, medians. The two searches must give the same translations (the JSON counts identical outputs).
Writes ``retiring_search.json`` and ``retiring_search.md`` under ``--results``.

    python -m benchmarks.experiments.retiring_search                          # the committed result
    python -m benchmarks.experiments.retiring_search --test_samples 16 --rounds 1 --results /tmp/rs   # smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from .common import provenance, render_only, write_results

NAME = "retiring_search"
SEARCHES = ("generate", "retiring")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/quickstart", help="A trained model folder.")
    parser.add_argument("--test_samples", type=int, default=500)
    parser.add_argument("--batch_sizes", default="32,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--render_only", action="store_true", help="Rewrite the .md from the JSON.")
    args = parser.parse_args()
    if render_only(args, NAME, render):
        return
    import torch
    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.metrics import score_translations
    from hf_deepnmt_training.recipes import resolve_path
    from hf_deepnmt_training.translate import translate_sentences
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    from hf_deepnmt.pipeline_translation import recorded_language_pairs

    pair = (recorded_language_pairs(model.config) or [("en", "es")])[0]
    test = read_parallel_file(resolve_path("corpus:web-sparv/test.jsonl.gz"), pair[0], pair[1], args.test_samples)
    report: dict = {"model": args.model, "sentences": len(test.sources), "threads": args.threads,
                    "rounds": args.rounds, "direction": f"{pair[0]}-{pair[1]}",
                    **provenance(NAME), "batch_sizes": {}}
    for batch_size in [int(value) for value in args.batch_sizes.split(",")]:
        def run(search: str) -> tuple[float, list[str]]:
            started = time.perf_counter()
            texts = translate_sentences(model, tokenizer, test.sources, num_beams=4, batch_size=batch_size,
                                        progress=False, search=search)
            return time.perf_counter() - started, texts

        for search in SEARCHES:  # warm-up
            translate_sentences(model, tokenizer, test.sources[:16], num_beams=4, batch_size=batch_size,
                                progress=False, search=search)
        seconds: dict[str, list[float]] = {search: [] for search in SEARCHES}
        outputs: dict[str, list[str]] = {}
        for _ in range(args.rounds):
            for search in SEARCHES:
                elapsed, texts = run(search)
                seconds[search].append(elapsed)
                outputs[search] = texts
        cell = {search: {"seconds": seconds[search], "median_s": statistics.median(seconds[search]),
                         "bleu": score_translations(outputs[search], test.targets).bleu} for search in SEARCHES}
        cell["identical"] = sum(a == b for a, b in zip(outputs["generate"], outputs["retiring"]))
        cell["speedup"] = cell["generate"]["median_s"] / cell["retiring"]["median_s"]
        report["batch_sizes"][str(batch_size)] = cell
        print(f"[{NAME}] batch {batch_size}: generate {cell['generate']['median_s']:.1f} s, retiring "
              f"{cell['retiring']['median_s']:.1f} s ({cell['speedup']:.2f}×), {cell['identical']} of "
              f"{len(test.sources)} identical", file=sys.stderr, flush=True)
    write_results(report, args.results, NAME, render)


def render(report: dict, results: Path) -> None:
    lines = ["# The retiring search vs one `generate` call per budget: `deepnmt translate`'s decoding", "",
             f"`{report['model']}`, the first {report['sentences']} verses of the embedded test set "
             f"({report['direction']}), beam 4, {report['threads']} torch threads, {report['rounds']} interleaved "
             f"rounds, medians; commit `{report['commit']}`. Measured by:", "", "```bash", report["command"], "```", "",
             "| batch size | one generate call per budget | retiring search | speed-up | identical translations | "
             "BLEU (both) |", "|---|---|---|---|---|---|"]
    for batch_size, cell in report["batch_sizes"].items():
        bleu = {cell[search]["bleu"] for search in SEARCHES}
        lines.append(f"| {batch_size} | {cell['generate']['median_s']:.1f} s | {cell['retiring']['median_s']:.1f} s | "
                     f"**{cell['speedup']:.2f}×** | {cell['identical']} of {report['sentences']} | "
                     + " / ".join(f"{value:.2f}" for value in sorted(bleu)) + " |")
    (results / f"{NAME}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
