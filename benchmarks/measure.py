"""In-process measurements: logits equivalence, training and decoding throughput, per-step decoding cost, profiles,
FLOP counts, matmul peak and torch.compile. Each returns plain dicts (JSON-ready); `run.py` orchestrates them."""

from __future__ import annotations

import inspect
import time
from typing import Callable

import torch

from hf_deepnmt.modeling_common import output_cache

# dou2018's rows (switches) and its Table 1 speeds live with the miniature experiment that trains the same rows
from benchmarks.experiments.dou2018_miniature import DOU2018_TABLE_1, DOU2018_VARIANTS

from .common import BOS, Batch, fixed_generation_config, interleaved, median, synthetic_batch


# ----------------------------------------------------------------------------------------------------------------
# Equivalence of the contenders (same weights)
# ----------------------------------------------------------------------------------------------------------------
@torch.no_grad()
def equivalence(models: dict[str, torch.nn.Module], batch: Batch, new_tokens: int) -> dict[str, dict[str, object]]:
    """Max |logit difference| against ``ours`` over non-pad target positions (eval mode, teacher forcing), and
    whether greedy and beam-4 outputs are identical."""
    reference = models["ours"].eval()
    mask = batch.labels != -100
    expected = reference(**batch.as_kwargs()).logits[mask]
    source = dict(input_ids=batch.input_ids[:8], attention_mask=batch.attention_mask[:8])
    outputs = {}
    for beams in (1, 4):
        fixed_generation_config(reference, beams, new_tokens)
        outputs[beams] = reference.generate(**source)
    result = {}
    for name, model in models.items():
        model.eval()
        got = model(**batch.as_kwargs()).logits[mask]
        same = {}
        for beams in (1, 4):
            fixed_generation_config(model, beams, new_tokens)
            same[beams] = bool(torch.equal(model.generate(**source), outputs[beams]))
        result[name] = {"max_abs_logit_diff": float((got - expected).abs().max()), "greedy_identical": same[1],
                        "beam4_identical": same[4]}
    return result


