"""A converted public checkpoint is a model of the package like any other (docs/public-checkpoints.md): `deepnmt
convert`, fine-tuning (`deepnmt train --model_name_or_path`, a stock `Seq2SeqTrainer`), deepening (`--warm_start_from`
with dou2018's copy, Wu et al.'s growing, Li et al.'s stacking, li2022 CAD, liu2020 ADMIN), the exports, the
translation pipeline, remote code and the Inference Endpoints handler — with its own tokenizer (a slow
MarianTokenizer or FairseqMosesBPETokenizer). Also issue 66.1: any other transformers seq2seq model fine-tunes with the
label-smoothed NLL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import train_argv
from public_checkpoints import (
    SOURCE_SAMPLE,
    TARGET_SAMPLE,
    fairseq_bpe_checkpoint,
    fairseq_bpe_ids,
    fairseq_sentencepiece_checkpoint,
    fsmt_source,
    marian_source,
    require_convert_extra,
)
from test_pipeline_and_remote_code import BLOCK_OUR_PACKAGES
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from hf_deepnmt import convert_checkpoint, convert_model, warm_start
from hf_deepnmt.errors import UserInputError
from hf_deepnmt_training.cli import main

require_convert_extra()


@pytest.fixture(scope="module")
def opus_mt(tmp_path_factory) -> Path:
    """A converted OPUS-MT-style folder (shared vocabulary, SiLU, output bias)."""
    root = tmp_path_factory.mktemp("opus_mt")
    return convert_checkpoint(marian_source(root / "source", "opus_mt"), root / "converted")


def logits(model, tokenizer, decoder_length: int = 6) -> torch.Tensor:
    batch = tokenizer(SOURCE_SAMPLE, padding=True, return_tensors="pt")
    decoder_input_ids = torch.full((len(SOURCE_SAMPLE), decoder_length), 7)
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        return model.eval()(**batch, decoder_input_ids=decoder_input_ids).logits


# ------------------------------------------------------------------------------------------------ deepening
def test_depth_growing_keeps_the_trained_layers_at_the_bottom_and_adds_new_ones(opus_mt):
    """Wu et al. 2019: the trained layers 1..L of each stack are layers 1..L of the grown one, the new top layers
    are initialised and listed as new (what --warm_start_hold_pretrained_steps holds the others against)."""
    source = AutoModelForSeq2SeqLM.from_pretrained(opus_mt)
    grown = warm_start(source, model_type="deep_transformer", method="grow", encoder_layers=4, decoder_layers=3)
    trained = source.state_dict()
    for name, tensor in grown.state_dict().items():
        if name in trained:
            assert torch.equal(tensor, trained[name]), name
    new = set(grown.warm_start_new_parameters)
    assert new and all(name.startswith(("model.encoder.layers.2.", "model.encoder.layers.3.",
                                        "model.decoder.layers.2.")) for name in new)
    assert grown.config.position_encoding == "sinusoidal" and grown.config.output_bias  # the source's backbone
    with pytest.raises(UserInputError, match="`encoder_layers` = 4 is not allowed with method 'copy'"):
        warm_start(source, model_type="deep_transformer", encoder_layers=4)


def test_stacking_copies_the_trained_top_layers_onto_the_top(opus_mt):
    """Li et al. 2020 (SDT): 2 → 5 encoder layers: new layers 3, 4, 5 are copies of trained layers 2, 1, 2 …
    precisely of L − k + j (k = 3 > L = 2 repeats the stack: 1, 2, 1); 2 → 3: layer 3 is a copy of layer 2."""
    source = AutoModelForSeq2SeqLM.from_pretrained(opus_mt)
    trained = source.state_dict()
    stacked = warm_start(source, model_type="deep_transformer", method="stack", encoder_layers=5, decoder_layers=3)
    state = stacked.state_dict()
    for new, copied in ((2, 0), (3, 1), (4, 0)):
        assert torch.equal(state[f"model.encoder.layers.{new}.fc1.weight"], trained[f"model.encoder.layers.{copied}.fc1.weight"])
    assert torch.equal(state["model.decoder.layers.2.encoder_attn.k_proj.weight"],
                       trained["model.decoder.layers.1.encoder_attn.k_proj.weight"])
    assert stacked.warm_start_new_parameters == ()  # every layer starts trained


def test_cad_and_admin_warm_starts_compute_the_trained_network(opus_mt):
    """li2022 CAD (p_net < 1) acts only in training, and ADMIN from a trained model keeps ω = 1, where LN(x + f(x))
    is the trained post-LN network: both warm starts give the converted model's logits exactly; ADMIN's closed form
    (a fresh initialisation's ω) is refused."""
    source = AutoModelForSeq2SeqLM.from_pretrained(opus_mt)
    tokenizer = AutoTokenizer.from_pretrained(opus_mt)
    expected = logits(source, tokenizer)
    cad = warm_start(source, model_type="deep_transformer", cross_attention_drop_depth=1,
                     cross_attention_drop_ratio=0.5)
    admin = warm_start(source, model_type="admin_transformer")
    assert admin.config.admin_profiled and admin.warm_start_new_parameters  # ω, trained from 1, never profiled
    assert all(torch.equal(value, torch.ones_like(value)) for name, value in admin.named_parameters() if "omega" in name)
    for model in (cad, admin):
        torch.testing.assert_close(logits(model, tokenizer), expected, rtol=0, atol=1e-5)
    with pytest.raises(UserInputError, match="closed_form"):
        warm_start(source, model_type="admin_transformer", admin_init="closed_form")


def test_a_stock_seq2seq_trainer_fine_tunes_a_converted_model(opus_mt, tmp_path):
    from datasets import Dataset
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments

    model = AutoModelForSeq2SeqLM.from_pretrained(opus_mt)
    tokenizer = AutoTokenizer.from_pretrained(opus_mt)
    data = Dataset.from_dict(tokenizer(SOURCE_SAMPLE, text_target=TARGET_SAMPLE))
    before = {name: value.detach().clone() for name, value in model.named_parameters()}
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4,
                                    learning_rate=1e-3, report_to="none", use_cpu=True, save_strategy="no",
                                    logging_steps=1, label_smoothing_factor=0.0)
    trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=data,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
    losses = [entry["loss"] for entry in trainer.train() and trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(model.lm_head.bias, before["lm_head.bias"])  # Marian's output bias trains (a parameter)


# ------------------------------------------------------------------------------------------------ deepnmt train
def run_train(corpus, output_dir, *extra, capsys=None) -> tuple[int, str]:
    argv = ["train", *train_argv(corpus, output_dir, "--max_steps", "2", "--eval_num_beams", "2",
                                 "--source_lang", "en", "--target_lang", "es")]
    overrides = argv.index("--config_overrides")
    del argv[overrides:overrides + 2]  # a fine-tuned model keeps its own shape
    code = main([*argv, *extra])
    return code, capsys.readouterr().err if capsys is not None else ""


@pytest.mark.integration
def test_train_converts_a_marian_folder_first_and_fine_tunes_it(small_corpus, tmp_path, capsys):
    source = marian_source(tmp_path / "marian", "separate_vocabularies")
    code, err = run_train(small_corpus, tmp_path / "run", "--model_name_or_path", str(source), capsys=capsys)
    assert code == 0, err
    assert "converted the marian model" in err and "fine-tuning the converted model" in err
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["model_type"] == "deep_transformer" and config["converted_from"]["format"] == "marian"
    card = (tmp_path / "run" / "README.md").read_text()
    assert "initialised from the marian checkpoint" in card and "converted exactly by `deepnmt convert`" in card
    assert not config["share_encoder_decoder_embeddings"]
    assert type(AutoTokenizer.from_pretrained(tmp_path / "run")).__name__ == "MarianTokenizer"


@pytest.mark.integration
def test_train_fine_tunes_an_fsmt_model_on_targets_of_its_target_dictionary(small_corpus, tmp_path, capsys):
    """transformers' FSMTTokenizer would make the labels with the source dictionary; the converted tokenizer makes
    them with the target's, so the run's labels are the target ids."""
    source = fsmt_source(tmp_path / "fsmt")
    code, err = run_train(small_corpus, tmp_path / "run", "--model_name_or_path", str(source), capsys=capsys)
    assert code == 0, err
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "run")
    assert type(tokenizer).__name__ == "FairseqMosesBPETokenizer"
    for target in TARGET_SAMPLE:  # fairseq's target ids: Moses (de) + subword-nmt + dict.de.txt
        assert tokenizer(text_target=target).input_ids == fairseq_bpe_ids(tmp_path / "fsmt" / "fairseq", target, "de")


