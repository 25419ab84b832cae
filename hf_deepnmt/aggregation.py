"""dou2018 (Exploiting Deep Representations for NMT): how one stack of the Transformer combines its layers.

Layer aggregation (§3.1.1) — ``encoder_layer_aggregation`` / ``decoder_layer_aggregation``:

* ``dense`` (Eq. (4)): H^l = Layer(H^{l−1}) + Σ_{i=1}^{l−1} H^i, no parameters;
* ``linear`` (Eq. (5), read as docs/dou2018.md explains): the input of every layer and the stack's output are each
  a linear combination, with d×d matrices, of all representations below them, the embeddings H^0 included;
* ``iterative`` (Eq. (6)): Ĥ^1 = H^1, Ĥ^l = AGG(H^l, Ĥ^{l−1}); the output is Ĥ^L;
* ``hierarchical`` (§3.1.1, Fig. 2): a node per layer pair, AGG(H^{2i−1}, H^{2i}[, Ĥ^{i−1}]), each node fed back as
  the input of layer 2i+1; the last node is the output.

`AggregationFunction` is AGG of Eq. (7), also used by multi-layer attention (Eq. (8)) to merge the attended layers.
H^0 is the embedding output (after positions), H^1 … H^L the layer outputs; the aggregated result replaces the
stack's output (encoder: the cross-attention memory, decoder: the input of the output projection).

Every operation is position-wise, so incremental decoding needs no extra cache for aggregation.
This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

LAYER_AGGREGATIONS: tuple[str, ...] = ("none", "dense", "linear", "iterative", "hierarchical")
AGGREGATION_ACTIVATIONS: tuple[str, ...] = ("sigmoid", "relu")


class AggregationFunction(nn.Module):
    """Eq. (7) dou2018: AGG(x, y[, z]) = LN(FFN([x; y[; z]]) + x + y [+ z]).

    FFN = Linear(k·d → d_ffn) → activation (sigmoid in the paper, ReLU its Table 4 alternative) → Linear(d_ffn → d),
    with d_ffn the stack's FFN width: at Base (d 512, d_ffn 2048) a 2-input AGG has 3.15M parameters, the figure that
    reproduces dou2018 Table 1 (docs/dou2018.md).
    """

    def __init__(self, num_inputs: int, d_model: int, ffn_dim: int, activation: str, eps: float):
        super().__init__()
        self.num_inputs = num_inputs
        self.fc1 = nn.Linear(num_inputs * d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, d_model)
        self.layer_norm = nn.LayerNorm(d_model, eps=eps)
        self.activation = torch.sigmoid if activation == "sigmoid" else F.relu

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != self.num_inputs:
            raise ValueError(f"AggregationFunction: built for {self.num_inputs} inputs, got {len(inputs)}.")
        concatenated = torch.cat(inputs, dim=-1)  # (B, T, k·d): [x; y[; z]]
        residual = inputs[0]
        for extra in inputs[1:]:
            residual = residual + extra  # x + y [+ z]
        return self.layer_norm(self.fc2(self.activation(self.fc1(concatenated))) + residual)  # Eq. (7) dou2018


class LinearCombination(nn.Module):
    """Σ_i W_i H^i over ``num_inputs`` representations, one d×d matrix each (Eq. (5) dou2018), unnormalised.

    ``weight`` is ``(num_inputs, d, d)``; it is initialised (in `DeepTransformerPreTrainedModel._init_weights`) to
    W = I for the newest input and 0 for the others, so a linear-aggregation model starts as the vanilla one.
    """

    def __init__(self, num_inputs: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_inputs, d_model, d_model))

    def reset_to_newest(self) -> None:
        """W = I for the newest (last) input, 0 for the others."""
        with torch.no_grad():
            self.weight.zero_()
            self.weight[-1].copy_(torch.eye(self.weight.size(-1), dtype=self.weight.dtype))

    def forward(self, states: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack(states, dim=0)  # (n, B, T, d), or (n, N, d) packed in training
        equation = "nbtd,ned->bte" if stacked.dim() == 4 else "nkd,ned->ke"
        return torch.einsum(equation, stacked, self.weight)  # Eq. (5) dou2018: Σ_i W_i h^i


class LayerAggregation(nn.Module):
    """The aggregation modules of one stack of ``num_layers`` layers; an `AggregationRun` walks a forward pass through them."""

    def __init__(self, kind: str, num_layers: int, d_model: int, ffn_dim: int, activation: str, eps: float):
        super().__init__()
        if kind not in LAYER_AGGREGATIONS or kind == "none":
            raise ValueError(f"LayerAggregation: `kind` = {kind!r} is not allowed; use one of {LAYER_AGGREGATIONS[1:]}.")
        self.kind = kind
        self.num_layers = num_layers
        if kind == "linear":
            # layer l reads Σ_{i<l} W_i^{(l)} H^i (l matrices); the output is Σ_{i≤L} W_i^{(out)} H^i (L+1)
            self.layer_inputs = nn.ModuleList(LinearCombination(l, d_model) for l in range(1, num_layers + 1))
            self.output_combination = LinearCombination(num_layers + 1, d_model)
        elif kind == "iterative":
            # Ĥ^l = AGG(H^l, Ĥ^{l−1}) for l = 2..L
            self.nodes = nn.ModuleList(
                AggregationFunction(2, d_model, ffn_dim, activation, eps) for _ in range(num_layers - 1))
        elif kind == "hierarchical":
            # one node per layer pair: 2 inputs for the first, 3 (the pair + the previous node) after it; an odd
            # last layer is merged with the previous node by a 2-input node (docs/dou2018.md)
            pairs = num_layers // 2
            nodes = [AggregationFunction(2 if i == 0 else 3, d_model, ffn_dim, activation, eps) for i in range(pairs)]
            if num_layers % 2:
                nodes.append(AggregationFunction(2, d_model, ffn_dim, activation, eps))
            self.nodes = nn.ModuleList(nodes)


class AggregationRun:
    """One forward pass through a stack: what layer l reads, what it contributes, what the stack outputs.

    ``outputs`` holds H^0 (the embeddings) and every H^l recorded so far (with dense connections, H^l already
    includes the sum of the layers below it, Eq. (4)).
    """

    def __init__(self, aggregation: LayerAggregation | None, embeddings: torch.Tensor):
        self.aggregation = aggregation
        self.kind = "none" if aggregation is None else aggregation.kind
        self.outputs: list[torch.Tensor] = [embeddings]
        self.node: torch.Tensor | None = None  # the newest iterative / hierarchical node
        self.dense_sum: torch.Tensor | None = None  # Σ_{i≥1} H^i so far

    def layer_input(self, layer: int) -> torch.Tensor:
        """The input of layer ``layer`` (1-based)."""
        if self.kind == "linear":
            return self.aggregation.layer_inputs[layer - 1](self.outputs[:layer])  # Eq. (5) dou2018, per layer
        if self.kind == "hierarchical" and layer % 2 == 1 and self.node is not None:
            return self.node  # §3.1.1 dou2018: the node of layers 2i−1, 2i is the input of layer 2i+1
        return self.outputs[layer - 1]

    def add(self, layer: int, output: torch.Tensor) -> torch.Tensor:
        """Record layer ``layer``'s output and return H^layer."""
        if self.kind == "dense":
            if self.dense_sum is not None:
                output = output + self.dense_sum  # Eq. (4) dou2018: Layer(H^{l−1}) + Σ_{i=1}^{l−1} H^i
            self.dense_sum = output if self.dense_sum is None else self.dense_sum + output
        self.outputs.append(output)
        if self.kind == "iterative":
            # Eq. (6) dou2018: Ĥ^1 = H^1, Ĥ^l = AGG(H^l, Ĥ^{l−1})
            self.node = output if layer == 1 else self.aggregation.nodes[layer - 2](output, self.node)
        elif self.kind == "hierarchical":
            nodes = self.aggregation.nodes
            if layer % 2 == 0:
                pair = self.outputs[layer - 1], output  # H^{2i−1}, H^{2i}
                index = layer // 2 - 1
                self.node = nodes[index](*pair) if index == 0 else nodes[index](*pair, self.node)  # §3.1.1 dou2018
            elif layer == self.aggregation.num_layers:
                self.node = nodes[-1](output, self.node)  # odd L: AGG(H^L, Ĥ^{prev}), docs/dou2018.md
        return output

    def output(self) -> torch.Tensor:
        """The stack's output: H^L, or the aggregation of §3.1.1."""
        if self.kind == "linear":
            return self.aggregation.output_combination(self.outputs)  # Eq. (5) dou2018: Σ_{i=0}^{L} W_i H^i
        if self.kind in ("iterative", "hierarchical"):
            return self.node
        return self.outputs[-1]