# ----------------------------------------------------------------------------------------------------------------
# Throughput
# ----------------------------------------------------------------------------------------------------------------
def training_step(model: torch.nn.Module, batch: Batch, label_smoothing: float = 0.0) -> Callable[[], None]:
    """One optimisation step: forward with labels (mean token cross-entropy), backward, AdamW step.

    With ``label_smoothing`` ε > 0 the loss is the uniform-prior label-smoothed cross-entropy averaged over the
    real target tokens, (1 − ε)·(−log p(y)) + ε·mean_v(−log p(v)): a model whose forward takes ``smoothing_epsilon``
    (ours) computes it itself, from its labels; any other (Marian, ours-before) returns logits for the shifted labels
    and `torch.nn.functional.cross_entropy(label_smoothing=ε)` computes the same value from them."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kwargs = batch.as_kwargs()
    own_loss = label_smoothing == 0.0 or "smoothing_epsilon" in inspect.signature(model.forward).parameters
    if label_smoothing and own_loss:
        kwargs["smoothing_epsilon"] = label_smoothing
    elif label_smoothing:
        labels = kwargs.pop("labels")
        kwargs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if own_loss:
            loss = model(**kwargs).loss
        else:
            logits = model(**kwargs).logits  # (B, T, V)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                                                     label_smoothing=label_smoothing)
        loss.backward()
        optimizer.step()

    return step


def training_throughput(models: dict[str, torch.nn.Module], batch: Batch, repeats: int,
                        label_smoothing: float = 0.0) -> dict[str, object]:
    """Target tokens/s of one training step per model, interleaved (see `training_step` for ``label_smoothing``)."""
    steps = {name: training_step(model, batch, label_smoothing) for name, model in models.items()}
    times = interleaved(steps, repeats=repeats, warmup=1)
    for model in models.values():
        model.eval()
    return {
        "source_tokens": batch.source_tokens,
        "target_tokens": batch.target_tokens,
        "sentences": int(batch.input_ids.size(0)),
        "seconds": times,
        "median_s": {name: median(values) for name, values in times.items()},
        "target_tokens_per_s": {name: batch.target_tokens / median(values) for name, values in times.items()},
        "label_smoothing": label_smoothing,
    }


def decoding_throughput(models: dict[str, torch.nn.Module], source: Batch, num_beams: int, new_tokens: int,
                        repeats: int) -> dict[str, object]:
    """Sentences/s of ``generate`` with exactly ``new_tokens`` steps for every contender."""
    calls = {}
    for name, model in models.items():
        model.eval()
        fixed_generation_config(model, num_beams, new_tokens)
        calls[name] = (lambda m: lambda: m.generate(input_ids=source.input_ids,
                                                    attention_mask=source.attention_mask))(model)
    times = interleaved(calls, repeats=repeats, warmup=1)
    sentences = int(source.input_ids.size(0))
    return {
        "batch": sentences,
        "num_beams": num_beams,
        "new_tokens": new_tokens,
        "seconds": times,
        "median_s": {name: median(values) for name, values in times.items()},
        "sentences_per_s": {name: sentences / median(values) for name, values in times.items()},
    }


@torch.no_grad()
def _decode_step_times(model: torch.nn.Module, source: Batch, steps: int) -> list[float]:
    """Seconds of each single-token decoder step through the cache (greedy continuation), encoder excluded."""
    encoder_outputs = model.get_encoder()(input_ids=source.input_ids, attention_mask=source.attention_mask)
    tokens = torch.full((source.input_ids.size(0), 1), BOS, dtype=torch.long)
    cache, times = None, []
    for _ in range(steps):
        start = time.perf_counter()
        out = model(encoder_outputs=encoder_outputs, attention_mask=source.attention_mask, decoder_input_ids=tokens,
                    past_key_values=cache, use_cache=True)
        cache = output_cache(out)
        tokens = out.logits[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        times.append(time.perf_counter() - start)
    return times


def incremental_decoding_cost(models: dict[str, torch.nn.Module], source: Batch, steps: int, repeats: int,
                              early: tuple[int, int] = (1, 11)) -> dict[str, object]:
    """Per-step cost vs generated length: the median over repeats of each step's time; ``late_over_early`` is the
    median of the last 10 steps over the median of steps ``early`` (the first step also projects the cross-attention
    keys/values and is excluded). Contenders alternate between repeats."""
    for model in models.values():
        model.eval()
    runs = {name: [] for name in models}
    for round_index in range(repeats):
        names = list(models)
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(_decode_step_times(models[name], source, steps))
    result = {"batch": int(source.input_ids.size(0)), "steps": steps, "per_step_s": {}, "early_s": {}, "late_s": {},
              "late_over_early": {}}
    for name, per_run in runs.items():
        per_step = [median([run[t] for run in per_run]) for t in range(steps)]
        early_s = median(per_step[early[0]:early[1]])
        late_s = median(per_step[-10:])
        result["per_step_s"][name] = per_step
        result["early_s"][name], result["late_s"][name] = early_s, late_s
        result["late_over_early"][name] = late_s / early_s
    return result


# ----------------------------------------------------------------------------------------------------------------
# Profiles
# ----------------------------------------------------------------------------------------------------------------
def top_ops(function: Callable[[], object], rows: int, warm: bool = True) -> dict[str, object]:
    """torch.profiler (CPU) over one call: the ``rows`` aten ops with the most self CPU time (after one untimed
    warm-up call unless ``warm`` is False, for functions that have just run)."""
    from torch.profiler import ProfilerActivity, profile

    if warm:
        function()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        function()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "total_self_cpu_ms": total / 1e3,
        "ops": [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "calls": e.count} for e in events[:rows]],
        "aten_calls": sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")),
    }


def profiles(models: dict[str, torch.nn.Module], batch: Batch, source: Batch, new_tokens: int,
             rows: int = 12) -> dict[str, dict[str, object]]:
    result: dict[str, dict[str, object]] = {"train": {}, "beam4": {}}
    for name, model in models.items():
        result["train"][name] = top_ops(training_step(model, batch), rows)
        model.eval()
        fixed_generation_config(model, 4, new_tokens)
        result["beam4"][name] = top_ops(
            lambda m=model: m.generate(input_ids=source.input_ids, attention_mask=source.attention_mask), rows)
    return result


# ----------------------------------------------------------------------------------------------------------------
# FLOPs and the machine's matmul peak
# ----------------------------------------------------------------------------------------------------------------
def _cpu_flash_mapping() -> dict[object, Callable[..., int]]:
    """FlopCounterMode knows the CUDA SDPA kernels; count the CPU flash kernel with the same formulas."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    aten = torch.ops.aten

    def forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
        return sdpa_backward_flop_count(grad_out, query, key, value)

    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}


