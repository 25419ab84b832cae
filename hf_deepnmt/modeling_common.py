"""What every model family of the package shares: sinusoidal positions, input checks, the seq2seq output with loss
components, Hub-ready saving (auto_map, the translation pipeline, FSDP2's generated classes), generation plumbing,
and unwrapping a model from DDP / torch.compile wrappers.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

import copy
import math
import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput, Seq2SeqModelOutput

from .pipeline_translation import TRANSLATION_PIPELINE_SPEC
from .errors import UserInputError
from .generation_common import (  # noqa: F401  (re-exported: the models and tests import them from here)
    CACHE_NAME,
    LENGTH_PENALTY_FORMS,
    GNMTLengthPenalty,
    cache_field,
    merge_cache_arguments,
    output_cache,
)


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DDP / DataParallel (``.module``) and torch.compile (``._orig_mod``) wrappers."""
    while True:
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif hasattr(model, "module") and isinstance(model.module, nn.Module):
            model = model.module
        else:
            return model


def sinusoidal_positions(start: int | torch.Tensor, length: int, dim: int, device: torch.device,
                         dtype: torch.dtype) -> torch.Tensor:
    """Sinusoidal position encodings for positions ``start .. start+length-1``, shape ``(length, dim)``; ``start``
    may be a 0-d integer tensor (an exported graph's position input).

    Vaswani et al. (2017) §3.5: PE(pos, 2i) = sin(pos / 10000^{2i/d}), PE(pos, 2i+1) = cos(pos / 10000^{2i/d}).
    Layout follows Marian (all sines, then all cosines), so a model without deep-NMT features exports exactly to
    `transformers.MarianMTModel`. Computed in float64 and cast, as Marian's table is.
    """
    positions = torch.arange(length, device=device, dtype=torch.float64) + start  # (T,), exact integers in float64
    return sinusoidal_encodings(positions, dim, dtype)  # (T, d)


def sinusoidal_encodings(positions: torch.Tensor, dim: int, dtype: torch.dtype,
                         frequencies: str = "sinusoidal") -> torch.Tensor:
    """`sinusoidal_positions`' encodings of any tensor of positions: shape ``positions.shape + (dim,)`` (a decoder
    whose rows stand at different positions, `hf_deepnmt.retiring_search.ContinuousSearch`).

    ``frequencies="sinusoidal_fairseq"``: tensor2tensor's and fairseq's frequencies, ω_i = 10000^(−i/(d/2 − 1)) for
    i < d/2 (`fairseq.modules.SinusoidalPositionalEmbedding.get_embedding`), sines then cosines as above, computed
    in float32 as fairseq computes its table, so that a converted fairseq model adds the very numbers it was
    trained with (docs/public-checkpoints.md)."""
    half = dim // 2
    if frequencies == "sinusoidal_fairseq":
        step = math.log(10000.0) / (half - 1)
        inv_freq = torch.exp(torch.arange(half, device=positions.device, dtype=torch.float32) * -step)  # (d/2,)
        angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., d/2)
        return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)  # (..., d)
    inv_freq = torch.pow(10000.0, -torch.arange(half, device=positions.device, dtype=torch.float64) * 2.0 / dim)
    angles = positions.to(torch.float64)[..., None] * inv_freq  # (..., d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)  # (..., d)


