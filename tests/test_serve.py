"""`deepnmt serve` (the package training/serve/): real server processes on a free loopback port.

* answers: the Inference Endpoints payload answered exactly as `handler.py` and the folder's translation pipeline
  answer it, for requests that were in flight together and decoded in one batch (seen in /metrics), with requests of
  other generation parameters decoded apart; the ONNX export of a folder served by default; a CTranslate2 export;
* faults: malformed JSON, wrong types, unknown parameters → 400 with one sentence; over-long texts → 413; /health 503
  while loading; a full queue → 503 with Retry-After; an exception inside a batch → 500 for that batch only; a client
  that leaves is taken out of the queue; SIGTERM answers every request in flight, then exits 0;
* the batching rules themselves (`Batcher`, no server) and the command line's one-sentence refusals.

starlette and uvicorn are the `serve` extra: without them these tests skip, unless DEEPNMT_REQUIRE_SERVE=1 (set by
`bash run.sh test`, i.e. CI), where a missing extra fails. The engine tests need the `export` extra likewise
(DEEPNMT_REQUIRE_EXPORT=1). The model is a briefly trained tiny Transformer whose beam search is decided by wide
margins (its outputs are the same in any batch composition, checked below), so equal answers are not luck.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import PARALLEL

if os.environ.get("DEEPNMT_REQUIRE_SERVE") == "1":
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
else:
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")

from serve_fault_worker import FAULT_MAX_NEW_TOKENS  # noqa: E402

from hf_deepnmt_training.cli import main  # noqa: E402
from hf_deepnmt_training.serve import Batcher, Metrics, Settings, Source, choose_engine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "serve_fault_worker.py"
SOURCES = [source for source, _ in PARALLEL] + ["Let there be light.", "The earth was void."]
PARAMETERS = {"num_beams": 3, "max_new_tokens": 12}


def require_export_extra(module: str) -> None:
    if os.environ.get("DEEPNMT_REQUIRE_EXPORT") == "1":
        __import__(module)
    else:
        pytest.importorskip(module)


# ------------------------------------------------------------------------------------------------ a server process
class Server:
    """`deepnmt serve FOLDER --port 0 ...` (or the fault worker) as a child process, started at construction (without
    waiting: several start at once); stderr is collected."""

    def __init__(self, folder: Path, *args: str, faults: tuple[float, float] | None = None) -> None:
        serve_args = [str(folder), "--port", "0", "--threads", "1", *args]
        command = ([sys.executable, str(WORKER), *map(str, faults), *serve_args] if faults else
                   [sys.executable, "-m", "hf_deepnmt_training.cli", "serve", *serve_args])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.listening = threading.Event()
        self.port = 0
        threading.Thread(target=self._read, daemon=True).start()

    def wait_listening(self, timeout: float = 120) -> None:
        if not self.listening.wait(timeout):
            self.process.kill()
            raise AssertionError("the server never said where it listens:\n" + self.log())

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                self.listening.set()

    def log(self) -> str:
        return "".join(self.lines)[-5000:]

    def request(self, method: str, path: str, body: bytes | None = None,
                timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def post(self, payload: object, path: str = "/") -> tuple[int, object]:
        status, _, body = self.request("POST", path, json.dumps(payload).encode())
        return status, json.loads(body)

    def wait_ready(self, timeout: float = 120) -> list[int]:
        """Poll /health until 200; the status codes seen on the way."""
        self.wait_listening(timeout)
        seen, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.request("GET", "/health")[0]
            seen.append(status)
            if status == 200:
                return seen
            assert self.process.poll() is None, self.log()
            time.sleep(0.05)
        raise AssertionError("the server never became ready:\n" + self.log())

    def metrics(self) -> dict[str, float]:
        status, headers, body = self.request("GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
        return parse_prometheus(body.decode())

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise


def parse_prometheus(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` of Prometheus' text format; every line must be a comment or a sample. The
    ``model`` and ``route`` labels (issue 62: one series per model and route) are summed over: ``name{code="200"}``
    is every model's and route's count of that code; bucket bounds are read as numbers (prometheus_client writes
    ``le="4.0"``, the key is ``le="4"``)."""
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("# "):
            assert re.fullmatch(r"# (HELP \w+ .+|TYPE \w+ (counter|gauge|histogram))", line), line
            continue
        match = re.fullmatch(r'(\w+)(?:\{((?:\w+="[^"]*",?)*)\})? (\S+)', line)
        assert match, line
        labels = [(name, f"{float(value):g}" if name == "le" and value != "+Inf" else value)
                  for name, value in re.findall(r'(\w+)="([^"]*)"', match.group(2) or "")]
        kept = ",".join(f'{name}="{value}"' for name, value in labels if name not in ("model", "route"))
        key = f"{match.group(1)}{{{kept}}}" if kept else match.group(1)
        samples[key] = samples.get(key, 0.0) + float(match.group(3))
    return samples


def concurrently(calls: list) -> list:
    """Run the zero-argument ``calls`` at the same time; their results in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


# ------------------------------------------------------------------------------------------------ the model
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread in this process: the server processes (one thread each) run beside it, and two spinning
    OpenMP threads on a busy core slow a tiny model's training a hundredfold."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny Transformer trained for 60 steps on the tiny corpus (export_cases.train_briefly): outputs differ from
    text to text and its search is decided by wide margins (init_std 0.5)."""
    from export_cases import train_briefly, variant_model

    folder = tmp_path_factory.mktemp("served") / "model"
    model = train_briefly(variant_model("post_ln", len(tiny_tokenizer)), tiny_tokenizer)
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def handler(model_folder):
    from hf_deepnmt.handler import EndpointHandler

    return EndpointHandler(str(model_folder))


