"""`deepnmt distill`: teacher -> distilled data -> student -> int8 export, every stage cached; a run killed in any stage
resumes to the result of an uninterrupted one; bad input is one sentence and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import load_file

import hf_deepnmt
from hf_deepnmt_training.cli import main
from hf_deepnmt_training.distill import STAGES, DistillOptions, distill

STUDENT = ["--max_steps", "6", "--save_steps", "3", "--config_overrides",
           "d_model=16,encoder_layers=3,decoder_layers=1,encoder_attention_heads=2,decoder_attention_heads=2,"
           "encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64",
           "--max_source_length", "48", "--max_target_length", "48", "--max_tokens", "400", "--report_to", "none",
           "--eval_strategy", "no", "--disable_tqdm", "true", "--logging_steps", "1", "--max_predict_samples", "8"]


class Killed(Exception):
    """Stands for the process dying at this point."""


@pytest.fixture(scope="module")
def teacher(tiny_tokenizer, tmp_path_factory):
    """A briefly trained tiny teacher that records en → es, with its tokenizer."""
    from export_cases import trained_variant

    folder = tmp_path_factory.mktemp("teacher") / "teacher"
    model = trained_variant("post_ln", tiny_tokenizer)
    hf_deepnmt.record_language_pair(model.config, "en", "es")
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


def options(teacher: Path, corpus: Path, output_dir: Path, **overrides) -> DistillOptions:
    settings = dict(teachers=[str(teacher)], output_dir=str(output_dir), train_file=str(corpus / "train.jsonl"),
                    validation_file=str(corpus / "valid.jsonl"), test_file=str(corpus / "test.jsonl"),
                    source_lang="en", target_lang="es", num_beams=2, batch_size=8, window=40,
                    train_argv=list(STUDENT))
    return DistillOptions(**{**settings, **overrides})


def completed(folder: Path) -> list[str]:
    return list(json.loads((folder / "distill.json").read_text())["completed"])


@pytest.mark.integration
def test_a_run_killed_in_each_stage_resumes_to_the_uninterrupted_result(teacher, small_corpus, tmp_path, monkeypatch,
                                                                         capsys):
    """The chain: killed after half the translations; killed while writing the dataset; killed after the student's
    first checkpoint; killed between the two exports. Each rerun skips the completed stages, continues the one that
    was interrupted (only the missing translations; training from checkpoint-3) and never takes a half-written file
    for done. The end equals an uninterrupted run: the same translations and dataset, the same student weights (to
    float precision), complete exports; the student's card names its teacher and its data."""
    import hf_deepnmt.export
    import hf_deepnmt_training.distill
    import hf_deepnmt_training.translate
    from hf_deepnmt_training.trainer import DeepNMTTrainer

    reference = tmp_path / "reference"
    outcome = distill(options(teacher, small_corpus, reference))
    assert outcome.ran == list(STAGES) and completed(reference) == list(STAGES)

    out = tmp_path / "out"
    calls = {"translated": 0}
    original_translate = hf_deepnmt_training.translate.translate_sentences

    def dies_in_the_third_window(model, tokenizer, sentences, **kwargs):
        if calls["translated"] >= 80:
            raise Killed
        calls["translated"] += len(sentences)
        return original_translate(model, tokenizer, sentences, **kwargs)

    monkeypatch.setattr(hf_deepnmt_training.translate, "translate_sentences", dies_in_the_third_window)
    with pytest.raises(Killed):
        distill(options(teacher, small_corpus, out))
    assert completed(out) == [] and len((out / "distilled" / "translations.txt").read_text().splitlines()) == 80
    assert not (out / "distilled" / "train.jsonl").exists()

    calls["translated"] = -10_000  # translates on
    original_records = hf_deepnmt_training.distill.distilled_records

    def dies_while_writing(plan):
        for index, item in enumerate(original_records(plan)):
            if index == 10:
                raise Killed
            yield item

    monkeypatch.setattr(hf_deepnmt_training.distill, "distilled_records", dies_while_writing)
    with pytest.raises(Killed):
        distill(options(teacher, small_corpus, out))
    assert completed(out) == ["translate"]
    assert calls["translated"] == -10_000 + 80  # only the 80 sources left
    manifest = json.loads((out / "distill.json").read_text())
    assert manifest["completed"]["translate"]["resumed_after"] == 80
    assert (out / "distilled" / "translations.txt").read_text() == (
        reference / "distilled" / "translations.txt").read_text()
    assert (out / "distilled" / ".train.jsonl.partial").exists() and not (out / "distilled" / "train.jsonl").exists()

    monkeypatch.setattr(hf_deepnmt_training.distill, "distilled_records", original_records)
    original_save = DeepNMTTrainer._save_checkpoint

    def dies_after_checkpoint_3(self, model, trial):
        original_save(self, model, trial)
        if self.state.global_step == 3:
            raise Killed

    monkeypatch.setattr(DeepNMTTrainer, "_save_checkpoint", dies_after_checkpoint_3)
    with pytest.raises(Killed):
        distill(options(teacher, small_corpus, out))
    assert completed(out) == ["translate", "dataset"]
    assert (out / "distilled" / "train.jsonl").read_text() == (reference / "distilled" / "train.jsonl").read_text()
    assert (out / "student" / "checkpoint-3").is_dir() and not (out / "student" / "model.safetensors").exists()

    monkeypatch.setattr(DeepNMTTrainer, "_save_checkpoint", original_save)
    original_export = hf_deepnmt.export.export_model

    def dies_in_the_second_export(model, tokenizer, output_dir, export_format, quantization=None):
        if export_format == "ctranslate2":
            Path(output_dir).mkdir(parents=True)
            (Path(output_dir) / "model.bin").write_bytes(b"half")
            raise Killed
        return original_export(model, tokenizer, output_dir, export_format, quantization)

    monkeypatch.setattr(hf_deepnmt.export, "export_model", dies_in_the_second_export)
    capsys.readouterr()
    with pytest.raises(Killed):
        distill(options(teacher, small_corpus, out))
    assert f"continuing the student from {out / 'student' / 'checkpoint-3'}" in capsys.readouterr().err
    assert completed(out) == ["translate", "dataset", "train"]
    assert (out / "student" / "onnx" / "deepnmt_export.json").is_file()  # renamed into place, yet not recorded
    assert (out / ".student-ctranslate2.incomplete" / "model.bin").exists()
    assert not (out / "student-ctranslate2").exists()

    monkeypatch.setattr(hf_deepnmt.export, "export_model", original_export)
    outcome = distill(options(teacher, small_corpus, out))
    assert outcome.ran == ["export"] and completed(out) == list(STAGES)
    assert not (out / ".student-ctranslate2.incomplete").exists()
    state = json.loads((out / "student" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    trained, expected = load_file(out / "student" / "model.safetensors"), load_file(reference / "student" /
                                                                                     "model.safetensors")
    assert all(torch.allclose(trained[name], expected[name], atol=1e-4) for name in expected)
    for folder in (out / "student" / "onnx", out / "student-ctranslate2"):
        manifest = json.loads((folder / "deepnmt_export.json").read_text())
        assert manifest["quantization"] == "int8"
        assert main(["translate", "--model", str(folder), "--input", str(small_corpus / "test.jsonl"), "--source_lang",
                     "en", "--target_lang", "es", "--max_samples", "2", "--output", str(tmp_path / "t.txt"),
                     "--num_beams", "2"]) == 0
        assert len((tmp_path / "t.txt").read_text().splitlines()) == 2
    card = (out / "student" / "README.md").read_text()
    assert f"teachers: {teacher}" in card and str(out / "distilled" / "train.jsonl") in card
    assert "Kim & Rush 2016" in card
    metrics = json.loads((out / "student" / "metrics.json").read_text())
    assert metrics["distillation"]["teachers"] == [str(teacher)] and metrics["distillation"]["pairs"] == 160

    capsys.readouterr()
    assert main(["distill", "--teachers", str(teacher), "--output_dir", str(out), "--train_file",
                 str(small_corpus / "train.jsonl"), "--num_beams", "3", *STUDENT]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "was distilled with num_beams = 2, not 3" in error[0], error


@pytest.mark.integration
def test_keep_original_targets_trains_on_both(teacher, small_corpus, tmp_path):
    out = tmp_path / "both"
    distill(options(teacher, small_corpus, out, keep_original_targets=True, export_formats=[]))
    records = [json.loads(line)["translation"] for line in (out / "distilled" / "train.jsonl").read_text().splitlines()]
    originals = [json.loads(line)["translation"] for line in (small_corpus / "train.jsonl").read_text().splitlines()]
    translations = (out / "distilled" / "translations.txt").read_text().splitlines()
    assert records[0::2] == [{"en": pair["en"], "es": text} for pair, text in zip(originals, translations)]
    assert records[1::2] == originals
    assert completed(out) == list(STAGES) and not (out / "student" / "onnx").exists()


@pytest.mark.parametrize("extra, words", [
    (["--teachers", "{empty}"], "`--teachers` = '{empty}' is a folder without a saved model"),
    (["--teachers", "{teacher}", "{other_vocab}"], "has vocab_size 121 but {teacher} has 120; the members of an "
                                                   "ensemble must share one vocabulary"),
    (["--teachers", "{teacher}", "--source_lang", "de", "--target_lang", "en"],
     "the teacher {teacher} translates en → es, not --source_lang de → --target_lang en"),
    (["--teachers", "{teacher}", "--max_target_length", "300"],
     "`max_position_embeddings` = 256 is not allowed with --max_source_length/--max_target_length 300"),
    (["--teachers", "{teacher}", "--recipe", "studnet"], "did you mean student"),
    (["--teachers", "{teacher}", "--tokenizer_name", "{teacher}"],
     "`--tokenizer_name` is not allowed among the student's training options"),
    (["--teachers", "{teacher}", "--recipe", "meng2019-bible-dtmt4", "--export", "ctranslate2"],
     "`--export ctranslate2` is not allowed for the student of recipe 'meng2019-bible-dtmt4': CTranslate2 cannot "
     "express meng2019 DTMT"),
    (["--teachers", "{teacher}", "--train_file", "{tmp}/missing.jsonl"], "missing.jsonl does not exist"),
    (["--teachers", "{teacher}", "--max_stepz", "3"], "unknown option `--max_stepz`; did you mean --max_steps"),
    (["--teachers", "{teacher}", "--device", "cuda:99"], "`--device` = 'cuda:99' is not available"),
    (["--teachers", "{teacher}", "--device", "gpu"], "`--device` = 'gpu' is not allowed; use auto, cpu, cuda"),
])
def test_bad_input_is_one_sentence_and_writes_nothing(teacher, tiny_tokenizer, small_corpus, tmp_path, capsys, extra,
                                                      words):
    """A folder that is not a model, teachers of two vocabularies, teachers of another language pair, a student
    recipe that does not fit the data (positions shorter than the length limit), a misspelt recipe, an option
    distill sets itself, an export the student cannot have, a missing training file, a misspelt training option, a
    device this machine lacks or torch does not know."""
    (tmp_path / "empty").mkdir()
    other_vocab = tmp_path / "other_vocab"
    tiny_model(vocab_size=len(tiny_tokenizer) + 1).save_pretrained(other_vocab)
    tiny_tokenizer.save_pretrained(other_vocab)
    names = {"empty": tmp_path / "empty", "teacher": teacher, "other_vocab": other_vocab, "tmp": tmp_path}
    fill = lambda text: text.format(**{key: str(value) for key, value in names.items()})  # noqa: E731
    argv = [fill(token) for token in extra]
    if "--train_file" not in argv:
        argv += ["--train_file", str(small_corpus / "train.jsonl")]
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["distill", *argv, "--output_dir", str(out)]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and fill(words) in error[0], error
    assert not out.exists()


@pytest.mark.integration
def test_two_processes_share_the_translation_and_train_the_student_together(teacher, small_corpus, tmp_path):
    """`torchrun --nproc_per_node 2 deepnmt distill` (2 CPU processes over gloo): the teacher's translations are the
    one-process translations line for line, and the student trains data-parallel."""
    import os
    import socket
    import subprocess
    import sys

    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_deepnmt_training.translate import training_file_sources, translate_corpus

    expected = tmp_path / "expected.txt"
    translate_corpus(AutoModelForSeq2SeqLM.from_pretrained(teacher), AutoTokenizer.from_pretrained(teacher),
                     training_file_sources(small_corpus / "train.jsonl", "en", "es"), expected, num_beams=2)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "two"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               "-m", "hf_deepnmt_training.cli", "distill", "--teachers", str(teacher), "--output_dir", str(out),
               "--train_file", str(small_corpus / "train.jsonl"), "--validation_file", str(small_corpus / "valid.jsonl"),
               "--test_file", str(small_corpus / "test.jsonl"), "--num_beams", "2", "--batch_size", "8",
               "--window", "40", "--threads", "1", "--export", "none", *STUDENT]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "distilled" / "translations.txt").read_text() == expected.read_text()
    import re

    assert len(re.findall(r"train: \d+ pairs from", result.stderr)) == 2  # both processes ran the student's training
    assert json.loads((out / "student" / "trainer_state.json").read_text())["global_step"] == 6
    assert completed(out) == list(STAGES) and result.stdout.count("deepnmt distill finished") == 1
    assert not list((out / "distilled").glob("translations.txt.from*"))  # the parts were merged and removed


@pytest.fixture(scope="module")
def en_fr(tiny_tokenizer, tmp_path_factory):
    """A tiny teacher that records en → fr, and train/valid/test files of the user's own in en and fr."""
    from conftest import PARALLEL

    folder = tmp_path_factory.mktemp("en_fr")
    model = tiny_model(vocab_size=len(tiny_tokenizer))
    hf_deepnmt.record_language_pair(model.config, "en", "fr")
    model.save_pretrained(folder / "teacher")
    tiny_tokenizer.save_pretrained(folder / "teacher")
    for split in ("train", "valid", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"translation": {"en": en, "fr": fr}}) + "\n"
                                                       for en, fr in PARALLEL), encoding="utf-8")
    return folder


