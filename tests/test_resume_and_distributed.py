"""Real `deepnmt train` processes: SIGKILL + resume, torchrun, accelerate launch (DDP) and FSDP2 with 2 CPU processes
(gloo)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import train_argv
from safetensors.torch import load_file

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
TRAIN = [sys.executable, "-m", "hf_deepnmt_training.cli", "train"]
ACCELERATE_CONFIG = Path(__file__).resolve().parents[1] / "training" / "configs" / "accelerate_ddp.yaml"
FSDP_CONFIG = ACCELERATE_CONFIG.with_name("accelerate_fsdp.yaml")
FSDP_WORKER = Path(__file__).resolve().parent / "fsdp_cpu_worker.py"  # lets accelerate shard on CPU processes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(command: list[str], timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(command, env=env or ENV, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _losses(folder: Path) -> dict[int, float]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return {entry["step"]: entry["loss"] for entry in state["log_history"] if "loss" in entry}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.integration
def test_sigkilled_run_resumes_to_the_same_result(small_corpus, tmp_path):
    args = ["--max_steps", "160", "--save_strategy", "steps", "--save_steps", "20", "--config_overrides",
            "d_model=16,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,decoder_attention_heads=2,"
            "encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64,dropout=0.1",
            "--max_tokens", "300", "--per_device_train_batch_size", "4"]  # token batches + dropout RNG both resume
    _run(TRAIN + train_argv(small_corpus, tmp_path / "straight", *args))

    killed = tmp_path / "killed"
    process = subprocess.Popen(TRAIN + train_argv(small_corpus, killed, *args), env=ENV,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (killed / "checkpoint-40").exists():
        assert process.poll() is None, "the run ended before it could be killed: " + process.stderr.read()[-2000:]
        assert time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert not (killed / "model.safetensors").exists()  # it really died mid-run

    _run(TRAIN + train_argv(small_corpus, killed, *args, "--resume_from_checkpoint", "last"))
    straight, resumed = _losses(tmp_path / "straight"), _losses(killed)
    assert max(resumed) == max(straight) == 160
    assert resumed[160] == pytest.approx(straight[160], rel=1e-3, abs=1e-3)
    a, b = _weights(tmp_path / "straight"), _weights(killed)
    assert all(torch.allclose(a[name], b[name], atol=1e-4) for name in a)


@pytest.mark.integration
def test_a_run_continued_to_more_steps_is_the_longer_run(small_corpus, tmp_path):
    """What `distill_bible --continue_students` relies on: a run of 40 steps, continued from its last checkpoint to 80
    in another folder, is the run of 80 steps (inverse-square-root schedule, dropout, token batches over several epochs)."""
    args = ["--save_strategy", "steps", "--save_steps", "20", "--lr_scheduler_type", "inverse_sqrt", "--warmup_steps",
            "10", "--config_overrides",
            "d_model=16,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,decoder_attention_heads=2,"
            "encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64,dropout=0.1",
            "--max_tokens", "300", "--per_device_train_batch_size", "4"]
    _run(TRAIN + train_argv(small_corpus, tmp_path / "straight", *args, "--max_steps", "80"))
    _run(TRAIN + train_argv(small_corpus, tmp_path / "short", *args, "--max_steps", "40"))
    continued = tmp_path / "continued"
    continued.mkdir()
    shutil.copytree(tmp_path / "short" / "checkpoint-40", continued / "checkpoint-40")
    _run(TRAIN + train_argv(small_corpus, continued, *args, "--max_steps", "80", "--resume_from_checkpoint", "last"))
    straight, resumed = _losses(tmp_path / "straight"), _losses(continued)
    assert max(resumed) == max(straight) == 80
    for step in (41, 60, 80):
        assert resumed[step] == pytest.approx(straight[step], rel=1e-3, abs=1e-3), step
    a, b = _weights(tmp_path / "straight"), _weights(continued)
    assert all(torch.allclose(a[name], b[name], atol=1e-4) for name in a)


# SGD: with Adam, parameters whose true gradient is exactly zero (attention key biases) turn float noise into
# lr-sized steps, so weights would differ where the mathematics says they cannot.
DDP_ARGS = ["--max_steps", "4", "--train_sampling_strategy", "sequential", "--ddp_find_unused_parameters", "false",
            "--optim", "sgd", "--learning_rate", "0.5",
            "--config_overrides", "d_model=16,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,"
            "decoder_attention_heads=2,encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64,dropout=0.0"]


@pytest.fixture(scope="module")
def single_process_double_batch(small_corpus, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ddp") / "single"
    _run(TRAIN + train_argv(small_corpus, folder, *DDP_ARGS, "--per_device_train_batch_size", "8"))
    return folder


def _compare_with_single(single: Path, multi: Path) -> None:
    one, two = _losses(single), _losses(multi)
    assert sorted(one) == sorted(two) == [1, 2, 3, 4]
    for step in one:
        assert two[step] == pytest.approx(one[step], rel=2e-3), (step, one, two)
    a, b = _weights(single), _weights(multi)
    assert all(torch.allclose(a[name], b[name], atol=2e-4) for name in a)


@pytest.mark.integration
@pytest.mark.parametrize("use_cpu_given", [True, False])
def test_torchrun_two_processes_match_one_process_with_the_doubled_batch(small_corpus, tmp_path,
                                                                         single_process_double_batch, use_cpu_given):
    """Without --use_cpu transformers forms no process group on a machine without GPUs (each process would train
    alone on the same data); `deepnmt train` notices the launcher and trains over gloo instead."""
    folder = tmp_path / "torchrun"
    argv = train_argv(small_corpus, folder, *DDP_ARGS, "--per_device_train_batch_size", "4")
    if not use_cpu_given:
        index = argv.index("--use_cpu")
        del argv[index:index + 2]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(_free_port()), "-m", "hf_deepnmt_training.cli", "train", *argv]
    cache = tmp_path / "datasets-cache"  # a cache of their own: the two processes prepare the corpus from nothing
    result = _run(command, env={**ENV, "HF_DATASETS_CACHE": str(cache)})
    # one process read and tokenized each split, the other memory-mapped that copy (hf_deepnmt_training.preprocess)
    assert result.stderr.count("train: reusing the prepared pairs") == 1, result.stderr[-3000:]
    assert result.stderr.count("train: reusing the tokenized corpus") == 1, result.stderr[-3000:]
    assert result.stderr.count("Generating train split: 160 examples") == 1  # read once
    assert len(list((cache / "hf_deepnmt").glob("tokens-*/complete.json"))) == 1
    assert "parallel_mode" not in result.stderr or "DISTRIBUTED" in result.stderr
    assert use_cpu_given or "training on CPU processes over gloo" in result.stderr
    _compare_with_single(single_process_double_batch, folder)


@pytest.mark.integration
def test_accelerate_launch_two_processes_match_one_process(small_corpus, tmp_path, single_process_double_batch):
    folder = tmp_path / "accelerate"
    # `--multi_gpu` selects accelerate's torch.distributed launcher; with no GPU it runs gloo processes on the CPU
    # (accelerate's `--cpu` flag would start a single process).
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
               "--num_processes", "2", "--main_process_port",
               str(_free_port()), "-m", "hf_deepnmt_training.cli", "train",
               *train_argv(small_corpus, folder, *DDP_ARGS, "--per_device_train_batch_size", "4")]
    _run(command)
    _compare_with_single(single_process_double_batch, folder)


@pytest.mark.integration
def test_torchrun_trains_li2022_cad_and_crt(small_corpus, tmp_path):
    """CAD skips parameters at random and CRT's views go through one model call: DDP must accept both."""
    folder = tmp_path / "crt"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(_free_port()), "-m", "hf_deepnmt_training.cli", "train",
               *train_argv(small_corpus, folder, "--max_steps", "4", "--config_overrides",
                           "d_model=16,encoder_layers=2,decoder_layers=3,encoder_attention_heads=2,"
                           "decoder_attention_heads=2,encoder_ffn_dim=32,decoder_ffn_dim=32,"
                           "max_position_embeddings=64,cross_attention_drop_depth=2,cross_attention_drop_ratio=0.5,"
                           "ddr_weight=1.0,ald_weight=1.0")]
    _run(command)
    logs = [entry for entry in json.loads((folder / "trainer_state.json").read_text())["log_history"]
            if "loss" in entry]
    assert len(logs) == 4 and all(math.isfinite(entry[key]) for entry in logs for key in ("loss", "ddr", "ald"))


