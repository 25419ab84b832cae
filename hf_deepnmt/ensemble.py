"""`EnsembleForConditionalGeneration`: several translation models of one vocabulary decoding as one model.

An ensemble is a transformers model in its own right: ``generate`` — transformers' own greedy search, beam search,
n-best lists, sampling, logits processors and stopping criteria — runs on it unchanged. Nothing of the search is
written here; the class answers ``forward`` with the members' combined next-token distribution:

* each member keeps **its own encoder output and its own decoding cache** (a Transformer's `EncoderDecoderCache`, a
  DTMT's `DTMTCache`, any other member's cache), gathered in one `EnsembleCache` that ``generate`` threads from step
  to step, reorders for beam search (each member's own ``_reorder_cache``), expands and selects for n-best and
  contrastive search; members of any family (a deep Transformer and a DTMT) combine, since only their
  distributions over the shared vocabulary meet;
* **combination** (docs/distillation.md, "Ensembles"): ``"mean"`` (default) is fairseq's — the log of the weighted
  mean of the members' probabilities, log Σ_i w_i p_i(y) computed as ``logsumexp(log p_i + log w_i)`` with the
  weights normalised to sum 1; ``"log_linear"`` is Marian's weighted sum of log-probabilities Σ_i w_i log p_i(y)
  (weights as given), renormalised over the vocabulary at each step, since transformers' beam search normalises the
  scores of every step (Marian adds the unnormalised sum to its beam scores; the choice of a greedy step is the same,
  beam scores differ by the per-step normaliser);
* an ensemble of **one** model returns that model's own logits, so its outputs (greedy and beam sequences and
  scores, n-best lists, samples for a seed) are exactly the model's.

Members must share one vocabulary: equal ``vocab_size`` and special-token ids here, equal tokens when built from
folders (`load_ensemble` compares their tokenizers), and the same recorded language pair where they record one
(`recorded_language_pairs`); anything else is refused with one `UserInputError` sentence. The ensemble is not saved
as one folder: save the members (``save_pretrained`` says so).

Not copied next to the weights (a saved model's code never needs it): it imports torch, transformers and this
package's modules.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .errors import UserInputError
from .modeling_common import (
    TranslationGenerationMixin,
    cache_field,
    check_token_ids,
    merge_cache_arguments,
    output_cache,
    unwrap_model,
)
from .pipeline_translation import record_language_pair, recorded_language_pairs

COMBINATIONS: tuple[str, ...] = ("mean", "log_linear")
"""``mean``: log Σ w_i p_i (fairseq, default); ``log_linear``: Σ w_i log p_i renormalised (Marian's sum)."""

SPECIAL_TOKEN_FIELDS: tuple[str, ...] = ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id",
                                         "decoder_start_token_id")
MEMBER_STATES = "member_{}"  # the key of member i's encoder states in the ensemble's encoder output


class EnsembleConfig(PretrainedConfig):
    """What ``generate`` needs to know of an ensemble: the shared vocabulary and special tokens, the shortest
    position limit of the members, and (for the record) the members' types, the weights and the combination. Built
    by `EnsembleForConditionalGeneration`; never saved."""

    model_type = "deepnmt_ensemble"

    def __init__(self, vocab_size: int = 0, max_position_embeddings: int = 1024,
                 member_types: Sequence[str] = (), weights: Sequence[float] = (), combination: str = "mean",
                 **kwargs: Any) -> None:
        kwargs.setdefault("is_encoder_decoder", True)
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.member_types = list(member_types)
        self.weights = [float(weight) for weight in weights]
        self.combination = combination


