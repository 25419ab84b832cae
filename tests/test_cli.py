"""The `deepnmt` command line: train (run_translation arguments), evaluate, translate, push, quickstart, recipes."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import TINY_TRAIN_ARGS, train_argv
from huggingface_hub import ModelCard
from test_model_cards import jumping_clock  # noqa: F401  (a fixture: time() moves 45 s per reading)

from hf_deepnmt_training.cli import main
from hf_deepnmt_training.errors import CommandLineError
from hf_deepnmt_training.hub import files_to_upload, push_folder, subfolders_left_out
from hf_deepnmt_training.recipes import RECIPES_DIR, load_model_config_dict, load_recipe

RUN_TRANSLATION_ARGS = ("--train_file", "--validation_file", "--test_file", "--source_lang", "--target_lang",
                        "--output_dir", "--max_source_length", "--max_target_length", "--max_train_samples",
                        "--max_eval_samples", "--max_predict_samples", "--dataset_name", "--dataset_config_name",
                        "--predict_with_generate", "--per_device_train_batch_size", "--learning_rate")
TINY_OVERRIDES = TINY_TRAIN_ARGS[TINY_TRAIN_ARGS.index("--config_overrides") + 1]
OUR_ARGS = ("--recipe", "--config_name", "--config_overrides", "--max_tokens", "--tokenizer_name", "--vocab_size")


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory):
    """One tiny `deepnmt train` run with evaluation, reused by the tests below."""
    from hf_deepnmt_training.train import train

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
    assert main(["train", "--help"]) == 0
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


@pytest.mark.integration
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
    # the file scored (not the training data) and the split (--max_predict_samples 10), in the text: a local file has
    # no Hub id for a model-index (tests/test_model_cards.py)
    assert card.data.eval_results is None and "Scored on test.jsonl:" in card.text
    assert f"| test[:10] | 10 | {metrics['test']['bleu']} |" in card.text
    assert f"- bleu: `{metrics['test']['signatures']['bleu']}`" in card.text
    assert "@inproceedings{vaswani2017attention" in card.text
    assert "training" in card.text.lower() and "optimizer steps" in card.text


@pytest.mark.integration
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


@pytest.mark.integration
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

    from hf_deepnmt_training.data import read_parallel_file
    from hf_deepnmt_training.translate import corpus_source_reliance

    corpus = read_parallel_file(small_corpus / "test.jsonl", "en", "es", 10)
    direct = corpus_source_reliance(AutoModelForSeq2SeqLM.from_pretrained(trained.output_dir),
                                    AutoTokenizer.from_pretrained(trained.output_dir), corpus.sources, corpus.targets)
    assert scores["source_reliance"] == pytest.approx(direct, abs=1e-4)


@pytest.mark.integration
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


@pytest.mark.integration
def test_translate_reads_at_most_one_window_ahead_and_keeps_the_order(trained):
    """Bounded memory on inputs of any length: a window of lines is read, sorted and translated before the next is
    read; the output is in input order and equals translating everything at once."""
    from hf_deepnmt_training.translate import translate_sentences, translate_windows

    model, tokenizer = trained.trainer.model.eval(), trained.tokenizer
    sentences = [("And God said " * (i % 4 + 1)).strip() if i % 5 else "" for i in range(11)]
    read = []

    def lines():
        for sentence in sentences:
            read.append(sentence)
            yield sentence + "\n"

    options = dict(num_beams=2, max_new_tokens=6)
    got = []
    for translation in translate_windows(model, tokenizer, lines(), window=4, batch_size=3, **options):
        got.append(translation)
        assert len(read) <= (len(got) - 1) // 4 * 4 + 4  # never more than the current window read
    assert got == translate_sentences(model, tokenizer, sentences, batch_size=32, progress=False, **options)
    assert got[0] == "" and got[5] == "" and got[1] != ""


@pytest.mark.integration
def test_translate_resumes_an_interrupted_output(trained, tmp_path, capsys, monkeypatch):
    import hf_deepnmt_training.translate

    source, full, partial = tmp_path / "in.txt", tmp_path / "full.txt", tmp_path / "partial.txt"
    source.write_text("".join(f"{'In the beginning ' * (i % 3 + 1)}{i}.\n" for i in range(9)), encoding="utf-8")
    argv = ["translate", "--model", str(trained.output_dir), "--input", str(source), "--num_beams", "2",
            "--max_new_tokens", "6", "--window", "4", "--batch_size", "2"]
    assert main([*argv, "--output", str(full)]) == 0
    expected = full.read_text(encoding="utf-8").splitlines(keepends=True)
    assert len(expected) == 9
    partial.write_text("".join(expected[:3]) + "torn last li", encoding="utf-8")  # killed while writing line 4
    translated = []
    original = hf_deepnmt_training.translate.translate_sentences
    monkeypatch.setattr(hf_deepnmt_training.translate, "translate_sentences",
                        lambda model, tok, sentences, **kw: translated.extend(sentences) or original(model, tok,
                                                                                                   sentences, **kw))
    capsys.readouterr()
    assert main([*argv, "--output", str(partial), "--resume"]) == 0
    assert partial.read_text(encoding="utf-8") == "".join(expected)
    assert len(translated) == 6  # only the lines after the 3 complete ones
    assert "resuming: 3 lines" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 2
    assert "--resume needs --output FILE" in capsys.readouterr().err
    assert main([*argv, "--window", "0", "--output", str(partial)]) == 2
    assert "--window 0 is not allowed" in capsys.readouterr().err


class RecordingHub:
    """Stands in for huggingface_hub.HfApi: records what would be sent, sends nothing."""

    def __init__(self):
        self.calls = []

    def create_repo(self, **kwargs):
        self.calls.append(("create_repo", kwargs))

    def create_commit(self, **kwargs):
        self.calls.append(("create_commit", kwargs))


@pytest.mark.integration
def test_push_uploads_exactly_the_model_files(trained):
    hub = RecordingHub()
    files = push_folder(trained.output_dir, "someone/tiny-en-es", api=hub, private=True)
    assert hub.calls[0] == ("create_repo", {"repo_id": "someone/tiny-en-es", "private": True, "exist_ok": True,
                                            "repo_type": "model"})
    kind, commit = hub.calls[1]
    uploaded = sorted(op.path_in_repo for op in commit["operations"])
    assert kind == "create_commit" and uploaded == files
    assert uploaded == sorted([
        "README.md", "aggregation.py", "all_results.json", "attention.py", "cache_deep_transformer.py",
        "cache_dtmt.py", "config.json", "configuration_common.py", "configuration_deep_transformer.py",
        "deepnmt_card.json", "errors.py", "generation_common.py", "generation_config.json", "handler.py",
        "loss_components.png", "losses.py", "metrics.json",
        "model.safetensors", "modeling_common.py", "modeling_deep_transformer.py", "objective_deep_transformer.py",
        "ort_generation.py", "papers.py", "pipeline_translation.py", "pretrained_deep_transformer.py",
        "retiring_search.py",
        "test_translations.txt", "tokenizer.json",
        "tokenizer_config.json", "train_results.json", "training_args.bin", "validation.png",
    ])
    card = next(op.path_or_fileobj for op in commit["operations"] if op.path_in_repo == "README.md")
    assert isinstance(card, bytes) and b'model="someone/tiny-en-es"' in card  # rendered for the repository
    assert b"path/to/this/folder" in (trained.output_dir / "README.md").read_bytes()  # the local card is unchanged
    assert all(Path(op.path_or_fileobj).parent == trained.output_dir for op in commit["operations"]
               if op.path_in_repo != "README.md")


@pytest.mark.integration
def test_push_leaves_out_subfolders_unless_asked(trained, tmp_path, capsys):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(trained.output_dir, folder)
    (folder / "averaged-last2").mkdir()
    (folder / "averaged-last2" / "model.safetensors").write_bytes(b"x")
    assert "averaged-last2/model.safetensors" not in files_to_upload(folder)
    assert "averaged-last2/model.safetensors" in files_to_upload(folder, include_subfolders=True)
    assert main(["push", str(folder), "--repo_id", "me/x", "--dry_run"]) == 0
    captured = capsys.readouterr()
    assert "averaged-last2" not in captured.out and "not uploading the subfolder(s) averaged-last2/" in captured.err


def test_push_uploads_the_onnx_export_the_endpoint_handler_serves(tmp_path):
    """`onnx/` holding an export (`deepnmt export --format onnx RUN RUN/onnx`) goes up with the model, since the
    folder's handler.py runs it on Inference Endpoints; other subfolders, and an `onnx/` without a manifest, do not."""
    import hf_deepnmt.handler
    from hf_deepnmt_training import hub

    assert (hub.ONNX_SUBFOLDER, hub.EXPORT_MANIFEST) == (hf_deepnmt.handler.ONNX_SUBFOLDER,
                                                         hf_deepnmt.handler.EXPORT_MANIFEST)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md",
                 "modeling_deep_transformer.py", "handler.py", "ort_generation.py"):
        (tmp_path / name).write_text("x")
    assert subfolders_left_out(tmp_path) == []
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "encoder.onnx").write_text("x")
    assert "onnx/encoder.onnx" not in files_to_upload(tmp_path) and subfolders_left_out(tmp_path) == ["onnx"]
    for name in ("deepnmt_export.json", "decoder.onnx", "config.json", "tokenizer.json"):
        (tmp_path / "onnx" / name).write_text("x")
    for other in ("averaged-last2", "checkpoint-4"):
        (tmp_path / other).mkdir()
        (tmp_path / other / "model.safetensors").write_text("x")
    (tmp_path / "averaged-last2" / "onnx").mkdir()
    (tmp_path / "averaged-last2" / "onnx" / "deepnmt_export.json").write_text("x")
    uploaded = files_to_upload(tmp_path)
    assert [name for name in uploaded if "/" in name] == ["onnx/config.json", "onnx/decoder.onnx",
                                                         "onnx/deepnmt_export.json", "onnx/encoder.onnx",
                                                         "onnx/tokenizer.json"]
    assert {"handler.py", "ort_generation.py"} <= set(uploaded)
    assert subfolders_left_out(tmp_path) == ["averaged-last2"]
    assert subfolders_left_out(tmp_path, include_subfolders=True) == []
    everything = files_to_upload(tmp_path, include_subfolders=True)
    assert set(everything) - set(uploaded) == {"averaged-last2/model.safetensors",
                                                "averaged-last2/onnx/deepnmt_export.json"}


