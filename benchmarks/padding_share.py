"""How much of `deepnmt train`'s batches is padding: the share that a training forward now skips
(docs/transformer.md, "Padding in training").

Cuts one epoch of the embedded corpus' training pairs into token-budget batches exactly as `deepnmt train` does
(`hf_deepnmt_training.data.TokenBudgetBatchSampler` over max(source, target) lengths, `--max_tokens` of the recipe)
and prints the real share of the padded source and target positions.

    python -m benchmarks.padding_share --model runs/quickstart --max_tokens 2048
"""

from __future__ import annotations

import argparse
import gzip
import json

import numpy as np


def padding_share(model: str, max_tokens: int, source_lang: str = "en", target_lang: str = "es") -> dict[str, float]:
    """Real tokens / padded positions of the source and the target over one epoch's batches."""
    from transformers import AutoTokenizer

    from hf_deepnmt_training.corpus import corpus_dir
    from hf_deepnmt_training.data import TokenBudgetBatchSampler

    tokenizer = AutoTokenizer.from_pretrained(model)
    with gzip.open(corpus_dir() / "train.jsonl.gz", "rt", encoding="utf-8") as handle:
        pairs = [json.loads(line)["translation"] for line in handle]
    sources = np.array([len(ids) for ids in tokenizer([pair[source_lang] for pair in pairs])["input_ids"]])
    targets = np.array([len(ids) for ids in tokenizer([pair[target_lang] for pair in pairs])["input_ids"]])
    sampler = TokenBudgetBatchSampler(np.maximum(sources, targets), max_tokens, seed=0)
    real = {"source": 0, "target": 0}
    padded = {"source": 0, "target": 0}
    for batch in sampler.batches_for_epoch(0):
        for side, lengths in (("source", sources[batch]), ("target", targets[batch])):
            real[side] += int(lengths.sum())
            padded[side] += int(lengths.max()) * len(batch)
    return {side: real[side] / padded[side] for side in real} | {"batches": len(sampler)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/quickstart", help="A model folder whose tokenizer cuts the pairs.")
    parser.add_argument("--max_tokens", type=int, default=2048, help="The token budget per batch (the quickstart's).")
    args = parser.parse_args()
    share = padding_share(args.model, args.max_tokens)
    print(f"{share['batches']} batches; real tokens: {share['source']:.1%} of the source positions, "
          f"{share['target']:.1%} of the target positions")


if __name__ == "__main__":
    main()