@pytest.mark.integration
def test_train_grows_a_converted_model_holding_its_trained_layers(opus_mt, small_corpus, tmp_path, capsys):
    """--warm_start_method grow with --warm_start_hold_pretrained_steps 2: after 2 steps the trained weights are
    unchanged, the new layers trained."""
    code, err = run_train(small_corpus, tmp_path / "run", "--warm_start_from", str(opus_mt), "--warm_start_method",
                          "grow", "--config_overrides", "encoder_layers=3,decoder_layers=3",
                          "--warm_start_hold_pretrained_steps", "2", "--save_strategy", "no", capsys=capsys)
    assert code == 0, err
    assert "grown to 3+3 layers (Wu et al. 2019" in err and "the trained ones are held for the first 2 steps" in err
    source = AutoModelForSeq2SeqLM.from_pretrained(opus_mt).state_dict()
    grown = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "run").state_dict()
    for name in ("model.encoder.layers.0.fc1.weight", "model.decoder.layers.1.encoder_attn.q_proj.weight",
                 "lm_head.bias"):
        assert torch.equal(grown[name], source[name]), name
    code, err = run_train(small_corpus, tmp_path / "released", "--warm_start_from", str(opus_mt), "--warm_start_method",
                          "grow", "--config_overrides", "encoder_layers=3,decoder_layers=3",
                          "--warm_start_hold_pretrained_steps", "1", "--save_strategy", "no", capsys=capsys)
    assert code == 0, err
    released = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "released").state_dict()
    assert not torch.equal(released["model.encoder.layers.0.fc1.weight"], source["model.encoder.layers.0.fc1.weight"])