@pytest.fixture(scope="module")
def servers(model_folder):
    """The two servers of the answer and fault tests, started at once (their start-up, mostly imports, overlaps):

    * ``plain``: `deepnmt serve` with batches of up to 7 sentences that wait up to 1 s to fill, texts of 40 tokens,
      two workers (two model instances; every answer test below is then answered by either);
    * ``faulty``: the fault worker (tests/serve_fault_worker.py): the model loads 1.5 s late, every batch takes 0.5 s
      more, a batch asking for max_new_tokens = 13 raises; batches of 2 that do not wait, a queue of 4 sentences.
      What it answered while loading is kept (``health_seen``, ``loading_answer``).
    """
    plain = Server(model_folder, "--max_batch_size", "7", "--max_wait_ms", "1000", "--max_input_tokens", "40",
                   "--workers", "2")
    faulty = Server(model_folder, "--max_batch_size", "2", "--max_queue", "4", "--max_wait_ms", "0", "--workers", "1",
                    faults=(1.5, 0.5))
    try:
        faulty.wait_listening()
        faulty.loading_answer = faulty.request("POST", "/", json.dumps({"inputs": "x"}).encode())
        faulty.health_seen = faulty.wait_ready()
        plain.wait_ready()
        yield {"plain": plain, "faulty": faulty}
    finally:
        exits = [(process.stop(), process) for process in (plain, faulty)]
    for code, process in exits:
        assert code == 0, process.log()


@pytest.fixture(scope="module")
def server(servers):
    return servers["plain"]


@pytest.fixture(scope="module")
def faulty(servers):
    return servers["faulty"]


# ------------------------------------------------------------------------------------------------ answers
@pytest.mark.integration
def test_requests_in_flight_together_are_one_batch_answered_as_the_pipeline_and_handler_answer(server, handler):
    status, _, body = server.request("GET", "/health")
    assert status == 200 and json.loads(body)["engine"] == "torch"
    other = {"num_beams": 2, "max_new_tokens": 12}
    n_best = {"num_beams": 3, "num_return_sequences": 2, "max_new_tokens": 12}
    # 7 sentences with PARAMETERS (one batch of --max_batch_size 7, closed as soon as it is full), sent at once with
    # two requests of other parameters, each decoded in a batch of its own
    requests = [
        {"inputs": SOURCES[0], "parameters": PARAMETERS},
        {"inputs": [SOURCES[1], "", SOURCES[2]], "parameters": PARAMETERS},
        {"inputs": SOURCES[3:6], "parameters": PARAMETERS},
        {"inputs": [SOURCES[6]], "parameters": PARAMETERS},
        {"inputs": SOURCES[7], "parameters": other},
        {"inputs": [SOURCES[0], SOURCES[7]], "parameters": n_best},
    ]
    before = server.metrics()
    answers = concurrently([lambda r=r, p=path: server.post(r, p)
                            for r, path in zip(requests, ["/", "/predict"] * 3)])
    after = server.metrics()
    assert [status for status, _ in answers] == [200] * len(requests)
    assert [body for _, body in answers] == [handler(request) for request in requests]

    # the batches: one of the 7 sentences with PARAMETERS, one of 1 and one of 2 (never mixed)
    def delta(name):
        return after[name] - before.get(name, 0)

    assert delta("deepnmt_batches_total") == 3 and delta("deepnmt_sentences_total") == 10
    assert delta('deepnmt_batch_size_sentences_bucket{le="4"}') == 2
    assert delta('deepnmt_batch_size_sentences_bucket{le="8"}') == 3 and delta("deepnmt_batch_size_sentences_sum") == 10
    assert re.search(r"batch \d+: 7 sentences from 4 requests", server.log())
    assert "2 search(es) at once" in server.log()  # --workers 2: two model instances were loaded
    # the same composition through the pipeline itself: one call on the 7 sentences, padded together
    translate = handler.pipeline
    batch = [SOURCES[0], SOURCES[1], SOURCES[2], *SOURCES[3:6], SOURCES[6]]
    together = [record["translation_text"] for record in translate(batch, batch_size=7, **PARAMETERS)]
    served = [answers[0][1][0], answers[1][1][0], answers[1][1][2], *answers[2][1], answers[3][1][0]]
    assert [record["translation_text"] for record in served] == together
    assert answers[1][1][1] == {"translation_text": ""} and len(set(together)) >= 5  # a mix-up would show


@pytest.mark.integration
def test_texts_of_different_budgets_are_one_retiring_search_answered_as_the_handler_answers(server, handler):
    """Without a length in the request, each text has its own new-token budget: the server decodes the 7 texts (3
    budgets) in one batch, with the retiring search, and answers what the handler (one generate call per budget)
    answers."""
    from hf_deepnmt.pipeline_translation import new_token_budget

    tokenizer = handler.pipeline.tokenizer
    budgets = {new_token_budget(len(tokenizer(text)["input_ids"]), 64) for text in SOURCES[:7]}
    assert len(budgets) >= 2, budgets  # the batch really mixes budgets
    requests = [{"inputs": SOURCES[:3], "parameters": {"num_beams": 3}},
                {"inputs": SOURCES[3:5], "parameters": {"num_beams": 3}},
                {"inputs": SOURCES[5:7], "parameters": {"num_beams": 3}}]
    before = server.metrics()
    answers = concurrently([lambda r=r: server.post(r) for r in requests])
    after = server.metrics()
    assert answers == [(200, handler(request)) for request in requests]
    assert after["deepnmt_batches_total"] - before["deepnmt_batches_total"] == 1
    texts = [record["translation_text"] for _, body in answers for record in body]
    assert len(set(texts)) >= 5  # a mix-up would show


