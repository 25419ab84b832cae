"""Section ``serve`` of ``python -m benchmarks.run``: `deepnmt serve` under load, dynamic batching vs one sentence
per `generate` call.

    python -m benchmarks.run --sections serve --model-dir runs/quickstart --merge
    python -m benchmarks.run --sections serve --quick --out-dir runs/serve-smoke   # smoke run, a random tiny model

For each engine — torch (the model folder) and ONNX Runtime int8 (``deepnmt export --format onnx --quantization
int8``, into a temporary folder) — and each server setting — dynamic batching (``--max_batch_size 32``, the
default, whose torch and ONNX engines decode every budget in one retiring search), the same with ``--search generate``
(one transformers ``generate`` call per budget; not for CTranslate2), the same with ``--continuous_batching`` (torch
only), the baseline ``--max_batch_size 1``, and (torch only) dynamic batching and the baseline with ``--workers 2`` (two
model instances decoding two batches at once) — one
`deepnmt serve` process on a free loopback port
(127.0.0.1 only), ``--threads`` = the harness' ``--engine-threads``; against it, 1, 8 and 32 concurrent clients, each
a keep-alive HTTP/1.1 connection sending its next request as soon as the last is answered, share a bounded list of
requests: ``serve_requests`` (2,000; quick: 40) of 1–3 consecutive verses of the embedded test set
(``corpus:web-sparv/test.jsonl.gz``, English), ``{"inputs": [...]}`` with the model's own generation settings
(beam 4 for a model of `deepnmt train`), stopping early after ``serve_time_limit_s`` (300 s; quick: 30 s) per client
count. ``--serve-requests`` and ``--serve-time-limit-s`` of the harness change both. Each cell:
sentences/s (sentences answered / wall time), p50 / p99 request latency, errors (non-200 answers and broken
connections: must be 0), the mean batch the server ran and, with continuous batching, the mean sentences per decoder
step (its /metrics). Goal (issue 38): at 32 clients dynamic
batching ≥ 3× the baseline's sentences/s with p99 < 2 s, for the quickstart model.

The clients run in this process (asyncio, one thread) beside the server: on a small machine they take some CPU from
it, equally in every cell. Without ``--model-dir`` a full run stops with the command that makes the quickstart model;
a ``--quick`` run builds a random tiny model instead (its translations run to ``max_new_tokens`` = 8: a smoke test of
the harness, not a measurement).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINES = {"torch": "torch (the model folder)", "onnx_int8": "ONNX Runtime int8",
           "ctranslate2_int8": "CTranslate2 int8 (a standard Transformer only)"}
# Each server setting: its --max_batch_size, --search and --workers. "dynamic" is the default batching with one
# worker; "dynamic_generate" the same with one transformers `generate` call per new-token budget (the server before
# the retiring search); "dynamic_continuous" the default with --continuous_batching (the torch engine only:
# sentences join the running search between decoder steps); "dynamic_workers2" two model instances decoding two
# batches at once (the torch engine only; each with the harness' threads), against "baseline_workers2", the same
# server with batches of one sentence.
SETTINGS = {"dynamic": (32, "retiring", 1), "dynamic_generate": (32, "generate", 1),
            "dynamic_continuous": (32, "continuous", 1), "baseline": (1, "retiring", 1),
            "dynamic_workers2": (32, "retiring", 2), "baseline_workers2": (1, "retiring", 2)}
# (dynamic setting, its baseline) whose ratio the goal is read on
GOAL_PAIRS = (("dynamic", "baseline"), ("dynamic_workers2", "baseline_workers2"))
GOAL_SPEEDUP, GOAL_P99_S, GOAL_CLIENTS = 3.0, 2.0, 32
QUICKSTART_COMMAND = "deepnmt quickstart --output_dir runs/quickstart"


def test_set_requests(count: int, seed: int = 0) -> list[list[str]]:
    """``count`` requests of 1–3 consecutive English verses of the embedded test set (seeded, cycling)."""
    return language_requests(count, "en", seed)


# ------------------------------------------------------------------------------------------------ the server
class ServerProcess:
    """`python -m hf_deepnmt_training.cli serve FOLDER --port 0 ...` with its port read from its log."""

    def __init__(self, folder: Path | Sequence[Path], max_batch_size: int, threads: int, timeout_s: float = 300,
                 search: str = "retiring", workers: int = 1) -> None:
        folders = [str(folder)] if isinstance(folder, (str, Path)) else [str(each) for each in folder]
        command = [sys.executable, "-m", "hf_deepnmt_training.cli", "serve", *folders, "--host", "127.0.0.1", "--port", "0",
                   "--threads", str(threads), "--max_batch_size", str(max_batch_size), "--workers", str(workers),
                   *(["--search", "retiring", "--continuous_batching"] if search == "continuous"
                     else ["--search", search])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        text=True)
        self.lines: list[str] = []
        self.port = 0
        listening = threading.Event()

        def read() -> None:
            for line in self.process.stderr:
                self.lines.append(line)
                match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if match:
                    self.port = int(match.group(1))
                    listening.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout_s
        if not listening.wait(timeout_s):
            self.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines[-30:]))
        while asyncio.run(get(self.port, "/health"))[0] != 200:
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("the server did not load its model:\n" + "".join(self.lines[-30:]))
            time.sleep(0.1)

    def metrics(self) -> dict[str, float]:
        status, body = asyncio.run(get(self.port, "/metrics"))
        samples: dict[str, float] = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                # the server labels its series by model and route: summed over both, `name{...}` keeps the others
                base, _, labels = name.partition("{")
                kept = [label for label in labels.rstrip("}").split(",")
                        if label and not label.startswith(("model=", "route="))]
                key = f"{base}{{{','.join(kept)}}}" if kept else base
                samples[key] = samples.get(key, 0.0) + float(value)
        return samples

    def stop(self) -> int:
        """SIGTERM (graceful: every request in flight answered); the exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


