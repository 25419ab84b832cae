"""`deepnmt serve`: a self-hosted HTTP translation server with dynamic batching (docs/serving.md).

    deepnmt serve runs/my-model                      # http://127.0.0.1:8000, the fastest engine the folder has
    curl -s localhost:8000/ -d '{"inputs": "Let there be light.", "parameters": {"num_beams": 4}}'
    # [{"translation_text": "Sea la luz."}]

Routes: ``POST /`` and ``POST /predict`` take the Inference Endpoints payload ``{"inputs": str | list[str],
"parameters": {...}}`` and answer what the folder's translation pipeline (and ``handler.py``) answer;
``GET /health`` is 200 once the model is loaded and 503 before; ``GET /metrics`` is Prometheus' text format
(prometheus_client, labelled by model and route); ``POST /translate``, ``POST /detect``, ``GET|POST /languages`` and
``GET /frontend/settings`` are LibreTranslate's API. Several model folders make one server of several language pairs:
a request goes to the model of the pair it names (``parameters.src_lang`` / ``tgt_lang``, or LibreTranslate's
``source`` / ``target``). ``--api_keys`` closes the translation routes to requests without one of the file's keys
(403) and limits each key's requests per minute (429).

The package, one module per job (each imports only those listed above it, and this file re-exports them):

=========================  ==========================================================================================
`options`                  what the server was told (`ServeOptions`) and decides before loading: each folder's engine
                           (`choose_engine`), ``--workers``' default (`default_workers`), the models and their
                           language pairs (`plan_models`)
`translators`              the contract between the server and an engine: `Translator`, a request's `Settings`, a
                           tokenized text (`Source`), the parameters a request may give and their checks
`engines`                  the engines: `PipelineTranslator` (torch, ONNX), `CTranslate2Translator`, `load_translator`
`workers`                  `ProcessTranslator`: a worker's searches in a child process (``--workers`` > 1)
`metrics`                  the Prometheus metrics: `MetricFamilies` (a server's), `Metrics` (a model's batches)
`queues`                   the waiting sentences (`Job`, `Item`, `SentenceQueues`) and the mechanics of taking them out
`batcher`                  `Batcher`: which sentences make the next batch (its policy: `Batcher.choose`), and running
                           the batches' searches on the worker threads
`libretranslate`           what LibreTranslate's API needs: `ApiError`, the API keys, reading its request bodies,
                           language detection (lingua), the text nodes of HTML
`service`                  what the routes share: each model's `ServerState` (its translators, batcher, metrics label)
                           and the `Service` of all of them (routing by language pair, the keys, the detector)
`handling`                 what every route does: count it, check its key, answer an error, `translate_texts`
`libretranslate_routes`    ``/translate``, ``/detect``, ``/languages``, ``/frontend/settings``
`routes`                   `build_app` (the starlette application) and the server's own routes: ``/``, ``/predict``,
                           ``/health``, ``/metrics``
`app`                      `serve`: start-up, uvicorn, and the exit on SIGINT/SIGTERM
=========================  ==========================================================================================

How a request flows through them:

1. `routes` (or `libretranslate_routes`) reads the request and its key (`handling`), and `service` picks the model of
   its language pair (``source=auto``: the language `libretranslate`'s detector finds);
2. `handling.Handling.translate_texts` checks its parameters with the model's first translator (`engines`: names,
   types, values; `Settings`) and tokenizes each text with the pipeline's own ``preprocess``; a text over
   ``--max_input_tokens`` is refused with 413 (the server never truncates), a request that does not fit in the queue
   with 503 and ``Retry-After``;
3. its sentences join the queue (`queues`) of their *generation parameters*: requests with different parameters are
   never decoded in one call. When the request sets no length, each text has its own *new-token budget* (1.5 × the
   source + 10, `hf_deepnmt.pipeline_translation.new_token_budget`); the torch and ONNX engines decode texts of every
   budget in one search that retires each sentence once it is done (`hf_deepnmt.retiring_search`; ``--search
   retiring``, the default), and otherwise (``--search generate``, CTranslate2, settings that search does not take)
   the queue is also per budget, so that a batch is one `generate` call whose length its sentences' budget bounds;
4. `batcher` hands each free worker (``--workers``, each with its own model instance: a thread of this process, or a
   child process, `workers`) one batch: the oldest waiting sentence's queue, as soon as ``--max_batch_size``
   sentences of it wait or the oldest has waited ``--max_wait_ms`` (meanwhile, a full batch of another queue goes
   first); when more wait than fit, the batch is, for one retiring search, the oldest requests' sentences (whole
   requests), else the ``--max_batch_size`` sentences closest in length that include the oldest;
5. the worker's translator (`engines`) pads the batch with the pipeline's collate function, runs the search and the
   pipeline's ``postprocess``; each sentence's translations go back to its request as soon as its search is over
   (with ``--continuous_batching``, new sentences join the running search between decoder steps); a request whose
   client has gone leaves the queue; an exception fails the requests of that batch only (500; 400 for a user's
   mistake) and the server goes on;
6. `routes` answers in the pipeline's shape (or `libretranslate_routes` in LibreTranslate's), and `metrics` counts it.

SIGTERM or SIGINT (`app`): uvicorn stops accepting connections, every request in flight is answered, then the process
exits with status 0. Only the standard library is imported at module level: starlette, uvicorn, prometheus_client and
lingua (the ``serve`` extra), torch and the model load when the server starts.
"""

from __future__ import annotations

from .options import (EXPORT_MANIFEST, ONNX_SUBFOLDER, RETRY_AFTER_S, ServedModel, ServeOptions, choose_engine,
                      default_workers, describe_pairs, plan_models)
from .translators import (CTRANSLATE2_PARAMETERS, GENERATION_PARAMETERS, PIPELINE_PARAMETERS, InputTooLong, More,
                          Settings, Source, Translator, budget_of, check_parameter_types)
from .engines import CTranslate2Translator, PipelineTranslator, load_translator
from .workers import ProcessTranslator
from .metrics import MetricFamilies, Metrics, Observed
from .queues import Batch, Item, Job, QueueFull, SentenceQueues
from .batcher import Batcher
from .libretranslate import ApiError, ApiKeys, HtmlDocument, LanguageDetector, read_api_keys
from .service import ServerState, Service
from .handling import ClientGone, Handling
from .libretranslate_routes import LibreTranslateRoutes
from .routes import ServerRoutes, answer, build_app
from .app import bind, configure_logging, exit_quietly_on_signals, is_loopback, serve

__all__ = [
    "CTRANSLATE2_PARAMETERS", "EXPORT_MANIFEST", "GENERATION_PARAMETERS", "ONNX_SUBFOLDER", "PIPELINE_PARAMETERS",
    "RETRY_AFTER_S", "ApiError", "ApiKeys", "Batch", "Batcher", "CTranslate2Translator", "ClientGone", "Handling",
    "HtmlDocument", "InputTooLong", "Item", "Job", "LanguageDetector", "LibreTranslateRoutes", "MetricFamilies",
    "Metrics", "More", "Observed", "PipelineTranslator", "ProcessTranslator", "QueueFull", "SentenceQueues",
    "ServeOptions", "ServedModel", "ServerRoutes", "ServerState", "Service", "Settings", "Source", "Translator",
    "answer", "bind", "budget_of", "build_app", "check_parameter_types", "choose_engine", "configure_logging",
    "default_workers", "describe_pairs", "exit_quietly_on_signals", "is_loopback", "load_translator", "plan_models",
    "read_api_keys", "serve",
]
