"""`deepnmt train`'s mistakes answered before torch loads (docs/training.md, "The command line").

The full parser of `deepnmt train` is transformers' `HfArgumentParser` over `Seq2SeqTrainingArguments`, whose module
imports torch: 6–8 CPU-seconds before a misspelt option or a bad value could be named. So the option table that
parser builds — every option string with its type, choices and arity — is kept in the cache of `hf_deepnmt_training.help_cache`
(the same key: versions and source files) whenever the full parser is built, and `precheck` parses the command line
against that table with the standard library alone: unknown and ill-typed options, values out of range
(`check_option_values`, which the full parse runs too) and data files that do not exist are one sentence in well
under a second. Without a table (the first run after installing or editing the package) `precheck` does nothing and
the full parse finds the same mistakes, slower.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hf_deepnmt_model_cards.licenses import license_problem

from .arguments import TRAIN_ALIASES, canonical_options, unknown_arguments_message
from .errors import CommandLineError
from .help_cache import cached_help, store_help

SCHEMA_NAME = "train-options"
CORPUS_PREFIX = "corpus:"  # `hf_deepnmt_training.recipes.CORPUS_PREFIX`: a path inside the embedded corpus
DATA_OPTIONS = ("train_file", "validation_file", "test_file")
POSITIVE_INTEGERS = ("eval_num_beams", "vocab_size", "bpe_min_frequency", "bpe_sample_pairs", "admin_profile_tokens")


# ------------------------------------------------------------------------------------------------ the option table
def _type_name(action: argparse.Action) -> str:
    """How `precheck` converts an option's value: int, float, bool, or str (anything else: not checked)."""
    kind = action.type
    if kind in (int, float):
        return kind.__name__
    if getattr(kind, "__name__", "") == "string_to_bool":
        return "bool"
    return "str"


def option_table(parser: argparse.ArgumentParser) -> list[dict[str, Any]]:
    """The options of a built `deepnmt train` parser as plain data."""
    table = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        table.append({"options": list(action.option_strings), "dest": action.dest,
                      "nargs": action.nargs if isinstance(action.nargs, (str, int)) or action.nargs is None else None,
                      "type": _type_name(action), "store_false": isinstance(action, argparse._StoreFalseAction),
                      "choices": [str(choice) for choice in action.choices] if action.choices else None})
    return table


def store_option_table(parser: argparse.ArgumentParser) -> None:
    """Keep the table of ``parser`` for `precheck` (skipped when the cache already holds the current one)."""
    if cached_help(SCHEMA_NAME) is None:
        store_help(SCHEMA_NAME, json.dumps(option_table(parser)))


def _to_bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("yes", "true", "t", "y", "1"):
        return True
    if lowered in ("no", "false", "f", "n", "0"):
        return False
    raise argparse.ArgumentTypeError(f"Truthy value expected: got {value} but expected one of yes/no, true/false")


class _LightParser(argparse.ArgumentParser):
    def error(self, message: str):  # noqa: ANN201 (argparse's signature)
        raise CommandLineError(f"{message} (see `deepnmt train --help`)")


def light_parser(table: list[dict[str, Any]]) -> argparse.ArgumentParser:
    """An argparse parser of the table's options: their names, arity, types and choices, no defaults."""
    parser = _LightParser(prog="deepnmt train", allow_abbrev=False, add_help=False,
                          argument_default=argparse.SUPPRESS)
    types = {"int": int, "float": float, "bool": _to_bool, "str": str}
    for entry in table:
        if entry["store_false"]:
            parser.add_argument(*entry["options"], dest=entry["dest"], action="store_false")
            continue
        kwargs: dict[str, Any] = {"dest": entry["dest"], "type": types[entry["type"]]}
        if entry["nargs"] is not None:
            kwargs["nargs"] = entry["nargs"]
            if entry["nargs"] == "?" and entry["type"] == "bool":
                kwargs["const"] = True
        if entry["choices"]:
            kwargs["choices"] = entry["choices"]
            kwargs["type"] = str
        parser.add_argument(*entry["options"], **kwargs)
    return parser


# ------------------------------------------------------------------------------------------------ checks
class _Values:
    """Attribute lookup over several argument objects (the three dataclasses of the full parse, or one namespace);
    a name none of them has is None."""

    def __init__(self, *sources: Any) -> None:
        self.sources = sources

    def __getattr__(self, name: str) -> Any:
        for source in self.sources:
            if hasattr(source, name):
                return getattr(source, name)
        return None


