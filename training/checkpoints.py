"""Checkpoints of a training run: finding the newest complete one, telling why a damaged one cannot be resumed from,
choosing what to resume, durable writes (fsync), and averaging the last N (liu2020 and fairseq evaluate the average
of the last 10).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainingArguments

import hf_deepnmt  # noqa: F401  (registers the model types)

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR


def resume_target(training_args: Seq2SeqTrainingArguments) -> str | None:
    requested = training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    existing = last_checkpoint(output_dir)
    if requested in (None, "", "False", "false"):
        if existing is not None or (Path(output_dir) / "model.safetensors").exists():
            found = Path(existing).name if existing else "a trained model"
            raise ValueError(
                f"--output_dir {output_dir} already holds {found}; continue it with --resume_from_checkpoint last, "
                "or train into a new --output_dir (nothing a run trained is overwritten)."
            )
        return None
    if requested in ("last", "True", "true"):
        if existing is None:
            raise ValueError(f"--resume_from_checkpoint last: {output_dir} holds no complete checkpoint-N yet.")
        target = existing
    elif not Path(requested).is_dir():
        raise ValueError(f"--resume_from_checkpoint {requested!r} is not a checkpoint folder.")
    else:
        target = requested
    problem = checkpoint_problem(target)
    if problem:  # damaged after it was written (the saves themselves are atomic): name it, offer the newest good one
        good = next((c for c in checkpoints_newest_first(output_dir) if Path(c) != Path(target)
                     and not checkpoint_problem(c)), None)
        offer = (f"the newest complete checkpoint is {good}: move {Path(target).name} away and resume with "
                 f"--resume_from_checkpoint {good}" if good else f"{output_dir} holds no other complete checkpoint")
        raise ValueError(f"--resume_from_checkpoint {requested}: {target} cannot be resumed from ({problem}); "
                         f"{offer}.")
    return target


def average_checkpoints(run_dir: str | os.PathLike, last: int = 10, output_dir: str | os.PathLike | None = None) -> Path:
    """Average the weights of the last ``last`` complete checkpoints of a run (liu2020 and fairseq evaluate the
    average of the last 10) into a complete model folder: weights, config, generation config, tokenizer, code."""
    from safetensors.torch import load_file

    run_dir = Path(run_dir)
    steps = sorted(int(p.name.split("-")[-1]) for p in run_dir.glob("checkpoint-*") if p.name.split("-")[-1].isdigit())
    if last < 1:
        raise ValueError(f"`--last` = {last!r} is not allowed; average at least 1 checkpoint.")
    if len(steps) < last:
        raise ValueError(f"{run_dir} holds {len(steps)} checkpoint(s), fewer than --last {last}; keep more with "
                         "--save_total_limit or average fewer.")
    folders = [run_dir / f"checkpoint-{step}" for step in steps[-last:]]
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
    tokenizer_source = folders[-1] if (folders[-1] / "tokenizer.json").exists() else run_dir
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(output_dir)
    (output_dir / "averaged_from.json").write_text(json.dumps([f.name for f in folders], indent=2) + "\n")
    return output_dir


def last_checkpoint(output_dir: str) -> str | None:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (``.incomplete/`` is never considered)."""
    if not os.path.isdir(output_dir):
        return None
    steps = [
        int(name.split("-")[-1])
        for name in os.listdir(output_dir)
        if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-") and name.split("-")[-1].isdigit()
    ]
    return os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{max(steps)}") if steps else None


def checkpoint_problem(folder: str | os.PathLike) -> str | None:
    """Why ``folder`` cannot be resumed from, in a few words (a missing or unreadable ``trainer_state.json``, no
    weights, a truncated or corrupted ``model.safetensors``), or None for a complete checkpoint."""
    folder = str(folder)
    state = os.path.join(folder, "trainer_state.json")
    try:
        with open(state, encoding="utf-8") as handle:
            json.load(handle)
    except (OSError, ValueError):
        return f"{state} is missing or unreadable"
    weights = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(weights):
        if any(os.path.isfile(os.path.join(folder, name)) for name in ("model.safetensors.index.json",
                                                                        "pytorch_model.bin")):
            return None
        return f"{folder} holds no model weights"
    from safetensors import safe_open

    try:
        with safe_open(weights, framework="pt") as handle:
            handle.keys()
    except Exception:  # the Rust reader raises its own error types
        return f"{weights} is truncated or corrupted"
    return None


def checkpoints_newest_first(output_dir: str) -> list[str]:
    """Every ``checkpoint-N`` folder of ``output_dir``, the highest step first."""
    if not os.path.isdir(output_dir):
        return []
    steps = sorted((int(name.split("-")[-1]) for name in os.listdir(output_dir)
                    if name.startswith(f"{PREFIX_CHECKPOINT_DIR}-") and name.split("-")[-1].isdigit()), reverse=True)
    return [os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}") for step in steps]


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
