"""What every HTTP route does (`routes`, `libretranslate_routes`): count and time its request (`Handling.counted`),
read its body and its API key, answer a refusal as ``{"error": sentence}`` with its status (`ApiError`), and
translate texts through the chosen model's batcher (`Handling.translate_texts`), waiting for the answer or for the
client to leave. starlette (the ``serve`` extra) is imported when a route runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .libretranslate import ApiError, bearer
from .metrics import NO_MODEL
from .options import RETRY_AFTER_S
from .queues import QueueFull
from .service import ServerState, Service
from .translators import InputTooLong, Settings, first_line

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response


class ClientGone(Exception):
    """The client closed its connection before its answer (499, which nobody reads)."""


def json_response(content: Any, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``content`` as a JSON answer (starlette's `JSONResponse`)."""
    from starlette.responses import JSONResponse

    return JSONResponse(content, status_code=status_code, headers=headers)


def loading() -> ApiError:
    """The refusal of a request for a model that is not loaded yet (503 with Retry-After)."""
    return ApiError(503, f"the model is still loading; retry in {RETRY_AFTER_S} s (GET /health says when it is "
                         "ready).", "loading", retry_after=RETRY_AFTER_S)


class Handling:
    """The steps the routes share, over ``service`` (every model of the server) and its metric families."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.families = service.families

    # -------------------------------------------------------------------------------------------- answers
    def error(self, code: int, sentence: str, reason: str, started: float, retry: int | None = None,
              model: str = NO_MODEL, route: str = "/") -> Response:
        self.families.answered(model, route, code, time.perf_counter() - started, reason)
        headers = {"Retry-After": str(retry)} if retry else None
        return json_response({"error": sentence}, status_code=code, headers=headers)

    def refused(self, refusal: ApiError, started: float, model: str, route: str) -> Response:
        return self.error(refusal.status, refusal.sentence, refusal.reason, started, refusal.retry_after, model,
                          route)

    def gone(self, started: float, model: str, route: str) -> Response:
        from starlette.responses import Response

        self.families.disconnects.labels(model, route).inc()
        self.families.answered(model, route, 499, time.perf_counter() - started, "client_disconnected")
        return Response(status_code=499)  # nobody reads it; uvicorn drops it

    def answered(self, content: Any, started: float, model: str, route: str) -> Response:
        """A translation route's answer (200), counted and timed."""
        self.families.answered(model, route, 200, time.perf_counter() - started)
        return json_response(content)

    # -------------------------------------------------------------------------------------------- requests
    def counted(self, handler: Callable[[Request, float, str], Any]) -> Callable[[Request], Any]:
        """``handler`` as a route whose requests are counted in flight; it gets the request's arrival time and
        path."""
        families = self.families

        async def route(request: Request) -> Response:
            started, path = time.perf_counter(), request.url.path
            families.in_flight.labels(path).inc()
            try:
                return await handler(request, started, path)
            finally:
                families.in_flight.labels(path).dec()

        return route

    @staticmethod
    async def read_body(request: Request) -> bytes:
        from starlette.requests import ClientDisconnect

        try:
            return await request.body()
        except ClientDisconnect:  # gone before its request was read
            raise ClientGone from None

    def authorize(self, request: Request, key: Any) -> None:
        """The API key check of a request: its ``Authorization: Bearer`` key, else the ``api_key`` its body gave."""
        self.service.authorize(bearer(request.headers.get("authorization")) or (key if isinstance(key, str) else None))

    @staticmethod
    async def client_disconnected(request: Request) -> None:
        """Return when the client has closed its connection (the ASGI server's ``http.disconnect``)."""
        while (await request.receive())["type"] != "http.disconnect":
            pass

    # -------------------------------------------------------------------------------------------- translation
    async def translate_texts(self, state: ServerState, texts: Sequence[str], parameters: dict[str, Any],
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
            raise ApiError(400, first_line(problem), "bad_request") from None
        blank = [""] * settings.num_return_sequences
        if not sources:  # blank texts translate to "" without the model (the pipeline's rule)
            return [blank] * len(texts), settings
        try:
            job = batcher.submit(settings, sources, len(texts))
        except QueueFull as problem:
            raise ApiError(503, str(problem), "queue_full", retry_after=RETRY_AFTER_S) from None
        left = asyncio.ensure_future(self.client_disconnected(request))
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
            raise ApiError(400, first_line(problem), "bad_request")
        if problem is not None:  # the batcher logged its traceback
            raise ApiError(500, f"the translation failed: {type(problem).__name__}: {first_line(problem)}",
                           "translation_failed")
        return [result if result is not None else blank for result in job.future.result()], settings