# ------------------------------------------------------------------------------------------------ the clients
async def _send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, method: str, path: str,
                body: bytes = b"") -> tuple[int, bytes, bool]:
    """One HTTP/1.1 request on a keep-alive connection: status, body, whether the server keeps the connection."""
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("the server closed the connection")
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    payload = await reader.readexactly(int(headers.get("content-length", 0)))
    return int(status_line.split()[1]), payload, headers.get("connection", "").lower() != "close"


async def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, b""
    try:
        status, body, _ = await _send(reader, writer, "GET", path)
        return status, body
    finally:
        writer.close()


async def load(port: int, requests: Sequence[list[str]], clients: int, time_limit_s: float,
               parameters: dict[str, object], routes: Sequence[str] | None = None,
               route_parameters: dict[str, dict[str, object]] | None = None) -> dict[str, object]:
    """``clients`` connections send ``requests`` (each the next one not yet taken) until none is left or
    ``time_limit_s`` has passed; what they measured. ``routes``: a name per request (a language pair) whose
    ``route_parameters`` join ``parameters``; the result then has a ``per_route`` entry of each one's figures."""
    latencies: list[float] = []
    sentences, errors, broken = 0, 0, 0
    by_route: dict[str, dict[str, list]] = {}
    next_index = 0
    started = time.perf_counter()

    async def client() -> None:
        nonlocal next_index, sentences, errors, broken
        connection = None
        while next_index < len(requests) and time.perf_counter() - started < time_limit_s:
            texts, route = requests[next_index], routes[next_index] if routes else None
            next_index += 1
            sent_parameters = {**parameters, **((route_parameters or {}).get(route) or {})}
            body = json.dumps({"inputs": texts, **({"parameters": sent_parameters} if sent_parameters else {})}).encode()
            sent = time.perf_counter()
            try:
                if connection is None:
                    connection = await asyncio.open_connection("127.0.0.1", port)
                status, payload, keep = await _send(*connection, "POST", "/", body)
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                broken += 1
                connection = None
                continue
            latencies.append(time.perf_counter() - sent)
            answer = json.loads(payload) if status == 200 else None
            mine = by_route.setdefault(route, {"latencies": [], "sentences": [0], "errors": [0]}) if routes else None
            if mine is not None:
                mine["latencies"].append(latencies[-1])
            if status == 200 and isinstance(answer, list) and len(answer) == len(texts):
                sentences += len(texts)
                if mine is not None:
                    mine["sentences"][0] += len(texts)
            else:
                errors += 1
                if mine is not None:
                    mine["errors"][0] += 1
            if not keep:
                connection[1].close()
                connection = None
        if connection is not None:
            connection[1].close()

    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - started
    ordered = sorted(latencies)

    def quantile(q: float) -> float | None:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None

    result = {"clients": clients, "requests": len(latencies) + broken, "sentences": sentences, "wall_s": wall,
              "sentences_per_s": sentences / wall if wall else 0.0, "p50_s": quantile(0.5), "p99_s": quantile(0.99),
              "mean_s": statistics.fmean(latencies) if latencies else None, "errors": errors + broken,
              "time_limited": len(latencies) + broken < len(requests)}
    if routes:
        result["per_route"] = {}
        for route, mine in by_route.items():
            ordered_route = sorted(mine["latencies"])
            result["per_route"][route] = {
                "requests": len(ordered_route), "sentences": mine["sentences"][0], "errors": mine["errors"][0],
                "sentences_per_s": mine["sentences"][0] / wall if wall else 0.0,
                "p50_s": ordered_route[len(ordered_route) // 2] if ordered_route else None,
                "p99_s": ordered_route[min(len(ordered_route) - 1, int(0.99 * len(ordered_route)))]
                if ordered_route else None}
    return result


# ------------------------------------------------------------------------------------------------ the section
def random_model(folder: Path) -> None:
    """The quick run's stand-in: translate_memory's random 2+2-layer d_model 64 model with a joint BPE."""
    from .translate_memory import build_model

    build_model(folder)


def serve_section(model_dir: str | None, threads: int, requests: int, clients: Sequence[int], time_limit_s: float,
                  quick: bool, log: Callable[[str], None], engines: Sequence[str] | None = None,
                  previous: dict[str, object] | None = None) -> dict[str, object]:
    """Every (engine, server setting, client count) cell; see the module docstring. ``engines``: the subset of
    `ENGINES` to measure (default: all the model can run; CTranslate2 needs a standard Transformer); ``previous``: a
    serve section measured before with the same model, threads, requests, clients and time limit, whose other
    engines' cells are kept."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_deepnmt.export import export_model
    from hf_deepnmt.export_formats import export_blockers

    workload = test_set_requests(requests)
    with tempfile.TemporaryDirectory(prefix="deepnmt_serve_bench_") as scratch:
        parameters: dict[str, object] = {}
        if model_dir is None:
            if not quick:
                raise SystemExit(f"--sections serve needs --model-dir (a trained model folder; the issue's goal is for "
                                 f"the quickstart model: `{QUICKSTART_COMMAND}`), or --quick for a smoke run.")
            model_dir = str(Path(scratch) / "random-model")
            log("serve: no --model-dir, a random tiny model (smoke run)")
            random_model(Path(model_dir))
            parameters = {"max_new_tokens": 8}
        model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
        wanted = list(engines or ENGINES)
        unknown = [engine for engine in wanted if engine not in ENGINES]
        if unknown:
            raise SystemExit(f"--serve-engines {','.join(unknown)} is not allowed; use some of {','.join(ENGINES)}")
        folders = {"torch": Path(model_dir)}
        for engine, export_format in (("onnx_int8", "onnx"), ("ctranslate2_int8", "ctranslate2")):
            if engine not in wanted:
                continue
            blockers = export_blockers(model.config, export_format)
            if blockers:
                log(f"serve: {engine} skipped: {blockers[0]}")
                continue
            folders[engine] = Path(scratch) / engine
            log(f"serve: exporting {model_dir} to {export_format} int8")
            export_model(model, tokenizer, folders[engine], export_format, "int8")
        folders = {engine: folder for engine, folder in folders.items() if engine in wanted}
        layouts = search_layouts(model, tokenizer, workload, threads, log) if "torch" in folders else None
        result: dict[str, object] = {
            "model_dir": str(model_dir), "threads": threads, "requests": requests, "clients": list(clients),
            "time_limit_s": time_limit_s, "parameters": parameters,
            "max_batch_size": {name: size for name, (size, _, _) in SETTINGS.items()},
            "search": {name: search for name, (_, search, _) in SETTINGS.items()},
            "workers": {name: workers for name, (_, _, workers) in SETTINGS.items()},
            "sentences_in_workload": sum(map(len, workload)), "runs": {}}
        same = ("model_dir", "threads", "requests", "clients", "time_limit_s", "parameters")
        settings_kept = previous and all(  # every setting of the earlier run is still one (same flags)
            result[key].get(name) == value for key in ("max_batch_size", "search")
            for name, value in previous.get(key, {}).items())
        if previous and settings_kept and all(previous.get(key) == result[key] for key in same):
            result["runs"] = {engine: cells for engine, cells in previous["runs"].items() if engine not in folders}
            if result["runs"]:
                log(f"serve: keeping the earlier cells of {', '.join(result['runs'])}")
                kept = previous.get("kept") or {**previous.get("measured_by", {}), "engines": list(result["runs"])}
                result["kept"] = {**kept, "engines": list(result["runs"])}
        for engine, folder in folders.items():
            for setting, (max_batch_size, search, workers) in SETTINGS.items():
                if engine.startswith("ctranslate2") and search != "retiring":
                    continue  # CTranslate2 has its own search: --search changes nothing there
                if (search == "continuous" or workers > 1) and engine != "torch":
                    continue  # only the torch Transformer takes sentences into a running search; workers: torch's
                log(f"serve: {engine}, {setting} (--max_batch_size {max_batch_size} --search {search} --workers "
                    f"{workers}): starting the server")
                server = ServerProcess(folder, max_batch_size, threads, search=search, workers=workers)
                try:
                    asyncio.run(load(server.port, workload[:4], 1, 60, parameters))  # warm-up
                    cells = {}
                    for count in clients:
                        before = server.metrics()
                        log(f"serve: {engine}, {setting}, {count} clients, {requests} requests")
                        cell = asyncio.run(load(server.port, workload, count, time_limit_s, parameters))
                        after = server.metrics()
                        batches = after["deepnmt_batches_total"] - before["deepnmt_batches_total"]
                        cell["mean_batch"] = ((after["deepnmt_batch_size_sentences_sum"]
                                               - before["deepnmt_batch_size_sentences_sum"]) / batches
                                              if batches else None)
                        steps = (after.get("deepnmt_search_size_sentences_count", 0)
                                 - before.get("deepnmt_search_size_sentences_count", 0))
                        cell["mean_search"] = ((after.get("deepnmt_search_size_sentences_sum", 0)
                                                - before.get("deepnmt_search_size_sentences_sum", 0)) / steps
                                               if steps else None)
                        cells[str(count)] = cell
                        log(f"serve: {engine}, {setting}, {count} clients: {cell['sentences_per_s']:.1f} sentences/s, "
                            f"p50 {cell['p50_s']:.3f} s, p99 {cell['p99_s']:.3f} s, {cell['errors']} errors, "
                            f"mean batch {cell['mean_batch'] or 0:.1f}")
                finally:
                    status = server.stop()
                cells["exit_status"] = status
                result["runs"].setdefault(engine, {})[setting] = cells
        result["goal"] = goal(result)
        if layouts:
            result["search_layouts"] = layouts
    return result


# The decoding state layouts of one retiring search, each switched off in turn (docs/transformer.md, "Caches"):
# (the source once per sentence, the self-attention reorder deferred to the next append).
SEARCH_LAYOUTS = {"per beam (transformers' layout)": (False, False), "source once per sentence": (True, False),
                  "source once per sentence + deferred reorder": (True, True)}


def search_layouts(model, tokenizer, workload: Sequence[Sequence[str]], threads: int, log: Callable[[str], None],
                   sentences: int = 32, repeats: int = 5) -> dict[str, object] | None:
    """One retiring search over the workload's first ``sentences`` sentences (the model's own settings, each its
    own new-token budget, as the server decodes a full batch), timed in each `SEARCH_LAYOUTS` layout: interleaved
    medians, and whether every layout gives the same translations. None for a model without these layouts."""
    import torch

    from hf_deepnmt.pipeline_translation import new_token_budget
    from hf_deepnmt.retiring_search import retiring_generate, search_settings

    from .common import interleaved, median

    if not hasattr(model, "beam_search_cache") or int(model.generation_config.num_beams or 1) < 2:
        return None
    texts = [text for request in workload for text in request][:sentences]
    batch = tokenizer(texts, return_tensors="pt", padding=True, truncation=True)
    limit = int(model.config.max_position_embeddings)
    budgets = [new_token_budget(int(length), limit) for length in batch["attention_mask"].sum(-1)]
    settings = search_settings(model, {})
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    model.eval()

    def layout(shared: bool, deferred: bool) -> Callable[[], list]:
        def run() -> list:
            model.beams_share_memory = shared  # instance attributes over the class's
            model.beam_search_cache = (lambda: type(model).beam_search_cache(model)) if deferred else (lambda: None)
            try:
                return retiring_generate(model, batch["input_ids"], batch["attention_mask"], budgets, settings)
            finally:
                del model.beams_share_memory, model.beam_search_cache
        return run

    runs = {name: layout(*switches) for name, switches in SEARCH_LAYOUTS.items()}
    log(f"serve: one retiring search over {len(texts)} sentences in {len(runs)} state layouts, {repeats} rounds")
    outputs = {name: [hypotheses.sequences.tolist() for hypotheses in run()] for name, run in runs.items()}
    times = interleaved(runs, repeats=repeats, warmup=0)
    torch.set_num_threads(previous_threads)
    medians = {name: median(values) for name, values in times.items()}
    first = next(iter(medians))
    return {"sentences": len(texts), "threads": threads, "repeats": repeats, "median_s": medians,
            "speedup": {name: medians[first] / value for name, value in medians.items()},
            "same_translations": all(output == outputs[first] for output in outputs.values())}


def goal(result: dict[str, object]) -> dict[str, dict[str, object]]:
    """Per engine at `GOAL_CLIENTS` clients: dynamic / baseline sentences/s, dynamic p99 and the errors of all its
    runs, against the goal (≥ `GOAL_SPEEDUP`×, p99 < `GOAL_P99_S` s, no error)."""
    verdicts = {}
    for engine, runs in result["runs"].items():
        for dynamic_name, baseline_name in GOAL_PAIRS:
            dynamic = runs.get(dynamic_name, {}).get(str(GOAL_CLIENTS))
            baseline = runs.get(baseline_name, {}).get(str(GOAL_CLIENTS))
            if not dynamic or not baseline:
                continue
            speedup = (dynamic["sentences_per_s"] / baseline["sentences_per_s"] if baseline["sentences_per_s"]
                       else None)
            errors = sum(cell["errors"] for setting in runs.values() for key, cell in setting.items()
                         if key != "exit_status")
            name = engine if dynamic_name == "dynamic" else f"{engine}, {dynamic_name}"
            verdicts[name] = {"speedup": speedup, "p99_s": dynamic["p99_s"], "errors": errors,
                              "met": bool(speedup and speedup >= GOAL_SPEEDUP and dynamic["p99_s"] is not None
                                          and dynamic["p99_s"] < GOAL_P99_S and errors == 0)}
    return verdicts


# ------------------------------------------------------------------------------------------------ several models
def recorded_pair(folder: str | Path) -> tuple[str, str]:
    """The one ``(source, target)`` a saved model folder records (`record_language_pair`)."""
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    pairs = [name.removeprefix("translation_").split("_to_") for name in config.get("task_specific_params") or {}
             if name.startswith("translation_") and "_to_" in name]
    if len(pairs) != 1:
        raise SystemExit(f"--model-dir {folder} records {len(pairs)} language pairs; serve_mixed needs one each.")
    return pairs[0][0], pairs[0][1]


def language_requests(count: int, language: str, seed: int = 0) -> list[list[str]]:
    """``count`` requests of 1–3 consecutive verses of the embedded test set in ``language`` (seeded, cycling)."""
    from hf_deepnmt_training.corpus import corpus_dir

    with gzip.open(corpus_dir() / "test.jsonl.gz", "rt", encoding="utf-8") as handle:
        verses = [json.loads(line)["translation"][language] for line in handle]
    rng = random.Random(seed)
    requests, position = [], 0
    for _ in range(count):
        size = rng.randint(1, 3)
        requests.append([verses[(position + i) % len(verses)] for i in range(size)])
        position += size
    return requests


def mixed_section(model_dirs: Sequence[str], threads: int, requests: int, clients: int, time_limit_s: float,
                  log: Callable[[str], None], workers: int = 1) -> dict[str, object]:
    """Section ``serve_mixed`` (issue 62): several models behind one `deepnmt serve`, each request routed by the
    language pair its parameters name (``src_lang`` / ``tgt_lang``), against each model alone in a server of the same
    flags (``--threads``, ``--workers``, ``--max_batch_size 32``). Alone: ``requests`` requests of 1–3 test verses
    in the model's source language; mixed: all of them, shuffled (seeded), so each model gets the same requests as
    alone. ``clients`` connections; per model sentences/s, p50 and p99 in both, and the whole."""
    pairs = {str(folder): recorded_pair(folder) for folder in model_dirs}
    names = {folder: f"{source}-{target}" for folder, (source, target) in pairs.items()}
    workloads = {folder: language_requests(requests, pairs[folder][0], seed=index)
                 for index, folder in enumerate(pairs)}
    route_parameters = {names[folder]: {"src_lang": source, "tgt_lang": target}
                        for folder, (source, target) in pairs.items()}
    result: dict[str, object] = {"models": {names[folder]: folder for folder in pairs}, "threads": threads,
                                 "workers": workers, "max_batch_size": 32, "requests_per_model": requests,
                                 "clients": clients, "time_limit_s": time_limit_s, "alone": {}, "mixed": None}

    def serve(folders: Sequence[str], requests_: list[list[str]], routes: list[str]) -> dict[str, object]:
        server = ServerProcess([Path(folder) for folder in folders], 32, threads, workers=workers)
        try:
            warm = [(text, route) for text, route in zip(requests_, routes)][:4 * len(folders)]
            asyncio.run(load(server.port, [text for text, _ in warm], 1, 60, {}, [route for _, route in warm],
                             route_parameters))
            cell = asyncio.run(load(server.port, requests_, clients, time_limit_s, {}, routes, route_parameters))
        finally:
            cell_status = server.stop()
        cell["exit_status"] = cell_status
        return cell

    for folder in pairs:
        log(f"serve_mixed: {names[folder]} alone, {clients} clients, {requests} requests")
        cell = serve([folder], workloads[folder], [names[folder]] * requests)
        result["alone"][names[folder]] = cell
        log(f"serve_mixed: {names[folder]} alone: {cell['sentences_per_s']:.2f} sentences/s, p99 {cell['p99_s']:.2f} s, "
            f"{cell['errors']} errors")
    tagged = [(request, names[folder]) for folder in pairs for request in workloads[folder]]
    random.Random(0).shuffle(tagged)
    log(f"serve_mixed: {', '.join(names.values())} in one server, {clients} clients, {len(tagged)} requests")
    cell = serve(list(pairs), [request for request, _ in tagged], [route for _, route in tagged])
    result["mixed"] = cell
    for route, figures in cell["per_route"].items():
        log(f"serve_mixed: {route} mixed: {figures['sentences_per_s']:.2f} sentences/s, p99 {figures['p99_s']:.2f} s, "
            f"{figures['errors']} errors")
    return result

