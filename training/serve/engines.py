"""`deepnmt serve`: a self-hosted HTTP translation server with dynamic batching (docs/serving.md).

    deepnmt serve runs/my-model                      # http://127.0.0.1:8000, the fastest engine the folder has
    curl -s localhost:8000/ -d '{"inputs": "Let there be light.", "parameters": {"num_beams": 4}}'
    # [{"translation_text": "Sea la luz."}]

Routes: ``POST /`` and ``POST /predict`` take the Inference Endpoints payload ``{"inputs": str | list[str],
"parameters": {...}}`` and answer what the folder's translation pipeline (and ``handler.py``) answer;
``GET /health`` is 200 once the model is loaded and 503 before; ``GET /metrics`` is Prometheus' text format
(prometheus_client, labelled by model and route); ``POST /translate``, ``POST /detect``, ``GET|POST /languages`` and
``GET /frontend/settings`` are LibreTranslate's API (`serve_libretranslate`).

Several model folders make one server of several language pairs (`Service`): each model keeps its own `ServerState`
(batcher, workers, metrics label) and a request goes to the model of the pair it names (``parameters.src_lang`` /
``tgt_lang``, or LibreTranslate's ``source`` / ``target``). ``--api_keys`` closes the translation routes to requests
without one of the file's keys (403) and limits each key's requests per minute (429).

How a request is served:

* the event loop checks the request (`hf_deepnmt.handler.check_request`, then the parameters: names, types, values)
  and tokenizes each text with the pipeline's own ``preprocess``; a text over ``--max_input_tokens`` is refused
  with 413 (the server never truncates); a request that does not fit in the queue gets 503 with ``Retry-After``;
* its sentences join the queue of their *generation parameters*: requests with different parameters are never
  decoded in one call. When the request sets no length, each text has its own *new-token budget* (1.5 × the source
  + 10, `hf_deepnmt.pipeline_translation.new_token_budget`, as every decoding path of the package gives a text);
  the torch and ONNX engines decode texts of every budget in one search that retires each sentence from the batch
  once it is done (`hf_deepnmt.retiring_search`, ``generate``'s results; ``--search retiring``, the default), and
  otherwise (``--search generate``, CTranslate2, settings that search does not take) the queue is also per budget,
  so that a batch is one `generate` call whose length its sentences' own budget bounds;
* `Batcher` hands each free worker thread (``--workers``, each with its own model instance) one batch: the oldest
  waiting sentence's parameters, as soon as
  ``--max_batch_size`` sentences of them wait or the oldest has waited ``--max_wait_ms`` (meanwhile, a full batch of
  other parameters goes first); when more wait than fit,
  the batch is, for one retiring search, the oldest requests' sentences (whole requests), else the
  ``--max_batch_size`` sentences closest in length that include the oldest (length-sorted batches
  pad least, and no sentence waits behind newer ones forever);
* the worker pads the batch with the pipeline's collate function, runs the retiring search (or the pipeline's
  ``forward``, `generate`) and the pipeline's ``postprocess``, and the results go back to their requests; a request whose client has gone is taken out of the
  queue; an exception fails the requests of that batch only (500; 400 for a user's mistake) and the server goes on.

SIGTERM or SIGINT: uvicorn stops accepting connections, every request in flight is answered, then the process exits
with status 0. Only the standard library is imported at module level: starlette, uvicorn, prometheus_client and
lingua (the ``serve`` extra), torch and the model load when the server starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib.util
import json
import logging
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from queue import SimpleQueue
from typing import Any, Protocol

from ..errors import CommandLineError

logger = logging.getLogger("deepnmt.serve")

EXPORT_MANIFEST = "deepnmt_export.json"  # hf_deepnmt.export_formats.MANIFEST, spelt here to stay torch-free
ONNX_SUBFOLDER = "onnx"  # hf_deepnmt.handler.ONNX_SUBFOLDER: where a model folder keeps its ONNX export
EXPORT_EXTRA_HINT = "pip install 'hf_deepnmt[export]'"
RETRY_AFTER_S = 1  # the Retry-After of every 503 (queue full, model loading)

# The parameters a request may give, with their JSON types: the translation pipeline's own (languages, decoding
# spaces) and `generate`'s arguments that are plain values. Anything else is refused with 400 (an unknown name
# would otherwise reach `generate`, which refuses it with a transformers message, or silently ignores it).
PIPELINE_PARAMETERS: dict[str, str] = {"src_lang": "string", "tgt_lang": "string",
                                       "clean_up_tokenization_spaces": "boolean"}
GENERATION_PARAMETERS: dict[str, str] = {
    "num_beams": "integer", "num_return_sequences": "integer", "max_new_tokens": "integer",
    "min_new_tokens": "integer", "max_length": "integer", "min_length": "integer", "length_penalty": "number",
    "early_stopping": "boolean or 'never'", "length_penalty_form": "string", "do_sample": "boolean",
    "temperature": "number", "top_k": "integer",
    "top_p": "number", "min_p": "number", "typical_p": "number", "repetition_penalty": "number",
    "encoder_repetition_penalty": "number", "no_repeat_ngram_size": "integer",
    "encoder_no_repeat_ngram_size": "integer",
}
# CTranslate2Engine.generate's settings (a CTranslate2 export has no transformers model to run `generate`)
CTRANSLATE2_PARAMETERS: tuple[str, ...] = ("num_beams", "max_new_tokens", "min_new_tokens", "length_penalty",
                                           "early_stopping", "clean_up_tokenization_spaces")


# ------------------------------------------------------------------------------------------------ options, engine
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
    api_keys: str | None = None  # a key file (`serve_libretranslate.read_api_keys`); None: an open server


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


# ------------------------------------------------------------------------------------------------ translators
class InputTooLong(ValueError):
    """A text longer than ``--max_input_tokens``: the request is answered with 413."""


@dataclass(frozen=True)
class Settings:
    """A request's checked parameters. ``key`` is their canonical JSON: requests with equal keys share batches."""

    key: str
    parameters: dict[str, Any]
    num_return_sequences: int  # how many translations per text the answer holds (the pipeline's rule)
    preprocess: dict[str, Any] = field(default_factory=dict)
    forward: dict[str, Any] = field(default_factory=dict)
    postprocess: dict[str, Any] = field(default_factory=dict)
    mixes_budgets: bool = False
    """Texts of every new-token budget share a batch: the engine decodes them in one search that retires each
    sentence when it is done (`hf_deepnmt.retiring_search`; the torch and ONNX engines, for the settings it takes)."""


@dataclass
class Source:
    """One tokenized text: its length in tokens and what the engine's ``translate`` takes."""

    length: int
    inputs: Any
    budget: int | None = None
    """Its new-token budget when the request sets no length (`hf_deepnmt.pipeline_translation.new_token_budget`):
    the batcher batches texts of one budget, which the engine decodes in one call."""


def budget_of(length: int, forward: dict[str, Any], positions: int) -> int | None:
    """A source's new-token budget, or None when the request's parameters set the length themselves."""
    from hf_deepnmt.pipeline_translation import new_token_budget

    return None if {"max_new_tokens", "max_length"} & forward.keys() else new_token_budget(length, positions)


More = Callable[[int], Sequence[Source]]
"""``more(searched)``: the sources that join a running search now, given how many sentences it holds (continuous
batching: `Batcher.admit`); they take the batch's next indices."""


class Translator(Protocol):
    """What the server needs of an engine. ``prepare`` and ``encode`` run on the event loop (cheap, they raise
    `UserInputError` / `InputTooLong` sentences); ``translate`` runs on the worker thread and may hand a source's
    translations to ``deliver(i, translations)`` before the batch is over (the retiring search does), and take more
    sources between decoder steps from ``more`` (continuous batching; an engine without it ignores ``more``)."""

    engine: str
    max_input_tokens: int

    def prepare(self, parameters: dict[str, Any]) -> Settings: ...

    def encode(self, text: str, index: int, settings: Settings) -> Source: ...

    def continuous_refused(self) -> str | None: ...

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]: ...


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    return isinstance(value, bool) or value == "never"  # early_stopping


def check_parameter_types(parameters: dict[str, Any], allowed: dict[str, str], engine: str) -> None:
    """One `UserInputError` sentence for a parameter the server does not take or a value of the wrong JSON type."""
    from hf_deepnmt.errors import UserInputError

    for name, value in parameters.items():
        if name not in allowed:
            raise UserInputError(f"`parameters.{name}` is not a parameter this server takes (engine {engine}); use "
                                 f"{', '.join(sorted(allowed))}.")
        if not _type_ok(value, allowed[name]):
            raise UserInputError(f"`parameters.{name}` = {json.dumps(value)[:60]} is not allowed; it must be "
                                 f"{'an' if allowed[name][0] in 'aeiou' else 'a'} {allowed[name]}.")


def _settings_key(parameters: dict[str, Any]) -> str:
    return json.dumps(parameters, sort_keys=True)


def _cut(message: str) -> str:
    """The first line of an error message (transformers' messages may run over several)."""
    lines = str(message).strip().splitlines()
    return lines[0] if lines else type(message).__name__


def _too_long(index: int, length: int, limit: int, model_limit: int) -> InputTooLong:
    where = "" if limit == model_limit else f" (--max_input_tokens; the model accepts {model_limit})"
    return InputTooLong(f"`inputs[{index}]` has {length} tokens, more than the {limit} this server accepts{where}; "
                        "split it into shorter texts.")


