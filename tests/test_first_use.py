"""What a new user meets first (issue 35): the model's own language pair, one sentence for a missing tokenizer or
extra, an empty input, quiet commands, mistakes answered before torch loads, and a time budget as a run length."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PARALLEL, tiny_model, train_argv

import hf_deepnmt
from hf_deepnmt.errors import UserInputError
from hf_deepnmt_training.arguments import resolve_language_pair, saved_language_pairs
from hf_deepnmt_training.cli import main
from hf_deepnmt_training.errors import CommandLineError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def en_de(tmp_path_factory, tiny_tokenizer):
    """A tiny model folder that records en → de, and a JSON-lines test file in en/de (the tiny corpus' texts)."""
    folder = tmp_path_factory.mktemp("en_de") / "model"
    model = tiny_model(vocab_size=len(tiny_tokenizer), init_std=0.5)
    hf_deepnmt.record_language_pair(model.config, "en", "de")
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    test = folder.parent / "test.jsonl"
    test.write_text("".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in PARALLEL),
                    encoding="utf-8")
    return folder, test


# ------------------------------------------------------------------------------------------------ language pair
def test_evaluate_reads_the_models_pair_and_refuses_another(en_de, capsys, tmp_path):
    folder, test = en_de
    common = ["--test_file", str(test), "--num_beams", "1", "--reliance_pairs", "2", "--output_json",
              str(tmp_path / "scores.json")]
    assert main(["evaluate", str(folder), *common]) == 0  # no languages given: the model's en → de, positional MODEL
    assert json.loads((tmp_path / "scores.json").read_text())["sentences"] == len(PARALLEL)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(folder), "--target_lang", "es", *common]) == 2
    assert "`--source_lang`/`--target_lang` = ? → es is not allowed" in capsys.readouterr().err
    unrecorded = tmp_path / "unrecorded"
    tiny_model().save_pretrained(unrecorded)
    (unrecorded / "tokenizer.json").write_text((folder / "tokenizer.json").read_text())
    assert main(["evaluate", str(unrecorded), *common]) == 2
    assert "records no language pair; pass --source_lang and --target_lang" in capsys.readouterr().err


def test_translate_takes_the_language_options_and_diagnose_a_positional_model(en_de, capsys, tmp_path):
    folder, test = en_de
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\n", encoding="utf-8")
    args = ["--input", str(source), "--num_beams", "1", "--max_new_tokens", "4"]
    assert main(["translate", str(folder), "--source_lang", "en", "--tgt_lang", "de", *args]) == 0
    capsys.readouterr()
    assert main(["translate", str(folder), "--source_lang", "de", *args]) == 2
    assert "de → ? is not allowed" in capsys.readouterr().err
    assert main(["diagnose", str(folder), "--test_file", str(test), "--pairs", "4"]) == 0
    capsys.readouterr()
    assert main(["diagnose", str(folder)]) == 2  # the default test file is English → Spanish
    assert "translates en → de, and the default --test_file, the embedded corpus, is English → Spanish" in \
        capsys.readouterr().err


def test_the_light_reading_of_the_pair_agrees_with_the_library(en_de, tmp_path):
    from hf_deepnmt.pipeline_translation import parse_translation_task

    folder, _ = en_de
    assert saved_language_pairs(folder) == [("en", "de")]
    assert saved_language_pairs(tmp_path) is None  # no saved files here
    for task in ("translation_en_to_de", "translation_zh-Hans_to_en", "translation_en_to_to_x", "summarization"):
        config = tmp_path / task / "config.json"
        config.parent.mkdir()
        config.write_text(json.dumps({"task_specific_params": {task: {}}}))
        expected = parse_translation_task(task)
        assert saved_language_pairs(config.parent) == ([expected] if expected else [])
    assert resolve_language_pair("m", [("en", "de")], None, None, required=True) == ("en", "de")
    assert resolve_language_pair("m", [("en", "de")], "EN", None, required=True) == ("EN", "de")
    with pytest.raises(CommandLineError, match="m translates en → de"):
        resolve_language_pair("m", [("en", "de")], "fr", None, required=False)


