#!/usr/bin/env python3
"""Build an English-Spanish software-message corpus from this machine's gettext catalogs.

A domain corpus for adaptation studies: the translated user-interface and error messages of the
installed Debian packages (``/usr/share/locale/es/LC_MESSAGES/*.mo``: coreutils, git, PostgreSQL,
GTK, binutils, ...). It is not committed: what it holds depends on which packages (and which
versions) are installed, so ``stats.json`` records every catalog's sha256 and owning package, and a
rerun elsewhere can tell whether it built the same corpus.

Procedure
---------
1. Catalogs. Every ``*.mo`` file of ``<locale_dir>/<language>/LC_MESSAGES`` is read, in file-name
   order (code points). A symbolic link to another catalog of the same folder (``iso_639.mo ->
   iso_639-2.mo``) is an alias and is skipped (listed in ``stats.json``). Each file is parsed
   directly from the GNU ``.mo`` format (either byte order, major revision 0 or 1); the header entry
   (empty msgid) gives the charset and is not a pair. The "system-dependent" strings that some
   files carry (``<PRIu64>`` format macros) live outside the two string tables and are not read,
   as Python's ``gettext`` module does not read them either.
2. Entries (both sides alike). A ``msgctxt`` (``context\\x04msgid``) is dropped, the text kept.
   A plural entry is taken as its singular: msgid (not msgid_plural) with ``msgstr[0]``. GnuPG
   (``gnupg2``) writes option meta-variables and pseudo-contexts as a ``|ALGO|`` prefix that it
   cuts at run time; when both sides start with such a prefix, each side's is cut.
3. Mnemonics. GUI catalogs mark a keyboard accelerator with an underscore before the letter
   (``C_reate`` -> ``C_rear``, ``Página a_ctual``); elsewhere an underscore is part of an
   identifier (``wal_level``, ``new_name`` -> ``nuevo_nombre``) and is text to learn. So the marker
   is removed only in ``MNEMONIC_CATALOGS`` (and GnuPG's ``|pinentry-label|`` entries; not under
   GTK's msgctxt "keyboard label", whose ``Multi_key``, ``Sys_Req`` are key names), and there on
   each side by the same rule: a side whose only underscore is followed by a letter or digit,
   that has at most ``MNEMONIC_MAX_WORDS`` words, and where the underscore does not join two
   capitals (the key name ``KP_Begin``), loses that underscore. A pair where one side lost its
   mnemonic and the other still holds an underscore is dropped (``_Index`` -> ``_Ind_ice``); one
   whose translation has no mnemonic at all is kept.
4. Normalisation (both sides): NFC, every run of whitespace (newlines and tabs of multi-line help
   texts included) becomes one space, ends trimmed. Nothing else is removed: format directives
   (``%s``, ``%1$d``), quotes, option names and placeholders are part of what a software
   translator must learn.
5. Filters, in this order, each counted in ``stats.json``: an empty translation; a side without
   any letter outside printf directives (``%s: %s``, ``%d%%``); an untranslated pair (target ==
   source after normalisation); a side longer than ``--max_chars`` characters (the full help
   screens of a few tools; default 400).
6. Deduplication by source sentence, over all catalogs in file-name order and entries in catalog
   order (``.mo`` files are sorted by msgid): the first pair with a given English text is kept.
   Shared strings (gnulib's in coreutils, tar, grep ...; PostgreSQL's common frontend messages)
   are therefore kept once, and no English sentence is in two splits.
7. Split by whole catalogs. ``VALID_CATALOGS`` and ``TEST_CATALOGS`` name held-out catalogs whose
   Debian package owns no catalog in train, so that no sister catalog (PostgreSQL's 20,
   binutils' 7) with near-identical messages is in train; everything else is train. Each split
   is written as ``{"translation": {"en": ..., "es": ...}}`` JSON lines in build order, gzip with
   mtime 0 (so a rerun on the same catalogs gives byte-identical files), with ``stats.json``:
   pairs per split, per-catalog counts, the sha256 of every ``.mo`` file and its owning package
   and version (``dpkg -S``, ``dpkg-query``; null where dpkg is absent), and every rule's count.

On Debian 12 (bookworm) with 85 catalog files (81 after 4 aliases, 49,374 entries) this gives 40,962
train, 1,530 valid and 1,844 test pairs.

Run ``python training/corpus/build_gettext_corpus.py`` (root of the repository); it writes to
``runs/corpora/gettext-en-es`` unless ``--output_dir`` says otherwise, and reads only the local
catalogs. The files are what ``deepnmt train --train_file runs/corpora/gettext-en-es/train.jsonl.gz
--source_lang en --target_lang es`` reads.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import shutil
import struct
import subprocess
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

DEFAULT_LOCALE_DIR = Path("/usr/share/locale")
DEFAULT_LANGUAGE = "es"
SOURCE_LANGUAGE = "en"  # gettext msgids of these packages are English
DEFAULT_OUTPUT_DIR = Path("runs/corpora/gettext-en-es")
DEFAULT_MAX_CHARS = 400
SPLIT_FILES = {"train": "train.jsonl.gz", "valid": "valid.jsonl.gz", "test": "test.jsonl.gz"}

# Held-out catalogs (catalog name = file name without ".mo"). Each belongs to a Debian package
# that owns no catalog in train, and they come from different corners of the domain: a metadata
# tool, a TLS library, a build tool and a system manager (valid); GNOME's base library with its
# command-line tools, a network downloader and a compressor (test). Pair counts as built on
# Debian 12 (bookworm) with the catalog versions that stats.json lists.
VALID_CATALOGS: tuple[str, ...] = (  # 1530 pairs
    "appstream",  # 631 pairs (package appstream)
    "gnutls30",  # 353 pairs (libgnutls30)
    "make",  # 377 pairs (make)
    "systemd",  # 169 pairs (systemd)
)
TEST_CATALOGS: tuple[str, ...] = (  # 1844 pairs
    "glib20",  # 1126 pairs (libglib2.0-data)
    "wget",  # 564 pairs (wget)
    "wget-gnulib",  # 0 pairs: wget's second catalog, all of it gnulib strings already kept earlier
    "xz",  # 154 pairs (xz-utils)
)

# Catalogs of GUI toolkits whose translators mark keyboard mnemonics with "_" (step 3).
MNEMONIC_CATALOGS: tuple[str, ...] = ("avahi", "gtk20", "software-properties")
MNEMONIC_CONTEXTS: tuple[str, ...] = ("pinentry-label",)  # GnuPG |context| prefixes of GUI labels
# msgctxt values under which an underscore is part of a name, not a mnemonic (GTK's key names:
# "KP_Enter", "Multi_key", "Sys_Req").
NON_MNEMONIC_CONTEXTS: tuple[str, ...] = ("keyboard label",)
MNEMONIC_MAX_WORDS = 6
GNUPG_CATALOGS: tuple[str, ...] = ("gnupg2",)

MO_MAGIC = 0x950412DE
CONTEXT_SEPARATOR = "\x04"
GNUPG_PREFIX_RE = re.compile(r"^\|([^|\s]+)\|")
MNEMONIC_RE = re.compile(r"_(?=[^\W_])")
CHARSET_RE = re.compile(r"charset=([^\s;]+)", re.I)
LETTER_RE = re.compile(r"[^\W\d_]")
# printf directives (C, with positional "%1$s", "*" widths and length modifiers; Python's "%(name)s"), which are not
# words to translate when step 5 asks whether a side has any letter.
FORMAT_RE = re.compile(r"%(?:\d+\$|\([^)]*\))?[-+ #0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?"
                       r"(?:hh|h|ll|l|L|q|j|z|Z|t|I64|I32)?[diouxXeEfFgGaAcspnmCS%]")


class CorpusError(RuntimeError):
    """A missing or unreadable catalog, or a configuration that leaves a split empty."""


# Every rule, with what its count counts (entries, or pairs after step 2).
RULES: dict[str, str] = {
    "context_dropped": "entries whose msgctxt was dropped (the text kept)",
    "plural_singular_taken": "plural entries taken as msgid + msgstr[0]",
    "gnupg_prefix_cut": "GnuPG entries whose |ARG| prefix was cut on both sides",
    "mnemonic_removed": "pairs whose accelerator underscore was removed on one or both sides",
    "dropped_mnemonic_mismatch": "pairs dropped: one side lost a mnemonic, the other kept a '_'",
    "dropped_empty_translation": "entries dropped: empty msgstr (untranslated)",
    "dropped_no_letters": "pairs dropped: a side without letters (a bare format string)",
    "dropped_identical": "pairs dropped: target == source after normalisation",
    "dropped_too_long": "pairs dropped: a side longer than max_chars characters",
    "dropped_duplicate_source": "pairs dropped: the English text is already in an earlier pair",
}


@dataclass(frozen=True)
class MoEntry:
    """One entry of a ``.mo`` file, decoded: context, msgid, msgid_plural and the msgstr forms."""

    context: str | None
    msgid: str
    msgid_plural: str | None
    msgstrs: tuple[str, ...]


@dataclass(frozen=True)
class Catalog:
    """A parsed ``.mo`` file: its name (file name without ``.mo``), path, sha256 and entries."""

    name: str
    path: Path
    sha256: str
    charset: str
    entries: tuple[MoEntry, ...]


@dataclass(frozen=True)
class Pair:
    """A cleaned sentence pair and the catalog it came from."""

    catalog: str
    en: str
    es: str


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


# ---------------------------------------------------------------------------------------------
# Reading .mo files


def _header_charset(header: bytes) -> str:
    match = CHARSET_RE.search(header.decode("ascii", errors="replace"))
    charset = match.group(1) if match else "UTF-8"
    return "UTF-8" if charset.upper() == "CHARSET" else charset  # an unfilled template header


def read_mo(path: Path, name: str | None = None) -> Catalog:
    """Parse a GNU ``.mo`` file (either byte order) into its entries, header entry excluded."""
    data = path.read_bytes()
    if len(data) < 28:
        raise CorpusError(f"{path} is too short to be a .mo file.")
    for order in ("<", ">"):
        if struct.unpack(f"{order}I", data[:4])[0] == MO_MAGIC:
            break
    else:
        raise CorpusError(f"{path} is not a GNU .mo file (bad magic number).")
    revision, count, originals_at, translations_at = struct.unpack(f"{order}4I", data[4:20])
    if revision >> 16 not in (0, 1):
        raise CorpusError(f"{path} has .mo major revision {revision >> 16}; only 0 and 1 are known.")
    if max(originals_at, translations_at) + 8 * count > len(data):
        raise CorpusError(f"{path} is truncated (its string tables end past the file).")

    def string(table: int, index: int) -> bytes:
        length, offset = struct.unpack(f"{order}2I", data[table + 8 * index: table + 8 * index + 8])
        if offset + length > len(data):
            raise CorpusError(f"{path} is truncated (string {index} ends past the file).")
        return data[offset: offset + length]

    raw = [(string(originals_at, i), string(translations_at, i)) for i in range(count)]
    charset = next((_header_charset(t) for o, t in raw if o == b""), "UTF-8")
    entries: list[MoEntry] = []
    for original, translation in raw:
        if original == b"":  # the header entry: metadata, not a message
            continue
        try:
            text = original.decode(charset)
            forms = tuple(translation.decode(charset).split("\x00"))
        except (UnicodeDecodeError, LookupError) as error:
            raise CorpusError(f"{path}: an entry is not valid {charset} ({error}).") from None
        context: str | None = None
        if CONTEXT_SEPARATOR in text:
            context, text = text.split(CONTEXT_SEPARATOR, 1)
        msgid, _, plural = text.partition("\x00")
        entries.append(MoEntry(context, msgid, plural if "\x00" in text else None, forms))
    return Catalog(name=name or path.name.removesuffix(".mo"), path=path,
                   sha256=hashlib.sha256(data).hexdigest(), charset=charset, entries=tuple(entries))


def find_catalogs(folder: Path) -> tuple[list[Path], dict[str, str]]:
    """The ``.mo`` files of ``folder`` in file-name order, and the aliases (symbolic links to
    another catalog of the folder: ``{"iso_639.mo": "iso_639-2.mo"}``) left out of them."""
    if not folder.is_dir():
        raise CorpusError(f"{folder} is not a folder; is the language's locale data installed?")
    paths = sorted(p for p in folder.iterdir() if p.name.endswith(".mo") and p.is_file())
    real = {p.resolve(): p for p in paths if not p.is_symlink()}
    kept: list[Path] = []
    aliases: dict[str, str] = {}
    for path in paths:
        target = real.get(path.resolve()) if path.is_symlink() else None
        if target is not None:
            aliases[path.name] = target.name
        else:
            kept.append(path)
    if not kept:
        raise CorpusError(f"{folder} holds no .mo files.")
    return kept, aliases


# ---------------------------------------------------------------------------------------------
# Cleaning


def normalise(text: str) -> str:
    """NFC, and every run of whitespace (newlines and tabs included) made one space, ends trimmed."""
    return " ".join(unicodedata.normalize("NFC", text).split())


def has_letters(text: str) -> bool:
    """Whether ``text`` has a letter outside printf format directives (``%s: %s`` has none)."""
    return LETTER_RE.search(FORMAT_RE.sub(" ", text)) is not None


def remove_mnemonic(text: str) -> tuple[str, bool]:
    """Remove a GUI accelerator underscore (``C_reate`` -> ``Create``) by the rule of step 3."""
    if text.count("_") != 1 or len(text.split()) > MNEMONIC_MAX_WORDS:
        return text, False
    match = MNEMONIC_RE.search(text)
    if match is None:
        return text, False
    at = match.start()
    if at > 0 and text[at - 1].isupper() and text[at + 1].isupper():  # KP_Begin: an identifier
        return text, False
    return text[:at] + text[at + 1:], True


def clean_entry(catalog: str, entry: MoEntry, counts: Counter[str],
                max_chars: int = DEFAULT_MAX_CHARS) -> Pair | None:
    """The pair an entry gives after steps 2-5, or None (the reason counted in ``counts``)."""
    if entry.context is not None:
        counts["context_dropped"] += 1
    if entry.msgid_plural is not None:
        counts["plural_singular_taken"] += 1
    source, target = entry.msgid, entry.msgstrs[0] if entry.msgstrs else ""
    if not target.strip():
        counts["dropped_empty_translation"] += 1
        return None
    gui = catalog in MNEMONIC_CATALOGS and entry.context not in NON_MNEMONIC_CONTEXTS
    if catalog in GNUPG_CATALOGS:
        source_prefix, target_prefix = GNUPG_PREFIX_RE.match(source), GNUPG_PREFIX_RE.match(target)
        if source_prefix and target_prefix:
            source, target = source[source_prefix.end():], target[target_prefix.end():]
            counts["gnupg_prefix_cut"] += 1
            gui = source_prefix.group(1) in MNEMONIC_CONTEXTS
    if gui:
        source, source_removed = remove_mnemonic(source)
        target, target_removed = remove_mnemonic(target)
        if source_removed or target_removed:
            if ("_" in source and target_removed) or ("_" in target and source_removed):
                counts["dropped_mnemonic_mismatch"] += 1
                return None
            counts["mnemonic_removed"] += 1
    source, target = normalise(source), normalise(target)
    if not target:
        counts["dropped_empty_translation"] += 1
        return None
    if not has_letters(source) or not has_letters(target):
        counts["dropped_no_letters"] += 1
        return None
    if source == target:
        counts["dropped_identical"] += 1
        return None
    if max_chars and max(len(source), len(target)) > max_chars:
        counts["dropped_too_long"] += 1
        return None
    return Pair(catalog, source, target)


def catalog_pairs(catalogs: Iterable[Catalog], counts: Counter[str],
                  max_chars: int = DEFAULT_MAX_CHARS) -> list[Pair]:
    """Clean every entry of the catalogs (in the order given) and keep the first pair of each
    English text (step 6)."""
    pairs: list[Pair] = []
    seen: set[str] = set()
    for catalog in catalogs:
        for entry in catalog.entries:
            pair = clean_entry(catalog.name, entry, counts, max_chars)
            if pair is None:
                continue
            if pair.en in seen:
                counts["dropped_duplicate_source"] += 1
                continue
            seen.add(pair.en)
            pairs.append(pair)
    return pairs


def split_pairs(pairs: Sequence[Pair], valid_catalogs: Sequence[str],
                test_catalogs: Sequence[str]) -> dict[str, list[Pair]]:
    """Pairs of the held-out catalogs go to valid / test, all others to train (order kept)."""
    overlap = sorted(set(valid_catalogs) & set(test_catalogs))
    if overlap:
        raise CorpusError(f"catalog(s) {', '.join(overlap)} cannot be held out for both valid and test.")
    split_of = {name: "valid" for name in valid_catalogs} | {name: "test" for name in test_catalogs}
    splits: dict[str, list[Pair]] = {split: [] for split in SPLIT_FILES}
    for pair in pairs:
        splits[split_of.get(pair.catalog, "train")].append(pair)
    return splits


def write_jsonl_gz(path: Path, pairs: Iterable[Pair], source_lang: str = SOURCE_LANGUAGE,
                   target_lang: str = DEFAULT_LANGUAGE) -> None:
    """``{"translation": {source_lang: ..., target_lang: ...}}`` lines, gzip with mtime 0."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz:
        for pair in pairs:
            record = {"translation": {source_lang: pair.en, target_lang: pair.es}}
            gz.write(json.dumps(record, ensure_ascii=False).encode("utf-8") + b"\n")
    path.write_bytes(buffer.getvalue())


