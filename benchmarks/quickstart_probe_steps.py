"""Step times of the quickstart probes' models (`benchmarks.experiments.quickstart_probes`), with this harness.

Median seconds of one training step (forward, backward, AdamW) of each probe's model, its steps interleaved with the
others' (so load affects all alike), on the synthetic 2048-source-token batch and 8000-token vocabulary, 1 thread.
Written into ``benchmarks/experiments/results/quickstart_probes.json`` (``step_seconds``), which the experiment's table
reads (``python -m benchmarks.experiments.quickstart_probes --collect``)::

    python -m benchmarks.quickstart_probe_steps [--repeats 8]

A module of its own, not an option of the experiment: it times the models with this harness (``benchmarks.common``,
``benchmarks.measure``) instead of training them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.experiments.common import RESULTS
from benchmarks.experiments.quickstart_probes import PROBES

from .common import build_ours, synthetic_batch
from .measure import training_throughput


def step_times(repeats: int = 8) -> dict[str, float]:
    """Median seconds of one training step of each probe's model (see the module docstring)."""
    import torch

    from hf_deepnmt_training.recipes import load_recipe, parse_overrides

    torch.set_num_threads(1)
    recipe = load_recipe("miniature")["model"]
    dims = {key: recipe[key] for key in ("d_model", "encoder_ffn_dim", "decoder_ffn_dim", "encoder_attention_heads",
                                         "decoder_attention_heads")}
    models = {}
    for name, options in PROBES.items():
        probe = parse_overrides(options[options.index("--config_overrides") + 1])  # dropout and the layer counts
        layers = {key: probe.pop(key) for key in ("encoder_layers", "decoder_layers")}
        models[name] = build_ours({**dims, **layers, "vocab_size": 8000, "max_position_embeddings": 512},
                                  layer_norm_position=recipe["layer_norm_position"], **probe)
    measured = training_throughput(models, synthetic_batch(tokens=2048), repeats=repeats)
    return measured["median_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--results", default=str(RESULTS))
    args = parser.parse_args()
    path = Path(args.results) / "quickstart_probes.json"
    stored = json.loads(path.read_text()) if path.exists() else {"probes": {}}
    stored["step_seconds"] = step_times(args.repeats)
    path.write_text(json.dumps(stored, indent=2) + "\n")
    print(json.dumps(stored["step_seconds"], indent=2))


if __name__ == "__main__":
    main()
