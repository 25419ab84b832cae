"""Marian export: a model of the package as a stock `transformers.MarianMTModel`, a folder that loads without custom
code (``deepnmt export --format marian``; `hf_deepnmt.export.export_model`).

Marian is Vaswani et al.'s post-LN Transformer with Marian/BART names, which are ours (docs/transformer.md): the
weights are copied name for name, the shared embedding becomes Marian's encoder, decoder and (tied) output embedding
(separate vocabularies stay separate), the output bias becomes ``final_logits_bias`` (zero for a model without one),
and the sinusoidal positions are Marian's own; fairseq's positions (other frequencies, an offset) or learned ones are
not (docs/public-checkpoints.md). What Marian cannot hold is decided
before anything is written, from the model type's registry entry and the one list of mechanisms a format cannot
express (`hf_deepnmt.export_formats.format_blockers`): DTMT, pre-LN, a LayerNorm epsilon other than 1e-5, dou2018's
layer aggregation and multi-layer attention, and li2022 CAD layers built without a cross-attention (p_net = 1.0).
liu2020 ADMIN is folded first (`hf_deepnmt.admin.fold_admin`): the result is exact up to float rounding.

Not copied next to the weights: a saved model's code never needs it; ``transformers`` Marian classes are imported
inside the functions.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .admin import fold_admin
from .errors import UserInputError
from .export_formats import format_blockers
from .modeling_common import unwrap_model

__all__ = ["export_marian", "marian_config", "write_marian"]

# Marian parameters that our state dict does not hold: the sinusoidal tables and the (zero) output bias.
MARIAN_ONLY_PARAMETERS = frozenset({"final_logits_bias", "model.encoder.embed_positions.weight",
                                    "model.decoder.embed_positions.weight"})


# Config fields Marian spells as we do (Marian/BART names, docs/transformer.md).
SHARED_FIELDS: tuple[str, ...] = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "dropout", "attention_dropout", "activation_dropout",
    "max_position_embeddings", "scale_embedding", "pad_token_id", "eos_token_id", "bos_token_id",
    "decoder_start_token_id", "tie_word_embeddings",
)


def marian_config(config: Any) -> Any:
    """The `transformers.MarianConfig` of a standard Transformer config of the package (same sizes, dropouts, token
    ids; one shared vocabulary)."""
    from transformers import MarianConfig

    return MarianConfig(**{name: getattr(config, name) for name in SHARED_FIELDS},
                        decoder_vocab_size=getattr(config, "target_vocab_size", config.vocab_size), forced_eos_token_id=None,
                        share_encoder_decoder_embeddings=getattr(config, "share_encoder_decoder_embeddings", True))


@torch.no_grad()
def export_marian(model: nn.Module) -> nn.Module:
    """A stock `transformers.MarianMTModel` (no custom code) with the same weights, logits and beam search output.

    ADMIN models are folded first. A model using a mechanism Marian lacks raises one `ValueError` sentence naming
    each such setting once (`hf_deepnmt.export_formats.format_blockers`).
    """
    from transformers import MarianMTModel

    model = unwrap_model(model)
    blockers = format_blockers(model.config, "marian")
    if blockers:
        raise UserInputError(f"export_marian: this model uses {', '.join(b.setting_first() for b in blockers)}, "
                             "which MarianMTModel cannot express.")
    if getattr(model.config, "residual_scaling", "none") == "admin":
        model = fold_admin(model)  # the same function as a standard post-LN Transformer (Eq. (2) liu2020 folded)
    config = model.config
    marian = MarianMTModel(marian_config(config)).to(model.device)
    state = model.state_dict()
    shared = config.share_encoder_decoder_embeddings
    state["model.encoder.embed_tokens.weight"] = state["model.shared.weight"]
    if shared:
        state["model.decoder.embed_tokens.weight"] = state["model.shared.weight"]
    else:  # separate vocabularies: Marian's own encoder and decoder embeddings, no `shared`
        del state["model.shared.weight"]
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.decoder.embed_tokens.weight"]
    bias = state.pop("lm_head.bias", None)  # Marian's final_logits_bias (a converted OPUS-MT model's)
    missing, unexpected = marian.load_state_dict(state, strict=False)
    if unexpected or set(missing) - MARIAN_ONLY_PARAMETERS:
        raise RuntimeError(f"export_marian: state dicts differ (missing {missing}, unexpected {unexpected}).")
    if bias is None:
        marian.final_logits_bias.zero_()
    else:
        marian.final_logits_bias.copy_(bias[None])  # (1, V)
    if config.tie_word_embeddings:
        marian.tie_weights()
    marian.generation_config = copy.deepcopy(model.generation_config)
    marian.train(model.training)
    return marian


def write_marian(model: nn.Module, output_dir: Path, quantization: str | None) -> None:
    """Save ``model`` as a `MarianMTModel` folder in the existing ``output_dir`` (float32, or ``bfloat16``)."""
    marian = export_marian(model)
    if quantization == "bfloat16":
        marian = marian.to(torch.bfloat16)
    marian.save_pretrained(output_dir)
