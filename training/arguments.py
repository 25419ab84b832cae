"""The command-line vocabulary shared by every `deepnmt` command (docs/training.md, "The command line").

An option may be spelt with hyphens or underscores (``--num-beams`` = ``--num_beams``); ``--model`` is
``--model_name_or_path``, ``--src_lang`` / ``--tgt_lang`` are ``--source_lang`` / ``--target_lang`` everywhere (and
``--num_beams`` is ``--eval_num_beams`` for `deepnmt train`); abbreviations are refused; a misspelt option is named
with its closest matches, in one sentence (`CommandLineError`), never as a usage dump or a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from .errors import CommandLineError

# One vocabulary for every command (docs/training.md, "The command line"): an option may be spelt with hyphens or
# underscores (`--num-beams` = `--num_beams`), and these aliases name the same option everywhere.
OPTION_ALIASES = {"--model": "--model_name_or_path", "--src_lang": "--source_lang", "--tgt_lang": "--target_lang"}
# `deepnmt train` (and the quickstart, which runs it) call the beam of the final test evaluation `--eval_num_beams`.
TRAIN_ALIASES = {**OPTION_ALIASES, "--num_beams": "--eval_num_beams"}
# The choices of `deepnmt export` / `deepnmt translate --engine`, spelt here so that `--help` needs no torch; they
# are `hf_deepnmt.export`'s (tests/test_cli.py checks that they are the same).
EXPORT_FORMATS: tuple[str, ...] = ("ctranslate2", "onnx", "marian")
ENGINES: tuple[str, ...] = ("torch", "ctranslate2", "onnx")
# `hf_deepnmt.ensemble.COMBINATIONS`, spelt here so that `--help` needs no torch (tests/test_cli.py checks they agree).
ENSEMBLE_COMBINATIONS: tuple[str, ...] = ("mean", "log_linear")
# The commands whose --model takes several folders, an ensemble (`training.cli.check_references` checks each).
SEVERAL_MODEL_COMMANDS: tuple[str, ...] = ("translate", "evaluate", "distill")
QUANTIZATIONS: dict[str, tuple[str, ...]] = {
    "ctranslate2": ("int8", "int8_float32", "bfloat16"),
    "onnx": ("int8",),
    "marian": ("bfloat16",),
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


def add_ensemble_options(parser: argparse.ArgumentParser) -> None:
    """``--weights`` and ``--combination`` of an ensemble (several ``--model`` folders)."""
    parser.add_argument("--weights", type=float, nargs="+", default=None, metavar="W", help="One weight per --model "
                        "folder when several are given (default: equal).")
    parser.add_argument("--combination", choices=ENSEMBLE_COMBINATIONS, default="mean", help="How several models' "
                        "next-token distributions combine: mean (default) = log of the weighted mean of their "
                        "probabilities, as fairseq; log_linear = their weighted sum of log-probabilities, as Marian "
                        "(renormalised at each step; docs/distillation.md).")

