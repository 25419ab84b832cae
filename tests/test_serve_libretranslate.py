"""Issue 62: `deepnmt serve` with two models of opposite pairs, LibreTranslate's API, API keys, labelled metrics.

A real server process (``deepnmt serve EN_ES ES_EN --api_keys FILE``, each batch 0.3 s slower through
tests/serve_fault_worker.py so that requests are in flight when SIGTERM comes) driven by a real LibreTranslate client
(`libretranslatepy`, form-encoded bodies) and by raw JSON requests:

* /languages, /frontend/settings, /detect among the served source languages; /translate of both pairs answers each
  model's own translation pipeline (`hf_deepnmt.handler.EndpointHandler`), for one text, a list, source=auto, html and
  alternatives; the Inference Endpoints payload routed by ``parameters.src_lang`` / ``tgt_lang``;
* every refusal: 400 (bad fields, a pair not served, a detected language not served, a text too long), 403 (no key, a
  wrong one, on both APIs), 429 with Retry-After (a key over its limit); keys never in the log;
* metrics per model and route; SIGTERM answers the requests in flight of both models, then exits 0;
* a one-model server without keys keeps the old payload and, bound beyond loopback, says that it is open;
* a CTranslate2 export folder beside a model folder, routed by the pair its manifest records;
* the key file's parser, the sliding window, the HTML text nodes, and the refusal of two models of one pair (no
  server; and through the command line).

The serve extra (starlette, uvicorn, prometheus-client, lingua) and libretranslatepy (the dev extra) are needed: these
tests skip without them, unless DEEPNMT_REQUIRE_SERVE=1 (CI), where a missing one fails.
"""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.parse
from pathlib import Path

import pytest
from conftest import PARALLEL

if os.environ.get("DEEPNMT_REQUIRE_SERVE") == "1":  # CI (`bash run.sh test`): the serve and dev extras are installed
    import libretranslatepy
    import lingua  # noqa: F401
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
else:
    pytest.importorskip("starlette")
    pytest.importorskip("prometheus_client")
    pytest.importorskip("lingua")
    libretranslatepy = pytest.importorskip("libretranslatepy")

from test_serve import Server, parse_prometheus  # noqa: E402

from hf_deepnmt_training.errors import CommandLineError  # noqa: E402
from hf_deepnmt_training.serve import plan_models  # noqa: E402
from hf_deepnmt_training.serve.libretranslate import ApiError, ApiKeys, read_api_keys, read_form  # noqa: E402

KEY, TIGHT_KEY = "k3y-open-0123456789", "k3y-tight-abcdef"  # TIGHT_KEY: 3 requests a minute
ENGLISH = ["The earth was without form and void.", "And God saw the light, that it was good."]
SPANISH = ["Y la tierra estaba desordenada y vacía.", "Y vió Dios que la luz era buena."]
# sentences the detector cannot mistake (the served source languages are English and Spanish)
CLEARLY_ENGLISH = "The weather is very nice today and we are going to walk in the park with our friends."
CLEARLY_SPANISH = "El tiempo está muy bonito hoy y vamos a caminar por el parque con nuestros amigos."


# ------------------------------------------------------------------------------------------------ models, server
@pytest.fixture(scope="module", autouse=True)
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _trained(tokenizer, pairs: list[tuple[str, str]], source: str, target: str, folder: Path) -> Path:
    """A tiny Transformer trained 60 steps on ``pairs`` (source → target), its pair recorded, saved in ``folder``."""
    import torch
    from export_cases import variant_model

    from hf_deepnmt import record_language_pair

    model = variant_model("post_ln", len(tokenizer))
    torch.manual_seed(1)
    model.train()
    sources, targets = zip(*pairs)
    batch = tokenizer(list(sources), text_target=list(targets), padding=True, return_tensors="pt")
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):
        loss = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    record_language_pair(model.eval().config, source, target)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tiny_tokenizer) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("two_pairs")
    return {"en-es": _trained(tiny_tokenizer, PARALLEL, "en", "es", root / "en-es"),
            "es-en": _trained(tiny_tokenizer, [(t, s) for s, t in PARALLEL], "es", "en", root / "es-en")}