def test_push_refuses_an_incomplete_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CommandLineError, match="missing model.safetensors, tokenizer_config.json, README.md, .*"
                                               "tokenizer.json or source.spm or vocab-src.json \\(the tokenizer\\)"):
        files_to_upload(tmp_path)


@pytest.mark.integration
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
    token_fields = {"vocab_size", "decoder_vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id",
                    "decoder_start_token_id", "use_cache", "is_encoder_decoder"}  # the tokenizer's (vocabularies too)
    assert documented - token_fields <= set(fields), documented - token_fields - set(fields)
    yaml.safe_dump(sections)  # plain data


def test_shipped_distributed_configs_parse():
    from hf_deepnmt_training.recipes import RECIPES_DIR

    configs = RECIPES_DIR.parent / "configs"
    accelerate = yaml.safe_load((configs / "accelerate_ddp.yaml").read_text())
    assert accelerate["distributed_type"] == "MULTI_GPU" and accelerate["num_processes"] >= 1
    zero2 = json.loads((configs / "deepspeed_zero2.json").read_text())
    assert zero2["zero_optimization"]["stage"] == 2 and zero2["train_micro_batch_size_per_gpu"] == "auto"


@pytest.mark.integration
def test_train_with_push_to_hub_uploads_once_at_the_end(small_corpus, tmp_path, monkeypatch):
    import huggingface_hub

    hubs = []

    class FakeHfApi(RecordingHub):
        def __init__(self, token=None):
            super().__init__()
            hubs.append(self)

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHfApi)
    from hf_deepnmt_training.train import train

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