def test_distill_without_languages_takes_the_teachers_pair(en_fr, tmp_path):
    """Issue 66 item 6: `deepnmt distill --train_file` of the user's own data without --source_lang/--target_lang
    took the recipe's en → es (its corpus's pair) and refused an en → fr teacher as "not --source_lang en →
    --target_lang es", options the user never passed. The pair comes from the teachers; the recipe's corpus (and its
    validation and test files) is refused in one sentence when it lacks the pair's languages."""
    from hf_deepnmt_training.distill import plan_distillation
    from hf_deepnmt_training.errors import CommandLineError

    teacher = str(en_fr / "teacher")
    files = {split: str(en_fr / f"{name}.jsonl") for split, name in
             (("train_file", "train"), ("validation_file", "valid"), ("test_file", "test"))}
    plan = plan_distillation(DistillOptions(teachers=[teacher], output_dir=str(tmp_path / "out"), **files,
                                            train_argv=list(STUDENT)))
    assert (plan.source_lang, plan.target_lang) == ("en", "fr") and "en" in plan.student_argv
    assert not (tmp_path / "out").exists()
    with pytest.raises(CommandLineError) as refused:
        plan_distillation(DistillOptions(teachers=[teacher], output_dir=str(tmp_path / "out"),
                                         train_file=files["train_file"], train_argv=list(STUDENT)))
    assert str(refused.value).startswith("--validation_file defaults to the recipe 'student''s corpus:web-sparv/"
                                         "valid.jsonl.gz, which holds en and es, not the pair to distil, en → fr;")
    with pytest.raises(CommandLineError) as refused:
        plan_distillation(DistillOptions(teachers=[teacher], output_dir=str(tmp_path / "out"),
                                         train_argv=list(STUDENT)))
    assert str(refused.value).startswith(f"the pair to distil is {teacher}'s en → {teacher}'s fr, and the recipe "
                                         "'student''s corpus")
    with pytest.raises(CommandLineError) as refused:
        plan_distillation(DistillOptions(teachers=[teacher], output_dir=str(tmp_path / "out"), target_lang="de",
                                         **files, train_argv=list(STUDENT)))
    assert str(refused.value) == (f"the teacher {teacher} translates en → fr, not --target_lang de; distil with "
                                  "teachers of the data's pair.")