def training_flops(model: torch.nn.Module, batch: Batch) -> int:
    """FLOPs of one forward + backward (matmuls and attention; the optimizer and element-wise ops are not
    counted, as usual for MFU figures)."""
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    counter = FlopCounterMode(display=False, custom_mapping=_cpu_flash_mapping())
    with counter:
        model(**batch.as_kwargs()).loss.backward()
    model.zero_grad(set_to_none=True)
    model.eval()
    return int(counter.get_total_flops())


def matmul_peak(n: int = 2048, repeats: int = 10) -> dict[str, float]:
    """fp32 GFLOP/s of a plain (n x n) @ (n x n) matmul on this machine: the best and the median of ``repeats``."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    flops = 2 * n ** 3
    return {"n": n, "best_gflops": flops / min(times) / 1e9, "median_gflops": flops / median(times) / 1e9}


def gflops_vs_peak(model: torch.nn.Module, batch: Batch, step_seconds: float) -> dict[str, float]:
    flops = training_flops(model, batch)
    peak = matmul_peak()
    achieved = flops / step_seconds / 1e9
    return {"flops_per_step": flops, "step_s": step_seconds, "achieved_gflops": achieved, **peak,
            "fraction_of_best_peak": achieved / peak["best_gflops"]}


# ----------------------------------------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------------------------------------
def compiled_training(model_factory: Callable[[], torch.nn.Module], batch: Batch,
                      repeats: int) -> dict[str, object]:
    """Eager vs ``torch.compile(model)`` (inductor) training steps of the same weights, interleaved; the compile
    time is the first compiled step minus a median compiled step."""
    eager = model_factory()
    compiled_model = model_factory()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model)
    step_eager, step_compiled = training_step(eager, batch), training_step(compiled, batch)
    start = time.perf_counter()
    step_compiled()
    first = time.perf_counter() - start
    times = interleaved({"eager": step_eager, "compiled": step_compiled}, repeats=repeats, warmup=1)
    with torch.no_grad():
        eager.eval(), compiled.eval()
        diff = float((eager(**batch.as_kwargs()).logits - compiled(**batch.as_kwargs()).logits).abs().max())
    medians = {name: median(values) for name, values in times.items()}
    return {"seconds": times, "median_s": medians, "compile_s": first - medians["compiled"],
            "speedup": medians["eager"] / medians["compiled"], "max_abs_logit_diff_after_training": diff}


def trainer_compile_smoke(model: torch.nn.Module, batch: Batch, steps: int, output_dir: str) -> dict[str, object]:
    """`Seq2SeqTrainer` with ``torch_compile=True`` runs ``steps`` optimisation steps on ``model``."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    rows = [{key: value[i] for key, value in batch.as_kwargs().items()} for i in range(batch.input_ids.size(0))]
    args = Seq2SeqTrainingArguments(output_dir=output_dir, torch_compile=True, max_steps=steps,
                                    per_device_train_batch_size=len(rows), report_to="none", use_cpu=True,
                                    save_strategy="no", logging_steps=1, disable_tqdm=True)
    start = time.perf_counter()
    result = Seq2SeqTrainer(model=model, args=args, train_dataset=rows).train()
    return {"ok": True, "steps": result.global_step, "train_loss": result.training_loss,
            "wall_s": time.perf_counter() - start}


def default_batches(quick: bool) -> tuple[Batch, dict[int, Batch]]:
    """The training batch (~4k source tokens, 512 in quick mode) and the decoding sources at batch 1 and 32."""
    train = synthetic_batch(tokens=512 if quick else 4096, seed=0)
    return train, {1: synthetic_batch(sentences=1, seed=1), 32: synthetic_batch(sentences=32, seed=2)}


