"""meng2019 DTMT: a deep transition RNN encoder-decoder for NMT, as a transformers model family.

Meng & Zhang (AAAI 2019), "DTMT: A Novel Deep Transition Architecture for Neural Machine Translation". Equation
numbers below are the paper's; every decision the paper leaves open is explained in ``docs/meng2019-dtmt.md``.

Read top to bottom:

1. the recurrent units — L-GRU (Eq. (14)-(16)), GRU (Eq. (6)-(9)) and T-GRU (Eq. (10)-(13)), each with per-gate
   LayerNorm — as modules that hold the parameters and as step functions that run them;
2. the transition block (Fig. 2): one L-GRU/GRU at the bottom and ``transition_depth`` T-GRUs above it;
3. the bidirectional, length-aware deep transition encoder (§Encoder);
4. multi-head additive attention and the deep transition decoder: query transition → attention → decoder
   transition → readout (§Decoder, Eq. (1)-(3), (5));
5. `DTMTModel` and `DTMTForConditionalGeneration` (generation through `GenerationMixin` and `DTMTCache`).

Speed (CPU): the input-side projections of every timestep are one matmul over the whole sequence before the
recurrence (encoder; the query transition of the decoder, which is teacher-forced in training); all gates of a unit
and its candidate share one matmul per step; both encoder directions run in the same loop as one batched matmul; the
attention keys are projected once per sentence; the readout runs once after the loop.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only torch,
transformers and same-folder modules with ``from .module import Name``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init
from torch.utils.checkpoint import checkpoint
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqModelOutput

from .cache_dtmt import DTMTCache
from .configuration_dtmt import DTMTConfig
from .losses import LossNormalizers, translation_nll_objective
from .modeling_common import (
    DeepTransformerSeq2SeqLMOutput,
    HubReadyMixin,
    TranslationGenerationMixin,
    as_encoder_output,
    bind_shared_embedding,
    cache_field,
    check_attention_mask,
    check_one_input,
    check_sequence_fits,
    check_token_ids,
    merge_cache_arguments,
    output_flags,
    seq2seq_lm_output,
    sinusoidal_positions,
)
from .errors import UserInputError
from .handler import EndpointHandler  # noqa: F401  (so that save_pretrained copies handler.py)


# ----------------------------------------------------------------------------------------------------------------
# 1. Recurrent units
# ----------------------------------------------------------------------------------------------------------------
class PackedUnit(NamedTuple):
    """The per-step parameters of one unit, or of ``D`` parallel units (the two encoder directions), stacked."""

    weight: torch.Tensor
    """``(D, d, K)``: the state projection, transposed for ``baddbmm``."""
    bias: torch.Tensor
    """``(D, 1, K)``: zero on the gate rows, the candidate bias b on the last d rows."""
    norm_weight: torch.Tensor
    """``(D, 1, n, d)``: the gain of each gate's LayerNorm."""
    norm_bias: torch.Tensor
    """``(D, 1, n, d)``: the offset of each gate's LayerNorm."""


class _RecurrentUnit(nn.Module):
    """What L-GRU, GRU and T-GRU share: a fused state projection [gate rows; W_hh] without bias, the candidate bias
    b of (W_hh h + b), and one LayerNorm per gate (§Advanced Techniques: "per-gate layer normalization ... within
    each gate"; gate projections carry no bias, the LayerNorm offset takes that role, as in the authors' code)."""

    num_gates: int

    def __init__(self, hidden_size: int, num_gates: int) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_gates = num_gates
        self.state_proj = nn.Linear(hidden_size, (num_gates + 1) * hidden_size, bias=False)
        self.candidate_bias = nn.Parameter(torch.zeros(hidden_size))
        self.gate_norm_weight = nn.Parameter(torch.ones(num_gates, hidden_size))
        self.gate_norm_bias = nn.Parameter(torch.zeros(num_gates, hidden_size))

    @staticmethod
    def pack(units: Sequence[_RecurrentUnit]) -> PackedUnit:
        """Stack the per-step parameters of parallel units (one per direction) for one batched matmul per step."""
        d = units[0].hidden_size
        gate_rows = units[0].num_gates * d
        if len(units) == 1:
            unit = units[0]
            weight = unit.state_proj.weight.t().unsqueeze(0)  # (1, d, K), a view
            bias = F.pad(unit.candidate_bias, (gate_rows, 0)).view(1, 1, -1)  # (1, 1, K)
            norm_weight = unit.gate_norm_weight[None, None]  # (1, 1, n, d)
            norm_bias = unit.gate_norm_bias[None, None]
        else:
            weight = torch.stack([unit.state_proj.weight.t() for unit in units])  # (D, d, K)
            bias = torch.stack([F.pad(unit.candidate_bias, (gate_rows, 0)) for unit in units]).unsqueeze(1)  # (D, 1, K)
            norm_weight = torch.stack([unit.gate_norm_weight for unit in units]).unsqueeze(1)  # (D, 1, n, d)
            norm_bias = torch.stack([unit.gate_norm_bias for unit in units]).unsqueeze(1)
        return PackedUnit(weight, bias, norm_weight, norm_bias)


