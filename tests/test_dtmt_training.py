"""Training DTMT with the project's tools: `deepnmt train --model_type dtmt`, meng2019's learning-rate schedule,
clear errors for the Transformer papers' options, and DDP with two CPU processes."""

from __future__ import annotations

import json
import math
import sys

import pytest
from conftest import train_argv
from test_resume_and_distributed import _free_port, _run
from transformers import AutoModelForSeq2SeqLM

from hf_deepnmt import DTMTForConditionalGeneration
from hf_deepnmt_training.cli import main
from hf_deepnmt_training.schedules import rnnplus_warmup_decay

TINY_DTMT_OVERRIDES = "d_model=16,transition_depth=1,attention_heads=2,max_position_embeddings=64"


def dtmt_argv(corpus, output_dir, *extra: str) -> list[str]:
    return train_argv(corpus, output_dir, "--model_type", "dtmt", "--config_overrides", TINY_DTMT_OVERRIDES, *extra)


def test_rnnplus_warmup_decay_is_equation_17():
    """meng2019 Zh-En: n = 2, p = 500, s = 8000, e = 64000 (factors of lr0)."""
    factor = lambda t: rnnplus_warmup_decay(t, warmup_steps=500, decay_start=8000, decay_end=64000, replicas=2)  # noqa: E731
    assert factor(0) == 1.0 and factor(500) == 1.5 and factor(1000) == 2.0  # linear warm-up, n reached at t = n·p
    assert factor(4000) == 2.0  # decay starts when n·t = s
    assert math.isclose(factor(18000), 2 * 4 ** ((8000 - 36000) / 56000))
    assert math.isclose(factor(32000), 0.5)  # n·t = e: lr0 / 2
    assert rnnplus_warmup_decay(0, 50, 100, 200, replicas=1) == 1.0  # one replica: no warm-up
    assert math.isclose(rnnplus_warmup_decay(200, 50, 100, 200, replicas=1), 0.5)


@pytest.mark.integration
def test_deepnmt_train_model_type_dtmt_with_the_papers_schedule(small_corpus, tmp_path):
    from hf_deepnmt_training.train import train

    outcome = train(dtmt_argv(small_corpus, tmp_path / "run", "--max_steps", "4", "--max_grad_norm", "5.0",
                              "--learning_rate", "1e-3", "--lr_schedule", "rnnplus_warmup_decay", "--warmup_steps", "2",
                              "--lr_replicas", "2", "--lr_decay_start", "4", "--lr_decay_end", "8",
                              "--max_predict_samples", "6", "--eval_num_beams", "2"))
    folder = outcome.output_dir
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "dtmt" and config["d_model"] == 16 and config["transition_depth"] == 1
    logged = [entry["learning_rate"] for entry in outcome.trainer.state.log_history if "learning_rate" in entry]
    expected = [1e-3 * rnnplus_warmup_decay(t, 2, 4, 8, 2) for t in range(4)]  # the rate of steps 1..4 (t = 0..3)
    assert logged == pytest.approx(expected, rel=1e-6)
    assert outcome.test_scores is not None and outcome.test_scores.num_sentences == 6
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert isinstance(model, DTMTForConditionalGeneration)
    assert model.generation_config.num_beams == 2 and model.generation_config.length_penalty == 0.6
    card = (folder / "README.md").read_text()
    assert "DTMT" in card and "meng2019dtmt" in card
    assert "learning-rate schedule: meng2019 eq. (17): linear warm-up" in card  # the schedule by its plain name


@pytest.mark.parametrize("override", ["ddr_weight=1.0", "cross_attention_drop_depth=1", "residual_scaling=admin",
                                      "encoder_layer_aggregation=hierarchical"])
def test_transformer_options_on_a_dtmt_model_are_one_clear_error(small_corpus, tmp_path, capsys, override):
    field = override.split("=")[0]
    code = main(["train", *train_argv(small_corpus, tmp_path / "o", "--model_type", "dtmt", "--config_overrides",
                                      f"{TINY_DTMT_OVERRIDES},{override}")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1, error
    assert f"`{field}`" in error[0] and "DTMT is a recurrent model" in error[0]


def test_bad_lr_schedule_is_refused_before_any_work(small_corpus, tmp_path, capsys):
    code = main(["train", *dtmt_argv(small_corpus, tmp_path / "o", "--lr_schedule", "noam")])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "`--lr_schedule` = 'noam'" in error
    assert not (tmp_path / "o" / "tokenizer.json").exists()


@pytest.mark.integration
def test_torchrun_trains_dtmt_with_gradient_checkpointing(small_corpus, tmp_path):
    """Two gloo processes (DDP), every parameter used every step, per-timestep gradient checkpointing on."""
    folder = tmp_path / "ddp"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
               str(_free_port()), "-m", "hf_deepnmt_training.cli", "train",
               *dtmt_argv(small_corpus, folder, "--max_steps", "3", "--gradient_checkpointing", "true",
                          "--ddp_find_unused_parameters", "false", "--max_predict_samples", "4")]
    _run(command)
    logs = [entry for entry in json.loads((folder / "trainer_state.json").read_text())["log_history"]
            if "loss" in entry]
    assert len(logs) == 3 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(folder), DTMTForConditionalGeneration)