# ---------------------------------------------------------------------------------------------
# Provenance


def owning_packages(paths: Sequence[Path]) -> dict[str, dict[str, str | None]]:
    """``{file name: {"package": ..., "version": ...}}`` from ``dpkg -S`` and ``dpkg-query``; values
    are None where dpkg is absent or owns no such file."""
    info: dict[str, dict[str, str | None]] = {p.name: {"package": None, "version": None} for p in paths}
    if not paths or shutil.which("dpkg") is None or shutil.which("dpkg-query") is None:
        return info
    listing = subprocess.run(["dpkg", "-S", *map(str, paths)], capture_output=True, text=True,
                             check=False).stdout
    by_path = {str(p): p.name for p in paths}
    for line in listing.splitlines():
        packages, sep, owned = line.partition(": ")
        if sep and owned in by_path and not line.startswith("diversion "):
            info[by_path[owned]]["package"] = packages.split(", ")[0]
    names = sorted({v["package"] for v in info.values() if v["package"]})
    if names:
        query = subprocess.run(["dpkg-query", "-W", "-f=${binary:Package}\t${Version}\n", *names],
                               capture_output=True, text=True, check=False).stdout
        versions: dict[str, str] = {}
        for line in query.splitlines():
            package, _, version = line.partition("\t")
            versions[package] = version
            versions.setdefault(package.split(":")[0], version)
        for value in info.values():
            if value["package"]:
                value["version"] = versions.get(value["package"]) or versions.get(
                    value["package"].split(":")[0])
    return info