class DTMTGatedUnit(_RecurrentUnit):
    """The bottom unit of a transition block, fed by an input x (embedding or attention context) and the state h.

    L-GRU (``linear_transformation=True``), Eq. (14)-(16) meng2019::

        r, z, l = σ(LN(W_x· x + W_h· h))                      Eq. (8), (9), (16), per-gate LayerNorm
        h̃ = tanh(W_xh x + r ⊙ (W_hh h + b)) + l ⊙ W_x x        Eq. (15)
        h' = (1 − z) ⊙ h + z ⊙ h̃                               Eq. (14)

    GRU (``linear_transformation=False``): the same without l and W_x x (Eq. (6)-(9)), the ShallowRNMT unit.
    ``input_proj`` holds every input-side matrix, [W_xr; W_xz; (W_xl;) W_xh; (W_x)], so that a whole sequence is
    projected in one matmul before the recurrence.
    """

    def __init__(self, input_size: int, hidden_size: int, linear_transformation: bool) -> None:
        super().__init__(hidden_size, num_gates=3 if linear_transformation else 2)
        self.linear_transformation = linear_transformation
        self.input_size = input_size
        input_rows = (self.num_gates + 1 + int(linear_transformation)) * hidden_size
        self.input_proj = nn.Linear(input_size, input_rows, bias=False)


class DTMTTransitionGRU(_RecurrentUnit):
    """T-GRU, Eq. (10)-(13) meng2019: a GRU whose only input is the state h of the unit below::

        r, z = σ(LN(W_h· h))                 Eq. (12), (13), per-gate LayerNorm
        h̃ = tanh(r ⊙ (W_hh h + b))           Eq. (11)
        h' = (1 − z) ⊙ h + z ⊙ h̃             Eq. (10)
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__(hidden_size, num_gates=2)


def _keep_dtype(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Under mixed precision the candidate and gates may come out in another dtype than the state, which keeps its
    own; in one precision this is no operator at all (fewer operators per timestep, docs/meng2019-dtmt.md, "Speed")."""
    return x if x.dtype == like.dtype else x.to(like.dtype)


def gated_unit_step(xp: torch.Tensor, h: torch.Tensor, p: PackedUnit, num_gates: int, linear_transformation: bool,
                    rnn_dropout: float, training: bool, eps: float) -> torch.Tensor:
    """One L-GRU/GRU step of ``D`` parallel units. ``xp`` ``(D, B, K_in)``: the unit's input projections of this
    timestep (precomputed); ``h`` ``(D, B, d)``. Gate order: r, z, l.

    Each tensor is cut with one ``split``/``unbind`` rather than several slices: autograd then joins the pieces'
    gradients with one ``cat``/``stack`` instead of zero-filling a full-size tensor per slice."""
    d = h.size(-1)
    g_rows = num_gates * d
    hp = torch.baddbmm(p.bias, h, p.weight)  # (D, B, (n+1)·d): [W_h· h for the gates; W_hh h + b]
    h_gates, h_candidate = hp.split([g_rows, d], dim=-1)
    x_parts = xp.split([g_rows, d, d] if linear_transformation else [g_rows, d], dim=-1)  # [W_x·x; W_xh x; (W_x x)]
    # (D, B, n, d); a view with -1 for B, not unflatten, which the ONNX export's traced loop cannot decompose
    pre = (x_parts[0] + h_gates).view(h.size(0), -1, num_gates, d)
    gates = torch.sigmoid(torch.addcmul(p.norm_bias, F.layer_norm(pre, (d,), eps=eps), p.norm_weight))  # Eq. (8), (9), (16)
    gate = gates.unbind(2)  # r, z(, l): each (D, B, d)
    candidate = torch.tanh(torch.addcmul(x_parts[1], gate[0], h_candidate))  # Eq. (7)/(15)
    if linear_transformation:
        candidate = torch.addcmul(candidate, gate[2], x_parts[2])  # Eq. (15): + l ⊙ H(x), H(x) = W_x x
    candidate = F.dropout(candidate, rnn_dropout, training)  # §Advanced Techniques: dropout on the candidate activation
    return torch.lerp(h, _keep_dtype(candidate, h), _keep_dtype(gate[1], h))  # Eq. (6)/(14): (1 − z) ⊙ h + z ⊙ h̃


def transition_gru_step(h: torch.Tensor, p: PackedUnit, rnn_dropout: float, training: bool,
                        eps: float) -> torch.Tensor:
    """One T-GRU step of ``D`` parallel units; ``h`` ``(D, B, d)``. Gate order: r, z."""
    d = h.size(-1)
    hp = torch.baddbmm(p.bias, h, p.weight)  # (D, B, 3d): [W_hr h; W_hz h; W_hh h + b]
    h_gates, h_candidate = hp.split([2 * d, d], dim=-1)
    pre = h_gates.view(h.size(0), -1, 2, d)  # (D, B, 2, d), as in `gated_unit_step`
    gates = torch.sigmoid(torch.addcmul(p.norm_bias, F.layer_norm(pre, (d,), eps=eps), p.norm_weight))  # Eq. (12), (13)
    reset, update = gates.unbind(2)  # each (D, B, d)
    candidate = torch.tanh(reset * h_candidate)  # Eq. (11)
    candidate = F.dropout(candidate, rnn_dropout, training)
    return torch.lerp(h, _keep_dtype(candidate, h), _keep_dtype(update, h))  # Eq. (10)