@pytest.mark.integration
def test_bad_requests_get_400_with_one_sentence_naming_the_field(server):
    bad = [
        (b'{"inputs": "x"', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'"x"', "the request body is str"),
        (b'{"inputs": 3}', "`inputs` = 3 is not allowed"),
        (b'{"inputs": []}', "non-empty list of strings"),
        (b'{"inputs": ["x", 4]}', "non-empty list of strings"),
        (b'{"text": "x"}', "fields ['text']"),
        (b'{"inputs": "x", "parameters": [4]}', "`parameters` = [4] is not allowed"),
        (b'{"inputs": "x", "parameters": {"num_beam": 4}}', "`parameters.num_beam` is not a parameter this server "
                                                            "takes"),
        (b'{"inputs": "x", "parameters": {"num_beams": "4"}}', '`parameters.num_beams` = "4" is not allowed; it must '
                                                              "be an integer"),
        (b'{"inputs": "x", "parameters": {"do_sample": 1}}', "`parameters.do_sample` = 1 is not allowed"),
        (b'{"inputs": "x", "parameters": {"num_beams": 0}}', "`num_beams` = 0 is not allowed"),
        (b'{"inputs": "x", "parameters": {"num_beams": 2, "num_return_sequences": 3}}',
         "`parameters.num_return_sequences` = 3 is more than `num_beams` = 2"),
        (b'{"inputs": "x", "parameters": {"max_new_tokens": 64}}', "`parameters.max_new_tokens` = 64 is more than "
                                                                   "this model can generate (63"),
        (b'{"inputs": "x", "parameters": {"tgt_lang": 3}}', "`parameters.tgt_lang` = 3 is not allowed"),
    ]
    for body, words in bad:
        status, headers, answer = server.request("POST", "/", body)
        error = json.loads(answer)
        assert status == 400 and headers["content-type"] == "application/json", (body, status, answer)
        assert list(error) == ["error"] and words in error["error"] and "\n" not in error["error"], (body, error)
    assert server.request("GET", "/health")[0] == 200


@pytest.mark.integration
def test_texts_over_max_input_tokens_get_413_and_are_never_truncated(server, tiny_tokenizer):
    long = " ".join(SOURCES[:3])  # > 40 tokens, under the model's 64
    too_long = " ".join(SOURCES * 3)  # over the model's 64
    assert 40 < len(tiny_tokenizer(long)["input_ids"]) <= 64 < len(tiny_tokenizer(too_long)["input_ids"])
    status, answer = server.post({"inputs": [SOURCES[0], long], "parameters": PARAMETERS})
    assert status == 413 and re.fullmatch(r"`inputs\[1\]` has \d+ tokens, more than the 40 this server accepts "
                                          r"\(--max_input_tokens; the model accepts 64\); split it into shorter "
                                          r"texts\.", answer["error"]), answer
    status, answer = server.post({"inputs": too_long})
    assert status == 413 and answer["error"].startswith("`inputs[0]` has ")
    status, answer = server.post({"inputs": ["x"] * 257})  # more texts than --max_queue (256) can ever hold
    assert status == 413 and "--max_queue = 256" in answer["error"]


@pytest.mark.integration
def test_metrics_count_requests_errors_and_latency(server):
    before = server.metrics()
    assert server.post({"inputs": "x", "parameters": {"nonsense": 1}})[0] == 400
    assert server.post({"inputs": ""})[0] == 200  # a blank text is answered without the model
    after = server.metrics()
    for name, grown in (('deepnmt_requests_total{code="400"}', 1), ('deepnmt_requests_total{code="200"}', 1),
                        ('deepnmt_request_errors_total{reason="bad_request"}', 1),
                        ("deepnmt_request_duration_seconds_count", 2)):
        assert after[name] - before.get(name, 0) == grown, name
    assert after["deepnmt_model_loaded"] == 1 and after["deepnmt_queue_depth_sentences"] == 0
    assert after["deepnmt_requests_in_flight"] == 0
    assert after['deepnmt_request_duration_seconds_bucket{le="+Inf"}'] == after["deepnmt_request_duration_seconds_count"]


def test_a_path_or_method_the_server_does_not_have_is_answered_in_json(tmp_path):
    """Issue 66 item 6: `GET /` was answered in plain text ("Method Not Allowed") where every other error of the
    server is `{"error": "<one sentence>"}`; a method a path does not take (405, keeping ``Allow``) and a path the
    server does not have (404) are JSON sentences too. The app is called as uvicorn calls it (ASGI), without a
    model: the routing answers before any route runs."""
    from hf_deepnmt_training.serve import ServeOptions, ServerState, build_app

    app = build_app(ServerState(ServeOptions(model=str(tmp_path)), "torch", tmp_path))

    def call(method: str, path: str) -> tuple[int, dict[str, str], bytes]:
        sent: list[dict] = []

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
                 "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": [],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}
        asyncio.run(app(scope, receive, send))
        start = next(message for message in sent if message["type"] == "http.response.start")
        headers = {key.decode().lower(): value.decode() for key, value in start["headers"]}
        return start["status"], headers, b"".join(message.get("body", b"") for message in sent
                                                 if message["type"] == "http.response.body")

    for method, path, code, sentence in (
            ("GET", "/", 405, "GET / is not allowed; use POST /."),
            ("PUT", "/predict", 405, "PUT /predict is not allowed; use POST /predict."),
            ("POST", "/health", 405, "POST /health is not allowed; use GET or HEAD /health."),
            ("GET", "/translation", 404, "/translation is not a path of this server; POST / or /predict translates "
                                         "(POST /translate, /detect and GET /languages in LibreTranslate's API), GET "
                                         "/health and GET /metrics report."),
            ("GET", "/translate", 405, "GET /translate is not allowed; use POST /translate.")):
        status, headers, body = call(method, path)
        assert (status, headers["content-type"], json.loads(body)) == (code, "application/json",
                                                                       {"error": sentence}), (method, path, body)
        assert code != 405 or set(headers["allow"].split(", ")) in ({"POST"}, {"GET", "HEAD"})


# ------------------------------------------------------------------------------------------------ faults
@pytest.mark.integration
def test_health_is_503_and_requests_wait_to_be_retried_until_the_model_is_loaded(faulty):
    assert faulty.health_seen[0] == 503 and faulty.health_seen[-1] == 200
    status, headers, body = faulty.loading_answer
    assert status == 503 and headers["retry-after"] == "1" and "still loading" in json.loads(body)["error"]


@pytest.mark.integration
def test_a_full_queue_answers_503_with_retry_after_and_the_rest_are_served(faulty):
    answers = concurrently([lambda i=i: faulty.request("POST", "/", json.dumps(
        {"inputs": SOURCES[i % len(SOURCES)], "parameters": PARAMETERS}).encode()) for i in range(10)])
    statuses = [status for status, _, _ in answers]
    # the queue takes 4 sentences and the running batch at most 2: some of the 10 are refused, 4 at least are served
    assert set(statuses) <= {200, 503} and statuses.count(200) >= 4 and statuses.count(503) >= 1, statuses
    for status, headers, body in answers:
        if status == 503:
            assert headers["retry-after"] == "1" and "--max_queue" in json.loads(body)["error"]
        else:
            assert json.loads(body)[0]["translation_text"]
    assert faulty.metrics()['deepnmt_request_errors_total{reason="queue_full"}'] == statuses.count(503)


