"""torch.compile (inductor, CPU) works on the model: no graph break, the eager results, and Seq2SeqTrainer's
``torch_compile=True``. Speed is measured by the benchmarks (benchmarks/RESULTS.md), never asserted here."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model


@pytest.mark.integration
def test_compiled_training_step_matches_eager(batch):
    """A training forward + backward compiles as one graph (dropout on: inductor draws its own random numbers, so
    the losses are not compared); the compiled model in eval mode gives the eager logits."""
    eager = tiny_model().train()
    compiled_model = tiny_model().train()
    compiled = torch.compile(compiled_model, fullgraph=True)  # fullgraph: a graph break is an error
    eager(**batch).loss.backward()
    compiled_loss = compiled(**batch).loss
    compiled_loss.backward()
    assert torch.isfinite(compiled_loss)
    eager.eval(), compiled.eval()
    with torch.no_grad():
        assert torch.allclose(compiled(**batch).logits, eager(**batch).logits, atol=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert q.grad is not None and q.grad.shape == p.grad.shape, name


@pytest.mark.integration
def test_seq2seq_trainer_with_torch_compile_runs(batch, tmp_path):
    """About 30 s from a cold inductor cache on 2 CPU cores (1 s after the test above, which warms it)."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    rows = [{key: value[i] for key, value in batch.items()} for i in range(batch["input_ids"].size(0))]
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), torch_compile=True, max_steps=2,
                                    per_device_train_batch_size=2, report_to="none", use_cpu=True,
                                    save_strategy="no", disable_tqdm=True)
    result = Seq2SeqTrainer(model=tiny_model().train(), args=args, train_dataset=rows).train()
    assert result.global_step == 2
    assert torch.isfinite(torch.tensor(result.training_loss))
