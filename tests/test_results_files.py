"""The committed results files are what their renderers make of the committed measurements, and a re-run of the
benchmarks replaces only the measured blocks of benchmarks/RESULTS.md, never the hand-written text around them.

Every markdown of benchmarks/experiments/results is its script's rendering of a committed JSON, byte for byte; the
hand-written li2022-cpu-scale.md holds its tables in generated blocks rendered from its JSONs, and its narrative
quotes only numbers those tables show (or that it takes, recomputed here, from a named source)."""

from __future__ import annotations

import copy
import importlib
import json
import math
import re
import shutil
from pathlib import Path
from typing import Literal, NamedTuple

import pytest
import yaml

from benchmarks import report
from benchmarks.experiments import li2022_regime
from benchmarks.experiments.common import merge_generated

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_results_md_is_its_json_rendered_into_the_hand_written_text():
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    assert report.merge_blocks(text, report.render_blocks(results)) == text
    assert "<!-- generated:engines -->" in text and "What these measurements say" in text


def test_a_rerun_replaces_the_measured_blocks_and_keeps_the_narrative():
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    rerun = copy.deepcopy(results)
    rerun["command"] = "python -m benchmarks.run --sections compile --merge  # a later run"
    rerun["compile"]["median_s"]["compiled"] *= 0.5
    merged = report.merge_blocks(text, report.render_blocks(rerun))
    assert "a later run" in merged and merged != text
    outside = lambda markdown: [line for line in _outside_blocks(markdown)]  # noqa: E731
    assert outside(merged) == outside(text)  # not one hand-written line changed


def test_a_fresh_results_file_gets_every_block_once():
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    fresh = report.merge_blocks(report.TITLE + "\n", report.render_blocks(results))
    for name, _ in report.render_blocks(results):
        assert fresh.count(f"<!-- generated:{name} -->") == 1 and fresh.count(f"<!-- /generated:{name} -->") == 1


def _outside_blocks(markdown: str) -> list[str]:
    kept, inside = [], False
    for line in markdown.splitlines():
        if line.startswith("<!-- generated:"):
            inside = True
        elif line.startswith("<!-- /generated:"):
            inside = False
        elif not inside:
            kept.append(line)
    return kept


def test_the_data_scale_block_is_its_json_rendered():
    from benchmarks import data_scale

    results = json.loads((ROOT / "benchmarks" / "data_scale.json").read_text())
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    assert "<!-- generated:data_scale -->" in text
    assert report.merge_blocks(text, [("data_scale", data_scale.render(results))]) == text


# --- benchmarks/experiments/results: every markdown is what its script renders from the committed JSON -----------

RESULTS = ROOT / "benchmarks" / "experiments" / "results"


class Renderer(NamedTuple):
    """How one results markdown is made: ``benchmarks.experiments.<module>.<function>`` renders ``json``; it takes the
    markdown's path (``takes="markdown"``) or the results folder (``takes="folder"``), and reads the committed files
    of ``inputs`` from that folder too."""

    module: str
    function: str
    json: str
    takes: Literal["markdown", "folder"]
    inputs: tuple[str, ...] = ()


