"""One description per paper: the single place that says what each paper adds to this package.

Each `Paper` names its config fields and the switches `deepnmt train --help` lists, the family whose config holds
them (and the sentence that refuses them on the other family's config), its docs page, its BibTeX and when a model
uses it, and what the rest of the package says about a model that uses it: its model-card lines, its loss terms in
the run report, and the switches an export format cannot express. Readers, each reading `PAPERS` instead of a list of
its own: the configs (`configuration_dtmt`, `configuration_deep_transformer`: fields of the other family are refused
by name), `deepnmt train --help` (`hf_deepnmt_training.train_arguments`), the exports
(`export_formats.mechanism_blockers`), the model cards (`hf_deepnmt_model_cards`: methods and BibTeX), the run report
(`hf_deepnmt_training.report.objective_description`), and the tests (tests/test_papers.py checks every entry against
the config classes, their rule tables and docs pages).

How each field is *validated* stays beside its config class (`configuration_deep_transformer.LI2022_RULES`, ...: one
rule table per paper, which needs the config's imports); tests/test_papers.py holds the two to the same field names.
Adding a mechanism: its module, its entry here, its rule table and ``__init__`` parameters, its docs page, its tests
(docs/architecture.md, "Adding a mechanism").

A config is read here as a mapping (``config.to_dict()`` or a ``config.json``): a field it lacks reads as its
default. This file is copied next to the weights with the configs (trust_remote_code), so it imports nothing but the
standard library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Config = Mapping[str, Any]

TRANSFORMER = "transformer"
DTMT = "dtmt"
STANDARD = ("ctranslate2", "marian")  # the export formats that hold a standard Transformer only


@dataclass(frozen=True)
class Blocker:
    """One thing a model has that an export format cannot express exactly."""

    setting: str
    """The config's words: ``"multi_layer_attention_k=2"``."""
    mechanism: str
    """The paper's: ``"dou2018 multi-layer attention"``."""
    reason: str
    """Why a standard Transformer cannot hold it (empty: the mechanism says it)."""
    formats: tuple[str, ...]
    """The formats it blocks."""
    where: str = ""
    """The stack it acts on, where it matters: ``"encoder"`` names "dou2018 encoder layer aggregation"."""

    def __str__(self) -> str:
        """The mechanism first, as `export_blockers` and the export's refusal name it."""
        paper, _, name = self.mechanism.partition(" ") if self.where else ("", "", self.mechanism)
        mechanism = " ".join(part for part in (paper, self.where, name) if part)
        return f"{mechanism} ({self.setting}: {self.reason})" if self.reason else f"{mechanism} ({self.setting})"

    def setting_first(self) -> str:
        """The setting first, as `hf_deepnmt.export_marian.export_marian` names it."""
        return f"{self.setting} ({self.mechanism})"


def _nothing(config: Config) -> list[Any]:
    return []


@dataclass(frozen=True)
class Paper:
    """What one paper adds to the package (module docstring)."""

    key: str
    """The citation key used everywhere: ``"li2022"``."""
    title: str
    bibtex: str
    family: str
    """The family whose config holds its fields: ``"transformer"`` or ``"dtmt"`` (`hf_deepnmt.registry`)."""
    model_type: str
    """The registered model type that carries the paper's defaults (a model of that type always cites it)."""
    docs: str
    """Its page, from the repository root."""
    fields: tuple[str, ...]
    """Every config field it adds (the family's config refuses none of them; the other family's refuses all)."""
    switches: tuple[str, ...]
    """The fields `deepnmt train --help` lists as the paper's switches, with their defaults."""
    foreign: str
    """Why its fields mean nothing on the other family's config (ends the refusal sentence)."""
    switched_on: Callable[[Config], bool]
    """Whether a config of its family uses the paper (cited in the card) without being of ``model_type``."""
    card_lines: Callable[[Config], list[str]] = _nothing
    """The model card's method lines for a config that uses it."""
    loss_terms: Callable[[Config], list[str]] = _nothing
    """Its terms of the training objective, as the run report names them."""
    export_blockers: Callable[[Config], list[Blocker]] = _nothing
    """Its switches that an export format cannot express (ONNX expresses all; ADMIN folds away)."""

    def used_by(self, config: Config) -> bool:
        """Whether a model with this config uses the paper's method (its card cites it)."""
        model_type = config.get("model_type")
        family = DTMT if model_type == DTMT else TRANSFORMER
        return model_type == self.model_type or (family == self.family and self.switched_on(config))


