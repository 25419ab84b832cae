"""What must hold on a GPU (tests marked ``gpu``: skipped without CUDA, run on a lent device with
``python3 -m pytest -q -m gpu tests/test_gpu.py``), and the GPU-path defects a CPU can catch (not marked: they run in
CI): every family trains and generates under bf16 autocast, the mixed-precision path a GPU run takes.

The GPU cases use the real CUDA kernels (FlashAttention where importable, flex attention compiled for CUDA), never
stand-ins."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from hf_deepnmt import DTMTConfig, DTMTForConditionalGeneration

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (run on a lent GPU machine)")
FAMILIES = {
    "post_ln": {},
    "pre_ln_cad": {"layer_norm_position": "pre", "cross_attention_drop_depth": 1, "cross_attention_drop_ratio": 0.5},
    "admin": {"residual_scaling": "admin", "admin_init": "closed_form"},
    "dou2018": {"encoder_layer_aggregation": "hierarchical", "decoder_layer_aggregation": "hierarchical",
                "multi_layer_attention_k": 2, "encoder_layers": 4, "decoder_layers": 4},
    "dtmt": None,
}


def build(name: str, device: str = "cpu", **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    if name == "dtmt":
        model = DTMTForConditionalGeneration(DTMTConfig(vocab_size=99, d_model=16, attention_heads=2,
                                                        transition_depth=2, **overrides))
    else:
        model = tiny_model(**{**FAMILIES[name], **overrides})
    return model.to(device)


def padded_batch(device: str = "cpu") -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, 0, 0], [13, 2, 0, 0, 0, 0]])
    labels = torch.tensor([[13, 14, 15, 16, 2], [17, 18, 2, -100, -100], [19, 2, -100, -100, -100]])
    batch = {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}
    return {key: value.to(device) for key, value in batch.items()}


def train_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
    """The loss of one training step (forward + backward) in float32 or under autocast to ``dtype``."""
    model.train()
    torch.manual_seed(1)
    device = next(model.parameters()).device.type
    context = torch.autocast(device, dtype=dtype) if dtype is not None else torch.autocast(device, enabled=False)
    with context:
        loss = model(**batch).loss
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    return loss.detach().float()


# ------------------------------------------------------------------------------------------------ on the CPU too
@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_family_trains_and_generates_under_bf16_autocast(name):
    """The mixed-precision path of a GPU run, on the CPU: DTMT's recurrent update mixed a bf16 candidate with a
    float32 state (`torch.lerp` refused: "expected dtype BFloat16 for `end`"); every family must train with a finite
    loss close to float32's and decode the same way cached and uncached."""
    model = build(name, dropout=0.0) if name != "dtmt" else build(name, dropout=0.0, rnn_dropout=0.0,
                                                                   readout_dropout=0.0)
    batch = padded_batch()
    full = train_loss(model, batch, None)
    half = train_loss(model, batch, torch.bfloat16)
    assert torch.isfinite(half) and abs(float(half - full)) < 0.05 * float(full)
    model.eval()
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cached = model.generate(**inputs, num_beams=2, max_new_tokens=6)
        uncached = model.generate(**inputs, num_beams=2, max_new_tokens=6, use_cache=False)
    assert torch.equal(cached, uncached)


