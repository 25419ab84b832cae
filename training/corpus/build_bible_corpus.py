#!/usr/bin/env python3
"""Build the embedded English-Spanish Bible corpus (World English Bible <-> Reina-Valera 1909).

Both texts are public domain and come from Debian's SWORD modules:

* ``sword-text-web``   -> module ``engWEB2015eb`` (World English Bible, NRSVA versification)
* ``sword-text-sparv`` -> module ``spaRV1909eb`` (Reina-Valera 1909, KJV versification)

Procedure
---------
1. Export. For each of the 66 books of the Protestant canon, ``diatheke -f internal -o fh``
   prints the whole book in one call (132 processes in all, about 20 s). ``internal`` keeps the
   module's OSIS markup, so the cleaning below knows exactly where markup stood; ``-o f`` keeps
   empty ``<note/>`` placeholders at footnote positions, ``-o h`` keeps the canonical psalm
   titles. The deuterocanonical books that only the WEB module carries are not exported.
2. Clean (both sides): drop ``<note>`` elements with their content, drop every other tag, and
   where removing markup joined two words ("God<note/>created", "allí</w><transChange>también")
   put a space back. Inline tags (``w``, ``q``, ``transChange``, ...) vanish; block and milestone
   tags (``l``, ``lg``, ``lb``, ``div``, ...) become a space. Then NFC, whitespace collapsed,
   stray spaces before ``? ! , ; : . )`` removed, a missing space after ``, ; : ! ?`` added,
   ",," -> ",".
   WEB only: canonical psalm titles (printed before verse 1) are prepended to verse 1, as
   RV1909 has them inside verse 1; the book-end trailer after Revelation 22:21 (the WEB
   glossary) is cut; the Romans doxology that WEB prints at 14:23 is moved to 16:25 and paired
   with RV1909 16:25-27.
   RV1909 only: an added-word element that is an enclitic pronoun stays on its verb
   ("enviándo</w><transChange>la" -> "enviándola", not "enviándo la"); the subscriptions
   ("colophons") after the last verse of the Pauline epistles and Hebrews are cut; the
   all-capitals first word(s) of each chapter ("EN el principio", "Y DESPUÉS movió") are
   re-cased with a lexicon counted from the module itself.
3. Align by verse key (book chapter:verse). RV1909's source numbers some chapters differently
   (e.g. Numbers 13, 1 Samuel 24, Job 39-40, Hosea 12, Jonah 2); the SWORD conversion to KJV
   keys left empty verses and merged the overflow into a chapter's last verse, so whole
   chapters are shifted by one to five verses. Such windows are found automatically (an RV1909
   verse that is empty where WEB is not, or two neighbouring pairs whose lengths or words do
   not match) and re-aligned there by dynamic programming: the cost of a group of verses is a
   Gale-Church length cost plus word evidence from a Dice-coefficient lexicon counted on the
   key pairs themselves, plus a prior that prefers same-key 1-1 pairs and allows shifted 1-1
   pairs, 2-1, 1-2, 2-2 and n-1 merges and (rarely) unpaired verses. A merged group becomes one
   pair.
4. Filter: drop pairs empty on either side (verses one text omits, e.g. Acts 8:37, Luke
   17:36), pairs where one side is only a cross-reference (none occur in these modules), and
   pairs whose length mismatch is extreme (a Textus Receptus addition such as Matthew 27:35).
5. Split by whole held-out books (``VALID_BOOKS``, ``TEST_BOOKS``); everything else is train.
   Write ``{"translation": {"en": ..., "es": ...}}`` JSON lines in canonical Bible order,
   gzip with mtime 0, so a rerun gives byte-identical files, plus ``stats.json`` and
   ``README.md``.

Run ``python training/corpus/build_bible_corpus.py`` (root of the repository); it needs the
Debian packages ``diatheke``, ``sword-text-web`` and ``sword-text-sparv`` and nothing else.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import math
import re
import shutil
import subprocess
import sys
import unicodedata
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist, median
from typing import NoReturn

try:
    from .bible_corpus_readme import render_readme
except ImportError:  # run as a script: python3 training/corpus/build_bible_corpus.py
    from bible_corpus_readme import render_readme

WEB_MODULE = "engWEB2015eb"
SPARV_MODULE = "spaRV1909eb"
MODULE_PACKAGES = {WEB_MODULE: "sword-text-web", SPARV_MODULE: "sword-text-sparv"}
DIATHEKE_PACKAGE = "diatheke"
SWORD_CONF_DIRS = (Path("/usr/share/sword/mods.d"), Path.home() / ".sword" / "mods.d")

DEFAULT_OUTPUT_DIR = Path(__file__).resolve().parent / "web-sparv"
SPLIT_FILES = {"train": "train.jsonl.gz", "valid": "valid.jsonl.gz", "test": "test.jsonl.gz"}

# (OSIS id, name diatheke prints in verse keys), in canonical order.
BOOKS: tuple[tuple[str, str], ...] = (
    ("Gen", "Genesis"), ("Exod", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deut", "Deuteronomy"), ("Josh", "Joshua"), ("Judg", "Judges"), ("Ruth", "Ruth"),
    ("1Sam", "I Samuel"), ("2Sam", "II Samuel"), ("1Kgs", "I Kings"), ("2Kgs", "II Kings"),
    ("1Chr", "I Chronicles"), ("2Chr", "II Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Esth", "Esther"), ("Job", "Job"), ("Ps", "Psalms"), ("Prov", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("Song", "Song of Solomon"), ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Ezek", "Ezekiel"), ("Dan", "Daniel"),
    ("Hos", "Hosea"), ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"),
    ("Jonah", "Jonah"), ("Mic", "Micah"), ("Nah", "Nahum"), ("Hab", "Habakkuk"),
    ("Zeph", "Zephaniah"), ("Hag", "Haggai"), ("Zech", "Zechariah"), ("Mal", "Malachi"),
    ("Matt", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "I Corinthians"), ("2Cor", "II Corinthians"),
    ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phil", "Philippians"),
    ("Col", "Colossians"), ("1Thess", "I Thessalonians"), ("2Thess", "II Thessalonians"),
    ("1Tim", "I Timothy"), ("2Tim", "II Timothy"), ("Titus", "Titus"), ("Phlm", "Philemon"),
    ("Heb", "Hebrews"), ("Jas", "James"), ("1Pet", "I Peter"), ("2Pet", "II Peter"),
    ("1John", "I John"), ("2John", "II John"), ("3John", "III John"), ("Jude", "Jude"),
    ("Rev", "Revelation of John"),
)
BOOK_INDEX = {osis: i for i, (osis, _) in enumerate(BOOKS)}

# Held-out books (whole books, so no verse of them is in train). Each split is ~1k pairs and
# mixes Old and New Testament prose, poetry and letters. No Gospel is held out: the synoptic
# parallels would put near-duplicates of test verses into train. Pair counts as built from
# sword-text-web 426.0-1 and sword-text-sparv 2.60-1.
VALID_BOOKS: tuple[str, ...] = (  # 983 pairs
    "Lam",  # Lamentations: OT poetry, 154 pairs
    "Dan",  # Daniel: OT narrative and apocalyptic, 357 pairs
    "Heb",  # Hebrews: NT epistle, 303 pairs
    "Jas",  # James: NT epistle, 108 pairs
    "2Pet",  # 2 Peter: NT epistle, 61 pairs
)
TEST_BOOKS: tuple[str, ...] = (  # 998 pairs
    "Ruth",  # Ruth: short OT narrative, 85 pairs
    "Eccl",  # Ecclesiastes: OT wisdom, 222 pairs
    "1Cor",  # 1 Corinthians: NT epistle, 437 pairs
    "2Cor",  # 2 Corinthians: NT epistle, 254 pairs (257 verses, the last ones re-aligned)
)

# WEB prints the Romans doxology (KJV 16:25-27) at the end of 14:23: move it to 16:25 and pair
# it with the three RV1909 verses.
DOXOLOGY_FROM = "Rom 14:23"
DOXOLOGY_START = "Now to him who is able"
DOXOLOGY_TO = "Rom 16:25"
DOXOLOGY_SPARV_KEYS = ("Rom 16:25", "Rom 16:26", "Rom 16:27")

# RV1909 appends a subscription to the last verse of these letters, after the final "Amén.".
COLOPHON_BOOKS = ("Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col", "1Thess", "2Thess",
                  "1Tim", "2Tim", "Titus", "Phlm", "Heb")
COLOPHON_RE = re.compile(r"(?<=Amén\.)\s+[^.]*\b(?:[Ee]scrita|[Ee]nviada)\b.*$")

# Inline OSIS elements: removing them must not separate text. All other elements are
# structural (line, line group, paragraph, list item, chapter or book boundary, title,
# speaker label, milestone) and are replaced by a space.
INLINE_TAGS = frozenset({"w", "q", "transChange", "seg", "name", "hi", "foreign",
                         "divineName", "rdg", "catchWord", "reference", "a", "i", "b"})
TAG_RE = re.compile(r"(<[^>]*>)")
TAG_NAME_RE = re.compile(r"<\s*(/?)\s*([A-Za-z]+)")
PSALM_TITLE_RE = re.compile(r'<title\b[^>]*\bcanonical="true"[^>]*>(.*?)</title>', re.S)
BOOK_END_RE = re.compile(r'<div\b[^>]*\btype="book"[^>]*/>')
# Characters that may end a word or clause before a removed footnote / start one after it.
LEFT_OF_GAP = frozenset(",;:.!?\u2019\u201d)")  # right single / double quotation marks
RIGHT_OF_GAP = frozenset("\u201c\u2018(¿¡")  # left double / single quotation marks
SPACE_BEFORE_PUNCT_RE = re.compile(r"\s+([?!,;:.)])")
SPACE_AFTER_PUNCT_RE = re.compile(r"([,;:!?])(?=[^\W\d_])")
DOUBLE_COMMA_RE = re.compile(r",{2,}")
CROSS_REFERENCE_RE = re.compile(r"^[(\[]\s*(?:See|Cf\.|Compare|Véase|Vea|Ver)\b[^()\[\]]*[)\]]\.?$")
CAPS_WORD_RE = re.compile(r"[A-ZÁÉÍÓÚÑÜÂÊÎÔÛ]{2,}\b")
WORD_RE = re.compile(r"[^\W\d_]+")
PSALM119_LABEL_RE = re.compile(r"^[A-Z]+\.\s")  # "ALEPH. Bienaventurados"

# Alignment inside suspect windows: dynamic programme over groups of verses whose cost is a
# Gale-Church length cost + word evidence - log(prior of the group's shape).
SAME_KEY_PRIOR = 0.9  # 1-1 pair of the same verse key
SHIFTED_PRIOR = 0.1  # 1-1 pair of different keys (inside a shifted run)
# The length cost is capped: a textual variant (a clause one text has and the other lacks, as in
# Acts 9:6) makes a correct pair look very bad by length alone; the words then decide.
LENGTH_COST_CAP = 5.0
# A same-key merge (e.g. 2 Samuel 2:31-32, where the texts break the verses at different
# places) is split back into verse pairs when every verse pair has |delta| <= this.
SPLIT_MAX_DELTA = 3.0
MERGE_PRIORS: dict[tuple[int, int], float] = {
    (2, 1): 0.02, (1, 2): 0.02, (2, 2): 0.005, (1, 3): 0.002, (3, 1): 0.002,
    (1, 0): 0.0005, (0, 1): 0.0005,
    **{(n, 1): 0.001 for n in range(4, 11)},  # n WEB verses into one RV1909 verse (Job 39:30)
}
WINDOW_SEED_DELTA = 3.0  # |delta| of a pair that, next to another bad pair, opens a window
WINDOW_NEIGHBOUR_DELTA = 2.0
WINDOW_SEED_SIMILARITY = 0.2  # two neighbouring pairs below this lexical similarity open one
WINDOW_MIN_LINKED = 3  # ... if they have at least this many words with translation candidates
# Lexicon: word pairs co-occurring in >= LEXICON_MIN_COUNT verse pairs with Dice >= MIN_DICE,
# ignoring words found in more than LEXICON_MAX_DF of the verses (function words).
LEXICON_MIN_COUNT = 2
LEXICON_MIN_DICE = 0.3
LEXICON_MAX_DF = 0.05
# Final filter: a pair whose length mismatch is extreme is "clearly not (only) a translation of
# the other side" (e.g. Matthew 27:35, where RV1909 follows the Textus Receptus and adds a
# quotation). Word evidence is not used here: free renderings share too few words.
DROP_DELTA = 6.0


class CorpusError(RuntimeError):
    """A missing tool or module, or unexpected module content."""


# Every cleaning, alignment and filtering rule, with what its count counts.
RULES: dict[str, str] = {
    "en_footnote_removed": "WEB verses whose <note> elements (footnotes) were removed",
    "en_space_restored_at_removed_footnote":
        'WEB verses where a removed footnote had glued two words ("God<note/>created")',
    "en_space_restored_at_word_markup_boundary":
        'WEB verses where touching word elements had no space ("new.”</q><w>He")',
    "en_space_before_punctuation_removed": "WEB verses with a space before ? ! , ; : . ) removed",
    "en_space_after_punctuation_added": "WEB verses with a space added after , ; : ! ?",
    "en_double_comma_collapsed": 'WEB verses with ",," collapsed',
    "en_psalm_title_prepended": "WEB psalm verses 1 given the canonical psalm title",
    "en_book_end_trailer_cut": "WEB verses cut at the book end (the glossary after Rev 22:21)",
    "es_footnote_removed": "RV1909 verses whose <note> elements were removed",
    "es_space_restored_at_removed_footnote": "RV1909 verses where a removed note glued two words",
    "es_space_restored_at_word_markup_boundary":
        'RV1909 verses where an added word touched a word ("allí</w><transChange>también")',
    "es_enclitic_pronoun_kept_joined":
        'RV1909 verses where an added enclitic stays on its verb ("enviándo" + "la")',
    "es_space_before_punctuation_removed": "RV1909 verses with a space before punctuation removed",
    "es_space_after_punctuation_added": "RV1909 verses with a space added after , ; : ! ?",
    "es_double_comma_collapsed": 'RV1909 verses with ",," collapsed',
    "es_colophon_cut": 'RV1909 epistle subscriptions cut ("Fué escrita de Corinto ...")',
    "es_chapter_opening_recased": 'RV1909 chapter openings re-cased ("EN el" -> "En el")',
    "en_empty_verse": "WEB verse keys with no text (omitted variants, 3 John 1:15, Rev 12:18)",
    "es_empty_verse": "RV1909 verse keys with no text (left by the versification mapping)",
    "romans_doxology_moved": "WEB Rom 14:23 doxology moved to 16:25, paired with RV1909 16:25-27",
    "dropped_sparv_verse_missing_in_web":
        "RV1909 verses dropped because WEB has no text there (Luke 17:36, Acts 8:37, ...)",
    "dropped_web_verse_missing_in_sparv": "WEB verses dropped because RV1909 has no such key",
    "dropped_web_verse_without_sparv_counterpart": "WEB verses the re-alignment left unpaired",
    "dropped_sparv_verse_without_web_counterpart": "RV1909 verses the re-alignment left unpaired",
    "pairs_realigned_across_verse_keys": "pairs whose WEB and RV1909 verse keys differ",
    "pairs_merged_from_several_verses": "pairs made of more than one verse on a side",
    "dropped_cross_reference_only": "pairs dropped because one side is only a cross-reference",
    "dropped_no_words": "pairs dropped because one side has no letters",
    "dropped_length_mismatch": "pairs dropped because their length |delta| exceeds DROP_DELTA",
}


@dataclass
class Rules:
    """Counts of verses (or pairs) touched by each rule in RULES."""

    counts: Counter[str] = field(default_factory=Counter)

    def hit(self, rule: str, n: int = 1) -> None:
        if rule not in RULES:
            raise KeyError(rule)
        self.counts[rule] += n

    def hit_all(self, side: str, hits: set[str]) -> None:
        for rule in sorted(hits):
            self.hit(f"{side}_{rule}")

    def table(self) -> dict[str, int]:
        return {rule: self.counts[rule] for rule in RULES}


@dataclass(frozen=True)
class Pair:
    key: str  # first WEB verse key of the pair, e.g. "Gen 1:1"
    en: str
    es: str
    en_keys: tuple[str, ...]
    es_keys: tuple[str, ...]


def key_sort(key: str) -> tuple[int, int, int]:
    book, cv = key.rsplit(" ", 1)
    chapter, verse = cv.split(":")
    return BOOK_INDEX[book], int(chapter), int(verse)


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(1)


# ---------------------------------------------------------------------------------------------
# Tools and module metadata


def check_tools() -> None:
    if shutil.which("diatheke") is None:
        raise CorpusError("diatheke not found: install it with "
                          f"`apt-get install {DIATHEKE_PACKAGE}`.")
    listing = subprocess.run(["diatheke", "-b", "system", "-k", "modulelist"],
                             capture_output=True, text=True, check=False).stdout
    for module, package in MODULE_PACKAGES.items():
        if not re.search(rf"^{re.escape(module)}\s*:", listing, re.M):
            raise CorpusError(f"SWORD module {module} not found: install it with "
                              f"`apt-get install {package}`.")


def module_conf(module: str) -> dict[str, str]:
    for conf_dir in SWORD_CONF_DIRS:
        if not conf_dir.is_dir():
            continue
        for path in sorted(conf_dir.glob("*.conf")):
            text = path.read_text(encoding="utf-8", errors="replace")
            if re.search(rf"^\[{re.escape(module)}\]\s*$", text, re.M):
                conf = {"conf_file": str(path)}
                for line in text.splitlines():
                    m = re.match(r"^([A-Za-z_.0-9]+)=(.*)$", line)
                    if m and m.group(1) not in conf:
                        conf[m.group(1)] = m.group(2).strip()
                return conf
    return {}


def package_version(package: str) -> str | None:
    if shutil.which("dpkg-query") is None:
        return None
    result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package],
                            capture_output=True, text=True, check=False)
    return result.stdout.strip() or None


def module_info(module: str) -> dict[str, str | None]:
    conf = module_conf(module)
    return {
        "module": module,
        "debian_package": MODULE_PACKAGES[module],
        "debian_package_version": package_version(MODULE_PACKAGES[module]),
        "description": conf.get("Description"),
        "module_version": conf.get("Version"),
        "sword_version_date": conf.get("SwordVersionDate"),
        "versification": conf.get("Versification"),
        "source_type": conf.get("SourceType"),
        "encoding": conf.get("Encoding"),
        "distribution_license": conf.get("DistributionLicense"),
        "copyright": conf.get("Copyright"),
        "conf_file": conf.get("conf_file"),
    }


# ---------------------------------------------------------------------------------------------
# Export


def export_book(module: str, osis: str, name: str) -> dict[str, tuple[str, str]]:
    """Return {"Gen 1:1": (preverse markup, verse markup)} for one book of one module."""
    result = subprocess.run(["diatheke", "-b", module, "-f", "internal", "-o", "fh", "-k", osis],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CorpusError(f"diatheke failed on {module} {osis}: {result.stderr.strip()}")
    out = result.stdout
    verses: dict[str, tuple[str, str]] = {}
    # One verse per line: [preverse markup]<name> <c>:<v>: <verse markup>
    for m in re.finditer(rf"^(?P<pre>.*?){re.escape(name)} (?P<c>\d+):(?P<v>\d+): (?P<text>.*)$",
                         out, re.M):
        verses[f"{osis} {m.group('c')}:{m.group('v')}"] = (m.group("pre"), m.group("text"))
    return verses


# ---------------------------------------------------------------------------------------------
# Cleaning


def strip_markup(markup: str, hits: set[str],
                 enclitic: Callable[[str, str], bool] | None = None) -> str:
    """Remove OSIS markup, keeping words apart where markup removal would glue them.

    ``enclitic(previous_word, added_word)`` says whether an RV1909 added word that follows a
    word element is an enclitic pronoun of it ("enviándo" + "la" -> "enviándola").
    """
    out: list[str] = []
    note_depth = 0
    after_note = after_close = at_boundary = False
    glued_note = glued_boundary = removed_note = joined_enclitic = False
    opened = ""
    for piece in TAG_RE.split(markup):
        if not piece:
            continue
        if piece.startswith("<"):
            m = TAG_NAME_RE.match(piece)
            closing, name = (m.group(1) == "/", m.group(2)) if m else (False, "")
            if name == "note":
                if closing:
                    note_depth = max(0, note_depth - 1)
                else:
                    removed_note = after_note = True
                    if not piece.endswith("/>"):
                        note_depth += 1
                continue
            if note_depth:
                continue
            if name in INLINE_TAGS:
                if closing:
                    after_close = True
                elif after_close:
                    at_boundary = True
                opened = "" if closing else name
                continue
            out.append(" ")
            after_note = after_close = at_boundary = False
            continue
        if note_depth:
            continue
        if out:
            left, right = out[-1][-1], piece[0]
            left_ok = left.isalnum() or left in LEFT_OF_GAP
            right_ok = right.isalnum() or right in RIGHT_OF_GAP
            if after_note and left_ok and right_ok:
                out.append(" ")
                glued_note = True
            elif at_boundary and left_ok and right_ok:
                previous = "".join(out).rsplit(" ", 1)[-1]
                if (enclitic is not None and opened == "transChange"
                        and enclitic(previous, piece)):
                    joined_enclitic = True
                else:
                    out.append(" ")
                    glued_boundary = True
        out.append(piece)
        after_note = after_close = at_boundary = False
    if removed_note:
        hits.add("footnote_removed")
    if glued_note:
        hits.add("space_restored_at_removed_footnote")
    if glued_boundary:
        hits.add("space_restored_at_word_markup_boundary")
    if joined_enclitic:
        hits.add("enclitic_pronoun_kept_joined")
    return "".join(out)


def normalise(text: str, hits: set[str]) -> str:
    text = unicodedata.normalize("NFC", text)
    text = " ".join(text.split())
    fixed = SPACE_BEFORE_PUNCT_RE.sub(r"\1", text)
    if fixed != text:
        hits.add("space_before_punctuation_removed")
    text = fixed
    fixed = SPACE_AFTER_PUNCT_RE.sub(r"\1 ", text)
    if fixed != text:
        hits.add("space_after_punctuation_added")
    text = fixed
    fixed = DOUBLE_COMMA_RE.sub(",", text)
    if fixed != text:
        hits.add("double_comma_collapsed")
    return fixed


def clean_web(raw: dict[str, tuple[str, str]], rules: Rules) -> dict[str, str]:
    verses: dict[str, str] = {}
    for key, (pre, markup) in raw.items():
        hits: set[str] = set()
        book_end = BOOK_END_RE.search(markup)
        if book_end and markup[book_end.end():].strip():
            hits.add("book_end_trailer_cut")
        if book_end:
            markup = markup[:book_end.start()]
        text = strip_markup(markup, hits)
        titles = [strip_markup(t, hits) for t in PSALM_TITLE_RE.findall(pre)]
        if titles and text.strip():
            text = " ".join(titles) + " " + text
            hits.add("psalm_title_prepended")
        verses[key] = normalise(text, hits)
        rules.hit_all("en", hits)
    return verses


def build_case_lexicon(verses: dict[str, str]) -> dict[str, str]:
    """Most frequent spelling of each word where it is not sentence-initial (RV1909 side)."""
    forms: dict[str, Counter[str]] = {}
    for text in verses.values():
        for m in WORD_RE.finditer(text):
            word = m.group(0)
            before = text[:m.start()].rstrip()
            if not before or before[-1] in ".?!:¿¡" or word.isupper():
                continue
            forms.setdefault(word.lower(), Counter())[word] += 1
    return {low: c.most_common(1)[0][0] for low, c in forms.items()}


def fold_accents(word: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFD", word) if not unicodedata.combining(ch))


def recase_chapter_opening(text: str, lexicon: dict[str, str], folded: dict[str, str]) -> str:
    """"Y DESPUÉS movió" -> "Y después movió"; "EN el" -> "En el"; "Y JEHOVÁ" -> "Y Jehová"."""
    start = 0
    label = PSALM119_LABEL_RE.match(text)
    if label and label.group(0).strip(" .") in HEBREW_LETTERS:
        start = label.end()
    first = CAPS_WORD_RE.search(text, start)
    if first is None:
        return text
    words = []
    pos = first.start()
    for m in re.finditer(r"\S+", text[pos:]):
        core = WORD_RE.search(m.group(0))
        if core is None or not core.group(0).isupper() or len(core.group(0)) < 2:
            break
        words.append((pos + m.start() + core.start(), core.group(0)))
        if core.end() < len(m.group(0)):  # punctuation after the word ends the run
            break
    chars = list(text)
    for i, (offset, word) in enumerate(words):
        low = word.lower()
        known = lexicon.get(low) or folded.get(fold_accents(low))
        before = text[:offset].rstrip(" ¿¡")
        sentence_start = i == 0 and (not before or before[-1] in ".?!")
        if known and known[0].isupper():
            new = known  # proper noun
        elif sentence_start:
            new = (known or low).capitalize()
        else:
            new = known or low
        if len(new) == len(word):
            chars[offset:offset + len(word)] = new
    return "".join(chars)


HEBREW_LETTERS = frozenset({"ALEPH", "BETH", "GIMEL", "DALETH", "HE", "VAU", "ZAIN", "CHETH",
                            "TETH", "JOD", "CAPH", "LAMED", "MEM", "NUN", "SAMECH", "AIN", "PE",
                            "TZADDI", "COPH", "RESH", "SIN", "SCHIN", "TAU"})


ENCLITICS = frozenset({"lo", "la", "los", "las", "le", "les", "se", "me", "te", "nos", "os"})
# An added word together with the word element it touches ("aderéza</w><transChange>la...").
ADDED_WORD_RE = re.compile(r"[^\s<>]*(?:</w>)?<transChange\b[^>]*>.*?</transChange>", re.S)


def enclitic_judge(raw: dict[str, tuple[str, str]]) -> Callable[[str, str], bool]:
    """RV1909 marks some enclitic pronouns as added words: "<w>enviándo</w><transChange>la".

    The pronoun belongs to the word before it when the joined form is an RV1909 word elsewhere,
    when the word before is not a word on its own (a fragment such as "aderéza"), or when it
    is an infinitive, gerund or plural imperative ("vengar", "adorándo", "desatad").
    """
    vocabulary: set[str] = set()
    for _, markup in raw.values():
        plain = TAG_RE.sub(" ", ADDED_WORD_RE.sub(" ", markup))
        vocabulary.update(w.lower() for w in WORD_RE.findall(plain))

    def judge(previous: str, added: str) -> bool:
        word, pronoun = previous.lower(), added.strip().lower()
        if pronoun not in ENCLITICS or not WORD_RE.fullmatch(word):
            return False
        return (word + pronoun in vocabulary or word not in vocabulary
                or (len(word) >= 4 and re.search(r"(ndo|[aeií]r|[aeií]d)$", word) is not None))

    return judge


def clean_sparv(raw: dict[str, tuple[str, str]], rules: Rules) -> dict[str, str]:
    judge = enclitic_judge(raw)
    verses: dict[str, str] = {}
    for key, (_, markup) in raw.items():
        hits: set[str] = set()
        verses[key] = normalise(strip_markup(markup, hits, judge), hits)
        rules.hit_all("es", hits)
    for book in COLOPHON_BOOKS:
        keys = [k for k, t in verses.items() if k.split(" ")[0] == book and t]
        if keys:
            last = max(keys, key=key_sort)
            cut = COLOPHON_RE.sub("", verses[last])
            if cut != verses[last]:
                verses[last] = cut
                rules.hit("es_colophon_cut")
    lexicon = build_case_lexicon(verses)
    folded: dict[str, str] = {}
    for low, form in sorted(lexicon.items()):
        folded.setdefault(fold_accents(low), form)
    for key, text in verses.items():
        if key.endswith(":1") and text:
            recased = recase_chapter_opening(text, lexicon, folded)
            if recased != text:
                verses[key] = recased
                rules.hit("es_chapter_opening_recased")
    return verses


def move_romans_doxology(en: dict[str, str], es: dict[str, str], rules: Rules) -> None:
    """WEB 14:23 ends with the doxology that RV1909 has as 16:25-27: make both 16:25."""
    text = en.get(DOXOLOGY_FROM, "")
    cut = text.find(DOXOLOGY_START)
    if cut <= 0 or en.get(DOXOLOGY_TO) or not all(es.get(k) for k in DOXOLOGY_SPARV_KEYS):
        return
    en[DOXOLOGY_FROM] = text[:cut].rstrip()
    en[DOXOLOGY_TO] = text[cut:]
    es[DOXOLOGY_TO] = " ".join(es[k] for k in DOXOLOGY_SPARV_KEYS)
    for key in DOXOLOGY_SPARV_KEYS:
        if key != DOXOLOGY_TO:
            es[key] = ""
    rules.hit("romans_doxology_moved")


# ---------------------------------------------------------------------------------------------
# Alignment


@dataclass(frozen=True)
class LengthModel:
    """Gale-Church length model: Spanish length ~ Normal(ratio * English, variance * English)."""

    ratio: float  # Spanish characters per English character
    variance: float  # per English character

    def delta(self, es_len: int, en_len: int) -> float:
        return (es_len - self.ratio * en_len) / math.sqrt(max(en_len, 1) * self.variance)

    def cost(self, es_len: int, en_len: int) -> float:
        p = 2.0 * (1.0 - NormalDist().cdf(abs(self.delta(es_len, en_len))))
        return -math.log(max(p, 1e-300))


def fit_length_model(pairs: list[tuple[str, str]]) -> LengthModel:
    es_total = sum(len(es) for _, es in pairs)
    en_total = sum(len(en) for en, _ in pairs)
    ratio = es_total / en_total
    # Robust variance: the median of squared residuals / 0.455 (median of chi-square with 1 dof).
    residuals = [(len(es) - ratio * len(en)) ** 2 / max(len(en), 1) for en, es in pairs]
    variance = median(residuals) / 0.455
    return LengthModel(ratio, variance)


def words(text: str) -> frozenset[str]:
    return frozenset(w.lower() for w in WORD_RE.findall(text))


@dataclass(frozen=True)
class Lexicon:
    """Word associations (Dice coefficient) counted on the verse-key pairs themselves.

    A "linked" word is one with at least one translation candidate. A pair's evidence is how
    many linked words of either side find a candidate on the other side (hits) or not (misses);
    the hit rates of key pairs (nearly all correct) and of neighbour-shifted pairs (nearly all
    wrong) turn hits and misses into log-likelihood ratios.
    """

    en_links: dict[str, frozenset[str]]
    es_links: dict[str, frozenset[str]]
    hit_llr: float = 0.0
    miss_llr: float = 0.0

    def evidence(self, en_words: frozenset[str], es_words: frozenset[str]) -> tuple[int, int]:
        hits = misses = 0
        for word in en_words:
            links = self.en_links.get(word)
            if links is not None:
                if links.isdisjoint(es_words):
                    misses += 1
                else:
                    hits += 1
        for word in es_words:
            links = self.es_links.get(word)
            if links is not None:
                if links.isdisjoint(en_words):
                    misses += 1
                else:
                    hits += 1
        return hits, misses

    def cost(self, en_words: frozenset[str], es_words: frozenset[str]) -> float:
        hits, misses = self.evidence(en_words, es_words)
        return -(hits * self.hit_llr + misses * self.miss_llr)

    def similarity(self, en_words: frozenset[str], es_words: frozenset[str]) -> tuple[float, int]:
        hits, misses = self.evidence(en_words, es_words)
        linked = hits + misses
        return (hits / linked if linked else 1.0), linked


def build_lexicon(pairs: list[tuple[frozenset[str], frozenset[str]]]) -> Lexicon:
    en_df: Counter[str] = Counter()
    es_df: Counter[str] = Counter()
    for en_words, es_words in pairs:
        en_df.update(en_words)
        es_df.update(es_words)
    max_df = LEXICON_MAX_DF * len(pairs)
    co: Counter[tuple[str, str]] = Counter()
    for en_words, es_words in pairs:
        en_kept = [w for w in en_words if LEXICON_MIN_COUNT <= en_df[w] <= max_df]
        es_kept = [w for w in es_words if LEXICON_MIN_COUNT <= es_df[w] <= max_df]
        for e in en_kept:
            for s in es_kept:
                co[(e, s)] += 1
    en_links: dict[str, set[str]] = {}
    es_links: dict[str, set[str]] = {}
    for (e, s), count in co.items():
        if count >= LEXICON_MIN_COUNT and 2 * count / (en_df[e] + es_df[s]) >= LEXICON_MIN_DICE:
            en_links.setdefault(e, set()).add(s)
            es_links.setdefault(s, set()).add(e)
    lexicon = Lexicon({w: frozenset(v) for w, v in en_links.items()},
                      {w: frozenset(v) for w, v in es_links.items()})
    aligned = [lexicon.evidence(e, s) for e, s in pairs]
    shifted = [lexicon.evidence(pairs[i][0], pairs[i + 1][1]) for i in range(len(pairs) - 1)]
    p_aligned = (sum(h for h, _ in aligned) + 1) / (sum(h + m for h, m in aligned) + 2)
    p_shifted = (sum(h for h, _ in shifted) + 1) / (sum(h + m for h, m in shifted) + 2)
    return Lexicon(lexicon.en_links, lexicon.es_links,
                   hit_llr=math.log(p_aligned / p_shifted),
                   miss_llr=math.log((1 - p_aligned) / (1 - p_shifted)))


def chapter_of(key: str) -> tuple[str, int]:
    book, cv = key.rsplit(" ", 1)
    return book, int(cv.split(":")[0])


def find_windows(keys: list[str], en: dict[str, str], es: dict[str, str], model: LengthModel,
                 lexicon: Lexicon, en_words: dict[str, frozenset[str]],
                 es_words: dict[str, frozenset[str]]) -> list[tuple[int, int]]:
    """Index ranges [start, end) of `keys` whose verse-key alignment is suspect."""
    seeds: list[int] = []
    bad_length: list[float] = []
    bad_words: list[bool] = []
    for i, key in enumerate(keys):
        e, s = en.get(key, ""), es.get(key, "")
        if e and not s:
            seeds.append(i)  # RV1909 verse left empty by a versification shift
        if e and s:
            bad_length.append(abs(model.delta(len(s), len(e))))
            sim, linked = lexicon.similarity(en_words[key], es_words[key])
            bad_words.append(linked >= WINDOW_MIN_LINKED and sim < WINDOW_SEED_SIMILARITY)
        else:
            bad_length.append(math.inf if e else 0.0)
            bad_words.append(bool(e))
    for i in range(len(keys)):
        neighbours = [j for j in (i - 1, i + 1) if 0 <= j < len(keys)]
        if bad_length[i] >= WINDOW_SEED_DELTA and any(
                bad_length[j] >= WINDOW_NEIGHBOUR_DELTA for j in neighbours):
            seeds.append(i)
        if bad_words[i] and any(bad_words[j] for j in neighbours):
            seeds.append(i)
    # A window runs from three verses before the seed to the end of the seed's chapter, and to
    # the end of the next chapter when the seed is among the last verses of its chapter (a
    # shift across a chapter boundary lasts until the next chapter ends).
    chapter_end: dict[tuple[str, int], int] = {}
    for i, key in enumerate(keys):
        chapter_end[chapter_of(key)] = i + 1
    windows: list[tuple[int, int]] = []
    for i in sorted(set(seeds)):
        book, chapter = chapter_of(keys[i])
        start = i
        for _ in range(3):
            if start > 0 and chapter_of(keys[start - 1])[0] == book:
                start -= 1
        end = chapter_end[(book, chapter)]
        if end - i <= 5 and (book, chapter + 1) in chapter_end:
            end = chapter_end[(book, chapter + 1)]
        if windows and start <= windows[-1][1]:
            windows[-1] = (windows[-1][0], max(end, windows[-1][1]))
        else:
            windows.append((start, end))
    return windows


def align_window(en_keys: list[str], es_keys: list[str], en: dict[str, str],
                 es: dict[str, str], en_words: dict[str, frozenset[str]],
                 es_words: dict[str, frozenset[str]], model: LengthModel,
                 lexicon: Lexicon) -> list[tuple[list[str], list[str]]]:
    """Align two verse sequences by dynamic programming; returns (WEB keys, RV1909 keys) groups.

    The cost of a group is its Gale-Church length cost plus its lexical evidence plus the
    negative log prior of its shape (1-1 with the same key, 1-1 shifted, merges, deletions).
    """
    n, m = len(en_keys), len(es_keys)
    en_pre = [0]
    for k in en_keys:
        en_pre.append(en_pre[-1] + len(en[k]) + 1)
    es_pre = [0]
    for k in es_keys:
        es_pre.append(es_pre[-1] + len(es[k]) + 1)
    moves = [(1, 1), *MERGE_PRIORS]
    cost = [[math.inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            if i == 0 and j == 0:
                continue
            best, best_move = math.inf, None
            for a, b in moves:
                if a > i or b > j or cost[i - a][j - b] == math.inf:
                    continue
                if (a, b) == (1, 1):
                    prior = SAME_KEY_PRIOR if en_keys[i - 1] == es_keys[j - 1] else SHIFTED_PRIOR
                else:
                    prior = MERGE_PRIORS[(a, b)]
                c = cost[i - a][j - b] - math.log(prior)
                if a and b:
                    en_len = en_pre[i] - en_pre[i - a] - 1
                    es_len = es_pre[j] - es_pre[j - b] - 1
                    group_en = frozenset().union(*(en_words[k] for k in en_keys[i - a:i]))
                    group_es = frozenset().union(*(es_words[k] for k in es_keys[j - b:j]))
                    c += min(model.cost(es_len, en_len), LENGTH_COST_CAP)
                    c += lexicon.cost(group_en, group_es)
                if c < best:
                    best, best_move = c, (a, b)
            cost[i][j], back[i][j] = best, best_move
    groups: list[tuple[list[str], list[str]]] = []
    i, j = n, m
    while i or j:
        move = back[i][j]
        assert move is not None
        a, b = move
        groups.append((en_keys[i - a:i], es_keys[j - b:j]))
        i, j = i - a, j - b
    return groups[::-1]


def align(en: dict[str, str], es: dict[str, str], rules: Rules, log: list[dict[str, object]]
          ) -> tuple[list[Pair], LengthModel, Lexicon]:
    keys = sorted(set(en) | set(es), key=key_sort)
    # Verses one text omits (Luke 17:36, Acts 8:37, ...): nothing to pair them with.
    for key in keys:
        if key in en and not en[key]:
            rules.hit("en_empty_verse")
        if key in es and not es[key]:
            rules.hit("es_empty_verse")
        if es.get(key) and not en.get(key):
            rules.hit("dropped_sparv_verse_missing_in_web")
        if en.get(key) and key not in es:
            rules.hit("dropped_web_verse_missing_in_sparv")
    keys = [k for k in keys if en.get(k)]
    en_words = {k: words(t) for k, t in en.items()}
    es_words = {k: words(t) for k, t in es.items()}
    key_pairs = [k for k in keys if en.get(k) and es.get(k)]
    model = fit_length_model([(en[k], es[k]) for k in key_pairs])
    lexicon = build_lexicon([(en_words[k], es_words[k]) for k in key_pairs])
    windows = find_windows(keys, en, es, model, lexicon, en_words, es_words)
    groups: list[tuple[list[str], list[str]]] = []
    pos = 0
    for start, end in windows:
        groups.extend(([k], [k]) for k in keys[pos:start])
        en_keys = [k for k in keys[start:end] if en.get(k)]
        es_keys = [k for k in keys[start:end] if es.get(k)]
        window_groups: list[tuple[list[str], list[str]]] = []
        for en_group, es_group in align_window(en_keys, es_keys, en, es, en_words, es_words,
                                               model, lexicon):
            if en_group == es_group and len(en_group) > 1 and all(
                    abs(model.delta(len(es[k]), len(en[k]))) <= SPLIT_MAX_DELTA for k in en_group):
                # Same keys on both sides and each verse pair plausible on its own: keep verse
                # granularity. (The word evidence of a merged group is never worse than that of
                # its parts, so the programme sometimes merges verses the keys pair correctly.)
                window_groups.extend(([k], [k]) for k in en_group)
            else:
                window_groups.append((en_group, es_group))
        changed = sum(1 for g in window_groups if g[0] != g[1])
        log.append({"window": f"{keys[start]} - {keys[end - 1]}", "verses": end - start,
                    "pairs_changed": changed})
        groups.extend(window_groups)
        pos = end
    groups.extend(([k], [k]) for k in keys[pos:])
    pairs: list[Pair] = []
    for en_keys, es_keys in groups:
        en_keys = [k for k in en_keys if en.get(k)]
        es_keys = [k for k in es_keys if es.get(k)]
        if not en_keys or not es_keys:
            if en_keys:
                rules.hit("dropped_web_verse_without_sparv_counterpart", len(en_keys))
            if es_keys:
                rules.hit("dropped_sparv_verse_without_web_counterpart", len(es_keys))
            continue
        if en_keys != es_keys:
            rules.hit("pairs_realigned_across_verse_keys")
        if len(en_keys) > 1 or len(es_keys) > 1:
            rules.hit("pairs_merged_from_several_verses")
        pairs.append(Pair(en_keys[0], " ".join(en[k] for k in en_keys),
                          " ".join(es[k] for k in es_keys), tuple(en_keys), tuple(es_keys)))
    return pairs, model, lexicon


def filter_pairs(pairs: list[Pair], model: LengthModel, rules: Rules) -> list[Pair]:
    kept: list[Pair] = []
    for pair in pairs:
        if CROSS_REFERENCE_RE.match(pair.en) or CROSS_REFERENCE_RE.match(pair.es):
            rules.hit("dropped_cross_reference_only")
            continue
        if not WORD_RE.search(pair.en) or not WORD_RE.search(pair.es):
            rules.hit("dropped_no_words")
            continue
        if abs(model.delta(len(pair.es), len(pair.en))) > DROP_DELTA:
            rules.hit("dropped_length_mismatch")
            continue
        kept.append(pair)
    return kept


# ---------------------------------------------------------------------------------------------
# Output


def write_jsonl_gz(path: Path, pairs: list[Pair]) -> None:
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz:
        for pair in pairs:
            line = json.dumps({"translation": {"en": pair.en, "es": pair.es}}, ensure_ascii=False)
            gz.write(line.encode("utf-8") + b"\n")
    path.write_bytes(buffer.getvalue())


def split_by_book(pairs: list[Pair]) -> tuple[dict[str, list[str]], dict[str, list[Pair]], Counter[str]]:
    """The books of each split, the pairs of each split and the pairs of each book (printed)."""
    held_out = set(VALID_BOOKS) | set(TEST_BOOKS)
    split_books: dict[str, list[str]] = {
        "train": [osis for osis, _ in BOOKS if osis not in held_out],
        "valid": sorted(VALID_BOOKS, key=BOOK_INDEX.__getitem__),
        "test": sorted(TEST_BOOKS, key=BOOK_INDEX.__getitem__),
    }
    split_of = {b: s for s, bs in split_books.items() for b in bs}
    splits: dict[str, list[Pair]] = {s: [] for s in SPLIT_FILES}
    per_book: Counter[str] = Counter()
    for pair in pairs:
        book = pair.key.split(" ")[0]
        splits[split_of[book]].append(pair)
        per_book[book] += 1
    for osis, name in BOOKS:
        print(f"  {name}: {per_book[osis]} pairs ({split_of[osis]})")
    return split_books, splits, per_book


def build(output_dir: Path) -> dict[str, object]:
    check_tools()
    rules = Rules()
    raw: dict[str, dict[str, tuple[str, str]]] = {WEB_MODULE: {}, SPARV_MODULE: {}}
    for osis, name in BOOKS:
        counts = []
        for module in (WEB_MODULE, SPARV_MODULE):
            verses = export_book(module, osis, name)
            if not verses:
                raise CorpusError(f"{module} has no verses for {name}; is the module complete?")
            raw[module].update(verses)
            counts.append(len(verses))
        print(f"exported {name}: {counts[0]} WEB / {counts[1]} RV1909 verses", flush=True)
    en = clean_web(raw[WEB_MODULE], rules)
    es = clean_sparv(raw[SPARV_MODULE], rules)
    move_romans_doxology(en, es, rules)
    windows: list[dict[str, object]] = []
    pairs, model, lexicon = align(en, es, rules, windows)
    pairs = filter_pairs(pairs, model, rules)
    pairs.sort(key=lambda p: key_sort(p.key))
    split_books, splits, per_book = split_by_book(pairs)


    output_dir.mkdir(parents=True, exist_ok=True)
    for split, file_name in SPLIT_FILES.items():
        write_jsonl_gz(output_dir / file_name, splits[split])
    stats: dict[str, object] = {
        "pairs": {s: len(p) for s, p in splits.items()} | {"total": len(pairs)},
        "books": split_books,
        "pairs_per_book": {osis: per_book[osis] for osis, _ in BOOKS},
        "modules": {"en": module_info(WEB_MODULE), "es": module_info(SPARV_MODULE)},
        "raw_verses": {"en": len(raw[WEB_MODULE]), "es": len(raw[SPARV_MODULE])},
        "rules": rules.table(),
        "rule_descriptions": RULES,
        "alignment_model": {"es_chars_per_en_char": round(model.ratio, 4),
                            "length_variance_per_char": round(model.variance, 4),
                            "lexicon_linked_words": {"en": len(lexicon.en_links),
                                                     "es": len(lexicon.es_links)},
                            "lexical_hit_llr": round(lexicon.hit_llr, 4),
                            "lexical_miss_llr": round(lexicon.miss_llr, 4)},
        "realigned_windows": windows,
        "command": "python3 training/corpus/build_bible_corpus.py",
    }
    (output_dir / "stats.json").write_text(json.dumps(stats, ensure_ascii=False, indent=2) + "\n",
                                           encoding="utf-8")
    readme = render_readme(stats, BOOKS, SPLIT_FILES, RULES)
    (output_dir / "README.md").write_text(readme, encoding="utf-8")
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR,
                        help=f"where to write the corpus (default: {DEFAULT_OUTPUT_DIR})")
    args = parser.parse_args(argv)
    try:
        stats = build(args.output_dir)
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