class EnsembleCache(Cache):
    """The members' decoding caches, one per member (``None`` before a member's first step), moved together.

    ``generate`` only ever sees this object: the length it reports is the first member's (every member consumed the
    same tokens), and every row operation — beam search's reorder, n-best's repeat, a batch selection, a crop — is
    applied to each member's cache. A member whose cache cannot do one (a DTMT state cannot be cropped) refuses it
    with its own sentence.
    """

    is_compileable = False

    def __init__(self, members: Sequence[Cache | None]) -> None:
        super().__init__(layers=[])
        self.members = list(members)

    def __repr__(self) -> str:
        return f"EnsembleCache({', '.join(repr(cache) for cache in self.members)})"

    def __len__(self) -> int:
        return max((len(cache) for cache in self.members if cache is not None), default=0)

    def _each(self) -> list[Cache]:
        return [cache for cache in self.members if cache is not None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        first = self.members[0] if self.members else None
        return first.get_seq_length() if first is not None else 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def is_initialized(self) -> bool:
        return bool(self.members) and all(cache is not None for cache in self.members)

    @property
    def is_croppable(self) -> bool:
        return all(getattr(cache, "is_croppable", False) for cache in self._each())

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        for cache in self._each():
            cache.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        for cache in self._each():
            cache.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for cache in self._each():
            cache.batch_select_indices(indices)

    def crop(self, tokens_to_remove: int) -> None:
        for cache in self._each():
            cache.crop(tokens_to_remove)

    def reset(self) -> None:
        for cache in self._each():
            cache.reset()


class EnsembleEncoder(nn.Module):
    """`EnsembleForConditionalGeneration.get_encoder()`: every member's encoder on the same source. The output's
    ``last_hidden_state`` is the first member's; member i's states are the extra key ``member_<i>``, so that
    ``generate`` expands each of them for beams and return sequences (it expands every tensor of the encoder
    output). Members' widths differ (a DTMT's annotations are 2·d wide), which is why they are not stacked."""

    main_input_name = "input_ids"

    def __init__(self, owner: EnsembleForConditionalGeneration) -> None:
        super().__init__()
        self.__dict__["owner"] = owner  # not a submodule: the members belong to the ensemble

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> BaseModelOutput:
        if input_ids is None or inputs_embeds is not None:
            raise UserInputError("an ensemble encodes `input_ids` only: its members embed tokens each in their own "
                                 "way, so `inputs_embeds` has no meaning for it.")
        states = [member.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                                       return_dict=True).last_hidden_state for member in self.owner.members]
        output = BaseModelOutput(last_hidden_state=states[0])
        for index, member_states in enumerate(states):
            output[MEMBER_STATES.format(index)] = member_states  # (B, S, d_i)
        return output


