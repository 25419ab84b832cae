"""The benchmark harness: ``python -m benchmarks.run`` (from the repository root).

Writes ``benchmarks/results.json`` (every raw timing), ``benchmarks/RESULTS.md`` (the tables) and
``benchmarks/scaling.png``. ``--quick`` is a smoke run of every cheap section on small batches (about two minutes)
and writes to ``runs/benchmarks-quick/`` unless ``--out-dir`` says otherwise, so it never overwrites the committed
results. ``--sections`` picks sections; ``--threads`` sets torch's intra-op threads (default 1, see `main`);
``--merge`` keeps the other sections of an existing results.json (e.g. ``--sections crt_cost --merge`` adds li2022's
step-cost section to the committed full run without re-measuring it).

Contenders, all with one set of weights: ``ours`` (this checkout's DeepTransformer), ``before`` (the same model as
of commit `common.BEFORE_REF`, before the performance work, loaded from git) and ``marian`` (`MarianMTModel` of the
same dimensions with the weights copied in). Later Transformer variants join as extra rows through
`common.VARIANTS`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from . import measure  # noqa: E402
from .common import (  # noqa: E402
    BEFORE_REF,
    REPO,
    SIZES,
    VARIANTS,
    build_ours,
    contenders,
    machine_info,
    median,
    model_dims,
    synthetic_batch,
)
from .probe_runner import run_probe  # noqa: E402

SECTIONS = ("equivalence", "train", "decode", "flat", "memory", "scaling", "profile", "flops", "compile", "deep_memory",
            "crt_cost", "dou2018", "dou2018_flops", "dtmt", "engines", "engines_deep", "engine_quality", "bf16_train",
            "decode_limit", "ct2_stock", "gpu", "dtmt_recurrence", "gpu_dtmt", "serve", "step_limit", "serve_mixed")
# The compile section's rows beyond the baseline: each paper's switches on the d256 6-6 model (issue 36 item 5).
COMPILE_ROWS: dict[str, dict[str, object]] = {
    "liu2020 ADMIN": {"residual_scaling": "admin", "admin_init": "closed_form"},
    "li2022 CAD + DDR + ALD": {"cross_attention_drop_depth": 3, "cross_attention_drop_ratio": 0.5, "ddr_weight": 1.0,
                               "ald_weight": 1.0},
    "dou2018 hierarchical + MLA k=2": {"encoder_layer_aggregation": "hierarchical",
                                       "decoder_layer_aggregation": "hierarchical", "multi_layer_attention_k": 2},
}
QUICK_SECTIONS = ("equivalence", "train", "decode", "flat", "memory", "scaling", "profile", "flops")


def settings(quick: bool) -> dict[str, object]:
    """Every knob of a run, recorded in results.json. Quick mode shrinks batches and repeats, never the method."""
    if quick:
        return dict(sizes=["d256"], train_tokens=512, train_repeats={"d256": 2}, new_tokens=8,
                    decode_repeats={1: 3, 32: 2}, flat_steps=40, flat_repeats=1, flat_batch=8,
                    memory_workloads=["beam4_b32"], depths=[6, 12], scaling_tokens=512,
                    lengths=[32], length_tokens=512, profile_size="d256", flops_size="d256",
                    compile_repeats=2, crt_tokens=256, crt_repeats=1, dou2018_size="d256", dou2018_repeats=1,
                    dtmt_size="d256", dtmt_repeats=2, dtmt_decode_repeats=1, dtmt_compile=False,
                    engine_models=["6-6 d256"], engine_new_tokens=8, engine_repeats={16: 1, 1: 2}, engine_memory=False,
                    engine_deep_models=["6-6 d256 dou2018 hierarchical + MLA k=2", "DTMT#4 d256"],
                    quality_samples=32, bf16_tokens=512, bf16_repeats=1, decode_limit_model="6-6 d256",
                    serve_requests=40, serve_clients=[1, 8], serve_time_limit_s=30, step_limit_repeats=5, step_limit_generate_repeats=1)
    return dict(sizes=list(SIZES), train_tokens=4096, train_repeats={"d256": 5, "d512": 5}, new_tokens=32,
                decode_repeats={1: 7, 32: 3}, flat_steps=200, flat_repeats=2, flat_batch=32,
                memory_workloads=["train", "greedy_b32", "beam4_b32"], depths=[6, 12, 24, 48],
                scaling_tokens=2048, lengths=[16, 32, 64, 128, 256], length_tokens=2048, profile_size="d256",
                # dou2018 at d256: its 8 models at d512, each with AdamW state, peaked above 20 GB RSS and were
                # OOM-killed on this 24 GB machine (2026-11-23)
                flops_size="d512", compile_repeats=3, crt_tokens=2048, crt_repeats=3, dou2018_size="d256",
                dou2018_repeats=3, dtmt_size="d256", dtmt_repeats=5, dtmt_decode_repeats=3, dtmt_compile=True,
                engine_models=["6-6 d256", "6-6 d512", "24-6 d512"], engine_new_tokens=32,
                # dou2018 at the width of the engines rows it is compared with; DTMT#4 at the `dtmt` section's width
                engine_deep_models=["6-6 d512 dou2018 hierarchical + MLA k=2", "DTMT#4 d256"],
                engine_repeats={16: 7, 1: 7}, engine_memory=True, quality_samples=None, bf16_tokens=2048,
                bf16_repeats=3, decode_limit_model="6-6 d512",
                # issue 38: 2,000 requests of 1-3 test verses at 1, 8 and 32 clients; each of the 12 runs (2 engines
                # x 2 server settings x 3 client counts) stops sending after 5 min, so the section ends within ~1.2 h
                serve_requests=2000, serve_clients=[1, 8, 32], serve_time_limit_s=300, step_limit_repeats=30, step_limit_generate_repeats=7)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _probe_spec(workload: str, size: str, model: str, threads: int, cfg: dict[str, object]) -> dict[str, object]:
    if workload == "train":
        return dict(model=model, size=size, workload="train", tokens=cfg["train_tokens"], threads=threads)
    kind, batch = workload.split("_b")
    return dict(model=model, size=size, workload="generate", batch=int(batch), num_beams=4 if kind == "beam4" else 1,
                new_tokens=cfg["new_tokens"], threads=threads)


def run(args: argparse.Namespace) -> dict[str, object]:
    cfg = settings(args.quick)
    if args.sizes:
        cfg["sizes"] = args.sizes
    for name in ("serve_requests", "serve_time_limit_s"):
        if getattr(args, name) is not None:
            cfg[name] = getattr(args, name)
    threads = torch.get_num_threads()
    results: dict[str, object] = {
        "command": args.command_line,
        "quick": args.quick,
        "started": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": machine_info(args.before_ref),
        "settings": {**cfg, "train_repeats": {k: v for k, v in cfg["train_repeats"].items()},
                     "decode_repeats": {str(k): v for k, v in cfg["decode_repeats"].items()}},
        "sections": args.sections,
    }
    started = time.perf_counter()
    train_batch, sources = measure.default_batches(args.quick)
    main_sections = {"equivalence", "train", "decode", "flat"} & set(args.sections)
    for size in cfg["sizes"] if main_sections else []:
        log(f"{size}: building contenders")
        models = contenders(size, with_before=not args.no_before, variants=args.variants,
                            before_ref=args.before_ref)
        if "equivalence" in args.sections:
            log(f"{size}: equivalence")
            results.setdefault("equivalence", {})[size] = measure.equivalence(models, train_batch, new_tokens=16)
        if "train" in args.sections:
            log(f"{size}: training throughput")
            repeats = cfg["train_repeats"].get(size, 3)
            results.setdefault("train", {})[size] = measure.training_throughput(models, train_batch, repeats)
            log(f"{size}: training throughput, label smoothing 0.1")
            results.setdefault("train_ls", {})[size] = measure.training_throughput(models, train_batch, repeats,
                                                                                   label_smoothing=0.1)
        if "decode" in args.sections:
            for batch, source in sources.items():
                for beams in (1, 4):
                    log(f"{size}: decoding, batch {batch}, beams {beams}")
                    results.setdefault("decode", {}).setdefault(size, {})[f"{'greedy' if beams == 1 else 'beam4'}_b{batch}"] = (
                        measure.decoding_throughput(models, source, beams, cfg["new_tokens"],
                                                    cfg["decode_repeats"][batch]))
        if "flat" in args.sections:
            log(f"{size}: per-step decoding cost vs length")
            source = synthetic_batch(sentences=cfg["flat_batch"], seed=3)
            results.setdefault("flat", {})[size] = measure.incremental_decoding_cost(
                models, source, cfg["flat_steps"], cfg["flat_repeats"])
        del models

    if "memory" in args.sections:
        memory: dict[str, dict[str, dict[str, object]]] = {}
        for size in cfg["sizes"]:
            for workload in cfg["memory_workloads"]:
                for model in ("ours", "marian"):
                    log(f"{size}: peak memory, {model}, {workload} (child process)")
                    memory.setdefault(size, {}).setdefault(model, {})[workload] = run_probe(
                        _probe_spec(workload, size, model, threads, cfg))
        results["memory"] = memory

    if "scaling" in args.sections:
        results["scaling"] = scaling(cfg, threads)

    if "profile" in args.sections:
        log("profiles (torch.profiler): training step and beam-4 decode")
        models = contenders(cfg["profile_size"], with_before=not args.no_before, before_ref=args.before_ref)
        results["profile"] = {"size": cfg["profile_size"],
                              **measure.profiles(models, train_batch, sources[32], cfg["new_tokens"])}
        del models

    if "flops" in args.sections:
        size = cfg["flops_size"]
        log(f"{size}: FLOPs of a training step vs the matmul peak")
        step_s = results.get("train", {}).get(size, {}).get("median_s", {}).get("ours")
        model = build_ours(model_dims(size))
        if step_s is None:  # the train section did not run for this size: time the step here
            step = measure.training_step(model, train_batch)
            step()
            step_s = median([_timed(step) for _ in range(3)])
        results["flops"] = {"size": size, **measure.gflops_vs_peak(model, train_batch, step_s)}
        del model

    if "compile" in args.sections:
        log("torch.compile: eager vs compiled training step (d256), and Seq2SeqTrainer(torch_compile=True)")
        dims = model_dims("d256")
        compiled = measure.compiled_training(lambda: build_ours(dims), train_batch, cfg["compile_repeats"])
        # issue 36 item 5: every paper's switches compile too; one row each (the same d256 6-6 and batch)
        compiled["papers"] = {}
        for name, switches in COMPILE_ROWS.items():
            log(f"torch.compile: eager vs compiled training step, d256 6-6 with {name}")
            compiled["papers"][name] = measure.compiled_training(lambda switches=switches: build_ours(dims, **switches),
                                                                 train_batch, cfg["compile_repeats"])
        tiny = dict(d_model=64, encoder_ffn_dim=128, decoder_ffn_dim=128, encoder_attention_heads=4,
                    decoder_attention_heads=4, vocab_size=8000, encoder_layers=2, decoder_layers=2,
                    max_position_embeddings=128)
        with tempfile.TemporaryDirectory() as folder:
            compiled["trainer_smoke"] = measure.trainer_compile_smoke(
                build_ours(tiny), synthetic_batch(sentences=8, seed=4), steps=2, output_dir=folder)
        results["compile"] = compiled

    if "deep_memory" in args.sections:
        # liu2020's model: 60L-12L d512 with ADMIN, one training step (forward, backward, Adam) at ~2k tokens.
        deep = {}
        for checkpointing in (False, True):
            log(f"deep memory: 60L-12L d512 ADMIN training step, 2k tokens, checkpointing={checkpointing}")
            deep["checkpointing" if checkpointing else "plain"] = run_probe(dict(
                model="ours", variant="admin", size="d512", workload="train", tokens=2048, threads=threads,
                timed=1, encoder_layers=60, decoder_layers=12, checkpointing=checkpointing), timeout=3600)
        results["deep_memory"] = deep

    if "crt_cost" in args.sections:
        # li2022 issue: a DEEP+CAD+CRT step vs DEEP at equal depth, 12-12 d256, L_dr = 9, p_net = 1.0.
        log(f"crt_cost: 12-12 d256 DEEP, +CAD, +CAD+DDR, +CAD+ALD, +CAD+CRT training steps, ~{cfg['crt_tokens']} "
            f"tokens, {cfg['crt_repeats']} interleaved repeats")
        results["crt_cost"] = measure.crt_cost(
            model_dims("d256", encoder_layers=12, decoder_layers=12), synthetic_batch(tokens=cfg["crt_tokens"], seed=5),
            repeats=cfg["crt_repeats"], flops_batch=synthetic_batch(sentences=4, seed=6))

    if "dou2018" in args.sections:
        # dou2018 Table 1: every deep-representation mechanism at Base 6-6, training and beam-4 decoding speed
        size = cfg["dou2018_size"]
        log(f"dou2018: 6-6 {size}, vanilla vs dense/linear/iterative/hierarchical/MLA k=2,3/hierarchical+div, "
            f"training step and beam-4 decoding (batch 32), {cfg['dou2018_repeats']} interleaved repeats")
        results["dou2018"] = measure.dou2018_speed(model_dims(size), train_batch, sources[32], cfg["new_tokens"],
                                                   cfg["dou2018_repeats"], cfg["dou2018_repeats"])
    if "dou2018_flops" in args.sections:
        # the compute-bound decoding ratio of each dou2018 mechanism: FLOPs of one cached step (no timing)
        size = cfg["dou2018_size"]
        log(f"dou2018_flops: 6-6 {size}, FLOPs of one cached decoding step per mechanism")
        results["dou2018_flops"] = measure.dou2018_decode_flops(model_dims(size))
    if "dtmt" in args.sections:
        # meng2019: DTMT#4 / DTMT#1 / ShallowRNMT vs the Transformer 6-6 of the same width (about DTMT#4's size).
        log(f"dtmt: {cfg['dtmt_size']} training step and decoding vs the Transformer"
            f"{', plus torch.compile rows' if cfg['dtmt_compile'] else ''}")
        results["dtmt"] = measure.dtmt_speed(cfg["dtmt_size"], train_batch, sources[32], cfg["dtmt_repeats"],
                                             cfg["dtmt_decode_repeats"], cfg["new_tokens"], cfg["dtmt_compile"])
    if "dtmt_recurrence" in args.sections:
        from .dtmt_recurrence import dtmt_recurrence

        # issue 36 item 4: DTMT#4's recurrence before / after / compiled vs the Transformer, and its operator counts
        results["dtmt_recurrence"] = dtmt_recurrence(torch.device("cpu"), cfg["dtmt_size"], cfg["train_tokens"],
                                                     cfg["dtmt_repeats"], log)
    if "gpu_dtmt" in args.sections:
        from .dtmt_recurrence import dtmt_recurrence

        on_gpu = torch.cuda.is_available() and not args.quick
        results["gpu_dtmt"] = dtmt_recurrence(torch.device("cuda" if on_gpu else "cpu"), "d512" if on_gpu else "d256",
                                              4096 if on_gpu else cfg["train_tokens"], 10 if on_gpu else 2, log)
    if "gpu" in args.sections:
        from . import gpu

        # one GPU: training, attention kernels, deep models, decoding (benchmarks/gpu.py); a CPU dry run without CUDA
        results["gpu"] = gpu.gpu_section(args.quick, log)
    if {"engines", "engines_deep", "engine_quality", "bf16_train", "decode_limit", "ct2_stock"} & set(args.sections):
        from . import engines

        # The engine comparison runs at --engine-threads (2: the setting), whatever --threads says.
        engine_threads = args.engine_threads
        if "engines" in args.sections:
            results["engines"] = engines.engines_section(
                engine_threads, cfg["engine_new_tokens"], cfg["engine_repeats"], cfg["engine_models"],
                cfg["engine_memory"], log)
        if "engines_deep" in args.sections:
            # the models CTranslate2 and Marian cannot express: our torch generate vs our ONNX export, fp32 / int8
            results["engines_deep"] = engines.engines_section(
                engine_threads, cfg["engine_new_tokens"], cfg["engine_repeats"], cfg["engine_deep_models"],
                cfg["engine_memory"], log, contenders=engines.DEEP_CONTENDERS, reference="ours",
                section="engines_deep")
        if "engine_quality" in args.sections:
            if not args.model_dir:
                raise SystemExit("--sections engine_quality needs --model-dir (one or more trained model folders).")
            quality: dict[str, object] = {}
            for model_dir in args.model_dir:
                log(f"engine_quality: {model_dir} on the embedded test set, every engine that can run it")
                started_model = dt.datetime.now().isoformat(timespec="seconds")
                quality[Path(model_dir).name] = {
                    **engines.quality_section(model_dir, engine_threads, cfg["quality_samples"], log),
                    "command": args.command_line, "quick": args.quick, "started": started_model,
                    "commit": results["machine"]["commit"]}
            results["engine_quality"] = {"models": quality}
        if "bf16_train" in args.sections:
            log("bf16_train: 6-6 d512 training step, fp32 vs bf16 autocast")
            results["bf16_train"] = engines.bf16_training(engine_threads, cfg["bf16_tokens"], cfg["bf16_repeats"])
        if "decode_limit" in args.sections:
            log(f"decode_limit: {cfg['decode_limit_model']}, beam 4: our generate vs Marian, matrix-kernel time, "
                "FLOPs, fp32 peak")
            results["decode_limit"] = engines.decode_limits(engine_threads, cfg["decode_limit_model"],
                                                            cfg["engine_new_tokens"], cfg["engine_repeats"][16])
        if "ct2_stock" in args.sections:
            log(f"ct2_stock: {cfg['decode_limit_model']}: our CTranslate2 export vs CTranslate2's own Marian conversion")
            results["ct2_stock"] = engines.stock_converter_check(engine_threads, cfg["decode_limit_model"],
                                                                 cfg["engine_new_tokens"], cfg["engine_repeats"][16])
        torch.set_num_threads(threads)

    if "step_limit" in args.sections:
        from . import engines

        log("step_limit: one beam-4 decoder step, ours and Marian's, beside its weight products alone")
        results["step_limit"] = engines.step_limits(threads, cfg["step_limit_repeats"], cfg["step_limit_generate_repeats"],
                                                    cfg["engine_new_tokens"])
    if "serve" in args.sections:
        from . import serve_load

        # `deepnmt serve` processes under load from this process' clients (benchmarks/serve_load.py)
        if args.model_dir and len(args.model_dir) > 1:
            log(f"serve: measuring the first --model-dir only ({args.model_dir[0]})")
        previous = None
        if args.merge and (args.out_path / "results.json").exists():  # keep the cells of engines not measured now
            earlier = json.loads((args.out_path / "results.json").read_text())
            previous = earlier.get("serve")
            if previous:
                measured = earlier.get("merged", {}).get("serve", earlier)
                previous = {**previous, "measured_by": {"command": measured.get("command"),
                                                        "commit": measured.get("machine", {}).get("commit")}}
        results["serve"] = serve_load.serve_section(
            args.model_dir[0] if args.model_dir else None, args.engine_threads, cfg["serve_requests"],
            cfg["serve_clients"], cfg["serve_time_limit_s"], args.quick, log,
            engines=args.serve_engines.split(",") if args.serve_engines else None, previous=previous)

    if "serve_mixed" in args.sections:
        from . import serve_load

        # several models behind one `deepnmt serve`, mixed traffic, against each alone (benchmarks/serve_load.py)
        if not args.model_dir or len(args.model_dir) < 2:
            raise SystemExit("--sections serve_mixed needs two or more --model-dir folders, each recording its own "
                             "language pair (e.g. an en→es and an es→en `deepnmt quickstart` model).")
        results["serve_mixed"] = serve_load.mixed_section(
            args.model_dir, args.engine_threads, cfg["serve_requests"], max(cfg["serve_clients"]),
            cfg["serve_time_limit_s"], log)

    results["duration_s"] = time.perf_counter() - started
    return results


def _timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def scaling(cfg: dict[str, object], threads: int) -> dict[str, object]:
    """Training step time and peak memory (one child process per point) vs depth and vs sentence length, d256."""
    points: dict[str, list[dict[str, object]]] = {"encoder_depth": [], "decoder_depth": [], "length": []}
    by_layers: dict[tuple[int, int], dict[str, object]] = {}  # 6-6 belongs to both sweeps: measured once
    for stack in ("encoder", "decoder"):
        for depth in cfg["depths"]:
            layers = {"encoder_layers": 6, "decoder_layers": 6, f"{stack}_layers": depth}
            key = (layers["encoder_layers"], layers["decoder_layers"])
            if key not in by_layers:
                log(f"scaling: {key[0]}-{key[1]} layers (child process)")
                by_layers[key] = run_probe(dict(model="ours", size="d256", workload="train",
                                                tokens=cfg["scaling_tokens"], threads=threads, timed=2, **layers))
            points[f"{stack}_depth"].append(by_layers[key])
    for length in cfg["lengths"]:
        log(f"scaling: sentence length {length} (child process)")
        points["length"].append(run_probe(dict(model="ours", size="d256", workload="train",
                                               tokens=cfg["length_tokens"], length=length, threads=threads,
                                               timed=2)))
    return {"tokens_depth": cfg["scaling_tokens"], "tokens_length": cfg["length_tokens"], **points}


SECTION_EXTRA_KEYS = {"train": ("train_ls",)}


def merge(existing: dict[str, object], new: dict[str, object], sections: list[str]) -> dict[str, object]:
    """``existing`` with the measured ``sections`` of ``new`` put in; the run that measured them is recorded under
    ``existing["merged"][section]`` (the top-level command, machine and sections stay those of the full run).
    ``engine_quality`` holds one entry per trained model: the models measured now join (or replace, by folder name)
    those already there (`merge_quality`)."""
    # the keys a section's run writes besides its own (the train section's label-smoothed rows)
    keys = [key for section in sections for key in (section, *SECTION_EXTRA_KEYS.get(section, ()))]
    for section in keys:
        if section in new:
            if section == "engine_quality" and section in existing:
                existing[section] = merge_quality(existing, new[section])
            else:
                existing[section] = new[section]
            existing.setdefault("merged", {})[section] = {
                key: new[key] for key in ("command", "quick", "started", "machine", "settings", "duration_s")}
    return existing


def merge_quality(existing: dict[str, object], new: dict[str, object]) -> dict[str, object]:
    """The ``engine_quality`` section of ``existing`` with the models of ``new`` added (a model folder name measured
    again replaces its entry). A section of the one-model layout (before `engine_quality` held several: the entry
    itself, with ``model_dir``) becomes the entry of its folder name, with the command, start and commit of the run
    that measured it (``existing["merged"]["engine_quality"]``, or the full run)."""
    old = existing["engine_quality"]
    if "models" in old:
        models = dict(old["models"])
    else:
        run = existing.get("merged", {}).get("engine_quality", existing)
        models = {Path(old["model_dir"]).name: {**old, "command": run["command"], "started": run["started"],
                                                "commit": run["machine"]["commit"]}}
    return {"models": {**models, **new["models"]}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke mode: small batches, few repeats (~2 min)")
    parser.add_argument("--sections", default=None,
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all but serve and serve_mixed; quick: "
                             "all but compile)")
    parser.add_argument("--sizes", default=None, help=f"comma-separated subset of {','.join(SIZES)}")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (default 1: on a shared machine a second OpenMP thread stalls "
                             "whenever another process holds the other core, which makes timings meaningless)")
    parser.add_argument("--engine-threads", type=int, default=2,
                        help="threads of every contender in the engines / engines_deep / engine_quality / bf16_train "
                             "sections and of the server in the serve section (default 2, the issue's setting)")
    parser.add_argument("--model-dir", default=None, nargs="+",
                        help="trained model folders for the engine_quality section (BLEU through every engine that "
                             "can run the model), one entry each, keyed by folder name; the serve section serves the "
                             "first, serve_mixed all of them in one server")
    parser.add_argument("--serve-requests", type=int, default=None,
                        help="serve section: requests per run (default 2000; quick: 40)")
    parser.add_argument("--serve-time-limit-s", type=float, default=None,
                        help="serve section: stop sending a run's requests after this many seconds (default 300; "
                             "quick: 30)")
    parser.add_argument("--serve-engines", default=None,
                        help="serve section: comma-separated subset of torch,onnx_int8,ctranslate2_int8 (default: "
                             "all the model can run); with --merge the other engines' earlier cells are kept")
    parser.add_argument("--no-before", action="store_true", help="skip the pre-optimisation contender")
    parser.add_argument("--before-ref", default=BEFORE_REF,
                        help=f"git commit whose model is the `before` contender (default {BEFORE_REF}, the code "
                             "before the performance work)")
    parser.add_argument("--variants", default="", help=f"extra DeepTransformer rows from {sorted(VARIANTS)}")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: re-render RESULTS.md and scaling.png from the results.json in the "
                             "output folder (after a change to report.py)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the output folder's results.json and replace only the sections measured now (each "
                             "merged section records its own command, machine and time under `merged`)")
    parser.add_argument("--out-dir", default=None,
                        help="where results.json, RESULTS.md and scaling.png go (default: benchmarks/; "
                             "quick: runs/benchmarks-quick/)")
    args = parser.parse_args(argv)
    args.command_line = "python -m benchmarks.run" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    # `serve` (tens of minutes, a trained model) runs only when named
    default = QUICK_SECTIONS if args.quick else [s for s in SECTIONS if s not in ("serve", "serve_mixed") and
                                                 (s not in ("gpu", "gpu_dtmt") or torch.cuda.is_available())]
    args.sections = args.sections.split(",") if args.sections else list(default)
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {list(SECTIONS)}")
    args.sizes = args.sizes.split(",") if args.sizes else None
    args.variants = [v for v in args.variants.split(",") if v]
    torch.set_num_threads(args.threads)
    out_dir = Path(args.out_dir) if args.out_dir else (REPO / "runs" / "benchmarks-quick" if args.quick
                                                          else REPO / "benchmarks")
    out_dir.mkdir(parents=True, exist_ok=True)
    args.out_path = out_dir

    from .report import write_report

    if args.render_only:
        results = json.loads((out_dir / "results.json").read_text())
        write_report(results, out_dir)
        log(f"re-rendered {out_dir / 'RESULTS.md'} and {out_dir / 'scaling.png'} from {out_dir / 'results.json'}")
        return
    results = run(args)
    duration_s = results["duration_s"]
    if args.merge and (out_dir / "results.json").exists():
        results = merge(json.loads((out_dir / "results.json").read_text()), results, args.sections)

    write_report(results, out_dir)  # adds the scaling fits to `results`
    (out_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    log(f"wrote {out_dir / 'results.json'}, {out_dir / 'RESULTS.md'}, {out_dir / 'scaling.png'} "
        f"in {duration_s / 60:.1f} min")


if __name__ == "__main__":
    main()