@pytest.mark.integration
def test_a_warm_start_keeps_the_trained_shape_and_refuses_another_in_one_sentence(opus_mt, small_corpus, tmp_path,
                                                                                  capsys):
    code, err = run_train(small_corpus, tmp_path / "run", "--warm_start_from", str(opus_mt), "--config_overrides",
                          "d_model=32", capsys=capsys)
    assert code == 2 and "`d_model` = 32 is not allowed with --warm_start_from" in err


@pytest.mark.integration
def test_train_fine_tunes_a_stock_transformers_model_with_the_label_smoothed_nll(small_corpus, tiny_tokenizer, tmp_path,
                                                                                capsys):
    """Issue 66.1: a BART of transformers fine-tunes (it died with AttributeError 'loss_components'); asking it for
    the papers' losses is one sentence before anything is written."""
    from transformers import BartConfig, BartForConditionalGeneration

    folder = tmp_path / "bart"
    config = BartConfig(vocab_size=len(tiny_tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
                        max_position_embeddings=64, pad_token_id=tiny_tokenizer.pad_token_id,
                        bos_token_id=tiny_tokenizer.bos_token_id, eos_token_id=tiny_tokenizer.eos_token_id,
                        decoder_start_token_id=tiny_tokenizer.bos_token_id, forced_eos_token_id=None)
    BartForConditionalGeneration(config).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    code, err = run_train(small_corpus, tmp_path / "run", "--model_name_or_path", str(folder),
                          "--label_smoothing_factor", "0.1", capsys=capsys)
    assert code == 0, err
    assert "fine-tuning a 'bart' model of transformers with the label-smoothed NLL" in err
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert all(torch.isfinite(torch.tensor(entry["loss"])) for entry in state["log_history"] if "loss" in entry)
    code, err = run_train(small_corpus, tmp_path / "refused", "--model_name_or_path", str(folder),
                          "--config_overrides", "ddr_weight=1.0", capsys=capsys)
    assert code == 2 and "`--config_overrides` = 'ddr_weight=1.0' is not allowed with a 'bart' model" in err
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())


