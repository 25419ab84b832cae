"""The error types of the `deepnmt` command line, importable without torch or transformers.

`CommandLineError` is a command line that cannot run; `NonFiniteLossError` stops training before an update with a NaN
or infinite loss. `is_user_mistake` tells the command line which exceptions are a user's mistake — its own
`CommandLineError` and every `hf_deepnmt.errors.UserInputError` (which `hf_deepnmt_training.data.DataError` and the other training
refusals are) — to print as one sentence with exit status 2; anything else is a bug and keeps its traceback.
`hf_deepnmt` is never imported here (it loads torch): an exception can only be one of its errors once it is loaded.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path


class CommandLineError(ValueError):
    """A command line that cannot run: `deepnmt` prints its one sentence on stderr and exits with status 2."""


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; raised before the optimizer step that would spread it."""


def is_user_mistake(error: BaseException) -> bool:
    """True for the project's own user-mistake errors: `CommandLineError` and `hf_deepnmt.errors.UserInputError`."""
    if isinstance(error, CommandLineError):
        return True
    errors = sys.modules.get("hf_deepnmt.errors")
    return errors is not None and isinstance(error, errors.UserInputError)


def hub_offline() -> bool:
    """Whether huggingface_hub is told not to reach the Hub (``HF_HUB_OFFLINE``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def hub_lookup(value: str, flag: str = "--model") -> Iterator[None]:
    """Loading ``value`` (a folder or a Hub id): an `OSError` for a name that is no folder here — the Hub is offline,
    could not be reached, or has no such repository — becomes one sentence naming it; any other error, and an
    `OSError` about a folder that exists, keeps its traceback."""
    try:
        yield
    except OSError as error:
        if Path(value).expanduser().exists():
            raise
        if hub_offline():
            why = "the Hub is not reachable to look it up (HF_HUB_OFFLINE is set)"
        else:
            why = f"the Hub did not provide it ({(str(error).strip().splitlines() or [type(error).__name__])[0]})"
        raise CommandLineError(f"`{flag}` = {value!r}: {value} is not a folder here, and {why}; pass a saved model "
                               "folder or a Hub id.") from None