class PipelineTranslator:
    """The torch and ONNX engines: the folder's translation pipeline (`hf_deepnmt.TranslationPipeline`, over the
    torch model or `OnnxSeq2SeqLM`) with its own ``preprocess``, batching (``pad_collate_fn``), ``forward`` and
    ``postprocess``; only the grouping of texts into batches is the server's."""

    def __init__(self, pipeline: Any, engine: str, max_input_tokens: int | None = None,
                 retiring: bool = True, continuous: bool = False) -> None:
        from transformers.pipelines.base import pad_collate_fn

        from hf_deepnmt.errors import UserInputError

        self.pipeline = pipeline
        self.engine = engine
        self.retiring = retiring  # decode every budget in one retiring search where it takes the settings
        self.continuous = continuous  # sentences join a running search (a model with `admits_mid_search`)
        self.model_limit = pipeline._max_source_tokens()
        if max_input_tokens is not None and max_input_tokens > self.model_limit:
            raise UserInputError(f"`--max_input_tokens` = {max_input_tokens} is more than the model accepts "
                                 f"({self.model_limit} tokens); use {self.model_limit} or less.")
        self.max_input_tokens = max_input_tokens or self.model_limit
        self.collate = pad_collate_fn(pipeline.tokenizer, None)
        self.tokenizer_lock = threading.Lock()  # encode (event loop) and decode (worker) share one tokenizer
        config = pipeline.model.config
        # the decoder's positions bound the output: the start token takes one (None: the model has no such limit)
        positions = getattr(config, "max_position_embeddings", None)
        self.max_output = positions if isinstance(positions, int) and positions > 1 else None

    def continuous_refused(self) -> str | None:
        """Why sentences cannot join a running search here (None: they can, for the settings the search takes)."""
        if not self.retiring:
            return "--search generate decodes each batch in one generate call"
        model = self.pipeline.model
        if not getattr(model, "admits_mid_search", False):
            return (f"{type(model).__name__} takes sentences only into an empty search (the Transformer family of "
                    "the torch engine takes them half-way)")
        return None

    def prepare(self, parameters: dict[str, Any]) -> Settings:
        from hf_deepnmt.errors import UserInputError
        from hf_deepnmt.modeling_common import check_generation_arguments
        from hf_deepnmt.retiring_search import unsupported

        check_parameter_types(parameters, {**PIPELINE_PARAMETERS, **GENERATION_PARAMETERS}, self.engine)
        pipeline = self.pipeline
        preprocess, forward, postprocess = pipeline._sanitize_parameters(**parameters)  # checks the languages
        forward = {**pipeline._forward_params, **forward}
        check_generation_arguments(forward)
        config = copy.deepcopy(pipeline.model.generation_config)
        setting = {**config.to_dict(), **forward}
        beams, returned = setting.get("num_beams") or 1, setting.get("num_return_sequences") or 1
        if returned > beams and not setting.get("do_sample"):
            raise UserInputError(f"`parameters.num_return_sequences` = {returned} is more than `num_beams` = {beams}; "
                                 "beam search returns at most num_beams translations per text.")
        try:  # what `generate` refuses, refused before the request joins a batch
            config.update(**forward)
            config.validate()
        except ValueError as error:
            raise UserInputError(f"`parameters`: {_cut(error)}") from None
        for name, limit in (("max_new_tokens", None if self.max_output is None else self.max_output - 1),
                            ("max_length", self.max_output)):
            value = forward.get(name)
            if limit is not None and value is not None and value > limit:
                raise UserInputError(f"`parameters.{name}` = {value} is more than this model can generate "
                                     f"({limit}, its max_position_embeddings); use {limit} or less.")
        # one search over every budget when the request leaves the length to the budgets and the search takes the
        # settings (otherwise `generate`, one call per budget)
        mixes = (self.retiring and not {"max_new_tokens", "max_length"} & forward.keys()
                 and unsupported(pipeline.model, forward) is None)
        return Settings(key=_settings_key(parameters), parameters=parameters,
                        num_return_sequences=int(parameters.get("num_return_sequences", 1) or 1),
                        preprocess={**pipeline._preprocess_params, **preprocess, "truncation": False},
                        forward=forward, postprocess={**pipeline._postprocess_params, **postprocess},
                        mixes_budgets=bool(mixes))

    def encode(self, text: str, index: int, settings: Settings) -> Source:
        pipeline = self.pipeline
        with self.tokenizer_lock:
            length = len(pipeline.tokenizer((pipeline.prefix or "") + text)["input_ids"])
            if length > self.max_input_tokens:
                raise _too_long(index, length, self.max_input_tokens, self.model_limit)
            positions = getattr(pipeline.model.config, "max_position_embeddings", None) or 1024
            return Source(length, pipeline.preprocess(text, **settings.preprocess),
                          budget_of(length, settings.forward, positions))

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]:
        """Every source's translations, in order (those ``more`` added after them); with the retiring search,
        ``deliver(i, translations)`` gets source ``i``'s as soon as its search is over (the batch goes on with the
        others), and between decoder steps the sources ``more`` gives join the search (`ContinuousSearch`)."""
        pipeline = self.pipeline

        def decode(output_ids: torch.Tensor) -> list[str]:  # (1, sequences per text, length)
            with self.tokenizer_lock:
                return [record["translation_text"] for record in
                        pipeline.postprocess({"output_ids": output_ids}, **settings.postprocess)]

        if not settings.mixes_budgets:
            batch = self.collate([source.inputs for source in sources])
            output_ids = pipeline.forward(batch, **settings.forward)["output_ids"]  # (batch, sequences, length)
            return [decode(output_ids[row:row + 1]) for row in range(len(sources))]
        from hf_deepnmt.retiring_search import ContinuousSearch, search_settings

        search = ContinuousSearch(pipeline.model, search_settings(pipeline.model, settings.forward))
        decoded: dict[int, list[str]] = {}
        total = 0

        def admit(joining: Sequence[Source]) -> None:
            nonlocal total
            batch = self.collate([source.inputs for source in joining])
            search.admit(batch["input_ids"].to(pipeline.device), batch["attention_mask"].to(pipeline.device),
                         [source.budget for source in joining], range(total, total + len(joining)))
            total += len(joining)

        admit(sources)
        joins = more is not None and self.continuous and search.admits_mid_search
        while True:
            if joins:  # continuous batching: the sentences that arrived join between two decoder steps
                joining = more(len(search))
                if joining:
                    admit(joining)
            if not len(search):
                break
            for index, hypotheses in search.step():
                decoded[index] = decode(hypotheses.sequences[None])
                if deliver is not None:
                    deliver(index, decoded[index])
        return [decoded[index] for index in range(total)]


class CTranslate2Translator:
    """A CTranslate2 export (`hf_deepnmt.export_ctranslate2.CTranslate2Engine`): the tokenizer that travels with it,
    CTranslate2's beam search (``early_stopping=True``, docs/fast-inference.md) and the pipeline's decoding
    (``skip_special_tokens``). Its parameters are the engine's: `CTRANSLATE2_PARAMETERS`."""

    @staticmethod
    def continuous_refused() -> str:
        return "CTranslate2 decodes each batch with its own search"

    engine = "ctranslate2"

    def __init__(self, engine: Any, tokenizer: Any, max_input_tokens: int | None = None) -> None:
        from hf_deepnmt.errors import UserInputError

        self.ct2 = engine
        self.tokenizer = tokenizer
        limits = (engine.max_positions, tokenizer.model_max_length)
        self.model_limit = min(int(limit) for limit in limits if isinstance(limit, int) and 0 < limit < 10**9)
        if max_input_tokens is not None and max_input_tokens > self.model_limit:
            raise UserInputError(f"`--max_input_tokens` = {max_input_tokens} is more than the model accepts "
                                 f"({self.model_limit} tokens); use {self.model_limit} or less.")
        self.max_input_tokens = max_input_tokens or self.model_limit
        generation = engine.manifest.get("generation", {})
        self.defaults = {"num_beams": generation.get("num_beams") or 1}  # the length: each text's own budget
        self.tokenizer_lock = threading.Lock()

    def prepare(self, parameters: dict[str, Any]) -> Settings:
        from hf_deepnmt.errors import UserInputError

        allowed = {name: {**PIPELINE_PARAMETERS, **GENERATION_PARAMETERS}[name] for name in CTRANSLATE2_PARAMETERS}
        check_parameter_types(parameters, allowed, self.engine)
        forward = {**self.defaults, **{k: v for k, v in parameters.items() if k != "clean_up_tokenization_spaces"}}
        for name in ("num_beams", "max_new_tokens"):
            if forward.get(name, 1) < 1:
                raise UserInputError(f"`parameters.{name}` = {forward[name]} is not allowed; it must be an integer ≥ 1.")
        if forward.get("min_new_tokens", 0) < 0:
            raise UserInputError(f"`parameters.min_new_tokens` = {forward['min_new_tokens']} is not allowed; it must "
                                 "be an integer ≥ 0.")
        if forward.get("early_stopping") is not None and forward["early_stopping"] is not True:
            raise UserInputError(f"`parameters.early_stopping` = {json.dumps(forward['early_stopping'])} is not "
                                 "available with the ctranslate2 engine, whose beam search stops a text once num_beams "
                                 "hypotheses have finished (true); serve the model with the torch or onnx engine.")
        return Settings(key=_settings_key(parameters), parameters=parameters, num_return_sequences=1, forward=forward,
                        postprocess={"clean_up_tokenization_spaces":
                                     parameters.get("clean_up_tokenization_spaces", False)})

    def encode(self, text: str, index: int, settings: Settings) -> Source:
        with self.tokenizer_lock:
            ids = self.tokenizer(text)["input_ids"]
        if len(ids) > self.max_input_tokens:
            raise _too_long(index, len(ids), self.max_input_tokens, self.model_limit)
        return Source(len(ids), ids, budget_of(len(ids), settings.forward, self.ct2.max_positions))

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]:
        """Every source's translations, in order (one batch: CTranslate2 takes no sentences mid-search)."""
        from hf_deepnmt.pipeline_translation import rows_by_budget

        # each text's own budget (`Source.budget`; None: the request's max_new_tokens), one call per budget, as the
        # pipeline of the torch and onnx engines decodes (the batcher already hands over texts of one budget)
        outputs: list[list[int]] = [[]] * len(sources)
        for budget, rows in rows_by_budget([source.budget for source in sources]):
            length = {} if budget is None else {"max_new_tokens": budget}
            for row, ids in zip(rows, self.ct2.generate([sources[row].inputs for row in rows], **settings.forward,
                                                       **length)):
                outputs[row] = ids
        with self.tokenizer_lock:
            return [[self.tokenizer.decode(ids, skip_special_tokens=True, **settings.postprocess)] for ids in outputs]