# ----------------------------------------------------------------------------------------------------------------
# li2022: cost of a DEEP+CAD+CRT training step vs DEEP at equal depth
# ----------------------------------------------------------------------------------------------------------------
CAD = {"cross_attention_drop_depth": 9, "cross_attention_drop_ratio": 1.0}  # L_dr = 9 of 12, p_net = 1.0
CRT_VARIANTS: dict[str, dict[str, object]] = {
    "DEEP": {},
    "DEEP+CAD": dict(CAD),
    "DEEP+CAD+DDR": {**CAD, "ddr_weight": 1.0},
    "DEEP+CAD+ALD": {**CAD, "ald_weight": 1.0},
    "DEEP+CAD+CRT": {**CAD, "ddr_weight": 1.0, "ald_weight": 1.0},
}
_FORWARD_PARTS = ("encoder", "decoder", "lm_head")


def crt_rows(config) -> dict[str, int]:
    """Rows per source sentence that `hf_deepnmt.losses.compute_losses` sends through each part in one training
    step (the model's ``_training_objective``): encoder X [+ X⁺, X⁻], decoder X [+ DDR's second pass] [+ X⁺, X⁻], vocabulary
    projection only the X passes; and the decoder layers that have cross-attention (p_net = 1.0 layers have none)."""
    ddr, ald = config.ddr_weight > 0, config.ald_weight > 0
    keep = config.cross_attention_keep_schedule()
    return {"encoder": 3 if ald else 1, "decoder": (2 if ddr else 1) + (2 if ald else 0), "lm_head": 2 if ddr else 1,
            "cross_attention_layers": sum(k > 0 for k in keep), "decoder_layers": len(keep)}


def crt_formula_flops(config, sentences: int, source_length: int, target_length: int) -> dict[str, float]:
    """Matmul + attention FLOPs of one forward + backward (backward = 2 × forward) per part, from the padded shapes
    and `crt_rows`: what the step must cost if time followed FLOPs. Element-wise work (losses, softmax, layer norm,
    dropout) and the optimizer are not counted."""
    d, f, v = config.d_model, config.encoder_ffn_dim, config.vocab_size
    s, t = source_length, target_length
    rows = crt_rows(config)
    layer = lambda n, ffn: n * (4 * d * d + 2 * d * ffn)  # noqa: E731 q, k, v, o projections and the FFN, per row
    encoder = config.encoder_layers * (layer(s, f) + 2 * s * s * d)  # + QKᵀ and AV
    decoder_self_ffn = config.decoder_layers * (layer(t, config.decoder_ffn_dim) + 2 * t * t * d)
    cross = rows["cross_attention_layers"] * (2 * t * d * d + 2 * s * d * d + 2 * t * s * d)  # q, o; k, v; QKᵀ, AV
    macs = {"encoder": rows["encoder"] * encoder,
            "decoder self-attention + FFN": rows["decoder"] * decoder_self_ffn,
            "decoder cross-attention": rows["decoder"] * cross,
            "vocabulary projection": rows["lm_head"] * t * d * v}
    return {name: 3 * 2 * sentences * value for name, value in macs.items()}  # 2 FLOPs per MAC, ×3 fwd + bwd


