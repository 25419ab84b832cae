"""Property-based tests (hypothesis): the data readers, the joint BPE round trip, config validation and padding
invariance, checked on generated inputs rather than on a few hand-picked examples (tests/test_data.py,
tests/test_tokenizer.py and tests/test_bad_input.py hold those).

Deterministic by default: the ``ci`` profile derandomizes, so CI runs the same examples every time. For a wider
random search set ``HF_DEEPNMT_HYPOTHESIS=explore`` (random seeds, ten times the examples), e.g.
``HF_DEEPNMT_HYPOTHESIS=explore pytest tests/test_properties.py``.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
import unicodedata
from pathlib import Path

import pytest
import torch
from conftest import TINY
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hf_deepnmt import (
    DeepTransformerConfig,
    DeepTransformerForConditionalGeneration,
    DTMTConfig,
    DTMTForConditionalGeneration,
)
from hf_deepnmt.aggregation import AGGREGATION_ACTIVATIONS, LAYER_AGGREGATIONS
from hf_deepnmt.configuration_deep_transformer import (
    ALLOWED_ACTIVATIONS,
    ALLOWED_ADMIN_INITS,
    ALLOWED_POSITION_ENCODINGS,
    ALLOWED_LAYER_NORM_POSITIONS,
    ALLOWED_RESIDUAL_SCALINGS,
)
from hf_deepnmt.configuration_dtmt import ALLOWED_LENGTH_PENALTY_FORMS, ALLOWED_RNN_CELLS, TRANSFORMER_ONLY_FIELDS
from hf_deepnmt.papers import TRANSFORMER, foreign_fields
from hf_deepnmt.errors import UserInputError
from hf_deepnmt_training.data import DataError, read_parallel_file

settings.register_profile(
    "ci", derandomize=True, database=None, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "explore", derandomize=False, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("HF_DEEPNMT_HYPOTHESIS", "ci")
settings.load_profile(PROFILE)


def examples(n: int) -> settings:
    """``n`` examples under the ``ci`` profile, ten times as many under ``explore``."""
    return settings(max_examples=n * (10 if PROFILE == "explore" else 1))


# ==============================================================================================================
# (a) data readers
# ==============================================================================================================
def normalise(text: str) -> str:
    """What `read_parallel_file` does to each side: runs of Unicode whitespace (``str.split()``) become one space,
    and the ends are trimmed."""
    return " ".join(text.split())


def expected_corpus(pairs: list[tuple[str, str]], max_samples: int | None) -> tuple[list[tuple[str, str]], int]:
    """The documented cleaning: pairs with an empty (normalised) side are dropped and counted, reading stops once
    ``max_samples`` pairs are kept."""
    kept, dropped = [], 0
    for source, target in pairs:
        source, target = normalise(source), normalise(target)
        if not source or not target:
            dropped += 1
            continue
        kept.append((source, target))
        if max_samples is not None and len(kept) >= max_samples:
            break
    return kept, dropped


def write(path: Path, text: str, gz: bool) -> Path:
    """Write UTF-8 ``text`` to ``path`` (gzip-compressed, with ``.gz`` added to the name, when ``gz``)."""
    data = text.encode("utf-8")
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def jsonl_record(source: str, target: str, ascii_only: bool) -> str:
    return json.dumps({"translation": {"en": source, "es": target}}, ensure_ascii=ascii_only)


# Any text (hypothesis excludes surrogates, which UTF-8 cannot hold) – in JSON every character is allowed, since
# json.dumps escapes the control characters; in line-based files a side cannot hold a line break (\n, \r) and in
# TSV no tab either. Every other character, the other Unicode separators included (\v, \f, \x1c-\x1e, \x85,
# \u2028, \u2029), is part of the sentence.
ANY_TEXT = st.text(max_size=12)
LINE_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=12)
TSV_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\n\r\t"), max_size=12)
SEPARATORS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
# Sentences that mix ordinary words with the separators above, so that every run meets them.
WORDY_TEXT = st.lists(st.sampled_from(["la", "luz", "  ", "é", "日本", *SEPARATORS]), max_size=6).map("".join)


def pairs_of(text: st.SearchStrategy[str]) -> st.SearchStrategy[list[tuple[str, str]]]:
    return st.lists(st.tuples(st.one_of(text, WORDY_TEXT), st.one_of(text, WORDY_TEXT)), max_size=8)


@st.composite
def parallel_file(draw) -> tuple[str, list[tuple[str, str]], bool, str]:
    """(format, pairs, gzip?, line ending) for a file that holds ``pairs``."""
    fmt = draw(st.sampled_from(["jsonl", "json-list", "tsv", "prefix"]))
    text = {"jsonl": ANY_TEXT, "json-list": ANY_TEXT, "tsv": TSV_TEXT, "prefix": LINE_TEXT}[fmt]
    return fmt, draw(pairs_of(text)), draw(st.booleans()), draw(st.sampled_from(["\n", "\r\n"]))


def write_parallel(folder: Path, fmt: str, pairs: list[tuple[str, str]], gz: bool, newline: str,
                   ascii_only: bool = True, blank_lines: tuple[int, ...] = ()) -> Path:
    """Write ``pairs`` in ``fmt``; return the path to give `read_parallel_file`. ``blank_lines`` are indices before
    which an empty line is inserted (JSONL and TSV skip empty lines)."""
    def lines_text(lines: list[str]) -> str:
        lines = list(lines)
        for index in sorted(blank_lines, reverse=True):
            lines.insert(min(index, len(lines)), "")
        return "".join(line + newline for line in lines)

    if fmt == "jsonl":
        return write(folder / "data.jsonl", lines_text([jsonl_record(s, t, ascii_only) for s, t in pairs]), gz)
    if fmt == "json-list":
        records = [{"translation": {"en": s, "es": t}} for s, t in pairs]
        return write(folder / "data.json", json.dumps(records, ensure_ascii=ascii_only, indent=1), gz)
    if fmt == "tsv":
        return write(folder / "data.tsv", lines_text([f"{s}\t{t}" for s, t in pairs]), gz)
    for lang, side in (("en", 0), ("es", 1)):  # prefix: one line per sentence, every line terminated
        write(folder / f"data.{lang}", "".join(pair[side] + newline for pair in pairs), gz)
    return folder / "data"


@examples(100)
@given(parallel_file(), st.booleans(), st.lists(st.integers(0, 8), max_size=3),
       st.one_of(st.none(), st.integers(1, 6)))
def test_every_format_reads_back_what_was_written(spec, ascii_only, blank_lines, max_samples):
    """Any list of (source, target) pairs of Unicode text – without the line breaks a line-based format cannot hold
    (and without tabs in TSV) – written as JSONL, a JSON list, TSV or two prefix files, gzipped or not, with LF or
    CRLF line ends, with or without escaped non-ASCII characters and with empty lines between JSONL/TSV records,
    reads back as exactly the whitespace-normalised pairs with both sides non-empty (the others counted in
    ``dropped_empty``), cut at ``max_samples``; a file with no such pair is a `DataError` that names it."""
    fmt, pairs, gz, newline = spec
    blank_lines = tuple(blank_lines) if fmt in ("jsonl", "tsv") else ()
    kept, dropped = expected_corpus(pairs, max_samples)
    with tempfile.TemporaryDirectory() as folder:
        path = write_parallel(Path(folder), fmt, pairs, gz, newline, ascii_only, blank_lines)
        if not kept:
            with pytest.raises(DataError) as error:
                read_parallel_file(path, "en", "es", max_samples=max_samples)
            assert str(path) in str(error.value) and ("is empty" in str(error.value) or "no sentence pair" in str(error.value))
            return
        corpus = read_parallel_file(path, "en", "es", max_samples=max_samples)
    assert list(zip(corpus.sources, corpus.targets)) == kept
    assert corpus.dropped_empty == dropped


MALFORMED_JSONL = st.sampled_from([
    '{"translation": {"en": "x", "es": }',  # not JSON
    '{"translation": ',  # not JSON (cut)
    "[1, 2",  # not JSON
    '"just a string"',  # not an object
    "[]",  # not an object
    '{"en": "x", "es": "y"}',  # no 'translation'
    '{"translation": ["x", "y"]}',  # 'translation' not a mapping
    '{"translation": {"en": "x"}}',  # no target
    '{"translation": {"en": "x", "fr": "y"}}',  # no target
    '{"translation": {"en": 3, "es": "y"}}',  # not a string
    '{"translation": {"en": "x", "es": null}}',  # not a string
])
MALFORMED_TSV = st.one_of(
    TSV_TEXT.filter(lambda text: text != ""),  # one column
    st.lists(TSV_TEXT, min_size=3, max_size=4).map("\t".join),  # three or four columns
)


@examples(80)
@given(st.sampled_from(["jsonl", "tsv"]), pairs_of(TSV_TEXT), st.integers(0, 8), st.data(), st.booleans(),
       st.sampled_from(["\n", "\r\n"]))
def test_a_malformed_line_is_reported_with_its_file_and_line_number(fmt, pairs, position, data, gz, newline):
    """In a JSONL or TSV file (gzipped or not, LF or CRLF) whose other lines are well-formed records of arbitrary
    Unicode text, one malformed line – bad JSON, a record of the wrong shape, a wrong column count – makes
    `read_parallel_file` raise a one-line `DataError` that starts with ``<file> line <n>:`` for exactly that line
    (counted as an editor counts lines), and nothing else."""
    bad = data.draw(MALFORMED_JSONL if fmt == "jsonl" else MALFORMED_TSV, label="malformed line")
    position = min(position, len(pairs))
    # A file that opens with '[' may be one JSON list (the reader accepts that): an unterminated list there is
    # located where the JSON parser notices it, and a lone '[]' is an empty list, not a bad line.
    assume(not (position == 0 and bad.startswith("[") and (bad == "[1, 2" or not pairs)))
    with tempfile.TemporaryDirectory() as folder:
        path = write_parallel(Path(folder), fmt, pairs, gz, newline, ascii_only=False)
        raw = gzip.decompress(path.read_bytes()) if gz else path.read_bytes()
        lines = raw.decode("utf-8").split(newline)[:-1]
        lines.insert(position, bad)
        bad_path = write(Path(folder) / ("bad." + fmt), "".join(line + newline for line in lines), gz)
        with pytest.raises(DataError) as error:
            read_parallel_file(bad_path, "en", "es")
    message = str(error.value)
    assert message.startswith(f"{bad_path} line {position + 1}: "), message
    assert "\n" not in message


SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)


@examples(40)
@given(st.sampled_from(["jsonl", "json-list"]), pairs_of(ANY_TEXT).filter(bool), st.data(), st.booleans())
def test_a_json_string_with_a_lone_surrogate_is_a_data_error(fmt, pairs, data, gz):
    """JSON may escape half of a UTF-16 pair (``"\\ud83d"``, common in crawled text cut inside an emoji), which
    Python reads as a str that no tokenizer can encode. A record holding one, anywhere in either side, is a
    one-line `DataError` naming the file and the line (JSON lines) or record number (a JSON list) and the
    surrogate – not a UnicodeEncodeError in tokenizer training later."""
    index = data.draw(st.integers(0, len(pairs) - 1), label="record")
    side = data.draw(st.integers(0, 1), label="side")
    surrogate = data.draw(SURROGATES, label="surrogate")
    text = pairs[index][side]
    cut = data.draw(st.integers(0, len(text)), label="position")
    pair = list(pairs[index])
    pair[side] = text[:cut] + surrogate + text[cut:]
    pairs = [*pairs[:index], tuple(pair), *pairs[index + 1:]]
    with tempfile.TemporaryDirectory() as folder:
        path = write_parallel(Path(folder), fmt, pairs, gz, "\n", ascii_only=True)  # escapes are the only way
        with pytest.raises(DataError) as error:
            read_parallel_file(path, "en", "es")
    where = f"line {index + 1}" if fmt == "jsonl" else f"record {index + 1}"
    lang = ("en", "es")[side]
    message = str(error.value)
    assert message.startswith(f"{path} {where}: 'translation.{lang}' holds the lone surrogate "
                              f"{ascii(surrogate)[1:-1]}"), message
    assert "\n" not in message


@examples(60)
@given(st.sampled_from(["jsonl", "tsv", "prefix"]), pairs_of(TSV_TEXT).filter(bool), st.data(),
       st.sampled_from([b"\xff", b"\xc3", b"\xe9t\xe9", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"]))
def test_bytes_that_are_not_utf8_are_reported_with_their_file_and_line(fmt, pairs, data, bad_bytes):
    """Bytes that are not UTF-8 (a stray latin-1 byte, a cut multi-byte sequence, an encoded surrogate, an
    over-long form) placed in any line of a JSONL, TSV or prefix file are a `DataError` naming that file and the
    line the bytes are on."""
    with tempfile.TemporaryDirectory() as folder:
        path = write_parallel(Path(folder), fmt, pairs, gz=False, newline="\n")
        damaged = path if fmt != "prefix" else Path(f"{path}.en")
        lines = damaged.read_bytes().split(b"\n")[:-1]
        line = data.draw(st.integers(0, len(lines) - 1), label="line")
        cut = data.draw(st.integers(0, len(lines[line])), label="column")
        lines[line] = lines[line][:cut] + bad_bytes + lines[line][cut:]
        damaged.write_bytes(b"".join(chunk + b"\n" for chunk in lines))
        with pytest.raises(DataError) as error:
            read_parallel_file(path, "en", "es")
    assert str(error.value).startswith(f"{damaged} line {line + 1}: not UTF-8 text"), str(error.value)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(["translation", "en", "es", "x"]), children, max_size=3),
    max_leaves=8,
)
GARBAGE_LINE = st.one_of(
    JSON_VALUES.map(json.dumps),
    st.builds(jsonl_record, ANY_TEXT, ANY_TEXT, st.booleans()),
    st.lists(st.one_of(ANY_TEXT, WORDY_TEXT), max_size=3).map("\t".join),
    st.text(max_size=20),
)


@st.composite
def garbage_bytes(draw) -> bytes:
    """Lines that are partly records, partly other JSON, partly text, sometimes with a few bytes changed, cut or
    gzip-compressed (whole or truncated)."""
    lines = draw(st.lists(GARBAGE_LINE, max_size=6))
    data = bytearray(draw(st.sampled_from(["\n", "\r\n", "\r"])).join(lines).encode("utf-8"))
    for _ in range(draw(st.integers(0, 2))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        data = bytearray(draw(st.binary(max_size=30)))
    if draw(st.booleans()):
        data = bytearray(gzip.compress(bytes(data), mtime=0))
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@examples(150)
@given(st.sampled_from(["data.jsonl", "data.json", "data.tsv", "data.jsonl.gz", "data.tsv.gz", "data.json.gz",
                        "prefix"]), garbage_bytes(), garbage_bytes())
def test_arbitrary_bytes_read_cleanly_or_raise_a_data_error_naming_the_file(name, data, other_side):
    """Whatever bytes a data file holds – valid or broken records, other JSON, loose text, changed bytes, random
    binary, whole or truncated gzip – `read_parallel_file` either returns a corpus of non-empty, whitespace-
    normalised pairs of UTF-8-encodable text or raises a one-line `DataError` that names the file; never another
    exception."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / name
        if name == "prefix":
            (Path(folder) / "prefix.en").write_bytes(data)
            (Path(folder) / "prefix.es").write_bytes(other_side)
        else:
            path.write_bytes(data)
        try:
            corpus = read_parallel_file(path, "en", "es")
        except DataError as error:
            message = str(error)
            assert str(path) in message and "\n" not in message, message
            return
    assert len(corpus.sources) == len(corpus.targets) > 0
    for side in corpus.sources + corpus.targets:
        assert side and side == normalise(side)
        side.encode("utf-8")  # no lone surrogate: a tokenizer can take it


