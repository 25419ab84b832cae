"""Configuration of the one Transformer implementation of hf_deepnmt.

`DeepTransformerConfig` (``model_type="deep_transformer"``) describes the Vaswani et al. encoder-decoder of
docs/transformer.md with Marian/BART field names. The deep-NMT methods of the other papers are switches of this same
configuration (docs/li2022.md, docs/liu2020.md, docs/dou2018.md); their paper-named configs are thin subclasses that only change ``model_type``
and defaults.

Every field is validated once when the config is built, by a field → rule table per paper (`TRANSFORMER_RULES`,
`LIU2020_RULES`, `LI2022_RULES`, `DOU2018_RULES`; the rules themselves are `configuration_common`'s, shared with
DTMT), and again when a model is built from it, so a config mutated after construction cannot slip through: a bad
value raises one ``ValueError`` sentence that names the field, the value and what is allowed.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code), so it may import only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from transformers import PreTrainedConfig
from transformers.utils import logging

from .aggregation import AGGREGATION_ACTIVATIONS, LAYER_AGGREGATIONS
from .configuration_common import (
    ENCODER_DECODER_RULES,
    FLAG,
    NON_NEGATIVE_WEIGHT,
    OPTIONAL_TOKEN_ID,
    POSITIVE_INT,
    PROBABILITY,
    SPECIAL_TOKEN_RULES,
    TOKEN_ID,
    FieldRules,
    Rule,
    ValidatedConfigMixin,
    divides_d_model,
    is_int,
    is_number,
    number_in,
    one_of,
)
from .errors import UserInputError
from .papers import TRANSFORMER

logger = logging.get_logger(__name__)

# Activation names accepted by `activation_function` (a subset of transformers.activations.ACT2FN that makes sense
# for a position-wise FFN). Kept explicit so that a typo fails at config time, not at the first forward.
ALLOWED_ACTIVATIONS: tuple[str, ...] = (
    "relu",
    "gelu",
    "gelu_new",
    "gelu_fast",
    "gelu_pytorch_tanh",
    "quick_gelu",
    "silu",
    "swish",
    "mish",
    "tanh",
    "sigmoid",
    "relu2",
)
ALLOWED_LAYER_NORM_POSITIONS: tuple[str, ...] = ("post", "pre")
# How positions enter the embeddings (docs/transformer.md, "Positions"; docs/public-checkpoints.md): Vaswani et al.'s
# sinusoids with frequencies 10000^(−2i/d) (Marian, OPUS-MT), tensor2tensor's / fairseq's with 10000^(−i/(d/2−1)), or
# a learned table (fairseq's --encoder-learned-pos).
ALLOWED_POSITION_ENCODINGS: tuple[str, ...] = ("sinusoidal", "sinusoidal_fairseq", "learned")
ALLOWED_RESIDUAL_SCALINGS: tuple[str, ...] = ("none", "admin")
ALLOWED_ADMIN_INITS: tuple[str, ...] = ("profiling", "closed_form")


def admin_omega_closed_form(num_sublayers: int) -> float:
    """ω = sqrt((N+1)/ln(N+1) − 1) for a stack of N residual sub-layers, ADMIN without profiling (docs/liu2020.md;
    admin-torch's "O(logn)" default)."""
    if not (is_int(num_sublayers) and num_sublayers >= 1):
        raise UserInputError(f"admin_omega_closed_form: `num_sublayers` = {num_sublayers!r} is not allowed; use ≥ 1.")
    n = num_sublayers
    return math.sqrt((n + 1) / math.log(n + 1) - 1)


# ------------------------------------------------------------------------------------------------ validation
# One field → rule table per paper (configuration_common.check_config runs them in this order; a rule may read the
# fields above it). DeepTransformerConfig.field_rules joins them.

# Vaswani et al.'s Transformer (docs/transformer.md): sizes, heads, FFN, dropouts, LayerNorm placement, special tokens.
TRANSFORMER_RULES: FieldRules = {
    **ENCODER_DECODER_RULES,
    "encoder_layers": (POSITIVE_INT,),
    "decoder_layers": (POSITIVE_INT,),
    "encoder_attention_heads": (POSITIVE_INT, divides_d_model()),
    "decoder_attention_heads": (POSITIVE_INT, divides_d_model()),
    "encoder_ffn_dim": (POSITIVE_INT,),
    "decoder_ffn_dim": (POSITIVE_INT,),
    "activation_function": (one_of(ALLOWED_ACTIVATIONS),),
    "position_encoding": (one_of(ALLOWED_POSITION_ENCODINGS),),
    "position_offset": (Rule(lambda value, config: is_int(value) and value >= 0,
                             "it must be an integer ≥ 0 (fairseq's first position is padding_idx + 1)"),),
    "output_bias": (FLAG,),
    "attention_dropout": (PROBABILITY,),
    "activation_dropout": (PROBABILITY,),
    "scale_embedding": (FLAG,),
    "layer_norm_position": (one_of(ALLOWED_LAYER_NORM_POSITIONS),),
    "init_std": (Rule(lambda value, config: value is None or (is_number(value) and math.isfinite(value) and value > 0),
                      "it must be None (d_model ** -0.5) or a finite positive number"),),
    "share_encoder_decoder_embeddings": (FLAG,),
    "decoder_vocab_size": (
        Rule(lambda value, config: value is None or (is_int(value) and value >= 1),
             "it must be None (the target vocabulary is the source's) or a positive integer"),
        Rule(lambda value, config: not config.share_encoder_decoder_embeddings or value in (None, config.vocab_size),
             lambda config: "one embedding matrix serves both sides with share_encoder_decoder_embeddings=True, so "
                            f"the target vocabulary must be the source's (vocab_size={config.vocab_size}); leave it "
                            "None or set share_encoder_decoder_embeddings=False")),
    **SPECIAL_TOKEN_RULES,
    # The Transformer also holds converted public checkpoints (docs/public-checkpoints.md): Marian (OPUS-MT) has no
    # `<s>` and starts decoding from `<pad>`, whose embedding row is zero and which no mask of the decoder reads.
    "bos_token_id": (OPTIONAL_TOKEN_ID,),
    "decoder_start_token_id": (TOKEN_ID,),
}


def _admin_only(field: str, default: Any) -> Rule:
    """An ADMIN setting left at its default unless ``residual_scaling="admin"``."""
    return Rule(lambda value, config: config.residual_scaling == "admin" or value == default,
                lambda config: "ADMIN settings apply only with residual_scaling='admin' (it is "
                               f"{config.residual_scaling!r}); set residual_scaling='admin' or leave {field} at "
                               f"{default!r}")


# liu2020 ADMIN (docs/liu2020.md): x_k = LN(ω_k ⊙ x_{k−1} + f_k(x_{k−1})), Eq. (2) liu2020, a post-LN rule.
LIU2020_RULES: FieldRules = {
    "residual_scaling": (one_of(ALLOWED_RESIDUAL_SCALINGS),
                         Rule(lambda value, config: value != "admin" or config.layer_norm_position == "post",
                              "ADMIN rescales post-LN residuals (liu2020 eq 2), so use it with "
                              "layer_norm_position='post' only")),
    "admin_init": (one_of(ALLOWED_ADMIN_INITS), _admin_only("admin_init", "profiling")),
    "admin_omega_trainable": (FLAG, _admin_only("admin_omega_trainable", True)),
    "admin_profiled": (FLAG, _admin_only("admin_profiled", False),
                       Rule(lambda value, config: not (config.admin_init == "closed_form" and value),
                            "a closed-form ADMIN model is never profiled (admin_init='closed_form'); leave it False")),
}

# li2022 (docs/li2022.md): cross-attention drop (§3.3) and the collapse-reducing losses DDR and ALD (§3.4, Eq. (6)).
LOSS_WEIGHT = number_in(0.0, math.inf, high_open=True, allowed="it must be a finite number ≥ 0 (0 switches the loss off)")
LI2022_RULES: FieldRules = {
    "cross_attention_drop_ratio": (number_in(0.0, 1.0, allowed="it must be a probability in [0, 1]"),),
    "cross_attention_drop_depth": (
        Rule(lambda value, config: is_int(value) and 0 <= value <= config.decoder_layers,
             lambda config: f"it must be an integer in [0, decoder_layers={config.decoder_layers}]"),
        Rule(lambda value, config: value < config.decoder_layers or config.cross_attention_drop_ratio < 1.0,
             lambda config: "with cross_attention_drop_ratio=1.0 no decoder layer would keep a cross-attention and "
                            "the model could not see its source; use a depth below "
                            f"decoder_layers={config.decoder_layers}")),
    "ddr_weight": (LOSS_WEIGHT,),
    "ald_weight": (LOSS_WEIGHT,),
    "ald_unk_ratio": (number_in(0.0, 0.5, low_open=True, high_open=True,
                                allowed="p_ALD must lie in (0, 0.5) (li2022 §3.4)"),),
    "ald_temperature": (number_in(0.0, math.inf, low_open=True, high_open=True,
                                  allowed="it must be a finite positive number"),),
    # ALD (and the source-reliance monitor) replace source words by <unk>: it is none of the tokens kept
    "unk_token_id": (*SPECIAL_TOKEN_RULES["unk_token_id"],
                     Rule(lambda value, config: value not in (config.pad_token_id, config.eos_token_id),
                          "it must differ from pad_token_id and eos_token_id (ALD masks source words with it)"),
                     Rule(lambda value, config: value != config.bos_token_id,
                          "it must differ from bos_token_id (li2022's ALD and the source-reliance monitor mask words "
                          "with it)")),
    "ald_protected_token_ids": (
        Rule(lambda value, config: isinstance(value, list)
             and all(is_int(token) and 0 <= token < config.vocab_size for token in value),
             lambda config: f"it must be a list of token ids in [0, vocab_size={config.vocab_size})"),
        Rule(lambda value, config: config.unk_token_id not in value, "it must not contain unk_token_id")),
}


def _aggregation_rules(stack: str) -> tuple[Rule, ...]:
    def merges(value: Any, config: Any) -> bool:
        return value not in ("iterative", "hierarchical") or getattr(config, f"{stack}_layers") >= 2

    return (one_of(LAYER_AGGREGATIONS),
            Rule(merges, lambda config: f"{getattr(config, f'{stack}_layer_aggregation')} aggregation merges layers, "
                                        f"so its stack needs at least 2 layers (it has "
                                        f"{getattr(config, f'{stack}_layers')})"))


def _shallow_diversity_stacks(config: Any) -> list[str]:
    return [stack for stack in config.diversity_stacks() if getattr(config, f"{stack}_layers") < 2]


# dou2018 (docs/dou2018.md): layer aggregation (§3.1.1), multi-layer attention (Eq. (8)), diversity (Eq. (9)-(10)).
DOU2018_RULES: FieldRules = {
    "encoder_layer_aggregation": _aggregation_rules("encoder"),
    "decoder_layer_aggregation": _aggregation_rules("decoder"),
    "aggregation_activation": (one_of(AGGREGATION_ACTIVATIONS),),
    "multi_layer_attention_k": (
        Rule(lambda value, config: is_int(value) and 1 <= value <= 3, "it must be 1 (off), 2 or 3 (dou2018 §3.1.2)"),
        Rule(lambda value, config: value == 1 or min(config.encoder_layers, config.decoder_layers) >= value + 1,
             lambda config: f"layers attend to the {config.multi_layer_attention_k} layers below them, so each stack "
                            f"needs at least {config.multi_layer_attention_k + 1} layers (encoder "
                            f"{config.encoder_layers}, decoder {config.decoder_layers})")),
    "diversity_weight": (
        NON_NEGATIVE_WEIGHT,
        Rule(lambda value, config: value == 0 or not _shallow_diversity_stacks(config),
             lambda config: "layer diversity compares adjacent layers, so the "
                            f"{_shallow_diversity_stacks(config)[0]} needs at least 2 layers")),
}

class DeepTransformerConfig(ValidatedConfigMixin, PreTrainedConfig):
    r"""Configuration of [`DeepTransformerForConditionalGeneration`]: a Transformer encoder-decoder for NMT.

    Defaults give Transformer-base (Vaswani et al. 2017): 6+6 layers, d_model 512, 8 heads, FFN 2048, post-LN, ReLU,
    a shared (joint-BPE) source/target vocabulary and embeddings tied to the output projection (docs/transformer.md).

    Args:
        vocab_size (`int`, defaults to 32000):
            Size of the joint source/target vocabulary. Source and target embeddings are one matrix (joint BPE,
            docs/transformer.md); must be greater than every special token id.
        d_model (`int`, defaults to 512):
            Width of every layer (embedding and hidden size). Even, and divisible by both head counts.
        encoder_layers (`int`, defaults to 6):
            Number of encoder layers L_e (≥ 1). liu2020 goes to 60, li2022 to 30.
        decoder_layers (`int`, defaults to 6):
            Number of decoder layers L_d (≥ 1). li2022 studies decoders as deep as 27-30 layers.
        encoder_attention_heads (`int`, defaults to 8):
            Heads of every encoder self-attention; must divide `d_model`.
        decoder_attention_heads (`int`, defaults to 8):
            Heads of every decoder self- and cross-attention; must divide `d_model`.
        encoder_ffn_dim (`int`, defaults to 2048):
            Inner width of the encoder position-wise feed-forward network (fc1 -> activation -> fc2).
        decoder_ffn_dim (`int`, defaults to 2048):
            Inner width of the decoder feed-forward network.
        activation_function (`str`, defaults to `"relu"`):
            FFN non-linearity; ReLU as in Vaswani et al. and all four papers. One of `ALLOWED_ACTIVATIONS`.
        dropout (`float`, defaults to 0.1):
            Residual dropout on every sub-layer output and on the embeddings, in [0, 1).
        attention_dropout (`float`, defaults to 0.0):
            Dropout on the attention probabilities, in [0, 1).
        activation_dropout (`float`, defaults to 0.0):
            Dropout after the FFN activation (fairseq's relu_dropout), in [0, 1).
        max_position_embeddings (`int`, defaults to 1024):
            Longest source or target sequence, in tokens, the model accepts. With sinusoidal positions this is a
            guard, not a parameter count; with learned ones each stack's table has this many rows (plus
            `position_offset`).
        position_encoding (`str`, defaults to `"sinusoidal"`):
            How positions are added to the scaled token embeddings (docs/transformer.md, "Positions"). `"sinusoidal"`:
            Vaswani et al. §3.5, PE(p, i) = sin(p / 10000^{2i/d}) in the first half of the vector and the cosines in
            the second (Marian's layout, so OPUS-MT models convert exactly). `"sinusoidal_fairseq"`: tensor2tensor's and
            fairseq's frequencies 10000^{−i/(d/2−1)}, same layout (fairseq and FSMT checkpoints). `"learned"`: a
            trained table per stack, `embed_positions` (fairseq's `--encoder-learned-pos`), normal-initialised with
            std d_model ** -0.5. One of `ALLOWED_POSITION_ENCODINGS`.
        position_offset (`int`, defaults to 0):
            The position number of the first token (≥ 0): 0 for Vaswani et al. and Marian; fairseq numbers positions
            from padding_idx + 1 (2 with `<pad>` = 1). A learned table has `position_offset` unused leading rows, so
            its row indices are fairseq's (docs/public-checkpoints.md).
        output_bias (`bool`, defaults to `False`):
            A learned bias on the output projection (`lm_head.bias`): Marian's `decoder_ff_logit_out_b`, transformers'
            `final_logits_bias`, which every OPUS-MT model has. The papers' Transformer has none.
        scale_embedding (`bool`, defaults to `True`):
            Multiply token embeddings by sqrt(d_model) before adding positions (Vaswani et al. §3.4).
        layer_norm_position (`str`, defaults to `"post"`):
            `"post"`: x_{k} = LN(x_{k-1} + f_k(x_{k-1})), the papers' default (Eq. (3) li2022, Eq. (1) liu2020).
            `"pre"`: x_{k} = x_{k-1} + f_k(LN(x_{k-1})), with a final LayerNorm on each stack (docs/transformer.md).
        layer_norm_eps (`float`, defaults to 1e-5):
            Epsilon of every LayerNorm (> 0).
        tie_word_embeddings (`bool`, defaults to `True`):
            Tie the output projection (`lm_head`) to the decoder's token embedding — the shared one, or the target
            one when `share_encoder_decoder_embeddings=False` (Press & Wolf 2017; docs/transformer.md).
        share_encoder_decoder_embeddings (`bool`, defaults to `True`):
            One token embedding matrix (`model.shared`) for source and target, a joint vocabulary (docs/transformer.md).
            `False`: the encoder keeps `model.shared` (`vocab_size` rows) and the decoder has its own
            `model.decoder.embed_tokens` (`decoder_vocab_size` rows) — Marian models with separate vocabularies and
            fairseq models with separate dictionaries (docs/public-checkpoints.md).
        decoder_vocab_size (`int`, *optional*, defaults to `None`):
            Size of the target vocabulary when it differs from the source's (`share_encoder_decoder_embeddings=False`);
            `None` means `vocab_size`. The output projection has this many rows; `target_vocab_size` reads it.
        init_std (`float`, *optional*, defaults to `None`):
            Standard deviation of the normal init of the token embedding (and of an untied `lm_head`). `None` means
            d_model ** -0.5, which gives unit-variance scaled embeddings (fairseq's choice). Linear layers use
            Xavier-uniform weights (gain 1) and zero biases; LayerNorms start at weight 1, bias 0.
        residual_scaling (`str`, defaults to `"none"`):
            `"none"`: the residual rule above. `"admin"`: liu2020 ADMIN, every post-LN residual sub-layer k computes
            x_k = LN(ω_k ⊙ x_{k-1} + f_k(x_{k-1})) (Eq. (2) liu2020) with a d_model-vector ω_k per sub-layer (2 per
            encoder layer, 3 per decoder layer); the first sub-layer of each stack keeps ω_1 = 1 and has no
            parameter (docs/liu2020.md). Requires `layer_norm_position="post"`.
        admin_init (`str`, defaults to `"profiling"`):
            How ADMIN sets ω. `"profiling"`: one training-mode forward pass on a real batch (≥ 4k target tokens)
            with the authors' recursion ω_{k+1} = sqrt(Var(ω_k ⊙ x_{k-1}) + Var(f_k(x_{k-1}))) over non-pad
            positions, run by `hf_deepnmt.admin_profile` (the trainer calls it before the first step).
            `"closed_form"`: ω = sqrt((N+1)/ln(N+1) − 1) with N = 2·encoder_layers or 3·decoder_layers, set at init
            (admin-torch's O(log N) default; docs/liu2020.md).
        admin_omega_trainable (`bool`, defaults to `True`):
            Train ω (the authors' choice) or keep it fixed at its initial value (stored as a buffer).
        admin_profiled (`bool`, defaults to `False`):
            Whether ω already holds a profile (set by `admin_profile`; saved with the model so that loading never
            re-profiles). Meaningless unless `residual_scaling="admin"` and `admin_init="profiling"`.
        cross_attention_drop_depth (`int`, defaults to 0):
            li2022 CAD drop depth L_dr (§3.3), in [0, decoder_layers]: decoder layers 1..L_dr (the bottom ones) skip
            their cross-attention sub-layer with probability `cross_attention_drop_ratio` during training; layers
            above L_dr always keep it (docs/li2022.md resolves the paper's self-contradiction this way). 0 disables CAD.
        cross_attention_drop_ratio (`float`, defaults to 0.0):
            li2022 CAD drop ratio p_net in [0, 1]: the probability that one of the bottom L_dr layers skips its
            cross-attention in a training forward pass (one draw per layer per forward, shared by the batch). At
            inference every existing cross-attention is used. With 1.0 those layers never train a cross-attention, so
            they are built without one (no parameters, no compute, skipped at inference too; docs/li2022.md).
        ddr_weight (`float`, defaults to 0.0):
            Weight of li2022's decoder dropout regularization loss (§3.4, docs/li2022.md), ≥ 0. When > 0 the training loss
            runs the decoder twice on one encoder output (independent dropout and drop-net draws), adds
            `ddr_weight · ½(KL(P1‖P2) + KL(P2‖P1))` per target token and averages the NLL over both passes. The paper
            gives no weight; `DeepDecoderTransformerConfig` uses 1.0 (R-Drop used 5).
        ald_weight (`float`, defaults to 0.0):
            Weight of li2022's anti-LM-degradation contrastive loss (Eq. (6) li2022, docs/li2022.md), ≥ 0; needs
            `unk_token_id`. `DeepDecoderTransformerConfig` uses 1.0.
        ald_unk_ratio (`float`, defaults to 0.3):
            p_ALD of Eq. (6) li2022, in (0, 0.5): each sentence draws γ ~ U[0, p_ALD); X⁺ has round(γ·n) of its n real
            source tokens replaced by `<unk>`, X⁻ has round((1−γ)·n) replaced.
        ald_temperature (`float`, defaults to 0.1):
            Softmax temperature τ of Eq. (6) li2022 (> 0).
        encoder_layer_aggregation (`str`, defaults to `"none"`):
            dou2018 §3.1.1 layer aggregation of the encoder, one of `LAYER_AGGREGATIONS`: `"dense"` (Eq. (4)),
            `"linear"` (Eq. (5): every layer's input and the stack's output a d×d-matrix combination of all
            representations below, identity-initialised), `"iterative"` (Eq. (6)), `"hierarchical"` (Fig. 2), or
            `"none"`. The aggregated result is the encoder output (docs/dou2018.md). Iterative and hierarchical need
            ≥ 2 layers.
        decoder_layer_aggregation (`str`, defaults to `"none"`):
            The same for the decoder; its aggregated result feeds the output projection.
        aggregation_activation (`str`, defaults to `"sigmoid"`):
            The non-linearity inside dou2018's AGG function (Eq. (7)): `"sigmoid"` (the paper) or `"relu"` (its
            Table 4 alternative).
        multi_layer_attention_k (`int`, defaults to 1):
            dou2018 §3.1.2 multi-layer attention (Eq. (8)) in both stacks: in every layer l ≥ k+1 the self-attention
            query attends separately to the k layers below (each through its own attention) and AGG merges the k
            contexts. 1 is the vanilla self-attention; 2 or 3 as the paper. Needs ≥ k+1 layers in each stack.
        diversity_weight (`float`, defaults to 0.0):
            λ of dou2018's layer-diversity regularisation (Eq. (9)-(10)), ≥ 0; the paper uses 1.0. The paper
            *maximises* diversity, so the trained objective is NLL − λ·L_div. It applies to each stack that uses a
            dou2018 mechanism (aggregation or multi-layer attention), or to both stacks when none does
            (`diversity_stacks`); each such stack needs ≥ 2 layers.
        label_smoothing (`float`, defaults to 0.0):
            ε of the label-smoothed NLL (Szegedy et al. 2016) that the model's own forward optimises in training mode
            (a stock `Seq2SeqTrainer` or a plain loop; `DeepNMTTrainer` passes its ``label_smoothing_factor``
            instead, and `deepnmt train` records it here). In [0, 1). Every paper of this package trains with 0.1;
            evaluation-mode losses are never smoothed.
        ald_protected_token_ids (`list[int]`, defaults to `[]`):
            Source token ids ALD must never replace by `<unk>` besides pad, bos and eos — e.g. target-language tags of
            a multilingual model (docs/li2022.md). Each must be a token id in [0, vocab_size).
        pad_token_id (`int`, defaults to 0):
            Id of `<pad>`; its embedding row is kept at zero and it is never attended to.
        bos_token_id (`int`, *optional*, defaults to 1):
            Id of `<s>`; `None` for a vocabulary without one (Marian's, whose decoder starts from `<pad>`).
        eos_token_id (`int`, defaults to 2):
            Id of `</s>`, which ends every source and target sequence.
        unk_token_id (`int`, defaults to 3):
            Id of `<unk>`. Used by the li2022 ALD loss (docs/li2022.md) to mask source tokens.
        decoder_start_token_id (`int`, defaults to 1):
            First decoder input token (`<s>`); labels are shifted right behind it. Marian starts from `<pad>` (its
            embedding row is zero), fairseq from `</s>`.
        use_cache (`bool`, defaults to `True`):
            Return and use key/value caches (`EncoderDecoderCache`) during incremental decoding.
        is_encoder_decoder (`bool`, defaults to `True`):
            Always `True`; present because transformers reads it.

    Example:

    ```python
    >>> from hf_deepnmt import DeepTransformerConfig, DeepTransformerForConditionalGeneration
    >>> config = DeepTransformerConfig(vocab_size=8000, d_model=256, encoder_layers=12, decoder_layers=6)
    >>> model = DeepTransformerForConditionalGeneration(config)
    ```
    """

    model_type = "deep_transformer"
    keys_to_ignore_at_inference = ["past_key_values", "encoder_last_hidden_state"]
    attribute_map = {
        "num_attention_heads": "encoder_attention_heads",
        "hidden_size": "d_model",
        "num_hidden_layers": "encoder_layers",
    }

    def __init__(
        self,
        vocab_size: int = 32000,
        d_model: int = 512,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        encoder_attention_heads: int = 8,
        decoder_attention_heads: int = 8,
        encoder_ffn_dim: int = 2048,
        decoder_ffn_dim: int = 2048,
        activation_function: str = "relu",
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation_dropout: float = 0.0,
        max_position_embeddings: int = 1024,
        position_encoding: str = "sinusoidal",
        position_offset: int = 0,
        output_bias: bool = False,
        scale_embedding: bool = True,
        layer_norm_position: str = "post",
        layer_norm_eps: float = 1e-5,
        tie_word_embeddings: bool = True,
        share_encoder_decoder_embeddings: bool = True,
        decoder_vocab_size: int | None = None,
        init_std: float | None = None,
        residual_scaling: str = "none",
        admin_init: str = "profiling",
        admin_omega_trainable: bool = True,
        admin_profiled: bool = False,
        cross_attention_drop_depth: int = 0,
        cross_attention_drop_ratio: float = 0.0,
        ddr_weight: float = 0.0,
        ald_weight: float = 0.0,
        ald_unk_ratio: float = 0.3,
        ald_temperature: float = 0.1,
        ald_protected_token_ids: list[int] | None = None,
        encoder_layer_aggregation: str = "none",
        decoder_layer_aggregation: str = "none",
        aggregation_activation: str = "sigmoid",
        multi_layer_attention_k: int = 1,
        diversity_weight: float = 0.0,
        label_smoothing: float = 0.0,
        pad_token_id: int = 0,
        bos_token_id: int | None = 1,
        eos_token_id: int = 2,
        unk_token_id: int = 3,
        decoder_start_token_id: int = 1,
        use_cache: bool = True,
        is_encoder_decoder: bool = True,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.position_encoding = position_encoding
        self.position_offset = position_offset
        self.output_bias = output_bias
        self.share_encoder_decoder_embeddings = share_encoder_decoder_embeddings
        self.decoder_vocab_size = decoder_vocab_size
        self.d_model = d_model
        self.encoder_layers = encoder_layers
        self.decoder_layers = decoder_layers
        self.encoder_attention_heads = encoder_attention_heads
        self.decoder_attention_heads = decoder_attention_heads
        self.encoder_ffn_dim = encoder_ffn_dim
        self.decoder_ffn_dim = decoder_ffn_dim
        self.activation_function = activation_function
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.max_position_embeddings = max_position_embeddings
        self.scale_embedding = scale_embedding
        self.layer_norm_position = layer_norm_position
        self.layer_norm_eps = layer_norm_eps
        self.init_std = init_std
        self.residual_scaling = residual_scaling
        self.admin_init = admin_init
        self.admin_omega_trainable = admin_omega_trainable
        self.admin_profiled = admin_profiled
        self.cross_attention_drop_depth = cross_attention_drop_depth
        self.cross_attention_drop_ratio = cross_attention_drop_ratio
        self.ddr_weight = ddr_weight
        self.ald_weight = ald_weight
        self.ald_unk_ratio = ald_unk_ratio
        self.ald_temperature = ald_temperature
        # A list or tuple is stored as a list (JSON's form); anything else is kept as given for check_fields to name.
        self.ald_protected_token_ids = ([] if ald_protected_token_ids is None else list(ald_protected_token_ids)
                                        if isinstance(ald_protected_token_ids, (list, tuple)) else ald_protected_token_ids)
        self.encoder_layer_aggregation = encoder_layer_aggregation
        self.decoder_layer_aggregation = decoder_layer_aggregation
        self.aggregation_activation = aggregation_activation
        self.multi_layer_attention_k = multi_layer_attention_k
        self.diversity_weight = diversity_weight
        self.label_smoothing = label_smoothing
        self.unk_token_id = unk_token_id
        self.use_cache = use_cache
        self.tie_word_embeddings = tie_word_embeddings
        self._validate_and_init(kwargs, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                                eos_token_id=eos_token_id, decoder_start_token_id=decoder_start_token_id,
                                is_encoder_decoder=is_encoder_decoder, tie_word_embeddings=tie_word_embeddings)

    # Every field with its rules, one table per paper (above); a subclass that adds fields extends it.
    field_rules: ClassVar[FieldRules] = {**TRANSFORMER_RULES, **LIU2020_RULES, **LI2022_RULES, **DOU2018_RULES}
    family: ClassVar[str] = TRANSFORMER  # meng2019's fields are refused by name (hf_deepnmt.papers)

    def check_fields(self) -> None:
        """Validate every field (`field_rules`); raise one `ValueError` sentence naming the field, the value and what
        is allowed. Warn once about settings that are valid but do nothing (`warn_about_idle_settings`)."""
        super().check_fields()
        self.warn_about_idle_settings()

    @property
    def target_vocab_size(self) -> int:
        """Rows of the decoder's token embedding and of the output projection: `decoder_vocab_size`, or `vocab_size`
        for a joint vocabulary."""
        return self.vocab_size if self.decoder_vocab_size is None else self.decoder_vocab_size

    def diversity_stacks(self) -> tuple[str, ...]:
        """The stacks dou2018's diversity term applies to: those that use a deep-representation mechanism
        (aggregation or multi-layer attention), or both when neither does (docs/dou2018.md)."""
        mla = self.multi_layer_attention_k > 1
        chosen = tuple(stack for stack in ("encoder", "decoder")
                       if mla or getattr(self, f"{stack}_layer_aggregation") != "none")
        return chosen or ("encoder", "decoder")

    def uses_deep_representations(self) -> bool:
        """Whether any dou2018 mechanism changes the network (aggregation or multi-layer attention)."""
        return (self.encoder_layer_aggregation != "none" or self.decoder_layer_aggregation != "none"
                or self.multi_layer_attention_k > 1)

    def warn_about_idle_settings(self) -> None:
        """Settings that are valid one by one but silently do nothing, or quietly change the model's scale: one
        warning each (docs/training.md, "Combinations"; the contradictory ones are rules of `field_rules`)."""
        name = type(self).__name__
        depth, ratio = self.cross_attention_drop_depth, float(self.cross_attention_drop_ratio)
        if depth > 0 and ratio == 0.0:
            logger.warning_once(
                f"{name}: cross_attention_drop_depth={depth} has no effect with cross_attention_drop_ratio=0.0 "
                "(cross-attention drop is off); set the depth to 0 as well, or a ratio above 0 to use it.")
        cad_random = depth > 0 and 0.0 < ratio < 1.0
        dropouts = (self.dropout, self.attention_dropout, self.activation_dropout)
        if self.ddr_weight > 0 and not cad_random and all(p == 0 for p in dropouts):
            logger.warning_once(
                f"{name}: ddr_weight={self.ddr_weight} has no effect: li2022's DDR compares two decoder passes that "
                "differ only by dropout or cross-attention drop, and all dropouts are 0 with no drop-net; set a "
                "dropout or ddr_weight=0.")

        for side in ("encoder", "decoder"):
            layers = getattr(self, f"{side}_layers")
            if getattr(self, f"{side}_layer_aggregation") == "dense" and self.layer_norm_position == "post" and layers > 2:
                logger.warning_once(
                    f"{name}: {side}_layer_aggregation='dense' with layer_norm_position='post' adds the normalised "
                    f"outputs of every layer below (dou2018 Eq. (4) read literally), so the {side}'s representation "
                    f"about doubles in scale per layer (≈{2 ** (layers - 1)}× at layer {layers}) and reaches the "
                    "next stage unnormalised; docs/dou2018.md, 'Dense under post-LN'.")

    def cross_attention_keep_schedule(self) -> list[float]:
        """Per decoder layer (bottom first), the probability that its cross-attention runs in a training pass.

        li2022 §3.3 as read in docs/li2022.md: 1 − p_net for layers 1..L_dr, 1.0 above. A layer at 0.0 is built
        without cross-attention.
        """
        depth, ratio = self.cross_attention_drop_depth, float(self.cross_attention_drop_ratio)
        return [1.0 - ratio if layer < depth else 1.0 for layer in range(self.decoder_layers)]


class AdminTransformerConfig(DeepTransformerConfig):
    r"""liu2020 (Very Deep Transformers for NMT): `DeepTransformerConfig` with ``model_type="admin_transformer"`` and
    the paper's defaults — a 60-layer encoder and 12-layer decoder, post-LN, 512/2048/8 heads,
    ``residual_scaling="admin"`` profiled on real data (docs/liu2020.md), and the authors' dropouts 0.2 / 0.1 / 0.1
    (attention / activation). Every field and its validation is `DeepTransformerConfig`'s.
    """

    model_type = "admin_transformer"

    def __init__(
        self,
        encoder_layers: int = 60,
        decoder_layers: int = 12,
        d_model: int = 512,
        encoder_attention_heads: int = 8,
        decoder_attention_heads: int = 8,
        encoder_ffn_dim: int = 2048,
        decoder_ffn_dim: int = 2048,
        dropout: float = 0.2,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.1,
        layer_norm_position: str = "post",
        residual_scaling: str = "admin",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            d_model=d_model,
            encoder_attention_heads=encoder_attention_heads,
            decoder_attention_heads=decoder_attention_heads,
            encoder_ffn_dim=encoder_ffn_dim,
            decoder_ffn_dim=decoder_ffn_dim,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation_dropout=activation_dropout,
            layer_norm_position=layer_norm_position,
            residual_scaling=residual_scaling,
            **kwargs,
        )


# li2022 Fig. 2: a 27-layer decoder works best with cross-attention drop in its bottom 21 layers.
DEEP_DECODER_DROP_FRACTION = 21 / 27


class DeepDecoderTransformerConfig(DeepTransformerConfig):
    r"""li2022 (a deep decoder that does not collapse): `DeepTransformerConfig` with
    ``model_type="deep_decoder_transformer"`` and the paper's full model as defaults — BASE, DEEP-30L-Full: a
    15-layer encoder and 15-layer decoder, post-LN (Eq. (3) li2022, docs/li2022.md; Table 1 labels the paper's
    baseline "Pre-Norm"), 512/2048/8, with cross-attention drop and both collapse-reducing losses switched on
    (docs/li2022.md). The explicit signature (rather than a table of defaults and a ``**kwargs`` ``__init__``) is
    deliberate: under transformers 5.2x a ``**kwargs``-only subclass lost fields (tried: ``decoder_layers`` went
    missing).

    Defaults the paper does not state, chosen here and recorded in the model card:

    * ``cross_attention_drop_depth`` = round(21/27 · decoder_layers) unless given (12 of the default 15): Fig. 2 of
      li2022 peaks at L_dr = 21 of a 27-layer decoder, and the default scales with the decoder, so
      ``DeepDecoderTransformerConfig(decoder_layers=6)`` drops in the bottom 5 layers;
    * ``cross_attention_drop_ratio=0.5``: §4.3 finds that a large drop depth works best with p_net < 1 ("retains
      some of the cross-attention"); no value is given;
    * ``ddr_weight=1.0``, ``ald_weight=1.0``, ``ald_unk_ratio=0.3``, ``ald_temperature=0.1`` (docs/li2022.md; p_ALD and
      τ are Fig. 3's best values).

    Every field and its validation is `DeepTransformerConfig`'s.
    """

    model_type = "deep_decoder_transformer"

    def __init__(
        self,
        encoder_layers: int = 15,
        decoder_layers: int = 15,
        d_model: int = 512,
        encoder_attention_heads: int = 8,
        decoder_attention_heads: int = 8,
        encoder_ffn_dim: int = 2048,
        decoder_ffn_dim: int = 2048,
        layer_norm_position: str = "post",
        cross_attention_drop_depth: int | None = None,
        cross_attention_drop_ratio: float = 0.5,
        ddr_weight: float = 1.0,
        ald_weight: float = 1.0,
        ald_unk_ratio: float = 0.3,
        ald_temperature: float = 0.1,
        **kwargs: Any,
    ) -> None:
        if cross_attention_drop_depth is None and is_int(decoder_layers) and decoder_layers >= 1:
            cross_attention_drop_depth = max(1, round(DEEP_DECODER_DROP_FRACTION * decoder_layers))
        super().__init__(
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            d_model=d_model,
            encoder_attention_heads=encoder_attention_heads,
            decoder_attention_heads=decoder_attention_heads,
            encoder_ffn_dim=encoder_ffn_dim,
            decoder_ffn_dim=decoder_ffn_dim,
            layer_norm_position=layer_norm_position,
            cross_attention_drop_depth=cross_attention_drop_depth,
            cross_attention_drop_ratio=cross_attention_drop_ratio,
            ddr_weight=ddr_weight,
            ald_weight=ald_weight,
            ald_unk_ratio=ald_unk_ratio,
            ald_temperature=ald_temperature,
            **kwargs,
        )


class DeepRepresentationTransformerConfig(DeepTransformerConfig):
    r"""dou2018 (Exploiting Deep Representations for NMT): `DeepTransformerConfig` with
    ``model_type="deep_representation_transformer"`` and the paper's default strategy as defaults — Transformer-Base
    (6+6 layers, 512/2048/8, post-LN) with hierarchical layer aggregation in both stacks and the layer-diversity
    term at λ = 1.0 ("+ Deep Representations" of dou2018 Table 2; Table 1 row 9), AGG with a sigmoid (Eq. (7)).
    Every field and its validation is `DeepTransformerConfig`'s; docs/dou2018.md explains each decision.
    """

    model_type = "deep_representation_transformer"

    def __init__(
        self,
        encoder_layers: int = 6,
        decoder_layers: int = 6,
        d_model: int = 512,
        encoder_attention_heads: int = 8,
        decoder_attention_heads: int = 8,
        encoder_ffn_dim: int = 2048,
        decoder_ffn_dim: int = 2048,
        layer_norm_position: str = "post",
        encoder_layer_aggregation: str = "hierarchical",
        decoder_layer_aggregation: str = "hierarchical",
        aggregation_activation: str = "sigmoid",
        multi_layer_attention_k: int = 1,
        diversity_weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            encoder_layers=encoder_layers,
            decoder_layers=decoder_layers,
            d_model=d_model,
            encoder_attention_heads=encoder_attention_heads,
            decoder_attention_heads=decoder_attention_heads,
            encoder_ffn_dim=encoder_ffn_dim,
            decoder_ffn_dim=decoder_ffn_dim,
            layer_norm_position=layer_norm_position,
            encoder_layer_aggregation=encoder_layer_aggregation,
            decoder_layer_aggregation=decoder_layer_aggregation,
            aggregation_activation=aggregation_activation,
            multi_layer_attention_k=multi_layer_attention_k,
            diversity_weight=diversity_weight,
            **kwargs,
        )
