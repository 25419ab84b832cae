"""The server's Prometheus metrics (``GET /metrics``, docs/serving.md, "Metrics"): the families of one server
(`MetricFamilies`, prometheus_client, labelled by model and route) and one model's batch metrics (`Metrics`, which
the batcher updates). prometheus_client is imported when a server's families are built."""

from __future__ import annotations

from dataclasses import dataclass

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

