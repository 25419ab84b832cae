"""The `deepnmt` command line: train (run_translation arguments), evaluate, translate, push, quickstart, recipes."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
import yaml
from conftest import train_argv
from huggingface_hub import ModelCard

from training.cli import main
from training.hub import files_to_upload, push_folder
from training.recipes import RECIPES_DIR, load_model_config_dict, load_recipe

RUN_TRANSLATION_ARGS = ("--train_file", "--validation_file", "--test_file", "--source_lang", "--target_lang",
                        "--output_dir", "--max_source_length", "--max_target_length", "--max_train_samples",
                        "--max_eval_samples", "--max_predict_samples", "--dataset_name", "--dataset_config_name",
                        "--predict_with_generate", "--per_device_train_batch_size", "--learning_rate")
OUR_ARGS = ("--recipe", "--config_name", "--config_overrides", "--max_tokens", "--tokenizer_name", "--vocab_size")


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory):
    """One tiny `deepnmt train` run with evaluation, reused by the tests below."""
    from training.run import train

    output_dir = tmp_path_factory.mktemp("cli") / "run"
    outcome = train(train_argv(small_corpus, output_dir, "--max_steps", "6", "--eval_strategy", "steps",
                               "--eval_steps", "3", "--predict_with_generate", "true", "--generation_max_length", "16",
                               "--max_eval_samples", "8", "--max_predict_samples", "10", "--eval_num_beams", "2"))
    return outcome


def test_help_of_every_command(capsys):
    assert main(["--help"]) == 0
    top = capsys.readouterr().out
    for command in ("quickstart", "train", "evaluate", "translate", "push"):
        assert command in top
    with pytest.raises(SystemExit) as info:
        main(["train", "--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    for flag in RUN_TRANSLATION_ARGS + OUR_ARGS:
        assert flag in text, flag
    for command in ("evaluate", "translate", "push", "quickstart"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "usage: deepnmt " + command in capsys.readouterr().out


def test_unknown_command_and_bad_arguments_give_one_sentence(capsys, small_corpus, tmp_path):
    assert main(["fly"]) == 2
    assert "unknown command 'fly'" in capsys.readouterr().err
    code = main(["train", "--train_file", str(tmp_path / "missing.jsonl"), "--output_dir", str(tmp_path / "o")])
    error = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(error) == 1 and "missing.jsonl" in error[0]
    assert main(["train", "--recipe", "no-such-recipe"]) == 2
    assert "no-such-recipe" in capsys.readouterr().err
    assert main(["train", *train_argv(small_corpus, tmp_path / "o2"), "--config_overrides", "d_model=15"]) == 2
    assert "`d_model` = 15 is not allowed" in capsys.readouterr().err


def test_train_writes_a_complete_model_folder(trained):
    folder = trained.output_dir
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json", "modeling_deep_transformer.py", "configuration_deep_transformer.py",
                 "pipeline_translation.py", "README.md", "metrics.json", "loss_components.png", "validation.png",
                 "test_translations.txt"):
        assert (folder / name).exists(), name
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["global_step"] == 6 and metrics["test"]["sentences"] == 10 and metrics["test"]["num_beams"] == 2
    assert metrics["test"]["signatures"]["bleu"].startswith("nrefs:1|")
    assert "eval_bleu" in metrics["validation"]
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["num_beams"] == 2
    assert generation.get("max_length") != 20  # Seq2SeqTrainer's evaluation default is not saved with the model
    card = ModelCard.load(folder / "README.md")
    assert card.data.language == ["en", "es"] and card.data.pipeline_tag == "translation"
    assert {"hf_deepnmt", "deep_transformer", "translation"} <= set(card.data.tags)
    bleu = next(r for r in card.data.eval_results if r.metric_type == "bleu")
    assert bleu.metric_value == metrics["test"]["bleu"] and bleu.dataset_split == "test"
    assert bleu.metric_config == metrics["test"]["signatures"]["bleu"]
    assert "@inproceedings{vaswani2017attention" in card.text
    assert "training" in card.text.lower() and "optimizer steps" in card.text


def test_an_existing_run_is_never_overwritten(trained, small_corpus, tmp_path, capsys):
    before = (trained.output_dir / "model.safetensors").read_bytes()
    assert main(["train", *train_argv(small_corpus, trained.output_dir), "--max_steps", "1"]) == 2
    assert "already holds a trained model" in capsys.readouterr().err
    assert (trained.output_dir / "model.safetensors").read_bytes() == before
    fresh = tmp_path / "fresh"
    assert main(["train", *train_argv(small_corpus, fresh), "--max_steps", "2", "--save_strategy", "steps",
                 "--save_steps", "1", "--save_only_model", "true"]) == 0
    (fresh / "model.safetensors").unlink()  # only the checkpoints are left, as after a crash
    assert main(["train", *train_argv(small_corpus, fresh), "--max_steps", "2"]) == 2
    assert "already holds checkpoint-2; continue it with --resume_from_checkpoint last" in capsys.readouterr().err


def test_evaluate_reproduces_the_training_runs_test_score(trained, small_corpus, tmp_path, capsys):
    out = tmp_path / "scores.json"
    assert main(["evaluate", "--model", str(trained.output_dir), "--test_file", str(small_corpus / "test.jsonl"),
                 "--num_beams", "2", "--max_samples", "10", "--output_json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("BLEU ")
    scores = json.loads(out.read_text())
    metrics = json.loads((trained.output_dir / "metrics.json").read_text())
    assert scores["bleu"] == metrics["test"]["bleu"] and scores["chrf"] == metrics["test"]["chrf"]
    # li2022's collapse monitor for any saved model: printed and saved, the same value as the library function
    assert "source reliance" in printed and scores["source_reliance"] > 0
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from training.data import read_parallel_file
    from training.run import corpus_source_reliance

    corpus = read_parallel_file(small_corpus / "test.jsonl", "en", "es", 10)
    direct = corpus_source_reliance(AutoModelForSeq2SeqLM.from_pretrained(trained.output_dir),
                                    AutoTokenizer.from_pretrained(trained.output_dir), corpus.sources, corpus.targets)
    assert scores["source_reliance"] == pytest.approx(direct, abs=1e-4)


def test_translate_from_file_and_stdin(trained, tmp_path, monkeypatch, capsys):
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\n\nAnd God said.\n", encoding="utf-8")
    target = tmp_path / "out.txt"
    assert main(["translate", "--model", str(trained.output_dir), "--input", str(source), "--output", str(target),
                 "--num_beams", "2", "--max_new_tokens", "8"]) == 0
    lines = target.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[0] != ""
    monkeypatch.setattr(sys, "stdin", io.StringIO("In the beginning.\nAnd God said.\n"))
    assert main(["translate", "--model", str(trained.output_dir), "--num_beams", "2", "--max_new_tokens", "8"]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == [lines[0], lines[2]]


class RecordingHub:
    """Stands in for huggingface_hub.HfApi: records what would be sent, sends nothing."""

    def __init__(self):
        self.calls = []

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))

    def create_commit(self, **kwargs):
        self.calls.append(("create_commit", kwargs))


def test_push_uploads_exactly_the_model_files(trained):
    hub = RecordingHub()
    files = push_folder(trained.output_dir, "someone/tiny-en-es", api=hub, private=True)
    assert hub.calls[0] == ("create_repo", {"repo_id": "someone/tiny-en-es", "private": True, "exist_ok": True,
                                            "repo_type": "model"})
    kind, commit = hub.calls[1]
    uploaded = sorted(op.path_in_repo for op in commit["operations"])
    assert kind == "create_commit" and uploaded == files
    assert uploaded == sorted([
        "README.md", "aggregation.py", "all_results.json", "config.json", "configuration_deep_transformer.py",
        "deepnmt_card.json", "generation_config.json", "loss_components.png", "losses.py", "metrics.json", "model.safetensors",
        "modeling_deep_transformer.py", "pipeline_translation.py", "test_translations.txt", "tokenizer.json",
        "tokenizer_config.json", "train_results.json", "training_args.bin", "validation.png",
    ])
    assert all(Path(op.path_or_fileobj).parent == trained.output_dir for op in commit["operations"])


def test_push_refuses_an_incomplete_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="missing model.safetensors, tokenizer.json"):
        files_to_upload(tmp_path)


def test_push_dry_run_lists_files(trained, capsys):
    assert main(["push", str(trained.output_dir), "--repo_id", "someone/x", "--dry_run"]) == 0
    assert capsys.readouterr().out.split() == files_to_upload(trained.output_dir)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_every_recipe_is_complete_and_documented(recipe):
    from transformers import AutoConfig

    path = RECIPES_DIR / f"{recipe}.yaml"
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any("Reproduces:" in line for line in header) and any("Command:" in line for line in header)
    sections = load_recipe(recipe)
    fields = load_model_config_dict(None, sections["model"])
    # complete: every documented config field is spelled out (no chain of mutated defaults)
    config_class = type(AutoConfig.for_model(fields.get("model_type", "deep_transformer")))
    documented = set(config_class().to_dict()) & set(config_class.__init__.__code__.co_varnames)
    token_fields = {"vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id",
                    "decoder_start_token_id", "use_cache", "is_encoder_decoder"}
    assert documented - token_fields <= set(fields), documented - token_fields - set(fields)
    yaml.safe_dump(sections)  # plain data


def test_shipped_distributed_configs_parse():
    from training.recipes import RECIPES_DIR

    configs = RECIPES_DIR.parent / "configs"
    accelerate = yaml.safe_load((configs / "accelerate_ddp.yaml").read_text())
    assert accelerate["distributed_type"] == "MULTI_GPU" and accelerate["num_processes"] >= 1
    zero2 = json.loads((configs / "deepspeed_zero2.json").read_text())
    assert zero2["zero_optimization"]["stage"] == 2 and zero2["train_micro_batch_size_per_gpu"] == "auto"


def test_train_with_push_to_hub_uploads_once_at_the_end(small_corpus, tmp_path, monkeypatch):
    import huggingface_hub

    hubs = []

    class FakeHfApi(RecordingHub):
        def __init__(self, token=None):
            super().__init__()
            hubs.append(self)

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    from training.run import train

    outcome = train(train_argv(small_corpus, tmp_path / "run", "--max_steps", "2", "--push_to_hub", "true",
                               "--hub_model_id", "someone/pushed", "--hub_private_repo", "true"))
    assert len(hubs) == 1  # the Trainer itself never talked to the Hub
    (kind, repo), (_, commit) = hubs[0].calls
    assert kind == "create_repo" and repo["repo_id"] == "someone/pushed" and repo["private"] is True
    uploaded = {op.path_in_repo for op in commit["operations"]}
    assert {"model.safetensors", "tokenizer.json", "pipeline_translation.py", "README.md"} <= uploaded
    assert uploaded == set(files_to_upload(outcome.output_dir))


def test_push_to_hub_without_a_repo_id_is_refused(small_corpus, tmp_path, capsys):
    assert main(["train", *train_argv(small_corpus, tmp_path / "r"), "--push_to_hub", "true"]) == 2
    assert "--hub_model_id" in capsys.readouterr().err


def test_radam_and_checkpoint_averaging(small_corpus, tmp_path):
    import torch
    from safetensors.torch import load_file

    from training.run import average_checkpoints, train

    outcome = train(train_argv(small_corpus, tmp_path / "run", "--max_steps", "3", "--optimizer", "radam",
                               "--save_strategy", "steps", "--save_steps", "1"))
    assert type(outcome.trainer.optimizer.optimizer if hasattr(outcome.trainer.optimizer, "optimizer")
                else outcome.trainer.optimizer) is torch.optim.RAdam
    assert main(["average-checkpoints", str(tmp_path / "run"), "--last", "2"]) == 0
    averaged = load_file(str(tmp_path / "run" / "averaged-last2" / "model.safetensors"))
    two = load_file(str(tmp_path / "run" / "checkpoint-2" / "model.safetensors"))
    three = load_file(str(tmp_path / "run" / "checkpoint-3" / "model.safetensors"))
    for name, tensor in averaged.items():
        assert torch.allclose(tensor, (two[name] + three[name]) / 2, atol=1e-6), name
    assert (tmp_path / "run" / "averaged-last2" / "tokenizer.json").exists()
    assert (tmp_path / "run" / "averaged-last2" / "modeling_deep_transformer.py").exists()
    with pytest.raises(ValueError, match="fewer than --last 5"):
        average_checkpoints(tmp_path / "run", last=5)


def test_quickstart_end_to_end_in_miniature(tmp_path, capsys):
    """The main job's whole path on the embedded corpus, shrunk to a tiny model and a few steps."""
    folder = tmp_path / "qs"
    assert main(["quickstart", "--output_dir", str(folder), "--max_steps", "4", "--eval_steps", "2",
                 "--save_steps", "2", "--logging_steps", "1", "--max_eval_samples", "4", "--max_predict_samples", "6",
                 "--vocab_size", "300", "--generation_max_length", "8", "--disable_tqdm", "true",
                 "--config_overrides", "d_model=16,encoder_ffn_dim=32,decoder_ffn_dim=32"]) == 0
    out = capsys.readouterr().out
    assert "hf_deepnmt quickstart finished in" in out and "BLEU" in out and "nrefs:1|" in out
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "modeling_deep_transformer.py", "pipeline_translation.py", "README.md", "metrics.json",
                 "loss_components.png", "validation.png", "sample_translations.md", "test_translations.txt"):
        assert (folder / name).exists(), name
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["test"]["sentences"] == 6 and metrics["timings_seconds"]["quickstart_seconds"] > 0
    assert json.loads((folder / "config.json").read_text())["layer_norm_position"] == "pre"
    card = ModelCard.load(folder / "README.md")
    assert card.data.datasets == ["hf_deepnmt/bible-web-rv1909"] and "public domain" in card.text
    assert len((folder / "sample_translations.md").read_text().splitlines()) == 2 + 5