@pytest.fixture(scope="module")
def handlers(folders):
    from hf_deepnmt.handler import EndpointHandler

    return {pair: EndpointHandler(str(folder)) for pair, folder in folders.items()}


class AnyHostServer(Server):
    """`test_serve.Server`, reading the port of a server listening on any address."""

    def _read(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line)
            match = re.search(r"listening on http://\S+:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                self.listening.set()


@pytest.fixture(scope="module")
def servers(folders, tmp_path_factory):
    """``two``: both models behind API keys (batches 0.3 s slower: requests stay in flight a while); ``open``: the
    en → es model alone, no keys, on every interface."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# clients\n{KEY}\n\n  {TIGHT_KEY}   3\n", encoding="utf-8")
    two = Server(folders["en-es"], str(folders["es-en"]), "--workers", "1", "--max_wait_ms", "20",
                 "--api_keys", str(keys), faults=(0.0, 0.3))
    opened = AnyHostServer(folders["en-es"], "--workers", "1", "--host", "0.0.0.0")
    try:
        two.wait_ready()
        opened.wait_ready()
        yield {"two": two, "open": opened}
    finally:
        exits = [(server.stop(), server) for server in (two, opened)]
    for code, server in exits:
        assert code == 0, server.log()


@pytest.fixture(scope="module")
def server(servers):
    return servers["two"]


def call(server: Server, method: str, path: str, body: object = None, headers: dict[str, str] | None = None,
         form: bool = False) -> tuple[int, dict[str, str], object]:
    """One request; ``body`` as JSON (or form-encoded with ``form``); the answer's status, headers and JSON."""
    data = None
    sent = dict(headers or {})
    if body is not None:
        if form:
            data = urllib.parse.urlencode(body, doseq=True).encode()
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        else:
            data = json.dumps(body).encode()
            sent.setdefault("Content-Type", "application/json")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        raw = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(raw) if raw else None
    finally:
        connection.close()


def pipeline_text(handler, text: str, **parameters) -> list[str]:
    """The model's own translation pipeline: ``text``'s translations."""
    records = handler({"inputs": text, "parameters": parameters})
    return [record["translation_text"] for record in records]


def client(server: Server, key: str | None = KEY):
    return libretranslatepy.LibreTranslateAPI(f"http://127.0.0.1:{server.port}", api_key=key)


# ------------------------------------------------------------------------------------------------ LibreTranslate
@pytest.mark.integration
def test_languages_settings_and_detection_name_the_served_pairs(server):
    languages = client(server).languages()
    assert languages == [{"code": "en", "name": "English", "targets": ["es"]},
                         {"code": "es", "name": "Spanish", "targets": ["en"]}]
    assert call(server, "POST", "/languages")[2] == languages  # GET and POST, no key needed
    status, _, settings = call(server, "GET", "/frontend/settings")
    assert status == 200 and settings["keyRequired"] is True and settings["apiKeys"] is True
    assert set(settings) >= {"charLimit", "frontendTimeout", "apiKeys", "keyRequired", "suggestions",
                             "supportedFilesFormat", "language"}
    assert settings["language"] == {"source": {"code": "en", "name": "English"},
                                    "target": {"code": "es", "name": "Spanish"}}
    for text, language in ((CLEARLY_ENGLISH, "en"), (CLEARLY_SPANISH, "es")):
        found = client(server).detect(text)
        assert [entry["language"] for entry in found] == [language, {"en": "es", "es": "en"}[language]], found
        assert 50 < found[0]["confidence"] <= 100 and all(set(entry) == {"confidence", "language"} for entry in found)


@pytest.mark.integration
def test_both_pairs_translate_as_each_models_own_pipeline(server, handlers):
    lt = client(server)
    for pair, texts in (("en-es", ENGLISH), ("es-en", SPANISH)):
        source, target = pair.split("-")
        expected = [pipeline_text(handlers[pair], text)[0] for text in texts]
        assert [lt.translate(text, source, target) for text in texts] == expected, pair  # form-encoded
        status, _, answer = call(server, "POST", "/translate", {"q": texts, "source": source, "target": target,
                                                                "api_key": KEY})
        assert status == 200 and answer == {"translatedText": expected}, (pair, answer)  # JSON, a list, in order
    english, spanish = (pipeline_text(handlers["en-es"], ENGLISH[0])[0],
                        pipeline_text(handlers["es-en"], SPANISH[0])[0])
    assert english != spanish  # a mix-up of the two models would show
    # the Inference Endpoints payload, routed by parameters.src_lang / tgt_lang; the key as a Bearer header
    bearer = {"Authorization": f"Bearer {KEY}"}
    for pair, text, expected in (("en-es", ENGLISH[0], english), ("es-en", SPANISH[0], spanish)):
        source, target = pair.split("-")
        status, _, answer = call(server, "POST", "/", {"inputs": text, "parameters": {"src_lang": source,
                                                                                        "tgt_lang": target}}, bearer)
        assert (status, answer) == (200, [{"translation_text": expected}]), (pair, answer)
    status, _, answer = call(server, "POST", "/predict", {"inputs": [SPANISH[0]], "api_key": KEY,
                                                          "parameters": {"src_lang": "es"}})
    assert (status, answer) == (200, [{"translation_text": spanish}])  # one language names the pair


@pytest.mark.integration
def test_source_auto_detects_among_the_served_source_languages(server, handlers):
    status, _, answer = call(server, "POST", "/translate", {"q": CLEARLY_SPANISH, "source": "auto", "target": "en",
                                                            "api_key": KEY})
    assert status == 200 and answer["translatedText"] == pipeline_text(handlers["es-en"], CLEARLY_SPANISH)[0]
    detected = answer["detectedLanguage"]
    assert detected["language"] == "es" and 50 < detected["confidence"] <= 100
    status, _, answer = call(server, "POST", "/translate", {"q": [CLEARLY_ENGLISH, ENGLISH[0]], "source": "auto",
                                                            "target": "es", "api_key": KEY}, form=True)
    assert status == 200 and answer["translatedText"] == [pipeline_text(handlers["en-es"], text)[0]
                                                          for text in (CLEARLY_ENGLISH, ENGLISH[0])]
    assert [entry["language"] for entry in answer["detectedLanguage"]] == ["en", "en"]


@pytest.mark.integration
def test_html_keeps_the_markup_and_translates_the_text_nodes(server, handlers):
    first, second = ENGLISH
    document = (f'<p class="verse" title="a &amp; b">{first} <b>{second}</b></p>\n'
                '<script>var s = "The earth";</script><style>p { color: red }</style><!-- The earth --><br/>')
    status, _, answer = call(server, "POST", "/translate", {"q": document, "source": "en", "target": "es",
                                                            "format": "html", "api_key": KEY})
    one, two = (html.escape(pipeline_text(handlers["en-es"], text)[0], quote=False) for text in ENGLISH)
    assert status == 200 and answer["translatedText"] == (
        f'<p class="verse" title="a &amp; b">{one} <b>{two}</b></p>\n'
        '<script>var s = "The earth";</script><style>p { color: red }</style><!-- The earth --><br/>')


@pytest.mark.integration
def test_alternatives_are_the_n_best_of_the_models_beam_search(server, handlers):
    status, _, answer = call(server, "POST", "/translate", {"q": ENGLISH[1], "source": "en", "target": "es",
                                                            "alternatives": 2, "api_key": KEY})
    def beams(pair: str, alternatives: int) -> int:  # the model's own beams, at least one per translation asked
        return max(alternatives + 1, handlers[pair].pipeline.model.generation_config.num_beams or 1)

    best = pipeline_text(handlers["en-es"], ENGLISH[1], num_beams=beams("en-es", 2), num_return_sequences=3)
    assert status == 200 and answer == {"translatedText": best[0], "alternatives": best[1:]}
    status, _, answer = call(server, "POST", "/translate", {"q": SPANISH, "source": "es", "target": "en",
                                                            "alternatives": "1", "api_key": KEY}, form=True)
    expected = [pipeline_text(handlers["es-en"], text, num_beams=beams("es-en", 1), num_return_sequences=2)
                for text in SPANISH]
    assert status == 200 and answer == {"translatedText": [texts[0] for texts in expected],
                                        "alternatives": [texts[1:] for texts in expected]}


@pytest.mark.integration
def test_bad_requests_get_400_with_one_sentence(server):
    base = {"q": "x", "source": "en", "target": "es", "api_key": KEY}
    long = " ".join(PARALLEL[0][0] for _ in range(8))  # over the model's 64 tokens
    cases = [
        ({**base, "target": "fr"}, "`target` = 'fr' is not a language this server translates into; it translates "
                                   "en → es, es → en."),
        ({**base, "source": "de", "target": "en"}, "`source`/`target` = de → en is not a pair this server "
                                                  "translates; it translates en → es, es → en."),
        ({**base, "source": "auto", "q": CLEARLY_SPANISH}, "was detected as es"),
        ({**base, "format": "markdown"}, "`format` = 'markdown' is not allowed; use 'text' or 'html'."),
        ({**base, "alternatives": -1}, "`alternatives` = -1 is not allowed; use an integer from 0 to 10."),
        ({**base, "q": []}, "`q` = [] is not allowed; use a string or a non-empty list of strings."),
        ({key: value for key, value in base.items() if key != "q"}, "the request has no `q`"),
        ({key: value for key, value in base.items() if key != "target"}, "the request has no `target`"),
        ({**base, "q": ["fine", long]}, "`q[1]` has "),
        ({**base, "q": ["fine", f"<p>{long}</p>"], "format": "html"}, "a text node of `q[1]` has "),
    ]
    for body, words in cases:
        status, headers, answer = call(server, "POST", "/translate", body)
        assert status == 400 and list(answer) == ["error"] and words in answer["error"], (body, answer)
        assert "\n" not in answer["error"] and headers["content-type"] == "application/json"
    status, _, answer = call(server, "POST", "/translate", headers={"Content-Type": "text/plain"})
    assert status == 400 and "application/json or application/x-www-form-urlencoded" in answer["error"]
    # the payload route: a pair not served, no pair on a server of several
    status, _, answer = call(server, "POST", "/", {"inputs": "x", "api_key": KEY,
                                                   "parameters": {"src_lang": "en", "tgt_lang": "fr"}})
    assert (status, answer) == (400, {"error": "`parameters.src_lang`/`parameters.tgt_lang` = en → fr is not a pair "
                                               "this server translates; it translates en → es, es → en."})
    status, _, answer = call(server, "POST", "/", {"inputs": "x", "api_key": KEY})
    assert status == 400 and answer["error"].startswith("this server translates several pairs (en → es, es → en)")


@pytest.mark.integration
def test_without_a_valid_key_403_and_over_the_limit_429_with_retry_after(server):
    with pytest.raises(urllib.error.HTTPError) as refused:
        client(server, key=None).translate(ENGLISH[0], "en", "es")
    assert refused.value.code == 403 and "needs an API key" in json.loads(refused.value.read())["error"]
    with pytest.raises(urllib.error.HTTPError) as refused:
        client(server, key="not-a-key").detect(CLEARLY_ENGLISH)
    assert refused.value.code == 403 and "not one this server accepts" in json.loads(refused.value.read())["error"]
    for body, headers in (({"inputs": "x"}, {}), ({"inputs": "x", "api_key": "nope"}, {}),
                          ({"inputs": "x"}, {"Authorization": "Bearer nope"})):
        status, _, answer = call(server, "POST", "/predict", body, headers)
        assert status == 403 and list(answer) == ["error"], (body, answer)
    # TIGHT_KEY: 3 requests per minute, a sliding window
    answers = [call(server, "POST", "/translate", {"q": ENGLISH[0], "source": "en", "target": "es",
                                                   "api_key": TIGHT_KEY}) for _ in range(4)]
    assert [status for status, _, _ in answers] == [200, 200, 200, 429]
    _, headers, answer = answers[-1]
    assert 1 <= int(headers["retry-after"]) <= 60
    assert answer["error"] == (f"this API key may make 3 requests per minute and has made them; retry in "
                               f"{headers['retry-after']} s.")
    assert call(server, "POST", "/translate", {"q": ENGLISH[0], "source": "en", "target": "es",
                                               "api_key": KEY})[0] == 200  # other keys are not held back
    for key in (KEY, TIGHT_KEY, "not-a-key", "nope"):
        assert key not in server.log()


@pytest.mark.integration
def test_metrics_are_labelled_by_model_and_route(server):
    status, headers, body = server.request("GET", "/metrics")
    text = body.decode()
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    for model in ("en-es", "es-en"):
        assert re.search(rf'deepnmt_requests_total\{{code="200",model="{model}",route="/translate"\}} [1-9]', text)
        assert re.search(rf'deepnmt_sentences_total\{{model="{model}"\}} [1-9]', text)
        assert f'deepnmt_model_loaded{{model="{model}"}} 1.0' in text
    assert re.search(r'deepnmt_requests_total\{code="400",model="none",route="/translate"\} [1-9]', text)
    assert re.search(r'deepnmt_requests_total\{code="200",model="en-es",route="/"\} [1-9]', text)
    samples = parse_prometheus(text)
    assert samples['deepnmt_requests_total{code="403"}'] >= 5 and samples['deepnmt_requests_total{code="429"}'] >= 1


@pytest.mark.integration
def test_sigterm_answers_the_requests_in_flight_of_both_models_then_exits_0(server, handlers):
    """The last test of the two-model server: it stops it (each batch takes 0.3 s more)."""
    results: dict[int, tuple] = {}
    requests = [({"q": ENGLISH[i % 2], "source": "en", "target": "es", "api_key": KEY}, "en-es", ENGLISH[i % 2])
                for i in range(3)]
    requests += [({"q": SPANISH[i % 2], "source": "es", "target": "en", "api_key": KEY}, "es-en", SPANISH[i % 2])
                 for i in range(3)]
    clients = [threading.Thread(target=lambda i=i, body=body: results.__setitem__(
        i, call(server, "POST", "/translate", body))) for i, (body, _, _) in enumerate(requests)]
    for thread in clients:
        thread.start()
    deadline = time.monotonic() + 30
    while server.metrics()["deepnmt_requests_in_flight"] < len(requests):
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.02)
    server.process.send_signal(signal.SIGTERM)
    for thread in clients:
        thread.join(60)
    assert server.process.wait(60) == 0, server.log()
    assert len(results) == len(requests)
    for i, (_, pair, text) in enumerate(requests):
        status, _, answer = results[i]
        assert status == 200 and answer["translatedText"] == pipeline_text(handlers[pair], text)[0], (pair, answer)