def test_json_nested_too_deeply_is_a_data_error(tmp_path):
    """A JSON line, or a file that is one JSON list, nested deeper than Python's recursion limit is a `DataError`
    naming the file (and the line, for JSON lines), not a RecursionError (too deep for the generated JSON above, so
    two examples)."""
    deep = "[" * 100_000
    for name, text, where in (("deep.jsonl", jsonl_record("a", "b", True) + "\n" + deep + "\n", " line 2"),
                              ("deep.json", deep, "")):
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(DataError) as error:
            read_parallel_file(tmp_path / name, "en", "es")
        assert str(error.value) == f"{tmp_path / name}{where}: not valid JSON (nested too deeply)."


# ==============================================================================================================
# (b) the joint BPE tokenizer
# ==============================================================================================================
@pytest.fixture(scope="module")
def bpe():
    """A joint BPE (vocabulary 300) trained on the first 300 pairs of the embedded corpus, with the set of
    characters it was trained on (its alphabet: NFKC-stable Latin letters, Spanish accents, punctuation)."""
    from hf_deepnmt_training.corpus import corpus_dir
    from hf_deepnmt_training.tokenizer import train_joint_bpe

    sources, targets = [], []
    with gzip.open(corpus_dir() / "train.jsonl.gz", "rt", encoding="utf-8") as handle:
        for line, _ in zip(handle, range(300)):
            record = json.loads(line)["translation"]
            sources.append(record["en"])
            targets.append(record["es"])
    tokenizer = train_joint_bpe(sources, targets, vocab_size=300, min_frequency=2, model_max_length=1024)
    alphabet = sorted(set("".join(sources + targets)) - {" "})
    assert all(unicodedata.normalize("NFKC", char) == char for char in alphabet)
    return tokenizer, alphabet


