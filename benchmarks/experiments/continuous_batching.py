"""Continuous batching on this CPU: sentences that join a running retiring search (`ContinuousSearch.admit` between
decoder steps, ``deepnmt serve --continuous_batching``) against one batch at a time, on a saturated stream.

One model folder (default ``runs/quickstart``, made by ``bash run.sh quickstart``), the first ``--sentences`` texts of
the serve benchmark's workload (benchmarks/serve_load.py: 1–3 consecutive English verses of the embedded test set per
request), the model's own generation settings (beam 4 for a model of `deepnmt train`), each text its own new-token
budget, at most ``--batch`` sentences in a search, one torch thread, every text available from the start (a server
under more load than it can serve):

* **batch at a time**: a search of ``--batch`` texts runs until its last sentence is done, then the next starts
  (``deepnmt serve``'s default);
* **continuous**: before every decoder step the search takes as many waiting texts as leave it ``--batch``
  sentences (``--continuous_batching``).

Reported per policy: wall time (medians of ``--rounds`` interleaved rounds after a warm-up), decoder steps, the mean
sentences per step, and — the cost of taking sentences half-way — per sentence and step, the self-attention cache
positions its rows attend over (and its step copies) against the positions its own hypotheses hold (a row that
joins late attends over the positions of the oldest row's hypotheses, masked for it). Both policies must give the same translations
(counted). Writes ``continuous_batching.json`` and ``.md`` under ``--results``.

    python -m benchmarks.experiments.continuous_batching                          # the committed result
    python -m benchmarks.experiments.continuous_batching --sentences 24 --rounds 1 --results /tmp/cb   # smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from .common import provenance, render_only, write_results

NAME = "continuous_batching"
POLICIES = ("batch at a time", "continuous")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/quickstart", help="A trained model folder.")
    parser.add_argument("--sentences", type=int, default=192)
    parser.add_argument("--batch", type=int, default=32, help="Most sentences in a search (the server's default).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--render_only", action="store_true", help="Rewrite the .md from the JSON.")
    args = parser.parse_args()
    if render_only(args, NAME, render):
        return
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from benchmarks.serve_load import test_set_requests
    from hf_deepnmt.pipeline_translation import new_token_budget
    from hf_deepnmt.retiring_search import ContinuousSearch, search_settings

    torch.set_num_threads(1)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    texts = [text for request in test_set_requests(args.sentences) for text in request][:args.sentences]
    ids = [tokenizer(text, truncation=True)["input_ids"] for text in texts]
    settings = search_settings(model, {})
    limit = int(model.config.max_position_embeddings)

    def run(continuous: bool) -> dict:
        """Every text through one search at a time; the statistics of the run and the translations."""
        search = ContinuousSearch(model, settings)
        position, outputs, steps, rows, columns, lengths = 0, {}, 0, [], [], []
        started = time.perf_counter()
        while len(outputs) < len(ids):
            room = args.batch - len(search)
            if position < len(ids) and room > 0 and (continuous or len(search) == 0):
                joining = ids[position:position + room]
                batch = tokenizer.pad({"input_ids": joining}, return_tensors="pt")
                search.admit(batch["input_ids"], batch["attention_mask"],
                             [new_token_budget(len(sentence), limit) for sentence in joining],
                             range(position, position + len(joining)))
                position += len(joining)
            rows.append(len(search))
            columns.append(search.columns * len(search))  # cache positions each sentence's rows attend over
            lengths.append(float((search.state.lengths - 1).sum()))  # the positions its own hypotheses hold
            for index, hypotheses in search.step():
                outputs[index] = hypotheses.sequences[0].tolist()
            steps += 1
        return {"seconds": time.perf_counter() - started, "steps": steps,
                "mean_sentences_per_step": statistics.mean(rows), "mean_cache_positions": sum(columns) / sum(rows),
                "mean_hypothesis_positions": sum(lengths) / sum(rows),
                "outputs": [outputs[index] for index in range(len(ids))]}

    run(True)  # warm-up
    measured: dict[str, list[dict]] = {policy: [] for policy in POLICIES}
    for _ in range(args.rounds):
        for policy in POLICIES:
            measured[policy].append(run(policy == "continuous"))
    report = {"model": args.model, "sentences": len(ids), "batch": args.batch, "rounds": args.rounds, "threads": 1,
              **provenance(NAME), "policies": {}}
    for policy, runs in measured.items():
        last = runs[-1]
        report["policies"][policy] = {
            "seconds": [run_["seconds"] for run_ in runs], "median_s": statistics.median(r["seconds"] for r in runs),
            **{key: last[key] for key in ("steps", "mean_sentences_per_step", "mean_cache_positions",
                                          "mean_hypothesis_positions")}}
    first, second = (measured[policy][-1]["outputs"] for policy in POLICIES)
    report["identical"] = sum(a == b for a, b in zip(first, second))
    report["continuous_over_batch"] = (report["policies"]["continuous"]["median_s"]
                                       / report["policies"]["batch at a time"]["median_s"])
    print(f"[{NAME}] " + ", ".join(f"{policy} {cell['median_s']:.2f} s" for policy, cell in
                                    report["policies"].items()) + f", {report['identical']} of {len(ids)} identical",
          file=sys.stderr, flush=True)
    write_results(report, args.results, NAME, render)


def render(report: dict, results: Path) -> None:
    lines = ["# Continuous batching vs one batch at a time on a saturated stream (retiring search, CPU)", "",
             f"`{report['model']}`, the first {report['sentences']} texts of the serve workload, the model's generation "
             f"settings, each text its own budget, at most {report['batch']} sentences per search, every text waiting "
             f"from the start, {report['threads']} torch thread, {report['rounds']} interleaved rounds, medians; commit "
             f"`{report['commit']}`. Measured by:", "", "```bash", report["command"], "```", "",
             "| policy | wall time | decoder steps | sentences per step | cache positions per sentence-step | "
             "its own hypothesis positions |", "|---|---|---|---|---|---|"]
    for policy, cell in report["policies"].items():
        lines.append(f"| {policy} | {cell['median_s']:.2f} s | {cell['steps']} | {cell['mean_sentences_per_step']:.1f} "
                     f"| {cell['mean_cache_positions']:.1f} | {cell['mean_hypothesis_positions']:.1f} |")
    lines += ["", f"Continuous / batch at a time: **{report['continuous_over_batch']:.2f}×** the wall time; "
              f"{report['identical']} of {report['sentences']} translations identical (float32: a sentence's "
              "log-probabilities may move by rounding with its batch's composition)."]
    (results / f"{NAME}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