@pytest.mark.integration
def test_one_open_model_keeps_the_old_payload_and_says_it_is_open_beyond_loopback(servers, handlers):
    opened = servers["open"]
    assert opened.post({"inputs": ENGLISH[0]}) == (200, handlers["en-es"]({"inputs": ENGLISH[0]}))
    status, _, answer = call(opened, "POST", "/translate", {"q": ENGLISH[0], "source": "en", "target": "es"})
    assert status == 200 and answer == {"translatedText": pipeline_text(handlers["en-es"], ENGLISH[0])[0]}
    warnings = [line for line in opened.log().splitlines() if "no --api_keys" in line]
    assert len(warnings) == 1 and "open beyond this machine" in warnings[0]
    assert call(opened, "GET", "/frontend/settings")[2]["keyRequired"] is False


@pytest.mark.integration
def test_an_export_folder_is_routed_by_the_pair_its_manifest_records(folders, handlers, tmp_path):
    """A CTranslate2 export of the en → es model beside the es → en model folder: the export's manifest records the
    pair; the payload's src_lang/tgt_lang choose it (and are not passed to CTranslate2, which takes no languages)."""
    if os.environ.get("DEEPNMT_REQUIRE_EXPORT") == "1":
        import ctranslate2  # noqa: F401
    else:
        pytest.importorskip("ctranslate2")
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_deepnmt.export import export_model, load_engine

    export = tmp_path / "en-es-ct2"
    tokenizer = AutoTokenizer.from_pretrained(folders["en-es"])
    export_model(AutoModelForSeq2SeqLM.from_pretrained(folders["en-es"]), tokenizer, export, "ctranslate2")
    mixed = Server(export, str(folders["es-en"]), "--workers", "1")
    try:
        mixed.wait_ready()
        health = json.loads(mixed.request("GET", "/health")[2])
        assert sorted((model["pair"], model["engine"]) for model in health["models"]) == [
            (["en", "es"], "ctranslate2"), (["es", "en"], "torch")]
        engine = load_engine(export, "ctranslate2", intra_threads=1)
        expected = tokenizer.decode(engine.generate([tokenizer(ENGLISH[0])["input_ids"]], num_beams=4,
                                                    max_new_tokens=12)[0], skip_special_tokens=True)
        status, answer = mixed.post({"inputs": ENGLISH[0], "parameters": {"src_lang": "en", "tgt_lang": "es",
                                                                          "num_beams": 4, "max_new_tokens": 12}})
        assert (status, answer) == (200, [{"translation_text": expected}])
        status, _, answer = call(mixed, "POST", "/translate", {"q": SPANISH[0], "source": "es", "target": "en"})
        assert (status, answer) == (200, {"translatedText": pipeline_text(handlers["es-en"], SPANISH[0])[0]})
        status, _, answer = call(mixed, "POST", "/translate", {"q": "x", "source": "en", "target": "es",
                                                               "alternatives": 1})
        assert (status, answer) == (400, {"error": "`alternatives` = 1 is not available with the ctranslate2 engine, "
                                                   "which returns one translation per text; use 0."})
    finally:
        code = mixed.stop()
    assert code == 0, mixed.log()


