"""Warm start: a model with new mechanisms, initialised from a trained model without them.

dou2018 §4.1: "The parameters of the proposed models were initialized by the pre-trained model." `warm_start` does
that for any Transformer variant of this package: it builds the new model, copies every weight of the trained one
(same names, same shapes — the one implementation keeps the backbone's names whatever the switches), and leaves the
new modules (aggregation nodes, linear combinations, multi-layer attentions, ADMIN ω, …) at their initialisation.
A linear-aggregation model warm-started this way computes exactly what the trained vanilla model does
(docs/dou2018.md, which also gives every mechanism's measured change of function at the warm start).

The returned model lists the parameters that did not come from the trained model in ``warm_start_new_parameters``:
`hf_deepnmt_training.trainer.DeepNMTTrainer` can train them with a scaled learning rate or hold them for the first steps
(``deepnmt train --warm_start_new_lr_scale / --warm_start_freeze_steps``; why, in docs/dou2018.md "Warm start").
"""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, PreTrainedModel

from .configuration_deep_transformer import DeepTransformerConfig
from .errors import UserInputError

# The fields a warm-started model takes over from the trained one: its shape, tokens and regularisation. The
# method switches (aggregation, multi-layer attention, diversity, CAD, CRT, ADMIN) come from the new model type's
# defaults and the overrides.
BACKBONE_FIELDS: tuple[str, ...] = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "dropout", "attention_dropout", "activation_dropout",
    "max_position_embeddings", "scale_embedding", "layer_norm_position", "layer_norm_eps", "tie_word_embeddings",
    "init_std", "label_smoothing", "pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id",
    "decoder_start_token_id",
)


def warm_start(
    source: str | os.PathLike | PreTrainedModel,
    config: DeepTransformerConfig | None = None,
    model_type: str = "deep_representation_transformer",
    **overrides: Any,
) -> PreTrainedModel:
    """A new model whose shared weights are copied from the trained ``source`` (a model or a saved folder).

    Args:
        source: the trained model (e.g. a vanilla ``deep_transformer``).
        config: the new model's complete config; if omitted, it is ``model_type``'s defaults with the source's
            `BACKBONE_FIELDS` and then ``overrides`` (e.g. ``encoder_layer_aggregation="linear"``).
        model_type: the new model's type when ``config`` is omitted (default: dou2018's
            ``deep_representation_transformer``).

    The new model's ``warm_start_new_parameters`` holds the names of the parameters not copied from ``source``.

    Raises one `ValueError` naming the weight when a trained weight has no place in the new model (it would be
    lost) or a different shape.
    """
    if not isinstance(source, PreTrainedModel):
        source = AutoModelForSeq2SeqLM.from_pretrained(source)
    if config is None:
        fields = {key: getattr(source.config, key) for key in BACKBONE_FIELDS if hasattr(source.config, key)}
        fields.update(overrides)
        config = AutoConfig.for_model(model_type, **fields)
    elif overrides:
        raise UserInputError("warm_start: pass either a complete `config` or field `overrides`, not both.")
    target = AutoModelForSeq2SeqLM.from_config(config)
    target_state = target.state_dict()
    copied = {}
    for name, tensor in source.state_dict().items():
        if name not in target_state:
            raise UserInputError(f"warm_start: the trained weight `{name}` has no place in the new "
                             f"{config.model_type} model, so it would be lost; the two configs differ in more than "
                             "the added mechanisms.")
        if target_state[name].shape != tensor.shape:
            raise UserInputError(f"warm_start: the trained weight `{name}` has shape {tuple(tensor.shape)}, the new model's "
                             f"{tuple(target_state[name].shape)}; keep the trained model's dimensions.")
        copied[name] = tensor
    with torch.no_grad():
        target.load_state_dict(copied, strict=False)
    target.tie_weights()
    # The parameters left at their initialisation (tied weights appear once, under the name named_parameters uses).
    target.warm_start_new_parameters = tuple(name for name, _ in target.named_parameters() if name not in copied)
    target.generation_config = source.generation_config
    target.train(source.training)
    return target
