"""The server's HTTP application (`build_app`) and its own routes: ``POST /`` and ``POST /predict`` (the Inference
Endpoints payload, answered as the folder's translation pipeline answers), ``GET /health``, ``GET /metrics``, and the
JSON answers to a path or method the server does not have and to a bug in a route. LibreTranslate's routes are
`libretranslate_routes`'; what every route does is `handling`'s."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from .handling import ClientGone, Handling, json_response, loading
from .libretranslate import ApiError
from .libretranslate_routes import LibreTranslateRoutes
from .metrics import NO_MODEL, ROUTES
from .options import RETRY_AFTER_S
from .service import ServerState, Service
from .translators import first_line

if TYPE_CHECKING:
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response


def build_app(service: Service | ServerState) -> Any:
    """The starlette application of ``service`` (or of one model's ``ServerState``): the routes and a lifespan that
    starts the batchers and the loading."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    if isinstance(service, ServerState):
        service = Service([service])
    own, libretranslate = ServerRoutes(service), LibreTranslateRoutes(service)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    return Starlette(routes=[*own.routes(), *libretranslate.routes()], lifespan=lifespan,
                     exception_handlers={HTTPException: own.refused_route, Exception: own.crashed})


def answer(single: bool, candidates: Sequence[Sequence[str]], num_return_sequences: int) -> list[Any]:
    """The translation pipeline's (and `handler.py`'s) answer: ``[{"translation_text": ...}]`` for a string (its
    ``num_return_sequences`` dicts), one dict per string for a list (a list of dicts each when that is above 1)."""
    records = [[{"translation_text": text} for text in texts] for texts in candidates]
    if single:
        return records[0]
    if num_return_sequences == 1:
        return [texts[0] for texts in records]
    return records


def model_health(state: ServerState) -> dict[str, Any]:
    """What ``GET /health`` says of a loaded model."""
    assert state.translator is not None
    health = {"engine": state.translator.engine, "model": str(state.folder),
              "max_input_tokens": state.translator.max_input_tokens,
              "max_batch_size": state.options.max_batch_size}
    if state.pair is not None:
        health["pair"] = list(state.pair)
    return health


class ServerRoutes(Handling):
    """The server's own routes over a `Service`, and its answers to what no route takes."""

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [Route("/health", self.health, methods=["GET"]), Route("/metrics", self.metrics, methods=["GET"]),
                Route("/", self.counted(self.predict), methods=["POST"]),
                Route("/predict", self.counted(self.predict), methods=["POST"])]

    async def health(self, request: Request) -> Response:
        states = self.service.states
        if any(state.translator is None for state in states):
            return json_response({"status": "loading", "engine": states[0].engine}, status_code=503,
                                 headers={"Retry-After": str(RETRY_AFTER_S)})
        if len(states) == 1:
            return json_response({"status": "ok", **model_health(states[0])})
        return json_response({"status": "ok", "models": [model_health(state) for state in states]})

    async def metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4
        from starlette.responses import Response

        families = self.families
        for state in self.service.states:
            families.queue_depth.labels(state.label).set(state.batcher.waiting if state.batcher is not None else 0)
            families.loaded.labels(state.label).set(int(state.translator is not None))
        return Response(families.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def predict(self, request: Request, started: float, route: str) -> Response:
        """``POST /`` and ``/predict``: the Inference Endpoints payload."""
        service = self.service
        label = NO_MODEL
        try:
            body = await self.read_body(request)
            try:
                data = json.loads(body)
            except ValueError as problem:  # JSONDecodeError, UnicodeDecodeError
                raise ApiError(400, f"the request body is not valid JSON ({first_line(problem)}); send "
                                    '{"inputs": "text" or ["text", ...], "parameters": {...}}.', "invalid_json") from None
            self.authorize(request, data.pop("api_key", None) if isinstance(data, dict) else None)
            first = service.states[0]
            if first.check_request is None:
                raise loading()
            try:
                inputs, parameters = first.check_request(data)  # hf_deepnmt.handler's: one ValueError sentence
            except ValueError as problem:
                raise ApiError(400, first_line(problem), "bad_request") from None
            try:
                state = service.choose(parameters)
            except first.user_error as problem:
                raise ApiError(400, first_line(problem), "bad_request") from None
            label = state.label
            if len(service.states) > 1 and state.engine == "ctranslate2":  # the pair chose it; its engine has no such
                parameters = {k: v for k, v in parameters.items() if k not in ("src_lang", "tgt_lang")}
            single = isinstance(inputs, str)
            candidates, settings = await self.translate_texts(state, [inputs] if single else inputs, parameters,
                                                              request)
        except ApiError as refusal:
            return self.refused(refusal, started, label, route)
        except ClientGone:
            return self.gone(started, label, route)
        return self.answered(answer(single, candidates, settings.num_return_sequences), started, label, route)

    async def refused_route(self, request: Request, problem: HTTPException) -> Response:
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
            sentence = first_line(problem.detail)
        return json_response({"error": sentence}, status_code=problem.status_code, headers=problem.headers)

    async def crashed(self, request: Request, problem: Exception) -> Response:
        """A bug in a route (not in a batch, whose requests get their own 500): JSON like every other error."""
        return self.error(500, f"the server failed: {type(problem).__name__}: {first_line(problem)}", "server_error",
                          time.perf_counter(), route=request.url.path if request.url.path in ROUTES else "/")
