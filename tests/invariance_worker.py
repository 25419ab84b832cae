"""One optimizer step of a trainer on a fixed synthetic batch of 6 sentence pairs, with every random draw of the
objective made a deterministic function of the row, so that one batch, gradient accumulation and data parallelism
can be compared exactly (docs/training.md, "Normalisation").

Used by tests/test_training_correctness.py in-process and, for DDP, as a script under
``torchrun --nproc_per_node 2 tests/invariance_worker.py OUT_DIR``: each process takes 3 of the 6 pairs and rank 0
writes ``OUT_DIR/<term>.pt`` (the logged loss and the weights after the step) for every term of `TERMS`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hf_deepnmt  # noqa: E402,F401
from hf_deepnmt import (  # noqa: E402
    DeepTransformerConfig,
    DeepTransformerForConditionalGeneration,
    DTMTConfig,
    DTMTForConditionalGeneration,
)
from hf_deepnmt import losses  # noqa: E402
from hf_deepnmt import modeling_deep_transformer as modeling  # noqa: E402

PAD, BOS, EOS, UNK = 0, 1, 2, 3
# A 2+2-layer tiny model; cross-attention drop on the bottom decoder layer (its draws are patched, see below).
MODEL = dict(vocab_size=99, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
             decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
             dropout=0.0, cross_attention_drop_depth=1, cross_attention_drop_ratio=0.5)
TERMS: dict[str, dict[str, float]] = {
    "nll": {},
    "ddr": {"ddr_weight": 1.0},
    "ald": {"ald_weight": 1.0},
    "crt": {"ddr_weight": 1.0, "ald_weight": 1.0},
    "div": {"diversity_weight": 1.0},  # dou2018: encoder (per source token) and decoder (per target token) terms
    "dtmt": {},  # meng2019's recurrent model (`DTMT`), whose objective is the label-smoothed NLL alone
}
# The DTMT of the "dtmt" term: DTMT#1, dropouts off (a step must be a function of the batch alone).
DTMT = dict(vocab_size=99, d_model=16, transition_depth=1, attention_heads=4, max_position_embeddings=64,
            dropout=0.0, rnn_dropout=0.0, readout_dropout=0.0)
SOURCE_LENGTHS = (3, 9, 4, 7, 2, 8)  # uneven on purpose: micro-batches hold different shares of tokens and sentences
TARGET_LENGTHS = (8, 2, 6, 3, 7, 4)


def examples() -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(0)
    rows = []
    for source_length, target_length in zip(SOURCE_LENGTHS, TARGET_LENGTHS):
        source = torch.randint(4, 99, (source_length,), generator=generator).tolist() + [EOS]
        target = torch.randint(4, 99, (target_length,), generator=generator).tolist() + [EOS]
        rows.append({"input_ids": source, "attention_mask": [1] * len(source), "labels": target})
    return rows


def collate(features: list[dict[str, list[int]]], label_pad: int = -100) -> dict[str, torch.Tensor]:
    """Right-pad a batch; labels with ``label_pad`` (-100, or the pad id, which the loss must ignore too)."""
    source_length = max(len(f["input_ids"]) for f in features)
    target_length = max(len(f["labels"]) for f in features)
    pad = lambda values, length, fill: values + [fill] * (length - len(values))  # noqa: E731
    return {
        "input_ids": torch.tensor([pad(f["input_ids"], source_length, PAD) for f in features]),
        "attention_mask": torch.tensor([pad(f["attention_mask"], source_length, 0) for f in features]),
        "labels": torch.tensor([pad(f["labels"], target_length, label_pad) for f in features]),
    }


# ------------------------------------------------------------------------------------------------ determinism
def deterministic_views(input_ids, attention_mask, config, gamma=None):
    """X⁺ / X⁻ with a fixed γ = 0.25 and the first replaceable positions (a function of the row alone)."""
    from hf_deepnmt.losses import replaceable_source_positions

    replaceable = replaceable_source_positions(input_ids, attention_mask, config)  # (B, S)
    n = replaceable.sum(dim=1, keepdim=True)
    order = replaceable.long().cumsum(dim=1)  # 1, 2, … at replaceable positions
    positive = input_ids.masked_fill(replaceable & (order <= torch.round(0.25 * n)), config.unk_token_id)
    negative = input_ids.masked_fill(replaceable & (order <= torch.round(0.75 * n)), config.unk_token_id)
    return positive, negative


def deterministic_draws(self, group_sizes=None, device=None, drop=True):
    """Drop-net decisions that depend only on the pass: the bottom layer attends to the source in the first pass
    and not in the second (so DDR's two passes differ without randomness); everything else attends."""
    decisions = [True] * len(self.layers)
    if self.training and group_sizes and len(group_sizes) >= 2:
        rows = torch.cat([torch.full((size,), 0.0 if group == 1 else 1.0) for group, size in enumerate(group_sizes)])
        decisions[0] = rows.to(device)[:, None, None]  # (R, 1, 1)
    return decisions


class Deterministic:
    """Context manager that installs `deterministic_views` and `deterministic_draws` in the model code."""

    def __enter__(self):
        self.saved = (losses.ald_views, modeling.DeepTransformerDecoder.draw_cross_attention)
        losses.ald_views = deterministic_views
        modeling.DeepTransformerDecoder.draw_cross_attention = deterministic_draws
        return self

    def __exit__(self, *exc):
        losses.ald_views, modeling.DeepTransformerDecoder.draw_cross_attention = self.saved


# ------------------------------------------------------------------------------------------------ one step
def build_model(term: str, label_smoothing: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(0)
    if term == "dtmt":
        return DTMTForConditionalGeneration(DTMTConfig(**DTMT, label_smoothing=label_smoothing))
    config = DeepTransformerConfig(**MODEL, **TERMS[term], label_smoothing=label_smoothing)
    return DeepTransformerForConditionalGeneration(config)


def one_step(term: str, output_dir: str, batch_size: int, accumulation: int = 1, label_pad: int = -100,
             stock: bool = False, steps: int = 1) -> dict[str, object]:
    """Train ``steps`` SGD steps (lr 1, no clipping; each step sees all 6 pairs) and return
    ``{"loss": first logged loss, "weights": state dict}``.

    ``stock``: transformers' own `Seq2SeqTrainer` with the smoothing in the model config (it must then have
    ``label_smoothing_factor=0``, or it would strip the labels); otherwise `DeepNMTTrainer` with
    ``label_smoothing_factor=0.1``.
    """
    from datasets import Dataset
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from hf_deepnmt_training.trainer import DeepNMTTrainer

    model = build_model(term, label_smoothing=0.1 if stock else 0.0)
    args = Seq2SeqTrainingArguments(
        output_dir=output_dir, per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
        max_steps=steps, optim="sgd", learning_rate=1.0, max_grad_norm=0.0, lr_scheduler_type="constant",
        warmup_steps=0, label_smoothing_factor=0.0 if stock else 0.1, train_sampling_strategy="sequential",
        logging_steps=1, save_strategy="no", eval_strategy="no", report_to="none", use_cpu=True, seed=0,
        disable_tqdm=True, dataloader_num_workers=0, ddp_find_unused_parameters=False,
    )
    trainer_class = Seq2SeqTrainer if stock else DeepNMTTrainer
    trainer = trainer_class(model=model, args=args, train_dataset=Dataset.from_list(examples()),
                            data_collator=lambda features: collate(features, label_pad))
    with Deterministic():
        trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    weights = {name: value.detach().clone() for name, value in trainer.model.state_dict().items()}
    return {"loss": logged["loss"], "weights": weights}


def main(out_dir: str) -> None:
    """Under torchrun: every term, 3 pairs per process, one step each."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_process = len(SOURCE_LENGTHS) // world
    for term in TERMS:
        result = one_step(term, os.path.join(out_dir, f"run-{term}"), batch_size=per_process)
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(result, os.path.join(out_dir, f"{term}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
