"""Sections ``engines`` and ``engines_deep``: beam-4 decoding through every inference engine, one set of weights,
side by side.

Contenders (random weights of `common.build_ours` / `common.build_dtmt`; for a standard Transformer copied into
Marian; exported with `hf_deepnmt.export`):

* ``marian``: `transformers.MarianMTModel.generate` (the peer every ratio of ``engines`` is taken against);
* ``ours``: our `generate`, float32 (the peer of ``engines_deep``); ``ours_bf16``: the same under
  ``torch.autocast("cpu", torch.bfloat16)``;
* ``ct2_fp32`` / ``ct2_int8``: our CTranslate2 export (`hf_deepnmt.export.CTranslate2Engine`), float32 / int8;
* ``onnx_fp32`` / ``onnx_int8``: our ONNX export run by transformers' own `generate` on ONNX Runtime
  (`hf_deepnmt.export.OnnxEngine`, i.e. `hf_deepnmt.ort_generation.OnnxSeq2SeqLM`; int8: ONNX Runtime's dynamic
  quantization of the MatMul weights).

``engines`` runs the standard Transformers of `MODELS` (6-6 / 24-6) against Marian with every contender;
``engines_deep`` runs the models CTranslate2 and Marian cannot express (`hf_deepnmt.export.export_blockers`: dou2018
layer aggregation + multi-layer attention, meng2019 DTMT#4) with ``ours``, ``onnx_fp32`` and ``onnx_int8``, as
ratios to ``ours``. One loop (`engines_section`) measures both.

Equal work: every contender produces exactly ``new_tokens`` tokens per hypothesis (``</s>`` suppressed until then,
as `common.fixed_generation_config` does for `generate`; the ONNX export carries that generation config). Times are
medians of interleaved rounds; peak memory comes from one child process per contender (`benchmarks.probe`), RSS above
the baseline after importing every library.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from .common import (
    BOS,
    EOS,
    PAD,
    SIZES,
    UNK,
    Batch,
    build_dtmt,
    build_marian,
    build_ours,
    FIRST_WORD_ID,
    copy_weights,
    fixed_generation_config,
    interleaved,
    median,
    model_dims,
    synthetic_batch,
)

CONTENDERS = ("marian", "ours", "ours_bf16", "ct2_fp32", "ct2_int8", "onnx_fp32", "onnx_int8")
# the models CTranslate2 and Marian cannot express: our torch generate and the ONNX export only
DEEP_CONTENDERS = ("ours", "onnx_fp32", "onnx_int8")
# the dou2018 model of `engines_deep`: hierarchical layer aggregation of both stacks and multi-layer attention, k = 2
DOU2018_HIERARCHICAL_MLA2 = {"encoder_layer_aggregation": "hierarchical", "decoder_layer_aggregation": "hierarchical",
                             "multi_layer_attention_k": 2}
# name -> the model: a Transformer of `common.build_ours` (size of `common.SIZES`, layers, `DeepTransformerConfig`
# overrides), or with ``model_type="dtmt"`` a DTMT of `common.build_dtmt` at the width of the size (DTMT#4 at d256 is
# the `dtmt` section's model, about the 6-6 d256 Transformer's size)
MODELS: dict[str, dict[str, object]] = {
    "6-6 d256": dict(size="d256", encoder_layers=6, decoder_layers=6),
    "6-6 d512": dict(size="d512", encoder_layers=6, decoder_layers=6),
    "24-6 d512": dict(size="d512", encoder_layers=24, decoder_layers=6),
    "6-6 d512 dou2018 hierarchical + MLA k=2": dict(size="d512", encoder_layers=6, decoder_layers=6,
                                                   overrides=DOU2018_HIERARCHICAL_MLA2),
    "6-6 d256 dou2018 hierarchical + MLA k=2": dict(size="d256", encoder_layers=6, decoder_layers=6,
                                                   overrides=DOU2018_HIERARCHICAL_MLA2),
    "DTMT#4 d256": dict(size="d256", model_type="dtmt", rnn_cell="lgru", transition_depth=4),
}
BATCHES = (16, 1)
# contender -> (export format, quantization) of the exported contenders
EXPORTS: dict[str, tuple[str, str | None]] = {"ct2_fp32": ("ctranslate2", None), "ct2_int8": ("ctranslate2", "int8"),
                                              "onnx_fp32": ("onnx", None), "onnx_int8": ("onnx", "int8")}


class SyntheticTokenizer:
    """What the exporters need from a tokenizer for a model without one: a unique string per id."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        specials = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", UNK: "<unk>"}
        return [specials.get(i, f"w{i}") for i in ids]

    def save_pretrained(self, folder: str | Path) -> None:
        """Nothing to save: the benchmark feeds token ids."""