# ------------------------------------------------------------------------------------------------ on a GPU
@needs_cuda
@pytest.mark.gpu
@pytest.mark.integration  # compiling flex attention for CUDA spawns inductor's compile workers
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", [name for name in FAMILIES if name != "dtmt"])
def test_attention_kernels_agree_on_padded_batches(name, dtype):
    """sdpa, eager, flex (compiled for CUDA) and FlashAttention 2 (where importable) on right- and left-padded
    sources. In float32 the kernels agree to ~1e-6, so logits must match to 1e-4 and beam search must return the same
    beams. In bf16 each kernel rounds differently (this model on CPU: eager and sdpa differ by 0.03-0.06 at logits of
    magnitude 3.5-5.4, 2-4 bf16 ulps; 1.5e-6 in float32) and a random model's near-ties can flip beams; so bf16 checks
    the logits to 5% of their largest magnitude (~12 ulps), far below the order-1 errors of a wrong mask. d_model 64
    with 4 heads: flex attention's compiled kernel needs a head dimension of at least 16 (the tiny models have 4)."""
    from transformers.utils import is_flash_attn_2_available

    model = build(name, "cuda", d_model=64).to(dtype).eval()
    batch = padded_batch("cuda")
    batch["input_ids"][2] = torch.tensor([0, 0, 0, 0, 13, 2], device="cuda")  # one left-padded source
    batch["attention_mask"] = (batch["input_ids"] != 0).long()
    implementations = ["eager", "flex_attention"]
    if is_flash_attn_2_available() and dtype != torch.float32:  # FlashAttention has no float32 kernel
        implementations.append("flash_attention_2")
    with torch.no_grad():
        reference = model(**batch).logits.float()
        tolerance = 1e-4 if dtype == torch.float32 else 0.05 * float(reference.abs().max())
        beams = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4,
                               max_new_tokens=8)
        for implementation in implementations:
            model.set_attn_implementation(implementation)
            logits = model(**batch).logits.float()
            torch.testing.assert_close(logits, reference, atol=tolerance, rtol=0, msg=implementation)
            if dtype == torch.float32:
                assert torch.equal(model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                                  num_beams=4, max_new_tokens=8), beams), implementation
            model.set_attn_implementation("sdpa")


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_mixed_precision_training_steps_are_finite_and_close_to_fp32(name, dtype):
    kwargs = {"dropout": 0.0} if name != "dtmt" else {"dropout": 0.0, "rnn_dropout": 0.0, "readout_dropout": 0.0}
    model = build(name, "cuda", **kwargs)
    batch = padded_batch("cuda")
    full = train_loss(model, batch, None)
    half = train_loss(model, batch, dtype)
    assert torch.isfinite(half) and abs(float(half - full)) < 0.05 * float(full)


@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FAMILIES))
def test_cached_equals_uncached_generation_in_bf16(name):
    model = build(name, "cuda").to(torch.bfloat16).eval()
    batch = padded_batch("cuda")
    inputs = {key: batch[key] for key in ("input_ids", "attention_mask")}
    with torch.no_grad():
        for options in ({"num_beams": 1}, {"num_beams": 4, "num_return_sequences": 2}):
            cached = model.generate(**inputs, max_new_tokens=10, **options)
            uncached = model.generate(**inputs, max_new_tokens=10, use_cache=False, **options)
            assert torch.equal(cached, uncached), options


def test_the_gpu_benchmark_section_runs_every_row_as_a_labelled_cpu_dry_run():
    """`python -m benchmarks.run --sections gpu --quick` exercises every code path of the GPU section on a machine
    without CUDA, and its table says it is a dry run — never a figure to quote."""
    from benchmarks import gpu

    result = gpu.gpu_section(quick=True, log=lambda message: None)
    table = "\n".join(gpu.render({"gpu": result}))
    assert result["dry_run"] and "CPU DRY RUN, NOT A RESULT" in table
    assert set(result["training"]["tiny"]["rows"]) == {"ours", "marian"}
    assert set(result["deep"]["admin"]) == {"plain", "checkpointing"}
    assert set(result["deep"]["dou2018"]) >= {"vanilla", "hierarchical", "mla3"} and "DTMT#4" in result["deep"]["dtmt"]
    assert {"ours b4", "marian b4", "ours b1", "marian b1"} == set(result["decoding"]["rows"])
    assert "FlashAttention" in table and "CTranslate2 on CUDA" in table


@needs_cuda
@pytest.mark.gpu
def test_translation_runs_on_the_process_gpu_and_matches_the_cpu(tiny_folder, tmp_path):
    """`deepnmt translate`'s engine (one model and an ensemble, the retiring search and `generate`) on the GPU by
    default gives the CPU's translations."""
    from hf_deepnmt_training.translate import load_translation_engine, translate_sentences

    texts = ["In the beginning God created the heavens and the earth.", "The light shines.", "", "And God said."]
    for models in ([str(tiny_folder)], [str(tiny_folder), str(tiny_folder)]):
        outputs = {}
        for device in ("auto", "cpu"):
            engine, tokenizer, _ = load_translation_engine(models, device=device)
            assert engine.model.device.type == ("cuda" if device == "auto" else "cpu")
            for search in ("retiring", "generate"):
                outputs[device, search] = translate_sentences(engine, tokenizer, texts, num_beams=2, progress=False,
                                                              search=search)
        assert outputs["auto", "retiring"] == outputs["cpu", "retiring"] == outputs["cpu", "generate"]
        assert outputs["auto", "generate"] == outputs["cpu", "generate"]