@pytest.mark.integration
def test_radam_and_checkpoint_averaging(small_corpus, tmp_path):
    import torch
    from safetensors.torch import load_file

    from hf_deepnmt_training.checkpoints import average_checkpoints
    from hf_deepnmt_training.train import train

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


@pytest.mark.integration
def test_quickstart_end_to_end_in_miniature(tmp_path, capsys, jumping_clock):  # noqa: F811
    """The main job's whole path on the embedded corpus, shrunk to a tiny model and a few steps; its card states the
    run time it printed, however the clock moves between readings."""
    folder = tmp_path / "qs"
    assert main(["quickstart", "--output_dir", str(folder), "--max_steps", "4", "--eval_steps", "2",
                 "--save_steps", "2", "--logging_steps", "1", "--max_eval_samples", "4", "--max_predict_samples", "6",
                 "--vocab_size", "300", "--generation_max_length", "8", "--disable_tqdm", "true",
                 "--config_overrides", "d_model=16,encoder_ffn_dim=32,decoder_ffn_dim=32"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "hf_deepnmt quickstart finished in" in out and "BLEU" in out and "nrefs:1|" in out
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "modeling_deep_transformer.py", "pipeline_translation.py", "README.md", "metrics.json",
                 "loss_components.png", "validation.png", "sample_translations.md", "test_translations.txt"):
        assert (folder / name).exists(), name
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["test"]["sentences"] == 6 and metrics["timings_seconds"]["quickstart_seconds"] > 0
    assert json.loads((folder / "config.json").read_text())["layer_norm_position"] == "pre"
    card = ModelCard.load(folder / "README.md")
    assert card.data.datasets is None and card.data.license is None  # no Hub dataset id; no license given
    assert "The training data, the World English Bible and the Reina-Valera 1909" in card.text  # in the public domain
    printed = re.findall(r"quickstart finished in ([\d.]+) min", out + captured.err)
    in_all = re.search(r"- wall time: [\d.]+ min training, ([\d.]+) min in all", card.text).group(1)
    assert printed == [in_all]  # said once; the card states the run time the quickstart printed
    assert f"{metrics['timings_seconds']['quickstart_seconds'] / 60:.1f}" == in_all
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
    import hf_deepnmt_training.train

    def interrupted(argv, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(hf_deepnmt_training.train, "train", interrupted)
    assert main(["train", "--recipe", "quickstart"]) == 130
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "interrupted" in error[0] and "--resume_from_checkpoint last" in error[0]


# ------------------------------------------------------------------------------------------------ one vocabulary
def test_every_command_takes_model_name_or_path_its_alias_and_hyphen_spellings(tiny_folder, tmp_path, capsys):
    """The same model option everywhere (`--model_name_or_path`, alias `--model`), hyphens = underscores."""
    source = tmp_path / "in.txt"
    source.write_text("In the beginning.\nAnd the earth.\n", encoding="utf-8")
    outputs = []
    for spelling in (["--model_name_or_path", str(tiny_folder)], ["--model", str(tiny_folder)],
                     ["--model-name-or-path", str(tiny_folder)], [f"--model={tiny_folder}"]):
        out = tmp_path / f"out{len(outputs)}.txt"
        assert main(["translate", *spelling, "--input", str(source), "--output", str(out), "--num-beams", "2",
                     "--batch-size", "2", "--max-new-tokens", "4"]) == 0, capsys.readouterr().err
        outputs.append(out.read_text(encoding="utf-8"))
    assert len(set(outputs)) == 1 and len(outputs[0].splitlines()) == 2
    assert main(["push", "--model_name_or_path", str(tiny_folder), "--repo_id", "me/x", "--dry-run"]) == 2
    assert "cannot be pushed" in capsys.readouterr().err  # parsed: the folder was checked (it has no card)
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    assert "--model_name_or_path" in capsys.readouterr().out
    for command in ("evaluate", "diagnose", "translate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        several = " [MODEL ...]" if command != "diagnose" else ""  # evaluate and translate take an ensemble
        assert f"--model_name_or_path MODEL{several}, --model MODEL{several}" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["evaluate", "--model", "m", "--test_file", "t", "--num_beam", "3"],
     "unknown option `--num_beam`; did you mean --num_beams? (see `deepnmt evaluate --help`)"),
    (["translate", "--model", "m", "--bach_size", "3"], "unknown option `--bach_size`; did you mean --batch_size?"),
    (["train", "--recipe", "quickstart", "--max_step", "3"], "unknown option `--max_step`; did you mean --max_steps"),
    (["train", "--recipe", "quickstart", "--nm_beams", "2"], "did you mean --num_beams or --eval_num_beams?"),
    (["quickstart", "--max-step", "3"], "unknown option `--max_step`"),
    (["evaluate", "--test_file", "t"], "give the model once, as MODEL or --model_name_or_path"),
    (["train", "--recipe", "quickstart", "--max_steps", "abc"], "--max_steps/--max-steps: invalid int value: 'abc'"),
    (["export", "only-one-path", "--format", "onnx"], "give one model (MODEL or --model_name_or_path) and one output"),
    (["push", "a", "--model", "b", "--repo_id", "me/x"], "give the model folder once"),
    (["evaluate", "--mod", "m", "--test_file", "t"], "unknown option `--mod`"),  # no abbreviations
])
def test_a_misspelt_or_missing_option_gets_one_sentence_with_the_close_matches(argv, words, capsys):
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and words in error[0], error


