"""What transformers' `PreTrainedModel` asks of the DeepTransformer models beyond their equations: the initial
weights of the standard modules (tensor2tensor's choices, no paper's equation; liu2020's ω is set with the layers in
modeling_deep_transformer.py), the base model's embedding and stack accessors, and its seq2seq output assembled from
the encoder's and the decoder's.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn import init
from transformers.modeling_outputs import BaseModelOutput, BaseModelOutputWithPastAndCrossAttentions, Seq2SeqModelOutput

from .aggregation import LinearCombination
from .modeling_common import PositionEncoding, bind_shared_embedding, cache_field, output_cache


class DeepTransformerCapabilities:
    """What transformers reads off the DeepTransformer models' classes (put before `PreTrainedModel`), and the
    config's re-validation at construction."""

    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    # Kernels of transformers' AttentionInterface, dispatched at call time by `interface_attention`.
    _supports_flex_attn = True
    _supports_flash_attn = True
    _no_split_modules = ["DeepTransformerEncoderLayer", "DeepTransformerDecoderLayer"]
    # forward divides its training objective by `num_items_in_batch` (the optimizer step's target tokens) when
    # transformers' Trainer passes it, so the Trainer must not divide by the accumulation steps again.
    accepts_loss_kwargs = True

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        config.check_fields()  # a config mutated after construction is re-validated here
        super().__init__(config, *args, **kwargs)


def init_standard_weights(module: nn.Module, config: Any, lm_head: nn.Module | None) -> None:
    """Xavier-uniform linear weights (gain 1) and zero biases, N(0, init_std) token embeddings and output
    projection ``lm_head``, unit LayerNorms. (fairseq's Transformer differs in one place: it gives q/k/v projections
    gain 1/√2; we use gain 1 everywhere, as tensor2tensor does.) Uses `torch.nn.init`, which transformers guards for
    loaded weights; call it under `torch.no_grad`."""
    std = config.init_std if config.init_std is not None else config.d_model ** -0.5
    if isinstance(module, nn.Linear):
        if module is lm_head:
            init.normal_(module.weight, mean=0.0, std=std)
        else:
            init.xavier_uniform_(module.weight)
        if module.bias is not None:
            init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        init.normal_(module.weight, mean=0.0, std=std)
        if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
            module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)
    elif isinstance(module, LinearCombination) and not getattr(module.weight, "_is_hf_initialized", False):
        module.reset_to_newest()  # docs/dou2018.md: a linear-aggregation stack starts as the vanilla one
    elif isinstance(module, PositionEncoding) and module.weight is not None:
        init.normal_(module.weight, mean=0.0, std=config.d_model ** -0.5)  # fairseq's learned positions


class SharedEmbeddingAccessors:
    """`DeepTransformerModel`'s accessors: the shared token embedding ``shared``, the ``encoder`` and ``decoder``."""

    config: Any
    shared: nn.Embedding
    encoder: nn.Module
    decoder: nn.Module

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        """The source embedding (and the target one too, when the vocabulary is shared), as Marian's."""
        self.shared = value
        bind_shared_embedding(self.encoder, value)
        if self.config.share_encoder_decoder_embeddings:
            bind_shared_embedding(self.decoder, value)

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        return self.encoder

    def get_decoder(self) -> nn.Module:
        return self.decoder


class LMEmbeddingAccessors:
    """`DeepTransformerForConditionalGeneration`'s input embedding: its base model's ``model.shared``."""

    model: nn.Module

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.shared

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)


def seq2seq_model_output(encoder_outputs: BaseModelOutput, decoder_outputs: BaseModelOutputWithPastAndCrossAttentions,
                         return_dict: bool | None) -> Seq2SeqModelOutput | tuple:
    """The base model's output: the decoder's states, cache and attentions, and the encoder's."""
    output = Seq2SeqModelOutput(
        last_hidden_state=decoder_outputs.last_hidden_state,
        **cache_field(output_cache(decoder_outputs)),
        decoder_hidden_states=decoder_outputs.hidden_states,
        decoder_attentions=decoder_outputs.attentions,
        cross_attentions=decoder_outputs.cross_attentions,
        encoder_last_hidden_state=encoder_outputs.last_hidden_state,
        encoder_hidden_states=encoder_outputs.hidden_states,
        encoder_attentions=encoder_outputs.attentions,
    )
    return output if return_dict is not False else output.to_tuple()