class EnsembleForConditionalGeneration(TranslationGenerationMixin, PreTrainedModel, GenerationMixin):
    """N ≥ 1 translation models that share one vocabulary, decoding as one model with transformers' ``generate``.

    Args:
        models: the members, any seq2seq models of this package (Transformer variants and DTMT mix), on one device.
        weights: one positive weight per member (default: equal). With ``combination="mean"`` they are normalised
            to sum 1 (the mixture weights of fairseq's average); with ``"log_linear"`` they multiply the
            log-probabilities as given (Marian's ``--weights``).
        combination: ``"mean"`` (log of the weighted mean of the probabilities, fairseq; default) or
            ``"log_linear"`` (the weighted sum of log-probabilities, Marian's, renormalised at each step).

    ``generate`` takes every argument a member's takes; its defaults (beam size, length penalty, early stopping,
    length limit) are the first member's generation config, capped by the shortest position limit of the members.
    ``forward(input_ids, attention_mask, decoder_input_ids)`` returns the combined next-token log-probabilities of
    every decoder position as ``logits`` (the first member's own logits for an ensemble of one); with ``labels``,
    ``loss`` is the combined distribution's NLL per target token. Attentions and hidden states are not returned
    (each member has its own: ask ``members[i]``). Building the ensemble puts the members in evaluation mode.
    """

    config_class = EnsembleConfig
    main_input_name = "input_ids"
    base_model_prefix = ""
    lm_head = None  # no output projection of its own (TranslationGenerationMixin reads this name)

    def __init__(self, models: Sequence[nn.Module], weights: Sequence[float] | None = None,
                 combination: str = "mean") -> None:
        members = check_members(models)
        weights = check_weights(weights, len(members), combination)
        first = members[0].config
        limit = min(member.config.max_position_embeddings for member in members)
        config = EnsembleConfig(
            vocab_size=first.vocab_size, max_position_embeddings=limit,
            member_types=[member.config.model_type for member in members], weights=weights,
            combination=combination, **{name: getattr(first, name, None) for name in SPECIAL_TOKEN_FIELDS})
        if getattr(first, "length_penalty_form", None) is not None:  # how the first member normalises beam scores
            config.length_penalty_form = first.length_penalty_form
        for source, target in {pair for member in members for pair in recorded_language_pairs(member.config)}:
            record_language_pair(config, source, target)  # the members' one pair (check_members), for the pipeline
        super().__init__(config)
        self.members = nn.ModuleList(members)
        self.encoder = EnsembleEncoder(self)
        self.log_weights = [math.log(weight) for weight in weights]
        # a member whose state cannot be rolled back (DTMT) makes the ensemble stateful: transformers then refuses
        # assisted decoding with its own message
        self._is_stateful = any(getattr(member, "_is_stateful", False) for member in members)
        self.post_init()
        generation = copy.deepcopy(members[0].generation_config)
        if generation.max_new_tokens is not None:
            generation.max_new_tokens = min(generation.max_new_tokens, limit - 1)
        self.generation_config = generation
        self.eval()

    # -------------------------------------------------------------------------------------------- plumbing
    def init_weights(self) -> None:
        """Nothing to initialise or tie: the members are trained models, and re-running their initialisation would
        overwrite weights."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """No cache for ``generate`` to pre-build: the first step gathers the members' own caches."""
        return False

    def can_generate(self) -> bool:
        return True

    def get_encoder(self, modality: str | None = None) -> EnsembleEncoder:
        return self.encoder

    def get_decoder(self) -> nn.Module:
        raise UserInputError("an ensemble has one decoder per member: use `ensemble.members[i].get_decoder()`.")

    def get_input_embeddings(self) -> nn.Module:
        raise UserInputError("an ensemble has one embedding per member: use "
                             "`ensemble.members[i].get_input_embeddings()`.")

    def get_output_embeddings(self) -> None:
        return None

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        raise UserInputError("an ensemble is not saved as one folder: save each member "
                             "(`ensemble.members[i].save_pretrained(folder_i)`) and load them together with "
                             "`hf_deepnmt.load_ensemble([folder_1, ...])`.")

    def _reorder_cache(self, past_key_values: EnsembleCache, beam_idx: torch.LongTensor) -> EnsembleCache:
        """Beam search (after every step): each member's cache follows the surviving hypotheses by that member's own
        rule (`DeepTransformerForConditionalGeneration._reorder_cache` moves only the self-attention keys/values,
        DTMT only its state)."""
        if not isinstance(past_key_values, EnsembleCache):
            past_key_values.reorder_cache(beam_idx)
            return past_key_values
        for index, (member, cache) in enumerate(zip(self.members, past_key_values.members)):
            if cache is None:
                continue
            if hasattr(member, "_reorder_cache"):
                past_key_values.members[index] = member._reorder_cache(cache, beam_idx)
            else:
                cache.reorder_cache(beam_idx)
        return past_key_values

    # -------------------------------------------------------------------------------------------- the model
    def combine(self, member_logits: Sequence[torch.Tensor]) -> torch.Tensor:
        """The ensemble's next-token scores from the members' logits, each ``(B, T, V)``: the member's own logits
        for an ensemble of one (under ``"mean"``, or ``"log_linear"`` with weight 1), else normalised
        log-probabilities in float32 (docs/distillation.md, "Ensembles")."""
        if len(member_logits) == 1 and (self.config.combination == "mean" or self.config.weights[0] == 1.0):
            return member_logits[0]  # log(1 · p) = log p: generate normalises the logits exactly as it does alone
        log_probs = torch.stack([logits.float().log_softmax(dim=-1) for logits in member_logits])  # (N, B, T, V)
        log_weights = log_probs.new_tensor(self.log_weights).view(-1, 1, 1, 1)  # (N, 1, 1, 1)
        if self.config.combination == "mean":
            return torch.logsumexp(log_probs + log_weights, dim=0)  # (B, T, V): log Σ_i w_i p_i
        weighted = (log_probs * log_weights.exp()).sum(dim=0)  # (B, T, V): Σ_i w_i log p_i
        return weighted.log_softmax(dim=-1)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | None = None,
        past_key_values: EnsembleCache | None = None,
        cache: EnsembleCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Seq2SeqLMOutput | tuple:
        """The combined scores ``(B, T, V)`` of the T ``decoder_input_ids`` (from the given cache, or from the
        start of the target), each member run on its own encoder states and cache; the `EnsembleCache` after them
        when ``use_cache``. ``labels`` give decoder inputs (shifted right) and the NLL of the combination."""
        past_key_values = merge_cache_arguments(cache, past_key_values)
        if labels is not None:
            check_token_ids("labels", labels, self.config.vocab_size, allow_ignore_index=True)
            use_cache = False
            if decoder_input_ids is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        if decoder_input_ids is None:
            raise UserInputError("an ensemble needs `decoder_input_ids` or `labels` (generate passes the former).")
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        elif not isinstance(encoder_outputs, BaseModelOutput) or MEMBER_STATES.format(0) not in encoder_outputs:
            raise UserInputError("`encoder_outputs` of an ensemble must come from its own encoder "
                                 "(`ensemble.get_encoder()`), which keeps every member's states.")
        if past_key_values is not None and not isinstance(past_key_values, EnsembleCache):
            raise UserInputError(f"an ensemble's cache is an EnsembleCache (one cache per member), got "
                                 f"{type(past_key_values).__name__}.")
        use_cache = use_cache is not False
        caches = past_key_values.members if past_key_values is not None else [None] * len(self.members)
        member_logits, new_caches = [], []
        for index, (member, member_cache) in enumerate(zip(self.members, caches)):
            states = BaseModelOutput(last_hidden_state=encoder_outputs[MEMBER_STATES.format(index)])
            output = member(attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                            encoder_outputs=states, use_cache=use_cache, return_dict=True,
                            **cache_field(member_cache))
            member_logits.append(output.logits)  # (B, T, V)
            new_caches.append(output_cache(output))
        logits = self.combine(member_logits)
        loss = None
        if labels is not None:
            log_probs = logits.float().log_softmax(dim=-1)  # (B, T, V); a no-op but for an ensemble of one
            keep = (labels != -100) & (labels != self.config.pad_token_id)  # (B, T)
            picked = log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # (B, T)
            loss = -(picked * keep).sum() / keep.sum().clamp(min=1)
        if use_cache:
            if past_key_values is None:
                past_key_values = EnsembleCache(new_caches)
            else:
                past_key_values.members = new_caches
        output = Seq2SeqLMOutput(loss=loss, logits=logits, **cache_field(past_key_values if use_cache else None),
                                 encoder_last_hidden_state=encoder_outputs.last_hidden_state)
        return output if return_dict is not False else output.to_tuple()