def build_model(label: str, marian: bool = False) -> torch.nn.Module:
    """Our model of `MODELS` ``label`` (random weights, seed 0), or with ``marian`` a `MarianMTModel` of its
    dimensions (a standard Transformer only), in eval mode."""
    spec = MODELS[label]
    size = spec["size"]
    if spec.get("model_type") == "dtmt":
        if marian:
            raise ValueError(f"{label}: Marian cannot express a DTMT")
        return build_dtmt(SIZES[size]["d_model"], spec["rnn_cell"], spec["transition_depth"],
                          SIZES[size]["encoder_attention_heads"]).eval()
    dims = model_dims(size, encoder_layers=spec["encoder_layers"], decoder_layers=spec["decoder_layers"])
    if marian:
        if spec.get("overrides"):
            raise ValueError(f"{label}: Marian cannot express {spec['overrides']}")
        return build_marian(dims).eval()
    return build_ours(dims, **spec.get("overrides", {})).eval()


def same_weights(label: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Our model of `MODELS` ``label`` (random weights) and a `MarianMTModel` holding the same weights, in eval mode."""
    ours, marian = build_model(label), build_model(label, marian=True)
    copy_weights(ours, marian)
    return ours, marian


def export_one(model: torch.nn.Module, folder: Path, export_format: str, quantization: str | None) -> Path:
    """One export of ``model`` (the benchmark vocabulary, `SyntheticTokenizer`) into ``folder``."""
    from hf_deepnmt.export import export_model

    export_model(model, SyntheticTokenizer(model.config.vocab_size), folder, export_format, quantization)
    return folder


def export_all(model: torch.nn.Module, folder: Path, names: tuple[str, ...] | list[str] = tuple(EXPORTS)
               ) -> dict[str, Path]:
    """The exports of `EXPORTS` among ``names`` (default: CTranslate2 fp32/int8 and ONNX fp32/int8) of ``model``
    under ``folder``."""
    return {name: export_one(model, folder / name, *EXPORTS[name]) for name in names if name in EXPORTS}


def source_ids(source: Batch) -> list[list[int]]:
    return [row[mask.bool()].tolist() for row, mask in zip(source.input_ids, source.attention_mask)]


def contender_call(name: str, source: Batch, new_tokens: int, threads: int, models: dict[str, torch.nn.Module],
                   exports: dict[str, Path]) -> Callable[[], object]:
    """A zero-argument function that decodes ``source`` with beam 4 and exactly ``new_tokens`` tokens: a torch
    model's `generate` (``marian``, ``ours``, ``ours_bf16``), or `load_engine`'s engine of an export — CTranslate2's
    own beam search, or for ONNX transformers' `generate` on ONNX Runtime (`OnnxSeq2SeqLM`)."""
    from hf_deepnmt.export import load_engine

    if name in ("marian", "ours", "ours_bf16"):
        model = models["marian" if name == "marian" else "ours"].eval()
        fixed_generation_config(model, 4, new_tokens)

        def generate() -> object:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=name == "ours_bf16"):
                return model.generate(input_ids=source.input_ids, attention_mask=source.attention_mask)

        return generate
    engine = load_engine(exports[name], EXPORTS[name][0], intra_threads=threads)
    ids = source_ids(source)
    return lambda: engine.generate(ids, num_beams=4, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def gemm_peaks(threads: int, n: int = 2048, repeats: int = 5) -> dict[str, float]:
    """Best GFLOP/s (GOP/s for int8) of an n×n×n matmul at ``threads`` threads: fp32, bf16 (AVX512-BF16) and int8
    (`torch._int_mm`, AVX512-VNNI) — the ceiling any engine's GEMMs can reach on this CPU."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    cases = {"fp32": lambda: torch.mm(a, b)}
    a16, b16 = a.bfloat16(), b.bfloat16()
    cases["bf16"] = lambda: torch.mm(a16, b16)
    a8, b8 = (torch.randint(-100, 100, (n, n), dtype=torch.int8) for _ in range(2))
    try:
        torch._int_mm(a8, b8)
        cases["int8"] = lambda: torch._int_mm(a8, b8)
    except RuntimeError:
        pass
    peaks = {}
    for name, function in cases.items():
        function()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            function()
            times.append(time.perf_counter() - start)
        peaks[f"{name}_gflops"] = 2 * n ** 3 / min(times) / 1e9
    return peaks


def engines_section(threads: int, new_tokens: int, repeats: dict[int, int], models_to_run: list[str],
                    memory: bool, log: Callable[[str], None], contenders: tuple[str, ...] = CONTENDERS,
                    reference: str = "marian", section: str = "engines") -> dict[str, object]:
    """Beam-4 decoding of the `MODELS` ``models_to_run`` by each of ``contenders`` at batch sizes `BATCHES`, exactly
    ``new_tokens`` new tokens, interleaved rounds (``repeats[batch]`` after a warm-up round), and with ``memory`` the
    peak memory of each contender in a child process. ``reference`` is the contender the report takes ratios to."""
    from .probe_runner import run_probe

    torch.set_num_threads(threads)
    results: dict[str, object] = {"threads": threads, "new_tokens": new_tokens, "num_beams": 4,
                                  "contenders": list(contenders), "reference": reference,
                                  "gemm_peaks": gemm_peaks(threads), "models": {}}
    sources = {batch: synthetic_batch(sentences=batch, seed=2) for batch in BATCHES}
    for label in models_to_run:
        spec = MODELS[label]
        models = {"ours": build_model(label)}
        if "marian" in contenders:
            models["marian"] = build_model(label, marian=True)
            copy_weights(models["ours"], models["marian"])
        fixed_generation_config(models["ours"], 4, new_tokens)  # the exports carry the contenders' search settings
        entry: dict[str, object] = {**spec, "parameters_m": sum(p.numel() for p in models["ours"].parameters()) / 1e6,
                                    "batches": {}}
        exported = [name for name in contenders if name in EXPORTS]
        with tempfile.TemporaryDirectory(prefix="deepnmt_engines_") as scratch:
            log(f"{section}: {label}: exporting ({', '.join(exported)})")
            exports = export_all(models["ours"], Path(scratch), exported)
            for batch in BATCHES:
                source = sources[batch]
                calls = {name: contender_call(name, source, new_tokens, threads, models, exports)
                         for name in contenders}
                log(f"{section}: {label}: beam 4, batch {batch}, {new_tokens} tokens, {repeats[batch]} rounds")
                times = interleaved(calls, repeats=repeats[batch], warmup=1)
                row: dict[str, object] = {
                    "seconds": times,
                    "median_s": {name: median(values) for name, values in times.items()},
                    "sentences_per_s": {name: batch / median(values) for name, values in times.items()},
                }
                if memory:
                    row["memory"] = {}
                    for name in contenders:
                        log(f"{section}: {label}: peak memory, {name}, batch {batch} (child process)")
                        row["memory"][name] = run_probe(dict(
                            model=name, label=label, **spec, workload="engine", batch=batch, new_tokens=new_tokens,
                            threads=threads, export=str(exports.get(name, "")), timed=0))
                entry["batches"][str(batch)] = row
                del calls
        results["models"][label] = entry
    return results


def probe_workload(spec: dict[str, object]) -> tuple[Callable[[], object], int]:
    """`benchmarks.probe` hook: the decode call of one contender (the model of `MODELS` ``spec["label"]`` built, or
    the export loaded, here)."""
    name = spec["model"]
    models = {}
    if name in ("ours", "ours_bf16"):
        models["ours"] = build_model(spec["label"])
    elif name == "marian":
        models["marian"] = build_model(spec["label"], marian=True)
    source = synthetic_batch(sentences=spec["batch"], seed=2)
    exports = {name: Path(spec["export"])} if spec.get("export") else {}
    return contender_call(name, source, spec["new_tokens"], spec["threads"], models, exports), spec["batch"]


class _WithSettings:
    """An engine whose `generate` always uses some fixed search settings (e.g. ``early_stopping=True``)."""

    def __init__(self, engine: object, **settings: object):
        self.engine, self.settings = engine, settings
        self.max_positions = engine.max_positions

    def generate(self, sources: list[list[int]], **options: object) -> list[list[int]]:
        return self.engine.generate(sources, **{**options, **self.settings})


def quality_section(model_dir: str, threads: int, samples: int | None, log: Callable[[str], None],
                    batch_size: int = 16) -> dict[str, object]:
    """BLEU / chrF of a trained model on the embedded test set through every engine that can run it (beam 4,
    `deepnmt translate`'s batching), the share of outputs identical to our float32 `generate`, and the largest
    score difference.

    The exports of `EXPORTS` whose format can express the model (`hf_deepnmt.export.export_blockers` empty; the others
    are listed under ``not_exported``): every one for a standard Transformer, ONNX fp32 / int8 only for dou2018's
    mechanisms or DTMT. The torch rows that only serve CTranslate2 — ``ours_early_stopping`` (the search CTranslate2
    runs) and ``ours_bf16`` — and CTranslate2's teacher-forced scores come with the CTranslate2 exports. ONNX
    Runtime's logits are checked teacher-forced through `OnnxSeq2SeqLM.forward` against the torch model's."""
    import numpy as np
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_deepnmt.export import TorchEngine, export_blockers, export_model, load_engine
    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.metrics import score_translations
    from hf_deepnmt_training.recipes import resolve_path
    from hf_deepnmt_training.translate import translate_sentences

    torch.set_num_threads(threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    corpus = read_parallel_file(resolve_path("corpus:web-sparv/test.jsonl.gz"), "en", "es", samples)
    blockers = {fmt: export_blockers(model.config, fmt) for fmt in dict.fromkeys(f for f, _ in EXPORTS.values())}
    exported = [name for name, (fmt, _) in EXPORTS.items() if not blockers[fmt]]
    result: dict[str, object] = {"model_dir": str(model_dir), "model_type": model.config.model_type,
                                 "sentences": len(corpus.sources), "num_beams": 4, "batch_size": batch_size,
                                 "threads": threads, "engines": {}}
    if any(blockers.values()):
        result["not_exported"] = {fmt: reasons for fmt, reasons in blockers.items() if reasons}
    with tempfile.TemporaryDirectory(prefix="deepnmt_quality_") as scratch:
        folders = {}
        for name in exported:
            log(f"engine_quality: exporting {name}")
            folders[name] = Path(scratch) / name
            export_model(model, tokenizer, folders[name], *EXPORTS[name])
        engines = {"ours": TorchEngine(model)}
        if "ct2_fp32" in exported:
            engines["ours_early_stopping"] = _WithSettings(TorchEngine(model), early_stopping=True)
            engines["ours_bf16"] = TorchEngine(model, bf16=True)
        for name, folder in folders.items():
            engines[name] = load_engine(folder, EXPORTS[name][0], intra_threads=threads)
        outputs = {}
        for name, engine in engines.items():
            log(f"engine_quality: translating {len(corpus.sources)} sentences with {name}")
            start = time.perf_counter()
            outputs[name] = translate_sentences(engine, tokenizer, corpus.sources, num_beams=4, batch_size=batch_size,
                                                progress=False)
            seconds = time.perf_counter() - start
            scores = score_translations(outputs[name], corpus.targets)
            result["engines"][name] = {"bleu": scores.bleu, "chrf": scores.chrf, "seconds": seconds,
                                       "signature": scores.signatures["bleu"]}
        for name in engines:
            entry = result["engines"][name]
            for reference in ("ours", "ours_early_stopping"):
                if reference in engines:
                    same = sum(a == b for a, b in zip(outputs[name], outputs[reference]))
                    entry[f"identical_to_{reference}"] = same / len(corpus.sources)
        pairs = [(s, t) for s, t in zip(corpus.sources, corpus.targets) if s.strip() and t.strip()][:64]
        sources = tokenizer([s for s, _ in pairs])["input_ids"]
        targets = tokenizer(text_target=[t for _, t in pairs])["input_ids"]
        start_token = model.config.decoder_start_token_id
        if "ct2_fp32" in engines:
            # the scores CTranslate2 exposes (teacher-forced log-probabilities of the references) vs our log-softmax
            differences = []
            for source, target, scores in zip(sources, targets, engines["ct2_fp32"].score(sources, targets)):
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([source]),
                                   decoder_input_ids=torch.tensor([[start_token, *target[:-1]]])).logits
                ours = logits.log_softmax(-1)[0, torch.arange(len(target)), torch.tensor(target)].numpy()
                differences.append(float(np.abs(np.array(scores) - ours).max()))
            result["ct2_fp32_max_abs_logprob_diff"] = max(differences)
            result["score_pairs"] = len(pairs)
        if "onnx_fp32" in engines:
            # ONNX Runtime's logits, teacher-forced (`OnnxSeq2SeqLM.forward` runs the decoder graph step by step), vs
            # the torch model's
            onnx_model = engines["onnx_fp32"].model
            differences = []
            for source, target in list(zip(sources, targets))[:16]:
                inputs = dict(input_ids=torch.tensor([source]),
                              decoder_input_ids=torch.tensor([[start_token, *target[:-1]]]))
                with torch.no_grad():
                    theirs, ours = onnx_model(**inputs).logits[0], model(**inputs).logits[0]
                differences.append(float((theirs - ours).abs().max()))
            result["onnx_fp32_max_abs_logit_diff"] = max(differences)
            result["logit_pairs"] = len(differences)
    return result


def bf16_training(threads: int, tokens: int, repeats: int) -> dict[str, object]:
    """A 6-6 d512 training step (forward, backward, AdamW) in float32 vs under bf16 autocast, interleaved, and the
    loss of one batch (eval mode) in both precisions."""
    from .measure import training_step

    torch.set_num_threads(threads)
    batch = synthetic_batch(tokens=tokens, seed=0)
    fp32 = build_ours(model_dims("d512"))
    bf16 = build_ours(model_dims("d512"))
    bf16.load_state_dict(fp32.state_dict())
    steps = {"fp32": training_step(fp32, batch)}
    bf16_step = training_step(bf16, batch)

    def autocast_step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16_step()

    steps["bf16"] = autocast_step
    times = interleaved(steps, repeats=repeats, warmup=1)
    reference = build_ours(model_dims("d512")).eval()
    with torch.no_grad():
        loss_fp32 = float(reference(**batch.as_kwargs()).loss)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_bf16 = float(reference(**batch.as_kwargs()).loss)
    return {"target_tokens": batch.target_tokens, "threads": threads, "seconds": times,
            "median_s": {name: median(values) for name, values in times.items()},
            "loss_fp32": loss_fp32, "loss_bf16": loss_bf16}


# aten kernels that do the matrix products of a decoding step (projections, FFN, output layer, attention)
MATRIX_KERNELS = ("aten::addmm", "aten::mm", "aten::bmm", "aten::_scaled_dot_product_flash_attention_for_cpu")


def decode_limits(threads: int, label: str, new_tokens: int, repeats: int) -> dict[str, object]:
    """How fast can our torch ``generate`` get, at most, on this CPU in float32? For the ``label`` model of the
    engines section, beam 4, each batch of `BATCHES`: Marian's and our time (interleaved), the self time of the
    matrix-product kernels in one profiled call of ours (`MATRIX_KERNELS`), and the FLOPs of one call
    (FlopCounterMode). Two ceilings on ours / Marian follow: with the same kernels (everything but the matrix
    products removed: Marian time / matrix-kernel time) and at the machine's fp32 matmul peak (Marian time /
    (FLOPs / peak))."""
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    from .measure import _cpu_flash_mapping

    torch.set_num_threads(threads)
    ours, marian = same_weights(label)
    peak = gemm_peaks(threads)["fp32_gflops"]
    result: dict[str, object] = {"model": label, "threads": threads, "new_tokens": new_tokens, "num_beams": 4,
                                 "fp32_peak_gflops": peak, "batches": {}}
    for batch in BATCHES:
        source = synthetic_batch(sentences=batch, seed=2)
        calls = {name: contender_call(name, source, new_tokens, threads, {"ours": ours, "marian": marian}, {})
                 for name in ("marian", "ours")}
        times = interleaved(calls, repeats=repeats, warmup=1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            calls["ours"]()
        matrix_ms = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in MATRIX_KERNELS) / 1e3
        counter = FlopCounterMode(display=False, custom_mapping=_cpu_flash_mapping())
        with counter:
            calls["ours"]()
        flops = int(counter.get_total_flops())
        marian_s, ours_s = median(times["marian"]), median(times["ours"])
        result["batches"][str(batch)] = {
            "seconds": times, "marian_s": marian_s, "ours_s": ours_s, "matrix_kernels_s": matrix_ms / 1e3,
            "flops": flops, "peak_bound_s": flops / (peak * 1e9),
            "ours_x_marian": marian_s / ours_s, "ceiling_same_kernels": marian_s / (matrix_ms / 1e3),
            "ceiling_peak": marian_s / (flops / (peak * 1e9)), "matrix_gflops": flops / (matrix_ms / 1e3) / 1e9}
    return result


STEP_LIMIT_MODELS = ("6-6 d256", "6-6 d512")
STEP_LIMIT_ROWS = {1: 4, 16: 64}  # batch -> decoder rows of a beam-4 step


def _weight_products(model: torch.nn.Module, rows: int) -> Callable[[], None]:
    """The matrix products of one decoder step with the model's own weights on ``rows`` rows, one after another and
    nothing else: per layer the self-attention's Q, K, V and output projections, the cross-attention's Q and output
    projections (its keys/values are projected once per sentence, not per step), the FFN's two; then the output
    layer. What a step would cost if everything else — attention over the cache, LayerNorms, residuals, softmax,
    the search, Python — took no time."""
    import torch.nn.functional as F

    decoder = model.get_decoder()
    layers = decoder.layers
    d_model = layers[0].fc1.in_features
    ffn = layers[0].fc1.out_features
    linears = []
    for layer in layers:
        linears += [layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.out_proj,
                    layer.encoder_attn.q_proj, layer.encoder_attn.out_proj, layer.fc1, layer.fc2]
    output = model.get_output_embeddings().weight  # (V, d)
    x, h = torch.randn(rows, d_model), torch.randn(rows, ffn)

    @torch.no_grad()
    def run() -> None:
        for linear in linears:
            F.linear(h if linear.in_features == ffn else x, linear.weight, linear.bias)
        F.linear(x, output)
    return run


def _decoder_step(model: torch.nn.Module, rows: int, past: int) -> Callable[[], None]:
    """One incremental decoder step of ``rows`` rows (each its own source of 20–40 tokens) through a cache of
    ``past`` positions, the output layer included; the cache is cut back after each call so every call is alike."""
    from hf_deepnmt.generation_common import CACHE_NAME

    source = synthetic_batch(sentences=rows, seed=3)
    with torch.no_grad():
        encoder = model.get_encoder()(input_ids=source.input_ids, attention_mask=source.attention_mask)
        prefix = torch.full((rows, past), BOS, dtype=torch.long)
        cache = model(encoder_outputs=encoder, attention_mask=source.attention_mask, decoder_input_ids=prefix,
                      use_cache=True)[CACHE_NAME]
    token = torch.full((rows, 1), FIRST_WORD_ID, dtype=torch.long)

    @torch.no_grad()
    def run() -> None:
        model(encoder_outputs=encoder, attention_mask=source.attention_mask, decoder_input_ids=token,
              use_cache=True, **{CACHE_NAME: cache})
        cache.crop(-1)
    return run


def step_limits(threads: int, repeats: int, generate_repeats: int, new_tokens: int,
                past: int = 16) -> dict[str, object]:
    """Where a beam-4 decoding step's time goes, ours beside Marian's (`STEP_LIMIT_MODELS`, the rows of batch 1 and
    16 with 4 beams): one decoder step each, and the step's weight products alone (`_weight_products`), timed
    interleaved; then both `generate` calls (beam 4, exactly ``new_tokens`` tokens), interleaved. Marian's time over
    the products alone bounds what any reduction of the rest can give ours / Marian with the same matrix kernels in
    float32: per step, and for `generate` (Marian's call over ``new_tokens`` steps of products alone — the encoder
    and the first step's cross-attention projections left out, so the true bound is lower still)."""
    torch.set_num_threads(threads)
    result: dict[str, object] = {"threads": threads, "past": past, "repeats": repeats,
                                 "generate_repeats": generate_repeats, "new_tokens": new_tokens, "models": {}}
    for label in STEP_LIMIT_MODELS:
        ours, marian = same_weights(label)
        entries = {}
        for batch, rows in STEP_LIMIT_ROWS.items():
            calls = {"marian": _decoder_step(marian, rows, past), "ours": _decoder_step(ours, rows, past),
                     "weight products": _weight_products(ours, rows)}
            times = interleaved(calls, repeats=repeats, warmup=3)
            medians = {name: median(values) for name, values in times.items()}
            source = synthetic_batch(sentences=batch, seed=2)
            generate = {name: contender_call(name, source, new_tokens, threads, {"ours": ours, "marian": marian}, {})
                        for name in ("marian", "ours")}
            generate_times = interleaved(generate, repeats=generate_repeats, warmup=1)
            generate_medians = {name: median(values) for name, values in generate_times.items()}
            entries[str(batch)] = {"rows": rows, "median_s": medians,
                                   "ours_x_marian": medians["marian"] / medians["ours"],
                                   "ceiling": medians["marian"] / medians["weight products"],
                                   "rest_ours_s": medians["ours"] - medians["weight products"],
                                   "rest_marian_s": medians["marian"] - medians["weight products"],
                                   "generate_median_s": generate_medians,
                                   "generate_ours_x_marian": generate_medians["marian"] / generate_medians["ours"],
                                   "generate_ceiling": generate_medians["marian"]
                                   / (new_tokens * medians["weight products"])}
        result["models"][label] = entries
    return result


def stock_converter_check(threads: int, label: str, new_tokens: int, repeats: int) -> dict[str, object]:
    """Is our CTranslate2 export as fast as CTranslate2's own conversion of the same weights? The ``label`` model's
    weights copied into `MarianMTModel`, converted by ``ctranslate2.converters.TransformersConverter`` (its Marian
    loader) and by `hf_deepnmt.export` from our model; both at float32 and int8, beam 4, batch 16, exactly
    ``new_tokens`` tokens, timed interleaved with `MarianMTModel.generate`. (The stock conversion starts the decoder
    from a zero embedding, Marian's convention: the same work, not the same outputs.)"""
    import ctranslate2
    from ctranslate2.converters import TransformersConverter
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    from hf_deepnmt.export import load_engine

    torch.set_num_threads(threads)
    ours, marian = same_weights(label)
    source = synthetic_batch(sentences=16, seed=2)
    ids = source_ids(source)
    vocab_size = ours.config.vocab_size
    # CTranslate2's Marian loader drops the last embedding row and expects the token "<pad>" there
    words = SyntheticTokenizer(vocab_size).convert_ids_to_tokens(list(range(vocab_size)))
    words[PAD], words[-1] = "<blank>", "<pad>"
    calls: dict[str, Callable[[], object]] = {"marian": contender_call("marian", source, new_tokens, threads,
                                                                      {"marian": marian}, {})}
    with tempfile.TemporaryDirectory(prefix="deepnmt_stock_") as scratch:
        marian.save_pretrained(Path(scratch) / "marian")
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")),
            pad_token="<pad>", eos_token="</s>", unk_token="<unk>", bos_token="<s>")
        tokenizer.save_pretrained(Path(scratch) / "marian")
        for quantization in (None, "int8"):
            suffix = quantization or "fp32"
            stock = Path(scratch) / f"stock_{suffix}"
            TransformersConverter(str(Path(scratch) / "marian")).convert(str(stock), quantization=quantization)
            translator = ctranslate2.Translator(str(stock), device="cpu", inter_threads=1, intra_threads=threads)
            batch = [[words[i] if i != len(words) - 1 else "<unk>" for i in row] for row in ids]
            calls[f"stock_ct2_{suffix}"] = lambda t=translator, b=batch: t.translate_batch(
                b, beam_size=4, max_decoding_length=new_tokens, min_decoding_length=new_tokens, max_input_length=0)
            export = export_one(ours, Path(scratch) / f"ours_{suffix}", "ctranslate2", quantization)
            engine = load_engine(export, "ctranslate2", intra_threads=threads)
            calls[f"ct2_{suffix}"] = lambda e=engine: e.generate(ids, num_beams=4, max_new_tokens=new_tokens,
                                                                 min_new_tokens=new_tokens)
        # equal work: the stock models also produce exactly new_tokens tokens
        lengths = {name: len(call()[0].hypotheses[0]) for name, call in calls.items() if name.startswith("stock")}
        times = interleaved(calls, repeats=repeats, warmup=1)
    return {"model": label, "threads": threads, "new_tokens": new_tokens, "batch": 16, "num_beams": 4,
            "stock_output_tokens": lengths, "seconds": times,
            "median_s": {name: median(values) for name, values in times.items()},
            "best_s": {name: min(values) for name, values in times.items()}}