def _fsdp_launch(entry: list[str], argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(FSDP_CONFIG), "--num_processes",
            "2", "--main_process_port", str(_free_port()), *entry, "train", *argv]


@pytest.mark.integration
def test_fsdp_two_processes_match_one_process_and_save_an_ordinary_folder(small_corpus, tmp_path,
                                                                          single_process_double_batch):
    """FSDP2 really shards (2 CPU processes over gloo, `tests/fsdp_cpu_worker.py`): same losses and weights as one
    process with the doubled batch; the checkpoint and the final folder hold the gathered weights as a plain
    safetensors folder with our own code files, which loads with `AutoModelForSeq2SeqLM`."""
    from transformers import AutoModelForSeq2SeqLM

    folder = tmp_path / "fsdp"
    argv = train_argv(small_corpus, folder, *DDP_ARGS, "--per_device_train_batch_size", "4", "--save_strategy", "steps",
                      "--save_steps", "4")
    result = _run(_fsdp_launch([str(FSDP_WORKER)], argv))
    assert "train as DDP" not in result.stderr
    checkpoint = folder / "checkpoint-4"
    assert (checkpoint / "pytorch_model_fsdp.bin").is_file()  # transformers took its FSDP checkpoint path
    assert not (folder / ".incomplete").exists()
    _compare_with_single(single_process_double_batch, folder)

    trained = _weights(folder)
    fsdp_state = torch.load(checkpoint / "pytorch_model_fsdp.bin", map_location="cpu", weights_only=True)
    assert all(torch.equal(fsdp_state[name], trained[name]) for name in trained)
    assert all(torch.equal(tensor, trained[name]) for name, tensor in _weights(checkpoint).items())
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["DeepTransformerForConditionalGeneration"]
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_deep_transformer.DeepTransformerForConditionalGeneration")
    assert (folder / "modeling_deep_transformer.py").is_file() and not list(folder.glob("_fsdp*.py"))
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert model.lm_head.weight is model.model.shared.weight
    loaded = model.state_dict()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in trained.items())