class PositionEncoding(nn.Module):
    """The positions one stack adds to its scaled token embeddings (``config.position_encoding``,
    docs/transformer.md "Positions"): sinusoids (Vaswani et al. §3.5, or fairseq's frequencies) computed on the fly,
    or a learned table ``weight`` of ``max_position_embeddings + position_offset`` rows (fairseq's
    ``LearnedPositionalEmbedding``; the first ``position_offset`` rows are never read, so row indices are fairseq's).
    Token ``t`` of a sequence stands at position ``position_offset + t``."""

    def __init__(self, kind: str, offset: int, max_positions: int, dim: int):
        super().__init__()
        self.kind, self.offset, self.dim = kind, offset, dim
        self.weight = nn.Parameter(torch.empty(max_positions + offset, dim)) if kind == "learned" else None

    def forward(self, start: int | torch.Tensor, length: int, device: torch.device, dtype: torch.dtype,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Encodings of positions ``start … start+length−1`` ``(1, T, d)``, or of ``position_ids`` ``(B, T)`` when the
        rows stand at different positions (then ``(B, T, d)``)."""
        if self.kind == "learned":
            if position_ids is None:
                position_ids = (torch.arange(length, device=device) + start)[None]  # (1, T)
            return F.embedding(position_ids + self.offset, self.weight).to(dtype)  # (B or 1, T, d)
        if position_ids is not None:
            return sinusoidal_encodings(position_ids + self.offset, self.dim, dtype, self.kind)  # (B, T, d)
        if self.kind == "sinusoidal" and self.offset == 0:
            return sinusoidal_positions(start, length, self.dim, device, dtype)[None]  # (1, T, d)
        positions = torch.arange(length, device=device, dtype=torch.float64) + start + self.offset  # (T,)
        return sinusoidal_encodings(positions, self.dim, dtype, self.kind)[None]  # (1, T, d)

    def table(self, length: int) -> torch.Tensor:
        """The encodings of the first ``length`` tokens, ``(length, d)`` float32: row t is what token t gets (an
        engine that reads a position table, CTranslate2)."""
        return self.forward(0, length, torch.device("cpu"), torch.float32)[0].detach().float().clone()


class ScaledEmbedding(nn.Embedding):
    """The shared token embedding, with its ``embed_scale`` (sqrt(d_model) when ``scale_embedding``, Vaswani et al.
    §3.4) applied in `forward`.

    Scaling inside the module makes ``get_input_embeddings()(ids)`` exactly what the stacks add positions to, so
    ``inputs_embeds=get_input_embeddings()(ids)`` and ``input_ids=ids`` give the same outputs (as BART's scaled word
    embedding does). The parameter is a plain ``weight``: tying, resizing and Marian export are unchanged.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None, embed_scale: float = 1.0):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeddings = super().forward(input_ids)
        return embeddings if self.embed_scale == 1.0 else embeddings * self.embed_scale


def bind_shared_embedding(stack: nn.Module, embedding: nn.Embedding) -> None:
    """Give a stack the shared token embedding without registering it a second time.

    A shared embedding has one owner (the Transformer's ``DeepTransformerModel.shared``, DTMT's encoder); the other
    stacks hold a plain reference so that the state dict, DDP and ZeRO see a single parameter (docs/transformer.md).
    """
    stack.__dict__["embed_tokens"] = embedding


def check_token_ids(name: str, ids: torch.Tensor | None, vocab_size: int, check_values: bool = True,
                    allow_ignore_index: bool = False) -> None:
    """One clear sentence for bad token ids (docs/training.md, "Bad input"): not an integer tensor, not 2-D, empty,
    or an id outside [0, vocab_size) (labels may also be -100). ``check_values=False`` skips the value scan (it
    synchronises a GPU), e.g. for the ids `generate` itself feeds back."""
    if ids is None:
        return
    if not isinstance(ids, torch.Tensor):
        raise UserInputError(f"`{name}` must be a torch.LongTensor of token ids (batch, length), got {type(ids).__name__}.")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise UserInputError(f"`{name}` has dtype {ids.dtype}; token ids must be integers (torch.long).")
    if ids.dim() != 2:
        raise UserInputError(f"`{name}` has shape {tuple(ids.shape)}; it must be 2-D (batch, length): for one sentence use "
                         "`ids.unsqueeze(0)`, or the tokenizer with return_tensors='pt'.")
    if ids.size(0) == 0 or ids.size(1) == 0:
        raise UserInputError(f"`{name}` has shape {tuple(ids.shape)}: an empty batch or a zero-length sequence has nothing "
                         "to translate (every tokenized sentence holds at least its </s>).")
    if check_values and not torch.compiler.is_compiling():  # a data-dependent branch would break the graph
        bad = (ids >= vocab_size) | ((ids < 0) & ~(ids == -100) if allow_ignore_index else ids < 0)
        if bool(bad.any()):
            value = int(ids[bad][0])
            allowed = f"[0, vocab_size={vocab_size})" + (" or -100 (ignored)" if allow_ignore_index else "")
            raise UserInputError(f"`{name}` holds the id {value}, which is not allowed; ids must lie in {allowed} (a "
                             "tokenizer that does not match the model?).")


