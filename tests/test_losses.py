"""hf_deepnmt.losses: label-smoothed NLL, normalisation, auxiliary-term plumbing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

from hf_deepnmt.losses import AuxiliaryLoss, compute_losses, label_smoothed_nll_loss


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_label_smoothed_nll_matches_torch_cross_entropy(epsilon):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    labels = torch.randint(4, 11, (3, 5))
    labels[1, 3:] = -100
    labels[2, 4] = 0  # a pad id inside the labels is ignored too
    smoothed, nll, count = label_smoothed_nll_loss(logits, labels, epsilon, pad_token_id=0)
    mask = (labels != -100) & (labels != 0)
    reference = F.cross_entropy(logits[mask], labels[mask], label_smoothing=epsilon, reduction="sum")
    reference_nll = F.cross_entropy(logits[mask], labels[mask], reduction="sum")
    assert count == mask.sum()
    assert torch.allclose(smoothed.double(), reference, atol=1e-5)
    assert torch.allclose(nll.double(), reference_nll, atol=1e-5)


def test_bad_epsilon_is_rejected():
    with pytest.raises(ValueError, match="epsilon"):
        label_smoothed_nll_loss(torch.zeros(1, 1, 5), torch.ones(1, 1, dtype=torch.long), 1.0)


def test_compute_losses_equals_model_loss_without_smoothing(batch):
    model = tiny_model()
    out = compute_losses(model, batch, label_smoothing=0.0, auxiliary=[])
    with torch.no_grad():
        reference = model(**batch).loss
    assert torch.allclose(out.loss.detach(), reference, atol=1e-6)
    assert torch.allclose(out.components["nll"], reference, atol=1e-6)
    assert out.num_tokens == (batch["labels"] != -100).sum()


def test_an_auxiliary_term_adds_its_weighted_value_logs_it_and_gets_gradient(batch):
    model = tiny_model().train()
    calls = []

    def logit_l2(m, inputs, outputs):
        calls.append(outputs.logits.shape)
        return outputs.logits.pow(2).mean()

    aux = AuxiliaryLoss("l2", weight=0.5, fn=logit_l2)
    torch.manual_seed(1)
    plain = compute_losses(model, batch, label_smoothing=0.1, auxiliary=[])
    torch.manual_seed(1)
    with_aux = compute_losses(model, batch, label_smoothing=0.1, auxiliary=[aux])
    assert set(with_aux.components) == {"nll", "smoothed_nll", "l2"}
    expected = plain.loss + 0.5 * with_aux.components["l2"]
    assert torch.allclose(with_aux.loss, expected, atol=1e-6)
    assert len(calls) == 1  # reuses the main forward's outputs
    with_aux.loss.backward()
    grad_with = model.lm_head.weight.grad.clone()
    model.zero_grad()
    torch.manual_seed(1)
    compute_losses(model, batch, label_smoothing=0.1, auxiliary=[]).loss.backward()
    assert not torch.allclose(grad_with, model.lm_head.weight.grad)  # the aux term changes the gradient


def test_num_items_in_batch_makes_micro_batches_add_up_to_the_full_batch(batch):
    """Σ over micro-batches of loss(normalised by the step's tokens) == loss of the whole batch."""
    model = tiny_model()
    aux = AuxiliaryLoss("l2", 0.3, lambda m, inputs, outputs: outputs.logits.pow(2).mean())
    full = compute_losses(model, batch, 0.1, [aux])
    total_tokens = full.num_tokens
    parts = [{key: value[i:i + 1] for key, value in batch.items()} for i in range(2)]
    summed = sum(compute_losses(model, part, 0.1, [aux], num_items_in_batch=total_tokens).loss for part in parts)
    smoothed_full = full.loss - 0.3 * full.components["l2"]
    smoothed_parts = sum(
        compute_losses(model, part, 0.1, [], num_items_in_batch=total_tokens).loss for part in parts
    )
    assert torch.allclose(smoothed_parts, smoothed_full, atol=1e-6)  # exact for the token-level NLL
    assert torch.allclose(summed, full.loss, atol=2e-2)  # aux: token-weighted mean of per-part means


def test_aux_term_errors_are_clear(batch):
    model = tiny_model()
    vector = AuxiliaryLoss("vec", 1.0, lambda m, i, o: o.logits.mean(-1))
    with pytest.raises(ValueError, match="'vec' must return a scalar"):
        compute_losses(model, batch, auxiliary=[vector])
    clash = AuxiliaryLoss("nll", 1.0, lambda m, i, o: o.logits.mean())
    with pytest.raises(ValueError, match="'nll' is already used"):
        compute_losses(model, batch, auxiliary=[clash])
    with pytest.raises(ValueError, match="no `labels`"):
        compute_losses(model, {k: v for k, v in batch.items() if k != "labels"})
