"""What `deepnmt serve` adds for LibreTranslate's clients and for API keys (docs/serving.md, "LibreTranslate clients"):
the key file and its per-key rate limits, the language detection among the served source languages (lingua), the
HTML text nodes of ``format=html``, and the reading of a LibreTranslate request body (JSON or form-encoded).

Only the standard library is imported at module level; lingua (the ``serve`` extra) when a detector is built.
"""

from __future__ import annotations

import hmac
import html
import json
import math
import time
import urllib.parse
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from ..errors import CommandLineError

RATE_WINDOW_S = 60.0  # the sliding window of a key's requests-per-minute limit
SPACES = " \t\r\n\f"  # HTML's whitespace: what stays around a translated text piece as it was
MAX_ALTERNATIVES = 10  # most `alternatives` a /translate request may ask for (each one is one more beam)


class ApiError(ValueError):
    """A request the LibreTranslate routes (or the key check) refuse: ``status`` and one sentence."""

    def __init__(self, status: int, sentence: str, reason: str, retry_after: int | None = None) -> None:
        super().__init__(sentence)
        self.status, self.sentence, self.reason, self.retry_after = status, sentence, reason, retry_after


# ------------------------------------------------------------------------------------------------ API keys
def read_api_keys(path: str | Path) -> dict[str, int | None]:
    """The keys of an ``--api_keys`` file and each one's requests-per-minute limit (None: unlimited).

    One key per line, optionally followed by whitespace and a limit (a positive integer); blank lines and lines whose
    first non-blank character is ``#`` are skipped. A bad line is one `CommandLineError` sentence naming the file, the
    line number and what is allowed; the key itself is never repeated in it (the message may end up in a log).
    """
    path = Path(path)
    allowed = ("each line is a key, optionally followed by whitespace and a requests-per-minute limit (an integer ≥ "
               "1), or a # comment, or blank")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise CommandLineError(f"--api_keys {path} cannot be read ({getattr(error, 'strerror', None) or error}); "
                               f"give a UTF-8 text file in which {allowed}.") from None
    keys: dict[str, int | None] = {}
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        where = f"--api_keys {path} line {number}"
        if len(fields) > 2:
            raise CommandLineError(f"{where} has {len(fields)} fields, which is not allowed; {allowed}.")
        limit: int | None = None
        if len(fields) == 2:
            if not fields[1].isdigit() or int(fields[1]) < 1:
                raise CommandLineError(f"{where}: the limit {fields[1][:20]!r} is not allowed; {allowed}.")
            limit = int(fields[1])
        if fields[0] in keys:
            raise CommandLineError(f"{where} repeats the key of an earlier line, which is not allowed; give each key "
                                   "once.")
        keys[fields[0]] = limit
    if not keys:
        raise CommandLineError(f"--api_keys {path} holds no key; {allowed} (at least one key).")
    return keys


@dataclass
class ApiKeys:
    """The keys a server accepts and the times of each key's requests in the last `RATE_WINDOW_S` seconds (a sliding
    window: a request is refused while ``limit`` requests of its key arrived in the 60 s before it). Used on the event
    loop only."""

    limits: dict[str, int | None]
    seen: dict[str, deque] = field(default_factory=dict)

    def check(self, key: str | None, now: float | None = None) -> None:
        """Raise `ApiError` 403 for a missing or unknown key, 429 (with the seconds to wait) for one over its limit;
        otherwise count the request."""
        if not key:
            raise ApiError(403, "this server needs an API key; send it as the `api_key` field (or the header "
                                "`Authorization: Bearer KEY`).", "no_api_key")
        known = None
        for candidate in self.limits:  # compare_digest over every key: the time taken does not tell how close it was
            if hmac.compare_digest(candidate.encode(), key.encode()):
                known = candidate
        if known is None:
            raise ApiError(403, "the API key sent is not one this server accepts; check it, or ask for one.",
                           "wrong_api_key")
        limit = self.limits[known]
        if limit is None:
            return
        now = time.monotonic() if now is None else now
        times = self.seen.setdefault(known, deque())
        while times and times[0] <= now - RATE_WINDOW_S:
            times.popleft()
        if len(times) >= limit:
            wait = max(1, math.ceil(times[0] + RATE_WINDOW_S - now))
            raise ApiError(429, f"this API key may make {limit} requests per minute and has made them; retry in "
                                f"{wait} s.", "rate_limited", retry_after=wait)
        times.append(now)