def crt_counted_flops(model: torch.nn.Module, batch: Batch) -> int:
    """FLOPs of one `compute_losses` forward + backward counted by FlopCounterMode (to check `crt_formula_flops`)."""
    from torch.utils.flop_counter import FlopCounterMode

    from hf_deepnmt.losses import compute_losses

    model.train()
    counter = FlopCounterMode(display=False, custom_mapping=_cpu_flash_mapping())
    with counter:
        compute_losses(model, batch.as_kwargs(), label_smoothing=0.1).loss.backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def crt_training_step(model: torch.nn.Module, batch: Batch, phases: list[dict[str, dict[str, float]]]
                      ) -> Callable[[], None]:
    """One li2022 training step through the loss entry point: zero_grad, ``compute_losses(model, batch,
    label_smoothing=0.1).loss.backward()``, AdamW step. Each call appends its phase times to ``phases``, by wall
    clock and by this process' CPU time (user + system; with one thread, the step's cost without the time the
    scheduler gave the core to other processes): forward (split by forward hooks into encoder, decoder, lm_head and
    the rest: views, losses), backward, optimizer."""
    from hf_deepnmt.losses import compute_losses

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kwargs = batch.as_kwargs()
    current: dict[tuple[str, str], float] = {}
    starts: dict[tuple[str, str], float] = {}

    def enter(part: str) -> None:
        for clock, read in _CLOCKS.items():
            starts[clock, part] = read()

    def leave(part: str) -> None:
        for clock, read in _CLOCKS.items():
            current[clock, part] = current.get((clock, part), 0.0) + read() - starts[clock, part]

    parts = {"encoder": model.get_encoder(), "decoder": model.get_decoder(), "lm_head": model.lm_head}
    for name, module in parts.items():
        module.register_forward_pre_hook(lambda *_, n=name: enter(n))
        module.register_forward_hook(lambda *_, n=name: leave(n))

    def step() -> None:
        current.clear()
        marks = [{clock: read() for clock, read in _CLOCKS.items()}]
        optimizer.zero_grad(set_to_none=True)
        loss = compute_losses(model, kwargs, label_smoothing=0.1).loss
        marks.append({clock: read() for clock, read in _CLOCKS.items()})
        loss.backward()
        marks.append({clock: read() for clock, read in _CLOCKS.items()})
        optimizer.step()
        marks.append({clock: read() for clock, read in _CLOCKS.items()})
        record = {}
        for clock in _CLOCKS:
            t0, t1, t2, t3 = (m[clock] for m in marks)
            forward = {name: current.get((clock, name), 0.0) for name in _FORWARD_PARTS}
            record[clock] = {"forward": t1 - t0, **{f"forward_{k}": v for k, v in forward.items()},
                             "forward_views_and_losses": t1 - t0 - sum(forward.values()),
                             "backward": t2 - t1, "optimizer": t3 - t2, "total": t3 - t0}
        phases.append(record)

    return step


def crt_cost(dims: dict[str, int], batch: Batch, repeats: int, profile_rows: int = 40,
             flops_batch: Batch | None = None) -> dict[str, object]:
    """DEEP vs DEEP+CAD(+DDR, +ALD, +CRT) training steps, interleaved, one set of weights (every CAD variant holds
    DEEP's weights minus the cross-attention of its bottom L_dr layers). Per variant: step times, phase medians,
    rows per part, formula FLOPs; FlopCounterMode's total on ``flops_batch`` (a small batch) against the formula
    there; torch.profiler top ops of one step of DEEP and DEEP+CAD+CRT."""
    from .common import build_ours

    models: dict[str, torch.nn.Module] = {}
    weights: dict[str, dict[str, object]] = {}
    for name, overrides in CRT_VARIANTS.items():
        models[name] = build_ours(dims, **overrides)
        if name != "DEEP":
            loaded = models[name].load_state_dict(models["DEEP"].state_dict(), strict=False)
            dropped = sorted({key.split(".encoder_attn.")[0] for key in loaded.unexpected_keys})
            if loaded.missing_keys or any(".encoder_attn." not in key for key in loaded.unexpected_keys):
                raise RuntimeError(f"{name}: weight copy not exact: {loaded}")
            weights[name] = {"layers_without_cross_attention": dropped,
                             "parameters": sum(p.numel() for p in models[name].parameters())}
    weights["DEEP"] = {"layers_without_cross_attention": [],
                       "parameters": sum(p.numel() for p in models["DEEP"].parameters())}

    counted = {}
    if flops_batch is not None:
        for name, model in models.items():
            counted[name] = {
                "counted": crt_counted_flops(model, flops_batch),
                "formula": sum(crt_formula_flops(model.config, flops_batch.input_ids.size(0),
                                                 flops_batch.input_ids.size(1), flops_batch.labels.size(1)).values())}

    phases: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in models}
    steps = {name: crt_training_step(model, batch, phases[name]) for name, model in models.items()}
    times = interleaved(steps, repeats=repeats, warmup=1)
    phases = {name: list(values[1:]) for name, values in phases.items()}  # drop the warm-up call
    medians = {name: median(values) for name, values in times.items()}
    cpu_medians = {name: median([p["cpu"]["total"] for p in values]) for name, values in phases.items()}
    profile = {name: top_ops(steps[name], profile_rows, warm=False) for name in ("DEEP", "DEEP+CAD+CRT")}

    sentences, source_length, target_length = (int(batch.input_ids.size(0)), int(batch.input_ids.size(1)),
                                               int(batch.labels.size(1)))
    variants = {}
    for name, model in models.items():
        formula = crt_formula_flops(model.config, sentences, source_length, target_length)
        variants[name] = {
            "overrides": CRT_VARIANTS[name],
            "rows_per_sentence": crt_rows(model.config),
            **weights[name],
            "seconds": times[name],
            "median_s": medians[name],
            "ratio_vs_deep": medians[name] / medians["DEEP"],
            "round_ratios_vs_deep": [a / b for a, b in zip(times[name], times["DEEP"])],
            "cpu_seconds": [p["cpu"]["total"] for p in phases[name]],
            "cpu_median_s": cpu_medians[name],
            "cpu_ratio_vs_deep": cpu_medians[name] / cpu_medians["DEEP"],
            "cpu_round_ratios_vs_deep": [p["cpu"]["total"] / q["cpu"]["total"]
                                         for p, q in zip(phases[name], phases["DEEP"])],
            "phases": phases[name],
            "phase_median_s": {clock: {key: median([p[clock][key] for p in phases[name]])
                                       for key in phases[name][0][clock]} for clock in _CLOCKS},
            "formula_flops": formula,
            "formula_flops_total": sum(formula.values()),
        }
    deep_flops = variants["DEEP"]["formula_flops_total"]
    for entry in variants.values():
        entry["formula_flops_ratio_vs_deep"] = entry["formula_flops_total"] / deep_flops
    for model in models.values():
        model.eval()
    return {
        "layers": f"{dims['encoder_layers']}-{dims['decoder_layers']}",
        "d_model": dims["d_model"],
        "ffn": dims["encoder_ffn_dim"],
        "vocab": dims["vocab_size"],
        "sentences": sentences,
        "source_tokens": batch.source_tokens,
        "target_tokens": batch.target_tokens,
        "padded_lengths": [source_length, target_length],
        "repeats": repeats,
        "variants": variants,
        "flops_check": {"sentences": None if flops_batch is None else int(flops_batch.input_ids.size(0)),
                        **({"per_variant": counted} if counted else {})},
        "profile": profile,
    }


