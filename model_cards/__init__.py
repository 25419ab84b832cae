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

from .bibtex import BIBTEX, papers_for_config
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


def _dtmt_methods(config: dict[str, Any]) -> list[str]:
    lines = []
    off = [name for name in ("encoder", "query", "decoder") if not config.get(f"{name}_transition", True)]
    if off and config.get("transition_depth", 4):
        lines.append(f"ablation (meng2019 Table 4): the {', '.join(off)} transition(s) reduced to a single unit")
    if not config.get("positional_encoding", True):
        lines.append("no positional encoding (meng2019 Table 6, Non-PE)")
    if config.get("share_encoder_decoder_embeddings"):
        lines.append("one embedding matrix for source and target (not in the paper)")
    if config.get("tie_word_embeddings"):
        lines.append("output projection tied to the target embedding (not in the paper)")
    return lines


def _methods(config: dict[str, Any]) -> list[str]:
    if config.get("model_type") == "dtmt":
        return _dtmt_methods(config)
    lines = []
    if config.get("layer_norm_position") == "pre":
        lines.append("pre-LN residual blocks with a final LayerNorm per stack")
    if config.get("residual_scaling") == "admin":
        how = ("profiled on training data (liu2020 / the authors' recursion)" if config.get("admin_init") == "profiling"
               else "set by the closed form sqrt((N+1)/ln(N+1) - 1)")
        lines.append(f"ADMIN residual scaling x_k = LN(ω_k ⊙ x_(k-1) + f_k(x_(k-1))) (liu2020 eq 2), ω {how}, "
                     f"{'trained' if config.get('admin_omega_trainable', True) else 'fixed'}; "
                     "`hf_deepnmt.fold_admin` turns it into a standard Transformer")
    depth, ratio = config.get("cross_attention_drop_depth", 0), config.get("cross_attention_drop_ratio", 0.0)
    if depth and ratio:
        inference = ("those layers have no cross-attention at all" if ratio >= 1.0
                     else "at inference every cross-attention is used")
        lines.append(f"cross-attention drop (li2022 §3.3): decoder layers 1-{depth} skip cross-attention with "
                     f"probability p_net = {ratio} in training, layers above always keep it (the paper's formula and prose "
                     f"disagree on what p means; this reading is the one its §4.3 results support); {inference}")
    if config.get("ddr_weight", 0):
        lines.append(f"DDR loss (li2022 §3.4), weight {config['ddr_weight']}: symmetric KL between two decoder passes "
                     "with independent dropout and drop-net draws; the paper gives no weight, this is our choice "
                     "(R-Drop used 5)")
    if config.get("ald_weight", 0):
        lines.append(f"ALD loss (li2022 eq. 6), weight {config['ald_weight']}, p_ALD = {config.get('ald_unk_ratio')}, "
                     f"τ = {config.get('ald_temperature')}: contrastive loss between the full source and <unk>-masked "
                     "copies (X⁺ keeps more of the source than X⁻)")
    if (depth and ratio) or config.get("ddr_weight", 0) or config.get("ald_weight", 0):
        lines.append("what cross-attention drop and CRT did in hf_deepnmt's own small-scale study (6-16 layers, d_model "
                     "128, a 29k-pair corpus, 3,000 steps): no decoder collapsed into a language model; where every "
                     "model learnt, CAD+CRT cost 1.45 BLEU (mean of 3 seeds) at equal steps and 3.7× the step time; "
                     "a deep post-LN decoder that stalled (BLEU 0) was repaired by ADMIN, not by CAD or CRT. li2022 "
                     "reports the collapse at WMT scale (4.5M pairs, 200k steps)")
    aggregation_names = {"dense": "dense connections (dou2018 eq. 4)",
                         "linear": "linear combination of all layers at every layer input and the output, "
                                   "d×d matrices (dou2018 eq. 5)",
                         "iterative": "iterative aggregation (dou2018 eq. 6-7)",
                         "hierarchical": "hierarchical aggregation over layer pairs, nodes fed back into the "
                                         "backbone (dou2018 §3.1.1)"}
    for stack in ("encoder", "decoder"):
        kind = config.get(f"{stack}_layer_aggregation", "none")
        if kind != "none":
            lines.append(f"{stack} layer aggregation: {aggregation_names[kind]}, AGG activation "
                         f"{config.get('aggregation_activation', 'sigmoid')}")
    k = config.get("multi_layer_attention_k", 1)
    if k > 1:
        lines.append(f"multi-layer attention, k = {k} (dou2018 eq. 8): in both stacks every layer l ≥ {k + 1} attends "
                     f"to the {k} layers below it with separate attentions merged by AGG")
    if config.get("diversity_weight", 0):
        lines.append(f"layer-diversity regularisation (dou2018 eq. 9-10), λ = {config['diversity_weight']}: the "
                     "training objective is NLL − λ·L_div (diversity between adjacent layers is maximised)")
    return lines


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

    problem = license_problem(license, "license")
    if problem:
        raise UserInputError(problem)
    license = normalise_license(license)
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model_type = config.get("model_type", "deep_transformer")
    papers = papers_for_config(config)
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
        bibtex="\n\n".join(BIBTEX[key] for key in papers),
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
