"""The command-line vocabulary shared by every `deepnmt` command (docs/training.md, "The command line").

An option may be spelt with hyphens or underscores (``--num-beams`` = ``--num_beams``); ``--model`` is
``--model_name_or_path``, ``--src_lang`` / ``--tgt_lang`` are ``--source_lang`` / ``--target_lang`` everywhere (and
``--num_beams`` is ``--eval_num_beams`` for `deepnmt train`); abbreviations are refused; a misspelt option is named
with its closest matches, in one sentence (`CommandLineError`), never as a usage dump or a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import CommandLineError

# One vocabulary for every command (docs/training.md, "The command line"): an option may be spelt with hyphens or
# underscores (`--num-beams` = `--num_beams`), and these aliases name the same option everywhere.
OPTION_ALIASES = {"--model": "--model_name_or_path", "--src_lang": "--source_lang", "--tgt_lang": "--target_lang"}
# `deepnmt train` (and the quickstart, which runs it) call the beam of the final test evaluation `--eval_num_beams`.
TRAIN_ALIASES = {**OPTION_ALIASES, "--num_beams": "--eval_num_beams"}
# The choices of `deepnmt export` / `deepnmt translate --engine`, spelt here so that `--help` needs no torch; they
# are `hf_deepnmt.export`'s (tests/test_cli.py checks that they are the same).
EXPORT_FORMATS: tuple[str, ...] = ("ctranslate2", "onnx", "marian", "argos")
ENGINES: tuple[str, ...] = ("torch", "ctranslate2", "onnx")
# `hf_deepnmt.ensemble.COMBINATIONS`, spelt here so that `--help` needs no torch (tests/test_cli.py checks they agree).
ENSEMBLE_COMBINATIONS: tuple[str, ...] = ("mean", "log_linear")
# The commands whose --model takes several folders, an ensemble (`hf_deepnmt_training.cli.check_references` checks each).
SEVERAL_MODEL_COMMANDS: tuple[str, ...] = ("translate", "evaluate", "distill")
QUANTIZATIONS: dict[str, tuple[str, ...]] = {
    "ctranslate2": ("int8", "int8_float32", "bfloat16"),
    "onnx": ("int8",),
    "marian": ("bfloat16",),
    "argos": ("int8", "int8_float32", "bfloat16"),
}


def underscored(argv: Sequence[str]) -> list[str]:
    """Option names with hyphens spelt with underscores (``--num-beams=4`` → ``--num_beams=4``); values untouched."""
    spelt = []
    for token in argv:
        if token.startswith("--") and len(token) > 2:
            flag, equals, value = token.partition("=")
            token = "--" + flag[2:].replace("-", "_") + equals + value
        spelt.append(token)
    return spelt


def canonical_options(argv: Sequence[str], aliases: dict[str, str] = OPTION_ALIASES) -> list[str]:
    """`underscored` options, each alias replaced by the option it names (``--model`` → ``--model_name_or_path``)."""
    canonical = []
    for token in underscored(argv):
        flag, equals, value = token.partition("=")
        canonical.append(aliases.get(flag, flag) + equals + value if flag in aliases else token)
    return canonical


def unknown_arguments_message(unknown: Sequence[str], known_options: Sequence[str],
                              aliases: dict[str, str] = TRAIN_ALIASES) -> str:
    """One sentence for arguments a parser did not take, with the closest known options (or their aliases, such as
    ``--num_beams`` for ``--eval_num_beams``) for a misspelt one."""
    import difflib

    known_options = [*known_options, *(alias for alias, option in aliases.items() if option in known_options)]
    flags = [token.partition("=")[0] for token in unknown if token.startswith("-")]
    if not flags:
        return f"unexpected argument(s) {' '.join(map(repr, unknown))}"
    spelt = sorted({option for option in known_options if "-" not in option[2:]})  # one spelling of each option
    hints = [difflib.get_close_matches(flag, spelt, n=2, cutoff=0.6) for flag in flags]
    if len(flags) == 1:
        return f"unknown option `{flags[0]}`" + (f"; did you mean {' or '.join(hints[0])}?" if hints[0] else "")
    return "unknown options " + ", ".join(f"`{flag}`" + (f" (did you mean {' or '.join(hint)}?)" if hint else "")
                                          for flag, hint in zip(flags, hints))


class CommandParser(argparse.ArgumentParser):
    """The argument parser of every `deepnmt` command but `train`: no abbreviations (``--model`` must not silently
    mean some longer option), and every mistake — a missing, misspelt or ill-typed option — raises
    `CommandLineError` with one sentence (the close matches of a misspelt option) instead of printing the usage."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        args = canonical_options(args or [])
        misspelt = [token for token in args if token.startswith("--") and token.partition("=")[0] not in
                    self._option_string_actions]
        if misspelt:  # named before a missing required option, which a misspelling usually is the cause of
            self.error(unknown_arguments_message(misspelt, list(self._option_string_actions)))
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(unknown_arguments_message(unknown, list(self._option_string_actions)))
        return parsed

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise CommandLineError(f"{message} (see `{self.prog} --help`)")


