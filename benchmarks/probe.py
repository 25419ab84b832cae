"""Peak memory (and step time) of one configuration, measured in a fresh child process.

Why a child per configuration: PyTorch on CPU allocates through the C allocator, which keeps freed memory around,
and tracemalloc does not see tensor storage; only the operating system's resident set size (RSS) is trustworthy,
and only in a process that has run nothing else. The child imports torch/transformers, records its RSS, resets the
kernel's peak-RSS counter (``/proc/self/clear_refs``), builds the model and the data, runs the workload and reads the
peak (VmHWM). ``peak_mib`` = peak − RSS after imports: parameters, gradients, optimizer state, activations and caches,
without the interpreter and libraries (reported separately as ``baseline_mib``).

Run by the harness as ``python -m benchmarks.probe '<json spec>'`` (`benchmarks.probe_runner.run_probe`);
prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time


def _workload(spec: dict[str, object]):
    import torch

    if spec["workload"] == "engine":
        from .engines import probe_workload

        return probe_workload(spec)

    from .common import build_marian, build_ours, fixed_generation_config, model_dims, synthetic_batch
    from .measure import training_step

    dims = model_dims(spec["size"], encoder_layers=spec.get("encoder_layers", 6),
                      decoder_layers=spec.get("decoder_layers", 6))
    from .common import VARIANTS

    model = build_marian(dims) if spec["model"] == "marian" else build_ours(dims, **VARIANTS.get(spec.get("variant"), {}))
    if spec.get("checkpointing"):
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    length = spec.get("length")
    bounds = dict(min_len=length, max_len=length) if length else {}
    if spec["workload"] == "train":
        batch = synthetic_batch(tokens=spec.get("tokens", 4096), seed=0, **bounds)
        return training_step(model, batch), batch.target_tokens
    source = synthetic_batch(sentences=spec["batch"], seed=2, **bounds)
    model.eval()
    fixed_generation_config(model, spec["num_beams"], spec["new_tokens"])

    def generate() -> None:
        with torch.no_grad():
            model.generate(input_ids=source.input_ids, attention_mask=source.attention_mask)

    return generate, int(source.input_ids.size(0))


def main(spec: dict[str, object]) -> dict[str, object]:
    import torch

    import hf_deepnmt  # noqa: F401  (imports everything the workload needs before the baseline is read)
    import transformers  # noqa: F401

    if spec["workload"] == "engine":  # every engine's library is in the baseline of every engine probe
        import ctranslate2  # noqa: F401
        import onnxruntime  # noqa: F401

        import hf_deepnmt.export  # noqa: F401

    from .common import reset_peak_rss, rss_kib

    torch.set_num_threads(int(spec.get("threads", torch.get_num_threads())))
    baseline = rss_kib()["VmRSS"]
    resettable = reset_peak_rss()
    function, units = _workload(spec)
    times = []
    for _ in range(1 + int(spec.get("timed", 1))):  # the first call also allocates optimizer state / warms kernels
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    peak = rss_kib()["VmHWM"]
    if not resettable:  # the peak may then predate the baseline; report it as is
        peak = max(peak, baseline)
    return {**spec, "baseline_mib": baseline / 1024, "peak_mib": (peak - baseline) / 1024,
            "peak_rss_mib": peak / 1024, "step_s": sorted(times[1:])[len(times[1:]) // 2] if len(times) > 1 else None,
            "units": units, "peak_reset_supported": resettable}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