RENDERED: dict[str, Renderer] = {
    "admin_miniature.md": Renderer("admin_miniature", "write_markdown", "admin_miniature.json", "markdown"),
    "bf16_cpu.md": Renderer("bf16_cpu", "render", "bf16_cpu.json", "folder"),
    "continuous_batching.md": Renderer("continuous_batching", "render", "continuous_batching.json", "folder"),
    "defaults_budget.md": Renderer("defaults_budget", "render", "defaults_budget.json", "folder"),
    "distill_bible.md": Renderer("distill_bible", "write_markdown", "distill_bible.json", "markdown"),
    "distill_bible_2800steps.md": Renderer("distill_bible", "write_markdown", "distill_bible_2800steps.json",
                                           "markdown"),
    "distill_bible_teachers2800_2800steps.md": Renderer("distill_bible", "write_markdown",
                                                        "distill_bible_teachers2800_2800steps.json", "markdown"),
    "distill_bible_teachers2800_8400steps_dropout0.1.md": Renderer(
        "distill_bible", "write_markdown", "distill_bible_teachers2800_8400steps_dropout0.1.json", "markdown"),
    "distill_bible_teachers2800_8400steps_dropout0.1_keep.md": Renderer(
        "distill_bible", "write_markdown", "distill_bible_teachers2800_8400steps_dropout0.1_keep.json", "markdown"),
    "distill_bible_teachers7000-dropout0.1-warmup400_7000steps_dropout0.1.md": Renderer(
        "distill_bible", "write_markdown", "distill_bible_teachers7000-dropout0.1-warmup400_7000steps_dropout0.1.json",
        "markdown"),
    "distill_bible_teachers7000-dropout0.1-warmup400_14000steps_dropout0.1.md": Renderer(
        "distill_bible", "write_markdown",
        "distill_bible_teachers7000-dropout0.1-warmup400_14000steps_dropout0.1.json", "markdown"),
    "distill_bible_teachers7000-dropout0.1-warmup400_14000steps_dropout0.1_keep.md": Renderer(
        "distill_bible", "write_markdown",
        "distill_bible_teachers7000-dropout0.1-warmup400_14000steps_dropout0.1_keep.json", "markdown"),
    "dou2018_miniature.md": Renderer("dou2018_miniature", "write_markdown", "dou2018_miniature.json", "markdown",
                                     inputs=("dou2018_miniature_base2.json",)),
    "dou2018_postln_d64.md": Renderer("dou2018_postln", "write_markdown", "dou2018_postln_d64.json", "markdown"),
    "dtmt_miniature.md": Renderer("dtmt_miniature", "write_markdown", "dtmt_miniature.json", "markdown"),
    "li2022_cad_crt_cost.md": Renderer("li2022_regime", "write_markdown", "li2022_cad_crt_cost.json", "markdown"),
    "li2022_miniature.md": Renderer("li2022_miniature", "write_markdown", "li2022_miniature.json", "markdown"),
    "li2022_regime_step1.md": Renderer("li2022_regime", "write_markdown", "li2022_regime_step1.json", "markdown"),
    "public_checkpoint_study.md": Renderer("public_checkpoint_study", "render", "public_checkpoint_study.json",
                                           "folder"),
    "quickstart_probes.md": Renderer("quickstart_probes", "render", "quickstart_probes.json", "folder"),
    "retiring_search.md": Renderer("retiring_search", "render", "retiring_search.json", "folder"),
    "train_defaults.md": Renderer("train_defaults", "render", "train_defaults.json", "folder"),
}
# Hand-written reports whose tables are generated blocks (checked below, not rendered whole).
WITH_GENERATED_BLOCKS = {"li2022-cpu-scale.md"}


def test_every_results_markdown_has_a_renderer():
    markdown = {path.name for path in RESULTS.glob("*.md")}
    assert markdown == set(RENDERED) | WITH_GENERATED_BLOCKS, "a results markdown without a renderer in RENDERED"
    for renderer in RENDERED.values():
        assert all((RESULTS / name).exists() for name in (renderer.json, *renderer.inputs))


@pytest.mark.parametrize("markdown", sorted(RENDERED))
def test_results_markdown_is_its_json_rendered(markdown, tmp_path):
    """Re-render into a temporary folder (the committed files stay untouched) and compare byte for byte."""
    renderer = RENDERED[markdown]
    for name in renderer.inputs:
        shutil.copy(RESULTS / name, tmp_path / name)
    render = getattr(importlib.import_module(f"benchmarks.experiments.{renderer.module}"), renderer.function)
    render(json.loads((RESULTS / renderer.json).read_text()), tmp_path / markdown if renderer.takes == "markdown"
           else tmp_path)
    assert (tmp_path / markdown).read_bytes() == (RESULTS / markdown).read_bytes(), (
        f"{markdown} is not what its script renders from {renderer.json}: re-render it "
        f"(python -m benchmarks.experiments.{renderer.module} --render_only …)")


# --- li2022-cpu-scale.md: tables generated from its JSONs, narrative quoting only their numbers --------------------

