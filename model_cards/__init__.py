"""Model cards for hf_deepnmt models: one Jinja template per model type, rendered with `huggingface_hub`.

`render_model_card(folder, ...)` reads ``config.json`` (architecture, switched-on methods) and the evaluation
results, and returns a `huggingface_hub.ModelCard` whose YAML front matter carries language, tags, metrics and only
what is known to be true: the license the user gave (none by default, `hf_deepnmt_model_cards.licenses`), the training data's
Hub dataset id (none for local files), and a ``model-index`` with the test scores only when they were scored on a
Hub dataset, whose id is its ``dataset.type``. The text carries the results with their sacreBLEU signatures, the
training details with the run time the command printed, links to the run's plots, the license (or that it is
unknown) and the BibTeX of every paper whose method the model uses. `write_model_card` saves it as the folder's
``README.md``. docs/training.md ("The model card") gives the reasons.

Only the standard library is imported with the package (huggingface_hub and hf_deepnmt when a card is rendered), so
that `hf_deepnmt_model_cards.licenses` is light.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .licenses import license_problem, normalise_license

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

TEMPLATES = Path(__file__).parent / "templates"

ARCHITECTURE_FIELDS = (
    "model_type", "encoder_layers", "decoder_layers", "d_model", "encoder_attention_heads", "encoder_ffn_dim",
    "decoder_ffn_dim", "vocab_size", "layer_norm_position", "activation_function", "dropout", "attention_dropout",
    "activation_dropout", "tie_word_embeddings", "max_position_embeddings",
)
DTMT_FIELDS = (
    "model_type", "d_model", "transition_depth", "attention_heads", "rnn_cell", "encoder_transition",
    "query_transition", "decoder_transition", "positional_encoding", "dropout", "rnn_dropout", "readout_dropout",
    "init_range", "vocab_size", "share_encoder_decoder_embeddings", "tie_word_embeddings", "max_position_embeddings",
)


@dataclass
class EvalRow:
    """One evaluated split."""

    split: str
    sentences: int
    bleu: float
    chrf: float
    ter: float
    decoding: str
    signatures: dict[str, str] = field(default_factory=dict)


# The plots `hf_deepnmt_training.plots.plot_history` writes into a run folder, with what each shows; the card links those present.
PLOTS: dict[str, str] = {
    "loss_components.png": "training loss components and learning rate per optimizer step",
    "validation.png": "validation BLEU, chrF, TER, loss and source reliance at each evaluation",
}


# Names of data files, never Hub dataset ids (a run folder written before 2026-11-25 stored its test file's name as one).
DATA_FILE_SUFFIXES = (".json", ".jsonl", ".tsv", ".csv", ".txt", ".gz", ".parquet", ".arrow")


def hub_dataset_id(name: str | None) -> str | None:
    """``name`` when it can be a Hub dataset id (``name`` or ``owner/name``, the Hub's characters) and is neither a
    file or folder here nor a data file's name, else None: a card's ``datasets`` and model-index ``dataset.type`` hold
    Hub ids, never local paths. (Whether the id exists on the Hub is not checked offline: callers pass only names that
    came from the Hub.)"""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not name or Path(name).expanduser().exists() or name.lower().endswith(DATA_FILE_SUFFIXES):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def template_for(model_type: str) -> Path:
    """The card template of a model type: its registry entry's ``card_template`` (`hf_deepnmt.registry`; the
    Transformer types share one)."""
    from hf_deepnmt.registry import MODEL_TYPES

    entry = MODEL_TYPES.get(model_type)
    return TEMPLATES / f"{entry.card_template if entry else 'deep_transformer'}.md"


def _dtmt_summary(config: dict[str, Any]) -> str:
    """meng2019's name for the model: DTMT#k, or ShallowRNMT (GRU / L-GRU) at depth 0."""
    depth, cell = config.get("transition_depth", 4), config.get("rnn_cell", "lgru")
    name = f"DTMT#{depth}" if depth else "ShallowRNMT"
    unit = "L-GRU" if cell == "lgru" else "GRU"
    return (f"{name} deep transition RNN ({unit} + {depth} T-GRU{'s' if depth != 1 else ''} per transition block, "
            f"d_model {config.get('d_model', '?')}, {config.get('attention_heads', '?')}-head additive attention)")


def _methods(config: dict[str, Any]) -> list[str]:
    """The method lines of every paper the model uses, in `hf_deepnmt.papers.PAPERS` order (each paper's
    description writes its own)."""
    from hf_deepnmt.papers import papers_used

    lines = [line for paper in papers_used(config) for line in paper.card_lines(config)]
    source = config.get("converted_from")
    if isinstance(source, dict):  # docs/public-checkpoints.md
        lines.insert(0, f"initialised from the {source.get('format')} checkpoint `{source.get('source')}`, converted "
                        "exactly by `deepnmt convert` (docs/public-checkpoints.md of hf_deepnmt)")
    return lines


def base_model_of(config: dict[str, Any]) -> str | None:
    """The Hub id a converted model started from (the card's ``base_model``), when its source was one rather than a
    local folder."""
    source = (config.get("converted_from") or {}).get("source") if isinstance(config.get("converted_from"), dict) else None
    if not isinstance(source, str) or source.startswith(("/", ".", "~")) or source.count("/") != 1 or Path(source).exists():
        return None
    return source