def load_translator(engine: str, folder: str | os.PathLike, threads: int | None = None,
                    max_input_tokens: int | None = None, search: str = "retiring",
                    continuous: bool = False, workers: int = 1) -> Translator:
    """Load ``engine`` for ``folder`` (as `choose_engine` returned them) with ``threads`` intra-op threads (default:
    torch's thread count divided among the ``workers`` instances the server loads, at least one each);
    ``search``: how the torch and onnx engines decode a batch (`ServeOptions.search`); ``continuous``: sentences join
    a running retiring search (`ServeOptions.continuous_batching`)."""
    import torch
    from transformers import AutoTokenizer

    import hf_deepnmt  # noqa: F401  (registers the model types and pipeline("translation"))
    from hf_deepnmt.pipeline_translation import TranslationPipeline

    if not threads and workers > 1:
        threads = max(1, torch.get_num_threads() // workers)
    if threads:
        torch.set_num_threads(threads)
    threads = threads or torch.get_num_threads()
    if engine == "ctranslate2":
        from hf_deepnmt.export_ctranslate2 import CTranslate2Engine

        return CTranslate2Translator(CTranslate2Engine(folder, intra_threads=threads),
                                     AutoTokenizer.from_pretrained(folder), max_input_tokens)
    if engine == "onnx":
        from hf_deepnmt.ort_generation import OnnxSeq2SeqLM

        model = OnnxSeq2SeqLM.from_export(folder, threads)
        pipeline = TranslationPipeline(model=model, tokenizer=AutoTokenizer.from_pretrained(folder),
                                       task="translation")
    else:
        from transformers import pipeline as make_pipeline

        pipeline = make_pipeline("translation", model=str(folder), device=0 if torch.cuda.is_available() else -1)
    if search == "generate":
        # transformers' own loop per budget, the way before the retiring search: a model's `generate` would
        # otherwise run that search on each budget's rows (docs/transformer.md, "`generate`")
        pipeline.model.generate_by_retiring_search = False
    return PipelineTranslator(pipeline, engine, max_input_tokens, retiring=search == "retiring",
                              continuous=continuous)


class ProcessTranslator:
    """A worker whose searches run in a child process with its own instance of the model (``--workers`` > 1,
    docs/serving.md, "Workers"): the server's first worker tokenizes and searches in the server process, each further
    one searches here. Two searches on threads of one process take turns on Python's lock between operators; in two
    processes they do not (measured: two one-worker servers on this 2-core CPU answered 68.5 sentences/s at 32 clients
    together, one server with two worker threads 49.9).

    ``translate`` sends the batch's tokenized sources and settings to the child and returns its translations; the
    child hands back each sentence's translations as soon as its search is over (``deliver``), as a thread worker
    does. A failure inside the batch comes back as the exception itself (its batch's requests get it, the worker goes
    on); a child that died fails its batch and every later one sent to it. The child ignores SIGINT/SIGTERM: the
    server process decides when it stops (`close`, after the batches in flight), and a child whose server is gone
    ends at once (its pipe closes)."""

    def __init__(self, engine: str, folder: str | os.PathLike, threads: int, max_input_tokens: int | None,
                 search: str) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.engine = engine
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_process, name="deepnmt-serve-worker", daemon=True,
                                       args=(child, engine, str(folder), threads, max_input_tokens, search))
        self.process.start()
        child.close()
        message = self._receive()
        if message[0] != "ready":
            self.close()
            raise RuntimeError(f"a worker process could not load the model: {message[1]}")
        self.max_input_tokens = message[1]
        self.lock = threading.Lock()

    def _receive(self) -> tuple:
        try:
            return self.connection.recv()
        except (EOFError, OSError) as error:
            raise RuntimeError(f"the worker process (pid {self.process.pid}) ended (exit code "
                               f"{self.process.exitcode}); restart the server") from error

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]:
        with self.lock:  # one search at a time per worker (`ServerState.idle` already ensures it)
            try:
                self.connection.send(("translate", list(sources), settings))
            except (OSError, ValueError) as error:
                raise RuntimeError(f"the worker process (pid {self.process.pid}) cannot take a batch: "
                                   f"{_cut(error)}") from error
            while True:
                message = self._receive()
                if message[0] == "deliver":
                    if deliver is not None:
                        deliver(message[1], message[2])
                elif message[0] == "done":
                    return message[1]
                else:  # ("error", exception)
                    raise message[1]

    def close(self) -> None:
        """Ask the child to end and wait for it (it has no batch by then: the batcher stopped first)."""
        with contextlib.suppress(OSError, ValueError):
            self.connection.send(("stop",))
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()
        self.connection.close()


