"""Checkpoints of a training run: finding the newest complete one, telling why a damaged one cannot be resumed from,
choosing what to resume, durable writes (fsync), and averaging the last N (liu2020 and fairseq evaluate the average
of the last 10).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import CONFIG_MAPPING, AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainingArguments
from transformers.trainer_utils import get_last_checkpoint, sort_checkpoints

import hf_deepnmt  # noqa: F401  (registers the model types)
from hf_deepnmt.errors import UserInputError
from hf_deepnmt.registry import model_type_names

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
INCOMPLETE_DIR = ".incomplete"  # a checkpoint is written under OUTPUT_DIR/.incomplete/ and moved into place when whole
TRAINER_STATE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME


def resume_target(training_args: Seq2SeqTrainingArguments) -> str | None:
    requested = training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    existing = last_checkpoint(output_dir)
    if requested in (None, "", "False", "false"):
        if existing is not None or (Path(output_dir) / "model.safetensors").exists():
            found = Path(existing).name if existing else "a trained model"
            raise UserInputError(
                f"--output_dir {output_dir} already holds {found}; continue it with --resume_from_checkpoint last, "
                "or train into a new --output_dir (nothing a run trained is overwritten)."
            )
        return None
    if requested in ("last", "True", "true"):
        if existing is None:
            raise UserInputError(f"--resume_from_checkpoint last: {output_dir} holds no complete checkpoint-N yet.")
        target = existing
    elif not Path(requested).is_dir():
        raise UserInputError(f"--resume_from_checkpoint {requested!r} is not a checkpoint folder.")
    else:
        target = requested
    problem = checkpoint_problem(target)
    if problem:  # damaged after it was written (the saves themselves are atomic): name it, offer the newest good one
        good = next((c for c in checkpoints_newest_first(output_dir) if Path(c) != Path(target)
                     and not checkpoint_problem(c)), None)
        offer = (f"the newest complete checkpoint is {good}: move {Path(target).name} away and resume with "
                 f"--resume_from_checkpoint {good}" if good else f"{output_dir} holds no other complete checkpoint")
        raise UserInputError(f"--resume_from_checkpoint {requested}: {target} cannot be resumed from ({problem}); "
                         f"{offer}.")
    return target


def average_checkpoints(run_dir: str | os.PathLike, last: int = 10, output_dir: str | os.PathLike | None = None) -> Path:
    """Average the weights of the last ``last`` complete checkpoints of a run (liu2020 and fairseq evaluate the
    average of the last 10) into a complete model folder: weights, config, generation config, tokenizer, code."""
    from safetensors.torch import load_file

    run_dir = Path(run_dir)
    checkpoints = sort_checkpoints(str(run_dir)) if run_dir.is_dir() else []  # oldest first
    if last < 1:
        raise UserInputError(f"`--last` = {last!r} is not allowed; average at least 1 checkpoint.")
    if len(checkpoints) < last:
        raise UserInputError(f"{run_dir} holds {len(checkpoints)} checkpoint(s), fewer than --last {last}; keep more "
                             "with --save_total_limit or average fewer.")
    folders = [Path(folder) for folder in checkpoints[-last:]]
    total: dict[str, torch.Tensor] = {}
    for folder in folders:
        for name, tensor in load_file(str(folder / "model.safetensors")).items():
            total[name] = total[name] + tensor.double() if name in total else tensor.double()
    model = AutoModelForSeq2SeqLM.from_pretrained(folders[-1])
    reference = model.state_dict()
    averaged = {name: (tensor / len(folders)).to(reference[name].dtype) for name, tensor in total.items()}
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"average_checkpoints: checkpoints do not match the model (missing {missing}).")
    model.tie_weights()
    output_dir = Path(output_dir) if output_dir is not None else run_dir / f"averaged-last{last}"
    model.save_pretrained(output_dir)
    tokenizer_source = folders[-1] if (folders[-1] / "tokenizer_config.json").exists() else run_dir
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(output_dir)
    (output_dir / "averaged_from.json").write_text(json.dumps([f.name for f in folders], indent=2) + "\n")
    return output_dir


def last_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest ``checkpoint-N`` of ``output_dir`` (transformers' `get_last_checkpoint`; a checkpoint being written
    lives under ``.incomplete/`` until it is complete, so every ``checkpoint-N`` is whole), or None."""
    return get_last_checkpoint(str(output_dir)) if os.path.isdir(output_dir) else None


def checkpoints_newest_first(output_dir: str | os.PathLike) -> list[str]:
    """Every ``checkpoint-N`` folder of ``output_dir``, the highest step first (transformers' `sort_checkpoints`)."""
    return sort_checkpoints(str(output_dir))[::-1] if os.path.isdir(output_dir) else []


