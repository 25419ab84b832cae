"""Embedded parallel corpus of hf_deepnmt: World English Bible <-> Reina-Valera 1909 (en-es).

The files are built by ``build_bible_corpus.py`` in this folder (see its docstring and
``web-sparv/README.md``); each split is gzip-compressed JSON lines of
``{"translation": {"en": ..., "es": ...}}``.
"""

from __future__ import annotations

import pathlib

CORPUS_FILES: dict[str, str] = {
    "train": "train.jsonl.gz",
    "valid": "valid.jsonl.gz",
    "test": "test.jsonl.gz",
}


def corpus_dir() -> pathlib.Path:
    """Return the folder holding the WEB-RV1909 corpus files."""
    return pathlib.Path(__file__).resolve().parent / "web-sparv"