# ------------------------------------------------------------------------------------------------ vaswani2017
def _transformer_card(config: Config) -> list[str]:
    pre_ln = config.get("layer_norm_position") == "pre"
    return ["pre-LN residual blocks with a final LayerNorm per stack"] if pre_ln else []


VASWANI2017 = Paper(
    key="vaswani2017",
    title="Attention Is All You Need",
    bibtex="""@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {30},
  year      = {2017}
}""",
    family=TRANSFORMER,
    model_type="deep_transformer",
    docs="docs/transformer.md",
    fields=("encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
            "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "attention_dropout", "activation_dropout",
            "scale_embedding", "layer_norm_position", "init_std", "position_encoding", "position_offset", "output_bias",
            "share_encoder_decoder_embeddings", "decoder_vocab_size"),
    switches=(),
    foreign="it is a Transformer field; DTMT's depth is `transition_depth` and its width `d_model`",
    switched_on=lambda config: True,  # every model of the Transformer family is one
    card_lines=_transformer_card,
)


# ------------------------------------------------------------------------------------------------ liu2020
def _liu2020_card(config: Config) -> list[str]:
    if config.get("residual_scaling") != "admin":
        return []
    how = ("profiled on training data (liu2020 / the authors' recursion)" if config.get("admin_init") == "profiling"
           else "set by the closed form sqrt((N+1)/ln(N+1) - 1)")
    return [f"ADMIN residual scaling x_k = LN(ω_k ⊙ x_(k-1) + f_k(x_(k-1))) (liu2020 eq 2), ω {how}, "
            f"{'trained' if config.get('admin_omega_trainable', True) else 'fixed'}; "
            "`hf_deepnmt.fold_admin` turns it into a standard Transformer"]


LIU2020 = Paper(
    key="liu2020",
    title="Very Deep Transformers for Neural Machine Translation",
    bibtex="""@article{liu2020verydeep,
  title   = {Very Deep Transformers for Neural Machine Translation},
  author  = {Liu, Xiaodong and Duh, Kevin and Liu, Liyuan and Gao, Jianfeng},
  journal = {arXiv preprint arXiv:2008.07772},
  year    = {2020}
}""",
    family=TRANSFORMER,
    model_type="admin_transformer",
    docs="docs/liu2020.md",
    fields=("residual_scaling", "admin_init", "admin_omega_trainable", "admin_profiled"),
    # layer_norm_position is the Transformer's field; liu2020 is the paper that compares the two placements
    switches=("residual_scaling", "admin_init", "layer_norm_position"),
    foreign="liu2020's ADMIN rescales Transformer residual sub-layers, which DTMT does not have",
    switched_on=lambda config: config.get("residual_scaling", "none") == "admin",
    card_lines=_liu2020_card,
    # never an export blocker: ADMIN folds into a standard Transformer (hf_deepnmt.admin.fold_admin)
)


# ------------------------------------------------------------------------------------------------ li2022
def _li2022_uses(config: Config) -> bool:
    return bool(config.get("cross_attention_drop_depth", 0) or config.get("ddr_weight", 0)
                or config.get("ald_weight", 0))


def _li2022_card(config: Config) -> list[str]:
    lines = []
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
    return lines


def _li2022_losses(config: Config) -> list[str]:
    return ([f"{config['ddr_weight']} × DDR (li2022)"] if config.get("ddr_weight", 0.0) else []) + \
           ([f"{config['ald_weight']} × ALD (li2022)"] if config.get("ald_weight", 0.0) else [])