def test_train_aliases_and_a_default_output_dir_printed_at_start(small_corpus, tmp_path, monkeypatch, capsys):
    """`--num_beams`/`--src_lang` name train's options; without --output_dir a new runs/<name>-<time> is used and
    printed; several processes must name one."""
    from hf_deepnmt_training.train_arguments import parse_train_args

    monkeypatch.chdir(tmp_path)
    argv = train_argv(small_corpus, tmp_path / "unused")
    argv = argv[:argv.index("--output_dir")] + argv[argv.index("--output_dir") + 2:]
    model_args, data_args, training_args, _ = parse_train_args(
        [*argv, "--num-beams", "3", "--src_lang", "fr", "--tgt-lang", "de"])
    assert (model_args.eval_num_beams, data_args.source_lang, data_args.target_lang) == (3, "fr", "de")
    assert training_args.output_dir.startswith("runs/deep_transformer-")
    assert f"writing the run to {training_args.output_dir}" in capsys.readouterr().err
    assert parse_train_args(["--recipe=quickstart"])[2].output_dir.startswith("runs/quickstart-")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="--output_dir is required when several processes"):
        parse_train_args(argv)


@pytest.mark.integration
def test_train_ends_with_a_summary_of_where_and_how(trained, capsys):
    from hf_deepnmt_training.report import print_train_summary

    print_train_summary(trained)
    out = capsys.readouterr().out
    folder = trained.output_dir
    assert f"-> {folder}" in out and f"BLEU {trained.test_scores.bleu}" in out
    assert f"deepnmt translate --model_name_or_path {folder} --input FILE --num_beams 2" in out
    assert f"deepnmt evaluate --model_name_or_path {folder} --test_file FILE" in out