def drop_one_leading_space(text: str) -> str:
    """Metaspace marks a word start with ``▁`` and adds one before the first word – unless the text already starts
    with a space, which then serves as that marker: so decoding loses exactly one leading space."""
    return text[1:] if text.startswith((" ", "▁")) else text


def expected_decoding(tokenizer, alphabet: set[str], text: str) -> str:
    """What decode(encode(text)) gives, special tokens kept: the NFKC form of ``text`` less one leading space, with
    the Metaspace marker ``▁`` read as a space and every character outside the training alphabet as one
    ``<unk>``."""
    out = []
    for char in drop_one_leading_space(unicodedata.normalize("NFKC", text)):
        if char in (" ", "▁"):
            out.append(" ")
        elif char in alphabet:
            out.append(char)
        else:
            out.append(tokenizer.unk_token)
    return "".join(out)


@examples(100)
@given(st.data())
def test_bpe_round_trips_text_in_its_alphabet_spacing_included(bpe, data):
    """For text made of the characters the BPE was trained on and plain spaces – words of any length in any
    order, with leading, trailing and repeated spaces – ``decode(encode(text), skip_special_tokens=True)`` is the
    text itself, except that one leading space is lost: the tokenizer's normalisation is NFKC (a no-op on this
    alphabet) and Metaspace restores every other space (`drop_one_leading_space`). The ids end with ``</s>`` and
    contain no ``<unk>``."""
    tokenizer, alphabet = bpe
    text = data.draw(st.text(st.sampled_from([*alphabet, " "]), max_size=40), label="text")
    ids = tokenizer(text)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == drop_one_leading_space(text)