def _li2022_blockers(config: Config) -> list[Blocker]:
    depth = config.get("cross_attention_drop_depth", 0)
    if depth > 0 and config.get("cross_attention_drop_ratio", 0) >= 1:
        # CTranslate2 writes those layers with a zero cross-attention (hf_deepnmt.export_ctranslate2); Marian cannot.
        # CAD at p_net < 1 acts only in training, and DDR and ALD are losses: none of them blocks an export.
        return [Blocker(f"cross_attention_drop_ratio=1.0 on {depth} decoder layers", "li2022 cross-attention drop",
                        "those layers have no cross-attention; every Marian decoder layer has one", ("marian",))]
    return []


LI2022 = Paper(
    key="li2022",
    title="What Works and Doesn't Work, A Deep Decoder for Neural Machine Translation",
    bibtex="""@inproceedings{li2022deepdecoder,
  title     = {What Works and Doesn't Work, A Deep Decoder for Neural Machine Translation},
  author    = {Li, Zuchao and Wang, Yiran and Utiyama, Masao and Sumita, Eiichiro and Zhao, Hai and Watanabe, Taro},
  booktitle = {Findings of the Association for Computational Linguistics: ACL 2022},
  pages     = {459--471},
  year      = {2022}
}""",
    family=TRANSFORMER,
    model_type="deep_decoder_transformer",
    docs="docs/li2022.md",
    fields=("cross_attention_drop_depth", "cross_attention_drop_ratio", "ddr_weight", "ald_weight", "ald_unk_ratio",
            "ald_temperature", "ald_protected_token_ids"),
    switches=("cross_attention_drop_depth", "cross_attention_drop_ratio", "ddr_weight", "ald_weight",
              "ald_unk_ratio", "ald_temperature"),
    foreign="li2022's cross-attention drop (CAD) and collapse-reducing losses (DDR/ALD) are defined for the "
            "Transformer decoder",
    switched_on=_li2022_uses,
    card_lines=_li2022_card,
    loss_terms=_li2022_losses,
    export_blockers=_li2022_blockers,
)


# ------------------------------------------------------------------------------------------------ dou2018
AGGREGATION_NAMES = {
    "dense": "dense connections (dou2018 eq. 4)",
    "linear": "linear combination of all layers at every layer input and the output, d×d matrices (dou2018 eq. 5)",
    "iterative": "iterative aggregation (dou2018 eq. 6-7)",
    "hierarchical": "hierarchical aggregation over layer pairs, nodes fed back into the backbone (dou2018 §3.1.1)",
}


def _dou2018_uses(config: Config) -> bool:
    return (config.get("encoder_layer_aggregation", "none") != "none"
            or config.get("decoder_layer_aggregation", "none") != "none"
            or config.get("multi_layer_attention_k", 1) != 1 or bool(config.get("diversity_weight", 0)))


def _dou2018_card(config: Config) -> list[str]:
    lines = []
    for stack in ("encoder", "decoder"):
        kind = config.get(f"{stack}_layer_aggregation", "none")
        if kind != "none":
            lines.append(f"{stack} layer aggregation: {AGGREGATION_NAMES[kind]}, AGG activation "
                         f"{config.get('aggregation_activation', 'sigmoid')}")
    k = config.get("multi_layer_attention_k", 1)
    if k > 1:
        lines.append(f"multi-layer attention, k = {k} (dou2018 eq. 8): in both stacks every layer l ≥ {k + 1} attends "
                     f"to the {k} layers below it with separate attentions merged by AGG")
    if config.get("diversity_weight", 0):
        lines.append(f"layer-diversity regularisation (dou2018 eq. 9-10), λ = {config['diversity_weight']}: the "
                     "training objective is NLL − λ·L_div (diversity between adjacent layers is maximised)")
    return lines


def _dou2018_losses(config: Config) -> list[str]:
    weight = config.get("diversity_weight", 0.0)
    return [f"− {weight} × L_div (dou2018 layer diversity, maximised)"] if weight else []