@pytest.mark.integration
def test_the_card_of_a_crt_run_is_true(small_corpus, tmp_path):
    """The card of a CAD + CRT run (li2022): the training section lists the objective the methods section describes,
    the optimizer and schedule by their plain names, the model-index names the file and split that were scored, the
    pushed card names its repository, and the install instructions are ones that work."""
    from hf_deepnmt_training.hub import card_for_repo
    from hf_deepnmt_training.train import train

    overrides = TINY_OVERRIDES + ",cross_attention_drop_depth=1,cross_attention_drop_ratio=0.5,ddr_weight=1.0,ald_weight=0.5"
    argv = train_argv(small_corpus, tmp_path / "crt", "--max_steps", "2", "--max_predict_samples", "6",
                      "--eval_num_beams", "1", "--optimizer", "radam", "--lr_scheduler_type", "inverse_sqrt",
                      "--warmup_steps", "1")
    argv[argv.index(TINY_OVERRIDES)] = overrides
    outcome = train(argv)
    text = (outcome.output_dir / "README.md").read_text(encoding="utf-8")
    card = ModelCard(text)
    methods = text.split("## Training")[0]
    training = text.split("## Training")[1].split("## Limitations")[0]
    assert "DDR loss (li2022" in methods and "ALD loss (li2022" in methods
    assert "- objective: label-smoothed NLL (ε 0.1) + 1.0 × DDR (li2022) + 0.5 × ALD (li2022)" in training
    assert "- optimizer: RAdam (β1 0.9, β2 0.999, ε 1e-08), peak learning rate 0.003, gradient clipping 1.0" in training
    assert "- learning-rate schedule: linear warm-up over 1 steps, then inverse square root" in training
    assert "adamw" not in training.lower()
    assert card.data.eval_results is None  # a local test file: no Hub id for a model-index
    assert "Scored on test.jsonl:" in text and "| test[:6] | 6 |" in text
    assert "pip install hf_deepnmt" not in text and "pip install -e ." in text
    assert "pipeline(\"translation_en_to_es\", model=model, tokenizer=tokenizer)" in text
    assert 'pipeline("translation", model="path/to/this/folder", trust_remote_code=True)' in text
    pushed = card_for_repo(outcome.output_dir, "someone/crt-en-es").decode()
    assert 'model="someone/crt-en-es"' in pushed and 'from_pretrained("someone/crt-en-es")' in pushed
    assert "path/to/this/folder" not in pushed


