"""Pushing a trained model folder to the Hugging Face Hub: model, tokenizer, code, pipeline and card.

`files_to_upload` decides exactly what goes up (weights, configs, tokenizer, the remote-code files with the Inference
Endpoints ``handler.py``, an ONNX export in ``onnx/`` that handler serves, the model card, metrics and plots — never
checkpoints, optimizer states or unfinished saves), `push_folder` creates the repository and uploads them in one
commit. The Hub client is a parameter, so tests can record what would be sent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import CommandLineError

REQUIRED = ("config.json", "model.safetensors", "tokenizer_config.json", "README.md")
# A tokenizer's own files, one of which every model folder needs: a fast tokenizer's tokenizer.json, or a converted
# public checkpoint's slow tokenizer (MarianTokenizer's source.spm, FairseqMosesBPETokenizer's vocab-src.json;
# docs/public-checkpoints.md)
TOKENIZER_FILES = ("tokenizer.json", "source.spm", "vocab-src.json")
EXCLUDED_PREFIXES = ("checkpoint-", ".", "_", "runs")
EXCLUDED_NAMES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json")
# The export `handler.py` serves: hf_deepnmt.handler's ONNX_SUBFOLDER and EXPORT_MANIFEST, repeated here so that this
# module does not load torch.
ONNX_SUBFOLDER = "onnx"
EXPORT_MANIFEST = "deepnmt_export.json"


def is_served_export(folder: str | Path, name: str) -> bool:
    """Whether the subfolder ``name`` of the model folder ``folder`` is the ONNX export its ``handler.py`` serves
    (``onnx/`` holding a ``deepnmt_export.json``, written by ``deepnmt export --format onnx RUN RUN/onnx``)."""
    return name == ONNX_SUBFOLDER and (Path(folder) / name / EXPORT_MANIFEST).is_file()


def subfolders_left_out(folder: str | Path, include_subfolders: bool = False) -> list[str]:
    """Names (sorted) of the subfolders of ``folder`` that `files_to_upload` leaves out and that are not always
    excluded (checkpoints, hidden folders): the other models it holds, none with ``include_subfolders``."""
    folder = Path(folder)
    if include_subfolders or not folder.is_dir():
        return []
    return sorted(path.name for path in folder.iterdir() if path.is_dir()
                  and not path.name.startswith(EXCLUDED_PREFIXES) and not is_served_export(folder, path.name))


def files_to_upload(folder: str | Path, include_subfolders: bool = False) -> list[str]:
    """Relative paths (sorted) of the files `push_folder` uploads; raise if a required file is missing. A model
    folder is flat: its subfolders (``averaged-lastN/`` of `deepnmt average-checkpoints`, an export, …) are other
    models and go up only with ``include_subfolders`` (checkpoints never), except ``onnx/`` when it holds an export:
    the folder's ``handler.py`` serves it on Inference Endpoints (`is_served_export`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CommandLineError(f"{folder} is not a model folder.")
    missing = [name for name in REQUIRED if not (folder / name).exists()]
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        missing.append(" or ".join(TOKENIZER_FILES) + " (the tokenizer)")
    if not any(folder.glob("modeling_*.py")):
        missing.append("modeling_*.py (the remote code; save with hf_deepnmt imported)")
    if missing:
        raise CommandLineError(f"{folder} cannot be pushed: missing {', '.join(missing)}.")
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(EXCLUDED_PREFIXES) for part in relative.parts):
            continue
        in_other_model = len(relative.parts) > 1 and not is_served_export(folder, relative.parts[0])
        if relative.name in EXCLUDED_NAMES or (in_other_model and not include_subfolders):
            continue
        files.append(relative.as_posix())
    return files


def card_license(folder: str | Path) -> str | None:
    """The license the folder's card states: ``deepnmt_card.json``'s (what `deepnmt train --license` gave), else the
    ``license`` field of a ``README.md`` the user wrote; None when there is none."""
    import json

    folder = Path(folder)
    stored = folder / "deepnmt_card.json"
    if stored.is_file():
        return json.loads(stored.read_text(encoding="utf-8")).get("license")
    if (folder / "README.md").is_file():
        from huggingface_hub.repocard import metadata_load

        return (metadata_load(folder / "README.md") or {}).get("license")
    return None