def _dou2018_blockers(config: Config) -> list[Blocker]:
    blockers = []
    for stack in ("encoder", "decoder"):
        kind = config.get(f"{stack}_layer_aggregation", "none")
        if kind not in (None, "none"):
            blockers.append(Blocker(f"{stack}_layer_aggregation={kind!r}", "dou2018 layer aggregation",
                                    "the stack's output combines every layer's output", STANDARD, where=stack))
    k = config.get("multi_layer_attention_k", 1) or 1
    if k > 1:
        blockers.append(Blocker(f"multi_layer_attention_k={k}", "dou2018 multi-layer attention",
                                "self-attention attends to several layers' outputs", STANDARD))
    return blockers  # layer diversity is a loss: it blocks nothing


DOU2018 = Paper(
    key="dou2018",
    title="Exploiting Deep Representations for Neural Machine Translation",
    bibtex="""@inproceedings{dou2018exploiting,
  title     = {Exploiting Deep Representations for Neural Machine Translation},
  author    = {Dou, Zi-Yi and Tu, Zhaopeng and Wang, Xing and Shi, Shuming and Zhang, Tong},
  booktitle = {Proceedings of the 2018 Conference on Empirical Methods in Natural Language Processing},
  pages     = {4253--4262},
  year      = {2018}
}""",
    family=TRANSFORMER,
    model_type="deep_representation_transformer",
    docs="docs/dou2018.md",
    fields=("encoder_layer_aggregation", "decoder_layer_aggregation", "aggregation_activation",
            "multi_layer_attention_k", "diversity_weight"),
    switches=("encoder_layer_aggregation", "decoder_layer_aggregation", "aggregation_activation",
              "multi_layer_attention_k", "diversity_weight"),
    foreign="dou2018's layer aggregation and multi-layer attention combine Transformer layers",
    switched_on=_dou2018_uses,
    card_lines=_dou2018_card,
    loss_terms=_dou2018_losses,
    export_blockers=_dou2018_blockers,
)


# ------------------------------------------------------------------------------------------------ meng2019
def _meng2019_card(config: Config) -> list[str]:
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


MENG2019 = Paper(
    key="meng2019",
    title="DTMT: A Novel Deep Transition Architecture for Neural Machine Translation",
    bibtex="""@inproceedings{meng2019dtmt,
  title     = {{DTMT}: A Novel Deep Transition Architecture for Neural Machine Translation},
  author    = {Meng, Fandong and Zhang, Jinchao},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  volume    = {33},
  pages     = {224--231},
  year      = {2019}
}""",
    family=DTMT,
    model_type="dtmt",
    docs="docs/meng2019-dtmt.md",
    fields=("transition_depth", "attention_heads", "rnn_cell", "encoder_transition", "query_transition",
            "decoder_transition", "positional_encoding", "rnn_dropout", "readout_dropout", "init_range",
            "length_penalty_form", "share_encoder_decoder_embeddings"),
    switches=("rnn_cell", "transition_depth", "attention_heads", "encoder_transition", "query_transition",
              "decoder_transition"),
    foreign="it is a field of meng2019's DTMT (a deep-transition RNN, model_type 'dtmt'), which the Transformer does "
            "not have",
    switched_on=lambda config: True,  # every model of the DTMT family is one
    card_lines=_meng2019_card,
)


# In the order the model cards list methods and cite papers.
PAPERS: dict[str, Paper] = {paper.key: paper for paper in (VASWANI2017, LIU2020, LI2022, DOU2018, MENG2019)}


def papers_of(family: str) -> tuple[Paper, ...]:
    """The papers whose fields a config of ``family`` holds, in `PAPERS` order."""
    return tuple(paper for paper in PAPERS.values() if paper.family == family)


def foreign_fields(family: str) -> dict[str, str]:
    """Every field of the *other* families' papers, with the reason it means nothing on a ``family`` config."""
    return {field: paper.foreign for paper in PAPERS.values() if paper.family != family for field in paper.fields}


def papers_used(config: Config) -> list[Paper]:
    """The papers a model with ``config`` uses, in `PAPERS` order (what its card cites)."""
    return [paper for paper in PAPERS.values() if paper.used_by(config)]
