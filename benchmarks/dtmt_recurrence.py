"""meng2019 DTMT's recurrence: operators per timestep and the training step against the Transformer of the same
width, before the recurrence work (git ``DTMT_BEFORE_REF``), after it (eager) and with `compile_recurrence`.

Sections (``python -m benchmarks.run --sections ...``):

* ``dtmt_recurrence`` — this CPU, float32, d256, 1 thread (the ``dtmt`` section's settings);
* ``gpu_dtmt`` — one CUDA device, bf16 autocast, d512 and 4,096 source tokens (the ``gpu`` section's DTMT row).

The "before" model is the package at ``DTMT_BEFORE_REF``, loaded from git (or, on a machine without the repository's
history, from ``.before/<ref>/hf_deepnmt``, made by ``git archive <ref> hf_deepnmt | tar -x -C .before/<ref>``)
into a private package, so old and new code run interleaved in one process with the same weights.
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .common import REPO, SIZES, VOCAB, build_dtmt, build_ours, interleaved, median, model_dims, synthetic_batch

DTMT_BEFORE_REF = "ebce4ca"  # the last commit before the recurrence work of issue 36 item 4
_PACKAGES: dict[str, Any] = {}


def load_dtmt_before(ref: str = DTMT_BEFORE_REF) -> Any | None:
    """``modeling_dtmt`` of git ``ref`` as a private package, or None when neither git nor an exported copy has it."""
    if ref in _PACKAGES:
        return _PACKAGES[ref]
    root = Path(tempfile.mkdtemp(prefix="hf_deepnmt_dtmt_before_"))
    name = f"hf_deepnmt_dtmt_at_{ref}"
    package = root / name
    exported = REPO / ".before" / ref / "hf_deepnmt"
    if exported.is_dir():
        shutil.copytree(exported, package)
    else:
        try:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "hf_deepnmt"], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        (root / "hf_deepnmt").rename(package)
    (package / "__init__.py").write_text("")  # the modules only: the real __init__ registers the Auto classes again
    sys.path.insert(0, str(root))
    _PACKAGES[ref] = importlib.import_module(f"{name}.modeling_dtmt")
    return _PACKAGES[ref]


def build_dtmt_before(like: torch.nn.Module, ref: str = DTMT_BEFORE_REF) -> torch.nn.Module | None:
    """The model of ``ref`` with ``like``'s config and weights."""
    module = load_dtmt_before(ref)
    if module is None:
        return None
    config = module.DTMTConfig(**like.config.to_diff_dict())
    model = module.DTMTForConditionalGeneration(config)
    model.load_state_dict(like.state_dict())
    return model


def operators_per_position(model: torch.nn.Module) -> dict[str, float]:
    """Top-level aten operators of one training forward + backward (torch.profiler, CPU), per target position and
    per source position: the difference between batches one position longer on one side, over 10 positions."""
    def count(source: int, target: int) -> int:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(4, VOCAB, (8, source), generator=generator)
        labels = torch.randint(4, VOCAB, (8, target), generator=generator)
        model.train()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
            model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
        model.zero_grad(set_to_none=True)
        return sum(1 for event in profile.events() if event.name.startswith("aten::") and (
            event.cpu_parent is None or not event.cpu_parent.name.startswith("aten::")))

    base = count(10, 10)
    return {"per_target_position": (count(10, 20) - base) / 10, "per_source_position": (count(20, 10) - base) / 10}


def _train_step(model: torch.nn.Module, kwargs: dict[str, torch.Tensor], device: torch.device) -> Callable[[], None]:
    model.train()
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if fused else {}))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if fused else None

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if autocast is not None:
            with autocast:
                loss = model(**kwargs).loss
        else:
            loss = model(**kwargs).loss
        loss.backward()
        optimizer.step()
        if fused:
            torch.cuda.synchronize(device)

    return step


