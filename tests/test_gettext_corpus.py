"""The gettext domain corpus builder (training/corpus/build_gettext_corpus.py) on tiny catalogs written here.

The ``.mo`` files are written by ``write_mo`` below in GNU gettext's binary format (no ``msgfmt`` needed): a header
entry, a plural entry, a msgctxt entry, GUI mnemonics, an untranslated and an identical entry, a bare format string,
multi-line whitespace, and an English text that two catalogs share.
"""

from __future__ import annotations

import gzip
import json
import struct
from collections import Counter
from pathlib import Path

import pytest

from hf_deepnmt_training.corpus import build_gettext_corpus as gc

HEADER = ("Project-Id-Version: tiny 1.0\nContent-Type: text/plain; charset=UTF-8\n"
          "Plural-Forms: nplurals=2; plural=(n != 1);\n")

CATALOGS: dict[str, dict[str, str]] = {
    "gtk20": {  # train; a mnemonic catalog
        "": HEADER,
        "Hello": "Hola",
        "_Open": "_Abrir",
        "keyboard label\x04KP_Enter": "TN Intro",  # a key name, not a mnemonic
        "%d file\x00%d files": "%d archivo\x00%d archivos",
        "Empty": "",
        "OK": "OK",
        "Two\n  lines\t here\n": "Dos\nlíneas  aquí\n",
        "%s: %s\n": "%s: «%s»",
        "_Index": "_Ind_ice",  # one side's mnemonic removed, an underscore left on the other: dropped
    },
    "make": {  # valid
        "": HEADER,
        "Hello": "Saludos",  # the English text is already in gtk20 (earlier in file-name order)
        "missing target": "falta el objetivo",
        "new_name": "nuevo_nombre",  # not a mnemonic catalog: underscores are text
    },
    "wget": {  # test, written big-endian
        "": HEADER,
        "Goodbye": "Adiós",
    },
}


def write_mo(path: Path, messages: dict[str, str], big_endian: bool = False) -> None:
    """A GNU .mo file (revision 0, no hash table) holding ``messages`` (msgid -> msgstr, both already joined with
    NUL for plurals and with EOT for a msgctxt), sorted by msgid as msgfmt writes them."""
    order = ">" if big_endian else "<"
    items = sorted((k.encode("utf-8"), v.encode("utf-8")) for k, v in messages.items())
    count = len(items)
    originals_at = 28
    translations_at = originals_at + 8 * count
    strings_at = translations_at + 8 * count
    blob = b""
    original_table: list[tuple[int, int]] = []
    translation_table: list[tuple[int, int]] = []
    for table, index in ((original_table, 0), (translation_table, 1)):
        for item in items:
            table.append((len(item[index]), strings_at + len(blob)))
            blob += item[index] + b"\x00"
    data = struct.pack(f"{order}7I", 0x950412DE, 0, count, originals_at, translations_at, 0, strings_at)
    for length, offset in original_table + translation_table:
        data += struct.pack(f"{order}2I", length, offset)
    path.write_bytes(data + blob)


@pytest.fixture
def locale_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "locale" / "es" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    for name, messages in CATALOGS.items():
        write_mo(folder / f"{name}.mo", messages, big_endian=name == "wget")
    (folder / "gtk.mo").symlink_to("gtk20.mo")  # an alias: skipped
    return tmp_path / "locale"


def test_read_mo_skips_the_header_and_decodes_plurals_and_contexts(locale_dir: Path) -> None:
    catalog = gc.read_mo(locale_dir / "es" / "LC_MESSAGES" / "gtk20.mo")
    assert catalog.name == "gtk20" and catalog.charset == "UTF-8"
    assert all(entry.msgid for entry in catalog.entries)  # no header entry
    assert len(catalog.entries) == len(CATALOGS["gtk20"]) - 1
    plural = next(e for e in catalog.entries if e.msgid_plural is not None)
    assert (plural.msgid, plural.msgid_plural, plural.msgstrs) == ("%d file", "%d files", ("%d archivo", "%d archivos"))
    context = next(e for e in catalog.entries if e.context is not None)
    assert (context.context, context.msgid) == ("keyboard label", "KP_Enter")
    big_endian = gc.read_mo(locale_dir / "es" / "LC_MESSAGES" / "wget.mo")
    assert [(e.msgid, e.msgstrs) for e in big_endian.entries] == [("Goodbye", ("Adiós",))]