SPECIAL_SPELLINGS = ("<pad>", "<s>", "</s>", "<unk>")


@examples(100)
@given(st.one_of(st.text(max_size=30),
                 st.lists(st.one_of(st.text(max_size=4), st.sampled_from(["<", "s>", "/s>", "▁", " ", "\u00a0", "ﬁ"])),
                          max_size=8).map("".join)))
def test_bpe_never_fails_and_maps_unknown_characters_to_unk(bpe, text):
    """For any Unicode text the tokenizer returns ids in the vocabulary ending with ``</s>``, and decoding them
    (specials kept, the final ``</s>`` dropped) gives exactly the text's NFKC form less one leading space, with
    ``▁`` read as a space and each character outside the training alphabet as one ``<unk>`` (`expected_decoding`).
    Text that spells a special token (``<s>``, ``</s>``, ``<pad>``, ``<unk>``) is left out: like every transformers
    tokenizer by default, ours reads that spelling as the special token itself."""
    assume(not any(special in text for special in SPECIAL_SPELLINGS))
    tokenizer, alphabet = bpe
    ids = tokenizer(text)["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id and all(0 <= i < len(tokenizer) for i in ids)
    decoded = tokenizer.decode(ids[:-1], skip_special_tokens=False)
    assert decoded == expected_decoding(tokenizer, set(alphabet), text)


# ==============================================================================================================
# (c) config validation
# ==============================================================================================================
NOT_INT = st.one_of(st.floats(), st.text(max_size=4), st.none(), st.booleans(), st.lists(st.integers(0, 5), max_size=2))
NOT_NUMBER = st.one_of(st.text(max_size=4), st.none(), st.booleans(), st.lists(st.floats(), max_size=2))
NOT_BOOL = st.one_of(st.integers(), st.floats(), st.text(max_size=4), st.none())
# Floats every float field is also checked on, one by one (test_float_fields_at_their_edges), since a few random
# examples per field may miss them.
EDGE_FLOATS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, 1.0, -1.0, 5e-324, 1e308)


