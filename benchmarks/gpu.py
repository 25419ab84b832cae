"""Section ``gpu``: the paths our users train and serve on, measured on one GPU side by side in one run.

    python -m benchmarks.run --sections gpu --merge          # on a GPU machine: ≤ 8 minutes on one H100
    python -m benchmarks.run --sections gpu --quick          # anywhere: a CPU dry run of every code path, tiny sizes

Rows (each against a peer in the same run, never a timed assertion):

* **training**: target tokens/s and model FLOP utilisation (MFU) of our Transformer vs `MarianMTModel` of identical
  size and weights, 6-6 d512 (Base) and 6-6 d1024 (Big), bf16 autocast, SDPA, fused AdamW; eager and
  `torch.compile`. MFU = model FLOPs of one step (forward + backward, counted by `torch.utils.flop_counter` on the
  real step) / step time / peak: against the device's dense bf16 peak from its datasheet (`DATASHEET_BF16_TFLOPS`)
  and against an 8192³ bf16 matmul measured in the same run;
* **flash**: FlashAttention (`flash_attention_2`/`3`, or a kernels-hub flash kernel already installed) vs SDPA on a
  padded batch: equality of logits, beams and loss, and forward+backward speed — the real CUDA kernels; when none
  is importable the row says so;
* **deep**: liu2020's 60L-12L d512 ADMIN step at 4k target tokens, peak GPU memory and step time with and without
  gradient checkpointing; li2022's DEEP+CAD+CRT step / DEEP step (12-12); dou2018's rows; DTMT#4 / Transformer;
* **decoding**: beam-4 sentences/s of our `generate` vs `MarianMTModel.generate` (batch 64 and 1), and CTranslate2
  on CUDA (float16, int8_float16) when its CUDA build imports.

Goals stated beside the figures (issue "On a GPU"): training ≥ 1.2× Marian's tokens/s and MFU ≥ 45 % at d1024 in
bf16; the 60L-12L d512 model fits a 24 GB GPU with checkpointing at 4k tokens per batch.

**Running it on the device** (the `device` tool's machines carry torch and transformers but not `datasets`,
`evaluate` or `ctranslate2`, and reach no network): install the package there without its dependencies, then run
the section and the GPU tests in one command, from the repository root::

    python3 -m pip install -q --no-deps --no-build-isolation -e . && \
    python3 -m benchmarks.run --sections gpu --merge && \
    python3 -m pytest -q -m gpu tests/test_gpu.py

Only ``hf_deepnmt``, ``benchmarks`` and the tests' imports are needed (torch, transformers, safetensors, tokenizers,
numpy, matplotlib — all present there); CTranslate2's CUDA wheel would have to be carried as a wheel (see
``/work/.library/device/README.md`` of the workplace) for its rows.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from .common import VOCAB, build_marian, build_ours, copy_weights, fixed_generation_config, median, synthetic_batch

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, from NVIDIA's datasheets; matched against the device name.
DATASHEET_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4), ("H800", 989.4),
    ("A100", 312.0), ("A10G", 70.0), ("L40S", 362.0), ("L4", 121.0),
)
GOALS = {"train_ratio_d1024": 1.2, "mfu_d1024": 0.45, "deep_memory_gib": 24.0}
SIZES = {
    "d512": dict(d_model=512, encoder_ffn_dim=2048, decoder_ffn_dim=2048, encoder_attention_heads=8,
                 decoder_attention_heads=8),
    "d1024": dict(d_model=1024, encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_attention_heads=16,
                  decoder_attention_heads=16),
    "tiny": dict(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_attention_heads=4,
                 decoder_attention_heads=4),
}


def settings(on_gpu: bool) -> dict[str, Any]:
    """Sizes, tokens and repeats: the full run on a GPU, a tiny dry run of every code path elsewhere."""
    if on_gpu:
        return dict(sizes=["d512", "d1024"], layers=6, vocab=32000, train_tokens=16384, repeats=10, compile=True,
                    matmul_n=8192, flash_tokens=8192, deep_layers=(60, 12), deep_tokens=4096, crt_layers=12,
                    decode_batches=(64, 1), decode_new_tokens=64, decode_repeats=5, dtmt_d=512)
    return dict(sizes=["tiny"], layers=2, vocab=512, train_tokens=256, repeats=2, compile=False, matmul_n=256,
                flash_tokens=128, deep_layers=(4, 2), deep_tokens=128, crt_layers=2, decode_batches=(4, 1),
                decode_new_tokens=4, decode_repeats=1, dtmt_d=32)


def device_peak(device: torch.device) -> tuple[str, float | None]:
    """The device's name and its datasheet dense bf16 peak in FLOP/s (None when unknown or not a GPU)."""
    if device.type != "cuda":
        return "CPU (dry run)", None
    name = torch.cuda.get_device_name(device)
    peak = next((tflops for key, tflops in DATASHEET_BF16_TFLOPS if key in name), None)
    return name, None if peak is None else peak * 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(step: Callable[[], object], device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``step`` after ``warmup`` untimed calls (device synchronised around each call)."""
    for _ in range(warmup):
        step()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        _sync(device)
        times.append(time.perf_counter() - start)
    return median(times)


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16)


def matmul_peak(device: torch.device, n: int) -> float:
    """Measured bf16 matmul FLOP/s of an n³ product (the best of 10 after 3 warm-ups)."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    best = float("inf")
    for index in range(13):
        _sync(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        _sync(device)
        if index >= 3:
            best = min(best, time.perf_counter() - start)
    return 2 * n ** 3 / best


def _batch(tokens: int, device: torch.device, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    batch = synthetic_batch(tokens=tokens, seed=seed)
    ids = batch.input_ids.clamp(max=vocab - 1)
    labels = batch.labels.masked_fill(batch.labels >= vocab, vocab - 1)
    return {"input_ids": ids.to(device), "attention_mask": batch.attention_mask.to(device),
            "labels": labels.to(device)}


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device,
               compiled: bool = False) -> Callable[[], None]:
    """One bf16-autocast training step (forward with labels, backward, fused AdamW) of ``model`` on ``batch``."""
    model.train()
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused) if fused else torch.optim.AdamW(
        model.parameters(), lr=1e-4)
    forward = torch.compile(model) if compiled else model

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with _autocast(device):
            loss = forward(**batch).loss
        loss.backward()
        optimizer.step()

    return step


def step_flops(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: torch.device) -> float:
    """FLOPs of one forward + backward, counted on the real step (`torch.utils.flop_counter.FlopCounterMode`)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    counter = FlopCounterMode(display=False)
    with counter, _autocast(device):
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def training_rows(cfg: dict[str, Any], device: torch.device, peak: float | None, measured_peak: float,
                  log: Callable[[str], None]) -> dict[str, Any]:
    """Ours vs Marian (same weights), eager and compiled, per size: tokens/s, MFU, ratio."""
    rows: dict[str, Any] = {}
    for size in cfg["sizes"]:
        dims = dict(SIZES[size], vocab_size=cfg["vocab"], encoder_layers=cfg["layers"], decoder_layers=cfg["layers"],
                    max_position_embeddings=512)
        ours = build_ours(dims).to(device)
        marian = build_marian(dims).to(device)
        copy_weights(ours, marian)
        batch = _batch(cfg["train_tokens"], device, cfg["vocab"])
        target_tokens = int((batch["labels"] != -100).sum())
        flops = {name: step_flops(model, batch, device) for name, model in (("ours", ours), ("marian", marian))}
        entry: dict[str, Any] = {"target_tokens": target_tokens, "flops_per_step": flops, "rows": {}}
        for compiled in ([False, True] if cfg["compile"] else [False]):
            for name, model in (("ours", ours), ("marian", marian)):
                label = f"{name}{' compiled' if compiled else ''}"
                log(f"gpu: {size} training, {label}")
                seconds = _timed(train_step(model, batch, device, compiled), device, cfg["repeats"])
                entry["rows"][label] = {
                    "step_s": seconds, "tokens_per_s": target_tokens / seconds,
                    "mfu_datasheet": None if peak is None else flops[name] / seconds / peak,
                    "mfu_measured_peak": flops[name] / seconds / measured_peak}
        rows[size] = entry
        del ours, marian
    return rows


def flash_rows(cfg: dict[str, Any], device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """FlashAttention vs SDPA on a padded batch: equality and speed (the real kernels, where there are any)."""
    from transformers.utils import is_flash_attn_2_available

    implementations = [name for name, available in (
        ("flash_attention_2", device.type == "cuda" and is_flash_attn_2_available()),
        ("flash_attention_3", device.type == "cuda" and _flash3_available())) if available]
    if not implementations:
        return {"available": [], "note": "no FlashAttention kernel importable on this machine (flash_attn / "
                                         "flash_attn_interface / a kernels-hub kernel); SDPA only"}
    dims = dict(SIZES["d512"], vocab_size=cfg["vocab"], encoder_layers=cfg["layers"], decoder_layers=cfg["layers"],
                max_position_embeddings=512)
    model = build_ours(dims).to(device=device, dtype=torch.bfloat16)
    batch = _batch(cfg["flash_tokens"], device, cfg["vocab"], seed=5)  # right-padded sources and targets
    results: dict[str, Any] = {"available": implementations, "rows": {}}
    reference = None
    for implementation in ["sdpa", *implementations]:
        log(f"gpu: attention {implementation}")
        model.set_attn_implementation(implementation)
        model.eval()
        with torch.no_grad():
            logits = model(**batch).logits.float()
            beams = model.generate(input_ids=batch["input_ids"][:8], attention_mask=batch["attention_mask"][:8],
                                   num_beams=4, max_new_tokens=16)
        model.train()
        step = train_step(model, batch, device)
        row = {"step_s": _timed(step, device, cfg["repeats"])}
        if reference is None:
            reference = (logits, beams)
        else:
            row["max_abs_logit_diff_vs_sdpa"] = float((logits - reference[0]).abs().max())
            row["beams_identical_to_sdpa"] = bool(torch.equal(beams, reference[1]))
        results["rows"][implementation] = row
    return results


def _flash3_available() -> bool:
    try:
        import flash_attn_interface  # noqa: F401
    except ImportError:
        return False
    return True


def deep_rows(cfg: dict[str, Any], device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """liu2020 60L-12L ADMIN memory and time (± checkpointing); li2022 CRT, dou2018 rows, DTMT#4 step ratios."""
    from benchmarks.experiments.dou2018_miniature import DOU2018_VARIANTS

    from .common import build_dtmt

    encoder_layers, decoder_layers = cfg["deep_layers"]
    dims = dict(SIZES["d512" if device.type == "cuda" else "tiny"], vocab_size=cfg["vocab"],
                encoder_layers=encoder_layers, decoder_layers=decoder_layers, max_position_embeddings=512)
    batch = _batch(cfg["deep_tokens"], device, cfg["vocab"], seed=7)
    out: dict[str, Any] = {"admin": {}}
    for checkpointing in (False, True):
        log(f"gpu: liu2020 {encoder_layers}L-{decoder_layers}L ADMIN, checkpointing {checkpointing}")
        model = build_ours(dims, residual_scaling="admin", admin_init="closed_form").to(device)
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = _timed(train_step(model, batch, device), device, max(2, cfg["repeats"] // 2), warmup=1)
        peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
        out["admin"]["checkpointing" if checkpointing else "plain"] = {"step_s": seconds, "peak_gib": peak}
        del model
    small = dict(dims, encoder_layers=cfg["crt_layers"], decoder_layers=cfg["crt_layers"])
    crt = {"DEEP": {}, "DEEP+CAD+CRT": {"cross_attention_drop_depth": max(1, cfg["crt_layers"] * 3 // 4),
                                        "cross_attention_drop_ratio": 0.5, "ddr_weight": 1.0, "ald_weight": 1.0}}
    out["crt"] = _ratios({name: build_ours(small, **switches).to(device) for name, switches in crt.items()},
                         batch, device, cfg, "DEEP", log, "li2022")
    base = dict(dims, encoder_layers=6 if device.type == "cuda" else 4, decoder_layers=6 if device.type == "cuda" else 4)
    out["dou2018"] = _ratios({name: build_ours(base, **switches).to(device) for name, switches in
                              DOU2018_VARIANTS.items()}, batch, device, cfg, "vanilla", log, "dou2018")
    heads = SIZES["d512"]["encoder_attention_heads"] if device.type == "cuda" else 4
    width = cfg["dtmt_d"]
    models = {"Transformer 6-6": build_ours(dict(base, vocab_size=VOCAB, d_model=width, encoder_ffn_dim=4 * width,
                                                 decoder_ffn_dim=4 * width)).to(device),
              "DTMT#4": build_dtmt(width, "lgru", 4, heads).to(device)}  # the harness's vocabulary, VOCAB
    dtmt_batch = _batch(cfg["deep_tokens"], device, VOCAB, seed=7)
    out["dtmt"] = _ratios(models, dtmt_batch, device, cfg, "Transformer 6-6", log, "meng2019")
    return out


def _ratios(models: dict[str, torch.nn.Module], batch: dict[str, torch.Tensor], device: torch.device,
            cfg: dict[str, Any], reference: str, log: Callable[[str], None], label: str) -> dict[str, Any]:
    steps = {}
    for name, model in models.items():
        log(f"gpu: {label} {name}")
        steps[name] = _timed(train_step(model, batch, device), device, max(2, cfg["repeats"] // 2), warmup=1)
    return {name: {"step_s": seconds, "cost_vs_" + reference: seconds / steps[reference]}
            for name, seconds in steps.items()}


def decoding_rows(cfg: dict[str, Any], device: torch.device, log: Callable[[str], None]) -> dict[str, Any]:
    """Beam-4 sentences/s: ours vs Marian (same weights, bf16 autocast), batch 64 and 1; CTranslate2 on CUDA."""
    size = "d512" if device.type == "cuda" else "tiny"
    dims = dict(SIZES[size], vocab_size=cfg["vocab"], encoder_layers=cfg["layers"], decoder_layers=cfg["layers"],
                max_position_embeddings=512)
    ours = build_ours(dims).to(device).eval()
    marian = build_marian(dims).to(device).eval()
    copy_weights(ours, marian)
    rows: dict[str, Any] = {"size": size, "new_tokens": cfg["decode_new_tokens"], "rows": {}}
    for batch_size in cfg["decode_batches"]:
        source = synthetic_batch(sentences=batch_size, seed=2)
        inputs = {"input_ids": source.input_ids.clamp(max=cfg["vocab"] - 1).to(device),
                  "attention_mask": source.attention_mask.to(device)}
        for name, model in (("ours", ours), ("marian", marian)):
            fixed_generation_config(model, 4, cfg["decode_new_tokens"])
            log(f"gpu: beam-4 decoding, batch {batch_size}, {name}")

            def generate(model: torch.nn.Module = model) -> None:
                with torch.no_grad(), _autocast(device):
                    model.generate(**inputs)

            seconds = _timed(generate, device, cfg["decode_repeats"], warmup=1)
            rows["rows"][f"{name} b{batch_size}"] = {"seconds": seconds, "sentences_per_s": batch_size / seconds}
    rows["ctranslate2"] = _ctranslate2_cuda_status()
    return rows


def _ctranslate2_cuda_status() -> str:
    try:
        import ctranslate2
    except ImportError:
        return "not measured: ctranslate2 is not installed on this machine"
    if ctranslate2.get_cuda_device_count() == 0:
        return "not measured: this ctranslate2 build sees no CUDA device"
    return "importable with CUDA: run `deepnmt export --format ctranslate2` and `--engine ctranslate2` (not timed here)"


def gpu_section(quick: bool, log: Callable[[str], None]) -> dict[str, Any]:
    """The whole section; on a machine without CUDA a CPU dry run at tiny size (labelled, not a result)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = settings(on_gpu=device.type == "cuda" and not quick)
    name, peak = device_peak(device)
    log(f"gpu: device {name}; measuring the bf16 matmul peak ({cfg['matmul_n']}³)")
    measured_peak = matmul_peak(device, cfg["matmul_n"])
    result: dict[str, Any] = {
        "device": name, "dry_run": device.type != "cuda" or quick, "settings": cfg,
        "datasheet_bf16_flops": peak, "measured_bf16_matmul_flops": measured_peak, "goals": GOALS,
        "torch": torch.__version__,
    }
    result["training"] = training_rows(cfg, device, peak, measured_peak, log)
    result["flash"] = flash_rows(cfg, device, log)
    result["deep"] = deep_rows(cfg, device, log)
    result["decoding"] = decoding_rows(cfg, device, log)
    return result


# ------------------------------------------------------------------------------------------------ the table block
def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def render(results: dict) -> list[str]:
    """The ``gpu`` block of RESULTS.md: every row, the goals beside the figures, the device and date."""
    g = results.get("gpu")
    if not g:
        return []
    title = "## GPU: training, attention kernels, deep models and decoding on one device"
    if g["dry_run"]:
        title += " — CPU DRY RUN, NOT A RESULT"
    datasheet = g["datasheet_bf16_flops"]
    datasheet_text = "–" if not datasheet else f"{datasheet / 1e12:.0f} TFLOP/s"
    lines = [title, "", f"Device: **{g['device']}**, torch {g['torch']}; datasheet dense bf16 peak {datasheet_text}, "
             f"measured bf16 {g['settings']['matmul_n']}³ matmul {g['measured_bf16_matmul_flops'] / 1e12:.1f} "
             "TFLOP/s.", ""]
    rows = []
    for size, entry in g["training"].items():
        for label, row in entry["rows"].items():
            peer = entry["rows"].get(label.replace("ours", "marian"))
            rows.append([size, label, f"{row['tokens_per_s']:,.0f}",
                         f"{row['tokens_per_s'] / peer['tokens_per_s']:.2f}×" if peer and "ours" in label else "",
                         _pct(row["mfu_datasheet"]), _pct(row["mfu_measured_peak"])])
    lines += ["Training, bf16 autocast, SDPA, fused AdamW (goal at d1024: ours ≥ 1.2× Marian, MFU ≥ 45 %):", "",
              "| size | model | target tok/s | ours/Marian | MFU (datasheet) | MFU (measured matmul) |",
              "|---|---|---|---|---|---|", *[f"| {' | '.join(r)} |" for r in rows], ""]
    flash = g["flash"]
    if flash.get("rows"):
        lines += ["| attention | step (s) | max |Δ logit| vs sdpa | beams = sdpa |", "|---|---|---|---|"]
        for name, row in flash["rows"].items():
            lines.append(f"| {name} | {row['step_s']:.4f} | {row.get('max_abs_logit_diff_vs_sdpa', '–')} | "
                         f"{row.get('beams_identical_to_sdpa', '–')} |")
        lines.append("")
    else:
        lines += [f"FlashAttention: {flash['note']}.", ""]
    admin = g["deep"]["admin"]
    lines += ["liu2020 ADMIN step at ~4k target tokens (goal: fits a 24 GB GPU with checkpointing):", "",
              "| checkpointing | step (s) | peak GPU memory (GiB) |", "|---|---|---|"]
    for name, row in admin.items():
        peak = "–" if row["peak_gib"] is None else f"{row['peak_gib']:.1f}"
        lines.append(f"| {name} | {row['step_s']:.3f} | {peak} |")
    lines.append("")
    for key, title_row in (("crt", "li2022 step cost"), ("dou2018", "dou2018 step cost"), ("dtmt", "DTMT step cost")):
        lines += [f"| {title_row} | step (s) | cost |", "|---|---|---|"]
        for name, row in g["deep"][key].items():
            cost = next(value for field, value in row.items() if field.startswith("cost_vs_"))
            lines.append(f"| {name} | {row['step_s']:.4f} | {cost:.2f}× |")
        lines.append("")
    decoding = g["decoding"]
    lines += [f"Beam-4 decoding ({decoding['size']}, {decoding['new_tokens']} new tokens, bf16 autocast):", "",
              "| contender | sentences/s |", "|---|---|",
              *[f"| {name} | {row['sentences_per_s']:.1f} |" for name, row in decoding["rows"].items()], "",
              f"CTranslate2 on CUDA: {decoding['ctranslate2']}.", ""]
    return lines