def test_an_export_records_the_pair(en_de, tmp_path):
    folder, _ = en_de
    assert main(["export", str(folder), str(tmp_path / "ct2"), "--format", "ctranslate2"]) == 0
    assert json.loads((tmp_path / "ct2" / "deepnmt_export.json").read_text())["language_pairs"] == [
        "translation_en_to_de"]
    assert saved_language_pairs(tmp_path / "ct2") == [("en", "de")]


# ------------------------------------------------------------------------------------------------ one sentence
def test_a_model_without_a_tokenizer_is_one_sentence(tmp_path, capsys):
    folder = tmp_path / "no-tokenizer"
    tiny_model().save_pretrained(folder)
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\n", encoding="utf-8")
    for argv in (["translate", str(folder), "--input", str(source)],
                 ["translate", "--model", str(folder), "--input", str(source)],
                 ["evaluate", str(folder), "--test_file", str(source), "--source_lang", "en", "--target_lang", "es"],
                 ["export", str(folder), str(tmp_path / "out"), "--format", "onnx"]):
        assert main(argv) == 2, argv
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and "holds a model but no tokenizer (no tokenizer.json)" in error[0], argv
    assert not (tmp_path / "out").exists()
    from transformers import pipeline

    with pytest.raises(UserInputError, match=r"holds no tokenizer .*tokenizer\.save_pretrained"):
        pipeline("translation", model=str(folder))