def not_in(allowed) -> st.SearchStrategy:
    return st.one_of(st.text(max_size=10).filter(lambda v: v not in allowed), st.integers(), st.none(),
                     st.booleans(), st.lists(st.sampled_from(list(allowed)), min_size=1, max_size=1))


def positive_int_bad() -> st.SearchStrategy:
    return st.one_of(st.integers(max_value=0), NOT_INT)


def float_bad(allowed) -> st.SearchStrategy:
    """Floats outside ``allowed`` (nan, ±inf, the edges and random ones) and values that are no number at all."""
    return st.one_of(st.sampled_from(EDGE_FLOATS).filter(lambda v: not allowed(v)),
                     st.floats().filter(lambda v: not allowed(v)), NOT_NUMBER)


TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id", "decoder_start_token_id")
# Token ids valid beside the defaults pad 0, bos 1, eos 2, unk 3, decoder start 1 (pad, eos and unk differ; unk
# differs from bos; the decoder start may be pad, Marian's convention, docs/public-checkpoints.md).
TOKEN_ID_CLASHES = {"pad_token_id": {1, 2, 3}, "bos_token_id": {3}, "eos_token_id": {0, 3},
                    "unk_token_id": {0, 1, 2}, "decoder_start_token_id": set()}
# DTMT has no ALD: its only rules are eos != pad and decoder start != pad.
DTMT_TOKEN_ID_CLASHES = {"pad_token_id": {1, 2}, "bos_token_id": set(), "eos_token_id": {0}, "unk_token_id": set(),
                         "decoder_start_token_id": {0}}


def token_id_valid(field: str, vocab: int = 99, clashes: dict[str, set[int]] = TOKEN_ID_CLASHES) -> st.SearchStrategy:
    return st.integers(0, vocab - 1).filter(lambda v: v not in clashes[field])


def token_id_bad(vocab: int = 99) -> st.SearchStrategy:
    return st.one_of(st.integers(max_value=-1), st.integers(min_value=vocab), NOT_INT)


def probability(v: float) -> bool:
    return 0.0 <= v < 1.0


def open_unit(v: float) -> bool:
    return 0.0 < v < 1.0


def finite_non_negative(v: float) -> bool:
    return math.isfinite(v) and v >= 0.0


def finite_positive(v: float) -> bool:
    return math.isfinite(v) and v > 0.0


# float field -> (the floats it allows, a strategy for them)
DEEP_TRANSFORMER_FLOATS = {
    **{field: (probability, st.floats(0.0, 1.0, exclude_max=True))
       for field in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing")},
    "layer_norm_eps": (open_unit, st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)),
    "init_std": (finite_positive, st.one_of(st.none(), st.floats(1e-6, 10.0))),  # None: d_model ** -0.5
    "cross_attention_drop_ratio": (lambda v: 0.0 <= v <= 1.0, st.floats(0.0, 1.0)),
    **{field: (finite_non_negative, st.floats(0.0, 1e6)) for field in ("ddr_weight", "ald_weight", "diversity_weight")},
    "ald_unk_ratio": (lambda v: 0.0 < v < 0.5, st.floats(0.0, 0.5, exclude_min=True, exclude_max=True)),
    "ald_temperature": (finite_positive, st.floats(1e-6, 1e6)),
}
DTMT_FLOATS = {
    **{field: (probability, st.floats(0.0, 1.0, exclude_max=True))
       for field in ("dropout", "rnn_dropout", "readout_dropout", "label_smoothing")},
    "init_range": (finite_positive, st.floats(1e-6, 10.0)),
    "layer_norm_eps": (open_unit, st.floats(0.0, 1.0, exclude_min=True, exclude_max=True)),
}

