"""pipeline("translation") in-process, and a saved folder used where hf_deepnmt cannot be imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from conftest import train_argv
from hf_deepnmt import TranslationPipeline, record_language_pair, recorded_language_pairs

SENTENCES = ["In the beginning God created the heavens.", "Let there be light.", "The earth was void."]


def _direct(model, tokenizer, text: str, **generate_kwargs) -> str:
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        ids = model.generate(**inputs, **generate_kwargs)
    return tokenizer.decode(ids[0], skip_special_tokens=True)


@pytest.fixture(scope="module")
def loaded(tiny_folder):
    return AutoModelForSeq2SeqLM.from_pretrained(tiny_folder).eval(), AutoTokenizer.from_pretrained(tiny_folder)


def test_generation_kwargs_reach_generate(loaded):
    model, tokenizer = loaded
    translate = pipeline("translation", model=model, tokenizer=tokenizer)
    short = translate(SENTENCES[0], max_new_tokens=2, num_beams=1, return_tensors=True)[0]["translation_token_ids"]
    assert len(short) <= 3  # decoder start + 2 new tokens
    longer = translate(SENTENCES[0], max_new_tokens=6, num_beams=1, return_tensors=True)[0]["translation_token_ids"]
    assert len(longer) > 3
    n_best = translate(SENTENCES, num_beams=4, num_return_sequences=3, max_new_tokens=5)
    assert len(n_best) == 3 and all(len(candidates) == 3 for candidates in n_best)
    ids = translate(SENTENCES[1], return_tensors=True, max_new_tokens=4)[0]["translation_token_ids"]
    assert ids[0].item() == model.config.decoder_start_token_id


def test_empty_string_gives_empty_translation(loaded):
    model, tokenizer = loaded
    translate = pipeline("translation", model=model, tokenizer=tokenizer, max_new_tokens=5)
    assert translate("") == [{"translation_text": ""}]
    mixed = translate(["", SENTENCES[0], "   "])
    assert mixed[0] == mixed[2] == {"translation_text": ""}
    assert mixed[1] == translate(SENTENCES[0])[0]


def test_over_long_input_is_truncated_with_a_warning(loaded):
    model, tokenizer = loaded
    translate = pipeline("translation", model=model, tokenizer=tokenizer, max_new_tokens=5)
    too_long = " ".join([SENTENCES[0]] * 20)  # far beyond max_position_embeddings = 64
    with pytest.warns(UserWarning, match="truncated to the 64 tokens"):
        result = translate(too_long)
    assert isinstance(result[0]["translation_text"], str)
    with pytest.raises(ValueError, match="truncation=True"):
        translate(too_long, truncation=False)


def test_pipeline_from_a_saved_folder_in_process(tiny_folder, loaded):
    model, tokenizer = loaded
    translate = pipeline("translation", model=str(tiny_folder), trust_remote_code=True)
    assert translate(SENTENCES[2], max_new_tokens=6, num_beams=2) == [
        {"translation_text": _direct(model, tokenizer, SENTENCES[2], max_new_tokens=6, num_beams=2)}
    ]


# A fresh process in which this project's packages cannot be imported (a machine where only the Hub folder exists).
BLOCK_OUR_PACKAGES = textwrap.dedent(
    """
    import importlib.abc, sys

    class BlockOurPackages(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("hf_deepnmt", "training", "model_cards"):
                raise ImportError(f"{name} is blocked in this process")

    sys.meta_path.insert(0, BlockOurPackages())
    """
)


FRESH_PROCESS = BLOCK_OUR_PACKAGES + textwrap.dedent(
    """
    import json
    import torch
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

    folder, text = sys.argv[1], sys.argv[2]
    try:
        import hf_deepnmt  # noqa: F401
        raise SystemExit("hf_deepnmt was importable")
    except ImportError:
        pass
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    inputs = tokenizer(text, return_tensors="pt")
    ids = model.generate(**inputs, num_beams=3, max_new_tokens=8)
    translate = pipeline("translation", model=folder, trust_remote_code=True)
    print(json.dumps({
        "config_module": type(config).__module__,
        "model_module": type(model).__module__,
        "tokenizer_class": type(tokenizer).__name__,
        "pipeline_module": type(translate).__module__,
        "generated": tokenizer.decode(ids[0], skip_special_tokens=True),
        "pipeline": translate([text, ""], num_beams=3, max_new_tokens=8),
    }))
    """
)


def test_saved_config_names_the_pipeline(tiny_folder):
    config = json.loads((tiny_folder / "config.json").read_text())
    assert config["custom_pipelines"] == {
        "translation": {"impl": "pipeline_translation.TranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"],
                        "type": "text"}
    }


@pytest.mark.parametrize("inputs, words", [
    (None, "`inputs` = None (NoneType)"),
    (3, "`inputs` = 3 (int)"),
    ({"text": "hi"}, "`inputs` = {'text': 'hi'} (dict)"),
    (["In the beginning.", 5], "`inputs[1]` = 5 (int)"),
    (["In the beginning.", None], "`inputs[1]` = None (NoneType)"),
])
def test_pipeline_refuses_non_strings_naming_the_item(loaded, inputs, words):
    model, tokenizer = loaded
    translate = pipeline("translation", model=model, tokenizer=tokenizer, max_new_tokens=3)
    with pytest.raises(ValueError, match="not allowed") as error:
        translate(inputs)
    assert words in str(error.value)


def test_pipeline_gives_empty_translations_for_blank_strings(loaded):
    model, tokenizer = loaded
    translate = pipeline("translation", model=model, tokenizer=tokenizer, max_new_tokens=3)
    out = translate(["", "   ", SENTENCES[0]])
    assert [r["translation_text"] for r in out[:2]] == ["", ""] and out[2]["translation_text"] != ""


LOAD_QUIETLY = textwrap.dedent(
    """
    import importlib.abc, sys

    folder, mode = sys.argv[1], sys.argv[2]
    if mode == "remote":
        class BlockOurPackages(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in ("hf_deepnmt", "training", "model_cards"):
                    raise ImportError(f"{name} is blocked in this process")

        sys.meta_path.insert(0, BlockOurPackages())
    else:
        import hf_deepnmt  # noqa: F401
    from transformers import AutoModelForSeq2SeqLM, pipeline

    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True)
    translate = pipeline("translation", model=folder, trust_remote_code=True)
    print(type(model).__module__, translate("In the beginning.", max_new_tokens=3))
    """
)


@pytest.mark.integration
@pytest.mark.parametrize("family", ["admin_transformer", "deep_representation_transformer", "dtmt"])
@pytest.mark.parametrize("mode", ["installed", "remote"])
def test_loading_a_saved_model_prints_no_warning(family, mode, tiny_tokenizer, tmp_path):
    """Issue: loading our models used to print a model-type mismatch warning. Every family, with the package
    imported and through remote code in a fresh process, loads and translates with nothing on stderr but the
    weight-loading progress bar."""
    import hf_deepnmt

    small = dict(vocab_size=len(tiny_tokenizer), d_model=16)
    if family == "dtmt":
        model = hf_deepnmt.DTMTForConditionalGeneration(
            hf_deepnmt.DTMTConfig(**small, attention_heads=2, transition_depth=1))
    else:
        config_class = {"admin_transformer": hf_deepnmt.AdminTransformerConfig,
                        "deep_representation_transformer": hf_deepnmt.DeepRepresentationTransformerConfig}[family]
        model_class = {"admin_transformer": hf_deepnmt.AdminTransformerForConditionalGeneration,
                       "deep_representation_transformer":
                           hf_deepnmt.DeepRepresentationTransformerForConditionalGeneration}[family]
        model = model_class(config_class(**small, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                         decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32))
    folder = tmp_path / family
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    script = tmp_path / "load.py"
    script.write_text(LOAD_QUIETLY)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"),
           "TRANSFORMERS_VERBOSITY": "warning", "PYTHONWARNINGS": "default",
           "PYTHONPATH": "" if mode == "remote" else str(Path(__file__).resolve().parents[1])}
    result = subprocess.run([sys.executable, str(script), str(folder), mode], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    module = result.stdout.split()[0]
    assert module.startswith("transformers_modules." if mode == "remote" else "hf_deepnmt.")
    noise = [line for line in result.stderr.replace("\r", "\n").splitlines()
             if line.strip() and not line.lstrip().startswith("Loading weights")]
    assert noise == [], noise


# --------------------------------------------------------------------------------------------------------------
# Hugging Face habits: src_lang / tgt_lang, "translation_<src>_to_<tgt>" tasks, no trust_remote_code in-process,
# pipeline_class=.
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def paired_folder(tmp_path_factory, tiny_folder, tiny_tokenizer):
    """The tiny saved model (same weights) with its config recording en → es, as `deepnmt train` records it."""
    folder = tmp_path_factory.mktemp("paired_model")
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_folder)
    record_language_pair(model.config, "en", "es")
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


def test_the_pair_travels_in_config_json(paired_folder):
    config = json.loads((paired_folder / "config.json").read_text())
    assert config["task_specific_params"] == {"translation_en_to_es": {}}
    assert config["custom_pipelines"]["translation"]["impl"] == "pipeline_translation.TranslationPipeline"
    assert recorded_language_pairs(AutoModelForSeq2SeqLM.from_pretrained(paired_folder).config) == [("en", "es")]


@pytest.fixture(scope="module")
def paired(paired_folder):
    """The model and tokenizer of `paired_folder`, for pipelines built from objects (no folder, no config lookup)."""
    return AutoModelForSeq2SeqLM.from_pretrained(paired_folder).eval(), AutoTokenizer.from_pretrained(paired_folder)


def test_matching_src_lang_and_tgt_lang_are_accepted_and_change_nothing(paired):
    model, tokenizer = paired
    expected = [{"translation_text": _direct(model, tokenizer, SENTENCES[0], num_beams=2, max_new_tokens=6)}]
    translate = pipeline("translation", model=model, tokenizer=tokenizer, num_beams=2, max_new_tokens=6)
    assert translate(SENTENCES[0], src_lang="en", tgt_lang="es") == expected
    assert translate(SENTENCES[0], src_lang="EN") == translate(SENTENCES[0], tgt_lang="es") == expected
    at_construction = pipeline("translation", model=model, tokenizer=tokenizer, src_lang="en", tgt_lang="es",
                               num_beams=2, max_new_tokens=6)
    assert at_construction(SENTENCES[0]) == expected


@pytest.mark.parametrize("argument, value", [("src_lang", "fr"), ("tgt_lang", "de"), ("tgt_lang", "en")])
def test_another_language_raises_naming_the_argument_and_the_models_pair(paired, argument, value):
    model, tokenizer = paired
    translate = pipeline("translation", model=model, tokenizer=tokenizer, max_new_tokens=3)
    with pytest.raises(ValueError) as error:
        translate(SENTENCES[0], **{argument: value})
    assert str(error.value) == (
        f"TranslationPipeline: `{argument}` = '{value}' is not allowed; this model translates en → es (the pair "
        "recorded in its config's task_specific_params)."
    )
    with pytest.raises(ValueError, match=f"`{argument}` = '{value}' is not allowed; this model translates en → es"):
        pipeline("translation", model=model, tokenizer=tokenizer, **{argument: value})


def test_a_language_that_is_not_a_string_is_refused(paired):
    model, tokenizer = paired
    translate = pipeline("translation", model=model, tokenizer=tokenizer, max_new_tokens=3)
    with pytest.raises(ValueError, match=r"`src_lang` = 3 \(int\) is not allowed; pass a language code"):
        translate(SENTENCES[0], src_lang=3)


def test_a_model_without_a_recorded_pair_accepts_any_language(loaded):
    """Nothing to check against: the languages are accepted and ignored."""
    model, tokenizer = loaded
    assert recorded_language_pairs(model.config) == []
    translate = pipeline("translation", model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=4)
    assert translate(SENTENCES[0], src_lang="fr", tgt_lang="de") == translate(SENTENCES[0])
    by_task = pipeline("translation_fr_to_de", model=model, tokenizer=tokenizer, num_beams=1, max_new_tokens=4)
    assert isinstance(by_task, TranslationPipeline) and by_task(SENTENCES[0]) == translate(SENTENCES[0])


def test_translation_src_to_tgt_task_resolves_to_the_pipeline(paired_folder):
    translate = pipeline("translation_en_to_es", model=str(paired_folder), num_beams=2, max_new_tokens=6)
    assert type(translate) is TranslationPipeline and translate.task == "translation_en_to_es"
    plain = pipeline("translation", model=str(paired_folder), num_beams=2, max_new_tokens=6)
    assert translate(SENTENCES) == plain(SENTENCES)
    assert isinstance(pipeline("translation_EN_to_ES", model=str(paired_folder)), TranslationPipeline)


def test_a_task_for_another_pair_raises(paired):
    model, tokenizer = paired
    with pytest.raises(ValueError) as error:
        pipeline("translation_es_to_en", model=model, tokenizer=tokenizer)
    assert str(error.value) == (
        "TranslationPipeline: `task` = 'translation_es_to_en' is not allowed; this model translates en → es, so use "
        "'translation' or 'translation_en_to_es'."
    )


@pytest.mark.parametrize("family", ["deep_transformer", "dtmt"])
def test_a_saved_folder_needs_no_trust_remote_code_when_hf_deepnmt_is_imported(family, tiny_folder, tiny_tokenizer,
                                                                               tmp_path):
    """Every config class of the package leaves the folder's `custom_pipelines` entry out in-process, so transformers
    takes the registered pipeline instead of demanding remote code; config.json keeps the entry."""
    import hf_deepnmt

    folder = tiny_folder
    if family == "dtmt":
        folder = tmp_path / "dtmt"
        torch.manual_seed(0)
        hf_deepnmt.DTMTForConditionalGeneration(hf_deepnmt.DTMTConfig(
            vocab_size=len(tiny_tokenizer), d_model=16, attention_heads=2, transition_depth=1)).save_pretrained(folder)
        tiny_tokenizer.save_pretrained(folder)
    assert "translation" in json.loads((folder / "config.json").read_text())["custom_pipelines"]
    translate = pipeline("translation", model=str(folder), num_beams=2, max_new_tokens=6)
    assert type(translate) is TranslationPipeline
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert translate(SENTENCES[1]) == [
        {"translation_text": _direct(model, tokenizer, SENTENCES[1], num_beams=2, max_new_tokens=6)}
    ]


def test_pipeline_class_names_the_installed_pipeline(paired_folder):
    translate = pipeline("translation_en_to_es", model=str(paired_folder), pipeline_class=TranslationPipeline,
                         max_new_tokens=4)
    assert type(translate) is TranslationPipeline
    assert translate(SENTENCES[0], src_lang="en") == translate(SENTENCES[0])
    with pytest.raises(ValueError, match="`tgt_lang` = 'fr' is not allowed"):
        translate(SENTENCES[0], tgt_lang="fr")


def test_training_records_the_language_pair(small_corpus, tiny_tokenizer, tmp_path):
    from hf_deepnmt_training.build import build_model as _build_model
    from hf_deepnmt_training.train_arguments import parse_train_args

    model_args, data_args, _, recipe = parse_train_args(
        train_argv(small_corpus, tmp_path / "run", "--source_lang", "en", "--target_lang", "es"))
    model = _build_model(model_args, data_args, recipe["model"], tiny_tokenizer)
    assert model.config.task_specific_params == {"translation_en_to_es": {}}
    assert recorded_language_pairs(model.config) == [("en", "es")]


def test_record_language_pair_replaces_other_pairs_and_keeps_other_tasks(tiny_folder):
    config = AutoModelForSeq2SeqLM.from_pretrained(tiny_folder).config
    config.task_specific_params = {"summarization": {"num_beams": 4}, "translation_en_to_de": {"num_beams": 2},
                                   "translation_en_to_es": {"num_beams": 5}}
    record_language_pair(config, "en", "es")
    assert config.task_specific_params == {"summarization": {"num_beams": 4}, "translation_en_to_es": {"num_beams": 5}}
    record_language_pair(config, "pt_BR", "en")
    assert recorded_language_pairs(config) == [("pt_BR", "en")]
    with pytest.raises(ValueError, match="`target_lang` = 'en_to_es' is not allowed"):
        record_language_pair(config, "pt", "en_to_es")


REMOTE_LANGUAGES = BLOCK_OUR_PACKAGES + textwrap.dedent(
    """
    from transformers import pipeline

    folder, text = sys.argv[1], sys.argv[2]
    translate = pipeline("translation", model=folder, trust_remote_code=True, max_new_tokens=4)
    assert type(translate).__module__.startswith("transformers_modules."), type(translate).__module__
    assert translate(text, src_lang="en", tgt_lang="es") == translate(text)
    try:
        translate(text, tgt_lang="fr")
    except ValueError as error:
        print(error)
    """
)


@pytest.mark.integration
def test_remote_code_checks_the_languages_where_hf_deepnmt_is_not_importable(paired_folder, tmp_path):
    script = tmp_path / "remote_languages.py"
    script.write_text(REMOTE_LANGUAGES)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-I", str(script), str(paired_folder), SENTENCES[0]],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == (
        "TranslationPipeline: `tgt_lang` = 'fr' is not allowed; this model translates en → es (the pair recorded in "
        "its config's task_specific_params)."
    )


# --------------------------------------------------------------------------------------------------------------
# Inference Endpoints: handler.py (and ort_generation.py) in every saved folder; an ONNX export in `onnx/` is used.
# --------------------------------------------------------------------------------------------------------------
ENDPOINT_REQUESTS = [
    {"inputs": SENTENCES[0], "parameters": {"num_beams": 3, "max_new_tokens": 8}},
    {"inputs": [SENTENCES[0], "", SENTENCES[1]], "parameters": {"num_beams": 3, "max_new_tokens": 8}},
    {"inputs": SENTENCES[2], "parameters": {"num_beams": 4, "num_return_sequences": 2, "max_new_tokens": 6}},
    {"inputs": SENTENCES[1]},  # the folder's generation defaults
]
ENDPOINT_BAD_REQUESTS = [
    {"inputs": 3}, {"text": "x"}, {"inputs": "x", "parameters": [4]}, "x", {"inputs": []},
    {"inputs": "x", "parameters": {"num_beams": 0}}, {"inputs": "x", "parameters": {"tgt_lang": 3}},
]

ENDPOINT_PROCESS = BLOCK_OUR_PACKAGES + textwrap.dedent(
    """
    import json

    try:
        import hf_deepnmt  # noqa: F401
        raise SystemExit("hf_deepnmt was importable")
    except ImportError:
        pass
    requests, bad_requests = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    for folder in sys.argv[3:]:
        sys.path.insert(0, folder)  # as Inference Endpoints import the repository's handler.py
        sys.modules.pop("handler", None)
        from handler import EndpointHandler

        handler = EndpointHandler(folder)
        errors = []
        for bad in bad_requests:
            try:
                handler(bad)
            except ValueError as error:
                errors.append(str(error))
        print(json.dumps({"engine": handler.engine, "pipeline_module": type(handler.pipeline).__module__,
                          "model_class": type(handler.pipeline.model).__name__,
                          "outputs": [handler(request) for request in ENDPOINT_REQUESTS], "errors": errors}))
        sys.path.remove(folder)
    """
).replace("ENDPOINT_REQUESTS", "requests")


def _generated(model, tokenizer, text: str, **generate_kwargs) -> list[str]:
    """Every returned sequence of the torch model's `generate`, decoded; without a length of the request's own, with
    the text's new-token budget (`new_token_budget`), as the pipeline decodes."""
    from hf_deepnmt.pipeline_translation import new_token_budget

    inputs = tokenizer(text, return_tensors="pt")
    if not {"max_new_tokens", "max_length"} & generate_kwargs.keys():
        generate_kwargs["max_new_tokens"] = new_token_budget(inputs["input_ids"].shape[-1],
                                                             model.config.max_position_embeddings)
    with torch.no_grad():
        ids = model.generate(**inputs, **generate_kwargs)
    return tokenizer.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.integration
@pytest.mark.parametrize("family", ["deep_transformer", "dtmt"])
def test_every_saved_folder_is_an_inference_endpoint_without_hf_deepnmt(family, tiny_tokenizer, tmp_path):
    """handler.py imported from a saved folder in a process without hf_deepnmt, as the endpoint does: torch when the
    folder has no export, ONNX Runtime when `onnx/` holds one; both answer like the torch model's `generate` and
    refuse bad requests with the same one-line sentences."""
    import shutil

    import hf_deepnmt
    from hf_deepnmt.export import export_model
    from conftest import tiny_model

    if family == "dtmt":
        torch.manual_seed(0)
        model = hf_deepnmt.DTMTForConditionalGeneration(hf_deepnmt.DTMTConfig(
            vocab_size=len(tiny_tokenizer), d_model=16, attention_heads=2, transition_depth=1)).eval()
    else:
        model = tiny_model(vocab_size=len(tiny_tokenizer))
    torch_folder, onnx_folder = tmp_path / f"{family}_torch", tmp_path / f"{family}_onnx"
    model.save_pretrained(torch_folder)
    tiny_tokenizer.save_pretrained(torch_folder)
    for name in ("handler.py", "ort_generation.py"):
        assert (torch_folder / name).read_text() == (Path(hf_deepnmt.__file__).parent / name).read_text()
    expected = []
    for request in ENDPOINT_REQUESTS:
        texts = [request["inputs"]] if isinstance(request["inputs"], str) else request["inputs"]
        parameters = request.get("parameters", {})
        per_text = [[{"translation_text": translation}
                     for translation in (_generated(model, tiny_tokenizer, text, **parameters) if text else [""])]
                    for text in texts]
        if isinstance(request["inputs"], str):
            expected.append(per_text[0])
        else:
            expected.append([candidates[0] for candidates in per_text])
    shutil.copytree(torch_folder, onnx_folder)
    export_model(model, tiny_tokenizer, onnx_folder / "onnx", "onnx")

    script = tmp_path / "endpoint.py"
    script.write_text(ENDPOINT_PROCESS)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": "",
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-I", str(script), json.dumps(ENDPOINT_REQUESTS),
                             json.dumps(ENDPOINT_BAD_REQUESTS), str(torch_folder), str(onnx_folder)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    noise = [line for line in result.stderr.replace("\r", "\n").splitlines()
             if line.strip() and not line.lstrip().startswith("Loading weights")]
    assert noise == [] and "Do you wish to run the custom code" not in result.stdout, noise
    by_torch, by_onnx = (json.loads(line) for line in result.stdout.strip().splitlines()[-2:])
    assert (by_torch["engine"], by_onnx["engine"]) == ("torch", "onnx")
    assert by_onnx["model_class"] == "OnnxSeq2SeqLM" and by_torch["model_class"] != "OnnxSeq2SeqLM"
    assert all(report["pipeline_module"].startswith("transformers_modules.") for report in (by_torch, by_onnx))
    assert by_torch["outputs"] == by_onnx["outputs"] == expected
    assert expected[0][0]["translation_text"] != "" and len(expected[2]) == 2
    errors = by_torch["errors"]
    assert by_onnx["errors"] == errors
    assert len(errors) == len(ENDPOINT_BAD_REQUESTS) and all(len(error.splitlines()) == 1 for error in errors)
    assert "`inputs` = 3 is not allowed" in errors[0]
    assert "fields ['text']" in errors[1] and "`parameters` = [4]" in errors[2]
    assert "request body is str" in errors[3] and "non-empty list" in errors[4]
    assert errors[5] == "generate: `num_beams` = 0 is not allowed; it must be an integer ≥ 1."
    assert errors[6] == ("TranslationPipeline: `tgt_lang` = 3 (int) is not allowed; pass a language code such as "
                         "'en'.")


def test_an_onnx_export_without_onnx_runtime_asks_for_a_requirements_file(tmp_path, monkeypatch):
    import importlib.util

    from hf_deepnmt.handler import EndpointHandler

    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "deepnmt_export.json").write_text("{}")
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "onnxruntime" else find_spec(name, *args))
    with pytest.raises(ImportError) as error:
        EndpointHandler(str(tmp_path))
    assert str(error.value) == (
        f"{tmp_path / 'onnx'} holds an ONNX export, which needs ONNX Runtime: put a requirements.txt with the line "
        f"`onnxruntime` next to handler.py (Inference Endpoints install it), or remove {tmp_path / 'onnx'} to serve "
        "the torch weights.")