# ---------------------------------------------------------------------------------------------
# Build


def build(output_dir: Path, locale_dir: Path = DEFAULT_LOCALE_DIR, language: str = DEFAULT_LANGUAGE,
          valid_catalogs: Sequence[str] = VALID_CATALOGS,
          test_catalogs: Sequence[str] = TEST_CATALOGS, max_chars: int = DEFAULT_MAX_CHARS,
          query_packages: bool = True) -> dict[str, object]:
    """Read, clean, deduplicate and split the catalogs; write the splits and ``stats.json``."""
    folder = locale_dir / language / "LC_MESSAGES"
    paths, aliases = find_catalogs(folder)
    catalogs = [read_mo(path) for path in paths]
    names = {c.name for c in catalogs}
    missing = sorted((set(valid_catalogs) | set(test_catalogs)) - names)
    if missing:
        print(f"warning: held-out catalog(s) not installed here: {', '.join(missing)}", file=sys.stderr)
    counts: Counter[str] = Counter()
    pairs = catalog_pairs(catalogs, counts, max_chars)
    splits = split_pairs(pairs, valid_catalogs, test_catalogs)
    empty = [split for split, split_pairs_ in splits.items() if not split_pairs_]
    if empty:
        raise CorpusError(f"split(s) {', '.join(empty)} would be empty: none of their catalogs "
                          f"gave a pair (held out: valid {list(valid_catalogs)}, test {list(test_catalogs)}).")

    packages = owning_packages(paths) if query_packages else {
        p.name: {"package": None, "version": None} for p in paths}
    per_catalog = Counter(pair.catalog for pair in pairs)
    split_of = {name: "valid" for name in valid_catalogs} | {name: "test" for name in test_catalogs}
    catalog_rows = {
        split: [{"catalog": c.name, "file": c.path.name, "sha256": c.sha256,
                 "package": packages[c.path.name]["package"],
                 "package_version": packages[c.path.name]["version"],
                 "entries": len(c.entries), "pairs": per_catalog[c.name]}
                for c in catalogs if split_of.get(c.name, "train") == split]
        for split in SPLIT_FILES
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    for split, file_name in SPLIT_FILES.items():
        write_jsonl_gz(output_dir / file_name, splits[split], SOURCE_LANGUAGE, language)
    stats: dict[str, object] = {
        "languages": {"source": SOURCE_LANGUAGE, "target": language},
        "catalog_folder": str(folder),
        "pairs": {split: len(p) for split, p in splits.items()} | {"total": len(pairs)},
        "catalogs": catalog_rows,
        "aliases_skipped": aliases,
        "held_out_missing": missing,
        "entries_read": sum(len(c.entries) for c in catalogs),
        "max_chars": max_chars,
        "rules": {rule: counts[rule] for rule in RULES},
        "rule_descriptions": RULES,
        "command": "python3 training/corpus/build_gettext_corpus.py",
    }
    (output_dir / "stats.json").write_text(json.dumps(stats, ensure_ascii=False, indent=2) + "\n",
                                           encoding="utf-8")
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", "--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                        help=f"where to write the corpus (default: {DEFAULT_OUTPUT_DIR})")
    parser.add_argument("--locale_dir", type=Path, default=DEFAULT_LOCALE_DIR,
                        help=f"the locale tree holding <language>/LC_MESSAGES (default: {DEFAULT_LOCALE_DIR})")
    parser.add_argument("--language", default=DEFAULT_LANGUAGE,
                        help="the target language's locale folder and JSON key (default: es); the "
                             "held-out catalogs are chosen for es")
    parser.add_argument("--max_chars", type=int, default=DEFAULT_MAX_CHARS,
                        help=f"drop pairs with a side longer than this (0: no limit; default {DEFAULT_MAX_CHARS})")
    args = parser.parse_args(argv)
    if args.max_chars < 0:
        parser.error("--max_chars must be 0 (no limit) or positive.")
    try:
        stats = build(args.output_dir, args.locale_dir, args.language, max_chars=args.max_chars)
    except CorpusError as error:
        fail(str(error))
    pairs = stats["pairs"]
    assert isinstance(pairs, dict)
    print(f"wrote {args.output_dir}: " + ", ".join(f"{s} {n}" for s, n in pairs.items()))
    rules = stats["rules"]
    assert isinstance(rules, dict)
    for rule, count in rules.items():
        print(f"  {rule}: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