def test_a_missing_extra_is_one_sentence_and_leaves_nothing(tiny_folder, tmp_path, capsys, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name in ("onnxscript", "ctranslate2") else real_find_spec(name,
                                                                                                             *args))
    for format_, missing in (("onnx", "onnxscript"), ("ctranslate2", "ctranslate2")):
        output = tmp_path / format_
        assert main(["export", str(tiny_folder), str(output), "--format", format_]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and f"needs {missing}, which the `export` extra installs" in error[0]
        assert "pip install 'hf_deepnmt[export]'" in error[0]
        assert not output.exists() and not list(tmp_path.glob(".*partial*"))
    monkeypatch.setattr(sys, "stdin", open(os.devnull))
    export = tmp_path / "export"
    export.mkdir()
    (export / "deepnmt_export.json").write_text('{"format": "ctranslate2"}')
    assert main(["translate", str(export), "--engine", "ctranslate2"]) == 2
    assert "the ctranslate2 engine needs ctranslate2" in capsys.readouterr().err


def test_a_failed_export_leaves_no_folder(tiny_folder, tmp_path, monkeypatch):
    import hf_deepnmt.export as export

    def fail(*args, **kwargs):
        raise RuntimeError("killed while writing")

    monkeypatch.setattr(export, "export_ctranslate2", fail)
    with pytest.raises(RuntimeError):
        main(["export", str(tiny_folder), str(tmp_path / "out"), "--format", "ctranslate2"])
    assert list(tmp_path.iterdir()) == []


def test_an_empty_input_is_said(tiny_folder, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    assert main(["translate", str(tiny_folder), "--input", str(empty), "--output", str(tmp_path / "out.txt")]) == 0
    assert f"{empty} has no lines to translate; nothing was written" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ quiet and quick
def _run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.mark.integration
def test_export_and_translate_print_nothing_a_user_cannot_act_on(tiny_folder, tmp_path):
    done = _run("-m", "hf_deepnmt_training.cli", "export", str(tiny_folder), str(tmp_path / "onnx"), "--format", "onnx",
                "--quantization", "int8")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # no torchvision notes, no ONNX Runtime advice, no progress bars
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\n", encoding="utf-8")
    done = _run("-m", "hf_deepnmt_training.cli", "translate", str(tiny_folder), "--input", str(source), "--output",
                str(tmp_path / "out.txt"))
    assert done.returncode == 0 and "Loading weights" not in done.stderr, done.stderr


@pytest.mark.integration
def test_train_mistakes_are_answered_before_torch_loads(tmp_path):
    """Once the option table is cached (by any full parse, e.g. `deepnmt train --help`), a mistake is one sentence
    from a process that never imported torch (the full parse costs 6-8 CPU-seconds here)."""
    env = {"DEEPNMT_CACHE": str(tmp_path / "cache")}
    assert _run("-m", "hf_deepnmt_training.cli", "train", "--help", env=env).returncode == 0
    probe = ("import sys; from hf_deepnmt_training.cli import main; code = main(sys.argv[1:]); "
             "print(code, 'torch' in sys.modules)")
    for argv, message in ((["train", "--max_stepz", "3"], "unknown option `--max_stepz`; did you mean --max_steps"),
                          (["train", "--max_steps", "-5"], "`--max_steps` = -5 is not allowed"),
                          (["train", "--max_steps", "x"], "--max_steps/--max-steps: invalid int value: 'x'"),
                          (["train", "--train_file", str(tmp_path / "nope.jsonl")], "nope.jsonl' does not exist"),
                          (["quickstart", "--eval_num_beams", "0"], "`--eval_num_beams` = 0 is not allowed")):
        done = _run("-c", probe, *argv, env=env)
        assert done.stdout.split() == ["2", "False"], (argv, done.stdout, done.stderr)
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, (argv, done.stderr)


# ------------------------------------------------------------------------------------------------ time budget
def test_a_budget_without_a_step_count_is_a_run_length():
    from types import SimpleNamespace

    from hf_deepnmt_training.train import UNBOUNDED_STEPS, run_until_budget

    for schedule, given in (("inverse_sqrt", None), ("constant", None), ("linear", "rnnplus_warmup_decay")):
        training_args = SimpleNamespace(max_steps=-1, lr_scheduler_type=schedule, process_index=1)
        run_until_budget(SimpleNamespace(max_train_minutes=25.0, lr_schedule=given), training_args)
        assert training_args.max_steps == UNBOUNDED_STEPS
    kept = SimpleNamespace(max_steps=300, lr_scheduler_type="linear", process_index=1)
    run_until_budget(SimpleNamespace(max_train_minutes=25.0, lr_schedule=None), kept)
    assert kept.max_steps == 300  # a step count given: it ends the run (or the budget, whichever comes first)
    with pytest.raises(UserInputError, match="`--lr_scheduler_type` = 'linear' decays over --max_steps"):
        run_until_budget(SimpleNamespace(max_train_minutes=25.0, lr_schedule=None),
                         SimpleNamespace(max_steps=-1, lr_scheduler_type="linear", process_index=1))


@pytest.mark.integration
def test_train_with_a_budget_runs_past_the_epochs(small_corpus, tmp_path):
    """--max_train_minutes without --max_steps trained for --num_train_epochs (765 steps of a 25-minute budget for
    one user); now it trains until the budget: here far past one epoch of the 160 pairs (20 steps of 8)."""
    from hf_deepnmt_training.train import train

    outcome = train(train_argv(small_corpus, tmp_path / "run", "--num_train_epochs", "1", "--max_train_minutes",
                               "0.25"))
    steps = outcome.trainer.state.global_step
    assert steps > 2 * 20, steps


@pytest.mark.integration
def test_a_users_training_py_does_not_shadow_the_package(tmp_path):
    """The installed module is hf_deepnmt_training, so a training.py (or model_cards.py) of the user's own in the
    working directory changes nothing (it shadowed the former top-level `training`)."""
    (tmp_path / "training.py").write_text("raise SystemExit('the user module was imported')\n")
    (tmp_path / "model_cards.py").write_text("raise SystemExit('the user module was imported')\n")
    done = subprocess.run([sys.executable, "-c", "from hf_deepnmt_training import corpus; "
                           "import hf_deepnmt_model_cards, hf_deepnmt_training.cli; print(corpus.corpus_dir().name)"],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.strip() == "web-sparv", done.stderr