def bearer(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer KEY`` header (None without one)."""
    if authorization and authorization[:7].lower() == "bearer ":
        return authorization[7:].strip() or None
    return None


# ------------------------------------------------------------------------------------------------ request bodies
def read_form(body: bytes, content_type: str) -> dict[str, Any]:
    """A LibreTranslate request's fields: a JSON object, or a form-encoded body (a field given several times, such
    as ``q``, becomes a list); a JSON object sent as a form (curl's ``-d`` without a Content-Type) is read as JSON.
    Raises `ApiError` 400 for anything else."""
    kind = content_type.split(";")[0].strip().lower()
    if kind in ("application/x-www-form-urlencoded", "") and body.lstrip()[:1] == b"{":
        kind = "application/json"  # `curl -d '{...}'` labels JSON as a form; no form field starts with "{"
    if kind == "application/json":
        try:
            data = json.loads(body)
        except ValueError as problem:
            raise ApiError(400, f"the request body is not valid JSON ({str(problem).splitlines()[0]}); send "
                                '{"q": "text", "source": "en", "target": "es"}.', "invalid_json") from None
        if not isinstance(data, dict):
            raise ApiError(400, f"the request body is a JSON {type(data).__name__}; send a JSON object such as "
                                '{"q": "text", "source": "en", "target": "es"}.', "bad_request")
        return data
    if kind in ("application/x-www-form-urlencoded", ""):
        try:
            pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise ApiError(400, "the form-encoded request body is not UTF-8; encode it in UTF-8.",
                           "bad_request") from None
        fields: dict[str, Any] = {}
        for name, value in pairs:
            if name in fields:
                fields[name] = [*fields[name], value] if isinstance(fields[name], list) else [fields[name], value]
            else:
                fields[name] = value
        return fields
    raise ApiError(400, f"the Content-Type {kind!r} is not allowed here; send application/json or "
                        "application/x-www-form-urlencoded.", "bad_request")


def text_field(fields: dict[str, Any], name: str, default: str | None = None) -> str | None:
    """Field ``name`` as a string (``default`` when absent), or `ApiError` 400."""
    value = fields.get(name, default)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"`{name}` = {_preview(value)} is not allowed; it must be a string.", "bad_request")
    return value


def alternatives_field(fields: dict[str, Any]) -> int:
    """``alternatives``: how many translations besides the best one (0 to `MAX_ALTERNATIVES`)."""
    value = fields.get("alternatives", 0)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_ALTERNATIVES:
        raise ApiError(400, f"`alternatives` = {_preview(value)} is not allowed; use an integer from 0 to "
                            f"{MAX_ALTERNATIVES}.", "bad_request")
    return value


def texts_field(fields: dict[str, Any]) -> tuple[list[str], bool]:
    """``q``: the texts and whether it was one string (the answer then holds one string, not a list)."""
    if "q" not in fields:
        raise ApiError(400, 'the request has no `q`; send the text to translate as "q" (a string or a list of '
                            "strings).", "bad_request")
    value = fields["q"]
    if isinstance(value, str):
        return [value], True
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return list(value), False
    raise ApiError(400, f"`q` = {_preview(value)} is not allowed; use a string or a non-empty list of strings.",
                   "bad_request")


def _preview(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ------------------------------------------------------------------------------------------------ languages
def language_name(code: str) -> str:
    """An ISO 639-1 code's English name as lingua knows it ("es" → "Spanish"); the code itself otherwise."""
    try:
        from lingua import IsoCode639_1, Language

        return Language.from_iso_code_639_1(IsoCode639_1.from_str(code)).name.title()
    except (ImportError, ValueError):
        return code


class LanguageDetector:
    """lingua's detector restricted to ``codes`` (the served source languages it knows), in its low-accuracy mode
    (trigram models only: the least memory, and sentences are long enough for it); its language models are loaded
    once, here. ``confidences`` gives each of them a confidence 0-100, best first."""

    def __init__(self, codes: Sequence[str]) -> None:
        from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

        self.known: dict[Any, str] = {}
        for code in codes:
            try:
                self.known[Language.from_iso_code_639_1(IsoCode639_1.from_str(code))] = code
            except ValueError:  # a code lingua does not know: never detected
                continue
        self.unknown = [code for code in codes if code not in self.known.values()]
        self.detector = (LanguageDetectorBuilder.from_languages(*self.known).with_low_accuracy_mode()
                         .with_preloaded_language_models().build() if self.known else None)

    def confidences(self, text: str) -> list[tuple[str, float]]:
        """``[(code, confidence 0-100), ...]`` over the detector's languages, best first."""
        if self.detector is None:
            raise ApiError(400, f"this server cannot detect its source languages ({', '.join(self.unknown)}: not "
                                "known to the language detector); send the source language as `source`.",
                           "no_detection")
        values = self.detector.compute_language_confidence_values(text)
        return [(self.known[value.language], round(100 * value.value, 2)) for value in values]


# ------------------------------------------------------------------------------------------------ format=html
class _Segmenter(HTMLParser):
    """Cuts an HTML text into markup and text pieces by the parser's own positions: every event starts where the
    previous one ends, so the pieces put together give the input back exactly (attributes, comments, entities and
    the contents of <script>/<style> untouched)."""

    RAW_TAGS = ("script", "style")

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=False)
        self.text = text
        starts, offset = [0], 0
        for line in text.splitlines(keepends=True):
            offset += len(line)
            starts.append(offset)
        self.line_starts = starts
        self.events: list[tuple[int, bool]] = []  # (offset, is text)
        self.raw_open: str | None = None

    def _mark(self, is_text: bool) -> None:
        line, column = self.getpos()
        self.events.append((self.line_starts[line - 1] + column, is_text))

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._mark(False)
        if tag in self.RAW_TAGS:
            self.raw_open = tag

    def handle_startendtag(self, tag: str, attrs: list) -> None:
        self._mark(False)

    def handle_endtag(self, tag: str) -> None:
        self._mark(False)
        if tag == self.raw_open:
            self.raw_open = None

    def handle_data(self, data: str) -> None:
        self._mark(self.raw_open is None)

    def handle_entityref(self, name: str) -> None:
        self._mark(True)

    def handle_charref(self, name: str) -> None:
        self._mark(True)

    def handle_comment(self, data: str) -> None:
        self._mark(False)

    def handle_decl(self, decl: str) -> None:
        self._mark(False)

    def handle_pi(self, data: str) -> None:
        self._mark(False)

    def unknown_decl(self, data: str) -> None:
        self._mark(False)


