"""What the routes share: each model's `ServerState` (its translators once loaded, one per worker, its batcher and
its metrics label) and the `Service` of every model of a server, with the API keys and the language detector; a
request goes to the model of the language pair it names (`Service.choose`, `Service.pair_state`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import SimpleQueue
from typing import Any

from . import engines
from .batcher import Batcher
from .libretranslate import ApiError, LanguageDetector
from .metrics import MetricFamilies, Metrics
from .options import ServeOptions, describe_pairs
from .translators import PIPELINE_PARAMETERS, More, Settings, Source, Translator, check_parameter_types, first_line
from .workers import ProcessTranslator

logger = logging.getLogger("deepnmt.serve")


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
        self.loader = loader or (lambda: engines.load_translator(  # looked up when the model loads
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
                logger.error("the model could not be loaded: %s", first_line(error))
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



class Service:
    """Every model a server serves (one `ServerState` each: its own batcher, workers and metrics label), the API keys
    and the language detector, shared by the routes (`build_app`). A request for a language pair goes to the model
    that records it (`choose`); two models of one pair are refused at start (`check_pairs`)."""

    def __init__(self, states: Sequence[ServerState], keys: Any = None,
                 families: MetricFamilies | None = None) -> None:
        self.states = list(states)
        self.families = families or self.states[0].metrics.families
        self.keys = keys  # libretranslate.ApiKeys, or None: an open server
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
        state = self.by_pair.get((source, target))
        if state is None:
            raise ApiError(400, f"`source`/`target` = {source} → {target} is not a pair this server translates; it "
                                f"translates {describe_pairs(self.pairs)}.", "unknown_pair")
        return state

    def confidences(self, text: str) -> list[tuple[str, float]]:
        """The served source languages with the detector's confidence (0-100) that ``text`` is in each, best first."""
        if not self.sources:
            raise ApiError(400, "this server's model records no language pair, so it cannot detect a language; "
                                "record the pair (hf_deepnmt.record_language_pair) and serve it again.", "no_pair")
        if self.detector is None:
            self.detector = LanguageDetector(self.sources)
        return self.detector.confidences(text)

    def detect_for(self, text: str, target: str) -> tuple[str, float]:
        """``text``'s detected source language (and confidence) for a translation into ``target``."""
        if not text.strip():  # nothing to detect: the first language translated into `target`
            return next(source for source, into in self.pairs if into == target), 0.0
        language, confidence = self.confidences(text)[0]
        if (language, target) not in self.by_pair:
            raise ApiError(400, f"`q` {text[:40]!r} was detected as {language} (confidence {confidence:g}), and this "
                                f"server does not translate {language} → {target}; it translates "
                                f"{describe_pairs(self.pairs)}.", "unknown_pair")
        return language, confidence