# ------------------------------------------------------------------------------------------------ checks
def check_members(models: Sequence[nn.Module]) -> list[nn.Module]:
    """The members, unwrapped (DDP, torch.compile), or one `UserInputError` sentence: no model, something that is
    not a seq2seq model, members on different devices, vocabularies or special tokens that differ, different
    recorded language pairs."""
    if isinstance(models, nn.Module) or not isinstance(models, Sequence) or isinstance(models, str):
        raise UserInputError(f"`models` must be a list of models, got {type(models).__name__}.")
    if not models:
        raise UserInputError("`models` is empty; an ensemble needs at least one model.")
    members = []
    for number, model in enumerate(models, start=1):
        if not isinstance(model, nn.Module) or not callable(getattr(unwrap_model(model), "get_encoder", None)):
            raise UserInputError(f"`models[{number - 1}]` is a {type(model).__name__}, not a loaded seq2seq model; "
                                 "pass models (or give folders to `hf_deepnmt.load_ensemble`).")
        member = unwrap_model(model)
        if not getattr(member.config, "is_encoder_decoder", False):
            raise UserInputError(f"`models[{number - 1}]` ({type(member).__name__}) is not an encoder-decoder "
                                 "translation model.")
        members.append(member)
    check_compatible([member.config for member in members],
                     [f"member {number} ({type(member).__name__})" for number, member in enumerate(members, start=1)])
    device = next(members[0].parameters()).device
    for number, member in enumerate(members[1:], start=2):
        member_device = next(member.parameters()).device
        if member_device != device:
            raise UserInputError(f"member {number} ({type(member).__name__}) is on {member_device} but member 1 is on "
                                 f"{device}; move the members to one device before building the ensemble.")
    return members