# field -> (valid values, invalid values, other fields the valid values need). Base: conftest's TINY config.
DEEP_TRANSFORMER_FIELDS: dict[str, tuple[st.SearchStrategy, st.SearchStrategy, dict]] = {
    "vocab_size": (st.integers(4, 10**6), positive_int_bad(), {}),
    "d_model": (st.integers(1, 128).map(lambda v: 4 * v),
                st.one_of(positive_int_bad(), st.integers(0, 100).map(lambda v: 2 * v + 1)), {}),
    **{field: (st.integers(1, 64), positive_int_bad(), {})
       for field in ("encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim",
                     "max_position_embeddings")},
    **{field: (st.sampled_from([1, 2, 4, 8, 16]), positive_int_bad(), {})
       for field in ("encoder_attention_heads", "decoder_attention_heads")},
    "activation_function": (st.sampled_from(ALLOWED_ACTIVATIONS), not_in(ALLOWED_ACTIVATIONS), {}),
    **{field: (valid, float_bad(allowed), {}) for field, (allowed, valid) in DEEP_TRANSFORMER_FLOATS.items()},
    "init_std": (DEEP_TRANSFORMER_FLOATS["init_std"][1],
                 float_bad(DEEP_TRANSFORMER_FLOATS["init_std"][0]).filter(lambda v: v is not None), {}),
    **{field: (st.booleans(), NOT_BOOL, {}) for field in ("scale_embedding", "tie_word_embeddings", "use_cache")},
    "is_encoder_decoder": (st.just(True), st.one_of(NOT_BOOL, st.just(False)), {}),
    **{field: (st.booleans(), NOT_BOOL, {"residual_scaling": "admin", "admin_init": "profiling"})
       for field in ("admin_omega_trainable", "admin_profiled")},
    "layer_norm_position": (st.sampled_from(ALLOWED_LAYER_NORM_POSITIONS), not_in(ALLOWED_LAYER_NORM_POSITIONS), {}),
    "residual_scaling": (st.sampled_from(ALLOWED_RESIDUAL_SCALINGS), not_in(ALLOWED_RESIDUAL_SCALINGS), {}),
    "admin_init": (st.sampled_from(ALLOWED_ADMIN_INITS), not_in(ALLOWED_ADMIN_INITS), {"residual_scaling": "admin"}),
    "cross_attention_drop_depth": (st.integers(0, 2),
                                   st.one_of(st.integers(max_value=-1), st.integers(min_value=3), NOT_INT),
                                   {"cross_attention_drop_ratio": 0.5}),
    "ald_protected_token_ids": (st.lists(st.integers(0, 98).filter(lambda v: v != 3), max_size=4),
                                st.one_of(st.integers(), st.text(min_size=1, max_size=3), st.floats(),
                                          st.lists(st.one_of(st.integers(max_value=-1), st.integers(min_value=99),
                                                             st.just(3), NOT_INT), min_size=1, max_size=3)), {}),
    **{field: (st.sampled_from(LAYER_AGGREGATIONS), not_in(LAYER_AGGREGATIONS), {})
       for field in ("encoder_layer_aggregation", "decoder_layer_aggregation")},
    "aggregation_activation": (st.sampled_from(AGGREGATION_ACTIVATIONS), not_in(AGGREGATION_ACTIVATIONS), {}),
    "multi_layer_attention_k": (st.sampled_from([1, 2, 3]),
                                st.one_of(st.integers().filter(lambda v: v not in (1, 2, 3)), NOT_INT),
                                {"encoder_layers": 4, "decoder_layers": 4}),
    **{field: (token_id_valid(field), token_id_bad(), {}) for field in TOKEN_IDS},
    # Marian (OPUS-MT) has no <s> (docs/public-checkpoints.md)
    "bos_token_id": (st.one_of(st.none(), token_id_valid("bos_token_id")),
                     token_id_bad().filter(lambda v: v is not None), {}),
    "position_encoding": (st.sampled_from(ALLOWED_POSITION_ENCODINGS), not_in(ALLOWED_POSITION_ENCODINGS), {}),
    "position_offset": (st.integers(0, 100), st.one_of(st.integers(max_value=-1), NOT_INT), {}),
    "output_bias": (st.booleans(), NOT_BOOL, {}),
    "share_encoder_decoder_embeddings": (st.booleans(), NOT_BOOL, {}),
    # a target vocabulary of its own needs share_encoder_decoder_embeddings=False; it must hold the special ids
    "decoder_vocab_size": (st.one_of(st.none(), st.integers(4, 10**6)),
                           st.one_of(st.integers(max_value=3), NOT_INT.filter(lambda v: v is not None)),
                           {"share_encoder_decoder_embeddings": False}),
}

DTMT_BASE = dict(vocab_size=99, d_model=16, attention_heads=2, transition_depth=1, max_position_embeddings=64)
DTMT_FIELDS: dict[str, tuple[st.SearchStrategy, st.SearchStrategy, dict]] = {
    "vocab_size": (st.integers(4, 10**6), positive_int_bad(), {}),
    "d_model": (st.integers(1, 128).map(lambda v: 2 * v),
                st.one_of(positive_int_bad(), st.integers(0, 100).map(lambda v: 2 * v + 1)), {"attention_heads": 1}),
    "attention_heads": (st.sampled_from([1, 2, 4, 8, 16]), positive_int_bad(), {}),
    "max_position_embeddings": (st.integers(1, 10**5), positive_int_bad(), {}),
    "transition_depth": (st.integers(0, 8), st.one_of(st.integers(max_value=-1), NOT_INT), {}),
    "rnn_cell": (st.sampled_from(ALLOWED_RNN_CELLS), not_in(ALLOWED_RNN_CELLS), {}),
    "length_penalty_form": (st.sampled_from(ALLOWED_LENGTH_PENALTY_FORMS), not_in(ALLOWED_LENGTH_PENALTY_FORMS), {}),
    **{field: (st.booleans(), NOT_BOOL, {})
       for field in ("encoder_transition", "query_transition", "decoder_transition", "positional_encoding",
                     "share_encoder_decoder_embeddings", "tie_word_embeddings", "use_cache")},
    "is_encoder_decoder": (st.just(True), st.one_of(NOT_BOOL, st.just(False)), {}),
    **{field: (valid, float_bad(allowed), {}) for field, (allowed, valid) in DTMT_FLOATS.items()},
    **{field: (token_id_valid(field, clashes=DTMT_TOKEN_ID_CLASHES), token_id_bad(), {}) for field in TOKEN_IDS},
}


def assert_names(error: BaseException, field: str, value) -> None:
    message = str(error)
    assert type(error) is UserInputError, f"{type(error).__name__}: {message}"  # ours, not a validator's
    assert f"`{field}` = {value!r}" in message and "\n" not in message, message


def check_invalid(build, field: str, value) -> None:
    with pytest.raises(Exception) as error:
        build(**{field: value})
    assert_names(error.value, field, value)