def _worker_process(connection: Any, engine: str, folder: str, threads: int, max_input_tokens: int | None,
                    search: str) -> None:
    """The child of a `ProcessTranslator`: load the engine, then translate each batch it is sent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and SIGTERM reach the server, which drains first
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        translator = load_translator(engine, folder, threads, max_input_tokens, search)
    except Exception as error:  # noqa: BLE001  (the server reports it and does not start)
        connection.send(("failed", _cut(error)))
        return
    connection.send(("ready", translator.max_input_tokens))
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return  # the server is gone
        if message[0] == "stop":
            return
        _, sources, settings = message
        try:
            outputs = translator.translate(sources, settings,
                                           lambda index, candidates: connection.send(("deliver", index, candidates)))
        except Exception as error:  # noqa: BLE001  (the batch's requests get it; the worker goes on)
            try:
                connection.send(("error", error))
            except Exception:  # noqa: BLE001  (an exception that does not pickle)
                connection.send(("error", RuntimeError(f"{type(error).__name__}: {_cut(error)}")))
        else:
            connection.send(("done", outputs))


def answer(single: bool, candidates: Sequence[Sequence[str]], num_return_sequences: int) -> list[Any]:
    """The translation pipeline's (and `handler.py`'s) answer: ``[{"translation_text": ...}]`` for a string (its
    ``num_return_sequences`` dicts), one dict per string for a list (a list of dicts each when that is above 1)."""
    records = [[{"translation_text": text} for text in texts] for texts in candidates]
    if single:
        return records[0]
    if num_return_sequences == 1:
        return [texts[0] for texts in records]
    return records


# ------------------------------------------------------------------------------------------------ metrics
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BATCH_DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10)
NO_MODEL = "none"  # the `model` label of a request answered before a model was chosen (bad JSON, no key, ...)
ROUTES = ("/", "/predict", "/translate", "/detect")  # the routes whose requests are counted and timed


class MetricFamilies:
    """A server's metrics (prometheus_client) in a registry of its own (not the process-wide default: tests build
    several servers in one process), labelled by model — its language pair, ``en-es`` — and by route
    (docs/serving.md, "Metrics")."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry = CollectorRegistry()
        request, model = ["model", "route"], ["model"]
        self.requests = Counter("deepnmt_requests", "Translation requests answered, by HTTP status code.",
                                [*request, "code"], registry=registry)
        self.errors = Counter("deepnmt_request_errors", "Translation requests answered with an error, by reason.",
                              [*request, "reason"], registry=registry)
        self.disconnects = Counter("deepnmt_client_disconnects", "Requests whose client left before the answer "
                                   "(their waiting sentences are dropped from the queue).", request, registry=registry)
        self.latency = Histogram("deepnmt_request_duration_seconds", "Time from a translation request's arrival to "
                                 "its answer.", request, buckets=LATENCY_BUCKETS, registry=registry)
        self.in_flight = Gauge("deepnmt_requests_in_flight", "Translation requests received and not yet answered.",
                               ["route"], registry=registry)
        self.sentences = Counter("deepnmt_sentences", "Sentences translated.", model, registry=registry)
        self.batches = Counter("deepnmt_batches", "Batches: sentences taken from the queue together.", model,
                               registry=registry)
        self.batch_failures = Counter("deepnmt_batch_failures", "Batches whose search raised (their requests got "
                                      "an error).", model, registry=registry)
        self.queue_depth = Gauge("deepnmt_queue_depth_sentences", "Sentences waiting for a batch.", model,
                                 registry=registry)
        self.loaded = Gauge("deepnmt_model_loaded", "1 once the model is loaded.", model, registry=registry)
        self.batch_size = Histogram("deepnmt_batch_size_sentences", "Sentences taken from the queue together (a new "
                                    "search, or sentences joining a running one).", model, buckets=SIZE_BUCKETS,
                                    registry=registry)
        self.batch_duration = Histogram("deepnmt_batch_duration_seconds", "Time from a batch's start to its last "
                                        "sentence's translation.", model, buckets=BATCH_DURATION_BUCKETS,
                                        registry=registry)
        self.search_size = Histogram("deepnmt_search_size_sentences", "Sentences decoded by each decoder step of a "
                                     "search that takes sentences while it runs.", model, buckets=SIZE_BUCKETS,
                                     registry=registry)
        for route in ROUTES:
            self.in_flight.labels(route)

    def answered(self, model: str, route: str, code: int, seconds: float, error: str | None = None) -> None:
        self.requests.labels(model, route, str(code)).inc()
        if error is not None:
            self.errors.labels(model, route, error).inc()
        self.latency.labels(model, route).observe(seconds)

    def value(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(sample.value for family in self.registry.collect() for sample in family.samples
                   if sample.name == name and labels.items() <= sample.labels.items())

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


@dataclass(frozen=True)
class Observed:
    """How many values a histogram has observed, and their sum."""

    count: int
    sum: float


class Metrics:
    """One model's batch metrics (``model``: its label, the language pair), in ``families`` (a registry of its own
    when not given). Updated on the event loop only."""

    def __init__(self, model: str = "model", families: MetricFamilies | None = None) -> None:
        self.model = model
        self.families = families or MetricFamilies()
        families = self.families
        self._sentences, self._batches = families.sentences.labels(model), families.batches.labels(model)
        self._failures = families.batch_failures.labels(model)
        self._batch_size, self._batch_duration = families.batch_size.labels(model), families.batch_duration.labels(model)
        self._search_size = families.search_size.labels(model)
        families.queue_depth.labels(model)
        families.loaded.labels(model)

    def batch_opened(self, sentences: int) -> None:
        self._batches.inc()
        self._batch_size.observe(sentences)

    def search_stepped(self, sentences: int) -> None:
        self._search_size.observe(sentences)

    def batch_ended(self, sentences: int, failed: bool, seconds: float) -> None:
        if failed:
            self._failures.inc()
        else:
            self._sentences.inc(sentences)
        self._batch_duration.observe(seconds)

    @property
    def batches(self) -> int:
        return int(self.families.value("deepnmt_batches_total", model=self.model))

    @property
    def sentences(self) -> int:
        return int(self.families.value("deepnmt_sentences_total", model=self.model))

    @property
    def search_size(self) -> Observed:
        return Observed(int(self.families.value("deepnmt_search_size_sentences_count", model=self.model)),
                        self.families.value("deepnmt_search_size_sentences_sum", model=self.model))


# ------------------------------------------------------------------------------------------------ dynamic batching
class QueueFull(Exception):
    """The queue cannot take a request's sentences now: 503 with Retry-After."""


@dataclass(eq=False)
class Job:
    """One request's sentences on their way through the queue; ``future`` gets every text's translations."""

    settings: Settings
    future: asyncio.Future
    results: list[list[str] | None]
    remaining: int

    def deliver(self, index: int, candidates: list[str]) -> None:
        self.results[index] = candidates
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(self.results)


@dataclass(eq=False)
class Batch:
    """Sentences taken from the queue together: a new search, or sentences joining a running one."""

    number: int
    sentences: int
    requests: int
    lengths: tuple[int, int]  # shortest and longest source, in tokens
    searched: int  # sentences already in the search it joined (0: it started the search)
    started: float  # time.perf_counter()
    remaining: int = 0  # sentences not yet delivered


@dataclass(eq=False)
class Item:
    """One sentence waiting for a batch."""

    job: Job
    index: int  # its place among the request's texts
    source: Source
    sequence: int  # arrival order
    arrived: float  # time.monotonic()
    delivered: bool = False  # its translations went to its request (early, or at the end of its batch)
    batch: Batch | None = None

    @property
    def queue(self) -> tuple[str, int | None]:
        """Its queue: the request's generation parameters and, unless the engine decodes several budgets in one
        search (`Settings.mixes_budgets`), the sentence's new-token budget (a batch of several budgets would
        otherwise be several calls)."""
        settings = self.job.settings
        return settings.key, None if settings.mixes_budgets else self.source.budget


class Batcher:
    """Dynamic batching (see the module docstring): a queue per generation-parameter key and new-token budget, one
    search at a time on a single worker thread (the model is not run on the event loop, so the server answers /health
    and /metrics and takes requests while it translates). While a retiring search runs, sentences of its parameters
    join it between decoder steps as rows free up (`admit`, continuous batching). The queue is shared by the event
    loop and the worker: ``lock`` guards it."""

    def __init__(self, translate: Callable[[Sequence[Source], Settings, Callable[[int, list[str]], None], More],
                                           list[list[str]]], metrics: Metrics,
                 max_batch_size: int = 32, max_wait_ms: float = 10.0, max_queue: int = 256,
                 executor: ThreadPoolExecutor | None = None, workers: int = 1,
                 full_batch_to_overlap: bool = True) -> None:
        self.translate = translate
        self.metrics = metrics
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000
        self.max_queue = max_queue
        self.workers = workers  # searches at once, each on its own thread (and model instance: `ServerState`)
        self.searching = 0  # searches running now
        # while a search runs, only a full batch starts another (workers on threads of one process); worker
        # processes overlap any two searches (docs/serving.md, "Workers")
        self.full_batch_to_overlap = full_batch_to_overlap
        self.executor = executor or ThreadPoolExecutor(max_workers=workers, thread_name_prefix="deepnmt-translate")
        self.pending: dict[tuple[str, int | None], list[Item]] = {}  # `Item.queue` -> its sentences, in arrival order
        self.waiting = 0  # sentences in `pending`
        self.sequence = 0
        self.batch_number = 0
        self.wakeup = asyncio.Event()
        self.stopping = False
        self.task: asyncio.Task | None = None
        self.lock = threading.Lock()  # `pending` and `waiting`: the worker takes joining sentences from them

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(), name="deepnmt-batcher")

    async def stop(self) -> None:
        """Let the batches of every sentence still waiting run, then end the loop (uvicorn calls the lifespan's end
        after the last request was answered, so nothing waits by then)."""
        self.stopping = True
        self.wakeup.set()
        if self.task is not None:
            await self.task
        self.executor.shutdown(wait=True)

    def submit(self, settings: Settings, sources: Sequence[tuple[int, Source]], texts: int) -> Job:
        """Queue a request's sources (``(index among its texts, source)``); raises `QueueFull`."""
        with self.lock:
            if self.waiting + len(sources) > self.max_queue:
                raise QueueFull(f"the queue holds {self.waiting} sentences and takes at most {self.max_queue} "
                                f"(--max_queue); retry in {RETRY_AFTER_S} s.")
            future = asyncio.get_running_loop().create_future()
            job = Job(settings, future, [None] * texts, len(sources))
            now = time.monotonic()
            for index, source in sources:
                self.sequence += 1
                item = Item(job, index, source, self.sequence, now)
                self.pending.setdefault(item.queue, []).append(item)
            self.waiting += len(sources)
        self.wakeup.set()
        return job

    def withdraw(self, job: Job) -> int:
        """Take a job's waiting sentences out of the queue (its client left, or another of its batches failed);
        returns how many. Its sentences already in the running batch are translated and dropped."""
        removed = 0
        with self.lock:
            for key, queue in list(self.pending.items()):
                kept = [item for item in queue if item.job is not job]
                if len(kept) < len(queue):
                    removed += len(queue) - len(kept)
                    if kept:
                        self.pending[key] = kept
                    else:
                        del self.pending[key]
            self.waiting -= removed
        if removed:
            self.wakeup.set()
        return removed

    async def next_batch(self) -> list[Item] | None:
        """Wait for the next batch: the oldest sentence's queue (`Item.queue`), once it has ``max_batch_size``
        sentences waiting or the oldest has waited ``max_wait_ms``; before that, another queue's full batch (ready,
        and it delays the oldest by one batch at most, since the oldest goes first once its wait is over); ``None``
        when stopping with nothing left. With ``full_batch_to_overlap`` (workers on threads of one process), while
        another search runs only a full batch starts one: two searches on threads pay only when each is large
        (docs/serving.md, "Workers"); a smaller batch waits for the running search to end, as with one worker."""
        while True:
            if not self.pending:
                if self.stopping:
                    return None
                self.wakeup.clear()
                await self.wakeup.wait()
                continue
            with self.lock:  # a running search's worker may take joining sentences (`admit`) meanwhile
                oldest = min((queue[0] for queue in self.pending.values()), key=lambda item: item.sequence)
                queue = self.pending[oldest.queue]
                wait = oldest.arrived + self.max_wait_s - time.monotonic()
                if len(queue) >= self.max_batch_size or self.stopping or (
                        wait <= 0 and not (self.searching and self.full_batch_to_overlap)):
                    return self.take(oldest, queue)
                full = next((queue for queue in self.pending.values() if len(queue) >= self.max_batch_size), None)
                if full is not None:
                    return self.take(full[0], full)
            self.wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):  # a search's end wakes it too (`run`)
                await asyncio.wait_for(self.wakeup.wait(), wait if wait > 0 else None)

    def take(self, oldest: Item, queue: list[Item]) -> list[Item]:
        """Remove and return the batch, sorted by length: every waiting sentence of the key if they fit; else, for a
        queue of every budget (one retiring search), the oldest requests' sentences in arrival order, whole requests
        only (a request's texts in one batch, unless one request alone has more than a batch takes); else (one
        ``generate`` call per batch) the ``max_batch_size`` consecutive ones in length order that include ``oldest``
        with the smallest length spread."""
        size = self.max_batch_size
        if len(queue) > size and oldest.job.settings.mixes_budgets:  # one retiring search: first come, first served
            queue_part = self._oldest_requests(queue, size)
        else:
            queue_part = queue
        by_length = sorted(queue_part, key=lambda item: (item.source.length, item.sequence))
        if len(by_length) > size:  # one generate call: the closest lengths that include the oldest
            position = by_length.index(oldest)
            starts = range(max(0, position - size + 1), min(position, len(by_length) - size) + 1)
            start = min(starts, key=lambda s: (by_length[s + size - 1].source.length - by_length[s].source.length, s))
            by_length = by_length[start:start + size]
        self._remove(oldest.queue, queue, by_length)
        return by_length

    def _remove(self, key: tuple[str, int | None], queue: list[Item], chosen: Sequence[Item]) -> None:
        """Take ``chosen`` out of ``key``'s ``queue`` (under ``lock``)."""
        taken = set(map(id, chosen))
        kept = [item for item in queue if id(item) not in taken]
        if kept:
            self.pending[key] = kept
        else:
            del self.pending[key]
        self.waiting -= len(chosen)

    @staticmethod
    def _oldest_requests(queue: list[Item], size: int) -> list[Item]:
        """The first ``size`` sentences of ``queue`` in arrival order, cut before the first request that does not
        fit whole (a request's waiting sentences are consecutive in arrival order: one `submit`)."""
        by_arrival = sorted(queue, key=lambda item: item.sequence)
        chosen = by_arrival[:size]
        if len(by_arrival) > size and by_arrival[size].job is chosen[-1].job:  # the cut splits the last request
            split = chosen[-1].job
            whole = [item for item in chosen if item.job is not split]
            chosen = whole or chosen  # one request larger than a batch: its first sentences
        return chosen

    def admit(self, key: tuple[str, int | None], searched: int) -> list[Item]:
        """Worker thread, between two decoder steps of a search of ``key``'s parameters holding ``searched``
        sentences: the waiting sentences of ``key`` that join it now — the oldest requests' (whole requests, as
        `take`), as many as leave the search at most ``max_batch_size`` — or none while a sentence of other
        parameters has waited its ``max_wait_ms`` (the search then ends and that batch goes next)."""
        free = self.max_batch_size - searched
        with self.lock:
            queue = self.pending.get(key)
            if free <= 0 or not queue:
                return []
            now = time.monotonic()
            if any(other[0].arrived + self.max_wait_s <= now for other_key, other in self.pending.items()
                   if other_key != key):
                return []
            chosen = self._oldest_requests(queue, free)
            self._remove(key, queue, chosen)
        return chosen

    async def run(self) -> None:
        """Form batches and start their searches, at most ``workers`` at once (a batch is formed when a worker is
        free, so that it takes whatever waits then); after the last batch, wait for the searches still running."""
        free = asyncio.Semaphore(self.workers)
        running: set[asyncio.Task] = set()
        while True:
            await free.acquire()
            first = await self.next_batch()
            if first is None:
                break
            first = [item for item in first if not item.job.future.done()]  # a failed or abandoned request's rest
            if not first:
                free.release()
                continue
            task = asyncio.get_running_loop().create_task(self.search(first))
            running.add(task)
            self.searching += 1

            def ended(done: asyncio.Task) -> None:
                running.discard(done)
                self.searching -= 1
                free.release()
                self.wakeup.set()  # a batch held back while this search ran may go now

            task.add_done_callback(ended)
        if running:
            await asyncio.wait(running)

    async def search(self, first: list[Item]) -> None:
        """One search of a batch on a worker thread: its sentences go back to their requests as each is done;
        with continuous batching, sentences of its parameters join it between decoder steps."""
        loop = asyncio.get_running_loop()
        settings = first[0].job.settings
        items = list(first)  # every sentence of this search, in the order the engine numbers them
        self.open_batch(first, 0)

        def deliver_early(position: int, candidates: list[str]) -> None:
            # worker thread: the sentence's search is over while its batch goes on; its request may be answered
            loop.call_soon_threadsafe(self.deliver, items[position], candidates)

        def more(searched: int) -> list[Source]:
            # worker thread, between decoder steps: sentences of the same parameters join the running search
            joining = self.admit(first[0].queue, searched)
            items.extend(joining)
            loop.call_soon_threadsafe(self.stepped, joining, searched)
            return [item.source for item in joining]

        try:
            outputs = await loop.run_in_executor(self.executor, self.translate, [item.source for item in first],
                                                 settings, deliver_early, more)
            if len(outputs) != len(items):
                raise RuntimeError(f"the engine gave {len(outputs)} results for a batch of {len(items)} sentences")
        except Exception as error:  # noqa: BLE001  (the search's requests get it; the server goes on)
            logger.error("the search of batch %d failed", first[0].batch.number, exc_info=error)
            self.fail(items, error)
        else:
            for item, candidates in zip(items, outputs):
                self.deliver(item, candidates)

    def open_batch(self, items: Sequence[Item], searched: int) -> None:
        """Count and log a batch: ``items`` start a search (``searched`` 0) or join one of ``searched`` sentences."""
        self.batch_number += 1
        lengths = [item.source.length for item in items]
        batch = Batch(self.batch_number, len(items), len({id(item.job) for item in items}),
                      (min(lengths), max(lengths)), searched, time.perf_counter(), remaining=len(items))
        for item in items:
            item.batch = batch
        self.metrics.batch_opened(len(items))

    def stepped(self, joining: Sequence[Item], searched: int) -> None:
        """Event loop: a decoder step of a continuous search is next, with ``joining`` sentences added to the
        ``searched`` ones."""
        if joining:
            self.open_batch(joining, searched)
        self.metrics.search_stepped(searched + len(joining))

    def deliver(self, item: Item, candidates: list[str]) -> None:
        """Hand a sentence's translations to its request, once (early from the search, or at its batch's end); a
        batch whose last sentence this is gets its log line."""
        if item.delivered:
            return
        item.delivered = True
        if not item.job.future.done():
            item.job.deliver(item.index, candidates)
        self._count_delivered(item, failed=False)

    def _count_delivered(self, item: Item, failed: bool) -> None:
        batch = item.batch
        if batch is None:
            return
        batch.remaining -= 1
        if batch.remaining:
            return
        seconds = time.perf_counter() - batch.started
        self.metrics.batch_ended(batch.sentences, failed, seconds)
        joined = f"joined a search of {batch.searched} sentences and " if batch.searched else ""
        logger.info("batch %d: %d sentences from %d requests, %d-%d source tokens, parameters %s: %s%s in %.3f s, "
                    "%d sentences waiting", batch.number, batch.sentences, batch.requests, *batch.lengths,
                    item.job.settings.key, joined, "FAILED" if failed else "translated", seconds, self.waiting)

    def fail(self, items: Sequence[Item], error: Exception) -> None:
        """Every request with a sentence in ``items`` (a failed search) gets ``error``; their other waiting
        sentences leave the queue."""
        for job in {id(item.job): item.job for item in items}.values():
            if not job.future.done():
                job.future.set_exception(error)
            self.withdraw(job)
        for item in items:
            if not item.delivered:
                item.delivered = True
                self._count_delivered(item, failed=True)


