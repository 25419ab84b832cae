"""Shared pieces of the benchmark harness: model builders (ours, ours-before-fixes, MarianMTModel with the same
weights), synthetic batches, interleaved timing, peak-RSS reading and machine information.

Every number the harness reports is a ratio of medians measured in one process run with the contenders
interleaved (A, B, C, A, B, C, ...), because absolute times on a shared machine are noise.
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

REPO = Path(__file__).resolve().parent.parent
# The commit whose modeling code is "before" in the profile-and-fix section: the foundation commit, before any
# performance work. Loaded from git into a private package so old and new run side by side in one process.
BEFORE_REF = "c273896"

VOCAB = 8000
PAD, BOS, EOS, UNK = 0, 1, 2, 3
FIRST_WORD_ID = 4  # synthetic tokens avoid the specials

# The two sizes of the issue: Transformer "small" (d256) and "base" (d512), 6+6 layers, shared 8k vocabulary.
SIZES: dict[str, dict[str, int]] = {
    "d256": dict(d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024, encoder_attention_heads=4,
                 decoder_attention_heads=4),
    "d512": dict(d_model=512, encoder_ffn_dim=2048, decoder_ffn_dim=2048, encoder_attention_heads=8,
                 decoder_attention_heads=8),
}


# Later Transformer variants (ADMIN, CAD+CRT, layer aggregation, ...) join the tables as extra rows: a row name and
# the `DeepTransformerConfig` overrides that switch the feature on (``--variants name,...``). Empty until they land.
VARIANTS: dict[str, dict[str, object]] = {
    # liu2020 ADMIN: ω per residual sub-layer (closed form here: the same compute as a profiled model)
    "admin": {"residual_scaling": "admin", "admin_init": "closed_form"},
}


def model_dims(size: str, encoder_layers: int = 6, decoder_layers: int = 6) -> dict[str, int]:
    return dict(SIZES[size], vocab_size=VOCAB, encoder_layers=encoder_layers, decoder_layers=decoder_layers,
                max_position_embeddings=512)


# ----------------------------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------------------------
def _ours_config(config_class, dims: dict[str, int], **overrides: object):
    fields = dict(activation_function="relu", dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                  scale_embedding=True, layer_norm_position="post", tie_word_embeddings=True, pad_token_id=PAD,
                  bos_token_id=BOS, eos_token_id=EOS, unk_token_id=UNK, decoder_start_token_id=BOS)
    return config_class(**dims, **{**fields, **overrides})


def build_ours(dims: dict[str, int], seed: int = 0, **overrides: object) -> torch.nn.Module:
    from hf_deepnmt import DeepTransformerConfig, DeepTransformerForConditionalGeneration

    torch.manual_seed(seed)
    return DeepTransformerForConditionalGeneration(_ours_config(DeepTransformerConfig, dims, **overrides))


_BEFORE_MODULES: dict[str, object] = {}


def load_before_package(ref: str = BEFORE_REF):
    """Import the hf_deepnmt model files of git ``ref`` as a private package (``hf_deepnmt_at_<ref>``).

    Returns the modeling module, or None when git or the commit is not available (a source tarball): the harness
    then simply has no "before" column.
    """
    if ref in _BEFORE_MODULES:
        return _BEFORE_MODULES[ref]
    root = Path(tempfile.mkdtemp(prefix="hf_deepnmt_before_"))
    package_name = "hf_deepnmt_at_" + re.sub(r"\W", "_", ref)
    package = root / package_name
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("configuration_deep_transformer.py", "modeling_deep_transformer.py", "pipeline_translation.py"):
        try:
            text = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:hf_deepnmt/{name}"], check=True,
                                  capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        (package / name).write_text(text)
    sys.path.insert(0, str(root))
    _BEFORE_MODULES[ref] = importlib.import_module(f"{package_name}.modeling_deep_transformer")
    return _BEFORE_MODULES[ref]


def build_before(dims: dict[str, int], seed: int = 0, ref: str = BEFORE_REF) -> torch.nn.Module | None:
    module = load_before_package(ref)
    if module is None:
        return None
    torch.manual_seed(seed)
    return module.DeepTransformerForConditionalGeneration(_ours_config(module.DeepTransformerConfig, dims))


def build_marian(dims: dict[str, int]) -> torch.nn.Module:
    """`MarianMTModel` of identical dimensions and conventions (ReLU, scaled embeddings, one shared tied
    vocabulary, sinusoidal positions, post-LN, SDPA). Its decoder starts from ``<s>`` like ours; Marian's own
    checkpoints start from ``<pad>``, which is only a convention of the id, not of the architecture."""
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(**dims, activation_function="relu", dropout=0.1, attention_dropout=0.0,
                          activation_dropout=0.0, scale_embedding=True, share_encoder_decoder_embeddings=True,
                          tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                          decoder_start_token_id=BOS, forced_eos_token_id=None)
    return MarianMTModel(config)


def copy_weights(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Load ``source``'s state dict into ``target`` (ours -> ours-before or ours -> Marian: same names).

    Marian's extra entries (its position tables, the encoder/decoder aliases of the shared embedding and the zero
    ``final_logits_bias``) are the only keys allowed to be missing.
    """
    result = target.load_state_dict(source.state_dict(), strict=False)
    allowed = re.compile(r"(final_logits_bias|.*embed_positions\.weight|.*embed_tokens\.weight|lm_head\.weight)$")
    missing = [key for key in result.missing_keys if not allowed.match(key)]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"weight copy is not exact: missing {missing}, unexpected {result.unexpected_keys}")
    if hasattr(target, "tie_weights"):
        target.tie_weights()


