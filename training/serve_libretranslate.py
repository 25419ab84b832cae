"""The old import path of `hf_deepnmt_training.serve.libretranslate` (keys, request bodies, language detection and
HTML of LibreTranslate's API), which moved into the package `hf_deepnmt_training.serve`; it stays so that code
importing it by this name (tests/test_serve_libretranslate.py) goes on working."""

from __future__ import annotations

from .serve.libretranslate import (MAX_ALTERNATIVES, RATE_WINDOW_S, SPACES, ApiError, ApiKeys, HtmlDocument,
                                   LanguageDetector, alternatives_field, bearer, html_pieces, language_name,
                                   read_api_keys, read_form, text_field, texts_field)

__all__ = ["MAX_ALTERNATIVES", "RATE_WINDOW_S", "SPACES", "ApiError", "ApiKeys", "HtmlDocument", "LanguageDetector",
           "alternatives_field", "bearer", "html_pieces", "language_name", "read_api_keys", "read_form", "text_field",
           "texts_field"]