LI2022_REPORT = RESULTS / "li2022-cpu-scale.md"
# A decimal number standing alone: not part of a name (li2022), a file (step1.json) or a unit-suffixed figure (4.5M).
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.]*\w)")


def _li2022_blocks() -> list[tuple[str, str]]:
    reports = {step: json.loads((RESULTS / f"{name}.json").read_text())
               for step, name in li2022_regime.CPU_SCALE_RESULTS.items()}
    return li2022_regime.cpu_scale_blocks(**reports)


def _quoted_elsewhere() -> dict[str, str]:
    """The numbers the report's narrative takes from outside its tables, each recomputed from its source: printed the
    way the report prints it, the key must come back."""
    recipe = yaml.safe_load((ROOT / "training" / "recipes" / "miniature.yaml").read_text())  # the runs' recipe
    miniature = json.loads((RESULTS / "li2022_miniature.json").read_text())
    benchmark = json.loads((ROOT / "benchmarks" / "results.json").read_text())["crt_cost"]["variants"]["DEEP+CAD+CRT"]
    paper = "DEEP 15-15 at 0.55 BLEU" in (ROOT / "docs" / "li2022.md").read_text(encoding="utf-8")
    return {
        "0.55": "0.55" if paper else "docs/li2022.md no longer quotes li2022 Table 1",  # the paper's collapsed DEEP
        "0.1": str(recipe["model"]["label_smoothing"]),
        "0.693": f"{math.log(2):.3f}",  # ALD's loss at chance
        "8.29": f"{math.log(recipe['training']['vocab_size']):.2f}",  # the loss of a uniform prediction
        "7.4": str(miniature["runs"]["deep"]["minutes"]),  # the li2022 miniature's 6-12 row on one CPU thread
        "3.66": f"{benchmark['ratio_vs_deep']:.2f}",  # benchmarks/RESULTS.md, crt_cost
        "1.0": str(benchmark["overrides"]["cross_attention_drop_ratio"]),  # that benchmark's p_net
    }


def _unbacked_numbers(text: str, blocks: list[tuple[str, str]]) -> set[str]:
    """Decimal numbers of the narrative (``text`` outside its generated blocks) that no table shows and that are not
    quoted from elsewhere."""
    shown = {number for _, body in blocks for number in DECIMAL.findall(body)}
    narrative = "\n".join(_outside_blocks(text))
    return set(DECIMAL.findall(narrative)) - shown - set(_quoted_elsewhere())


def test_li2022_report_tables_are_its_jsons_rendered():
    text = LI2022_REPORT.read_text(encoding="utf-8")
    blocks = _li2022_blocks()
    for name, _ in blocks:
        assert text.count(f"<!-- generated:{name} -->") == 1 and text.count(f"<!-- /generated:{name} -->") == 1
    assert merge_generated(text, blocks) == text, (
        "li2022-cpu-scale.md's tables differ from its JSONs: python -m benchmarks.experiments.li2022_regime "
        "--render_report")


def test_li2022_report_narrative_quotes_only_numbers_its_tables_show():
    assert _unbacked_numbers(LI2022_REPORT.read_text(encoding="utf-8"), _li2022_blocks()) == set()
    for number, recomputed in _quoted_elsewhere().items():
        assert recomputed == number, f"li2022-cpu-scale.md quotes {number}; its source now says {recomputed}"


def test_li2022_report_checks_catch_a_number_not_in_the_jsons():
    text = LI2022_REPORT.read_text(encoding="utf-8")
    blocks = _li2022_blocks()
    in_a_table = text.replace("| 11.39 |", "| 12.14 |", 1)
    assert in_a_table != text and merge_generated(in_a_table, blocks) != in_a_table
    in_the_narrative = text.replace("validation BLEU 11.39", "test BLEU 12.14", 1)
    assert in_the_narrative != text and _unbacked_numbers(in_the_narrative, blocks) == {"12.14"}