def check_compatible(configs: Sequence[Any], names: Sequence[str]) -> None:
    """One `UserInputError` sentence, naming the two members by ``names``, when their configs differ in vocabulary
    size or special-token ids, or record different language pairs (a member recording none agrees with any)."""
    first, first_name = configs[0], names[0]
    first_pairs = recorded_language_pairs(first)
    for config, name in zip(configs[1:], names[1:]):
        if config.vocab_size != first.vocab_size:
            raise UserInputError(f"{name} has vocab_size {config.vocab_size} but {first_name} has "
                                 f"{first.vocab_size}; the members of an ensemble must share one vocabulary.")
        # the target side of a converted model with two vocabularies (docs/public-checkpoints.md): the probabilities
        # the ensemble combines must be over one target vocabulary
        mine, theirs = (getattr(c, "decoder_vocab_size", None) or c.vocab_size for c in (config, first))
        if mine != theirs:
            raise UserInputError(f"{name} has a target vocabulary of {mine} tokens but {first_name} of {theirs}; the "
                                 "members of an ensemble must share one vocabulary.")
        for field in SPECIAL_TOKEN_FIELDS:
            mine, theirs = getattr(config, field, None), getattr(first, field, None)
            if mine is not None and theirs is not None and mine != theirs:
                raise UserInputError(f"{name} has {field} = {mine} but {first_name} has {theirs}; the members of an "
                                     "ensemble must share one vocabulary and its special tokens.")
        pairs = recorded_language_pairs(config)
        if pairs and first_pairs and set(pairs) != set(first_pairs):
            raise UserInputError(f"{name} records the language pair {_pairs(pairs)} but {first_name} records "
                                 f"{_pairs(first_pairs)}; the members of an ensemble must translate the same pair.")


def check_weights(weights: Sequence[float] | None, count: int, combination: str) -> list[float]:
    """The members' weights (equal by default; normalised to sum 1 under ``"mean"``), or one sentence."""
    if combination not in COMBINATIONS:
        raise UserInputError(f"`combination` = {combination!r} is not allowed; use one of {', '.join(COMBINATIONS)}.")
    if weights is None:
        weights = [1.0] * count
    weights = list(weights)
    if len(weights) != count:
        raise UserInputError(f"`weights` has {len(weights)} values for {count} models; give one weight per model.")
    for weight in weights:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise UserInputError(f"`weights` holds {weight!r}, which is not allowed; every weight must be a finite "
                                 "number > 0.")
    if combination == "mean":
        total = float(sum(weights))
        return [float(weight) / total for weight in weights]
    return [float(weight) for weight in weights]


def check_same_tokens(tokenizers: Sequence[Any], names: Sequence[str]) -> None:
    """One sentence when two members' tokenizers map tokens to ids differently (a different BPE of the same size is
    a different vocabulary)."""
    first = tokenizers[0].get_vocab()
    for tokenizer, name in zip(tokenizers[1:], names[1:]):
        vocab = tokenizer.get_vocab()
        if vocab == first:
            continue
        share = (f"the members of an ensemble must share one tokenizer (train the others on the first's: `deepnmt "
                 f"train --tokenizer_name {names[0]}`).")
        if len(vocab) != len(first):
            raise UserInputError(f"{name} has a vocabulary of {len(vocab)} tokens but {names[0]} has {len(first)}; "
                                 f"{share}")
        token = next(token for token in sorted(first) if vocab.get(token) != first[token])
        there = f"id {vocab[token]}" if token in vocab else "absent"
        raise UserInputError(f"{name} has a vocabulary of the same size as {names[0]} but other tokens (the token "
                             f"{token!r} is id {first[token]} in {names[0]}'s tokenizer and {there} in {name}'s); "
                             f"{share}")


def load_ensemble(folders: Sequence[str | os.PathLike], weights: Sequence[float] | None = None,
                  combination: str = "mean", **from_pretrained_kwargs: Any) -> tuple[EnsembleForConditionalGeneration,
                                                                                   Any]:
    """The ensemble of the saved models in ``folders`` (or Hub ids) and the tokenizer of the first. The configs are
    compared before any weights load (`check_compatible`, naming the folders), and every folder's tokenizer must hold
    the same tokens (`check_same_tokens`)."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    if isinstance(folders, (str, os.PathLike)) or not folders:
        raise UserInputError(f"`folders` must be a non-empty list of model folders, got {folders!r}.")
    names = [str(folder) for folder in folders]
    check_compatible([AutoConfig.from_pretrained(folder) for folder in folders], names)  # before any weights load
    tokenizers = [AutoTokenizer.from_pretrained(folder) for folder in folders]
    check_same_tokens(tokenizers, names)
    models = [AutoModelForSeq2SeqLM.from_pretrained(folder, **from_pretrained_kwargs) for folder in folders]
    return EnsembleForConditionalGeneration(models, weights=weights, combination=combination), tokenizers[0]


def _pairs(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{source} → {target}" for source, target in pairs)
