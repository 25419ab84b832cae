"""Pushing a trained model folder to the Hugging Face Hub: model, tokenizer, code, pipeline and card.

`files_to_upload` decides exactly what goes up (weights, configs, tokenizer, the remote-code files, the model card,
metrics and plots — never checkpoints, optimizer states or unfinished saves), `push_folder` creates the repository
and uploads them in one commit. The Hub client is a parameter, so tests can record what would be sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md")
EXCLUDED_PREFIXES = ("checkpoint-", ".", "_", "runs")
EXCLUDED_NAMES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")


def files_to_upload(folder: str | Path) -> list[str]:
    """Relative paths (sorted) of the files `push_folder` uploads; raise if a required file is missing."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a model folder.")
    missing = [name for name in REQUIRED if not (folder / name).exists()]
    if not any(folder.glob("modeling_*.py")):
        missing.append("modeling_*.py (the remote code; save with hf_deepnmt imported)")
    if missing:
        raise FileNotFoundError(f"{folder} cannot be pushed: missing {', '.join(missing)}.")
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(EXCLUDED_PREFIXES) for part in relative.parts):
            continue
        if relative.name in EXCLUDED_NAMES:
            continue
        files.append(relative.as_posix())
    return files


def push_folder(
    folder: str | Path,
    repo_id: str,
    api: Any | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload hf_deepnmt model",
) -> list[str]:
    """Create ``repo_id`` (if needed) and upload `files_to_upload(folder)` in one commit; return the file list."""
    from huggingface_hub import CommitOperationAdd, HfApi

    folder = Path(folder)
    files = files_to_upload(folder)
    api = api if api is not None else HfApi(token=token)
    api.create_repo(repo_id=repo_id, private=private, exist_ok=True, repo_type="model")
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in files]
    api.create_commit(repo_id=repo_id, operations=operations, commit_message=commit_message, repo_type="model")
    return files