@pytest.mark.integration
def test_resuming_from_a_damaged_checkpoint_names_it_and_offers_the_newest_complete_one(small_corpus, tmp_path,
                                                                                         capsys):
    from hf_deepnmt_training.train import train

    run = tmp_path / "run"
    argv = train_argv(small_corpus, run, "--max_steps", "4", "--save_strategy", "steps", "--save_steps", "2")
    argv = [a for a in argv if a != "--test_file" and not a.endswith("test.jsonl")]
    train(argv)
    weights = run / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # damaged after the (atomic) save, e.g. by a full disk copy
    capsys.readouterr()
    assert main(["train", *argv, "--resume_from_checkpoint", "last"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error
    assert f"{run / 'checkpoint-4'} cannot be resumed from ({weights} is truncated or corrupted)" in error[0]
    assert f"resume with --resume_from_checkpoint {run / 'checkpoint-2'}" in error[0]


@pytest.mark.parametrize("failure, words", [
    ("offline", "cannot upload to someone/x: HF_HUB_OFFLINE is set"),
    ("unauthorized", "the Hub refused the upload to someone/x (HTTP 401): log in with `hf auth login`"),
    ("no_network", "cannot reach the Hub to upload to someone/x (ConnectError: Name or service not known)"),
])
@pytest.mark.integration
def test_push_without_the_hub_says_so_in_one_sentence(trained, failure, words):
    """Offline, unreachable or not logged in: one sentence naming the repository and where the model stays."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    try:  # the HTTP client of huggingface_hub: httpx2 from huggingface_hub 2.x, httpx before
        import httpx2 as httpx
    except ImportError:
        import httpx

    request = httpx.Request("POST", "https://huggingface.co/api/repos/create")
    errors = {"offline": OfflineModeIsEnabled("offline mode is enabled"),
              "unauthorized": HfHubHTTPError("401 Unauthorized", response=httpx.Response(401, request=request)),
              "no_network": httpx.ConnectError("Name or service not known", request=request)}

    class FailingHub(RecordingHub):
        def create_repo(self, **kwargs):
            raise errors[failure]

    with pytest.raises(ValueError) as info:
        push_folder(trained.output_dir, "someone/x", api=FailingHub())
    message = str(info.value)
    assert words in message and f"the model stays in {trained.output_dir}" in message and "\n" not in message


@pytest.mark.integration
def test_bf16_translation_and_training_run_under_bfloat16_autocast_on_cpu(tiny_folder, small_corpus, tmp_path,
                                                                          monkeypatch):
    """`deepnmt translate --bf16` and `deepnmt train --bf16 true --use_cpu true` work on this CPU
    (docs/fast-inference.md, "bf16 on the CPU"): every forward of the model runs under CPU bfloat16 autocast, so its
    logits come out in bfloat16; without the flag (the default, chosen from the measurements) everything is float32."""
    import functools
    import math

    import torch

    from hf_deepnmt import DeepTransformerForConditionalGeneration
    from hf_deepnmt_training.train import train

    seen: list[tuple[bool, torch.dtype]] = []
    forward = DeepTransformerForConditionalGeneration.forward

    @functools.wraps(forward)  # the Trainer reads the signature to keep the dataset's columns
    def recording(self, *args, **kwargs):
        output = forward(self, *args, **kwargs)
        seen.append((torch.is_autocast_enabled("cpu"), output.logits.dtype))
        return output

    monkeypatch.setattr(DeepTransformerForConditionalGeneration, "forward", recording)
    (tmp_path / "in.txt").write_text("In the beginning God created the heavens.\nAnd God saw the light.\n",
                                     encoding="utf-8")
    common = ["translate", "--model", str(tiny_folder), "--input", str(tmp_path / "in.txt"), "--num_beams", "2",
              "--max_new_tokens", "6", "--threads", "1"]
    for flag, expected in (([], (False, torch.float32)), (["--bf16"], (True, torch.bfloat16))):
        seen.clear()
        assert main([*common, "--output", str(tmp_path / f"out{len(flag)}.txt"), *flag]) == 0
        assert seen and set(seen) == {expected}, flag
        assert (tmp_path / f"out{len(flag)}.txt").read_text(encoding="utf-8").count("\n") == 2
    seen.clear()
    outcome = train(train_argv(small_corpus, tmp_path / "run", "--max_steps", "2", "--bf16", "true"))
    assert outcome.trainer.args.bf16 and seen and set(seen) == {(True, torch.bfloat16)}
    losses = [entry["loss"] for entry in outcome.trainer.state.log_history if "loss" in entry]
    assert losses and all(math.isfinite(loss) for loss in losses)


# ------------------------------------------------------------------------------------------------ careless input
def test_max_steps_other_than_a_positive_count_or_minus_one_is_refused(tmp_path, capsys):
    """transformers reads any non-positive --max_steps as "train for --num_train_epochs": -5 trained silently."""
    from hf_deepnmt_training.train_arguments import parse_train_args

    for value in ("-5", "0"):
        assert main(["train", "--recipe", "quickstart", "--max_steps", value, "--output_dir", str(tmp_path / value)]) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert len(error) == 1 and f"`--max_steps` = {value} is not allowed" in error[0] and "-1" in error[0]
        assert not (tmp_path / value).exists()
    assert parse_train_args(["--recipe", "quickstart", "--max_steps", "-1", "--output_dir", str(tmp_path / "o")])[2].max_steps == -1


@pytest.mark.parametrize("command", ["evaluate", "translate", "export", "diagnose"])
def test_a_model_path_that_is_not_here_is_named_offline_and_online(command, tmp_path, monkeypatch, capsys):
    """`--model runs/no-such-model` used to print transformers' "We couldn't connect to 'https://huggingface.co'"
    without the name."""
    import transformers

    extra = {"evaluate": ["--test_file", "x.jsonl"], "translate": [], "diagnose": [],
             "export": ["--output_dir", str(tmp_path / "out"), "--format", "onnx"]}[command]
    argv = [command, "--model", "runs/no-such-model", *extra]
    assert main(argv) == 2  # HF_HUB_OFFLINE=1 (tests/conftest.py)
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "runs/no-such-model is not a folder here, and the Hub is not reachable" in error[0]

    def unreachable(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in "
                      "the cached files.")

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(transformers.AutoModelForSeq2SeqLM, "from_pretrained", unreachable)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", unreachable)
    assert main(argv) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "runs/no-such-model is not a folder here, and the Hub did not provide it" in error[0]


def test_a_misspelt_recipe_gets_its_closest_names_not_the_whole_list(capsys):
    assert main(["train", "--recipe", "quickstar"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "did you mean quickstart?" in error[0] and "deepnmt train --help" in error[0]
    assert len(error[0]) < 250 and "liu2020-wmt14" not in error[0]


def test_a_bug_shows_its_traceback_and_only_our_errors_are_one_sentence(monkeypatch, capsys):
    """Only the project's own error types are a user's mistake; a ValueError from inside torch or transformers is a bug
    and must not be turned into a one-line "user mistake" with exit status 2."""
    import hf_deepnmt_training.train

    def broken(argv, **kwargs):
        raise ValueError("expected scalar type Float but found Half")  # e.g. from inside torch

    monkeypatch.setattr(hf_deepnmt_training.train, "train", broken)
    with pytest.raises(ValueError, match="expected scalar type"):
        main(["train", "--recipe", "quickstart"])


def test_the_commands_choices_are_the_export_modules():
    """`--help` needs the export formats (and the ensemble combinations) without importing torch: the CLI's copies
    must be hf_deepnmt's."""
    from hf_deepnmt import ensemble, export
    from hf_deepnmt_training import arguments

    assert arguments.EXPORT_FORMATS == export.EXPORT_FORMATS and arguments.ENGINES == export.ENGINES
    assert arguments.QUANTIZATIONS == export.QUANTIZATIONS
    assert arguments.ENSEMBLE_COMBINATIONS == ensemble.COMBINATIONS


HELP_PROBE = """
import contextlib, io, json, sys
from hf_deepnmt_training.cli import main
argv = json.loads(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        code = main(argv)
    except SystemExit as exit:
        code = exit.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "trainer": "transformers.trainer" in sys.modules,
                  "length": len(out.getvalue())}))
"""


@pytest.mark.integration
def test_help_answers_without_importing_torch_or_the_trainer(tmp_path):
    """`deepnmt --help` and every `deepnmt <command> --help`, in a fresh interpreter, import neither torch nor
    transformers.trainer (`train --help` renders transformers' options once and reads them from the cache after)."""
    import os
    import subprocess

    from hf_deepnmt_training.cli import COMMANDS

    env = {**os.environ, "DEEPNMT_CACHE": str(tmp_path / "cache")}

    def probe(argv):
        result = subprocess.run([sys.executable, "-c", HELP_PROBE, json.dumps(argv)], env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    first = probe(["train", "--help"])
    assert first["code"] == 0 and not first["trainer"]  # the first rendering needs transformers' training arguments
    for argv in (["--help"], *([command, "--help"] for command in COMMANDS)):
        seen = probe(argv)
        assert seen["code"] == 0 and seen["length"] > 200, argv
        assert not seen["torch"] and not seen["trainer"], argv
    assert probe(["train", "--help"])["length"] == first["length"]