@pytest.mark.integration
def test_an_exception_in_a_batch_fails_its_requests_with_500_and_the_server_goes_on(faulty):
    broken = {"inputs": SOURCES[0], "parameters": {"max_new_tokens": FAULT_MAX_NEW_TOKENS}}
    fine = {"inputs": SOURCES[1], "parameters": PARAMETERS}
    (status_broken, answer_broken), (status_fine, answer_fine) = concurrently(
        [lambda: faulty.post(broken), lambda: faulty.post(fine)])
    assert status_broken == 500 and answer_broken == {"error": "the translation failed: RuntimeError: injected fault"}
    assert status_fine == 200 and answer_fine[0]["translation_text"]
    assert faulty.post(fine) == (200, answer_fine)
    assert faulty.metrics()["deepnmt_batch_failures_total"] >= 1


@pytest.mark.integration
def test_a_client_that_leaves_is_taken_out_of_the_queue(faulty):
    before = faulty.metrics()
    first = threading.Thread(target=faulty.post, args=({"inputs": SOURCES[0], "parameters": PARAMETERS},))
    first.start()  # its batch holds the worker for 0.5 s
    time.sleep(0.1)
    body = json.dumps({"inputs": SOURCES[1:3], "parameters": PARAMETERS}).encode()
    leaving = socket.create_connection(("127.0.0.1", faulty.port))
    leaving.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (len(body), body))
    time.sleep(0.1)
    leaving.close()  # gone while its two sentences wait
    time.sleep(0.1)
    started = time.monotonic()
    assert faulty.post({"inputs": SOURCES[3], "parameters": PARAMETERS})[0] == 200
    first.join()
    after = faulty.metrics()
    assert after["deepnmt_client_disconnects_total"] - before.get("deepnmt_client_disconnects_total", 0) == 1
    # only the two requests that stayed were translated, the leaving one's sentences never reached the model
    assert after["deepnmt_sentences_total"] - before["deepnmt_sentences_total"] == 2
    assert time.monotonic() - started < 2.0