def add_model_option(parser: argparse.ArgumentParser, help_text: str, required: bool = True,
                     several: bool = False) -> None:
    """``--model_name_or_path`` (alias ``--model``), the model option of every command; ``several``: one or more
    folders (an ensemble: `deepnmt translate`, `deepnmt evaluate`, `deepnmt distill`'s teachers), a list."""
    parser.add_argument("--model_name_or_path", "--model", dest="model", required=required, metavar="MODEL",
                        nargs="+" if several else None, help=help_text)


def add_model_argument(parser: argparse.ArgumentParser, help_text: str, metavar: str = "MODEL",
                       several: bool = False) -> None:
    """The model of a command that takes one: a positional ``MODEL`` or ``--model_name_or_path`` (alias
    ``--model``), exactly one of them (`model_argument` reads it); ``several``: one or more folders either way (an
    ensemble), read as a list."""
    parser.add_argument("positional_model", nargs="*" if several else "?", metavar=metavar,
                        help=f"{help_text} (or --model_name_or_path)")
    add_model_option(parser, f"{help_text}, instead of the positional {metavar}.", required=False, several=several)


def model_argument(parser: argparse.ArgumentParser, args: argparse.Namespace, metavar: str = "MODEL") -> Any:
    """The model `add_model_argument` took, given once (a list where it takes several); sets ``args.model``."""
    if bool(args.positional_model) == bool(args.model):
        parser.error(f"give the model once, as {metavar} or --model_name_or_path")
    args.model = args.model or args.positional_model
    return args.model


def add_device_option(parser: argparse.ArgumentParser, what: str = "translates") -> None:
    """``--device``: where the torch engine runs (`hf_deepnmt_training.translate.translation_device` checks it)."""
    parser.add_argument("--device", default="auto", help=f"Where the torch engine {what}: auto (default: this "
                        "process' GPU when torch sees CUDA — cuda:LOCAL_RANK under torchrun / accelerate launch — "
                        "else the CPU), cpu, cuda, cuda:N or mps. Exported engines (onnx, ctranslate2) run on the "
                        "CPU.")


def add_ensemble_options(parser: argparse.ArgumentParser) -> None:
    """``--weights`` and ``--combination`` of an ensemble (several ``--model`` folders)."""
    parser.add_argument("--weights", type=float, nargs="+", default=None, metavar="W", help="One weight per --model "
                        "folder when several are given (default: equal).")
    parser.add_argument("--combination", choices=ENSEMBLE_COMBINATIONS, default="mean", help="How several models' "
                        "next-token distributions combine: mean (default) = log of the weighted mean of their "
                        "probabilities, as fairseq; log_linear = their weighted sum of log-probabilities, as Marian "
                        "(renormalised at each step; docs/distillation.md).")


