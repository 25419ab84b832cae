"""LibreTranslate's API on this server (docs/serving.md, "LibreTranslate clients"): ``POST /translate``,
``POST /detect``, ``GET|POST /languages`` and ``GET /frontend/settings``. A ``/translate`` request is read
(`LibreTranslateRoutes.read_translate`), its texts go to the models of their pairs (``source=auto``: the detected
language's, `LibreTranslateRoutes.route_texts`), each model translates its texts through its batcher
(`LibreTranslateRoutes.translate_group`), and the answer is LibreTranslate's (`LibreTranslateRoutes.reply`)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .handling import ClientGone, Handling, json_response, loading
from .libretranslate import (ApiError, HtmlDocument, alternatives_field, language_name, read_form, text_field,
                             texts_field)
from .metrics import NO_MODEL
from .options import describe_pairs
from .service import ServerState
from .translators import Translator

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response


def default_beams(translator: Translator) -> int:
    """The number of beams a translator uses when a request does not say."""
    pipeline = getattr(translator, "pipeline", None)
    if pipeline is not None:
        return int(getattr(pipeline.model.generation_config, "num_beams", None) or 1)
    return int(getattr(translator, "defaults", {}).get("num_beams") or 1)


@dataclass
class TranslateRequest:
    """A ``POST /translate`` request, read and checked: its texts (``single``: ``q`` was one string), its pair, how
    many ``alternatives`` it asks for, and, for ``format=html``, each text's document; ``pieces``: what is translated
    of each text (its text nodes, or the text itself)."""

    texts: list[str]
    single: bool
    source: str
    target: str
    alternatives: int
    documents: list[HtmlDocument] | None
    pieces: list[list[str]]


class LibreTranslateRoutes(Handling):
    """LibreTranslate's routes over a server's `Service`."""

    def routes(self) -> list[Any]:
        from starlette.routing import Route

        return [Route("/translate", self.counted(self.translate), methods=["POST"]),
                Route("/detect", self.counted(self.detect), methods=["POST"]),
                Route("/languages", self.languages, methods=["GET", "POST"]),
                Route("/frontend/settings", self.frontend_settings, methods=["GET"])]

    async def fields(self, request: Request) -> dict[str, Any]:
        """The request's fields (JSON or form-encoded), once its API key passed."""
        fields = read_form(await self.read_body(request), request.headers.get("content-type", ""))
        self.authorize(request, fields.get("api_key"))
        return fields

    @staticmethod
    def required(fields: dict[str, Any], name: str, example: str) -> str:
        value = text_field(fields, name)
        if not value:
            raise ApiError(400, f"the request has no `{name}`; send it, e.g. {example}.", "bad_request")
        return value

    # -------------------------------------------------------------------------------------------- /translate
    async def translate(self, request: Request, started: float, route: str) -> Response:
        """``POST /translate``: LibreTranslate's translation (docs/serving.md, "LibreTranslate clients")."""
        label = NO_MODEL
        try:
            asked = self.read_translate(await self.fields(request))
            states, detected = await self.route_texts(asked)
            label = states[0].label if len({id(state) for state in states}) == 1 else NO_MODEL
            groups: dict[int, list[int]] = {}  # each model's texts
            for index, state in enumerate(states):
                groups.setdefault(id(state), []).append(index)
            results = await asyncio.gather(*(self.translate_group(states[indices[0]], indices, asked, request)
                                             for indices in groups.values()))
            per_text: list[list[list[str]]] = [[] for _ in asked.texts]
            for indices, grouped in zip(groups.values(), results):
                for index, candidates in zip(indices, grouped):
                    per_text[index] = candidates
            ranked = self.rank(asked, per_text)
        except ApiError as refusal:
            return self.refused(refusal, started, label, route)
        except ClientGone:
            return self.gone(started, label, route)
        return self.answered(self.reply(asked, ranked, detected), started, label, route)

    def read_translate(self, fields: dict[str, Any]) -> TranslateRequest:
        """The request's texts, pair, format and alternatives, checked (`ApiError` 400)."""
        service = self.service
        texts, single = texts_field(fields)
        source = self.required(fields, "source", '"source": "en" (or "auto")')
        target = self.required(fields, "target", '"target": "es"')
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
        return TranslateRequest(texts, single, source, target, alternatives, documents, pieces)

    async def route_texts(self, asked: TranslateRequest) -> tuple[list[ServerState], list[tuple[str, float]] | None]:
        """Each text's model, and with ``source=auto`` each text's detected language and confidence."""
        service = self.service
        if asked.source != "auto":
            return [service.pair_state(asked.source, asked.target)] * len(asked.texts), None
        if any(state.translator is None for state in service.states):
            raise loading()
        detected = [await asyncio.to_thread(service.detect_for, " ".join(parts), asked.target)
                    for parts in asked.pieces]
        return [service.pair_state(language, asked.target) for language, _ in detected], detected

    async def translate_group(self, state: ServerState, indices: list[int], asked: TranslateRequest,
                              request: Request) -> list[list[list[str]]]:
        """The translations of the texts ``indices`` (one model's, ``state``): each text's pieces' candidates."""
        if state.translator is None:
            raise loading()
        alternatives, pieces = asked.alternatives, asked.pieces
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
            candidates, _ = await self.translate_texts(state, flat, parameters, request, too_long=400)
        except ApiError as refusal:
            if refusal.reason == "too_large":  # name the text as the request does: `q[i]`
                origin = [index for index in indices for _ in pieces[index]]
                node = "a text node of " if asked.documents else ""
                refusal.sentence = re.sub(r"`inputs\[(\d+)\]`", lambda m: f"{node}`q[{origin[int(m.group(1))]}]`",
                                          refusal.sentence, count=1)
            raise
        grouped, at = [], 0
        for index in indices:
            grouped.append(candidates[at:at + len(pieces[index])])
            at += len(pieces[index])
        return grouped

    @staticmethod
    def rank(asked: TranslateRequest, per_text: list[list[list[str]]]) -> list[list[str]]:
        """Each text's translations, best first (an HTML document assembled from its nodes' translations)."""
        ranked: list[list[str]] = []
        for index, candidates in enumerate(per_text):
            if asked.documents is not None:
                ranked.append([asked.documents[index].assemble([options[rank] for options in candidates])
                               for rank in range(asked.alternatives + 1)])
            else:
                ranked.append(candidates[0] if candidates else [""] * (asked.alternatives + 1))
        return ranked

    @staticmethod
    def reply(asked: TranslateRequest, ranked: list[list[str]],
              detected: list[tuple[str, float]] | None) -> dict[str, Any]:
        """LibreTranslate's answer: ``translatedText``, ``alternatives`` when asked, ``detectedLanguage`` for auto."""
        single = asked.single
        reply: dict[str, Any] = {"translatedText": ranked[0][0] if single else [texts[0] for texts in ranked]}
        if asked.alternatives:
            reply["alternatives"] = ranked[0][1:] if single else [texts[1:] for texts in ranked]
        if detected is not None:
            languages = [{"confidence": confidence, "language": language} for language, confidence in detected]
            reply["detectedLanguage"] = languages[0] if single else languages
        return reply

    # -------------------------------------------------------------------------------------------- the others
    async def detect(self, request: Request, started: float, route: str) -> Response:
        """``POST /detect``: ``[{"confidence": 0-100, "language": code}, ...]`` over the served source languages."""
        try:
            fields = await self.fields(request)
            text = self.required(fields, "q", '"q": "the text"')
            values = await asyncio.to_thread(self.service.confidences, text)
        except ApiError as refusal:
            return self.refused(refusal, started, NO_MODEL, route)
        except ClientGone:
            return self.gone(started, NO_MODEL, route)
        return self.answered([{"confidence": confidence, "language": language} for language, confidence in values],
                             started, NO_MODEL, route)

    def languages_list(self) -> list[dict[str, Any]]:
        pairs = self.service.pairs
        codes = list(dict.fromkeys(code for pair in pairs for code in pair))
        return [{"code": code, "name": language_name(code),
                 "targets": [into for source, into in pairs if source == code]} for code in codes]

    async def languages(self, request: Request) -> Response:
        """``GET|POST /languages``: every served language with the languages it translates into."""
        return json_response(self.languages_list())

    async def frontend_settings(self, request: Request) -> Response:
        """``GET /frontend/settings``: LibreTranslate's web front end's settings, in its shape."""
        pairs = self.service.pairs
        source, target = pairs[0] if pairs else ("auto", "")
        keyed = self.service.keys is not None
        return json_response({
            "charLimit": -1, "frontendTimeout": 500, "apiKeys": keyed, "keyRequired": keyed, "suggestions": False,
            "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": source, "name": language_name(source)},
                         "target": {"code": target, "name": language_name(target)}}})