def html_pieces(text: str) -> list[tuple[str, bool]]:
    """``text`` as consecutive ``(raw piece, is text)`` pieces: neighbouring text events (data, entities) form one
    piece, markup is never text, nor is what <script> and <style> hold. ``"".join`` of the pieces is ``text``."""
    parser = _Segmenter(text)
    parser.feed(text)
    parser.close()
    events = parser.events
    pieces: list[tuple[str, bool]] = []
    bounds = [offset for offset, _ in events] + [len(text)]
    if not events or events[0][0] > 0:  # leading text the parser held back (it never does; kept exact anyway)
        pieces.append((text[: bounds[0]] if events else text, True))
    for (offset, is_text), end in zip(events, bounds[1:]):
        piece = text[offset:end]
        if pieces and pieces[-1][1] == is_text:
            pieces[-1] = (pieces[-1][0] + piece, is_text)
        elif piece:
            pieces.append((piece, is_text))
    assert "".join(piece for piece, _ in pieces) == text
    return pieces


@dataclass
class HtmlDocument:
    """An HTML text split for translation: ``texts`` are its text pieces' words (entities decoded, outer whitespace
    off), each translated alone; `assemble` puts the translations back between the untouched markup, escaped."""

    pieces: list[tuple[str, bool]]
    texts: list[str]
    slots: list[tuple[int, str, str]]  # (piece index, its raw leading and trailing whitespace) of each text

    @classmethod
    def parse(cls, text: str) -> HtmlDocument:
        pieces = html_pieces(text)
        texts, slots = [], []
        for index, (piece, is_text) in enumerate(pieces):
            if not is_text:
                continue
            core = html.unescape(piece).strip()
            if not core:
                continue  # whitespace and &nbsp; between tags stay as they are
            lead = piece[: len(piece) - len(piece.lstrip(SPACES))]
            trail = piece[len(piece.rstrip(SPACES)):]
            texts.append(core)
            slots.append((index, lead, trail))
        return cls(pieces, texts, slots)

    def assemble(self, translations: Sequence[str]) -> str:
        out = [piece for piece, _ in self.pieces]
        for (index, lead, trail), translation in zip(self.slots, translations):
            out[index] = lead + html.escape(translation, quote=False) + trail
        return "".join(out)