def check_valid(build, field: str, value, context: dict) -> None:
    config = build(**{**context, field: value})
    assert getattr(config, field) == value
    reloaded = type(config).from_dict(json.loads(config.to_json_string()))
    assert getattr(reloaded, field) == value


def build_deep_transformer(**overrides) -> DeepTransformerConfig:
    return DeepTransformerConfig(**{**TINY, **overrides})


def build_dtmt(**overrides) -> DTMTConfig:
    return DTMTConfig(**{**DTMT_BASE, **overrides})


@pytest.mark.parametrize("field", sorted(DEEP_TRANSFORMER_FIELDS))
@examples(15)
@given(data=st.data())
def test_deep_transformer_config_names_every_bad_value(field, data):
    """For every validated field of `DeepTransformerConfig`, a value of the wrong type (strings, None, bools,
    floats for ints, lists) or outside the field's range (nan and ±inf included) raises a one-line `ValueError` –
    that exact type, before any transformers validator – that names the field and the value ("`field` = repr")."""
    check_invalid(build_deep_transformer, field, data.draw(DEEP_TRANSFORMER_FIELDS[field][1], label=field))


@pytest.mark.parametrize("field", sorted(DEEP_TRANSFORMER_FIELDS))
@examples(10)
@given(data=st.data())
def test_deep_transformer_config_accepts_every_valid_value(field, data):
    """Every value a `DeepTransformerConfig` field allows (with the other fields it needs) constructs, is kept as
    given and survives a JSON round trip (`to_json_string` -> `from_dict`)."""
    valid, _, context = DEEP_TRANSFORMER_FIELDS[field]
    check_valid(build_deep_transformer, field, data.draw(valid, label=field), context)


@pytest.mark.parametrize("build, field, allowed", [
    *(pytest.param(build_deep_transformer, field, allowed, id=f"DeepTransformerConfig-{field}")
      for field, (allowed, _) in DEEP_TRANSFORMER_FLOATS.items()),
    *(pytest.param(build_dtmt, field, allowed, id=f"DTMTConfig-{field}") for field, (allowed, _) in DTMT_FLOATS.items()),
])
def test_float_fields_at_their_edges(build, field, allowed):
    """Every float field of both configs, at each of nan, ±inf, ±0, 0.5, 1, -1, the smallest subnormal and 1e308:
    the values its rule allows construct, the others raise the one-line `ValueError` naming field and value."""
    for value in EDGE_FLOATS:
        if allowed(value):
            assert getattr(build(**{field: value}), field) == value
        else:
            check_invalid(build, field, value)


@pytest.mark.parametrize("field", sorted(DTMT_FIELDS))
@examples(15)
@given(data=st.data())
def test_dtmt_config_names_every_bad_value(field, data):
    """As for `DeepTransformerConfig`: a wrong-typed or out-of-range value of any `DTMTConfig` field raises a
    one-line `ValueError` naming the field and the value."""
    check_invalid(build_dtmt, field, data.draw(DTMT_FIELDS[field][1], label=field))


@pytest.mark.parametrize("field", sorted(DTMT_FIELDS))
@examples(10)
@given(data=st.data())
def test_dtmt_config_accepts_every_valid_value(field, data):
    """Every value a `DTMTConfig` field allows constructs, is kept and survives a JSON round trip."""
    valid, _, context = DTMT_FIELDS[field]
    check_valid(build_dtmt, field, data.draw(valid, label=field), context)


@pytest.mark.parametrize("field", sorted(TRANSFORMER_ONLY_FIELDS))
@examples(3)
@given(value=JSON_VALUES)
def test_dtmt_config_refuses_every_transformer_field_whatever_its_value(field, value):
    """A Transformer-only field passed to `DTMTConfig` is refused by name with any value (valid for the
    Transformer or not): a one-line `ValueError` naming the field and the value."""
    check_invalid(build_dtmt, field, value)


@pytest.mark.parametrize("field", sorted(foreign_fields(TRANSFORMER)))
@examples(3)
@given(value=JSON_VALUES)
def test_transformer_configs_refuse_every_dtmt_field_whatever_its_value(field, value):
    """A field of meng2019's DTMT passed to `DeepTransformerConfig` is refused by name with any value (it would
    otherwise be stored as an attribute no layer reads): a one-line `ValueError` naming the field and the value."""
    check_invalid(build_deep_transformer, field, value)


def test_every_validated_field_has_a_property():
    """The tables above cover every `__init__` argument of both configs (all are validated), so a new field cannot
    go without its two properties."""
    import inspect

    passed_on = {"kwargs", "self"}
    deep = set(inspect.signature(DeepTransformerConfig.__init__).parameters) - passed_on
    dtmt = set(inspect.signature(DTMTConfig.__init__).parameters) - passed_on
    assert deep == set(DEEP_TRANSFORMER_FIELDS)
    assert dtmt == set(DTMT_FIELDS)
    # and every argument has its rules in the config's one field → rule table, run once at construction
    assert deep == set(DeepTransformerConfig.field_rules)
    assert dtmt == set(DTMTConfig.field_rules)


