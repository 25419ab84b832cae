"""`deepnmt diagnose`: is a saved translation model using its source, or has its decoder collapsed?

Three measurements on a few sentence pairs (teacher forcing, evaluation mode):

* **source reliance** (li2022's collapse monitor, docs/li2022.md): mean per-token KL between the predictions with the
  real source and with every source word replaced by ``<unk>``; ≈ 0 when the decoder ignores the source;
* **cross-attention share** per decoder layer: ‖CrossAttn(h)‖ / ‖h‖, the size of the cross-attention branch relative
  to the state it reads (its sub-layer input), averaged over target tokens — how much source information each layer
  writes;
* **cross-attention entropy** per decoder layer: the entropy of the attention weights over the real source tokens,
  divided by log(source length) and averaged over heads and target tokens: 1 = spread uniformly (attending nowhere in
  particular), small = focused on a few source words.

A healthy model has clearly positive reliance and, in some layers, a visible share with entropy well below 1. A
collapsed decoder has reliance ≈ 0 and shares ≈ 0 or entropies ≈ 1 everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hf_deepnmt.errors import UserInputError


@dataclass
class Diagnosis:
    source_reliance: float
    pairs: int
    cross_attention_share: list[float | None] = field(default_factory=list)
    """Per decoder layer, bottom first; None for a layer without cross-attention (li2022 CAD, p_net = 1)."""
    cross_attention_entropy: list[float | None] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"source_reliance": self.source_reliance, "pairs": self.pairs,
                "cross_attention_share": self.cross_attention_share,
                "cross_attention_entropy": self.cross_attention_entropy}

    def report(self) -> str:
        verdict = ("the decoder ignores its source (collapsed, or not trained)" if self.source_reliance < 0.05
                   else "the decoder uses its source")
        lines = [f"source reliance {self.source_reliance:.4f} nats/token on {self.pairs} pairs: {verdict}",
                 "decoder layer | cross-attention share ‖CrossAttn(h)‖/‖h‖ | attention entropy (1 = uniform)"]
        for number, (share, entropy) in enumerate(zip(self.cross_attention_share, self.cross_attention_entropy), 1):
            lines.append(f"{number:>13} | " + ("no cross-attention" if share is None
                                               else f"{share:>40.3f} | {entropy:.3f}"))
        return "\n".join(lines)


@torch.no_grad()
def diagnose(model, tokenizer, sources: Sequence[str], targets: Sequence[str], max_pairs: int = 64) -> Diagnosis:
    """Measure a Transformer translation model of this package on the first ``max_pairs`` non-empty pairs."""
    from hf_deepnmt_training.translate import corpus_source_reliance

    pairs = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()][:max_pairs]
    if not pairs:
        raise UserInputError("diagnose needs at least one non-empty sentence pair.")
    model.eval()
    reliance = corpus_source_reliance(model, tokenizer, [s for s, _ in pairs], [t for _, t in pairs], max_pairs)
    decoder = model.get_decoder()
    limit = min(tokenizer.model_max_length, getattr(model.config, "max_position_embeddings", 1024))
    batch = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs], padding=True, truncation=True,
                      max_length=limit, return_tensors="pt").to(model.device)
    labels = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    target = labels != -100  # (B, T)
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = []
    for index, layer in enumerate(decoder.layers):
        if getattr(layer, "encoder_attn", None) is None:
            continue

        def hook(module, args, kwargs, output, index=index):
            captured[index] = (args[0] if args else kwargs["hidden_states"], output[0])  # (B, T, d) in, branch out

        handles.append(layer.encoder_attn.register_forward_hook(hook, with_kwargs=True))
    try:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                    output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    source_mask = batch["attention_mask"].bool()  # (B, S)
    lengths = source_mask.sum(dim=1).clamp(min=2).float()  # (B,)
    shares, entropies = [], []
    for index, weights in enumerate(out.cross_attentions):
        if weights is None or index not in captured:
            shares.append(None)
            entropies.append(None)
            continue
        state, branch = captured[index]
        ratio = branch.norm(dim=-1) / state.norm(dim=-1).clamp(min=1e-9)  # (B, T)
        shares.append(float(ratio[target].mean()))
        probabilities = weights.float().clamp(min=1e-12)  # (B, H, T, S)
        entropy = -(probabilities * probabilities.log()).masked_fill(~source_mask[:, None, None, :], 0.0).sum(-1)
        normalised = entropy / torch.log(lengths)[:, None, None]  # (B, H, T)
        entropies.append(float(normalised.mean(dim=1)[target].mean()))
    return Diagnosis(source_reliance=round(reliance, 4), pairs=len(pairs),
                     cross_attention_share=[None if v is None else round(v, 4) for v in shares],
                     cross_attention_entropy=[None if v is None else round(v, 4) for v in entropies])