def dtmt_recurrence(device: torch.device, size: str, tokens: int, repeats: int,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """The training step of the Transformer 6-6, DTMT#4 before / after / compiled (same width, interleaved) and the
    operator counts of DTMT#4 before and after (CPU, a small model: the count does not depend on the width)."""
    d, heads = SIZES[size]["d_model"], SIZES[size]["encoder_attention_heads"]
    after = build_dtmt(d, "lgru", 4, heads)
    models: dict[str, torch.nn.Module] = {"Transformer 6-6": build_ours(model_dims(size))}
    before = build_dtmt_before(after)
    if before is not None:
        models["DTMT#4 before"] = before
    models["DTMT#4"] = after
    compiled = build_dtmt(d, "lgru", 4, heads)
    compiled.compile_recurrence()
    models["DTMT#4 compiled recurrence"] = compiled
    if device.type == "cuda":  # CUDA graphs: a whole compiled timestep replayed as one launch
        graphs = build_dtmt(d, "lgru", 4, heads)
        graphs.compile_recurrence(mode="reduce-overhead")
        models["DTMT#4 compiled recurrence, CUDA graphs"] = graphs
    batch = synthetic_batch(tokens=tokens, seed=7)
    kwargs = {key: value.to(device) for key, value in batch.as_kwargs().items()}
    steps = {}
    for name, model in models.items():
        steps[name] = _train_step(model.to(device), kwargs, device)
    first = {}
    for name in [name for name in models if "compiled" in name]:
        log(f"{device.type}: DTMT recurrence, compiling {name} (its first three steps)")
        start = time.perf_counter()
        for _ in range(3):  # compiles; CUDA graphs are recorded on the steps after the first
            steps[name]()
        first[name] = time.perf_counter() - start
    log(f"{device.type}: DTMT recurrence, {repeats} interleaved training steps of {', '.join(models)}")
    times = interleaved(steps, repeats=repeats, warmup=1)
    step_s = {name: median(values) for name, values in times.items()}
    ops = {}
    small_after = build_dtmt(64, "lgru", 4, 4)
    ops["DTMT#4"] = operators_per_position(small_after)
    small_before = build_dtmt_before(small_after)
    if small_before is not None:
        ops["DTMT#4 before"] = operators_per_position(small_before)
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU", "size": size,
            "torch": torch.__version__, "before_ref": DTMT_BEFORE_REF if before is not None else None,
            "target_tokens": batch.target_tokens, "source_tokens": batch.source_tokens, "repeats": repeats,
            "seconds": times, "step_s": step_s,
            "cost_vs_transformer": {name: value / step_s["Transformer 6-6"] for name, value in step_s.items()},
            "compile_first_steps_s": first, "operators": ops,
            "autocast": "bf16" if device.type == "cuda" else "none (float32)"}


def render(results: dict, key: str) -> list[str]:
    if key not in results:
        return []
    r = results[key]
    title = ("## meng2019 DTMT's recurrence on a GPU (section `gpu_dtmt`)" if key == "gpu_dtmt"
             else "## meng2019 DTMT's recurrence on this CPU (section `dtmt_recurrence`)")
    lines = [title, "",
             f"Device: **{r['device']}**, torch {r['torch']}, autocast {r['autocast']}; DTMT#4 and the Transformer 6-6 at "
             f"{r['size']} (FFN 4·d), one training step (forward with the model's loss, backward, AdamW) on "
             f"{r['source_tokens']:,} source / {r['target_tokens']:,} target tokens, median of {r['repeats']} "
             f"interleaved steps. `before` = commit `{r['before_ref']}` (same weights); `compiled recurrence` = "
             "`model.compile_recurrence()` (each timestep one `torch.compile` graph), `CUDA graphs` = "
             "`model.compile_recurrence(mode=\"reduce-overhead\")`; their first three steps, which compile (and "
             "record the graphs), are not counted: "
             + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in r["compile_first_steps_s"].items()) + ".", "",
             "| model | step (s) | cost vs Transformer |", "|---|---|---|"]
    for name, seconds in r["step_s"].items():
        lines.append(f"| {name} | {seconds:.4f} | {r['cost_vs_transformer'][name]:.2f}× |")
    lines += ["", "Top-level aten operators of one training forward + backward (torch.profiler on CPU, DTMT#4 at d64, "
              "batch 8; the count does not depend on the width):", "",
              "| model | per target position | per source position |", "|---|---|---|"]
    for name in ("DTMT#4 before", "DTMT#4"):
        if name in r["operators"]:
            o = r["operators"][name]
            lines.append(f"| {name} | {o['per_target_position']:.0f} | {o['per_source_position']:.0f} |")
    return lines + [""]