def contenders(size: str, with_before: bool = True, variants: tuple[str, ...] | list[str] = (),
               before_ref: str = BEFORE_REF) -> dict[str, torch.nn.Module]:
    """``{"ours": ..., "before": ..., "marian": ..., *variants}`` with one set of weights (the ours init; a variant
    gets every weight it shares with the plain model)."""
    dims = model_dims(size)
    ours = build_ours(dims)
    models = {"ours": ours}
    if with_before:
        before = build_before(dims, ref=before_ref)
        if before is not None:
            copy_weights(ours, before)
            models["before"] = before
    marian = build_marian(dims)
    copy_weights(ours, marian)
    models["marian"] = marian
    for name in variants:
        models[name] = build_ours(dims, **VARIANTS[name])
        models[name].load_state_dict(ours.state_dict(), strict=False)
    return models


def fixed_generation_config(model: torch.nn.Module, num_beams: int, new_tokens: int) -> None:
    """The same generation settings for every contender: exactly ``new_tokens`` steps (eos is suppressed until
    then), no forced eos, no length tricks — equal work for an equal-throughput comparison."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, num_beams=num_beams,
        do_sample=False, min_new_tokens=new_tokens, max_new_tokens=new_tokens, early_stopping=False,
        length_penalty=1.0,
    )


# ----------------------------------------------------------------------------------------------------------------
# Synthetic data
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, S), right-padded with PAD, ends with EOS
    attention_mask: torch.Tensor  # (B, S)
    labels: torch.Tensor  # (B, T), -100 on padding, ends with EOS

    @property
    def source_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def target_tokens(self) -> int:
        return int((self.labels != -100).sum())

    def as_kwargs(self) -> dict[str, torch.Tensor]:
        return dict(input_ids=self.input_ids, attention_mask=self.attention_mask, labels=self.labels)


def _pad(rows: list[torch.Tensor], value: int) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=value)


def synthetic_batch(sentences: int | None = None, tokens: int | None = None, min_len: int = 20, max_len: int = 40,
                    seed: int = 0) -> Batch:
    """Random sentence pairs with lengths uniform in [min_len, max_len] (eos included): either ``sentences`` of
    them or as many as fit a budget of ``tokens`` source tokens (fairseq's --max-tokens, counted without padding)."""
    generator = torch.Generator().manual_seed(seed)
    sources, targets, total = [], [], 0
    while True:
        src_len, tgt_len = (int(x) for x in torch.randint(min_len, max_len + 1, (2,), generator=generator))
        if sentences is not None and len(sources) == sentences:
            break
        if tokens is not None and total + src_len > tokens and sources:
            break
        words = torch.randint(FIRST_WORD_ID, VOCAB, (src_len + tgt_len,), generator=generator)
        sources.append(torch.cat([words[: src_len - 1], torch.tensor([EOS])]))
        targets.append(torch.cat([words[src_len:src_len + tgt_len - 1], torch.tensor([EOS])]))
        total += src_len
    input_ids = _pad(sources, PAD)
    return Batch(input_ids=input_ids, attention_mask=(input_ids != PAD).long(), labels=_pad(targets, -100))


# ----------------------------------------------------------------------------------------------------------------
# Timing and memory
# ----------------------------------------------------------------------------------------------------------------
def interleaved(functions: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Time each function ``repeats`` times, round-robin (the starting contender rotates each round so none always
    runs right after another), after ``warmup`` untimed rounds. Returns seconds per call, per name."""
    names = list(functions)
    for _ in range(warmup):
        for name in names:
            functions[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            functions[name]()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def rss_kib() -> dict[str, int]:
    """Current (VmRSS) and peak (VmHWM) resident set size of this process, in KiB (Linux /proc)."""
    text = Path("/proc/self/status").read_text()
    return {key: int(re.search(key + r":\s+(\d+)", text).group(1)) for key in ("VmRSS", "VmHWM")}


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (``echo 5 > /proc/self/clear_refs``, Linux >= 4.0). False if unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def machine_info(before_ref: str = BEFORE_REF) -> dict[str, object]:
    import transformers

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError):
        memory_gib = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "hf_deepnmt",
                                     "benchmarks"], capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", False
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "memory_gib": memory_gib,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cuda_available": torch.cuda.is_available(),
        "load_average_at_start": load,
        "commit": commit + ("+uncommitted" if dirty else ""),
        "before_ref": before_ref,
    }


# ----------------------------------------------------------------------------------------------------------------
# meng2019 DTMT (its own family: compared with the Transformer of about equal size, never weight-copied)
# ----------------------------------------------------------------------------------------------------------------
# Rows of the `dtmt` section: (rnn_cell, transition_depth). DTMT#4 at d256 has about the parameters of the 6-6 d256
# Transformer (12.9M vs 13.1M with the 8k vocabulary).
DTMT_ROWS: dict[str, tuple[str, int]] = {"DTMT#4": ("lgru", 4), "DTMT#1": ("lgru", 1), "ShallowRNMT": ("gru", 0)}


def build_dtmt(d_model: int, rnn_cell: str, transition_depth: int, heads: int, seed: int = 0) -> torch.nn.Module:
    """A DTMT with the benchmark vocabulary and token ids; the dropouts of the miniature recipe (0.2 / 0.1 / 0.2)."""
    from hf_deepnmt import DTMTConfig, DTMTForConditionalGeneration

    torch.manual_seed(seed)
    return DTMTForConditionalGeneration(DTMTConfig(
        vocab_size=VOCAB, d_model=d_model, transition_depth=transition_depth, attention_heads=heads,
        rnn_cell=rnn_cell, dropout=0.2, rnn_dropout=0.1, readout_dropout=0.2, max_position_embeddings=512,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, unk_token_id=UNK, decoder_start_token_id=BOS))