# ------------------------------------------------------------------------------------------------ no server
def test_the_key_file_takes_keys_limits_comments_and_names_a_bad_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# team keys\nalpha\n\n   beta 30  \n\t# another comment\ngamma\t5\n", encoding="utf-8")
    assert read_api_keys(path) == {"alpha": None, "beta": 30, "gamma": 5}
    for text, words in (
            ("alpha\nbeta 30 extra\n", f"--api_keys {path} line 2 has 3 fields, which is not allowed; each line is a "
                                       "key, optionally followed by whitespace and a requests-per-minute limit"),
            ("alpha 0\n", f"--api_keys {path} line 1: the limit '0' is not allowed; each line is a key"),
            ("# c\nalpha ten\n", f"--api_keys {path} line 2: the limit 'ten' is not allowed"),
            ("alpha\nalpha 3\n", f"--api_keys {path} line 2 repeats the key of an earlier line"),
            ("# nothing\n\n", f"--api_keys {path} holds no key")):
        path.write_text(text, encoding="utf-8")
        with pytest.raises(CommandLineError) as refused:
            read_api_keys(path)
        message = str(refused.value)
        assert message.startswith(words) and "\n" not in message, message
        assert "alpha" not in message  # a key is never repeated in a message


def test_a_key_over_its_limit_waits_until_its_oldest_request_is_a_minute_old():
    keys = ApiKeys({"a": 2, "b": None})
    keys.check("a", now=0.0)
    keys.check("a", now=10.0)
    with pytest.raises(ApiError) as refused:
        keys.check("a", now=30.5)
    assert (refused.value.status, refused.value.retry_after) == (429, 30)  # the request of t=0 leaves at t=60
    keys.check("a", now=60.0)  # it has left: a sliding window of 60 s
    for _ in range(100):
        keys.check("b", now=61.0)  # no limit
    for key, status in ((None, 403), ("", 403), ("c", 403)):
        with pytest.raises(ApiError) as refused:
            keys.check(key, now=62.0)
        assert refused.value.status == status