def weights_problem(folder: str | os.PathLike) -> str | None:
    """Why the weights of a model folder or checkpoint cannot be read, in a few words (none, or a truncated or
    corrupted ``model.safetensors``), or None. The one integrity check of saved weights."""
    folder = Path(folder)
    present = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not present:
        return f"{folder} holds no model weights ({', '.join(WEIGHT_FILES)})"
    if present[0].name == "model.safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(present[0]), framework="pt") as handle:
                handle.keys()
        except Exception:  # the Rust reader raises its own error types
            return f"{present[0]} is truncated or corrupted"
    return None


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot be resumed from, in a few words (a missing or unreadable ``trainer_state.json``, or
    `weights_problem`), or None for a complete checkpoint."""
    state = Path(folder) / "trainer_state.json"
    try:
        json.loads(state.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"{state} is missing or unreadable"
    return weights_problem(folder)


def saved_model_problem(folder: str | os.PathLike) -> str | None:
    """Why a saved model folder cannot load, in a few words (an unreadable ``config.json``, a ``model_type`` nobody
    registered, or `weights_problem`), or None."""
    config_file = Path(folder) / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{config_file} is not a readable JSON config ({error})"
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type not in CONFIG_MAPPING:
        return (f"{config_file} names model_type {model_type!r}, which neither transformers nor hf_deepnmt knows "
                f"(hf_deepnmt's: {', '.join(model_type_names())})")
    problem = weights_problem(folder)
    if problem and "holds no model weights" in problem:
        return (f"{folder} holds a config but no weights ({', '.join(WEIGHT_FILES)}); a run killed before its final "
                "save keeps its weights in checkpoint-N/ folders")
    return problem and f"{problem}; use an earlier checkpoint-N/ or re-download it"


def write_trainer_state(state: Any, folder: str | os.PathLike) -> None:
    """Replace ``folder``'s ``trainer_state.json`` with ``state`` (a transformers `TrainerState`) atomically: written
    beside it, flushed to disk, renamed, so that a checkpoint never holds a torn state."""
    path = Path(folder) / TRAINER_STATE
    temporary = path.with_name(f".{TRAINER_STATE}.tmp-{os.getpid()}")
    state.save_to_json(str(temporary))
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    fsync_dir(str(folder))


# Options `deepnmt train` chose from the run's measured length (the DTMT rows' warm-up), in each checkpoint: a
# resumed run measures again and could land on another value, so it takes the checkpoint's.
RUN_CHOICES = "deepnmt_run_choices.json"


def write_run_choices(folder: str | os.PathLike, choices: dict[str, Any]) -> None:
    """Write ``choices`` (option name -> value) into the checkpoint ``folder`` being staged; nothing when empty."""
    if choices:
        (Path(folder) / RUN_CHOICES).write_text(json.dumps(choices, indent=2, sort_keys=True) + "\n")


def read_run_choices(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """The length-based choices ``checkpoint`` was trained with (`write_run_choices`); empty for a checkpoint written
    without any (the rules chose nothing, or an older hf_deepnmt)."""
    path = Path(checkpoint) / RUN_CHOICES
    if not path.is_file():
        return {}
    try:
        choices = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UserInputError(f"{path}: cannot be read as JSON ({error}); it holds the options the run chose from its "
                             "length, so delete the checkpoint or the file to resume with fresh choices.") from None
    if not isinstance(choices, dict):
        raise UserInputError(f"{path}: holds {type(choices).__name__}, not an object of option values; delete it "
                             "to resume with fresh choices.")
    return choices


def final_path(checkpoint: str) -> str | None:
    """The path a checkpoint recorded under ``OUTPUT_DIR/.incomplete/`` (where it was written) has once moved into
    place, ``OUTPUT_DIR/checkpoint-N``, when that folder exists; None for any other path."""
    staged = Path(checkpoint)
    if staged.parent.name != INCOMPLETE_DIR:
        return None
    final = staged.parent.parent / staged.name
    return str(final) if final.is_dir() else None


def record_final_best_checkpoint(checkpoint: str | os.PathLike) -> str | None:
    """Make the ``best_model_checkpoint`` that ``checkpoint``'s ``trainer_state.json`` records the folder's final
    path when it names the ``.incomplete/`` path the best checkpoint was written under (runs before 2026-11-28
    recorded that one, which transformers then drops on resume as a path that "does not exist anymore"); returns the
    path now recorded, or None when nothing was changed."""
    from transformers import TrainerState

    path = Path(checkpoint) / TRAINER_STATE
    if not path.is_file():
        return None
    state = TrainerState.load_from_json(str(path))
    final = final_path(state.best_model_checkpoint) if isinstance(state.best_model_checkpoint, str) else None
    if final is None:
        return None
    state.best_model_checkpoint = final
    write_trainer_state(state, checkpoint)
    return final


def fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for file_name in files:
            with open(os.path.join(root, file_name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(root)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