# ----------------------------------------------------------------------------------------------------------------
# 2. Transition block
# ----------------------------------------------------------------------------------------------------------------
class DTMTTransition(nn.Module):
    """One deep transition module (Fig. 2): an L-GRU (or GRU) at the bottom and ``depth`` T-GRUs above it.

    The state carried to the next timestep is the output of the top T-GRU (§T-GRU: "the state output of the last
    T-GRU ... is carried over as the state input of the first GRU for the next time step").
    """

    def __init__(self, input_size: int, config: DTMTConfig, depth: int) -> None:
        super().__init__()
        d = config.d_model
        self.unit = DTMTGatedUnit(input_size, d, linear_transformation=config.rnn_cell == "lgru")
        self.t_grus = nn.ModuleList(DTMTTransitionGRU(d) for _ in range(depth))
        self.rnn_dropout = config.rnn_dropout
        self.eps = config.layer_norm_eps

    @staticmethod
    def project_inputs(blocks: Sequence[DTMTTransition], inputs: torch.Tensor) -> torch.Tensor:
        """The bottom unit's input projections of ``D`` parallel blocks: ``inputs`` ``(D, N, in)`` -> ``(D, N, K_in)``
        in one (batched) matmul for all N positions."""
        if len(blocks) == 1:
            return F.linear(inputs, blocks[0].unit.input_proj.weight)
        weight = torch.stack([block.unit.input_proj.weight.t() for block in blocks])  # (D, in, K_in)
        return torch.bmm(inputs, weight)

    @staticmethod
    def step_function(blocks: Sequence[DTMTTransition], training: bool, compiled: bool = False,
                      mode: str | None = None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``step(xp, h) -> h'``: one timestep of ``D`` parallel blocks (bottom unit, then every T-GRU), with the
        parameters packed once for the whole sequence; ``compiled``: the step as one `torch.compile` graph of
        ``mode`` (`DTMTPreTrainedModel.compile_recurrence`)."""
        first = blocks[0]
        unit = _RecurrentUnit.pack([block.unit for block in blocks])
        t_grus = [_RecurrentUnit.pack([block.t_grus[i] for block in blocks]) for i in range(len(first.t_grus))]
        return functools.partial(
            compiled_function(_block_step, mode) if compiled else _block_step, unit=unit, t_grus=t_grus,
            num_gates=first.unit.num_gates, linear_transformation=first.unit.linear_transformation, rnn_dropout=first.rnn_dropout,
            training=training, eps=first.eps)


def _block_step(xp: torch.Tensor, h: torch.Tensor, unit: PackedUnit, t_grus: list[PackedUnit], num_gates: int,
                linear_transformation: bool, rnn_dropout: float, training: bool, eps: float) -> torch.Tensor:
    """§Encoder / §Decoder: h_{j,0} = L-GRU(x_j, h_{j-1,L}); h_{j,k} = T-GRU_k(h_{j,k-1}) for 1 ≤ k ≤ L."""
    h = gated_unit_step(xp, h, unit, num_gates, linear_transformation, rnn_dropout, training, eps)
    for packed in t_grus:
        h = transition_gru_step(h, packed, rnn_dropout, training, eps)
    return h


@functools.cache
def compiled_function(function: Callable[..., Any], mode: str | None = None) -> Callable[..., Any]:
    """``function`` (one timestep, a module-level function of tensors) as one `torch.compile` graph, made once per
    process: the time loop stays in Python and every timestep of every length calls the same compiled step, so a new
    target length never recompiles (compiling the whole model instead would unroll the loop, one graph per length).
    The parameters are arguments, so models of one shape share the graph; a new batch size or source length
    recompiles once, after which that size is symbolic (torch's automatic dynamic shapes); a new mode (training or
    not, gradients on or off, autocast) adds a graph. The steps compile as one graph each (tests/test_compile_dtmt.py
    checks ``fullgraph=True``); should a run ever pass torch's recompile limit, torch warns and runs that step
    eagerly instead of failing. docs/meng2019-dtmt.md, "Speed"."""
    return torch.compile(function, mode=mode)


# ----------------------------------------------------------------------------------------------------------------
# 3. Encoder
# ----------------------------------------------------------------------------------------------------------------
def reverse_index(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, S)`` gather index that reverses each row within its length and leaves padding in place
    (``tf.reverse_sequence``). Applying it twice is the identity."""
    positions = torch.arange(length, device=lengths.device)[None]  # (1, S)
    reversed_positions = lengths[:, None] - 1 - positions  # (B, S)
    return torch.where(reversed_positions >= 0, reversed_positions, positions)


def exported_recurrence(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], inputs: torch.Tensor,
                        initial: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``step(project(x_t), h)`` over the first dimension of ``inputs`` from state ``initial`` as one traced loop,
    for `torch.onnx.export`: a Python loop over a sequence of symbolic length would be unrolled for the example's
    length only. torch's ``scan`` becomes ONNX's ``Scan`` operator; the states of every step come back stacked
    ``(S, *initial.shape)``. The input projection runs per step inside the loop (the eager path does it for all steps
    at once before its loop): torch 2.13's ONNX decomposition of ``scan`` fails on loop inputs computed by a matmul
    over a symbolic batch. Eager code keeps the Python loop (docs/fast-inference.md)."""
    from torch._higher_order_ops.scan import scan  # torch's (prototype) scan: only ever traced, never run eagerly

    def combine(state: torch.Tensor, x_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = step(project(x_t), state)
        return state, state.clone()  # scan forbids a carry that aliases an output

    return scan(combine, initial, inputs)[1]


class _DTMTStack(nn.Module):
    """What encoder and decoder share: embedding + bias + scaled positions + dropout, and per-step checkpointing."""

    embed_tokens: nn.Embedding

    def __init__(self, config: DTMTConfig) -> None:
        super().__init__()
        self.config = config
        # The authors add a learned bias vector to the embeddings of both sides (docs/meng2019-dtmt.md).
        self.embed_bias = nn.Parameter(torch.zeros(config.d_model))
        self.gradient_checkpointing = False
        self.compiled_recurrence = False  # set by `DTMTPreTrainedModel.compile_recurrence`
        self.compile_mode: str | None = None  # its ``mode``: None (inductor's default) or a `torch.compile` mode

    def _compiled_steps(self) -> bool:
        """Whether this call runs the compiled timestep: asked for, and not already inside a compiled (or exported)
        graph, which traces the plain step itself."""
        return self.compiled_recurrence and not torch.compiler.is_compiling()

    def _embed(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None,
               start: int | torch.Tensor) -> torch.Tensor:
        """``start``: the position of the first token; a 0-d tensor in the ONNX export's decoder step (its
        ``position`` input), where the length check below is the runtime's (docs/fast-inference.md)."""
        check_one_input(type(self).__name__, input_ids, inputs_embeds)
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        x = x + self.embed_bias  # (B, T, d)
        length, d = x.size(1), x.size(2)
        if not isinstance(start, torch.Tensor):
            check_sequence_fits(type(self).__name__, start + length, self.config.max_position_embeddings)
        if self.config.positional_encoding:
            # §Advanced Techniques: sinusoidal positions (Vaswani et al.) scaled by 1/sqrt(d_k), d_k = embedding size
            x = x + sinusoidal_positions(start, length, d, x.device, x.dtype) * d ** -0.5
        return F.dropout(x, self.config.dropout, self.training)  # §Advanced Techniques: dropout on embedding layers

    def _step(self, step: Callable[..., Any], *args: torch.Tensor) -> Any:
        """One timestep; with gradient checkpointing only the step's inputs are kept for the backward pass and its
        inside (gates, LayerNorm statistics, candidates) is recomputed. The compiled step is given tensors of their
        own rather than views into the whole sequence's projections: a view's offset and base would be guarded and
        recompile the step."""
        if self._compiled_steps():
            args = tuple(arg.clone() if arg._base is not None else arg for arg in args)
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # transformers' `activation_checkpointing_enable(...)` sets the function with the user's options
            # (``use_reentrant`` True or False); every tensor the step reads is a positional argument
            run = getattr(self, "_gradient_checkpointing_func", None) or functools.partial(checkpoint,
                                                                                           use_reentrant=False)
            return run(step, *args)
        return step(*args)