def test_two_models_of_one_pair_or_a_model_without_a_pair_are_refused_at_start(tmp_path):
    def folder(name: str, pairs: list[str]) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"task_specific_params": {p: {} for p in pairs}}))
        return str(path)

    first, second = folder("a", ["translation_en_to_es"]), folder("b", ["translation_en_to_es"])
    back, none = folder("c", ["translation_es_to_en"]), folder("d", [])
    assert [model.pair for model in plan_models([first, back], None, False)] == [("en", "es"), ("es", "en")]
    assert plan_models([none], None, False)[0].pair is None  # one model needs no pair
    with pytest.raises(CommandLineError) as refused:
        plan_models([first, back, second], None, False)
    assert str(refused.value) == (f"MODEL_DIR {first} and {second} both translate en → es; a server takes one model "
                                  "per language pair, so serve one of them.")
    with pytest.raises(CommandLineError, match=f"MODEL_DIR {re.escape(none)} records no language pair, and a server "
                                               "of several models routes each request by its pair"):
        plan_models([first, none], None, False)


def test_html_text_nodes_are_translated_alone_and_the_markup_is_kept_byte_for_byte():
    from hf_deepnmt_training.serve.libretranslate import HtmlDocument

    source = ('<!DOCTYPE html>\n<p class="a&amp;b" data-x=\'1 < 2\'>Tom &amp; Jerry <b>run</b>\n</p>'
              '<script>if (a < b) { x = "<b>no</b>"; }</script><STYLE>p { color: red }</STYLE>'
              '<!-- a comment --> &nbsp; <br/>caf&#233; 1 < 2')
    document = HtmlDocument.parse(source)
    assert document.texts == ["Tom & Jerry", "run", "café 1 < 2"]  # entities decoded for the model
    assert document.assemble(["T & J", "<corre>", "CAFÉ"]) == (
        '<!DOCTYPE html>\n<p class="a&amp;b" data-x=\'1 < 2\'>T &amp; J <b>&lt;corre&gt;</b>\n</p>'
        '<script>if (a < b) { x = "<b>no</b>"; }</script><STYLE>p { color: red }</STYLE>'
        '<!-- a comment --> &nbsp; <br/>CAFÉ')
    assert document.assemble(document.texts) != source  # entities come back escaped, not as they were written
    plain = HtmlDocument.parse("no markup at all")
    assert plain.texts == ["no markup at all"] and plain.assemble(["sin marcas"]) == "sin marcas"


