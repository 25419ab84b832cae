"""`OnnxSeq2SeqLM`: an ONNX export of this package (``deepnmt export --format onnx``) as a transformers model, so that
``generate`` — transformers' own greedy search, beam search, sampling, logits processors and stopping criteria — runs
on ONNX Runtime sessions instead of torch modules. Nothing of the search is written here: the class only answers
``forward`` with the graphs of `hf_deepnmt.export_onnx` and keeps the decoder's state in `OnnxDecoderCache`.

The ecosystem's driver for this, 🤗 Optimum's ``ORTModelForSeq2SeqLM``, cannot serve: every optimum-onnx release so far
pins transformers < 4.58, and a forced install fails at import under transformers 5 (docs/fast-inference.md).

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code), so that a saved folder's
``handler.py`` can serve an ONNX export without hf_deepnmt installed: it imports only torch, numpy, transformers and
same-folder modules; onnxruntime is imported when a session is opened, in a ``try`` block (transformers' import
check of a Hub folder then does not require it). Its name holds no "onnx": Inference Endpoints' default container
skips every file matching ``*onnx*`` when it downloads a safetensors repository (docs/fast-inference.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import GenerationConfig, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from .cache_dtmt import DecoderStateCache
from .errors import UserInputError
from .modeling_common import TranslationGenerationMixin, cache_field, merge_cache_arguments

MANIFEST = "deepnmt_export.json"


class OnnxDecoderCache(DecoderStateCache):
    """The decoder's state between ONNX decoding steps: the memory (computed once per source sentence by the
    encoder graph: cross-attention keys/values, or DTMT's keys, values and mask), the past (self-attention
    keys/values per slot, or DTMT's state s_{t-1}) and the number of tokens seen. Every tensor has the
    (beam-expanded) batch first.

    `reorder_cache` selects rows of everything; `OnnxSeq2SeqLM._reorder_cache`, which beam search calls, moves
    only the past (`reorder_state`: the memory of a sentence's beam group is one expanded copy). A state cannot be
    rolled back, so `crop` refuses (no assisted decoding).
    """

    def __init__(self, memory: dict[str, torch.Tensor], past: dict[str, torch.Tensor], seen_tokens: int = 0) -> None:
        super().__init__(layers=[])
        self.memory = memory
        self.past = past
        self.seen_tokens = seen_tokens

    def __repr__(self) -> str:
        return f"OnnxDecoderCache(batch={self.batch_size}, past={list(self.past)}, seen_tokens={self.seen_tokens})"

    @property
    def batch_size(self) -> int:
        return next(iter(self.past.values())).size(0)

    def _select(self, index: torch.Tensor) -> None:
        self.reorder_state(index)
        self.memory = {name: value.index_select(0, index) for name, value in self.memory.items()}

    def reorder_state(self, beam_idx: torch.LongTensor) -> None:
        """Reorder only the past (see the class docstring)."""
        self.past = {name: value.index_select(0, beam_idx) for name, value in self.past.items()}


class OnnxEncoder(nn.Module):
    """`OnnxSeq2SeqLM.get_encoder()`: the encoder graph. Its output carries the memory and the initial past as extra
    keys of the `BaseModelOutput`, so that ``generate`` expands them for beams with the encoder states."""

    main_input_name = "input_ids"

    def __init__(self, owner: OnnxSeq2SeqLM):
        super().__init__()
        self.__dict__["owner"] = owner  # not a submodule: the owner holds the sessions

    def forward(self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                inputs_embeds: torch.Tensor | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> BaseModelOutput:
        if input_ids is None or inputs_embeds is not None:
            raise UserInputError("an ONNX export encodes `input_ids` only (no `inputs_embeds`).")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        owner = self.owner
        owner.check_length("a source", input_ids.size(1))
        feeds = {"input_ids": _array(input_ids.long()), "attention_mask": _array(attention_mask.long())}
        outputs = owner.encoder_session.run(owner.graphs["encoder"]["outputs"], feeds)
        named = {name: torch.from_numpy(value) for name, value in zip(owner.graphs["encoder"]["outputs"], outputs)}
        result = BaseModelOutput(last_hidden_state=named.pop("encoder_hidden_states"))
        for name, value in named.items():
            result[name] = value  # memory.* and initial.*: batch-first tensors generate expands for beams
        return result


class OnnxSeq2SeqLM(TranslationGenerationMixin, PreTrainedModel, GenerationMixin):
    """The ONNX export in ``folder`` as a seq2seq model for transformers' ``generate`` (CPU, ONNX Runtime).

    ``OnnxSeq2SeqLM.from_export(folder)`` opens ``encoder.onnx`` and ``decoder.onnx`` with ``intra_threads`` threads;
    ``generate(input_ids=..., attention_mask=..., num_beams=4, ...)`` then behaves as the exported model's
    ``generate`` (the generation defaults travel in the export's ``generation_config.json``; the argument checks are
    the torch models', `TranslationGenerationMixin`), and
    ``forward(input_ids, attention_mask, decoder_input_ids)`` returns the logits of every decoder position.
    """

    main_input_name = "input_ids"
    _is_stateful = True  # the decoder state cannot be cropped: transformers refuses assisted decoding by this flag
    lm_head = None  # the output projection is inside decoder.onnx (TranslationGenerationMixin reads this name)

    def __init__(self, config: PretrainedConfig, folder: str | os.PathLike, intra_threads: int | None = None):
        super().__init__(config)
        self.folder = Path(folder)
        self.manifest = json.loads((self.folder / MANIFEST).read_text(encoding="utf-8"))
        if self.manifest.get("format") != "onnx":
            raise UserInputError(f"{folder} holds a {self.manifest.get('format')} export, not an onnx one.")
        self.graphs = self.manifest["onnx"]
        self.encoder_session = _session(self.folder / "encoder.onnx", intra_threads)
        self.decoder_session = _session(self.folder / "decoder.onnx", intra_threads)
        self.decoder_inputs = [node.name for node in self.decoder_session.get_inputs()]
        self.encoder = OnnxEncoder(self)
        self.post_init()

    @classmethod
    def from_export(cls, folder: str | os.PathLike, intra_threads: int | None = None) -> OnnxSeq2SeqLM:
        """The export in ``folder`` (``config.json``, ``generation_config.json``, the two graphs, the manifest)."""
        folder = Path(folder)
        if not (folder / MANIFEST).is_file():
            raise UserInputError(f"{folder} is not an hf_deepnmt export (no {MANIFEST}); make one with "
                                 "`deepnmt export --format onnx MODEL OUT`.")
        config = PretrainedConfig.from_dict(json.loads((folder / "config.json").read_text(encoding="utf-8")))
        config.is_encoder_decoder = True
        model = cls(config, folder, intra_threads)
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder)
        return model.eval()

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """No key/value cache for generate to pre-build: the first step creates an `OnnxDecoderCache`."""
        return False

    def can_generate(self) -> bool:  # a PreTrainedModel without a model class of its own: say so explicitly
        return True

    def check_length(self, what: str, length: int) -> None:
        """The model's position limit, which the exported graphs do not check (the torch model's sentence)."""
        limit = getattr(self.config, "max_position_embeddings", None)
        if limit is not None and length > limit:
            raise UserInputError(f"{type(self).__name__}: {what} of {length} tokens is longer than "
                                 f"max_position_embeddings={limit}; truncate the input (the tokenizer and the "
                                 "translation pipeline do this with truncation=True).")

    def get_encoder(self, modality: str | None = None) -> OnnxEncoder:
        return self.encoder

    def _reorder_cache(self, past_key_values: OnnxDecoderCache, beam_idx: torch.LongTensor) -> OnnxDecoderCache:
        """Beam search: the past follows the surviving hypotheses; the memory stays (one copy per beam group)."""
        past_key_values.reorder_state(beam_idx)
        return past_key_values

    def start(self, encoder_outputs: BaseModelOutput) -> OnnxDecoderCache:
        """The cache before the first decoder token: the memory and the initial past from the encoder graph's
        outputs, or empty past tensors (no key/value yet)."""
        batch = encoder_outputs.last_hidden_state.size(0)
        memory = {name: encoder_outputs[name] for name in self.graphs["memory"]}
        past = {entry["name"]: encoder_outputs[entry["initial"]] if entry["initial"]
                else torch.zeros(batch, *entry["empty_shape"]) for entry in self.graphs["past"]}
        return OnnxDecoderCache(memory, past)

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        encoder_outputs: BaseModelOutput | None = None,
        past_key_values: OnnxDecoderCache | None = None,
        cache: OnnxDecoderCache | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """Logits ``(N, T, V)`` of the T ``decoder_input_ids``, run one step at a time from the given cache (or from
        the start of the target); the cache after them when ``use_cache``."""
        past_key_values = merge_cache_arguments(cache, past_key_values)
        if decoder_input_ids is None:
            raise UserInputError("an ONNX export needs `decoder_input_ids` (generate passes them).")
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        if attention_mask is None:
            attention_mask = torch.ones(encoder_outputs.last_hidden_state.shape[:2], dtype=torch.long)
        state = past_key_values if isinstance(past_key_values, OnnxDecoderCache) else self.start(encoder_outputs)
        self.check_length("a target", state.seen_tokens + decoder_input_ids.size(1))
        mask = _array(attention_mask.long())
        logits = []
        for token in decoder_input_ids.long().split(1, dim=1):  # (N, 1) per step
            values = {"decoder_input_ids": _array(token), "encoder_attention_mask": mask,
                      "position": np.array(state.seen_tokens, dtype=np.int64),
                      **{name: _array(value) for name, value in state.memory.items()},
                      **{name: _array(value) for name, value in state.past.items()}}
            step_logits, *present = self.decoder_session.run(None, {name: values[name] for name in self.decoder_inputs})
            logits.append(torch.from_numpy(step_logits))
            state.past = {entry["name"]: torch.from_numpy(value) for entry, value in zip(self.graphs["past"], present)}
            state.seen_tokens += 1
        output = Seq2SeqLMOutput(logits=torch.stack(logits, dim=1),  # (N, T, V)
                                 **cache_field(state if use_cache is not False else None),
                                 encoder_last_hidden_state=encoder_outputs.last_hidden_state)
        return output if return_dict is not False else output.to_tuple()


def _array(tensor: torch.Tensor) -> np.ndarray:
    """A contiguous CPU numpy view of ``tensor`` (no copy when it already is one)."""
    return tensor.detach().cpu().contiguous().numpy()


def _session(path: Path, intra_threads: int | None) -> Any:
    try:  # in a try block: transformers' check of a Hub folder's imports then does not demand onnxruntime
        import onnxruntime as ort
    except ImportError as error:
        raise ImportError("running an ONNX export needs ONNX Runtime: pip install onnxruntime.") from error

    options = ort.SessionOptions()
    if intra_threads:
        options.intra_op_num_threads = intra_threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