def render_model_card(
    folder: str | Path,
    source_lang: str,
    target_lang: str,
    results: list[EvalRow] | None = None,
    training: dict[str, Any] | None = None,
    dataset_name: str = "custom",
    dataset_id: str | None = None,
    dataset_description: str = "",
    eval_dataset_name: str | None = None,
    eval_dataset_id: str | None = None,
    license: str | None = None,
    repo_id: str | None = None,
    model_name: str | None = None,
    example_source: str = "Hello, world!",
    limitations: str = "",
    plots: Sequence[str] = tuple(PLOTS),
    data_license: str = "",
) -> ModelCard:
    """Render the card of a saved model folder (see the module docstring).

    Args:
        dataset_name / dataset_description: the training data, as the card's text names it.
        dataset_id: the training data's Hub dataset id, or None (local files): the ``datasets`` field.
        eval_dataset_name / eval_dataset_id: what the ``results`` were scored on (default: the training data); only
            with a Hub dataset id do they go into a ``model-index`` (its ``dataset.type`` must be one, and
            huggingface_hub cannot read a model-index without it); otherwise they are in the text only.
        license: a Hub license id given by the user (`hf_deepnmt_model_cards.licenses`), or None: no ``license`` field, and the
            text says the license is unknown.
        repo_id: written into the usage snippet (`hf_deepnmt_training.hub.push_folder` renders the card again with it).
        plots: file names of plots in ``folder`` to link from the card (relative links; those absent are skipped).
        data_license: a sentence on the training data's license, for the card's license section.
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    from hf_deepnmt.errors import UserInputError
    from hf_deepnmt.papers import papers_used

    problem = license_problem(license, "license")
    if problem:
        raise UserInputError(problem)
    license = normalise_license(license)
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model_type = config.get("model_type", "deep_transformer")
    used = papers_used(config)  # hf_deepnmt.papers: what the card cites, tags and describes
    papers = [paper.key for paper in used]
    results = results or []
    generation = {}
    if (folder / "generation_config.json").exists():
        generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    trained_on = hub_dataset_id(dataset_id)
    scored_id = hub_dataset_id(eval_dataset_id if eval_dataset_name or eval_dataset_id else dataset_id)
    eval_results = []
    for row in results if scored_id else []:
        for metric, value, name in (("bleu", row.bleu, "BLEU"), ("chrf", row.chrf, "chrF"), ("ter", row.ter, "TER")):
            eval_results.append(
                EvalResult(
                    task_type="translation",
                    task_name=f"Translation {source_lang}-{target_lang}",
                    dataset_type=scored_id,
                    dataset_name=eval_dataset_name or dataset_name,
                    dataset_split=row.split,
                    metric_type=metric,
                    metric_name=name,
                    metric_value=value,
                    metric_config=row.signatures.get(metric),
                )
            )
    name = model_name or repo_id or folder.name
    card_data = ModelCardData(
        language=[source_lang, target_lang],
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "hf_deepnmt", model_type, "custom_code", *papers],
        base_model=base_model_of(config),
        datasets=[trained_on] if trained_on else None,
        metrics=["bleu", "chrf", "ter"],
        model_name=name if eval_results else None,  # the model-index's name; no index, no name
        eval_results=eval_results or None,
    )
    fields = DTMT_FIELDS if model_type == "dtmt" else ARCHITECTURE_FIELDS
    architecture = {key: config[key] for key in fields if key in config}
    summary = _dtmt_summary(config) if model_type == "dtmt" else (
        f"{config.get('encoder_layers', '?')}-layer encoder / {config.get('decoder_layers', '?')}-layer decoder "
        f"{config.get('layer_norm_position', 'post')}-LN Transformer (d_model {config.get('d_model', '?')})"
    )
    signatures: dict[str, str] = {}
    for row in results:
        signatures.update(row.signatures)
    return ModelCard.from_template(
        card_data,
        template_path=str(template_for(model_type)),
        model_name=name,
        repo_id=repo_id or "path/to/this/folder",
        architecture_summary=summary,
        source_lang=source_lang,
        target_lang=target_lang,
        example_source=example_source,
        num_beams=generation.get("num_beams", 4),
        results=[row.__dict__ for row in results],
        eval_dataset=eval_dataset_name or dataset_name,
        signatures=signatures,
        architecture=architecture,
        methods=_methods(config),
        training=training or {},
        dataset_description=dataset_description or dataset_name,
        limitations=limitations or "Trained on a single domain; expect degraded output on other text.",
        plots=[{"file": name, "title": PLOTS.get(name, name)} for name in plots if (folder / name).is_file()],
        license=license,
        data_license=data_license or "The license of the training data is not recorded here; it may restrict how "
                                     "this model can be used.",
        bibtex="\n\n".join(paper.bibtex for paper in used),
    )


def write_model_card(folder: str | Path, trainer: Any | None = None, **kwargs: Any) -> Path:
    """Render and save ``README.md`` in ``folder``. With a ``trainer`` only (its ``create_model_card`` hook), the
    languages and results come from ``<folder>/deepnmt_card.json`` written by ``deepnmt train``."""
    from hf_deepnmt.errors import UserInputError

    folder = Path(folder)
    if trainer is not None and not kwargs:
        stored = folder / "deepnmt_card.json"
        if not stored.exists():
            raise UserInputError(f"{stored} is missing; it is written by `deepnmt train` before the card.")
        kwargs = json.loads(stored.read_text(encoding="utf-8"))
        kwargs["results"] = [EvalRow(**row) for row in kwargs.get("results", [])]
    card = render_model_card(folder, **kwargs)
    path = folder / "README.md"
    card.save(str(path))
    return path