# Languages ----------------------------------------------------------------------------------------------------
# A model records the pair it translates in its config (hf_deepnmt.record_language_pair, docs/training.md): here it is
# read from the saved files with the standard library, before torch loads, in the form
# hf_deepnmt.pipeline_translation.parse_translation_task reads (tests/test_cli.py checks that both agree).
_TRANSLATION_TASK = re.compile(r"translation_(?P<src>.+?)_to_(?P<tgt>.+)")


def saved_language_pairs(folder: str | os.PathLike) -> list[tuple[str, str]] | None:
    """The ``(source, target)`` pairs a saved model folder (its ``config.json``) or a `deepnmt export` folder (its
    ``deepnmt_export.json``) records; ``None`` when ``folder`` is not a local folder with either file."""
    folder = Path(folder).expanduser()
    for name, key in (("deepnmt_export.json", "language_pairs"), ("config.json", "task_specific_params")):
        path = folder / name
        if path.is_file():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None  # an unreadable file is reported when the model loads
            if not isinstance(saved, dict) or (name == "deepnmt_export.json" and key not in saved):
                continue  # an export written before it recorded the pair: its config.json may
            recorded = saved.get(key) or {}
            names = recorded if isinstance(recorded, (dict, list)) else []
            pairs = []
            for entry in names:
                match = _TRANSLATION_TASK.fullmatch(entry) if isinstance(entry, str) else None
                if match:
                    pairs.append((match["src"], match["tgt"]))
            return pairs
    return None


def resolve_language_pair(model: str, pairs: list[tuple[str, str]] | None, source_lang: str | None,
                          target_lang: str | None, required: bool) -> tuple[str | None, str | None]:
    """``--source_lang`` / ``--target_lang`` checked against the pairs the model records (``pairs``; ``None``: not
    known here) and completed from them: a language the model does not translate is refused, a missing one is the
    model's. With ``required`` (the command reads a parallel file), a model that records no pair needs both."""
    if pairs:
        def same(given: str | None, recorded: str) -> bool:
            return given is None or given.lower() == recorded.lower()

        matching = [pair for pair in pairs if same(source_lang, pair[0]) and same(target_lang, pair[1])]
        if not matching:
            recorded = ", ".join(f"{source} → {target}" for source, target in pairs)
            given = " → ".join(language or "?" for language in (source_lang, target_lang))
            raise CommandLineError(f"`--source_lang`/`--target_lang` = {given} is not allowed: {model} translates "
                                   f"{recorded} (recorded in its config); leave them out to use the model's pair.")
        if len(matching) == 1:
            return source_lang or matching[0][0], target_lang or matching[0][1]
    if required and (source_lang is None or target_lang is None):
        why = ("records several pairs" if pairs else "records no language pair") if pairs is not None else \
            "is not a local folder whose config could be read"
        raise CommandLineError(f"{model} {why}; pass --source_lang and --target_lang (the languages of the test "
                               "file to read).")
    return source_lang, target_lang


def add_language_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--source_lang`` / ``--target_lang`` (aliases ``--src_lang`` / ``--tgt_lang``): default the model's pair."""
    parser.add_argument("--source_lang", default=None, help=f"Source language code {what} (default: the one the "
                        "model's config records; a model trained with `deepnmt train` records its pair).")
    parser.add_argument("--target_lang", default=None, help=f"Target language code {what} (default: the model's).")


# Optional extras ----------------------------------------------------------------------------------------------
def require_modules(extra: str, modules: Sequence[str], what: str) -> None:
    """One sentence naming the extra to install when one of ``modules`` cannot be imported (checked without
    importing them)."""
    import importlib.util

    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise CommandLineError(f"{what} needs {' and '.join(missing)}, which the `{extra}` extra installs: "
                               f"pip install 'hf_deepnmt[{extra}]'.")


def quiet_libraries() -> None:
    """No progress bars from transformers itself ("Loading weights", "Writing model shards": a bar a second long on
    every command, nothing a user can act on); training's own progress bar and the data stages' bars stay. Called by
    each command once it has parsed its arguments (it imports transformers' logging, ~1 s)."""
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
