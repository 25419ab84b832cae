"""Warm start: a model with new mechanisms, or more layers, initialised from a trained model without them.

dou2018 §4.1: "The parameters of the proposed models were initialized by the pre-trained model." `warm_start` does
that for any Transformer variant of this package: it builds the new model, copies every weight of the trained one
(same names, same shapes — the one implementation keeps the backbone's names whatever the switches), and leaves the
new modules (aggregation nodes, linear combinations, multi-layer attentions, ADMIN ω, …) at their initialisation.
A linear-aggregation model warm-started this way computes exactly what the trained vanilla model does
(docs/dou2018.md, which also gives every mechanism's measured change of function at the warm start).

A model may also start deeper than the trained one (`DEEPENING_METHODS`; docs/public-checkpoints.md, "Deepening a
pretrained model"):

* ``"grow"`` — depth growing (Wu et al. 2019, "Depth Growing for Neural Machine Translation", ACL): the trained L
  layers become layers 1..L of each stack, layers L+1..L' are new (initialised), and the trained ones may be held
  while the new ones learn (``deepnmt train --warm_start_hold_pretrained_steps``), as Wu et al. train in two stages;
* ``"stack"`` — shallow-to-deep stacking (Li et al. 2020, "Shallow-to-Deep Training for Neural Machine
  Translation", EMNLP; their SDT-Training code): the new top layers are copies of the trained stack's top layers, in
  order (6 → 12 copies layers 1..6 onto 7..12), so every layer starts trained.

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
    "decoder_start_token_id", "position_encoding", "position_offset", "output_bias", "share_encoder_decoder_embeddings",
    "decoder_vocab_size",
)
# The backbone fields that fix the weights' shapes and what they compute: a warm-started model keeps the trained
# model's (the others — dropouts, label smoothing, init — are regularisation, which a fine-tuning run may change).
SHAPE_FIELDS: tuple[str, ...] = tuple(field for field in BACKBONE_FIELDS if field not in (
    "dropout", "attention_dropout", "activation_dropout", "init_std", "label_smoothing", "encoder_layers",
    "decoder_layers"))
DEEPENING_METHODS: tuple[str, ...] = ("copy", "grow", "stack")


def warm_start(
    source: str | os.PathLike | PreTrainedModel,
    config: DeepTransformerConfig | None = None,
    model_type: str = "deep_representation_transformer",
    method: str = "copy",
    **overrides: Any,
) -> PreTrainedModel:
    """A new model whose shared weights are copied from the trained ``source`` (a model or a saved folder).

    Args:
        source: the trained model (e.g. a vanilla ``deep_transformer``, or a converted OPUS-MT model).
        config: the new model's complete config; if omitted, it is ``model_type``'s defaults with the source's
            `BACKBONE_FIELDS` and then ``overrides`` (e.g. ``encoder_layer_aggregation="linear"``).
        model_type: the new model's type when ``config`` is omitted (default: dou2018's
            ``deep_representation_transformer``).
        method: ``"copy"`` (same layers), or, for a config with more encoder and/or decoder layers than the source,
            ``"grow"`` (Wu et al. 2019: new top layers initialised) or ``"stack"`` (Li et al. 2020: new top layers
            copied from the trained top layers); module docstring.

    The new model's ``warm_start_new_parameters`` holds the names of the parameters not copied from ``source``.

    Raises one `ValueError` naming the weight when a trained weight has no place in the new model (it would be
    lost) or a different shape, and naming the field when the layer counts do not fit the method.
    """
    if method not in DEEPENING_METHODS:
        raise UserInputError(f"warm_start: `method` = {method!r} is not allowed; use one of {list(DEEPENING_METHODS)}.")
    if not isinstance(source, PreTrainedModel):
        source = AutoModelForSeq2SeqLM.from_pretrained(source)
    if config is None:
        fields = {key: getattr(source.config, key) for key in BACKBONE_FIELDS if hasattr(source.config, key)}
        fields.update(overrides)
        config = AutoConfig.for_model(model_type, **fields)
    elif overrides:
        raise UserInputError("warm_start: pass either a complete `config` or field `overrides`, not both.")
    source_state = deepened_state(source.state_dict(), source.config, config, method)
    admin_from_trained = (getattr(config, "residual_scaling", "none") == "admin"
                          and getattr(source.config, "residual_scaling", "none") != "admin")
    if admin_from_trained and config.admin_init == "closed_form":
        raise UserInputError("warm_start: `admin_init` = 'closed_form' is not allowed from a trained model: ADMIN's ω "
                             "(liu2020 §3) is derived from a fresh initialisation's output variances and would change "
                             "what the trained layers compute; use admin_init='profiling', which a warm start leaves "
                             "at ω = 1 (docs/public-checkpoints.md).")
    target = AutoModelForSeq2SeqLM.from_config(config)
    target_state = target.state_dict()
    copied = {}
    for name, tensor in source_state.items():
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
    if admin_from_trained:
        # ω = 1 everywhere: LN(1 · x + f(x)) is the trained post-LN network itself. Profiling would set ω from the
        # variances of a fresh initialisation, which a trained model no longer has, and change its function; the
        # model is marked profiled so that training keeps ω = 1 and learns it (docs/public-checkpoints.md).
        target.config.admin_profiled = True
    # The parameters left at their initialisation (tied weights appear once, under the name named_parameters uses).
    target.warm_start_new_parameters = tuple(name for name, _ in target.named_parameters() if name not in copied)
    target.generation_config = source.generation_config
    target.train(source.training)
    return target


def deepened_state(state: dict[str, torch.Tensor], source: Any, config: Any, method: str) -> dict[str, torch.Tensor]:
    """The trained ``state`` laid out for ``config``'s layer counts: unchanged for ``"copy"`` (the counts must be
    the source's), the trained layers at the bottom for ``"grow"`` (the new ones left out, so they keep their
    initialisation), and for ``"stack"`` the new top layers as copies of the trained top layers in order (layer
    L + j takes layer L − k + j of the trained L, k = L' − L; k > L repeats the stack)."""
    deepened = dict(state)
    for stack in ("encoder", "decoder"):
        trained, wanted = getattr(source, f"{stack}_layers"), getattr(config, f"{stack}_layers")
        if wanted == trained:
            continue
        if method == "copy" or wanted < trained:
            allowed = "the same number" if method == "copy" else f"at least {trained}"
            raise UserInputError(f"warm_start: `{stack}_layers` = {wanted} is not allowed with method {method!r} from a "
                                 f"model of {trained} {stack} layers; use {allowed} (or method 'grow' / 'stack' to "
                                 "start deeper).")
        if method == "stack":
            added = wanted - trained
            # Li et al. 2020: new layer L + j (j = 0 … k−1) is a copy of trained layer L − k + j; k > L repeats the stack
            copy_of = {new: (new - trained) % trained + max(0, trained - added) for new in range(trained, wanted)}
            prefix = f"model.{stack}.layers."
            for name, tensor in state.items():
                if name.startswith(prefix):
                    index, rest = name[len(prefix):].split(".", 1)
                    for new, copied in copy_of.items():
                        if copied == int(index):
                            deepened[f"{prefix}{new}.{rest}"] = tensor.clone()
    return deepened