class DTMTEncoder(_DTMTStack):
    """Bidirectional deep transition encoder (§Encoder): a forward and a backward transition block over the source
    embeddings; the annotation of x_j is C_j = [→h_j ; ←h_j] (2·d wide).

    Length-aware: the backward block reads each sentence right to left *within its length*, so padding never
    reaches a real position in either direction and appending padding changes no annotation. Annotations at padded
    positions are zero (as the authors' copy-through loop leaves them).
    """

    main_input_name = "input_ids"

    def __init__(self, config: DTMTConfig) -> None:
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        depth = config.block_depths()["encoder"]
        self.forward_transition = DTMTTransition(config.d_model, config, depth)
        self.backward_transition = DTMTTransition(config.d_model, config, depth)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> BaseModelOutput | tuple:
        check_token_ids("input_ids", input_ids, self.config.vocab_size)  # docs/training.md, "Bad input"
        x = self._embed(input_ids, inputs_embeds, start=0)  # (B, S, d)
        batch, length, d = x.shape
        check_attention_mask("attention_mask", attention_mask, "input_ids", (batch, length))
        if attention_mask is None:
            lengths = torch.full((batch,), length, dtype=torch.long, device=x.device)
        else:
            lengths = attention_mask.sum(dim=1).long()
        index = reverse_index(lengths, length).unsqueeze(-1)  # (B, S, 1)
        x_backward = x.gather(1, index.expand(-1, -1, d))  # (B, S, d): each sentence reversed within its length
        blocks = (self.forward_transition, self.backward_transition)
        compiled = self._compiled_steps()
        step = DTMTTransition.step_function(blocks, self.training, compiled, self.compile_mode)
        h = x.new_zeros(2, batch, d)  # s_0 = 0
        if compiled:  # a leaf that asks for a gradient whenever the steps' inputs do, so that every step (the first
            h.requires_grad_(x.requires_grad)  # too) sees one kind of state (`compiled_function`)
        if torch.compiler.is_exporting():  # torch.onnx.export: one traced loop over the symbolic length
            inputs = torch.stack([x, x_backward]).permute(2, 0, 1, 3)  # (S, 2, B, d) time-major
            stacked = exported_recurrence(step, inputs, h, lambda xt: DTMTTransition.project_inputs(blocks, xt))
            stacked = stacked.permute(1, 2, 0, 3)  # (S, 2, B, d) -> (2, B, S, d)
        else:
            directions = torch.stack([x, x_backward]).transpose(1, 2).reshape(2, length * batch, d)  # (2, S·B, d)
            projected = DTMTTransition.project_inputs(blocks, directions)  # (2, S·B, K_in): all steps in one matmul
            projected = projected.view(2, length, batch, -1).transpose(0, 1)  # (S, 2, B, K_in)
            states = []
            for xp in projected.unbind(0):  # one UnbindBackward for all steps, not a full-size zero fill per step
                h = self._step(step, xp, h)  # (2, B, d): both directions in one batched step
                states.append(h)
            stacked = torch.stack(states, dim=2)  # (2, B, S, d)
        backward = stacked[1].gather(1, index.expand(-1, -1, d))  # (B, S, d), back in left-to-right order
        annotations = torch.cat([stacked[0], backward], dim=-1)  # (B, S, 2d): C = {[→h_j, ←h_j]}
        if attention_mask is not None:
            annotations = annotations * attention_mask.unsqueeze(-1).to(annotations.dtype)
        hidden_states = (x, annotations) if output_hidden_states else None
        output = BaseModelOutput(last_hidden_state=annotations, hidden_states=hidden_states)
        return output if return_dict is not False else output.to_tuple()


