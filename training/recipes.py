"""Recipes (``training/recipes/*.yaml``) and model presets (``training/presets/*.json``).

A recipe is one complete, citable training setup. Its header comment names the paper table it reproduces and the
exact command; its body has three sections::

    model:      # complete model config (every field spelled out) — or `preset: <name>`
      model_type: deep_transformer
      d_model: 512
      ...
    data:       # DataArguments (run_translation names), e.g. train_file, source_lang, max_tokens
      ...
    training:   # Seq2SeqTrainingArguments + ModelArguments, e.g. learning_rate, max_steps, vocab_size
      ...

File paths that start with ``corpus:`` point into the embedded corpus shipped with the package
(``corpus:web-sparv/train.jsonl.gz``). Command-line arguments override the recipe.

Presets are complete `config.json`-style files that users can cite by name (fairseq's named architectures):
``--config_name transformer-base``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hf_deepnmt.errors import UserInputError

from .corpus import corpus_dir

RECIPES_DIR = Path(__file__).parent / "recipes"
PRESETS_DIR = Path(__file__).parent / "presets"
CORPUS_PREFIX = "corpus:"
SECTIONS = ("model", "data", "training")


def resolve_path(value: Any) -> Any:
    """``corpus:<path>`` -> the absolute path inside the embedded corpus folder; anything else unchanged."""
    if isinstance(value, str) and value.startswith(CORPUS_PREFIX):
        return str(corpus_dir().parent / value[len(CORPUS_PREFIX):])
    return value


def _closest(name: str, names: list[str]) -> str:
    """" (did you mean a or b?)" for the names closest to a misspelt ``name``, else ""."""
    import difflib

    close = difflib.get_close_matches(Path(name).stem, sorted(names), n=3, cutoff=0.5)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def find_recipe(name_or_path: str) -> Path:
    """A recipe file path, or the name of one shipped in ``training/recipes`` (with or without ``.yaml``)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = RECIPES_DIR / (name_or_path if name_or_path.endswith(".yaml") else f"{name_or_path}.yaml")
    if shipped.exists():
        return shipped
    raise UserInputError(f"--recipe {name_or_path!r} is neither a file nor a shipped recipe"
                         + _closest(name_or_path, [p.stem for p in RECIPES_DIR.glob("*.yaml")])
                         + "; `deepnmt train --help` lists every recipe.")


def load_recipe(name_or_path: str) -> dict[str, dict[str, Any]]:
    """Read a recipe; every section is optional, unknown sections are an error."""
    path = find_recipe(name_or_path)
    recipe = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(recipe, dict):
        raise UserInputError(f"{path}: a recipe is a mapping with sections {list(SECTIONS)}.")
    unknown = set(recipe) - set(SECTIONS)
    if unknown:
        raise UserInputError(f"{path}: unknown section(s) {sorted(unknown)}; allowed: {list(SECTIONS)}.")
    return {section: dict(recipe.get(section) or {}) for section in SECTIONS}


def recipe_to_argv(recipe: dict[str, dict[str, Any]]) -> list[str]:
    """The ``data`` and ``training`` sections as command-line arguments (so the command line can override them)."""
    argv: list[str] = []
    for section in ("data", "training"):
        for key, value in recipe[section].items():
            if value is None:
                continue
            if isinstance(value, bool):
                argv += [f"--{key}", str(value)]
            elif isinstance(value, (list, tuple)):
                argv += [f"--{key}", *map(str, value)]
            elif isinstance(value, dict):
                argv += [f"--{key}", json.dumps(value)]
            else:
                argv += [f"--{key}", str(resolve_path(value))]
    return argv


def find_preset(name: str) -> Path | None:
    path = PRESETS_DIR / f"{name}.json"
    return path if path.exists() else None


def load_model_config_dict(config_name: str | None, recipe_model: dict[str, Any]) -> dict[str, Any]:
    """The model config fields: a preset / config file named by ``--config_name`` (or ``preset:`` in the recipe),
    then the recipe's own fields on top."""
    fields = dict(recipe_model)
    name = config_name or fields.pop("preset", None)
    fields.pop("preset", None)
    base: dict[str, Any] = {}
    if name:
        preset = find_preset(name)
        path = preset or Path(name)
        if path.is_dir():
            path = path / "config.json"
        if not path.exists():
            raise UserInputError(f"--config_name {name!r} is neither a config file/folder nor a preset"
                                 + _closest(name, [p.stem for p in PRESETS_DIR.glob("*.json")])
                                 + "; `deepnmt train --help` lists every preset.")
        base = json.loads(path.read_text(encoding="utf-8"))
    return {**base, **fields}


def parse_overrides(text: str | None) -> dict[str, Any]:
    """``"d_model=256,encoder_layers=12,dropout=0.2"`` -> typed dict (run_clm's --config_overrides syntax)."""
    overrides: dict[str, Any] = {}
    if not text:
        return overrides
    for item in text.split(","):
        if "=" not in item:
            raise UserInputError(f"--config_overrides item {item!r} is not KEY=VALUE.")
        key, raw = (part.strip() for part in item.split("=", 1))
        overrides[key] = yaml.safe_load(raw)
    return overrides


def model_fields(config_name: str | None, config_overrides: str | None, model_type: str | None,
                 recipe_model: dict) -> tuple[str, dict]:
    """The model type and config fields of a model trained from scratch: the preset (``--config_name``) or the
    recipe's model section, then ``--config_overrides``, ``--model_type`` on top; an override key the model type's
    config does not have is one sentence (`check_override_keys`)."""
    fields = load_model_config_dict(config_name, recipe_model)
    overrides = parse_overrides(config_overrides)
    fields.update(overrides)
    model_type = model_type or fields.pop("model_type", "deep_transformer")
    fields.pop("model_type", None)
    check_override_keys(model_type, overrides)
    return model_type, fields


def config_fields(model_type: str) -> set[str]:
    """The field names a registered model type's config accepts (its ``__init__`` parameters and what it stores)."""
    import inspect

    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    return (set(inspect.signature(config_class.__init__).parameters) | set(config_class().to_dict())) - {"self",
                                                                                                          "kwargs"}


def check_override_keys(model_type: str, overrides: dict[str, Any]) -> None:
    """A ``--config_overrides`` key that the model type's config does not have is a typo (transformers would store it
    beside the real field and nothing would read it): one sentence with the close matches."""
    import difflib

    from transformers import CONFIG_MAPPING

    from hf_deepnmt.registry import model_type_entry

    model_type_entry(model_type, "`model_type`")  # one sentence with the closest types for an unknown one
    config_class = CONFIG_MAPPING[model_type]
    known = config_fields(model_type)
    for key, value in overrides.items():
        if key not in known:
            config_class(**{key: value})  # a config that refuses the field by name says why (e.g. DTMT's refusals)
            close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else "see `deepnmt train --help` and the presets"
            raise UserInputError(f"--config_overrides: `{key}` is not a field of {config_class.__name__} "
                             f"({model_type}); {hint}")