def test_filters_dedup_and_split_by_catalog(locale_dir: Path) -> None:
    paths, aliases = gc.find_catalogs(locale_dir / "es" / "LC_MESSAGES")
    assert [p.name for p in paths] == ["gtk20.mo", "make.mo", "wget.mo"] and aliases == {"gtk.mo": "gtk20.mo"}
    counts: Counter[str] = Counter()
    pairs = gc.catalog_pairs([gc.read_mo(p) for p in paths], counts)
    assert [(p.catalog, p.en, p.es) for p in pairs] == [
        ("gtk20", "%d file", "%d archivo"),  # plural: msgid with msgstr[0]
        ("gtk20", "Hello", "Hola"),  # kept first; make's "Saludos" dropped
        ("gtk20", "Two lines here", "Dos líneas aquí"),  # whitespace normalised
        ("gtk20", "Open", "Abrir"),  # mnemonic removed on both sides
        ("gtk20", "KP_Enter", "TN Intro"),  # context dropped, no mnemonic under "keyboard label"
        ("make", "missing target", "falta el objetivo"),
        ("make", "new_name", "nuevo_nombre"),
        ("wget", "Goodbye", "Adiós"),
    ]
    assert not any("Project-Id-Version" in p.es for p in pairs)
    assert counts["dropped_duplicate_source"] == 1 and counts["plural_singular_taken"] == 1
    assert counts["dropped_empty_translation"] == 1 and counts["dropped_identical"] == 1
    assert counts["dropped_no_letters"] == 1 and counts["dropped_mnemonic_mismatch"] == 1
    assert counts["mnemonic_removed"] == 1 and counts["context_dropped"] == 1
    splits = gc.split_pairs(pairs, valid_catalogs=("make",), test_catalogs=("wget",))
    assert {split: sorted({p.catalog for p in ps}) for split, ps in splits.items()} == {
        "train": ["gtk20"], "valid": ["make"], "test": ["wget"]}
    with pytest.raises(gc.CorpusError, match="both valid and test"):
        gc.split_pairs(pairs, valid_catalogs=("make",), test_catalogs=("make",))


def test_build_is_byte_identical_on_rerun(locale_dir: Path, tmp_path: Path) -> None:
    outputs = []
    for run in ("a", "b"):
        out = tmp_path / run
        stats = gc.build(out, locale_dir, "es", valid_catalogs=("make",), test_catalogs=("wget",),
                         query_packages=False)
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert outputs[0] == outputs[1]
    assert sorted(outputs[0]) == ["stats.json", "test.jsonl.gz", "train.jsonl.gz", "valid.jsonl.gz"]
    assert stats["pairs"] == {"train": 5, "valid": 2, "test": 1, "total": 8}
    lines = gzip.decompress(outputs[0]["test.jsonl.gz"]).decode("utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [{"translation": {"en": "Goodbye", "es": "Adiós"}}]
    recorded = json.loads(outputs[0]["stats.json"])
    assert [row["catalog"] for row in recorded["catalogs"]["valid"]] == ["make"]
    assert recorded["catalogs"]["train"][0]["sha256"] == gc.read_mo(
        locale_dir / "es" / "LC_MESSAGES" / "gtk20.mo").sha256
    with pytest.raises(gc.CorpusError, match="would be empty"):
        gc.build(tmp_path / "c", locale_dir, "es", valid_catalogs=("make",), test_catalogs=("absent",),
                 query_packages=False)