# ------------------------------------------------------------------------------------------------ the application
class ServerState:
    """What the routes share: the translator once loaded, the batcher, the metrics."""

    def __init__(self, options: ServeOptions, engine: str, folder: Path,
                 loader: Callable[[], Translator] | None = None,
                 spawner: Callable[[], Translator] | None = None, *,
                 pair: tuple[str, str] | None = None, families: MetricFamilies | None = None) -> None:
        """``loader`` loads the first worker's translator (in this process); ``spawner`` each further one (default:
        a `ProcessTranslator`, or, with continuous batching, which a child process cannot join, another
        in-process instance; a caller's ``loader`` alone gives in-process instances for every worker). ``pair``: the
        language pair the model records (the requests for it come here; its metrics' ``model`` label);
        ``families``: the server's metrics (a registry of its own when not given)."""
        self.options = options
        self.pair = pair
        self.label = f"{pair[0]}-{pair[1]}" if pair else "model"
        self.engine = engine
        self.folder = folder
        # `load_translator` as the package holds it when the model loads: tests/serve_fault_worker.py replaces it
        self.loader = loader or (lambda: sys.modules[__package__].load_translator(
            engine, folder, options.threads, options.max_input_tokens, options.search, options.continuous_batching,
            options.workers or 1))
        if spawner is None and loader is None and not options.continuous_batching:
            spawner = self._spawn_process
        self.spawner = spawner or self.loader
        self.processes: list[ProcessTranslator] = []
        self.worker_threads = 1  # each worker's torch threads (`_load_workers`)
        self.metrics = Metrics(self.label, families)
        self.translator: Translator | None = None  # the first worker's: it also checks and tokenizes the requests
        self.idle: SimpleQueue[Translator] = SimpleQueue()  # the workers' translators not searching now
        self.batcher: Batcher | None = None
        self.load_error: BaseException | None = None
        self.on_load_error: Callable[[], None] = lambda: None
        self.load_after: asyncio.Future | None = None  # this model loads once that one has (several models)
        self.loading: asyncio.Future | None = None  # the loading, once `start` began it
        self.check_request: Callable[[Any], tuple[Any, dict]] | None = None
        self.user_error: type[Exception] = ValueError

    async def start(self) -> None:
        """Start the batcher and load the model on its worker thread (the routes answer 503 until it is loaded)."""
        workers = self.options.workers or 1
        self.batcher = Batcher(self.translate, self.metrics, self.options.max_batch_size, self.options.max_wait_ms,
                               self.options.max_queue, workers=workers,
                               full_batch_to_overlap=self.spawner != self._spawn_process)
        self.batcher.start()
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        logger.info("loading %s with the %s engine%s", self.folder, self.engine,
                    f", {workers} instances (--workers)" if workers > 1 else "")
        # one instance per worker: a search holds its model's state (and the tokenizer's) for its whole length; the
        # first in this process (it also tokenizes the requests), the others in their own processes (`spawner`)
        previous = self.load_after

        async def load() -> list[Translator]:
            if previous is not None:  # another model of this server loads first (`Service.start`)
                await asyncio.wait([previous])
            return await loop.run_in_executor(self.batcher.executor, self._load_workers, workers)

        future = self.loading = asyncio.ensure_future(load())

        def loaded(done: asyncio.Future) -> None:
            if done.cancelled():
                return
            error = done.exception()
            if error is not None:
                self.load_error = error
                logger.error("the model could not be loaded: %s", _cut(error))
                self.on_load_error()
                return
            from hf_deepnmt.errors import UserInputError
            from hf_deepnmt.handler import check_request

            self.check_request, self.user_error = check_request, UserInputError
            translators = done.result()
            for translator in translators:
                self.idle.put(translator)
            self.translator = translators[0]
            logger.info("model loaded in %.1f s: engine %s, at most %d tokens per text, batches of up to %d "
                        "sentences, %g ms wait, %d sentences queued, %d search(es) at once",
                        time.perf_counter() - started, self.translator.engine, self.translator.max_input_tokens,
                        self.options.max_batch_size, self.options.max_wait_ms, self.options.max_queue,
                        len(translators))
            if self.options.continuous_batching:
                reason = self.translator.continuous_refused()
                if reason:
                    logger.warning("--continuous_batching has no effect here: %s; batches are formed between "
                                   "searches.", reason)
                else:
                    logger.info("continuous batching: sentences join the running search between decoder steps")

        future.add_done_callback(loaded)

    def _spawn_process(self) -> Translator:
        return ProcessTranslator(self.engine, self.folder, self.worker_threads, self.options.max_input_tokens,
                                 self.options.search)

    def _load_workers(self, workers: int) -> list[Translator]:
        """The first worker's translator, then the others: worker processes load while the first does; instances in
        this process one after the other (two loads at once in one process race in transformers' lazy imports and
        model registration, and one of them could get a freshly initialised output layer)."""
        import torch

        # each worker's threads, read before the first worker's loader sets this process' count to its own share
        self.worker_threads = self.options.threads or max(1, torch.get_num_threads() // workers)
        in_process = self.spawner != self._spawn_process

        with ThreadPoolExecutor(1 if in_process else max(1, workers - 1), thread_name_prefix="deepnmt-spawn") as pool:
            first = self.loader() if in_process else None
            others = [pool.submit(self.spawner) for _ in range(workers - 1)]
            if first is None:
                first = self.loader()
            spawned = []
            try:
                for future in others:
                    spawned.append(future.result())
            except BaseException:
                for translator in spawned:
                    if isinstance(translator, ProcessTranslator):
                        translator.close()
                raise
        self.processes = [translator for translator in spawned if isinstance(translator, ProcessTranslator)]
        for number, translator in enumerate(spawned, start=2):
            if isinstance(translator, ProcessTranslator):
                logger.info("worker %d of %d searches in process %d", number, workers, translator.process.pid)
        return [first, *spawned]

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]:
        assert self.translator is not None  # batches exist only once the model is loaded
        translator = self.idle.get_nowait()  # never empty: at most `workers` searches run (`Batcher.run`)
        try:
            return translator.translate(sources, settings, deliver, more)
        finally:
            self.idle.put(translator)

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()
        for process in self.processes:  # every batch is over: the worker processes end
            process.close()