# ----------------------------------------------------------------------------------------------------------------
# dou2018: training and decoding speed of each deep-representation mechanism relative to the vanilla model
# ----------------------------------------------------------------------------------------------------------------
def dou2018_speed(dims: dict[str, int], train_batch: Batch, source: Batch, new_tokens: int, train_repeats: int,
                  decode_repeats: int) -> dict[str, object]:
    """Training step (forward with the model's own objective, backward, AdamW) and beam-4 decoding of every
    `DOU2018_VARIANTS` model, interleaved, each relative to the vanilla model of the same dimensions; the backbone
    weights are shared (copied from the vanilla model) and the new modules keep their initialisation."""
    from .common import build_ours

    models = {name: build_ours(dims, **overrides) for name, overrides in DOU2018_VARIANTS.items()}
    for name, model in models.items():
        if name != "vanilla":
            model.load_state_dict(models["vanilla"].state_dict(), strict=False)
    parameters = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    train = training_throughput(models, train_batch, train_repeats)
    decode = decoding_throughput(models, source, 4, new_tokens, decode_repeats)
    base_train, base_decode = train["median_s"]["vanilla"], decode["median_s"]["vanilla"]
    variants = {}
    for name in models:
        paper_train, paper_decode = DOU2018_TABLE_1[name]
        variants[name] = {
            "overrides": DOU2018_VARIANTS[name],
            "parameters": parameters[name],
            "added_parameters": parameters[name] - parameters["vanilla"],
            "train_ratio": base_train / train["median_s"][name],
            "decode_ratio": base_decode / decode["median_s"][name],
            "paper_train_ratio": paper_train / DOU2018_TABLE_1["vanilla"][0],
            "paper_decode_ratio": paper_decode / DOU2018_TABLE_1["vanilla"][1],
        }
    return {"dims": dims, "train": train, "decode": decode, "variants": variants}