@pytest.mark.parametrize("command, make, words", [
    (["translate", "--model", "{tmp}/missing-model"], None, "`--model` = '{tmp}/missing-model' does not exist"),
    (["evaluate", "--model", "./not-here", "--test_file", "x"], None, "`--model` = './not-here' does not exist"),
    (["diagnose", "--model={tmp}/empty"], "dir", "is a folder without a saved model"),
    (["train", "--model_name_or_path", "{tmp}/weights.bin"], "file", "is a file; it must be a saved model folder"),
    (["train", "--warm_start_from", "{tmp}/missing/run"], None, "`--warm_start_from` = '{tmp}/missing/run' does not"),
    (["train", "--recipe", "quickstart", "--output_dir", "{tmp}/weights.bin"], "file", "is an existing file"),
    (["train", "--recipe", "quickstart", "--output_dir", "{tmp}/run", "--eval_num_beams", "0"], None,
     "`--eval_num_beams` = 0 is not allowed"),
])
def test_bad_model_references_and_output_folders_get_one_line_and_exit_2(command, make, words, tmp_path, capsys):
    if make == "dir":
        (tmp_path / "empty").mkdir()
    elif make == "file":
        (tmp_path / "weights.bin").write_bytes(b"\0")
    argv = [part.replace("{tmp}", str(tmp_path)) for part in command]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and words.replace("{tmp}", str(tmp_path)) in error[0], error