def check_option_values(*sources: Any) -> None:
    """The values transformers would take without complaint but that cannot be what the user meant (values not
    given are their defaults, which pass)."""
    values = _Values(*sources)
    if values.license is not None and license_problem(values.license):
        raise CommandLineError(license_problem(values.license))
    for name in POSITIVE_INTEGERS:
        value = getattr(values, name)
        if value is not None and not (isinstance(value, int) and value >= 1):
            raise CommandLineError(f"`--{name}` = {value!r} is not allowed; use a positive integer.")
    max_steps = values.max_steps
    if max_steps is not None and max_steps < 1 and max_steps != -1:
        # transformers reads every non-positive value as "train for --num_train_epochs"; -1 is its documented default
        raise CommandLineError(f"`--max_steps` = {max_steps} is not allowed; use a positive number of optimizer "
                               "steps, or -1 (the default) to train for --num_train_epochs.")
    minutes = values.max_train_minutes
    if minutes is not None and not (math.isfinite(minutes) and minutes > 0):
        raise CommandLineError(f"`--max_train_minutes` = {minutes!r} is not allowed; use a positive number of "
                               "minutes.")
    smoothing = values.label_smoothing_factor
    if smoothing is not None and not (math.isfinite(smoothing) and 0 <= smoothing < 1):
        # the model configs refuse it too, but only once the data is read and the model built
        raise CommandLineError(f"`--label_smoothing_factor` = {smoothing!r} is not allowed; use a number in [0, 1) "
                               "(0.1 or 0.2 in deepnmt's defaults, 0 for none).")
    scale, hold = values.warm_start_new_lr_scale, values.warm_start_freeze_steps
    if ((scale is not None and scale != 1.0) or (hold is not None and hold != 0)) and not values.warm_start_from:
        raise CommandLineError("`--warm_start_new_lr_scale` / `--warm_start_freeze_steps` apply to the parameters a "
                               "warm start adds; give --warm_start_from too, or leave them at 1.0 / 0.")
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise CommandLineError(f"`--warm_start_new_lr_scale` = {scale!r} is not allowed; use a number > 0 (1.0: the "
                               "same learning rate as the trained parameters; --warm_start_freeze_steps holds them).")
    if hold is not None and hold < 0:
        raise CommandLineError(f"`--warm_start_freeze_steps` = {hold!r} is not allowed; use 0 (no hold) or a positive "
                               "number of optimizer steps.")
    method, held = values.warm_start_method, values.warm_start_hold_pretrained_steps
    if ((method is not None and method != "copy") or (held is not None and held != 0)) and not values.warm_start_from:
        raise CommandLineError("`--warm_start_method` / `--warm_start_hold_pretrained_steps` start a model from a trained "
                               "one; give --warm_start_from too, or leave them at copy / 0.")
    if method is not None and method not in ("copy", "grow", "stack"):
        raise CommandLineError(f"`--warm_start_method` = {method!r} is not allowed; use copy, grow (Wu et al. 2019) or "
                               "stack (Li et al. 2020).")
    if held is not None and held < 0:
        raise CommandLineError(f"`--warm_start_hold_pretrained_steps` = {held!r} is not allowed; use 0 (no hold) or a "
                               "positive number of optimizer steps.")


def check_data_files(values: argparse.Namespace) -> None:
    """A data file named on the command line that exists neither as a file nor as a ``PREFIX`` of ``PREFIX.<lang>``
    files (the embedded corpus' ``corpus:`` paths included)."""
    from .corpus import corpus_dir

    for name in DATA_OPTIONS:
        value = getattr(values, name, None)
        if not value:
            continue
        path = Path(corpus_dir().parent / value[len(CORPUS_PREFIX):]) if value.startswith(CORPUS_PREFIX) \
            else Path(value).expanduser()
        if path.exists() or (path.parent.is_dir() and any(path.parent.glob(f"{glob.escape(path.name)}.*"))):
            continue
        raise CommandLineError(f"`--{name}` = {value!r} does not exist (neither a data file nor the PREFIX of "
                               f"PREFIX.<lang> files).")


def precheck(argv: Sequence[str]) -> None:
    """Refuse a `deepnmt train` command line that cannot run, before torch loads (see the module docstring)."""
    text = cached_help(SCHEMA_NAME)
    if text is None or "--help" in argv or "-h" in argv:
        return
    parser = light_parser(json.loads(text))
    values, unknown = parser.parse_known_args(canonical_options(argv, TRAIN_ALIASES))
    if unknown:
        known = [option for action in parser._actions for option in action.option_strings]
        raise CommandLineError(unknown_arguments_message(unknown, known) + " (see `deepnmt train --help`)")
    check_option_values(values)
    check_data_files(values)