@pytest.mark.integration
def test_fsdp_trains_admin_with_cad_and_crt(small_corpus, tmp_path):
    """ADMIN profiles before FSDP wraps the model; CAD's per-process drop-net draws leave different cross-attention
    parameters unused on the two processes (the per-layer reduce-scatter used to fail at step 5 with these seeds);
    CRT's views go through one sharded model call."""
    folder = tmp_path / "admin_cad_crt"
    argv = train_argv(small_corpus, folder, "--max_steps", "6", "--admin_profile_tokens", "200", "--config_overrides",
                      "d_model=16,encoder_layers=2,decoder_layers=3,encoder_attention_heads=2,"
                      "decoder_attention_heads=2,encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64,"
                      "residual_scaling=admin,cross_attention_drop_depth=2,cross_attention_drop_ratio=0.5,"
                      "ddr_weight=1.0,ald_weight=1.0")
    result = _run(_fsdp_launch([str(FSDP_WORKER)], argv))
    assert "ADMIN profile on" in result.stderr
    logs = [entry for entry in json.loads((folder / "trainer_state.json").read_text())["log_history"]
            if "loss" in entry]
    assert len(logs) == 6 and all(math.isfinite(entry[key]) for entry in logs for key in ("loss", "ddr", "ald"))
    assert json.loads((folder / "config.json").read_text())["admin_profiled"] is True
    omegas = [tensor for name, tensor in _weights(folder).items() if name.endswith("_omega")]
    assert omegas and all(bool((tensor > 1.0).all()) for tensor in omegas)  # profiled ω grows with depth, ω_1 = 1


@pytest.mark.integration
def test_fsdp_config_on_cpu_processes_says_it_trains_as_ddp(small_corpus, tmp_path, single_process_double_batch):
    """accelerate shards only on GPUs: the plain CLI under the FSDP config trains as DDP over gloo and says so."""
    folder = tmp_path / "fsdp_as_ddp"
    result = _run(_fsdp_launch(["-m", "hf_deepnmt_training.cli"], train_argv(small_corpus, folder, *DDP_ARGS,
                                                                  "--per_device_train_batch_size", "4")))
    assert "FSDP was requested, but accelerate shards only on GPUs" in result.stderr
    _compare_with_single(single_process_double_batch, folder)