# ----------------------------------------------------------------------------------------------------------------
# 4. Attention and decoder
# ----------------------------------------------------------------------------------------------------------------
class DTMTAttention(nn.Module):
    """Multi-head additive attention (§Decoder, c_t = Multihead-Attention(C, s_{t,Lq}); Eq. (3), (5) per head).

    For head k: e_{k,j} = vᵀ tanh(W_q^k s + U^k h_j), α_k = softmax_j(e_k), c^k = Σ_j α_{k,j} h_j^k, where W_q
    (d -> d) and U (2d -> d) are split into heads, the score vector v is shared by all heads and the values are the
    annotations themselves split into heads (no value projection; the authors' code). The heads are concatenated
    and transformed by ``out_proj`` (2d -> 2d): the context c_t stays 2·d wide, which the paper's parameter counts
    require (docs/meng2019-dtmt.md).
    """

    def __init__(self, config: DTMTConfig) -> None:
        super().__init__()
        d = config.d_model
        self.num_heads = config.attention_heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(2 * d, d, bias=False)
        self.score = nn.Parameter(torch.zeros(d // config.attention_heads))  # v_a of Eq. (5), shared by the heads
        self.out_proj = nn.Linear(2 * d, 2 * d)

    def prepare(self, annotations: torch.Tensor, attention_mask: torch.Tensor | None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Once per sentence: keys U·h_j ``(B, H, S, d/H)``, values ``(B, H, S, 2d/H)``, mask bias ``(B, 1, S)``."""
        batch, length, _ = annotations.shape
        keys = self.k_proj(annotations).view(batch, length, self.num_heads, -1).transpose(1, 2).contiguous()
        values = annotations.view(batch, length, self.num_heads, -1).transpose(1, 2).contiguous()
        mask_bias = annotations.new_zeros(batch, 1, length)
        if attention_mask is not None:
            mask_bias = mask_bias.masked_fill(~attention_mask.bool()[:, None, :], torch.finfo(mask_bias.dtype).min)
        return keys, values, mask_bias

    def packed(self) -> AttentionWeights:
        """The per-step parameters, for the module-level (compilable) `additive_attention`."""
        return AttentionWeights(self.q_proj.weight, self.score, self.out_proj.weight, self.out_proj.bias, self.num_heads)

    def forward(self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask_bias: torch.Tensor,
                weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``query`` ``(B, d)`` -> context c_t ``(B, 2d)`` and the weights α ``(B, H, S)``. Given ``weights``
        (α of this step computed before, see `DTMTDecoder.forward`), the context is built from them."""
        return additive_attention(query, self.packed(), keys, values, mask_bias, weights)


class AttentionWeights(NamedTuple):
    """`DTMTAttention`'s per-step parameters."""

    query: torch.Tensor
    """``(d, d)``: W_q."""
    score: torch.Tensor
    """``(d/H,)``: v, shared by the heads."""
    out_weight: torch.Tensor
    """``(2d, 2d)``: the output transformation of the concatenated heads."""
    out_bias: torch.Tensor
    """``(2d,)``."""
    num_heads: int


def additive_attention(query: torch.Tensor, p: AttentionWeights, keys: torch.Tensor, values: torch.Tensor,
                       mask_bias: torch.Tensor, weights: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """`DTMTAttention.forward` as a function of tensors: ``query`` ``(B, d)``, keys ``(B, H, S, d/H)``, values
    ``(B, H, S, 2d/H)``, mask bias ``(B, 1, S)`` -> context ``(B, 2d)`` and weights α ``(B, H, S)``."""
    batch = query.size(0)
    if weights is None:
        q = F.linear(query, p.query).view(batch, p.num_heads, 1, -1)  # (B, H, 1, d/H)
        # (B, H, S): Eq. (5) e = vᵀ tanh(W s + U h); v as a (d/H, 1) matrix: ONNX Runtime runs the batched
        # matrix-vector form of this product ~9x slower (measured, docs/fast-inference.md), torch alike
        scores = torch.matmul(torch.tanh(keys + q), p.score[:, None])[..., 0]
        weights = torch.softmax(scores + mask_bias, dim=-1)  # (B, H, S): Eq. (5) a = softmax(e)
    heads = torch.matmul(weights.unsqueeze(-2), values)  # (B, H, 1, 2d/H): Eq. (3) c = Σ_j a_j h_j per head
    return F.linear(heads.view(batch, -1), p.out_weight, p.out_bias), weights  # (B, 2d)


def decoder_step_function(yp: torch.Tensor, state: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          mask_bias: torch.Tensor, *given: torch.Tensor, query_step: Callable,
                          attention: AttentionWeights, context_weight: torch.Tensor, decoder_step: Callable
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One target step of `DTMTDecoder` from s_{t-1} ``(1, B, d)`` and the query block's input projection of
    y_{t-1} ``(1, B, K_in)`` (``given``: this step's α, when the decoder replays weights it returns, see
    `DTMTDecoder.forward`). A module-level function of tensors, so that `compiled_function` makes one graph of it
    for every model and every length."""
    query = query_step(yp, state)  # (1, B, d): s_{t,Lq}, query transition
    context, weights = additive_attention(query[0], attention, keys, values, mask_bias, *given)  # (B, 2d): c_t
    cp = F.linear(context, context_weight).unsqueeze(0)  # (1, B, K_in): the decoder L-GRU's input projection of c_t
    state = decoder_step(cp, query)  # (1, B, d): s_t, decoder transition whose L-GRU input is c_t
    return state, context, weights


class DTMTDecoder(_DTMTStack):
    """Deep transition decoder (§Decoder, Fig. 2). Per target step t::

        s_{t,Lq}  = query transition (L-GRU(y_{t-1}, s_{t-1}) + Lq T-GRUs)
        c_t       = Multihead-Attention(C, s_{t,Lq})
        s_t       = decoder transition (L-GRU(c_t, s_{t,Lq}) + Ld T-GRUs)
        readout_t = dropout(tanh(W_o [y_{t-1}; s_t; c_t] + b_o))          Eq. (1): f(c_t, y_{t-1}, s_t)

    s_0 = tanh(W_s · mean_j(C_j) + b_s) over the real source positions (the authors' initial state).
    Incremental decoding keeps s_{t-1}, the projected keys, the values and the mask in a `DTMTCache`.
    """

    main_input_name = "input_ids"

    def __init__(self, config: DTMTConfig, embed_tokens: nn.Embedding | None = None) -> None:
        super().__init__(config)
        d = config.d_model
        if embed_tokens is None:
            self.embed_tokens = nn.Embedding(config.vocab_size, d)
        else:
            bind_shared_embedding(self, embed_tokens)
        depths = config.block_depths()
        self.init_proj = nn.Linear(2 * d, d)
        self.query_transition = DTMTTransition(d, config, depths["query"])
        self.attention = DTMTAttention(config)
        self.decoder_transition = DTMTTransition(2 * d, config, depths["decoder"])  # its L-GRU input is c_t (2d)
        self.readout = nn.Linear(d + d + 2 * d, d)

    def start(self, encoder_hidden_states: torch.Tensor, encoder_attention_mask: torch.Tensor | None) -> DTMTCache:
        """Everything computed once per source sentence: s_0, keys, values and mask, in a fresh `DTMTCache`."""
        keys, values, mask_bias = self.attention.prepare(encoder_hidden_states, encoder_attention_mask)
        if encoder_attention_mask is None:
            mean = encoder_hidden_states.mean(dim=1)
        else:
            mask = encoder_attention_mask.unsqueeze(-1).to(encoder_hidden_states.dtype)  # (B, S, 1)
            mean = (encoder_hidden_states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B, 2d)
        state = torch.tanh(self.init_proj(mean))  # (B, d): s_0
        return DTMTCache(state, keys, values, mask_bias, seen_tokens=0)


    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: DTMTCache | None = None,
        cache: DTMTCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, DTMTCache | None, tuple | None, tuple | None]:
        """Runs the decoder over ``input_ids`` ``(B, T)`` (all T steps in training, one step per call when
        decoding with a cache). Returns (readout ``(B, T, d)``, cache or None, hidden states, attention weights)."""
        past_key_values = merge_cache_arguments(cache, past_key_values)
        if isinstance(past_key_values, DTMTCache):
            cache = past_key_values
        else:  # training, an uncached call, or the first decoding step (generate may hand over an unused cache)
            if encoder_hidden_states is None:
                raise UserInputError(f"{type(self).__name__}: `encoder_hidden_states` is required (run the encoder first).")
            cache = self.start(encoder_hidden_states, encoder_attention_mask)
        y = self._embed(input_ids, inputs_embeds, start=cache.seen_tokens)  # (B, T, d): y_{t-1}
        if output_attentions and torch.is_grad_enabled():
            # A recurrent decoder uses α_t inside the loop, so a tensor stacked afterwards is not what the outputs were
            # computed from: its gradient would be None. Here the weights are computed in a first pass and the
            # outputs in a second pass that reads them back (the same function, the same dropout masks): the
            # returned weights are then on the gradient path, as in every transformers model (docs/meng2019-dtmt.md).
            with torch.random.fork_rng(devices=[y.device] if y.device.type == "cuda" else []):
                _, _, first = self._transitions(y, cache)  # the RNG states (CPU, and the GPU's) are restored after
            decoder_states, context, weights = self._transitions(y, cache, first)
        else:
            decoder_states, context, weights = self._transitions(y, cache)
        readout = torch.tanh(self.readout(torch.cat([y, decoder_states, context], dim=-1)))  # Eq. (1) f(c, y, s)
        readout = F.dropout(readout, self.config.readout_dropout, self.training)  # dropout before prediction
        if use_cache:
            cache.state = decoder_states[:, -1]
            cache.seen_tokens += y.size(1)
        hidden_states = (y, decoder_states, readout) if output_hidden_states else None
        attentions = (weights,) if output_attentions else None  # (B, H, T, S)
        return readout, cache if use_cache else None, hidden_states, attentions

    def _transitions(self, y: torch.Tensor, cache: DTMTCache, weights: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The recurrence over the T embedded targets ``y`` ``(B, T, d)`` from ``cache``'s s_{t-1} (not updated
        here): states s_t ``(B, T, d)``, contexts c_t ``(B, T, 2d)`` and weights α ``(B, H, T, S)``. Given
        ``weights``, step t's context is built from ``weights[:, :, t]`` instead of computing them."""
        # The query block's input projections of every y_{t-1} in one matmul (teacher forcing in training).
        projected = DTMTTransition.project_inputs([self.query_transition], y.transpose(0, 1))  # (T, B, K_in)
        query_step = DTMTTransition.step_function([self.query_transition], self.training)
        decoder_step = DTMTTransition.step_function([self.decoder_transition], self.training)
        step = functools.partial(compiled_function(decoder_step_function, self.compile_mode) if self._compiled_steps()
                                 else decoder_step_function, query_step=query_step, attention=self.attention.packed(),
                                 context_weight=self.decoder_transition.unit.input_proj.weight,
                                 decoder_step=decoder_step)
        state = cache.state.unsqueeze(0)  # (1, B, d)
        states, contexts, all_weights = [], [], []
        given_weights = weights.unbind(2) if weights is not None else None  # each (B, H, S)
        for t, yp in enumerate(projected.unsqueeze(1).unbind(0)):  # each (1, B, K_in); one UnbindBackward
            given = () if given_weights is None else (given_weights[t],)
            state, context, step_weights = self._step(step, yp, state, cache.keys, cache.values, cache.mask_bias,
                                                      *given)
            states.append(state[0])
            contexts.append(context)
            all_weights.append(step_weights)
        weights = torch.stack(all_weights, dim=2) if weights is None else weights  # (B, H, T, S)
        return torch.stack(states, dim=1), torch.stack(contexts, dim=1), weights


# ----------------------------------------------------------------------------------------------------------------
# 5. Models
# ----------------------------------------------------------------------------------------------------------------
class DTMTPreTrainedModel(HubReadyMixin, PreTrainedModel):
    """Weight init and Hub plumbing shared by the DTMT models."""

    config_class = DTMTConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DTMTTransition", "DTMTAttention"]
    # forward divides its training objective by `num_items_in_batch` (the optimizer step's target tokens) when
    # transformers' Trainer passes it, so the Trainer must not divide by the accumulation steps again.
    accepts_loss_kwargs = True

    base_model_class_name = "DTMTModel"
    seq2seq_class_name = "DTMTForConditionalGeneration"

    def __init__(self, config: DTMTConfig, *args: Any, **kwargs: Any) -> None:
        config.check_fields()  # a config mutated after construction is re-validated here
        super().__init__(config, *args, **kwargs)

    def compile_recurrence(self, enabled: bool = True, mode: str | None = None) -> None:
        """Run every timestep of the encoder and the decoder as one `torch.compile` graph (``fullgraph=True``):
        the encoder's transition blocks, and the decoder's query transition + attention + decoder transition. The
        way to compile a recurrent model: the time loop stays in Python, so lengths never recompile; on a GPU the
        dozens of small kernels of a timestep become a few (benchmarks/RESULTS.md, "DTMT"). `deepnmt train
        --torch_compile` calls it. The numbers equal eager's up to float rounding (dropout draws its own random
        numbers). ``mode``: `torch.compile`'s (None: inductor's default). ``enabled=False`` returns to the eager
        steps."""
        from torch._inductor import list_mode_options

        modes = sorted(list_mode_options())
        if mode is not None and mode not in modes:
            raise UserInputError(f"`mode` = {mode!r} is not a torch.compile mode; use one of {modes} or None.")
        for module in self.modules():
            if isinstance(module, _DTMTStack):
                module.compiled_recurrence = enabled
                module.compile_mode = mode

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """§Training Details: every parameter uniform in [-init_range, init_range] (weights, embeddings, biases, the
        attention score vector); LayerNorm gains 1 and offsets 0 (the authors' code). `torch.nn.init`, which
        transformers guards for loaded weights."""
        r = self.config.init_range
        if isinstance(module, nn.Linear):
            init.uniform_(module.weight, -r, r)
            if module.bias is not None:
                init.uniform_(module.bias, -r, r)
        elif isinstance(module, nn.Embedding):
            init.uniform_(module.weight, -r, r)
        elif isinstance(module, _RecurrentUnit):
            init.uniform_(module.candidate_bias, -r, r)
            init.ones_(module.gate_norm_weight)
            init.zeros_(module.gate_norm_bias)
        elif isinstance(module, DTMTAttention):
            init.uniform_(module.score, -r, r)
        if isinstance(module, _DTMTStack):
            init.uniform_(module.embed_bias, -r, r)


class DTMTModel(DTMTPreTrainedModel):
    """DTMT encoder and decoder; returns the readout vectors (the input of the output projection)."""

    def __init__(self, config: DTMTConfig) -> None:
        super().__init__(config)
        self.encoder = DTMTEncoder(config)
        shared = self.encoder.embed_tokens if config.share_encoder_decoder_embeddings else None
        self.decoder = DTMTDecoder(config, shared)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.encoder.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            bind_shared_embedding(self.decoder, value)

    def get_encoder(self, modality: str | None = None) -> DTMTEncoder:
        return self.encoder

    def get_decoder(self) -> DTMTDecoder:
        return self.decoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: DTMTCache | None = None,
        cache: DTMTCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Seq2SeqModelOutput | tuple:
        """The usual seq2seq arguments. ``decoder_attention_mask`` is accepted and not needed: the decoder is
        causal by construction and right-padded targets never influence real positions."""
        past_key_values = merge_cache_arguments(cache, past_key_values)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        output_attentions, output_hidden_states = output_flags(self.config, output_attentions, output_hidden_states)
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states)
        encoder_outputs = as_encoder_output(encoder_outputs)
        readout, cache, hidden_states, attentions = self.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        output = Seq2SeqModelOutput(
            last_hidden_state=readout,
            **cache_field(cache),
            decoder_hidden_states=hidden_states,
            cross_attentions=attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
        )
        return output if return_dict is not False else output.to_tuple()


class DTMTForConditionalGeneration(TranslationGenerationMixin, DTMTPreTrainedModel, GenerationMixin):
    """meng2019 DTMT for translation: `DTMTModel` + the output projection (softmax layer, with bias); generates with
    greedy search, beam search and sampling through `GenerationMixin` and `DTMTCache`.

    ``labels`` give the mean token-level cross-entropy over non-pad targets as ``loss`` (padding may be -100 or the
    pad id). Label smoothing (0.1 in the paper) lives in `hf_deepnmt.losses` / the trainer. The default generation
    config is the paper's decoding: beam 4, length penalty α = 0.6 (transformers divides the log-probability by
    length^α; the authors' THUMT uses GNMT's ((5 + length) / 6)^α, docs/meng2019-dtmt.md).
    """

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed_tokens.weight"}
    # A recurrent decoder state cannot be rolled back: transformers refuses assisted and prompt-lookup decoding for
    # stateful models with its own message, instead of failing inside them.
    _is_stateful = True

    def __init__(self, config: DTMTConfig) -> None:
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:  # the one embedding is registered under the encoder
            self._tied_weights_keys = {"lm_head.weight": "model.encoder.embed_tokens.weight"}
        self.model = DTMTModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size)
        self.post_init()
        self.set_translation_generation_defaults()  # beam 4: §Training Details, beam_size = 4
        # "length penalty alpha = 0.6" (§Training Details), applied in the form config.length_penalty_form names: GNMT's
        # ((5 + |Y|) / 6) ** α by default, as the authors' decoder computes it (`GNMTLengthPenalty`;
        # docs/meng2019-dtmt.md, "Decoding")
        self.generation_config.length_penalty = 0.6

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """No attention key/value cache to pre-build: the model creates its own `DTMTCache` on the first step."""
        return False

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.set_input_embeddings(value)

    def _resize_token_embeddings(self, new_num_tokens: int | None, pad_to_multiple_of: int | None = None,
                                 mean_resizing: bool = True) -> nn.Embedding:
        """transformers resizes the input (source) embedding and the output projection; a separate target
        embedding is resized here too, before the weights are tied again."""
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        decoder = self.model.decoder
        if not self.config.share_encoder_decoder_embeddings and (
                decoder.embed_tokens.num_embeddings != embeddings.num_embeddings):
            decoder.embed_tokens = self._get_resized_embeddings(decoder.embed_tokens, embeddings.num_embeddings,
                                                                mean_resizing=mean_resizing)
        return embeddings

    def _reorder_cache(self, past_key_values: DTMTCache | None, beam_idx: torch.LongTensor) -> DTMTCache | None:
        """Beam search (called by `GenerationMixin` after every step): make the decoder state follow the surviving
        hypotheses. Keys, values and mask are not copied: beam search moves hypotheses only within a sentence's
        beam group, whose rows hold the same (expanded) source, so that copy would change nothing."""
        if isinstance(past_key_values, DTMTCache):
            past_key_values.reorder_state(beam_idx)
        elif past_key_values is not None:
            past_key_values.reorder_cache(beam_idx)
        return past_key_values

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        past_key_values: DTMTCache | None = None,
        cache: DTMTCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        loss_normalizers: LossNormalizers | None = None,
        smoothing_epsilon: float | None = None,
        **kwargs: Any,
    ) -> DeepTransformerSeq2SeqLMOutput | tuple:
        """With ``labels`` the output carries the model's objective (docs/training.md): in training mode the
        label-smoothed NLL (ε = ``smoothing_epsilon``, default ``config.label_smoothing``, 0.1 as meng2019's
        §Advanced Techniques trains the NLL of Eq. (1)), in evaluation mode the unsmoothed NLL;
        ``loss_components`` / ``loss_component_counts`` hold each term. ``num_items_in_batch`` (transformers'
        Trainer) and ``loss_normalizers`` (``DeepNMTTrainer``) make the loss this micro-batch's share of the
        optimizer step's, so gradient accumulation and DDP give the gradient of one large batch."""
        past_key_values = merge_cache_arguments(cache, past_key_values)
        vocab = self.config.vocab_size  # input_ids and attention_mask are checked by the encoder
        # the ids `generate` feeds back after the first step are its own: not scanned (that would sync a GPU)
        check_token_ids("decoder_input_ids", decoder_input_ids, vocab, check_values=past_key_values is None)
        check_token_ids("labels", labels, vocab, allow_ignore_index=True)
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V): Eq. (1) softmax(f(c_t, y_{t-1}, s_t))
        loss = components = counts = None
        if labels is not None:
            epsilon = self.config.label_smoothing if smoothing_epsilon is None else float(smoothing_epsilon)
            pad = self.config.pad_token_id
            source_tokens = (attention_mask.sum() if attention_mask is not None
                             else (input_ids != pad).sum() if input_ids is not None else torch.tensor(0))
            loss, components, counts = translation_nll_objective(
                logits, labels, pad, training=self.training, epsilon=epsilon, source_tokens=source_tokens,
                num_items_in_batch=num_items_in_batch, loss_normalizers=loss_normalizers)
        return seq2seq_lm_output(outputs, logits, loss, components, counts, return_dict)