def check_attention_mask(name: str, mask: torch.Tensor | None, ids_name: str, shape: tuple[int, ...]) -> None:
    """A 2-D padding mask must have the shape of its ids (4-D masks are taken as given)."""
    if mask is None or not isinstance(mask, torch.Tensor) or mask.dim() == 4:
        return
    if tuple(mask.shape) != tuple(shape):
        raise UserInputError(f"`{name}` has shape {tuple(mask.shape)} but `{ids_name}` has shape {tuple(shape)}; the mask "
                         "needs one 1/0 entry per token.")


def check_one_input(owner: str, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> None:
    """A stack embeds either token ids or given embeddings, never both, never neither."""
    if (input_ids is None) == (inputs_embeds is None):
        raise UserInputError(f"{owner}: pass exactly one of `input_ids` and `inputs_embeds`.")


def check_sequence_fits(owner: str, longest: int, max_positions: int) -> None:
    """A sequence of ``longest`` tokens must fit in the model's positions."""
    if longest > max_positions:
        raise UserInputError(
            f"{owner}: a sequence of {longest} tokens is longer than "
            f"max_position_embeddings={max_positions}; truncate the input (the tokenizer "
            "and the translation pipeline do this with truncation=True)."
        )


def check_positions_fit(owner: str, position_ids: torch.Tensor | None, shape: tuple[int, ...], past_length: int,
                        max_positions: int) -> None:
    """The positions of a pass's ``shape`` ``(B, T)`` tokens must fit in the model's: ``past_length`` … for every
    row, or ``position_ids`` ``(B, T)``, one per token."""
    if position_ids is not None:
        if tuple(position_ids.shape) != shape:
            raise UserInputError(f"`decoder_position_ids` has shape {tuple(position_ids.shape)}; it needs one "
                                 f"position per input token, {shape}.")
        longest = int(position_ids.max()) + 1 if position_ids.numel() else 0
    else:
        longest = past_length + shape[1]
    check_sequence_fits(owner, longest, max_positions)


def output_flags(config: Any, output_attentions: bool | None, output_hidden_states: bool | None) -> tuple[bool, bool]:
    """Whether a forward returns attentions and hidden states: as asked, else as the config says."""
    output_attentions = bool(output_attentions if output_attentions is not None else config.output_attentions)
    output_hidden_states = bool(
        output_hidden_states if output_hidden_states is not None else config.output_hidden_states
    )
    return output_attentions, output_hidden_states


def as_encoder_output(encoder_outputs: Any) -> BaseModelOutput:
    """Encoder outputs given as a tuple ``(last_hidden_state[, hidden_states[, attentions]])`` as a
    `BaseModelOutput` (one already is one)."""
    if isinstance(encoder_outputs, BaseModelOutput):
        return encoder_outputs
    return BaseModelOutput(
        last_hidden_state=encoder_outputs[0],
        hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
        attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
    )


def check_generation_arguments(kwargs: dict[str, Any]) -> None:
    """``num_beams``, ``num_return_sequences``, ``max_new_tokens`` and ``max_length`` (given directly or through
    ``generation_config``) must be integers ≥ 1."""
    config = kwargs.get("generation_config")
    for name in ("num_beams", "num_return_sequences", "max_new_tokens", "max_length"):
        value = kwargs.get(name, getattr(config, name, None) if config is not None else None)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise UserInputError(f"generate: `{name}` = {value!r} is not allowed; it must be an integer ≥ 1.")


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder inputs: ``<s> y_1 … y_{n-1}`` from labels ``y_1 … y_n`` (-100 becomes pad)."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


@dataclass
class DeepTransformerSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus, with labels, every term of the loss (in evaluation mode only ``nll``).

    Args:
        loss_components (`dict[str, torch.Tensor]`, *optional*):
            Detached per-unit mean of each term of this batch: ``nll`` (unsmoothed), ``smoothed_nll`` and one entry
            per auxiliary term switched on (``ddr`` per target token, ``ald`` per sentence, ``div_encoder`` per source
            token and ``div_decoder`` per target token, each L_div itself, not its negation), unweighted.
        loss_component_counts (`dict[str, torch.Tensor]`, *optional*):
            How many units (target tokens, source tokens or sentences) each component averages over in this batch.
    """

    loss_components: dict[str, torch.Tensor] | None = None
    loss_component_counts: dict[str, torch.Tensor] | None = None


def seq2seq_lm_output(outputs: Seq2SeqModelOutput, logits: torch.Tensor, loss: torch.Tensor | None,
                      components: dict[str, torch.Tensor] | None, counts: dict[str, torch.Tensor] | None,
                      return_dict: bool | None) -> DeepTransformerSeq2SeqLMOutput | tuple:
    """A base model's states and the logits projected from them, as transformers' seq2seq LM output with the loss
    and its components."""
    output = DeepTransformerSeq2SeqLMOutput(
        loss=loss,
        logits=logits,
        **cache_field(output_cache(outputs)),
        decoder_hidden_states=outputs.decoder_hidden_states,
        decoder_attentions=outputs.decoder_attentions,
        cross_attentions=outputs.cross_attentions,
        encoder_last_hidden_state=outputs.encoder_last_hidden_state,
        encoder_hidden_states=outputs.encoder_hidden_states,
        encoder_attentions=outputs.encoder_attentions,
        loss_components=components,
        loss_component_counts=counts,
    )
    return output if return_dict is not False else output.to_tuple()


def _unsharded_class(cls: type) -> type:
    """``cls`` itself, or for the class FSDP2's `fully_shard` generates (``FSDP<Name>``), the model class it wraps."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2 cannot have wrapped it
        return cls
    return next(base for base in cls.__mro__ if not issubclass(base, FSDPModule))


class HubReadyMixin:
    """`save_pretrained` that makes the folder self-sufficient on the Hub: the `translation` pipeline
    (``custom_pipelines``) and ``auto_map`` entries for both Auto classes, and ``handler.py`` with
    ``ort_generation.py`` for Inference Endpoints (transformers copies them as same-folder imports of the modeling
    files, which import the handler). Put before `PreTrainedModel`.

    The ``custom_pipelines`` entry is written into the saved config.json only; the live config is left as it was,
    because in a process that imported hf_deepnmt the package's configs never carry it (see
    ``configuration_common.without_pipelines_served_in_process``), so a reloaded config equals the saved
    model's."""

    base_model_class_name: str
    seq2seq_class_name: str

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        wrapper, defining = type(self), _unsharded_class(type(self))
        if defining is not wrapper:
            # FSDP2 (`fully_shard`) gave this instance a generated subclass, `FSDP<Name>`, defined in torch: saved as
            # is, the folder's `auto_map` and code files would be torch's. Save it as the class it wraps.
            self.__class__ = defining
            try:
                return self.save_pretrained(save_directory, *args, **kwargs)
            finally:
                self.__class__ = wrapper
        if self._auto_class is None:
            super().save_pretrained(save_directory, *args, **kwargs)
            return
        module = type(self).__module__.rsplit(".", 1)[-1]
        self.config.auto_map = {
            **(getattr(self.config, "auto_map", None) or {}),
            "AutoModel": f"{module}.{self.base_model_class_name}",
            "AutoModelForSeq2SeqLM": f"{module}.{self.seq2seq_class_name}",
        }
        had_pipelines = "custom_pipelines" in self.config.__dict__
        previous = self.config.__dict__.get("custom_pipelines")
        self.config.custom_pipelines = {"translation": dict(TRANSLATION_PIPELINE_SPEC)}
        try:
            super().save_pretrained(save_directory, *args, **kwargs)
        finally:
            if had_pipelines:
                self.config.custom_pipelines = previous
            else:
                del self.config.custom_pipelines


class TranslationGenerationMixin:
    """What every seq2seq class of the package shares on top of its base model ``self.model`` and ``lm_head``:
    the output embedding accessors, the encoder/decoder, labels → decoder inputs, and `generate` with checked
    arguments. Put before the `PreTrainedModel` subclass."""

    # Its forward computes the full training objective of its config (`hf_deepnmt.losses.compute_losses` calls it so;
    # any other seq2seq model gets the label-smoothed NLL of its logits, `losses.stock_model_objective`).
    computes_translation_objective: bool = True

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, new_embeddings: nn.Linear) -> None:
        self.lm_head = new_embeddings

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        return self.model.encoder

    def get_decoder(self) -> nn.Module:
        return self.model.decoder

    def set_translation_generation_defaults(self) -> None:
        """MT-sized `generate` defaults (call after ``post_init``; a saved generation_config.json overrides them):
        beam 4, up to 256 new tokens instead of transformers' 20, and a sentence's beam search ends once
        ``num_beams`` hypotheses have finished (``early_stopping=True``: the rule of fairseq, Marian and CTranslate2,
        so that `generate`, the ONNX export and the CTranslate2 export give the same beams; docs/fast-inference.md,
        "Same output from every engine")."""
        self.generation_config.max_new_tokens = min(256, self.config.max_position_embeddings - 1)
        self.generation_config.num_beams = 4
        self.generation_config.early_stopping = True

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """`GenerationMixin.prepare_inputs_for_generation`, continuing from a returned cache: when `generate` is given
        the full ``decoder_input_ids`` of an earlier call together with that call's cache (``cache`` /
        ``past_key_values``), only the tokens the cache has not consumed are fed. transformers slices them itself
        only for decoder-only models or when a ``decoder_attention_mask`` marks the full length; without this, the
        decoder would consume the cached tokens a second time (wrong positions, a Transformer cache holding them
        twice, a DTMT state advanced twice)."""
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if isinstance(cache, Cache) and kwargs.get("next_sequence_length") is None:
            seen = cache.get_seq_length()
            if 0 < seen < input_ids.size(1):
                input_ids = input_ids[:, seen:]  # (B, T - seen): the tokens not yet in the cache
        return super().prepare_inputs_for_generation(input_ids, *args, **kwargs)

    # Whether `generate` runs `hf_deepnmt.retiring_search` where that search gives transformers' own result (set it
    # to False on an instance to run transformers' loop; docs/transformer.md, "generate").
    generate_by_retiring_search: bool = True

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """`GenerationMixin.generate`; an explicit ``max_length`` replaces the default ``max_new_tokens`` instead
        of being overridden by it, and bad lengths or beam counts get one clear sentence. A call that asks for
        sequences only, with settings `hf_deepnmt.retiring_search` reproduces, runs that search (`_retiring_call`):
        the same tensor, each sentence leaving the batch once its result is final."""
        check_generation_arguments(kwargs)
        if kwargs.get("max_length") is not None and "max_new_tokens" not in kwargs:
            kwargs["max_new_tokens"] = None
        form = kwargs.get("length_penalty_form") or getattr(self.config, "length_penalty_form", None) or "power"
        if form not in LENGTH_PENALTY_FORMS:
            raise UserInputError(f"`length_penalty_form` = {form!r} is not allowed; use 'power' (|Y| ** α, "
                                 "transformers') or 'gnmt' (((5 + |Y|) / 6) ** α).")
        found = self._retiring_call(args, kwargs)
        if found is not None:
            return found
        kwargs.pop("length_penalty_form", None)
        self._add_generation_cache(kwargs)
        settings = kwargs.get("generation_config") or self.generation_config
        if form == "gnmt":
            alpha = kwargs.get("length_penalty", settings.length_penalty)
            penalty = GNMTLengthPenalty(1.0 if alpha is None else alpha)
            if kwargs.get("generation_config") is not None and "length_penalty" not in kwargs:
                # inside the passed config: transformers deprecates a config together with generation arguments
                kwargs["generation_config"] = copy.deepcopy(kwargs["generation_config"])
                kwargs["generation_config"].length_penalty = penalty
            else:
                kwargs["length_penalty"] = penalty
        return super().generate(*args, **kwargs)

    def _add_generation_cache(self, kwargs: dict[str, Any]) -> None:
        """Where a family starts transformers' search from a cache of its own, it puts it in ``kwargs`` here."""

    # transformers' `generate` options that a call may pass and still run the retiring search, when they ask for
    # nothing (None, False, an empty list).
    _NEUTRAL_CALL_OPTIONS = ("logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn", "synced_gpus",
                             "assistant_model", "streamer", "negative_prompt_ids", "negative_prompt_attention_mask",
                             "custom_generate", "generation_config")

    def _retiring_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
        """``generate``'s output computed by `hf_deepnmt.retiring_search.retiring_generate` (one budget for every
        sentence), or None where transformers' loop must run: a call with a positional argument other than the
        inputs, other model inputs (``decoder_input_ids``, ``encoder_outputs``, a cache, no ``attention_mask``), a
        passed ``generation_config``, a call option that asks for something, a setting the search does not reproduce
        (`retiring_search.unsupported`: sampling, logits processors, scores or dict outputs, ...), no explicit length
        (transformers' default of 20 new tokens has rules of its own), ``use_cache=False``, a ``num_return_sequences``
        transformers would refuse, a model in training mode, or tracing (``torch.compile``).

        The output is transformers': ``(B · num_return_sequences, T)``, the decoder start token first, the n-best
        rows of a sentence consecutive, shorter rows filled as ``generate`` fills them (greedy: the pad token after
        ``</s>``; beam search: the pad token, or ``</s>`` when the pad id is 0) up to the longest; the search gives
        each sentence ``generate``'s sequences (tests/test_retiring_search.py compares the tensors)."""
        if not self.generate_by_retiring_search or self.training or torch.compiler.is_compiling():
            return None  # in training mode transformers' loop draws dropout as it always did
        call = dict(kwargs)
        if args:
            if len(args) > 1 or "input_ids" in call or "inputs" in call:
                return None
            call["input_ids"] = args[0]
        call.pop("labels", None)  # Seq2SeqTrainer's evaluation passes its batch's labels along; no search reads them
        input_ids = call.pop("inputs", None)
        input_ids = call.pop("input_ids", None) if input_ids is None else input_ids
        attention_mask = call.pop("attention_mask", None)
        if not isinstance(input_ids, torch.Tensor) or not isinstance(attention_mask, torch.Tensor) \
                or input_ids.dim() != 2 or attention_mask.shape != input_ids.shape or input_ids.size(0) == 0:
            return None
        for name in self._NEUTRAL_CALL_OPTIONS:
            if name in call:
                value = call.pop(name)
                if value is not None and value is not False and not (isinstance(value, (list, tuple)) and not value):
                    return None
        from .retiring_search import retiring_generate, search_settings, unsupported

        if unsupported(self, call) is not None:
            return None
        merged = {**self.generation_config.to_dict(), **call}
        if merged.get("use_cache") is False or merged.get("cache_implementation") is not None:
            return None
        if merged.get("max_new_tokens") is not None:
            budget = int(merged["max_new_tokens"])
        elif call.get("max_length") is not None:
            budget = int(call["max_length"]) - 1  # max_length counts the decoder start token
        else:
            return None
        settings = search_settings(self, call)
        if budget < 1 or settings.num_return_sequences > settings.num_beams:
            return None  # transformers' own error or warning
        found = retiring_generate(self, input_ids, attention_mask, [budget] * input_ids.size(0), settings)
        rows = [row for hypotheses in found for row in hypotheses.sequences]  # (B · n) rows of their own lengths
        width = max(row.numel() for row in rows)
        fill = settings.pad_token_id
        if settings.num_beams > 1 and not settings.pad_token_id and settings.eos_token_ids:
            fill = settings.eos_token_ids[0]  # transformers' beam search fills with </s> when the pad id is 0
        output = rows[0].new_full((len(rows), width), fill)  # (B · n, T)
        for index, row in enumerate(rows):
            output[index, :row.numel()] = row
        return output

