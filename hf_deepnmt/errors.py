"""The one error type of hf_deepnmt for a user's mistake.

`UserInputError` is raised for anything a user gave that cannot work — a config field, a model input, a data file, a
command-line value — with one sentence that names the field, the value and what is allowed. It subclasses
`ValueError`, so code that catches `ValueError` keeps working. The ``deepnmt`` command line prints these (and their
subclasses in ``training``) as one line with exit status 2; every other exception is a bug and shows its traceback.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports nothing.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """A user's mistake, stated in one sentence naming the field, the value and what is allowed."""