def stored_card(folder: str | Path, license: str | None = None) -> dict[str, Any] | None:
    """``deepnmt_card.json`` of ``folder`` (None for a card the user wrote), its license replaced by ``license``
    when one is given."""
    import json

    stored = Path(folder) / "deepnmt_card.json"
    if not stored.is_file():
        return None
    kwargs = json.loads(stored.read_text(encoding="utf-8"))
    if license is not None:
        kwargs["license"] = license
    return kwargs


def card_for_repo(folder: str | Path, repo_id: str, license: str | None = None) -> bytes:
    """The model card as uploaded to ``repo_id``: rendered again from ``deepnmt_card.json`` with the repository id
    in its usage snippet (the folder's own ``README.md`` names the folder) and ``license`` (`deepnmt push --license`)
    in place of the stored one, when given; a card the user wrote (no ``deepnmt_card.json``) is uploaded unchanged
    but for that license."""
    from hf_deepnmt_model_cards import EvalRow, render_model_card

    folder = Path(folder)
    kwargs = stored_card(folder, license)
    if kwargs is None:
        if license is None:
            return (folder / "README.md").read_bytes()
        from huggingface_hub import ModelCard

        card = ModelCard.load(folder / "README.md")
        card.data.license = license
        return str(card).encode("utf-8")
    kwargs["results"] = [EvalRow(**row) for row in kwargs.get("results", [])]
    kwargs["repo_id"] = repo_id
    return str(render_model_card(folder, **kwargs)).encode("utf-8")


class HubUnavailableError(ValueError):
    """The Hub could not take an upload (offline, unreachable, not logged in): one sentence, the files stay local."""


def explain_hub_error(error: Exception, repo_id: str, folder: str | Path) -> HubUnavailableError | None:
    """One sentence for the ways an upload fails that are not a bug — offline mode, no network, no or a refused
    login — naming the repository and where the model stays; None for anything else."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    kept = f"the model stays in {folder}"
    if isinstance(error, OfflineModeIsEnabled):
        return HubUnavailableError(f"cannot upload to {repo_id}: HF_HUB_OFFLINE is set ({kept}; unset it to push).")
    status = getattr(getattr(error, "response", None), "status_code", None)
    if isinstance(error, HfHubHTTPError) and status in (401, 403):
        return HubUnavailableError(f"the Hub refused the upload to {repo_id} (HTTP {status}): log in with `hf auth "
                                   f"login` or pass a write token ({kept}).")
    name = type(error).__name__
    if any(word in name for word in ("Connect", "Timeout", "Network", "Proxy")):
        return HubUnavailableError(f"cannot reach the Hub to upload to {repo_id} ({name}: {error}); check the "
                                   f"network ({kept}; `deepnmt push --dry_run` lists the files).")
    return None


def push_folder(
    folder: str | Path,
    repo_id: str,
    api: Any | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload hf_deepnmt model",
    include_subfolders: bool = False,
    license: str | None = None,
) -> list[str]:
    """Create ``repo_id`` (if needed) and upload `files_to_upload(folder)` in one commit, the model card rendered
    for ``repo_id`` (`card_for_repo`) with ``license`` (a Hub license id, `deepnmt push --license`) when given, and
    ``deepnmt_card.json`` stating the same license; return the file list."""
    import json

    from huggingface_hub import CommitOperationAdd, HfApi

    from hf_deepnmt_model_cards.licenses import license_problem, normalise_license

    if license_problem(license, "license"):
        raise CommandLineError(license_problem(license, "license"))
    license = normalise_license(license)
    folder = Path(folder)
    files = files_to_upload(folder, include_subfolders)
    api = api if api is not None else HfApi(token=token)
    rewritten = {"README.md": card_for_repo(folder, repo_id, license)}
    if license is not None and stored_card(folder) is not None:
        rewritten["deepnmt_card.json"] = (json.dumps(stored_card(folder, license), indent=2, ensure_ascii=False)
                                          + "\n").encode("utf-8")
    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in files
                  if name not in rewritten]
    operations += [CommitOperationAdd(path_in_repo=name, path_or_fileobj=content)
                   for name, content in rewritten.items()]
    try:
        api.create_repo(repo_id=repo_id, private=private, exist_ok=True, repo_type="model")
        api.create_commit(repo_id=repo_id, operations=operations, commit_message=commit_message, repo_type="model")
    except Exception as error:  # offline, no network, no login: one sentence (`explain_hub_error`); else re-raise
        explained = explain_hub_error(error, repo_id, folder)
        if explained is None:
            raise
        raise explained from None
    return files
