"""training/trainer.py: losses and their logging, gradient accumulation, evaluation, token batching, NaN guard,
atomic checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainingArguments, TrainerCallback

from hf_deepnmt.losses import AuxiliaryLoss
from hf_deepnmt_training.data import read_parallel_file, tokenize_corpus
from hf_deepnmt_training.metrics import TranslationMetrics
from hf_deepnmt_training.checkpoints import last_checkpoint
from hf_deepnmt_training.trainer import INCOMPLETE_DIR, DeepNMTTrainer, NonFiniteLossError


@pytest.fixture(scope="module")
def data(small_corpus, tiny_tokenizer):
    train = tokenize_corpus(read_parallel_file(small_corpus / "train.jsonl", "en", "es"), tiny_tokenizer, 48, 48)
    valid = tokenize_corpus(read_parallel_file(small_corpus / "valid.jsonl", "en", "es", max_samples=8),
                            tiny_tokenizer, 48, 48)
    return train, valid


def make_trainer(tmp_path, data, tokenizer, aux=None, max_tokens=None, dropout=0.0, model_overrides=None, **args):
    model = tiny_model(vocab_size=len(tokenizer), dropout=dropout, max_position_embeddings=64,
                       **(model_overrides or {})).train()
    defaults = dict(
        output_dir=str(tmp_path), learning_rate=3e-3, per_device_train_batch_size=8, max_steps=4, logging_steps=1,
        report_to="none", use_cpu=True, seed=0, save_strategy="no", eval_strategy="no", warmup_steps=0,
        lr_scheduler_type="constant", disable_tqdm=True, dataloader_num_workers=0, label_smoothing_factor=0.1,
        predict_with_generate=True, generation_num_beams=1, generation_max_length=12,
    )
    defaults.update(args)
    training_args = Seq2SeqTrainingArguments(**defaults)
    return DeepNMTTrainer(
        model=model, args=training_args, train_dataset=data[0], eval_dataset=data[1], processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=TranslationMetrics(tokenizer), auxiliary_losses=aux, max_tokens=max_tokens,
    )


def logit_l2() -> AuxiliaryLoss:
    return AuxiliaryLoss("l2", 0.01, lambda model, inputs, outputs: outputs.logits.float().pow(2).mean())


def test_every_component_is_logged_separately_and_to_tensorboard(tmp_path, data, tiny_tokenizer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = make_trainer(tmp_path, data, tiny_tokenizer, aux=[logit_l2()], report_to="tensorboard",
                           logging_steps=2)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 2
    for entry in logs:
        assert {"loss", "nll", "smoothed_nll", "l2"} <= set(entry)
        assert entry["l2"] > 0 and entry["nll"] > 0
    events = EventAccumulator(str(next(tmp_path.rglob("events.out.tfevents.*")).parent))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/nll", "train/smoothed_nll", "train/l2"} <= tags, tags


def test_gradient_accumulation_equals_the_doubled_batch(tmp_path, data, tiny_tokenizer):
    def one_step(batch_size: int, accumulation: int, folder: str) -> dict[str, torch.Tensor]:
        trainer = make_trainer(tmp_path / folder, data, tiny_tokenizer, aux=[logit_l2()], max_steps=1,
                               per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
                               optim="sgd", learning_rate=1.0, max_grad_norm=0.0,
                               train_sampling_strategy="sequential")
        trainer.train()
        logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
        return {"__loss": torch.tensor(logged["loss"]),
                **{name: p.detach().clone() for name, p in trainer.model.named_parameters()}}

    big = one_step(8, 1, "big")
    accumulated = one_step(4, 2, "accumulated")
    assert abs(big["__loss"] - accumulated["__loss"]) < 2e-3  # logged loss is not inflated by accumulation
    for name, value in big.items():
        assert torch.allclose(value, accumulated[name], atol=2e-4), name


def test_evaluation_generates_and_scores_with_sacrebleu(tmp_path, data, tiny_tokenizer):
    trainer = make_trainer(tmp_path, data, tiny_tokenizer)
    metrics = trainer.evaluate()
    assert {"eval_bleu", "eval_chrf", "eval_ter", "eval_loss"} <= set(metrics)
    assert all(isinstance(metrics[k], float) for k in ("eval_bleu", "eval_chrf", "eval_ter"))
    signatures = trainer.compute_metrics.last.signatures
    assert signatures["bleu"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert signatures["chrf"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
    assert "ter" in signatures
    # eval_loss is the model's unsmoothed NLL even though training smooths labels
    batch = trainer.data_collator([data[1][i] for i in range(len(data[1]))])
    batch.pop("length", None)
    with torch.no_grad():
        nll = trainer.model(**{k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "labels")}).loss
    assert math.isclose(metrics["eval_loss"], nll.item(), rel_tol=1e-3)


def test_token_budget_batches_are_used_for_training(tmp_path, data, tiny_tokenizer):
    trainer = make_trainer(tmp_path, data, tiny_tokenizer, max_tokens=160)
    loader = trainer.get_train_dataloader()
    shapes = [tuple(batch["input_ids"].shape) for batch in loader]
    assert len({shape[0] for shape in shapes}) > 1  # variable sentence counts
    assert all(rows * max(cols, 1) <= 160 + 48 for rows, cols in shapes)
    assert sum(shape[0] for shape in shapes) == len(data[0])
    trainer.train()
    assert trainer.state.global_step == 4


def test_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path, data, tiny_tokenizer):
    calls = {"n": 0}

    def explode(model, inputs, outputs):
        calls["n"] += 1
        return outputs.logits.sum() * (float("nan") if calls["n"] >= 5 else 0.0)

    trainer = make_trainer(tmp_path, data, tiny_tokenizer, aux=[AuxiliaryLoss("boom", 1.0, explode)],
                           max_steps=8, save_strategy="steps", save_steps=2)
    with pytest.raises(NonFiniteLossError, match=r"step 5 because the loss is nan .*checkpoint-4\) is intact"):
        trainer.train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    weights = load_file(str(tmp_path / "checkpoint-4" / "model.safetensors"))
    assert all(torch.isfinite(tensor).all() for tensor in weights.values())
    assert last_checkpoint(str(tmp_path)).endswith("checkpoint-4")


def test_checkpoints_are_atomic(tmp_path, data, tiny_tokenizer, monkeypatch):
    trainer = make_trainer(tmp_path, data, tiny_tokenizer, max_steps=6, save_strategy="steps", save_steps=2)
    original = trainer._save_optimizer_and_scheduler
    saves = {"n": 0}

    def crash_on_second_save(output_dir):
        saves["n"] += 1
        if saves["n"] == 2:
            raise KeyboardInterrupt("killed while writing the optimizer state")
        return original(output_dir)

    monkeypatch.setattr(trainer, "_save_optimizer_and_scheduler", crash_on_second_save)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]  # no half-written checkpoint-4
    assert (tmp_path / INCOMPLETE_DIR / "checkpoint-4" / "model.safetensors").exists()
    assert last_checkpoint(str(tmp_path)).endswith("checkpoint-2")
    state = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2

    resumed = make_trainer(tmp_path, data, tiny_tokenizer, max_steps=6, save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=last_checkpoint(str(tmp_path)))
    assert resumed.state.global_step == 6
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert not (tmp_path / INCOMPLETE_DIR).exists()  # the stale partial save was cleaned up


def test_model_card_hook_writes_our_card(tmp_path, data, tiny_tokenizer):
    trainer = make_trainer(tmp_path, data, tiny_tokenizer, max_steps=1)
    trainer.train()
    trainer.save_model(str(tmp_path))
    (tmp_path / "deepnmt_card.json").write_text(json.dumps({"source_lang": "en", "target_lang": "es"}))
    trainer.create_model_card()
    assert "hf_deepnmt" in Path(tmp_path / "README.md").read_text()


def test_resuming_a_tied_model_warns_about_no_missing_lm_head(tmp_path, data, tiny_tokenizer, monkeypatch):
    """A tied model's checkpoint does not store lm_head.weight: resuming re-ties it silently; a key that is really
    absent is still reported."""
    import transformers.trainer
    from torch.nn.modules.module import _IncompatibleKeys

    trainer = make_trainer(tmp_path, data, tiny_tokenizer, max_steps=1)
    warnings = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a, **k: warnings.append(message))
    model = trainer.model
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())  # untied, as after a bare load
    trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight"], []))
    assert warnings == [] and model.lm_head.weight is model.get_input_embeddings().weight
    trainer._issue_warnings_after_load(_IncompatibleKeys(["lm_head.weight", "model.encoder.layers.0.fc1.bias"], []))
    assert len(warnings) == 1 and "model.encoder.layers.0.fc1.bias" in warnings[0] and "lm_head" not in warnings[0]


def test_the_best_checkpoint_is_recorded_at_its_final_path_and_kept_on_resume(tmp_path, data, tiny_tokenizer,
                                                                             monkeypatch):
    """Issue 66 item 4: every checkpoint's trainer_state.json names the best checkpoint by the path it has once moved
    into place (it named OUTPUT_DIR/.incomplete/checkpoint-N, where it was written), and a resumed run keeps it — a
    checkpoint of an earlier run that recorded the .incomplete path included — without transformers' warning that it
    "does not exist anymore"."""
    import transformers.trainer

    options = dict(max_steps=4, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
                   metric_for_best_model="loss", load_best_model_at_end=True, save_total_limit=5)
    trainer = make_trainer(tmp_path, data, tiny_tokenizer, **options)
    trainer.train()
    recorded = {name: json.loads((tmp_path / name / "trainer_state.json").read_text())["best_model_checkpoint"]
                for name in ("checkpoint-2", "checkpoint-4")}
    assert all(INCOMPLETE_DIR not in path and Path(path).is_dir() for path in recorded.values()), recorded
    assert recorded["checkpoint-2"] == str(tmp_path / "checkpoint-2")

    state_file = tmp_path / "checkpoint-4" / "trainer_state.json"  # as an earlier version wrote it
    state = json.loads(state_file.read_text())
    best = Path(state["best_model_checkpoint"])
    state["best_model_checkpoint"] = str(best.parent / INCOMPLETE_DIR / best.name)
    state_file.write_text(json.dumps(state))
    warnings = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", lambda message, *a, **k: warnings.append(message))
    resumed = make_trainer(tmp_path, data, tiny_tokenizer, **{**options, "max_steps": 6})
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert not [message for message in warnings if "does not exist anymore" in str(message)]
    assert resumed.state.best_model_checkpoint in (str(best), str(tmp_path / "checkpoint-6"))
    assert json.loads(state_file.read_text())["best_model_checkpoint"] == str(best)


def test_a_run_without_max_steps_says_its_length_before_it_starts(tmp_path, data, tiny_tokenizer, capsys):
    """Issue 66 item 6: `--max_steps -1` (transformers' default) quietly became three epochs (903 steps, 8 minutes
    for the user). One line says the run's length in passes and optimizer steps before the first step; a run with
    --max_steps says nothing of the kind."""
    trainer = make_trainer(tmp_path, data, tiny_tokenizer, max_steps=-1, num_train_epochs=1,
                           per_device_train_batch_size=32)
    steps = []
    trainer.add_callback(type("Steps", (TrainerCallback,), {"on_step_begin": lambda self, args, state, control, **kw:
                                                             steps.append(capsys.readouterr().err)})())
    trainer.train()
    assert trainer.state.global_step == trainer.state.max_steps == 5  # 160 pairs, 32 a batch
    assert ("[deepnmt] no --max_steps: the run is --num_train_epochs 1 over its training data, 5 optimizer steps; "
            "--max_steps N or --max_train_minutes M sets another length") in steps[0]
    make_trainer(tmp_path / "steps", data, tiny_tokenizer, max_steps=2).train()
    assert "no --max_steps" not in capsys.readouterr().err
