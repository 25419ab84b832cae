"""The committed results files are what their renderers make of the committed measurements, and a re-run of the
benchmarks replaces only the measured blocks of benchmarks/RESULTS.md, never the hand-written text around them."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from benchmarks import report

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
