"""Model cards state only what is true (issue 35 item 6): a license only when the user gives one, a model-index and a
`datasets` field only with Hub dataset ids, links to the run's plots, and the run time the command printed."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import time

import pytest
from conftest import train_argv
from huggingface_hub import ModelCard

from hf_deepnmt.errors import UserInputError
from hf_deepnmt_model_cards import EvalRow, hub_dataset_id, render_model_card
from hf_deepnmt_model_cards.licenses import HUB_LICENSES, license_problem
from hf_deepnmt_training.cli import main
from hf_deepnmt_training.hub import card_for_repo, push_folder

ROW = EvalRow("test[:10]", 10, 12.5, 40.1, 70.2, "beam 4", {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a"})


@pytest.fixture
def folder(tiny_folder, tmp_path):
    """A copy of the tiny saved model, to add plots and card files to."""
    copy = tmp_path / "model"
    shutil.copytree(tiny_folder, copy)
    return copy


def front_matter(card: ModelCard) -> str:
    return str(card).split("\n---\n", 1)[0]


# ---------------------------------------------------------------------------------------------------------- license
def test_a_card_names_no_license_unless_one_is_given(folder):
    card = render_model_card(folder, "en", "es", results=[ROW])
    assert card.data.license is None and "license:" not in front_matter(card)
    section = str(card).split("## License", 1)[1].split("\n## ", 1)[0]
    assert "Unknown: no license was given" in section and "--license ID" in section
    given = render_model_card(folder, "en", "es", results=[ROW], license="GPL-3.0")  # the Hub's spelling is lower case
    assert given.data.license == "gpl-3.0" and "license: gpl-3.0" in front_matter(given)
    assert "released under the license `gpl-3.0`" in str(given) and "Unknown" not in str(given)


@pytest.mark.parametrize("value, words", [
    ("apache", "`license` = 'apache' is not a Hub license id; use one of the ids listed at"),
    ("Apache License 2.0", "`license` = 'Apache License 2.0' is not a Hub license id"),
    ("other", "`license` = 'other' is not allowed: the Hub then needs a license name, a link and a LICENSE file"),
])
def test_a_license_that_is_not_a_hub_id_is_refused_in_one_sentence(folder, value, words):
    with pytest.raises(UserInputError, match=re.escape(words)):
        render_model_card(folder, "en", "es", license=value)
    assert license_problem("cc-by-nc-sa-4.0") is None and license_problem(None) is None
    assert {"apache-2.0", "mit", "gpl-3.0", "cc-by-4.0", "unknown"} <= set(HUB_LICENSES)


def test_train_and_push_refuse_a_bad_license_before_anything_runs(small_corpus, folder, tmp_path, capsys):
    assert main(["train", *train_argv(small_corpus, tmp_path / "run"), "--license", "apache2"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert error == ["deepnmt train: `--license` = 'apache2' is not a Hub license id; use one of the ids listed at "
                     "https://huggingface.co/docs/hub/repositories-licenses (e.g. apache-2.0, mit, cc-by-4.0, "
                     "cc-by-sa-4.0, gpl-3.0), or leave it out: the card then says the license is unknown."]
    assert not (tmp_path / "run").exists()
    assert main(["quickstart", "--output_dir", str(tmp_path / "qs"), "--license", "Apache 2"]) == 2  # passed to train
    assert "`--license` = 'Apache 2' is not a Hub license id" in capsys.readouterr().err
    assert not (tmp_path / "qs").exists()
    (folder / "README.md").write_text("---\nlanguage: en\n---\nA card.\n")
    assert main(["push", str(folder), "--repo_id", "someone/x", "--license", "bsd-4", "--dry_run"]) == 2
    assert "`--license` = 'bsd-4' is not a Hub license id" in capsys.readouterr().err


def test_train_takes_the_license_the_user_gives():
    from hf_deepnmt_training.train_arguments import ModelArguments, parse_train_args

    assert ModelArguments.__dataclass_fields__["license"].default is None
    model_args = parse_train_args(["--recipe", "quickstart", "--output_dir", "unused", "--license", "CC-BY-4.0"])[0]
    assert model_args.license == "cc-by-4.0"


class RecordingHub:
    def __init__(self):
        self.operations = []

    def create_repo(self, **kwargs):
        pass

    def create_commit(self, **kwargs):
        self.operations = kwargs["operations"]


def test_push_sets_the_license_the_user_gives(folder, capsys):
    """`deepnmt push --license`: the uploaded card (and deepnmt_card.json) state it; a card the user wrote gets it in
    its front matter; without one anywhere, push says the card states none."""
    for name in ("README.md", "tokenizer_config.json"):
        (folder / name).touch()
    (folder / "deepnmt_card.json").write_text(json.dumps({"source_lang": "en", "target_lang": "es",
                                                          "license": None}))
    hub = RecordingHub()
    push_folder(folder, "someone/en-es", api=hub, license="MIT")
    uploaded = {op.path_in_repo: op.path_or_fileobj for op in hub.operations}
    assert ModelCard(uploaded["README.md"].decode()).data.license == "mit"
    assert json.loads(uploaded["deepnmt_card.json"])["license"] == "mit"
    assert json.loads((folder / "deepnmt_card.json").read_text())["license"] is None  # the local folder is unchanged
    assert ModelCard(card_for_repo(folder, "someone/en-es").decode()).data.license is None
    assert main(["push", str(folder), "--repo_id", "someone/en-es", "--dry_run"]) == 0
    assert "the card states no license" in capsys.readouterr().err
    (folder / "deepnmt_card.json").unlink()
    (folder / "README.md").write_text("---\nlanguage: en\n---\nA card the user wrote.\n")
    card = ModelCard(card_for_repo(folder, "someone/en-es", license="apache-2.0").decode())
    assert card.data.license == "apache-2.0" and "A card the user wrote." in card.text


# --------------------------------------------------------------------------------------------------------- datasets
def test_the_model_index_and_datasets_hold_hub_dataset_ids_only(folder, tmp_path):
    """Scored on a local file: the results are in the text, with no model-index (its dataset.type must be a Hub id,
    and huggingface_hub cannot read one without it); trained on local files: no `datasets` field."""
    local = tmp_path / "data" / "train.jsonl"
    local.parent.mkdir()
    local.write_text("{}\n")
    card = render_model_card(folder, "en", "es", results=[ROW], dataset_name="train.jsonl", dataset_id=str(local),
                             eval_dataset_name="test.jsonl")
    assert card.data.eval_results is None and card.data.datasets is None
    assert "model-index" not in front_matter(card) and str(local) not in front_matter(card)
    assert "Scored on test.jsonl:" in card.text and "| test[:10] | 10 | 12.5 | 40.1 | 70.2 | beam 4 |" in card.text
    assert ModelCard(str(card)).data.eval_results is None  # the card loads back
    hub = render_model_card(folder, "en", "es", results=[ROW], dataset_name="WMT14 de-en", dataset_id="wmt/wmt14")
    result = ModelCard(str(hub)).data.eval_results[0]
    assert (result.dataset_type, result.dataset_name, result.dataset_split) == ("wmt/wmt14", "WMT14 de-en", "test[:10]")
    assert hub.data.datasets == ["wmt/wmt14"]
    assert hub_dataset_id("data/train/x.jsonl") is None and hub_dataset_id(str(local)) is None
    assert hub_dataset_id("test.jsonl") is None and hub_dataset_id("wmt14") == "wmt14"  # a file name is no Hub id


# ------------------------------------------------------------------------------------------------------------ plots
def test_the_card_links_the_plots_of_its_folder(folder):
    (folder / "loss_components.png").write_bytes(b"\x89PNG")
    text = str(render_model_card(folder, "en", "es"))
    assert "[loss_components.png](loss_components.png)" in text and "](loss_components.png)" in text.split("## License")[0]
    assert "validation.png" not in text  # not in the folder: not linked
    (folder / "validation.png").write_bytes(b"\x89PNG")
    assert "[validation.png](validation.png)" in str(render_model_card(folder, "en", "es"))


# --------------------------------------------------------------------------------------------------------- run time
class JumpingTime:
    """The `time` module as the command's modules see it, with a `time()` that moves 45 s at every reading: the card
    and the printed line agree only if they state one reading."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        self.now += 45.0
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def jumping_clock(monkeypatch):
    fake = JumpingTime()
    for name in ("hf_deepnmt_training.cli", "hf_deepnmt_training.train", "hf_deepnmt_training.quickstart", "hf_deepnmt_training.report", "hf_deepnmt_training.clock"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        monkeypatch.setattr(module, "time", fake, raising=False)
    return fake


def stated_minutes(card_text: str, printed: str, command: str) -> tuple[str, list[str]]:
    """The card's "X min in all" and every "<command> finished in X min" the command printed."""
    in_all = re.search(r"- wall time: [\d.]+ min training, ([\d.]+) min in all", card_text)
    assert in_all, card_text
    return in_all.group(1), re.findall(rf"{command} finished in ([\d.]+) min", printed)


@pytest.mark.integration
def test_a_trained_runs_card_states_what_the_command_printed(small_corpus, tmp_path, capsys, jumping_clock):
    """`deepnmt train` on local files: the run time in the card is the one printed (however the clock moves between
    readings), no license field, no model-index or `datasets` (local data), both plots linked and present."""
    run = tmp_path / "run"
    assert main(["train", *train_argv(small_corpus, run), "--max_steps", "4", "--eval_strategy", "steps",
                 "--eval_steps", "2", "--predict_with_generate", "true", "--generation_max_length", "12",
                 "--max_eval_samples", "6", "--max_predict_samples", "6", "--eval_num_beams", "2"]) == 0
    captured = capsys.readouterr()
    text = (run / "README.md").read_text(encoding="utf-8")
    card_minutes, printed = stated_minutes(text, captured.out + captured.err, "train")
    assert printed == [card_minutes], (card_minutes, printed)  # said once, and what the card says
    metrics = json.loads((run / "metrics.json").read_text())
    assert f"{metrics['timings_seconds']['total_seconds'] / 60:.1f}" == card_minutes
    card = ModelCard(text)
    assert card.data.license is None and "Unknown: no license was given" in text
    assert card.data.eval_results is None and card.data.datasets is None and "Scored on test.jsonl:" in text
    for plot in ("loss_components.png", "validation.png"):
        assert (run / plot).is_file() and f"[{plot}]({plot})" in text
    stored = json.loads((run / "deepnmt_card.json").read_text())
    assert stored["license"] is None and stored["plots"] == ["loss_components.png", "validation.png"]


def test_a_converted_model_s_card_names_its_hub_source_as_base_model():
    from hf_deepnmt_model_cards import base_model_of

    assert base_model_of({"converted_from": {"format": "marian", "source": "Helsinki-NLP/opus-mt-en-es"}}) == \
        "Helsinki-NLP/opus-mt-en-es"
    assert base_model_of({"converted_from": {"format": "fairseq", "source": "/data/run/checkpoint_best.pt"}}) is None
    assert base_model_of({}) is None