# ------------------------------------------------------------------------------------------------ deepnmt convert
def test_deepnmt_convert_writes_a_folder_and_says_what_it_converted(tmp_path, capsys):
    source = marian_source(tmp_path / "marian")
    assert main(["convert", str(source), "--output_dir", str(tmp_path / "out"), "--source_lang", "en",
                 "--target_lang", "es"]) == 0
    out = capsys.readouterr().out
    assert "converted the marian model" in out and "within 0 of transformers' MarianMTModel" in out and "en → es" in out
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert main(["convert", str(source), str(tmp_path / "out")]) == 2
    assert "exists and is not an empty folder" in capsys.readouterr().err
    directory, _ = fairseq_bpe_checkpoint(tmp_path / "fairseq")
    (directory / "dict.de.txt").unlink()
    capsys.readouterr()  # the fixture's own output (subword-nmt's progress bar)
    assert main(["convert", str(directory), str(tmp_path / "fairseq_out")]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "dict.de.txt is missing" in error[0]
    assert main(["train", "--model_name_or_path", str(directory), "--output_dir", str(tmp_path / "o")]) == 2
    assert "is a fairseq checkpoint; convert it first: deepnmt convert" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------ exports, pipeline
@pytest.mark.parametrize("case", ["separate_vocabularies", "fairseq_pre_ln"])
def test_the_exports_of_a_converted_model_translate_as_it_does(case, tmp_path):
    """CTranslate2 (two vocabularies, fairseq's position table, Marian's output bias and banned <pad>) and ONNX give
    the torch engine's beam-4 translations. CTranslate2 cuts a hypothesis at its length limit where generate forces
    </s> there (Marian's and fairseq's forced_eos_token_id): the comparison runs without that setting."""
    from hf_deepnmt.export import export_model, load_engine

    source = (marian_source(tmp_path / "source", case) if case != "fairseq_pre_ln"
              else fairseq_sentencepiece_checkpoint(tmp_path / "source")[0])
    folder = convert_checkpoint(source, tmp_path / "converted")
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model.generation_config.forced_eos_token_id = None
    model.generation_config.early_stopping = True  # CTranslate2's stopping rule (docs/fast-inference.md)
    model.save_pretrained(folder)
    sources = [tokenizer(line).input_ids for line in SOURCE_SAMPLE]
    expected = load_engine(folder, "torch").generate(sources, num_beams=4, max_new_tokens=10)
    assert not any(model.config.pad_token_id in ids for ids in expected)
    for export_format in ("ctranslate2", "onnx"):
        exported = export_model(model, tokenizer, tmp_path / export_format, export_format)
        assert load_engine(exported, export_format).generate(sources, num_beams=4, max_new_tokens=10) == expected


REMOTE = BLOCK_OUR_PACKAGES + textwrap.dedent(
    """
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    folder, text = sys.argv[1], sys.argv[2]
    translate = pipeline("translation", model=folder, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    print(type(translate.model).__name__, type(tokenizer).__name__)
    print(translate(text, max_new_tokens=8, num_beams=2)[0]["translation_text"])
    """
)


@pytest.mark.integration
def test_a_converted_folder_translates_in_process_remotely_and_through_the_handler(tmp_path):
    """The pipeline in-process, the saved folder's remote code where hf_deepnmt is not importable (the fairseq
    tokenizer's code travels with it), and the Inference Endpoints handler give the same translation."""
    from transformers import pipeline

    from hf_deepnmt.handler import EndpointHandler

    folder = convert_checkpoint(fairseq_bpe_checkpoint(tmp_path / "fairseq")[0], tmp_path / "converted")
    assert (folder / "tokenization_fairseq.py").is_file()
    text = SOURCE_SAMPLE[1]
    local = pipeline("translation", model=str(folder))(text, max_new_tokens=8, num_beams=2)[0]["translation_text"]
    handled = EndpointHandler(str(folder))({"inputs": text, "parameters": {"max_new_tokens": 8, "num_beams": 2}})
    assert handled[0]["translation_text"] == local
    script = tmp_path / "remote.py"
    script.write_text(REMOTE)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-I", str(script), str(folder), text], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    classes, translation = result.stdout.strip().splitlines()[-2:]
    assert classes == "DeepTransformerForConditionalGeneration FairseqMosesBPETokenizer"
    assert translation == local


def test_the_pipeline_puts_a_multi_target_model_s_code_before_the_source(tmp_path):
    """A multi-target OPUS-MT model (``>>xx<<`` tokens) records its codes; ``tgt_lang="es"`` translates as the
    text with ``>>es<<`` before it, and a code the model lacks is one sentence."""
    from transformers import pipeline

    folder = convert_checkpoint(marian_source(tmp_path / "source", "multi_target"), tmp_path / "converted")
    translate = pipeline("translation", model=str(folder))
    text = SOURCE_SAMPLE[0]
    coded = translate(f">>es<< {text}", max_new_tokens=6, num_beams=2)[0]["translation_text"]
    assert translate(text, tgt_lang="es", max_new_tokens=6, num_beams=2)[0]["translation_text"] == coded
    assert translate(text, tgt_lang="fr", max_new_tokens=6, num_beams=2)[0]["translation_text"] != coded \
        or translate(text, tgt_lang="de", max_new_tokens=6, num_beams=2)[0]["translation_text"] != coded
    with pytest.raises(UserInputError, match="`tgt_lang` = 'it' is not allowed; this multi-target model's codes are"):
        translate(text, tgt_lang="it")


@pytest.mark.integration
def test_translate_evaluate_push_and_ensembles_take_a_converted_folder(tmp_path, capsys):
    """`deepnmt translate` and `evaluate` on a converted folder (its slow tokenizer), `deepnmt push` uploads its
    tokenizer files (no tokenizer.json) and code, and two converted models of one tokenizer are an ensemble."""
    from hf_deepnmt import load_ensemble
    from hf_deepnmt_training.hub import files_to_upload

    source = marian_source(tmp_path / "source")
    folder = convert_checkpoint(source, tmp_path / "converted", source_lang="en", target_lang="es")
    (tmp_path / "input.txt").write_text("\n".join(SOURCE_SAMPLE) + "\n")
    capsys.readouterr()
    assert main(["translate", str(folder), "--input", str(tmp_path / "input.txt"), "--num_beams", "2",
                 "--max_new_tokens", "8"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == len(SOURCE_SAMPLE)
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps({"translation": {"en": s, "es": t}}) + "\n"
                                 for s, t in zip(SOURCE_SAMPLE, TARGET_SAMPLE)))
    assert main(["evaluate", str(folder), "--test_file", str(test_file), "--num_beams", "2"]) == 0
    assert "BLEU" in capsys.readouterr().out
    (folder / "README.md").write_text("a card")
    uploaded = files_to_upload(folder)
    assert {"source.spm", "target.spm", "vocab.json", "modeling_deep_transformer.py"} <= set(uploaded)
    second = convert_checkpoint(marian_source(tmp_path / "second", seed=1), tmp_path / "second-converted")
    ensemble, tokenizer = load_ensemble([str(folder), str(second)])
    batch = tokenizer(SOURCE_SAMPLE[:2], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert ensemble.generate(**batch, num_beams=2, max_new_tokens=6).shape[0] == 2


@pytest.mark.integration
def test_deepnmt_serve_answers_with_a_converted_fairseq_model(tmp_path):
    """`deepnmt serve` on a converted folder whose tokenizer is FairseqMosesBPETokenizer answers as the pipeline."""
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    from test_serve import Server
    from transformers import pipeline

    folder = convert_checkpoint(fairseq_bpe_checkpoint(tmp_path / "fairseq")[0], tmp_path / "converted")
    parameters = {"num_beams": 2, "max_new_tokens": 8}
    expected = [answer["translation_text"] for answer in
                pipeline("translation", model=str(folder))(SOURCE_SAMPLE[:3], **parameters)]
    server = Server(folder, "--workers", "1")
    try:
        server.wait_ready()
        status, answer = server.post({"inputs": SOURCE_SAMPLE[:3], "parameters": parameters})
    finally:
        code = server.stop()
    assert status == 200 and [item["translation_text"] for item in answer] == expected
    assert code == 0, server.log()


@pytest.mark.integration
def test_distill_takes_a_converted_teacher_with_two_vocabularies(small_corpus, tmp_path):
    """`deepnmt distill` with a converted OPUS-MT model of separate vocabularies as the teacher: its translations
    train a student on the teacher's tokenizer, which gets the teacher's two vocabularies and starts decoding from
    <pad> (Marian's tokenizer has no <s>)."""
    from test_distill import STUDENT

    teacher = convert_checkpoint(marian_source(tmp_path / "source", "separate_vocabularies"), tmp_path / "teacher",
                                 source_lang="en", target_lang="es")
    out = tmp_path / "distill"
    assert main(["distill", "--teachers", str(teacher), "--output_dir", str(out), "--train_file",
                 str(small_corpus / "train.jsonl"), "--validation_file", str(small_corpus / "valid.jsonl"),
                 "--test_file", str(small_corpus / "test.jsonl"), "--num_beams", "2", "--export", "none",
                 *STUDENT]) == 0
    student = json.loads((out / "student" / "config.json").read_text())
    teacher_config = json.loads((teacher / "config.json").read_text())
    assert not student["share_encoder_decoder_embeddings"]
    assert student["decoder_vocab_size"] == teacher_config["decoder_vocab_size"]
    assert student["decoder_start_token_id"] == student["pad_token_id"] and student["bos_token_id"] is None