@pytest.mark.parametrize("damage, words", [
    ("truncate", "model.safetensors is truncated or corrupted"),
    ("no_weights", "holds a config but no weights"),
    ("model_type", "names model_type 'no_such_model', which neither transformers nor hf_deepnmt knows"),
    ("config_json", "config.json is not a readable JSON config"),
])
def test_a_damaged_saved_model_is_named_with_its_file(damage, words, tiny_folder, tmp_path, capsys):
    import shutil

    folder = tmp_path / "damaged"
    shutil.copytree(tiny_folder, folder)
    weights, config = folder / "model.safetensors", folder / "config.json"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "no_weights":
        weights.unlink()
    elif damage == "model_type":
        config.write_text(config.read_text().replace('"deep_transformer"', '"no_such_model"'))
    else:
        config.write_text("{ not json")
    assert main(["translate", "--model", str(folder), "--input", str(config)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and words in error[0] and str(folder) in error[0], error


@pytest.mark.parametrize("recipe, overrides, words", [
    ("quickstart", "decoder_layer=3", "`decoder_layer` is not a field of DeepTransformerConfig (deep_transformer); "
                                      "did you mean decoder_layers"),
    ("quickstart", "encoder_layer_agregation=dense", "did you mean encoder_layer_aggregation"),
    ("meng2019-bible-dtmt4", "transition_dept=2", "`transition_dept` is not a field of DTMTConfig (dtmt); did you "
                                                  "mean transition_depth"),
    ("meng2019-bible-dtmt4", "ddr_weight=1.0", "DTMT is a recurrent model"),
])
def test_config_override_typos_are_refused_with_close_matches(recipe, overrides, words, tmp_path, capsys):
    argv = ["train", "--recipe", recipe, "--output_dir", str(tmp_path / "run"), "--config_overrides", overrides]
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and words in error[0], error
    assert not (tmp_path / "run" / "config.json").exists()


def test_ctrl_c_during_training_prints_how_to_resume(monkeypatch, capsys):
    import training.run

    def interrupted(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(training.run, "train", interrupted)
    assert main(["train", "--recipe", "quickstart"]) == 130
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "interrupted" in error[0] and "--resume_from_checkpoint last" in error[0]