# ==============================================================================================================
# (d) padding invariance
# ==============================================================================================================
@st.composite
def deep_transformer_config(draw, aggregation: str) -> DeepTransformerConfig:
    """A random tiny DeepTransformer (d_model 16, 2-4 layers per stack) with dou2018 ``aggregation`` in both stacks
    and random other structural options: pre/post LN, ADMIN (closed form), AGG activation, multi-layer attention
    k (drawn first, so each k is as likely), CAD with bottom layers built without cross-attention."""
    k = draw(st.integers(1, 3))
    encoder_layers, decoder_layers = draw(st.integers(k + 1, 4)), draw(st.integers(k + 1, 4))
    position = draw(st.sampled_from(ALLOWED_LAYER_NORM_POSITIONS))
    admin = position == "post" and draw(st.booleans())
    no_cross = draw(st.booleans())
    return DeepTransformerConfig(**{
        **TINY, "encoder_layers": encoder_layers, "decoder_layers": decoder_layers, "multi_layer_attention_k": k,
        "layer_norm_position": position,
        "encoder_layer_aggregation": aggregation,
        "decoder_layer_aggregation": aggregation,
        "aggregation_activation": draw(st.sampled_from(AGGREGATION_ACTIVATIONS)),
        "scale_embedding": draw(st.booleans()),
        **({"residual_scaling": "admin", "admin_init": "closed_form"} if admin else {}),
        **({"cross_attention_drop_depth": 1, "cross_attention_drop_ratio": 1.0} if no_cross else {}),
    })


@st.composite
def dtmt_config(draw) -> DTMTConfig:
    """A random tiny DTMT (d_model 16): L-GRU or GRU, transition depth 0-2, each Table 4 ablation, PE or not."""
    return DTMTConfig(**{
        **DTMT_BASE, "transition_depth": draw(st.integers(0, 2)), "rnn_cell": draw(st.sampled_from(ALLOWED_RNN_CELLS)),
        "encoder_transition": draw(st.booleans()), "query_transition": draw(st.booleans()),
        "decoder_transition": draw(st.booleans()), "positional_encoding": draw(st.booleans()),
        "share_encoder_decoder_embeddings": draw(st.booleans()),
    })


SENTENCE = st.lists(st.integers(4, 98), min_size=0, max_size=7).map(lambda ids: ids + [2])  # ends with </s>
PADDED_INPUTS = dict(
    sentences=st.lists(SENTENCE, min_size=1, max_size=3),
    extra=st.integers(0, 4),
    decoder_ids=st.lists(st.integers(4, 98), min_size=0, max_size=5).map(lambda ids: [1] + ids),
    garbage=st.booleans(),
    seed=st.integers(0, 2**16),
)


def check_padding_invariance(family, config, sentences, extra, decoder_ids, garbage, seed) -> None:
    """Batch ``sentences`` right-padded (attention mask 0) to their longest length plus ``extra`` – the masked
    positions holding ``<pad>`` or, with ``garbage``, random ids – and compare every row with the sentence run
    alone: decoder logits and the encoder states of the real positions agree to 1e-5."""
    torch.manual_seed(seed)
    model = family(config).eval()
    width = max(map(len, sentences)) + extra
    input_ids = torch.zeros(len(sentences), width, dtype=torch.long)
    if garbage:
        input_ids = torch.randint(0, config.vocab_size, (len(sentences), width),
                                  generator=torch.Generator().manual_seed(seed))
    attention_mask = torch.zeros(len(sentences), width, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        input_ids[row, : len(sentence)] = torch.tensor(sentence)
        attention_mask[row, : len(sentence)] = 1
    decoder_input_ids = torch.tensor([decoder_ids] * len(sentences))
    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
        for row, sentence in enumerate(sentences):
            alone = model(input_ids=torch.tensor([sentence]), attention_mask=torch.ones(1, len(sentence), dtype=torch.long),
                          decoder_input_ids=decoder_input_ids[:1])
            # equal up to float32 rounding: dou2018's dense connection under post-LN grows the states layer by layer
            # (docs/dou2018.md), so the tolerance is relative as well as absolute
            torch.testing.assert_close(batched.logits[row], alone.logits[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(batched.encoder_last_hidden_state[row, : len(sentence)],
                                       alone.encoder_last_hidden_state[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("aggregation", LAYER_AGGREGATIONS)
@examples(4)
@given(data=st.data(), **PADDED_INPUTS)
def test_padding_never_changes_deep_transformer_logits(aggregation, data, sentences, extra, decoder_ids, garbage, seed):
    """In eval mode, for random tiny DeepTransformers – each dou2018 layer aggregation (here in both stacks), with
    random LN position, ADMIN, multi-layer attention k 1-3 and CAD-removed cross-attentions – and random source
    sentences, batching the sentences with right padding changes no decoder logit and no encoder state of a real
    position (|Δ| ≤ 1e-5) compared with each sentence alone, also when the masked positions hold arbitrary ids."""
    config = data.draw(deep_transformer_config(aggregation), label="config")
    check_padding_invariance(DeepTransformerForConditionalGeneration, config, sentences, extra, decoder_ids, garbage, seed)


@examples(8)
@given(config=dtmt_config(), **PADDED_INPUTS)
def test_padding_never_changes_dtmt_logits(config, sentences, extra, decoder_ids, garbage, seed):
    """The same for random tiny DTMT models (L-GRU or GRU, transition depth 0-2, every Table 4 ablation, with or
    without positional encoding): the bidirectional encoder reads each row within its length, so right padding
    changes no logit and no encoder state of a real position."""
    check_padding_invariance(DTMTForConditionalGeneration, config, sentences, extra, decoder_ids, garbage, seed)
