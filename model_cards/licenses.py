"""The license a model card may state: a Hub license id that the person who trains or uploads the model gives, or none.

A model's license is its owner's decision, bounded by the license of its training data (a model trained on data under
the GPL or CC BY-NC is not free to be Apache-2.0 because a tool said so), so nothing here has a default: without
``--license`` the card has no ``license:`` field and says in its text that the license is unknown.

The Hub accepts the ids of its license list (https://huggingface.co/docs/hub/repositories-licenses) in a card's
``license:`` field. `huggingface_hub` carries no copy of that list, so `HUB_LICENSES` is one, taken from the Hub's
documentation (huggingface/hub-docs, docs/hub/repositories-licenses.md, with its Llama 3.x entries); a license the
Hub adds later is refused here until it is added to this tuple. ``other`` is refused:
the Hub then wants ``license_name`` and ``license_link`` and a LICENSE file, which the command line does not take (edit
the card's front matter for that).

This module imports nothing heavy, so that `deepnmt push` can check ``--license`` before loading torch.
"""

from __future__ import annotations

HUB_LICENSES: tuple[str, ...] = (
    "apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m", "bigscience-bloom-rail-1.0",
    "bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd", "bsd-2-clause", "bsd-3-clause",
    "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0", "cc-by-2.5", "cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0",
    "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0", "cc-by-nd-4.0", "cc-by-nc-nd-3.0",
    "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0", "cc-by-nc-sa-4.0", "cdla-sharing-1.0",
    "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0", "epl-1.0", "epl-2.0", "etalab-2.0", "eupl-1.1",
    "agpl-3.0", "gfdl", "gpl", "gpl-2.0", "gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0", "isc", "lppl-1.3c", "ms-pl",
    "mpl-2.0", "odc-by", "odbl", "openrail++", "osl-3.0", "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib", "pddl",
    "lgpl-lr", "deepfloyd-if-license", "llama2", "llama3", "llama3.1", "llama3.2", "llama3.3", "gemma", "unknown",
)
LICENSES_PAGE = "https://huggingface.co/docs/hub/repositories-licenses"


def license_problem(value: str | None, name: str = "--license") -> str | None:
    """One sentence saying why ``value`` cannot be a card's license (naming the option ``name``), or None when it can:
    None (no license given) and the ids of `HUB_LICENSES` in any letter case."""
    if value is None:
        return None
    if value.strip().lower() == "other":
        return (f"`{name}` = {value!r} is not allowed: the Hub then needs a license name, a link and a LICENSE file, "
                "which the card cannot take from the command line; give a Hub license id, or leave the option out and "
                "add license: other, license_name and license_link to README.md yourself.")
    if normalise_license(value) not in HUB_LICENSES:
        return (f"`{name}` = {value!r} is not a Hub license id; use one of the ids listed at {LICENSES_PAGE} (e.g. "
                "apache-2.0, mit, cc-by-4.0, cc-by-sa-4.0, gpl-3.0), or leave it out: the card then says the license "
                "is unknown.")
    return None


def normalise_license(value: str | None) -> str | None:
    """The Hub spelling of a license id (lower case, no surrounding blanks); None stays None."""
    return None if value is None else value.strip().lower()
