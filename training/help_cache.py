"""`deepnmt train --help` without loading torch: the help text, kept in a cache after its first rendering.

Most of `deepnmt train`'s options are transformers' `Seq2SeqTrainingArguments`, whose module imports torch (about 8
CPU-seconds here); the description reads the paper switches' defaults from the config classes. Rendering it for
every ``--help`` would make the command slow to answer, so the text is rendered once, stored under
``$XDG_CACHE_HOME/hf_deepnmt`` (``~/.cache/hf_deepnmt``; ``DEEPNMT_CACHE`` overrides), and read back while nothing it
depends on has changed: the key holds the versions of Python, transformers and hf_deepnmt and the size and
modification time of every source file and recipe/preset of the package, so an upgrade or an edit renders it anew.
"""

from __future__ import annotations

import hashlib
import os
import sys
from importlib import metadata
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
WATCHED = ("training/*.py", "training/recipes/*.yaml", "training/presets/*.json", "hf_deepnmt/*.py")


def cache_dir() -> Path:
    """Where the rendered help lives."""
    if os.environ.get("DEEPNMT_CACHE"):
        return Path(os.environ["DEEPNMT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hf_deepnmt"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"


def help_key() -> str:
    """A digest of everything the rendered help depends on."""
    digest = hashlib.sha256(f"{sys.version_info[:3]}|{_version('transformers')}|{_version('hf_deepnmt')}".encode())
    for pattern in WATCHED:
        for path in sorted(PACKAGE_ROOT.glob(pattern)):
            stat = path.stat()
            digest.update(f"{path.relative_to(PACKAGE_ROOT)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:20]


def cached_help(name: str) -> str | None:
    """The stored help text ``name`` for the current key, or None."""
    path = cache_dir() / f"{name}-{help_key()}.txt"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def store_help(name: str, text: str) -> None:
    """Keep ``text`` for the current key (written atomically; a cache that cannot be written is simply skipped)."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staged = folder / f".{name}-{os.getpid()}.tmp"
        staged.write_text(text, encoding="utf-8")
        os.replace(staged, folder / f"{name}-{help_key()}.txt")
    except OSError:
        pass