def test_the_budget_study_sets_a_defaults_run_from_before_the_dropout_rule_aside(tmp_path):
    """A `defaults` run whose log has no dropout-rule line is the old defaults (the `dropout0.0` row): its folder and
    log are renamed so that the study trains today's defaults instead of recording it; a run with the line stays."""
    from benchmarks.experiments.defaults_budget import set_aside_before_rule

    old, new = "10000-10min-defaults", "20000-10min-defaults"
    for name, log in ((old, "[deepnmt]   model: … dropout 0.0 …\n"),
                      (new, "[deepnmt]   dropout 0.1: the run is a 10-minute budget at 0.455 s a step (…): ≈ 1,318 "
                            "steps = 7.4 passes over the training data (178 steps each); …\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text("{}")
        (tmp_path / f"{name}.log").write_text(log)
    assert set_aside_before_rule(tmp_path, old) and not set_aside_before_rule(tmp_path, new)
    assert not (tmp_path / old).exists() and (tmp_path / f"{old}-before-rule" / "metrics.json").is_file()
    assert (tmp_path / f"{old}-before-rule.log").is_file() and (tmp_path / new / "metrics.json").is_file()
    assert not set_aside_before_rule(tmp_path, old)  # nothing left to set aside
    unfinished = "29024-10min-defaults"  # killed before it printed its dropout: trained again whole, not set aside
    (tmp_path / unfinished).mkdir()
    (tmp_path / f"{unfinished}.log").write_text("[deepnmt] training a joint BPE …\n")
    assert not set_aside_before_rule(tmp_path, unfinished) and (tmp_path / unfinished).is_dir()


def test_the_budget_study_keeps_the_defaults_of_before_the_warm_up_change_as_their_own_row(tmp_path):
    """Since the warm-up study the defaults choose 400 steps: a finished `defaults` run whose log shows the defaults
    choosing 200 is set aside (folder and log renamed) and recorded as the `warmup200` row, and the cell's
    `warmup400` run (the same command the defaults resolve to now) stands for the defaults; a run of today's
    defaults (warm-up 400 in its log) stays what it is."""
    from benchmarks.experiments.defaults_budget import migrate, set_aside_before_rule, warmup_of

    rule = ("[deepnmt]   dropout 0.1: the run is a 30-minute budget at 0.447 s a step (…): ≈ 4,024 steps = 22.6 passes "
            "over the training data (178 steps each); …\n")
    for name, warmup in (("10000-30min-defaults", 200), ("20000-30min-defaults", 400)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text("{}")
        (tmp_path / f"{name}.log").write_text(f"[deepnmt]   --warmup_steps {warmup}\n{rule}")
    assert set_aside_before_rule(tmp_path, "10000-30min-defaults")
    assert (tmp_path / "10000-30min-defaults-warmup200" / "metrics.json").is_file()
    assert not set_aside_before_rule(tmp_path, "20000-30min-defaults")
    assert warmup_of(["--warmup_steps", "400"], "") == 400 and warmup_of([], "[deepnmt]   --max_tokens 2048\n") is None

    def run(row: str, bleu: float, **extra) -> dict:
        return {"size": "10000", "budget_minutes": 30.0, "row": row, "test": {"bleu": bleu}, "rule": {"dropout": 0.1},
                **extra}

    report = migrate({"runs": {"10000-30min-defaults": run("defaults", 12.19),
                               "10000-30min-warmup400": run("warmup400", 12.13, warmup_steps=400),
                               "20000-30min-defaults": {**run("defaults", 15.0, warmup_steps=400), "size": "20000"}}})
    runs = report["runs"]
    assert runs["10000-30min-warmup200"]["test"]["bleu"] == 12.19 and runs["10000-30min-warmup200"]["ran_as"]
    # the Transformer defaults of that time are the `transformer` row since issue 63 made DTMT#1 the defaults
    assert runs["10000-30min-transformer"]["test"]["bleu"] == 12.13
    assert "warmup400" in runs["10000-30min-transformer"]["ran_as"] and "10000-30min-defaults" not in runs
    assert runs["20000-30min-transformer"]["test"]["bleu"] == 15.0
    assert "warmup400" not in runs["20000-30min-transformer"]["ran_as"]
    assert migrate(json.loads(json.dumps(report))) == report  # once: the copied defaults are not the old ones
    assert "20000-30min-warmup200" not in runs
