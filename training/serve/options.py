"""What a server was told and what it serves, decided before anything loads (and without importing torch):
`ServeOptions` (the command line, parsed by `hf_deepnmt_training.cli._serve`), the engine of each model folder
(`choose_engine`, also `deepnmt translate`'s and `deepnmt distill`'s), the number of model instances
(`default_workers`), and the models of one server with their language pairs (`plan_models`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import CommandLineError

EXPORT_MANIFEST = "deepnmt_export.json"  # hf_deepnmt.export_formats.MANIFEST, spelt here to stay torch-free
ONNX_SUBFOLDER = "onnx"  # hf_deepnmt.handler.ONNX_SUBFOLDER: where a model folder keeps its ONNX export
EXPORT_EXTRA_HINT = "pip install 'hf_deepnmt[export]'"
RETRY_AFTER_S = 1  # the Retry-After of every 503 (queue full, model loading)


@dataclass
class ServeOptions:
    """Everything `deepnmt serve` was told (`hf_deepnmt_training.cli._serve` parses and checks the command line)."""

    model: str
    engine: str | None = None  # None: the fastest the folder has (`choose_engine`)
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch_size: int = 32
    max_wait_ms: float = 10.0
    max_queue: int = 256
    max_input_tokens: int | None = None  # None: the longest source the model accepts
    threads: int | None = None  # each worker's; None: torch's default divided among the workers
    workers: int | None = None  # model instances, each running one search at a time; None: `default_workers`
    search: str = "retiring"  # torch/onnx: one retiring search over every budget, or "generate" per budget
    continuous_batching: bool = False  # sentences join a running retiring search between decoder steps
    more_models: tuple[str, ...] = ()  # further model folders: one server routes each request by language pair
    api_keys: str | None = None  # a key file (`libretranslate.read_api_keys`); None: an open server


def default_workers(engine: str, cuda: bool, threads: int | None) -> int:
    """``--workers`` when not given: two instances of the torch engine on a CPU of two or more cores (torch's thread
    count) when ``--threads`` is not given either, one thread each, the second in a worker process — a batch of a
    small model does not keep two cores busy, and two searches side by side served 1.6–1.8× the sentences per second
    of one on the 2-core CPU measured at 8 and 32 clients (docs/serving.md, "Workers"); one instance otherwise (a GPU,
    an export engine, or threads the user chose)."""
    if engine != "torch" or cuda or threads:
        return 1
    import torch

    return 2 if torch.get_num_threads() >= 2 else 1


def choose_engine(folder: str | os.PathLike, requested: str | None, cuda: bool = False,
                  command: str = "serve") -> tuple[str, Path]:
    """The engine that serves ``folder`` and the folder it loads, without importing torch (``deepnmt serve`` and
    ``deepnmt translate``; ``command`` names the command in the messages).

    A `deepnmt export` folder is served by its own format's engine (a Marian export by torch); a model folder by
    torch, or by ONNX Runtime when it holds an ONNX export in ``onnx/`` (`handler.py`'s convention) and no GPU is
    used — the same choice as the Inference Endpoints handler, ONNX int8 being the fastest CPU engine measured
    (benchmarks/RESULTS.md, "Fast inference"). ``requested`` (``--engine``) overrides it where the folder has that
    engine; otherwise one `CommandLineError` sentence says what to export.
    """
    folder = Path(folder)
    manifest = folder / EXPORT_MANIFEST
    if manifest.is_file():
        try:
            export_format = json.loads(manifest.read_text(encoding="utf-8"))["format"]
        except (ValueError, KeyError, TypeError) as error:
            raise CommandLineError(f"MODEL_DIR {folder}: {manifest.name} is not a `deepnmt export` manifest "
                                   f"({error}); export the model again.") from None
        if export_format == "argos":
            raise CommandLineError(f"{folder} holds an Argos Translate package, which argostranslate (or "
                                   f"LibreTranslate) runs; {command} the model folder it was exported from, or its "
                                   "`deepnmt export --format ctranslate2` export.")
        own = "torch" if export_format == "marian" else export_format
        if requested not in (None, own):
            raise CommandLineError(f"`--engine` = {requested!r} is not allowed for {folder}, a {export_format} "
                                   f"export; use --engine {own}, or {command} the model folder it was exported from.")
        return own, folder
    export = folder / ONNX_SUBFOLDER
    has_onnx = (export / EXPORT_MANIFEST).is_file()
    if requested == "onnx":
        if not has_onnx:
            raise CommandLineError(f"`--engine` = 'onnx' needs an ONNX export, and {folder} has none in "
                                   f"{ONNX_SUBFOLDER}/; make one with `deepnmt export --format onnx {folder} "
                                   f"{export}` (add --quantization int8 for the fastest CPU engine).")
        return "onnx", export
    if requested == "ctranslate2":
        raise CommandLineError(f"`--engine` = 'ctranslate2' serves a CTranslate2 export folder, and {folder} is a "
                               f"model folder; run `deepnmt export --format ctranslate2 {folder} OUT` and {command} OUT.")
    if requested is None and has_onnx and not cuda:
        return "onnx", export
    return "torch", folder



@dataclass(frozen=True)
class ServedModel:
    """One model of a server: the folder given, its engine, the folder that engine loads, its language pair."""

    given: str
    engine: str
    folder: Path
    pair: tuple[str, str] | None


def plan_models(folders: Sequence[str], engine: str | None, cuda: bool) -> list[ServedModel]:
    """Each folder's engine and recorded pair; one `CommandLineError` sentence when several models are served and one
    records no single pair (requests are routed by pair), or when two record the same pair."""
    from ..arguments import saved_language_pairs

    models = []
    for given in folders:
        chosen, folder = choose_engine(given, engine, cuda)
        pairs = saved_language_pairs(given) or []
        if len(folders) > 1 and len(pairs) != 1:
            what = f"records {len(pairs)} language pairs ({describe_pairs(pairs)})" if pairs else \
                "records no language pair"
            raise CommandLineError(f"MODEL_DIR {given} {what}, and a server of several models routes each request by "
                                   "its pair, so each model must record exactly one; record it "
                                   "(hf_deepnmt.record_language_pair, or train with --source_lang/--target_lang) or "
                                   "serve this model alone.")
        models.append(ServedModel(given, chosen, folder, pairs[0] if len(pairs) == 1 else None))
    seen: dict[tuple[str, str], str] = {}
    for model in models:
        if model.pair is not None and model.pair in seen:
            raise CommandLineError(f"MODEL_DIR {seen[model.pair]} and {model.given} both translate "
                                   f"{describe_pairs([model.pair])}; a server takes one model per language pair, so "
                                   "serve one of them.")
        if model.pair is not None:
            seen[model.pair] = model.given
    return models



def describe_pairs(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{source} → {target}" for source, target in pairs) or "no language pair"