class ClientGone(Exception):
    """The client closed its connection before its answer (499, which nobody reads)."""


def describe_pairs(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{source} → {target}" for source, target in pairs) or "no language pair"


def default_beams(translator: Translator) -> int:
    """The number of beams a translator uses when a request does not say."""
    pipeline = getattr(translator, "pipeline", None)
    if pipeline is not None:
        return int(getattr(pipeline.model.generation_config, "num_beams", None) or 1)
    return int(getattr(translator, "defaults", {}).get("num_beams") or 1)


class Service:
    """Every model a server serves (one `ServerState` each: its own batcher, workers and metrics label), the API keys
    and the language detector, shared by the routes (`build_app`). A request for a language pair goes to the model
    that records it (`choose`); two models of one pair are refused at start (`check_pairs`)."""

    def __init__(self, states: Sequence[ServerState], keys: Any = None,
                 families: MetricFamilies | None = None) -> None:
        self.states = list(states)
        self.families = families or self.states[0].metrics.families
        self.keys = keys  # serve_libretranslate.ApiKeys, or None: an open server
        self.by_pair = {state.pair: state for state in self.states if state.pair is not None}
        self.detector: Any = None

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(self.by_pair)

    @property
    def sources(self) -> list[str]:
        return list(dict.fromkeys(source for source, _ in self.pairs))

    async def start(self) -> None:
        """Start every model's batcher and loading; the models load one after the other (two loads at once in one
        process raced in transformers' lazy imports and model registration: a model could load with a freshly
        initialised output layer), while the server answers 503 for those not loaded yet."""
        previous = None
        for state in self.states:
            state.load_after = previous
            await state.start()
            previous = state.loading

    async def stop(self) -> None:
        await asyncio.gather(*(state.stop() for state in self.states))

    def authorize(self, key: str | None) -> None:
        """Raise `ApiError` 403 / 429 when the server has keys and ``key`` is missing, unknown or over its limit."""
        if self.keys is not None:
            self.keys.check(key)

    def choose(self, parameters: dict[str, Any]) -> ServerState:
        """The model of a payload request: the only one, or the one whose pair ``parameters.src_lang`` /
        ``tgt_lang`` name (`ApiError` 400 otherwise)."""
        from .libretranslate import ApiError

        if len(self.states) == 1:
            return self.states[0]
        check_parameter_types({name: parameters[name] for name in ("src_lang", "tgt_lang") if name in parameters},
                              PIPELINE_PARAMETERS, "routing")
        source, target = parameters.get("src_lang"), parameters.get("tgt_lang")
        matching = [state for pair, state in self.by_pair.items()
                    if source in (None, pair[0]) and target in (None, pair[1])]
        if len(matching) == 1 and (source is not None or target is not None):
            return matching[0]
        served = describe_pairs(self.pairs)
        if not matching:
            given = f"{source or '?'} → {target or '?'}"
            raise ApiError(400, f"`parameters.src_lang`/`parameters.tgt_lang` = {given} is not a pair this server "
                                f"translates; it translates {served}.", "unknown_pair")
        raise ApiError(400, f"this server translates several pairs ({served}); name one with `parameters.src_lang` "
                            "and `parameters.tgt_lang`.", "no_pair")

    def pair_state(self, source: str, target: str) -> ServerState:
        from .libretranslate import ApiError

        state = self.by_pair.get((source, target))
        if state is None:
            raise ApiError(400, f"`source`/`target` = {source} → {target} is not a pair this server translates; it "
                                f"translates {describe_pairs(self.pairs)}.", "unknown_pair")
        return state

    def confidences(self, text: str) -> list[tuple[str, float]]:
        """The served source languages with the detector's confidence (0-100) that ``text`` is in each, best first."""
        from .libretranslate import ApiError, LanguageDetector

        if not self.sources:
            raise ApiError(400, "this server's model records no language pair, so it cannot detect a language; "
                                "record the pair (hf_deepnmt.record_language_pair) and serve it again.", "no_pair")
        if self.detector is None:
            self.detector = LanguageDetector(self.sources)
        return self.detector.confidences(text)

    def detect_for(self, text: str, target: str) -> tuple[str, float]:
        """``text``'s detected source language (and confidence) for a translation into ``target``."""
        from .libretranslate import ApiError

        if not text.strip():  # nothing to detect: the first language translated into `target`
            return next(source for source, into in self.pairs if into == target), 0.0
        language, confidence = self.confidences(text)[0]
        if (language, target) not in self.by_pair:
            raise ApiError(400, f"`q` {text[:40]!r} was detected as {language} (confidence {confidence:g}), and this "
                                f"server does not translate {language} → {target}; it translates "
                                f"{describe_pairs(self.pairs)}.", "unknown_pair")
        return language, confidence


def build_app(service: Service | ServerState) -> Any:
    """The starlette application of ``service`` (or of one model's ``ServerState``): the routes and a lifespan that
    starts the batchers and the loading."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    from .libretranslate import (ApiError, HtmlDocument, alternatives_field, bearer, language_name, read_form,
                                       text_field, texts_field)

    if isinstance(service, ServerState):
        service = Service([service])
    families = service.families

    def error(code: int, sentence: str, reason: str, started: float, retry: int | None = None,
              model: str = NO_MODEL, route: str = "/") -> Response:
        families.answered(model, route, code, time.perf_counter() - started, reason)
        headers = {"Retry-After": str(retry)} if retry else None
        return JSONResponse({"error": sentence}, status_code=code, headers=headers)

    def refused(refusal: ApiError, started: float, model: str, route: str) -> Response:
        return error(refusal.status, refusal.sentence, refusal.reason, started, refusal.retry_after, model, route)

    def gone(started: float, model: str, route: str) -> Response:
        families.disconnects.labels(model, route).inc()
        families.answered(model, route, 499, time.perf_counter() - started, "client_disconnected")
        return Response(status_code=499)  # nobody reads it; uvicorn drops it

    def loading() -> ApiError:
        return ApiError(503, f"the model is still loading; retry in {RETRY_AFTER_S} s (GET /health says when it is "
                             "ready).", "loading", retry_after=RETRY_AFTER_S)

    def model_health(state: ServerState) -> dict[str, Any]:
        assert state.translator is not None
        health = {"engine": state.translator.engine, "model": str(state.folder),
                  "max_input_tokens": state.translator.max_input_tokens,
                  "max_batch_size": state.options.max_batch_size}
        if state.pair is not None:
            health["pair"] = list(state.pair)
        return health

    async def health(request: Request) -> Response:
        if any(state.translator is None for state in service.states):
            return JSONResponse({"status": "loading", "engine": service.states[0].engine}, status_code=503,
                                headers={"Retry-After": str(RETRY_AFTER_S)})
        if len(service.states) == 1:
            return JSONResponse({"status": "ok", **model_health(service.states[0])})
        return JSONResponse({"status": "ok", "models": [model_health(state) for state in service.states]})

    async def metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4

        for state in service.states:
            families.queue_depth.labels(state.label).set(state.batcher.waiting if state.batcher is not None else 0)
            families.loaded.labels(state.label).set(int(state.translator is not None))
        return Response(families.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def translate_texts(state: ServerState, texts: Sequence[str], parameters: dict[str, Any],
                              request: Request, too_long: int = 413) -> tuple[list[list[str]], Settings]:
        """Every text's translations by ``state``'s model (its batcher); `ApiError` for a refusal, `ClientGone`
        when the client leaves first."""
        translator, batcher = state.translator, state.batcher
        if translator is None or batcher is None:
            raise loading()
        try:
            if len(texts) > batcher.max_queue:
                raise InputTooLong(f"`inputs` holds {len(texts)} texts, more than this server queues "
                                   f"(--max_queue = {batcher.max_queue}); send at most {batcher.max_queue} per request.")
            settings = translator.prepare(parameters)
            sources = [(index, translator.encode(text, index, settings)) for index, text in enumerate(texts)
                       if text.strip()]
        except InputTooLong as problem:
            raise ApiError(too_long, str(problem), "too_large") from None
        except state.user_error as problem:
            raise ApiError(400, _cut(problem), "bad_request") from None
        blank = [""] * settings.num_return_sequences
        if not sources:  # blank texts translate to "" without the model (the pipeline's rule)
            return [blank] * len(texts), settings
        try:
            job = batcher.submit(settings, sources, len(texts))
        except QueueFull as problem:
            raise ApiError(503, str(problem), "queue_full", retry_after=RETRY_AFTER_S) from None
        left = asyncio.ensure_future(client_disconnected(request))
        try:
            await asyncio.wait({job.future, left}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            left.cancel()
        if not job.future.done():  # the client left: its waiting sentences leave the queue
            job.future.cancel()
            batcher.withdraw(job)
            raise ClientGone
        problem = job.future.exception()
        if isinstance(problem, state.user_error):
            raise ApiError(400, _cut(problem), "bad_request")
        if problem is not None:  # the batcher logged its traceback
            raise ApiError(500, f"the translation failed: {type(problem).__name__}: {_cut(problem)}",
                           "translation_failed")
        return [result if result is not None else blank for result in job.future.result()], settings

    def counted(handler: Callable[[Request, float, str], Any]) -> Callable[[Request], Any]:
        async def route(request: Request) -> Response:
            started, path = time.perf_counter(), request.url.path
            families.in_flight.labels(path).inc()
            try:
                return await handler(request, started, path)
            finally:
                families.in_flight.labels(path).dec()

        return route

    async def read_body(request: Request) -> bytes:
        try:
            return await request.body()
        except ClientDisconnect:  # gone before its request was read
            raise ClientGone from None

    async def predict(request: Request, started: float, route: str) -> Response:
        """``POST /`` and ``/predict``: the Inference Endpoints payload."""
        label = NO_MODEL
        try:
            body = await read_body(request)
            try:
                data = json.loads(body)
            except ValueError as problem:  # JSONDecodeError, UnicodeDecodeError
                raise ApiError(400, f"the request body is not valid JSON ({_cut(problem)}); send "
                                    '{"inputs": "text" or ["text", ...], "parameters": {...}}.', "invalid_json") from None
            key = data.pop("api_key", None) if isinstance(data, dict) else None
            service.authorize(bearer(request.headers.get("authorization")) or (key if isinstance(key, str) else None))
            first = service.states[0]
            if first.check_request is None:
                raise loading()
            try:
                inputs, parameters = first.check_request(data)  # hf_deepnmt.handler's: one ValueError sentence
            except ValueError as problem:
                raise ApiError(400, _cut(problem), "bad_request") from None
            try:
                state = service.choose(parameters)
            except first.user_error as problem:
                raise ApiError(400, _cut(problem), "bad_request") from None
            label = state.label
            if len(service.states) > 1 and state.engine == "ctranslate2":  # the pair chose it; its engine has no such
                parameters = {k: v for k, v in parameters.items() if k not in ("src_lang", "tgt_lang")}
            single = isinstance(inputs, str)
            candidates, settings = await translate_texts(state, [inputs] if single else inputs, parameters, request)
        except ApiError as refusal:
            return refused(refusal, started, label, route)
        except ClientGone:
            return gone(started, label, route)
        families.answered(label, route, 200, time.perf_counter() - started)
        return JSONResponse(answer(single, candidates, settings.num_return_sequences))

    async def libre_fields(request: Request) -> dict[str, Any]:
        fields = read_form(await read_body(request), request.headers.get("content-type", ""))
        key = fields.get("api_key")
        service.authorize(bearer(request.headers.get("authorization")) or (key if isinstance(key, str) else None))
        return fields

    def required(fields: dict[str, Any], name: str, example: str) -> str:
        value = text_field(fields, name)
        if not value:
            raise ApiError(400, f"the request has no `{name}`; send it, e.g. {example}.", "bad_request")
        return value

    async def translate(request: Request, started: float, route: str) -> Response:
        """``POST /translate``: LibreTranslate's translation (docs/serving.md, "LibreTranslate clients")."""
        label = NO_MODEL
        try:
            fields = await libre_fields(request)
            texts, single = texts_field(fields)
            source = required(fields, "source", '"source": "en" (or "auto")')
            target = required(fields, "target", '"target": "es"')
            kind = text_field(fields, "format", "text")
            if kind not in ("text", "html"):
                raise ApiError(400, f"`format` = {kind!r} is not allowed; use 'text' or 'html'.", "bad_request")
            alternatives = alternatives_field(fields)
            targets = {into for _, into in service.pairs}
            if target not in targets:
                raise ApiError(400, f"`target` = {target!r} is not a language this server translates into; it "
                                    f"translates {describe_pairs(service.pairs)}.", "unknown_pair")
            documents = [HtmlDocument.parse(text) for text in texts] if kind == "html" else None
            pieces = [document.texts for document in documents] if documents else [[text] for text in texts]
            detected: list[tuple[str, float]] | None = None
            if source == "auto":
                if any(state.translator is None for state in service.states):
                    raise loading()
                detected = [await asyncio.to_thread(service.detect_for, " ".join(parts), target) for parts in pieces]
                states = [service.pair_state(language, target) for language, _ in detected]
            else:
                states = [service.pair_state(source, target)] * len(texts)
            label = states[0].label if len({id(state) for state in states}) == 1 else NO_MODEL
            groups: dict[int, list[int]] = {}
            for index, state in enumerate(states):
                groups.setdefault(id(state), []).append(index)

            async def run(indices: list[int]) -> list[list[list[str]]]:
                state = states[indices[0]]
                if state.translator is None:
                    raise loading()
                parameters: dict[str, Any] = {}
                if alternatives:
                    if state.engine == "ctranslate2":
                        raise ApiError(400, f"`alternatives` = {alternatives} is not available with the ctranslate2 "
                                            "engine, which returns one translation per text; use 0.", "bad_request")
                    parameters = {"num_beams": max(default_beams(state.translator), alternatives + 1),
                                  "num_return_sequences": alternatives + 1}
                flat = [text for index in indices for text in pieces[index]]
                if not flat:
                    return [[] for _ in indices]
                try:
                    candidates, _ = await translate_texts(state, flat, parameters, request, too_long=400)
                except ApiError as refusal:
                    if refusal.reason == "too_large":  # name the text as the request does: `q[i]`
                        origin = [index for index in indices for _ in pieces[index]]
                        node = "a text node of " if documents else ""
                        refusal.sentence = re.sub(r"`inputs\[(\d+)\]`",
                                                  lambda m: f"{node}`q[{origin[int(m.group(1))]}]`",
                                                  refusal.sentence, count=1)
                    raise
                grouped, at = [], 0
                for index in indices:
                    grouped.append(candidates[at:at + len(pieces[index])])
                    at += len(pieces[index])
                return grouped

            results = await asyncio.gather(*(run(indices) for indices in groups.values()))
            per_text: list[list[list[str]]] = [[] for _ in texts]
            for indices, grouped in zip(groups.values(), results):
                for index, candidates in zip(indices, grouped):
                    per_text[index] = candidates
            ranked: list[list[str]] = []  # each text's translations, best first
            for index, candidates in enumerate(per_text):
                if documents is not None:
                    ranked.append([documents[index].assemble([options[rank] for options in candidates])
                                   for rank in range(alternatives + 1)])
                else:
                    ranked.append(candidates[0] if candidates else [""] * (alternatives + 1))
        except ApiError as refusal:
            return refused(refusal, started, label, route)
        except ClientGone:
            return gone(started, label, route)
        reply: dict[str, Any] = {"translatedText": ranked[0][0] if single else [texts[0] for texts in ranked]}
        if alternatives:
            reply["alternatives"] = ranked[0][1:] if single else [texts[1:] for texts in ranked]
        if detected is not None:
            languages = [{"confidence": confidence, "language": language} for language, confidence in detected]
            reply["detectedLanguage"] = languages[0] if single else languages
        families.answered(label, route, 200, time.perf_counter() - started)
        return JSONResponse(reply)

    async def detect(request: Request, started: float, route: str) -> Response:
        """``POST /detect``: ``[{"confidence": 0-100, "language": code}, ...]`` over the served source languages."""
        try:
            fields = await libre_fields(request)
            text = required(fields, "q", '"q": "the text"')
            values = await asyncio.to_thread(service.confidences, text)
        except ApiError as refusal:
            return refused(refusal, started, NO_MODEL, route)
        except ClientGone:
            return gone(started, NO_MODEL, route)
        families.answered(NO_MODEL, route, 200, time.perf_counter() - started)
        return JSONResponse([{"confidence": confidence, "language": language} for language, confidence in values])

    def languages_list() -> list[dict[str, Any]]:
        codes = list(dict.fromkeys(code for pair in service.pairs for code in pair))
        return [{"code": code, "name": language_name(code),
                 "targets": [into for source, into in service.pairs if source == code]} for code in codes]

    async def languages(request: Request) -> Response:
        """``GET|POST /languages``: every served language with the languages it translates into."""
        return JSONResponse(languages_list())

    async def frontend_settings(request: Request) -> Response:
        """``GET /frontend/settings``: LibreTranslate's web front end's settings, in its shape."""
        pairs = service.pairs
        source, target = pairs[0] if pairs else ("auto", "")
        keyed = service.keys is not None
        return JSONResponse({
            "charLimit": -1, "frontendTimeout": 500, "apiKeys": keyed, "keyRequired": keyed, "suggestions": False,
            "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": source, "name": language_name(source)},
                         "target": {"code": target, "name": language_name(target)}}})

    async def client_disconnected(request: Request) -> None:
        """Return when the client has closed its connection (the ASGI server's ``http.disconnect``)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def refused_route(request: Request, problem: HTTPException) -> Response:
        """starlette's own answers — a path this server does not have (404), a method its path does not take (405,
        with ``Allow``) — as JSON like every other error (they were plain text: "Method Not Allowed")."""
        path = request.url.path
        if problem.status_code == 405:
            allowed = " or ".join(sorted(str((problem.headers or {}).get("Allow", "")).split(", ")))
            sentence = f"{request.method} {path} is not allowed; use {allowed} {path}."
        elif problem.status_code == 404:
            sentence = (f"{path} is not a path of this server; POST / or /predict translates (POST /translate, "
                        "/detect and GET /languages in LibreTranslate's API), GET /health and GET /metrics report.")
        else:
            sentence = _cut(problem.detail)
        return JSONResponse({"error": sentence}, status_code=problem.status_code, headers=problem.headers)

    async def crashed(request: Request, problem: Exception) -> Response:
        """A bug in a route (not in a batch, whose requests get their own 500): JSON like every other error."""
        return error(500, f"the server failed: {type(problem).__name__}: {_cut(problem)}", "server_error",
                     time.perf_counter(), route=request.url.path if request.url.path in ROUTES else "/")

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    routes = [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
              Route("/", counted(predict), methods=["POST"]), Route("/predict", counted(predict), methods=["POST"]),
              Route("/translate", counted(translate), methods=["POST"]),
              Route("/detect", counted(detect), methods=["POST"]),
              Route("/languages", languages, methods=["GET", "POST"]),
              Route("/frontend/settings", frontend_settings, methods=["GET"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: refused_route, Exception: crashed})


# ------------------------------------------------------------------------------------------------ running it
def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port`` (port 0: a free one), or one `CommandLineError` sentence."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)  # connections queue from now on, before uvicorn's loop accepts them
    except OSError as error:
        raise CommandLineError(f"cannot listen on {host}:{port} ({error.strerror or error}); choose another "
                               "--host/--port (--port 0 takes a free port).") from None
    sock.set_inheritable(True)
    return sock


def configure_logging() -> None:
    """One line per event of this server on stderr: ``[deepnmt serve] ...``."""
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s [deepnmt serve] %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


@contextlib.contextmanager
def exit_quietly_on_signals() -> Iterator[None]:
    """uvicorn handles SIGINT/SIGTERM itself (graceful shutdown), then re-raises the signal to the handler it found:
    with no-op handlers in place, the process then ends normally, with status 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or a name) is this machine only."""
    import ipaddress

    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
    except (OSError, ValueError):
        return False


def serve(options: ServeOptions, loader: Callable[[], Translator] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM; 0 after a graceful shutdown. A model that cannot load stops it: its
    error is raised (one sentence for a user's mistake, through the command line)."""
    import uvicorn

    from .libretranslate import ApiKeys, read_api_keys

    cuda = False
    if options.engine in (None, "torch"):
        import torch  # the default engine depends on a GPU; torch loads with the model anyway

        cuda = torch.cuda.is_available()
    models = plan_models([options.model, *options.more_models], options.engine, cuda)
    for model in models:
        needed = {"onnx": "onnxruntime", "ctranslate2": "ctranslate2"}.get(model.engine)
        if needed and importlib.util.find_spec(needed) is None:
            raise CommandLineError(f"the {model.engine} engine needs {needed}, which the export extra installs: "
                                   f"{EXPORT_EXTRA_HINT}.")
    keys = ApiKeys(read_api_keys(options.api_keys)) if options.api_keys else None
    configure_logging()
    sock = bind(options.host, options.port)
    host, port = sock.getsockname()[:2]
    families = MetricFamilies()
    states = []
    for model in models:
        own = replace(options, model=model.given, more_models=(),
                      workers=options.workers or default_workers(model.engine, cuda, options.threads))
        states.append(ServerState(own, model.engine, model.folder, loader, pair=model.pair, families=families))
    service = Service(states, keys, families)
    config = uvicorn.Config(build_app(service), lifespan="on", access_log=False, log_level="info",
                            timeout_graceful_shutdown=None)
    server = uvicorn.Server(config)

    def stop_on_load_error() -> None:
        server.should_exit = True

    for state in states:
        state.on_load_error = stop_on_load_error
    shown = f"[{host}]" if ":" in host else host
    if len(states) > 1:
        logger.info("serving %d models: %s", len(states),
                    ", ".join(f"{describe_pairs([state.pair])} from {state.folder}" for state in states if state.pair))
    if keys is None and not is_loopback(options.host):
        logger.warning("no --api_keys: anyone who can reach %s:%d may translate (the server is open beyond this "
                       "machine)", shown, port)
    elif keys is not None:
        logger.info("API keys: %d accepted (from --api_keys), %d with a requests-per-minute limit",
                    len(keys.limits), sum(limit is not None for limit in keys.limits.values()))
    logger.info("listening on http://%s:%d (POST / or /predict, POST /translate, POST /detect, GET /languages, "
                "GET /health, GET /metrics)", shown, port)
    with exit_quietly_on_signals():
        server.run(sockets=[sock])
    for state in states:
        if state.load_error is not None:
            raise state.load_error
    logger.info("stopped: %d requests answered", int(families.value("deepnmt_requests_total")))
    return 0
