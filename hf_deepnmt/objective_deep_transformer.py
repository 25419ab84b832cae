"""The plumbing around `DeepTransformerForConditionalGeneration`'s training objective (docs/training.md): every
view of a batch through one call of the base model, the step-level normalisation of the terms, the output that
shows X's rows alone, the evaluation loss, and the checks and warnings around it.

The terms themselves — the label-smoothed NLL, li2022's DDR and ALD, dou2018's layer diversity — are the model's
(`_objective_terms` and the methods it calls, in modeling_deep_transformer.py, built from losses.py), and so is
the output projection of the needed positions (`_x_pass_logits`).

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqModelOutput
from transformers.utils import logging

from .errors import UserInputError
from .losses import (
    BatchViews,
    LossNormalizers,
    combine_terms,
    resolve_normalizers,
    target_mask,
    training_views,
    translation_nll_objective,
)
from .modeling_common import DeepTransformerSeq2SeqLMOutput

logger = logging.get_logger(__name__)


class TrainingObjectiveMixin:
    """`DeepTransformerForConditionalGeneration`'s objective plumbing; the model provides ``model`` (the base
    model), ``_x_pass_logits`` and ``_objective_terms``."""

    config: Any
    model: nn.Module
    training: bool

    def _training_objective(
        self,
        input_ids: torch.LongTensor | None,
        attention_mask: torch.Tensor | None,
        decoder_input_ids: torch.LongTensor | None,
        decoder_attention_mask: torch.Tensor | None,
        encoder_outputs: BaseModelOutput | tuple | None,
        inputs_embeds: torch.Tensor | None,
        decoder_inputs_embeds: torch.Tensor | None,
        labels: torch.LongTensor,
        output_attentions: bool | None,
        output_hidden_states: bool | None,
        num_items_in_batch: torch.Tensor | int | None,
        loss_normalizers: LossNormalizers | None,
        smoothing_epsilon: float | None,
    ) -> DeepTransformerSeq2SeqLMOutput:
        """The training objective in one model call (docs/training.md): every view of the batch li2022's
        collapse-reducing training needs (`hf_deepnmt.losses.training_views`: X; DDR's second pass; ALD's X⁺, X⁻) goes
        through **one** call of the base model, so DDP and gradient checkpointing see one ordinary forward; only X's
        passes are projected to the vocabulary; each term (`hf_deepnmt.losses`: `nll_terms`, `ddr_term`, `ald_term`,
        `diversity_term`) is a sum over its units divided by the step's count of them (`resolve_normalizers`).
        """
        config = self.config
        self._check_objective_inputs(encoder_outputs, inputs_embeds, decoder_inputs_embeds)
        self._warn_if_trainer_counts_pad_labels(labels, num_items_in_batch, loss_normalizers)
        views = training_views(input_ids, attention_mask, config, labels.size(0))
        diversity = config.diversity_stacks() if config.diversity_weight > 0.0 else ()
        # each row's positions up to its last real label; later ones (label padding) are not computed (docs/transformer.md)
        real = target_mask(labels, config.pad_token_id)  # (B, T)
        steps = torch.arange(1, labels.size(1) + 1, device=labels.device)  # (T,) 1-based positions
        lengths = views.per_pass(torch.where(real, steps, 0).amax(dim=-1, keepdim=True))  # (passes·B, 1)
        outputs = self.model(
            input_ids=views.encoder_input_ids(),
            attention_mask=views.per_source(attention_mask),
            decoder_input_ids=views.per_pass(decoder_input_ids),
            decoder_attention_mask=views.per_pass(decoder_attention_mask),
            encoder_outputs=encoder_outputs,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=False,
            output_attentions=output_attentions,
            output_hidden_states=bool(output_hidden_states) or bool(diversity),
            encoder_row_index=views.encoder_row_index(labels.device),
            drop_net_group_sizes=views.group_sizes(),
            target_lengths=lengths[:, 0],
        )
        logits = self._x_pass_logits(views, outputs, steps, lengths)  # (passes·B, T, V)
        terms = self._objective_terms(views, outputs, logits, labels, input_ids, attention_mask, diversity,
                                      smoothing_epsilon)
        source_mask = self._source_mask(input_ids, attention_mask, outputs.encoder_last_hidden_state, views)
        local = {"target_tokens": terms[0].count, "source_tokens": source_mask.sum(),
                 "sentences": torch.tensor(views.size, device=labels.device)}
        loss, components, counts = combine_terms(terms, resolve_normalizers(local, loss_normalizers,
                                                                            num_items_in_batch))
        return self._x_view_output(views, outputs, loss, logits, components, counts, output_hidden_states)

    def _check_objective_inputs(self, encoder_outputs: BaseModelOutput | tuple | None,
                                inputs_embeds: torch.Tensor | None, decoder_inputs_embeds: torch.Tensor | None) -> None:
        """li2022's DDR/ALD build their views from ids: refuse precomputed encoder outputs and embeddings."""
        crt = self.config.ddr_weight > 0.0 or self.config.ald_weight > 0.0
        given = sorted(name for name, value in (("encoder_outputs", encoder_outputs), ("inputs_embeds", inputs_embeds),
                                                 ("decoder_inputs_embeds", decoder_inputs_embeds)) if value is not None)
        if crt and given:
            raise UserInputError(f"{type(self).__name__}: li2022's DDR/ALD training objective needs input_ids and "
                                 f"decoder ids (it builds several views of them); got {given} instead.")

    def _evaluation_objective(self, logits: torch.Tensor, labels: torch.Tensor | None,
                              num_items_in_batch: torch.Tensor | int | None) -> tuple[Any, Any, Any]:
        """Evaluation mode: the unsmoothed NLL per target token, with its components and counts (None without
        ``labels``)."""
        if labels is None:
            return None, None, None
        return translation_nll_objective(logits, labels, self.config.pad_token_id, training=False, epsilon=0.0,
                                         source_tokens=torch.tensor(0), num_items_in_batch=num_items_in_batch)

    @staticmethod
    def _x_view_output(views: BatchViews, outputs: Seq2SeqModelOutput, loss: torch.Tensor, logits: torch.Tensor,
                       components: dict[str, torch.Tensor], counts: dict[str, torch.Tensor],
                       output_hidden_states: bool | None) -> DeepTransformerSeq2SeqLMOutput:
        """The objective's output: the loss of every view, the logits, states and attentions of X's rows only."""

        def first(states: tuple[torch.Tensor, ...] | None, encoder: bool = False) -> tuple | None:
            return None if states is None else tuple(
                views.take(h, "x", sources=encoder) for h in states)  # X's rows only

        return DeepTransformerSeq2SeqLMOutput(
            loss=loss,
            logits=logits[:views.size],
            encoder_last_hidden_state=views.take(outputs.encoder_last_hidden_state, "x", sources=True),
            decoder_hidden_states=first(outputs.decoder_hidden_states) if output_hidden_states else None,
            encoder_hidden_states=first(outputs.encoder_hidden_states, True) if output_hidden_states else None,
            decoder_attentions=first(outputs.decoder_attentions),
            cross_attentions=first(outputs.cross_attentions),
            encoder_attentions=first(outputs.encoder_attentions, True),
            loss_components=components,
            loss_component_counts=counts,
        )

    def _source_mask(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None,
                     encoder_states: torch.Tensor, views: BatchViews) -> torch.Tensor:
        """True at X's real source positions ``(B, S)``."""
        if attention_mask is not None:
            return attention_mask.bool()
        if input_ids is not None:
            return input_ids != self.config.pad_token_id
        return torch.ones(views.size, encoder_states.size(1), dtype=torch.bool, device=encoder_states.device)

    def _warn_if_auxiliary_losses_go_untrained(self) -> None:
        """A training-mode forward without labels computes no loss: li2022's DDR/ALD terms are not trained. (Not under
        `torch.compile`, where a logging call would break the graph: the eager forward warns.)"""
        if (self.config.ddr_weight > 0 or self.config.ald_weight > 0) and not torch.compiler.is_compiling():
            logger.warning_once(
                f"{type(self).__name__}: a training-mode forward without `labels` computes no loss, so the ddr/ald "
                "terms of the config are not trained. A stock Trainer with label_smoothing_factor > 0 does this (it "
                "removes the labels): use label_smoothing_factor=0 and config.label_smoothing instead, or "
                "DeepNMTTrainer.")

    def _warn_if_trainer_counts_pad_labels(self, labels: torch.Tensor, num_items_in_batch: Any,
                                           loss_normalizers: LossNormalizers | None) -> None:
        """Warn when transformers' Trainer counted pad labels. Not under `torch.compile`: the test reads the labels'
        values, a data-dependent branch that would break the graph (the eager forward warns)."""
        pad = self.config.pad_token_id
        if torch.compiler.is_compiling():
            return
        if num_items_in_batch is not None and loss_normalizers is None and pad is not None and bool(
                (labels == pad).any()):
            logger.warning_once(
                f"{type(self).__name__}: `labels` contain pad_token_id={pad}; the loss ignores them, but transformers' "
                "Trainer counts them in `num_items_in_batch`, which shrinks every update — pad labels with -100 "
                "(DataCollatorForSeq2Seq does by default) or train with DeepNMTTrainer, which counts exactly.")