@pytest.mark.integration
def test_sigterm_answers_every_request_in_flight_then_exits_0(faulty):
    """The last test of the fault server: it stops it (5 requests: at most 1-2 in the running batch, the rest fit in
    the queue of 4; each batch of 2 takes 0.5 s more)."""
    results: list = []
    clients = [threading.Thread(target=lambda i=i: results.append(faulty.post(
        {"inputs": SOURCES[i], "parameters": PARAMETERS}))) for i in range(5)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 30
    while faulty.metrics()["deepnmt_requests_in_flight"] < 5:
        assert time.monotonic() < deadline, faulty.log()
        time.sleep(0.02)
    faulty.process.send_signal(signal.SIGTERM)
    refused_while_answering = False
    while time.monotonic() < deadline:  # the listening socket closes at once, before the answers are all given
        try:
            socket.create_connection(("127.0.0.1", faulty.port), timeout=1).close()
        except ConnectionRefusedError:
            refused_while_answering = len(results) < 5
            break
        time.sleep(0.02)
    for client in clients:
        client.join(60)
    assert faulty.process.wait(60) == 0, faulty.log()
    assert refused_while_answering
    assert len(results) == 5 and all(status == 200 and answer[0]["translation_text"] for status, answer in results)
    assert re.search(r"stopped: \d+ requests answered", faulty.log())


# ------------------------------------------------------------------------------------------------ other engines
@pytest.fixture(scope="module")
def engine_servers(model_folder, tmp_path_factory):
    """The model folder with an ONNX export in onnx/ and a CTranslate2 export, each served with the default engine
    (both servers started at once)."""
    require_export_extra("onnxruntime")
    require_export_extra("ctranslate2")
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_deepnmt.export import export_model

    scratch = tmp_path_factory.mktemp("engines")
    with_onnx = scratch / "with_onnx"
    shutil.copytree(model_folder, with_onnx)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(model_folder), AutoTokenizer.from_pretrained(model_folder)
    export_model(model, tokenizer, with_onnx / "onnx", "onnx")
    export_model(model, tokenizer, scratch / "ct2", "ctranslate2")
    processes = {"onnx": Server(with_onnx, "--max_wait_ms", "200"), "ctranslate2": Server(scratch / "ct2")}
    try:
        for process in processes.values():
            process.wait_ready()
        yield {**processes, "folders": {"onnx": with_onnx, "ctranslate2": scratch / "ct2"}}
    finally:
        exits = [(process.stop(), process) for process in processes.values()]
    for code, process in exits:
        assert code == 0, process.log()


@pytest.mark.integration
def test_a_folder_with_an_onnx_export_is_served_by_onnx_runtime_by_default(engine_servers):
    from hf_deepnmt.handler import EndpointHandler

    process, folder = engine_servers["onnx"], engine_servers["folders"]["onnx"]
    assert json.loads(process.request("GET", "/health")[2])["engine"] == "onnx"
    requests = [{"inputs": SOURCES[:4], "parameters": PARAMETERS}, {"inputs": SOURCES[4], "parameters": PARAMETERS},
                {"inputs": SOURCES[5:], "parameters": {"num_beams": 3}}]  # own budgets: the retiring search
    answers = concurrently([lambda r=r: process.post(r) for r in requests])
    endpoint = EndpointHandler(str(folder))
    assert endpoint.engine == "onnx"
    assert answers == [(200, endpoint(request)) for request in requests]


@pytest.mark.integration
def test_a_ctranslate2_export_is_served_by_ctranslate2(engine_servers):
    from transformers import AutoTokenizer

    from hf_deepnmt.export import load_engine

    process, folder = engine_servers["ctranslate2"], engine_servers["folders"]["ctranslate2"]
    assert json.loads(process.request("GET", "/health")[2])["engine"] == "ctranslate2"
    status, answer = process.post({"inputs": SOURCES[:3], "parameters": PARAMETERS})
    tokenizer = AutoTokenizer.from_pretrained(folder)
    engine = load_engine(folder, "ctranslate2", intra_threads=1)
    expected = tokenizer.batch_decode(engine.generate(tokenizer(SOURCES[:3])["input_ids"], **PARAMETERS),
                                      skip_special_tokens=True)
    assert status == 200 and [record["translation_text"] for record in answer] == expected
    status, answer = process.post({"inputs": "x", "parameters": {"num_return_sequences": 2}})
    assert status == 400 and "(engine ctranslate2)" in answer["error"]
    status, answer = process.post({"inputs": "x", "parameters": {"early_stopping": False}})
    assert status == 400 and "not available with the ctranslate2 engine" in answer["error"]


# ------------------------------------------------------------------------------------------------ batching rules
def _run_batcher(jobs: list[tuple[str, list[int]]], max_batch_size: int,
                 budget=lambda length: None, mixes_budgets: bool = False) -> list[list[tuple[str, int]]]:
    """Submit ``(parameters key, source lengths)`` jobs at once to a `Batcher` whose translation records its calls;
    the calls as ``(key, length)`` lists. ``budget`` gives each source's new-token budget."""
    calls: list[list[tuple[str, int]]] = []

    def translate(sources, settings, deliver=None, more=None):
        calls.append([(settings.key, source.length) for source in sources])
        return [[str(source.length)] for source in sources]

    async def scenario():
        batcher = Batcher(translate, Metrics(), max_batch_size=max_batch_size, max_wait_ms=50, max_queue=100)
        submitted = [batcher.submit(Settings(key=key, parameters={}, num_return_sequences=1,
                                             mixes_budgets=mixes_budgets),
                                    [(i, Source(length, None, budget(length))) for i, length in enumerate(lengths)],
                                    len(lengths))
                     for key, lengths in jobs]
        batcher.start()
        results = await asyncio.gather(*(job.future for job in submitted))
        await batcher.stop()
        return results

    results = asyncio.run(scenario())
    assert results == [[[str(length)] for length in lengths] for _, lengths in jobs]  # back to their requests
    return calls


def test_batches_never_mix_parameters_and_group_the_closest_lengths_with_the_oldest():
    calls = _run_batcher([("a", [30, 5]), ("b", [7]), ("a", [29, 6, 31]), ("a", [4])], max_batch_size=3)
    assert all(len({key for key, _ in call}) == 1 for call in calls)
    # key "a" first (its sentence is the oldest): the 3 lengths closest together that include the oldest (30)
    assert calls[0] == [("a", 29), ("a", 30), ("a", 31)]
    assert sorted(map(sorted, calls)) == sorted(map(sorted, [[("a", 29), ("a", 30), ("a", 31)],
                                                             [("a", 4), ("a", 5), ("a", 6)], [("b", 7)]]))


def test_a_batch_holds_texts_of_one_new_token_budget():
    """Sentences of different new-token budgets (`new_token_budget` of their lengths: 1 → 16, 5 → 24, 12 → 32) are
    never batched together, since the engine would decode them in separate calls; those of one budget are."""
    from hf_deepnmt.pipeline_translation import new_token_budget

    calls = _run_batcher([("a", [1, 5, 12, 2]), ("a", [4, 12, 6])], max_batch_size=8,
                         budget=lambda length: new_token_budget(length, 512))
    assert sorted(map(sorted, calls)) == sorted(map(sorted, [[("a", 1), ("a", 2), ("a", 4)], [("a", 5), ("a", 6)],
                                                             [("a", 12), ("a", 12)]]))


def test_an_engine_that_decodes_every_budget_in_one_search_gets_them_in_one_batch():
    """With the retiring search (`Settings.mixes_budgets`) the budgets share batches: 7 sentences, one batch."""
    from hf_deepnmt.pipeline_translation import new_token_budget

    calls = _run_batcher([("a", [1, 5, 12, 2]), ("a", [4, 12, 6])], max_batch_size=8,
                         budget=lambda length: new_token_budget(length, 512), mixes_budgets=True)
    assert calls == [[("a", 1), ("a", 2), ("a", 4), ("a", 5), ("a", 6), ("a", 12), ("a", 12)]]


def test_one_retiring_search_takes_the_oldest_requests_whole_in_arrival_order():
    """A queue of every budget (`Settings.mixes_budgets`) is served first come, first served, a request's texts in
    one batch: with 4 per batch, request 1 (2 texts) goes with request 2's single text, not with the 3 texts of
    request 3 that would split it (the length windows of the per-budget queues would have taken 30, 31, 29, 32);
    request 3 is next, then request 4; one request larger than a batch is cut."""
    calls = _run_batcher([("a", [30, 5]), ("a", [7]), ("a", [31, 29, 32]), ("a", [4]), ("a", [9, 8, 7, 6, 5])],
                         max_batch_size=4, mixes_budgets=True)
    assert calls == [[("a", 5), ("a", 7), ("a", 30)], [("a", 4), ("a", 29), ("a", 31), ("a", 32)],
                     [("a", 6), ("a", 7), ("a", 8), ("a", 9)], [("a", 5)]]
    per_budget = _run_batcher([("a", [30, 5]), ("a", [7]), ("a", [31, 29, 32]), ("a", [4])], max_batch_size=4)
    assert per_budget[0] == [("a", 29), ("a", 30), ("a", 31), ("a", 32)]  # one generate call: lengths close together


def test_a_sentence_whose_search_is_over_is_answered_before_its_batch_ends():
    """The engine hands a sentence's translations over mid-batch (`deliver`, as the retiring search does when the
    sentence leaves it): a request whose sentences are all delivered is answered while the batch still runs; the
    others at its end, each sentence once."""
    release = threading.Event()
    answered_early = []

    def translate(sources, settings, deliver, more=None):
        deliver(0, ["early"])  # the batch's first source (request "a", one text) is done
        answered_early.append(release.wait(10))  # the test answers request "a" before this batch may end
        return [["late"] if index == 0 else [str(source.length)] for index, source in enumerate(sources)]

    async def scenario():
        batcher = Batcher(translate, Metrics(), max_batch_size=8, max_wait_ms=20, max_queue=100)
        settings = Settings(key="k", parameters={}, num_return_sequences=1, mixes_budgets=True)
        short = batcher.submit(settings, [(0, Source(1, None, None))], 1)
        long = batcher.submit(settings, [(0, Source(5, None, None)), (1, Source(9, None, None))], 2)
        batcher.start()
        first = await asyncio.wait_for(short.future, 10)
        still_running = not long.future.done()
        release.set()
        second = await asyncio.wait_for(long.future, 10)
        await batcher.stop()
        return first, still_running, second

    first, still_running, second = asyncio.run(scenario())
    assert first == [["early"]] and still_running and answered_early == [True]
    assert second == [["5"], ["9"]]


def test_with_two_workers_two_full_batches_are_decoded_at_once_and_a_smaller_one_waits():
    """``--workers 2``: a second full batch is decoded while the first is still being decoded (each search waits at a
    barrier that only two searches running together pass); with one worker it waits. On worker threads a batch that
    is not full waits for the running search to end, as with one worker (two small searches on threads at once were
    slower, docs/serving.md); with worker processes (``full_batch_to_overlap=False``) it goes to the free worker."""

    def run(workers: int, sizes: tuple[int, int], full_batch_to_overlap: bool = True) -> tuple[list, list[bool]]:
        barrier = threading.Barrier(2, timeout=1.5)
        met: list[bool] = []

        def translate(sources, settings, deliver=None, more=None):
            try:
                barrier.wait()
                met.append(True)
            except threading.BrokenBarrierError:
                met.append(False)
            return [[settings.key] for _ in sources]

        async def scenario():
            batcher = Batcher(translate, Metrics(), max_batch_size=4, max_wait_ms=0, max_queue=100, workers=workers,
                              full_batch_to_overlap=full_batch_to_overlap)
            jobs = [batcher.submit(Settings(key=key, parameters={}, num_return_sequences=1),
                                   [(i, Source(3, None, None)) for i in range(size)], size)
                    for key, size in zip("ab", sizes)]
            batcher.start()
            results = await asyncio.gather(*(job.future for job in jobs))
            await batcher.stop()
            return results

        return asyncio.run(scenario()), met

    results, met = run(2, (4, 4))
    assert results == [[["a"]] * 4, [["b"]] * 4] and met == [True, True]
    results, met = run(1, (4, 4))  # one search at a time: the first gives up waiting for a second
    assert results == [[["a"]] * 4, [["b"]] * 4] and met[0] is False
    results, met = run(2, (4, 1))  # the single sentence is held back while the full batch runs
    assert results == [[["a"]] * 4, [["b"]]] and met[0] is False
    results, met = run(2, (4, 1), full_batch_to_overlap=False)  # worker processes: any batch goes to a free worker
    assert results == [[["a"]] * 4, [["b"]]] and met == [True, True]


def test_each_search_running_at_once_has_a_model_instance_of_its_own(model_folder):
    """`ServerState` loads ``--workers`` instances and hands each running search one that no other search holds."""
    from hf_deepnmt_training.serve import ServeOptions, ServerState

    loaded: list[object] = []
    holders: dict[int, int] = {}
    barrier = threading.Barrier(2, timeout=10)

    class Instance:
        engine, max_input_tokens = "torch", 8

        def translate(self, sources, settings, deliver=None, more=None):
            holders[threading.get_ident()] = id(self)
            barrier.wait()  # both searches hold their instance now
            return [["x"] for _ in sources]

    def loader():
        loaded.append(Instance())
        return loaded[-1]

    async def scenario():
        state = ServerState(ServeOptions(model=str(model_folder), workers=2), "torch", model_folder, loader)
        await state.start()
        while state.translator is None:
            await asyncio.sleep(0.01)
        loop = asyncio.get_running_loop()
        settings = Settings(key="k", parameters={}, num_return_sequences=1)
        await asyncio.gather(*(loop.run_in_executor(state.batcher.executor, state.translate,
                                                    [Source(1, None, None)], settings) for _ in range(2)))
        await state.stop()

    asyncio.run(scenario())
    assert len(loaded) == 2 and sorted(holders.values()) == sorted(map(id, loaded))


@pytest.mark.integration
def test_a_worker_process_translates_as_the_server_process_does_and_survives_a_failed_batch(model_folder):
    """`ProcessTranslator` (``--workers`` > 1): a child process with its own instance gives the in-process
    translator's translations, hands each sentence back as its search ends, returns a batch's exception itself and
    then translates the next batch; `close` ends it."""
    from hf_deepnmt_training.serve import ProcessTranslator, load_translator

    local = load_translator("torch", model_folder, threads=1)
    settings = local.prepare({})
    texts = ["the small house", "a cat and a dog are in the big house", "we go home"]
    sources = [local.encode(text, index, settings) for index, text in enumerate(texts)]
    expected = local.translate(sources, settings)
    worker = ProcessTranslator("torch", model_folder, 1, None, "retiring")
    try:
        assert worker.process.is_alive() and worker.max_input_tokens == local.max_input_tokens
        delivered: dict[int, list[str]] = {}
        assert worker.translate(sources, settings, lambda index, candidates: delivered.setdefault(index,
                                                                                                    candidates)) == expected
        assert delivered == dict(enumerate(expected))
        broken = [*sources[:1], replace(sources[1], inputs=None)]  # the child's search fails on the second source
        with pytest.raises(Exception) as failure:
            worker.translate(broken, settings)
        assert type(failure.value).__module__ in ("builtins", "hf_deepnmt.errors"), failure.value
        assert worker.translate(sources, settings) == expected  # the same worker goes on
    finally:
        worker.close()
    assert not worker.process.is_alive() and worker.process.exitcode == 0


@pytest.mark.integration
def test_the_second_worker_of_a_server_searches_in_a_process_of_its_own(server):
    """The plain server runs ``--workers 2``: the second worker's process is the server's child, and answers come
    back through it (the answer tests above are served by either worker)."""
    match = re.search(r"worker 2 of 2 searches in process (\d+)", server.log())
    assert match, server.log()
    child = int(match.group(1))

    def stat() -> list[str]:  # the fields after the process name: state, parent pid, ..., user and system ticks
        return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()

    assert int(stat()[1]) == server.process.pid
    ticks = int(stat()[11]) + int(stat()[12])
    texts = ("a house", "the dog", "we go", "the cat")  # four full batches at once (--max_batch_size 7)
    answers = concurrently([lambda text=text: server.post({"inputs": [text] * 7}) for text in texts])
    assert all(code == 200 for code, _ in answers), answers
    assert int(stat()[11]) + int(stat()[12]) > ticks  # the child searched some of them


def test_two_workers_by_default_only_for_the_torch_engine_on_a_cpu_of_two_cores(monkeypatch):
    import torch

    from hf_deepnmt_training.serve import default_workers

    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert default_workers("torch", cuda=False, threads=None) == 2
    assert default_workers("torch", cuda=True, threads=None) == 1  # a GPU: one instance
    assert default_workers("torch", cuda=False, threads=2) == 1  # the user chose the threads
    assert default_workers("onnx", cuda=False, threads=None) == 1 and default_workers("ctranslate2", False, None) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert default_workers("torch", cuda=False, threads=None) == 1


def test_the_server_decodes_every_budget_in_one_retiring_search_unless_told_otherwise(model_folder):
    """The torch engine's settings: one search over every budget for the model's own settings; one generate call per
    budget with --search generate, for settings the search does not take, or when the request sets the length."""
    from hf_deepnmt_training.serve import load_translator

    retiring = load_translator("torch", model_folder)
    assert retiring.prepare({}).mixes_budgets and retiring.prepare({"num_beams": 2}).mixes_budgets
    assert not retiring.prepare({"repetition_penalty": 1.2}).mixes_budgets
    assert not retiring.prepare({"max_new_tokens": 9}).mixes_budgets
    generate = load_translator("torch", model_folder, search="generate")
    assert not generate.prepare({}).mixes_budgets
    assert retiring.pipeline.model.generate_by_retiring_search  # a budget's generate call: the search, one budget
    assert generate.pipeline.model.generate_by_retiring_search is False  # transformers' own loop, as before


def test_with_continuous_batching_sentences_join_the_running_search_and_get_their_own_translations(model_folder,
                                                                                                   handler):
    """``--continuous_batching``: the sentences ``more`` hands over between decoder steps join the running retiring
    search (the first call's search is half-way when they come) and get what the handler gives each request."""
    from hf_deepnmt_training.serve import load_translator

    translator = load_translator("torch", model_folder, continuous=True)
    settings = translator.prepare({"num_beams": 3})
    assert settings.mixes_budgets and translator.continuous_refused() is None
    # what the server logs when the option cannot work (one generate call per batch)
    assert load_translator("torch", model_folder, search="generate", continuous=True).continuous_refused() \
        .startswith("--search generate decodes each batch in one generate call")
    first, later = SOURCES[:3], [SOURCES[3:5], SOURCES[5:7]]
    sources = [translator.encode(text, index, settings) for index, text in enumerate(first)]
    calls: list[int] = []  # sentences in the search at each call of `more`

    def more(searched: int) -> list:
        calls.append(searched)
        if len(calls) in (2, 4):  # after the first and the third decoder step
            texts = later[0] if len(calls) == 2 else later[1]
            return [translator.encode(text, index, settings) for index, text in enumerate(texts)]
        return []

    delivered: dict[int, list[str]] = {}
    outputs = translator.translate(sources, settings, lambda index, texts: delivered.setdefault(index, texts), more)
    assert calls[1] == 3 and calls[3] >= 1, calls  # both groups joined a search that was running
    assert len(outputs) == 7 and delivered == dict(enumerate(outputs))
    expected = [handler({"inputs": texts, "parameters": {"num_beams": 3}}) for texts in (first, *later)]
    assert [[text] for request in expected for text in (record["translation_text"] for record in request)] == outputs
    # without the option, the search takes no one half-way: `more` is never asked
    calls.clear()
    plain = load_translator("torch", model_folder)
    assert plain.translate([plain.encode(SOURCES[0], 0, settings)], plain.prepare({"num_beams": 3}), None, more) \
        and calls == []


def test_a_running_search_takes_waiting_sentences_of_its_parameters_only_whole_requests_up_to_the_batch_size():
    """`Batcher.admit` (continuous batching): between decoder steps the search gets the oldest waiting requests of
    its own parameters, whole, as many sentences as leave it at most ``--max_batch_size``; sentences of other
    parameters are never taken, and once their oldest has waited ``--max_wait_ms`` the search takes no one more (it
    ends, and their batch goes next)."""
    calls: list[list[tuple[str, int]]] = []  # each search: its first sentences
    joined: list[list[int]] = []  # what each `more` call handed over
    gate = threading.Event()

    def translate(sources, settings, deliver=None, more=None):
        calls.append([(settings.key, source.length) for source in sources])
        total = list(sources)
        if len(calls) == 1:
            gate.wait(10)  # the test queues requests while this search "runs"
            for searched, pause in ((3, 0.0), (1, 0.3)):  # 2 of the 5 sentences left, then 4; then "b" waited 300 ms
                time.sleep(pause)
                joining = list(more(searched))
                joined.append([source.length for source in joining])
                total += joining
        return [[str(source.length)] for source in total]

    async def scenario():
        batcher = Batcher(translate, Metrics(), max_batch_size=5, max_wait_ms=200, max_queue=100)
        settings = {key: Settings(key=key, parameters={}, num_return_sequences=1, mixes_budgets=True)
                    for key in "ab"}

        def submit(key, lengths):
            return batcher.submit(settings[key], [(i, Source(n, None, None)) for i, n in enumerate(lengths)],
                                  len(lengths))

        jobs = [submit("a", [1, 2, 3, 4, 5])]  # a full batch: the search starts at once
        batcher.start()
        await asyncio.sleep(0.05)
        jobs += [submit("a", [6]), submit("b", [9]), submit("a", [7, 8])]
        gate.set()
        results = await asyncio.wait_for(asyncio.gather(*(job.future for job in jobs)), 10)
        await batcher.stop()
        return results, batcher.metrics

    results, metrics = asyncio.run(scenario())
    assert results == [[["1"], ["2"], ["3"], ["4"], ["5"]], [["6"]], [["9"]], [["7"], ["8"]]]
    # 3 in the search: room for 2 — request [6] joins, [7, 8] would be cut in two and waits; then "b" has waited
    # its 200 ms: the search takes no one more, and b's batch goes before the newer [7, 8]
    assert joined == [[6], []], joined
    assert calls == [[("a", 1), ("a", 2), ("a", 3), ("a", 4), ("a", 5)], [("b", 9)], [("a", 7), ("a", 8)]]
    assert metrics.batches == 4 and metrics.sentences == 9 and metrics.search_size.count == 2


def test_a_full_batch_does_not_wait_for_an_older_sentence_of_other_parameters():
    calls = _run_batcher([("b", [7]), ("a", [1, 2, 3])], max_batch_size=3)  # "b" waits its 50 ms for company
    assert calls == [[("a", 1), ("a", 2), ("a", 3)], [("b", 7)]]


def test_one_sentence_batches_with_max_batch_size_1():
    calls = _run_batcher([("a", [3, 1, 2])], max_batch_size=1)
    assert calls == [[("a", 3)], [("a", 1)], [("a", 2)]]  # the oldest first, one at a time


# ------------------------------------------------------------------------------------------------ the command line
def test_choose_engine_takes_the_fastest_the_folder_has(tmp_path):
    from hf_deepnmt_training.errors import CommandLineError

    model = tmp_path / "model"
    (model / "onnx").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    assert choose_engine(model, None) == ("torch", model)
    (model / "onnx" / "deepnmt_export.json").write_text('{"format": "onnx"}')
    assert choose_engine(model, None) == ("onnx", model / "onnx")
    assert choose_engine(model, None, cuda=True) == ("torch", model)  # as handler.py: torch on a GPU
    assert choose_engine(model, "torch") == ("torch", model)
    ct2 = tmp_path / "ct2"
    ct2.mkdir()
    (ct2 / "deepnmt_export.json").write_text('{"format": "ctranslate2"}')
    assert choose_engine(ct2, None) == ("ctranslate2", ct2)
    with pytest.raises(CommandLineError, match="a ctranslate2 export; use --engine ctranslate2"):
        choose_engine(ct2, "torch")
    with pytest.raises(CommandLineError, match="is a model folder; run `deepnmt export --format ctranslate2"):
        choose_engine(model, "ctranslate2")


def test_serve_refuses_bad_command_lines_with_one_sentence(model_folder, tmp_path, capsys):
    for argv, words in (
        (["serve"], "give the model folder once"),
        (["serve", str(model_folder), "--model", str(model_folder)], "give the model folder once"),
        (["serve", str(model_folder), "--max_batch_size", "0"], "--max_batch_size 0 is not allowed"),
        (["serve", str(model_folder), "--workers", "0"], "--workers 0 is not allowed"),
        (["serve", str(model_folder), "--port", "70000"], "--port 70000 is not allowed"),
        (["serve", str(model_folder), "--max_wait_ms", "-1"], "--max_wait_ms -1.0 is not allowed"),
        (["serve", str(model_folder), "--max_bach_size", "4"], "did you mean --max_batch_size"),
        (["serve", str(tmp_path / "missing")], "does not exist"),
        (["serve", str(model_folder), "--engine", "onnx"], "needs an ONNX export"),
    ):
        assert main(argv) == 2, argv
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and error[0].startswith("deepnmt serve: ") and words in error[0], (argv, error)


def test_without_the_serve_extra_serve_says_which_extra_to_install(model_folder, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name in ("starlette", "uvicorn") else find_spec(name, *args))
    assert main(["serve", str(model_folder)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["deepnmt serve: the server needs starlette and uvicorn, which the `serve` extra installs: "
                     "pip install 'hf_deepnmt[serve]'."]


def test_the_serve_benchmark_block_shows_each_cell_and_the_goal():
    """benchmarks/serve_load.py's verdict and benchmarks/report.py's table, on made-up cells (not measurements)."""
    from benchmarks import report, serve_load

    def cell(rate: float, p99: float, errors: int = 0) -> dict:
        return {"clients": 32, "requests": 2000, "sentences": 4000, "wall_s": 100.0, "sentences_per_s": rate,
                "p50_s": 0.5, "p99_s": p99, "mean_s": 0.6, "errors": errors, "time_limited": False, "mean_batch": 30.0}

    section = {"model_dir": "runs/quickstart", "threads": 2, "requests": 2000, "clients": [32], "time_limit_s": 300,
               "parameters": {}, "max_batch_size": {"dynamic": 32, "baseline": 1}, "sentences_in_workload": 4000,
               "runs": {"torch": {"dynamic": {"32": cell(40, 1.5), "exit_status": 0},
                                  "baseline": {"32": cell(10, 9.0), "exit_status": 0}},
                        "onnx_int8": {"dynamic": {"32": cell(50, 2.5), "exit_status": 0},
                                      "baseline": {"32": cell(20, 5.0, errors=1), "exit_status": 0}}}}
    section["goal"] = serve_load.goal(section)
    assert section["goal"]["torch"] == {"speedup": 4.0, "p99_s": 1.5, "errors": 0, "met": True}
    assert not section["goal"]["onnx_int8"]["met"] and section["goal"]["onnx_int8"]["errors"] == 1
    text = "\n".join(report._serve({"command": "python -m benchmarks.run --sections serve", "machine": {"commit": "c"},
                                    "serve": section}))
    assert "| torch | dynamic | 32 | 40.0 | 4.00× | 0.500 | 1.500 | 0 | 30.0 | – | 2000 |" in text
    assert "- torch, 32 clients: dynamic 4.00× the baseline's sentences/s, p99 1.50 s, 0 errors in all its runs — " \
           "goal (≥ 3×, p99 < 2 s, 0 errors) met" in text
    assert "onnx_int8, 32 clients: dynamic 2.50×" in text and text.count("not met") == 1