def test_the_command_line_refuses_two_models_of_one_pair_and_a_bad_key_file_in_one_sentence(folders, tmp_path,
                                                                                              capsys):
    import shutil

    from hf_deepnmt_training.cli import main

    paths = [str(folders["en-es"]), str(shutil.copytree(folders["en-es"], tmp_path / "en-es-again"))]
    keys = tmp_path / "keys.txt"
    keys.write_text("good-key\nbad-key 1 2\n", encoding="utf-8")
    for argv, sentence in (
            (["serve", *paths], f"MODEL_DIR {paths[0]} and {paths[1]} both translate en → es; a server takes "
                                  "one model per language pair, so serve one of them."),
            (["serve", paths[0], "--port", "0", paths[0]], f"MODEL_DIR {paths[0]} is given twice"),
            (["serve", paths[0], "--api_keys", str(keys)], f"--api_keys {keys} line 2 has 3 fields, which is not "
                                                          "allowed")):
        assert main(argv) == 2, argv
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and error[0].startswith(f"deepnmt serve: {sentence}"), (argv, error)
        assert "bad-key" not in error[0]


def test_a_request_body_is_json_or_a_form_and_curls_unlabelled_json_is_json():
    """LibreTranslate's clients send JSON or a form; `curl -d '{...}'` (the README's call without a Content-Type)
    labels a JSON object as a form, and it is read as the JSON it is; anything else is one 400 sentence."""
    request = {"q": "Hola", "source": "es", "target": "en", "api_key": "KEY"}
    body = json.dumps(request).encode()
    assert read_form(body, "application/json; charset=utf-8") == request
    assert read_form(body, "application/x-www-form-urlencoded") == request
    assert read_form(b"q=a&q=b&source=es", "application/x-www-form-urlencoded") == {"q": ["a", "b"], "source": "es"}
    with pytest.raises(ApiError, match="not valid JSON"):
        read_form(b"{not json", "application/x-www-form-urlencoded")
    with pytest.raises(ApiError, match="Content-Type 'text/plain' is not allowed"):
        read_form(body, "text/plain")