def dou2018_decode_flops(dims: dict[str, int], source_length: int = 32, prefix_length: int = 16) -> dict[str, object]:
    """FLOPs of one cached decoding step (one hypothesis: the new token's decoder layers, aggregation, multi-layer
    attention over the cached keys/values, and the vocabulary projection) for every `DOU2018_VARIANTS` model,
    counted by `torch.utils.flop_counter.FlopCounterMode` after a ``prefix_length``-token prefix on a
    ``source_length``-token source. vanilla / variant is the decoding speed ratio a compute-bound machine would
    show: the ceiling for the measured ratios when every matmul runs at the same rate."""
    from torch.utils.flop_counter import FlopCounterMode

    from .common import build_ours

    generator = torch.Generator().manual_seed(0)
    vocab = dims["vocab_size"]
    source = torch.randint(4, vocab, (1, source_length), generator=generator)
    prefix = torch.cat([torch.full((1, 1), BOS), torch.randint(4, vocab, (1, prefix_length - 1), generator=generator)],
                       dim=1)
    token = torch.randint(4, vocab, (1, 1), generator=generator)
    flops = {}
    with torch.no_grad():
        for name, overrides in DOU2018_VARIANTS.items():
            model = build_ours(dims, **overrides).eval()
            mask = torch.ones_like(source)
            encoder_outputs = model.get_encoder()(input_ids=source, attention_mask=mask)
            cached = model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=prefix,
                           use_cache=True)
            counter = FlopCounterMode(display=False)
            with counter:
                model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=token,
                      past_key_values=output_cache(cached), use_cache=True)
            flops[name] = counter.get_total_flops()
    return {"source_length": source_length, "prefix_length": prefix_length, "flops_per_step": flops,
            "compute_bound_decode_ratio": {name: flops["vanilla"] / value for name, value in flops.items()}}


# ----------------------------------------------------------------------------------------------------------------
# meng2019 DTMT vs the Transformer of about equal size
# ----------------------------------------------------------------------------------------------------------------
def dtmt_speed(size: str, batch: Batch, source: Batch, repeats: int, decode_repeats: int, new_tokens: int,
               compile_rows: bool) -> dict[str, object]:
    """Training target tokens/s and beam-4 / greedy sentences/s of DTMT#4, DTMT#1 and ShallowRNMT at the width of
    ``size`` against our Transformer 6-6 of that size, all interleaved in one process. With ``compile_rows``, DTMT#4
    once more with its recurrence compiled (``compile_recurrence()``), interleaved with the Transformer again."""
    from .common import DTMT_ROWS, SIZES, build_dtmt, build_ours, model_dims

    d, heads = SIZES[size]["d_model"], SIZES[size]["encoder_attention_heads"]
    models = {"Transformer": build_ours(model_dims(size))}
    for name, (cell, depth) in DTMT_ROWS.items():
        models[name] = build_dtmt(d, cell, depth, heads)
    parameters = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    train = training_throughput(models, batch, repeats)
    decode = {f"beam4_b{source.input_ids.size(0)}": decoding_throughput(models, source, 4, new_tokens, decode_repeats),
              f"greedy_b{source.input_ids.size(0)}": decoding_throughput(models, source, 1, new_tokens, decode_repeats)}
    result: dict[str, object] = {"size": size, "parameters": parameters, "train": train, "decode": decode}
    if compile_rows:
        pair = {"Transformer": models["Transformer"], "DTMT#4 compiled": build_dtmt(d, *DTMT_ROWS["DTMT#4"], heads)}
        pair["DTMT#4 compiled"].compile_recurrence()  # each timestep one torch.compile graph (docs/meng2019-dtmt.md)
        step = training_step(pair["DTMT#4 compiled"], batch)
        start = time.perf_counter()
        step()  # compiles (every block shape of the model)
        first = time.perf_counter() - start
        compiled_train = training_throughput(pair, batch, repeats)
        compiled_train["first_step_s"] = first
        compiled_decode = decoding_throughput(pair, source, 4, new_tokens, decode_repeats)
        result["compiled"] = {"train": compiled_train, f"beam4_b{source.input_ids.size(0)}": compiled_decode,
                              "method": "compile_recurrence"}
    return result
