"""Configuration of meng2019's DTMT, the deep transition RNN family of hf_deepnmt (``model_type="dtmt"``).

DTMT (Meng & Zhang, AAAI 2019) is a bidirectional deep transition encoder and a deep transition decoder joined by
multi-head additive attention. Each of its three transition modules (encoder, query, decoder; Fig. 2) is a
*transition block*: a linear-transformation enhanced GRU (L-GRU, Eq. (14)-(16)) at the bottom and ``k`` transition
GRUs (T-GRU, Eq. (10)-(13)) above it; DTMT#k has ``transition_depth=k``. Every choice the paper leaves open is
explained in ``docs/meng2019-dtmt.md``.

Every field is validated once when the config is built, by the field → rule table `DTMT_RULES` (its rules, and
those of the fields every encoder-decoder of the package has, are `configuration_common`'s), and again when a model
is built from it: a bad value raises one ``ValueError`` sentence that names the field, the value and what is allowed. The Transformer mechanisms of the other
papers (li2022 CAD/CRT, liu2020 ADMIN, dou2018 layer aggregation) have no meaning for an RNN and are refused.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code), so it imports only transformers
and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from transformers import PreTrainedConfig

from .configuration_common import (ENCODER_DECODER_RULES, FLAG, POSITIVE_INT, PROBABILITY, SPECIAL_TOKEN_RULES,
                                   FieldRules, Rule, ValidatedConfigMixin, divides_d_model, is_int, number_in,
                                   one_of)
from .papers import DTMT, foreign_fields

ALLOWED_RNN_CELLS: tuple[str, ...] = ("lgru", "gru")
# modeling_common.LENGTH_PENALTY_FORMS, spelt here so that this file imports no modeling code (tests check they agree)
ALLOWED_LENGTH_PENALTY_FORMS: tuple[str, ...] = ("power", "gnmt")

# Fields of the Transformer family (its structure and the other papers' mechanisms), each with why it means nothing
# here (hf_deepnmt.papers): refused by name at construction (`ValidatedConfigMixin`).
TRANSFORMER_ONLY_FIELDS: dict[str, str] = foreign_fields(DTMT)

# meng2019's fields with their rules (configuration_common.check_config runs them in this order).
DTMT_RULES: FieldRules = {
    **ENCODER_DECODER_RULES,
    "attention_heads": (POSITIVE_INT, divides_d_model()),
    "transition_depth": (Rule(lambda value, config: is_int(value) and value >= 0, "it must be an integer ≥ 0 (the "
                              "number of T-GRUs per transition block, k of DTMT#k)"),),
    "rnn_cell": (one_of(ALLOWED_RNN_CELLS),),
    "length_penalty_form": (one_of(ALLOWED_LENGTH_PENALTY_FORMS),),
    **{field: (FLAG,) for field in ("encoder_transition", "query_transition", "decoder_transition",
                                    "positional_encoding", "share_encoder_decoder_embeddings")},
    "rnn_dropout": (PROBABILITY,),
    "readout_dropout": (PROBABILITY,),
    "init_range": (number_in(0.0, math.inf, low_open=True, high_open=True,
                             allowed="it must be a finite positive number (the paper uses 0.08)"),),
    **SPECIAL_TOKEN_RULES,
}


class DTMTConfig(ValidatedConfigMixin, PreTrainedConfig):
    r"""Configuration of [`DTMTForConditionalGeneration`]: meng2019's deep transition RNN encoder-decoder.

    Defaults give the paper's Zh-En DTMT#4 (Table 1, §Training Details): d 1024, four T-GRUs above the L-GRU of every
    transition block, 16 attention heads, positional encoding, dropouts 0.5 / 0.3 / 0.5 and uniform ±0.08 init.
    Use ``rnn_cell="gru", transition_depth=0`` for the paper's ShallowRNMT baseline.

    Args:
        vocab_size (`int`, defaults to 32000):
            Size of the vocabulary (one id space for source and target, as the project's joint BPE tokenizer; the
            embeddings themselves are separate unless `share_encoder_decoder_embeddings`).
        d_model (`int`, defaults to 1024):
            Embedding and hidden size d (the paper uses 1024 for both, §Training Details). Even (the positional
            encoding pairs sin and cos) and divisible by `attention_heads`. Encoder annotations and the attention
            context are 2·d wide (bidirectional concatenation).
        transition_depth (`int`, defaults to 4):
            k of DTMT#k: the number of T-GRUs above the bottom L-GRU/GRU in every transition block (§System
            Description), ≥ 0. 0 gives a shallow RNMT (Table 3 rows "ShallowRNMT").
        attention_heads (`int`, defaults to 16):
            Heads of the multi-head additive attention (the authors' code uses 16); must divide `d_model`.
        rnn_cell (`str`, defaults to `"lgru"`):
            The bottom unit of every transition block: `"lgru"` (L-GRU, Eq. (14)-(16)) or `"gru"` (GRU with the
            same per-gate LayerNorm, Eq. (6)-(9)); the L-GRU/GRU columns of Table 3.
        encoder_transition (`bool`, defaults to `True`):
            Table 4 ablation: with `False` the encoder blocks (both directions) keep only their bottom unit, no
            T-GRUs — the encoder of a shallow RNMT (docs/meng2019-dtmt.md explains this reading).
        query_transition (`bool`, defaults to `True`):
            Table 4 ablation of the query transition (before the attention), as `encoder_transition`.
        decoder_transition (`bool`, defaults to `True`):
            Table 4 ablation of the decoder transition (after the attention), as `encoder_transition`.
        positional_encoding (`bool`, defaults to `True`):
            Add sinusoidal positions scaled by 1/sqrt(d) to the source and target embeddings (§Advanced Techniques,
            Table 6 "PE" / "Non-PE").
        dropout (`float`, defaults to 0.5):
            Dropout on the source and target embeddings (the authors' `dropout`), in [0, 1). Paper: 0.5 Zh-En,
            0.3 En-De, 0.2 En-Fr.
        rnn_dropout (`float`, defaults to 0.3):
            Dropout on the candidate activation h̃ of every L-GRU/GRU/T-GRU (the authors' `rnn_dropout`), in [0, 1).
            Paper: 0.3 Zh-En, 0.1 En-De and En-Fr.
        readout_dropout (`float`, defaults to 0.5):
            Dropout on the readout layer before the output projection, in [0, 1). Paper: 0.5 Zh-En, 0.3 En-De,
            0.2 En-Fr.
        init_range (`float`, defaults to 0.08):
            Every weight, embedding and bias starts uniform in [-init_range, init_range] (§Training Details);
            LayerNorm gains start at 1 and offsets at 0. Positive.
        length_penalty_form (`str`, defaults to `"gnmt"`):
            How beam search normalises a hypothesis' log-probability by its length |Y| (``</s>`` counted) with the
            generation config's ``length_penalty`` α: `"gnmt"` divides by ((5 + |Y|) / 6) ** α, the form of GNMT (Wu
            et al. 2016, Eq. (14)) in which meng2019 decodes ("length penalty alpha = 0.6", §Training Details; the
            authors' decoder); `"power"` by |Y| ** α, transformers' own. `generate(length_penalty_form=...)` overrides
            it for one call (docs/meng2019-dtmt.md, "Decoding").
        label_smoothing (`float`, defaults to 0.1):
            ε of the label-smoothed NLL the model's own training-mode loss uses when the caller passes none (a stock
            `Seq2SeqTrainer` or a plain loop; `DeepNMTTrainer` passes its ``label_smoothing_factor``, and `deepnmt
            train` records it here). meng2019 §Advanced Techniques: "uniform label smoothing with an uncertainty=0.1"
            (Eq. (1) writes the plain NLL it is applied to); 0.0 trains the plain NLL. In [0, 1).
        layer_norm_eps (`float`, defaults to 1e-6):
            Epsilon of the per-gate LayerNorms (the authors' value), in (0, 1).
        max_position_embeddings (`int`, defaults to 1024):
            Longest source or target sequence, in tokens, the model accepts (a guard for the pipeline and the
            tokenizer; positions are sinusoidal, not learned).
        share_encoder_decoder_embeddings (`bool`, defaults to `False`):
            Use one embedding matrix for source and target tokens (sensible with a joint BPE vocabulary). The paper's
            models have separate ones (their parameter counts need them; docs/meng2019-dtmt.md).
        tie_word_embeddings (`bool`, defaults to `False`):
            Tie the output projection's weight to the target embedding (Press & Wolf 2017). Not in the paper.
        pad_token_id (`int`, defaults to 0):
            Id of `<pad>`.
        bos_token_id (`int`, defaults to 1):
            Id of `<s>`.
        eos_token_id (`int`, defaults to 2):
            Id of `</s>`, which ends every source and target sequence.
        unk_token_id (`int`, defaults to 3):
            Id of `<unk>` (the collapse monitor of `hf_deepnmt.losses.source_reliance` replaces source words by it).
        decoder_start_token_id (`int`, defaults to 1):
            First decoder input token (`<s>`); labels are shifted right behind it.
        use_cache (`bool`, defaults to `True`):
            Return a `DTMTCache` (decoder state s_{t-1}, projected attention keys, source mask) for incremental
            decoding.
        is_encoder_decoder (`bool`, defaults to `True`):
            Always `True`; present because transformers reads it.

    Example:

    ```python
    >>> from hf_deepnmt import DTMTConfig, DTMTForConditionalGeneration
    >>> config = DTMTConfig(vocab_size=8000, d_model=256, transition_depth=4, attention_heads=4)  # DTMT#4
    >>> shallow = DTMTConfig(vocab_size=8000, d_model=256, rnn_cell="gru", transition_depth=0)  # ShallowRNMT
    >>> model = DTMTForConditionalGeneration(config)
    ```
    """

    model_type = "dtmt"
    keys_to_ignore_at_inference = ["past_key_values", "encoder_last_hidden_state"]
    attribute_map = {"hidden_size": "d_model", "num_attention_heads": "attention_heads"}

    def __init__(
        self,
        vocab_size: int = 32000,
        d_model: int = 1024,
        transition_depth: int = 4,
        attention_heads: int = 16,
        rnn_cell: str = "lgru",
        encoder_transition: bool = True,
        query_transition: bool = True,
        decoder_transition: bool = True,
        positional_encoding: bool = True,
        dropout: float = 0.5,
        rnn_dropout: float = 0.3,
        readout_dropout: float = 0.5,
        init_range: float = 0.08,
        length_penalty_form: str = "gnmt",
        label_smoothing: float = 0.1,
        layer_norm_eps: float = 1e-6,
        max_position_embeddings: int = 1024,
        share_encoder_decoder_embeddings: bool = False,
        tie_word_embeddings: bool = False,
        pad_token_id: int = 0,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        unk_token_id: int = 3,
        decoder_start_token_id: int = 1,
        use_cache: bool = True,
        is_encoder_decoder: bool = True,
        **kwargs: Any,
    ) -> None:
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.transition_depth = transition_depth
        self.attention_heads = attention_heads
        self.rnn_cell = rnn_cell
        self.encoder_transition = encoder_transition
        self.query_transition = query_transition
        self.decoder_transition = decoder_transition
        self.positional_encoding = positional_encoding
        self.dropout = dropout
        self.rnn_dropout = rnn_dropout
        self.readout_dropout = readout_dropout
        self.init_range = init_range
        self.length_penalty_form = length_penalty_form
        self.label_smoothing = label_smoothing
        self.layer_norm_eps = layer_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.share_encoder_decoder_embeddings = share_encoder_decoder_embeddings
        self.unk_token_id = unk_token_id
        self.use_cache = use_cache
        self.tie_word_embeddings = tie_word_embeddings
        self._validate_and_init(kwargs, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                                eos_token_id=eos_token_id, decoder_start_token_id=decoder_start_token_id,
                                is_encoder_decoder=is_encoder_decoder, tie_word_embeddings=tie_word_embeddings)

    field_rules: ClassVar[FieldRules] = DTMT_RULES
    family: ClassVar[str] = DTMT
    foreign_preamble: ClassVar[str] = "DTMT is a recurrent model and "

    def block_depths(self) -> dict[str, int]:
        """T-GRUs above the bottom unit of each transition module (Fig. 2): ``transition_depth`` where the module's
        transition is on, 0 where Table 4's ablation replaces it by the shallow RNMT's single unit."""
        depth = self.transition_depth
        return {
            "encoder": depth if self.encoder_transition else 0,
            "query": depth if self.query_transition else 0,
            "decoder": depth if self.decoder_transition else 0,
        }
