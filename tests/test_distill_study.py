"""The distillation study's `--reuse_from` (benchmarks/experiments/distill_bible.py): a longer-student study starts
from another study's teachers and distilled data, and `deepnmt distill` resumes it at the student's training."""

from __future__ import annotations

import argparse
import json

from benchmarks.experiments import distill_bible


def _source_study(root):
    for name in distill_bible.REUSED_RUNS:
        (root / name).mkdir(parents=True)
        (root / name / "marker.txt").write_text(name)
    (root / "entries").mkdir()
    (root / "entries" / "teacher-a.json").write_text('{"exit_code": 0, "wall_minutes": 22.6}\n')
    distilled = root / "distill" / "distilled"
    distilled.mkdir(parents=True)
    (distilled / "translations.txt").write_text("hola\n")
    (distilled / "train.jsonl").write_text('{"translation": {"en": "hi", "es": "hola"}}\n')
    manifest = {"settings": {"teachers": ["/x/teacher-a"], "num_beams": 4, "student_options": ["--seed", "42"]},
                "completed": {"translate": {"seconds": 823.4}, "dataset": {"pairs": 1}, "train": {"steps": 2800},
                              "export": {"onnx": "x"}}}
    (root / "distill" / "distill.json").write_text(json.dumps(manifest))
    return manifest


def test_reuse_from_links_the_teachers_and_starts_the_distillation_at_the_student(tmp_path):
    source, work = tmp_path / "t2800", tmp_path / "t2800_s8400"
    before = _source_study(source)
    args = argparse.Namespace(work_dir=str(work), smoke=False, threads=1, teacher_steps=2800, student_steps=8400,
                              student_dropout=0.1, keep_original_targets=False, reuse_original_student=False)
    argv = dict((name, argv) for name, _, argv in distill_bible.steps(args))["distilled-student"]
    options = distill_bible.student_options(argv)
    assert options == ["--seed", "42", "--max_steps", "8400", "--config_overrides", "dropout=0.1"]
    distill_bible.reuse_runs(args, source, options)
    distill_bible.reuse_runs(args, source, options)  # a second lane: nothing changes
    for name in distill_bible.REUSED_RUNS:
        assert (work / name).is_symlink() and (work / name / "marker.txt").read_text() == name
    assert json.loads((work / "entries" / "teacher-a.json").read_text())["wall_minutes"] == 22.6
    manifest = json.loads((work / "distill" / "distill.json").read_text())
    assert list(manifest["completed"]) == ["translate", "dataset"]  # distill trains and exports the new student
    assert manifest["settings"] == {**before["settings"], "student_options": options, "keep_original_targets": False}
    assert (work / "distill" / "distilled" / "train.jsonl").read_text().startswith('{"translation"')
    assert json.loads((source / "distill" / "distill.json").read_text()) == before  # the source is left alone
    assert not (work / "distill.partial").exists()
    assert distill_bible.results_name(2800, 8400, 0.1) == "distill_bible_teachers2800_8400steps_dropout0.1"
    assert distill_bible.results_name(2800, 2800) == "distill_bible_teachers2800_2800steps"


def test_reuse_from_with_the_original_targets_rebuilds_the_dataset_and_links_the_same_original_student(tmp_path):
    source, work = tmp_path / "d01", tmp_path / "keep"
    _source_study(source)
    (source / "student-original").mkdir()
    (source / "entries" / "original-student.json").write_text('{"exit_code": 0, "wall_minutes": 61.7}\n')
    args = argparse.Namespace(work_dir=str(work), smoke=False, threads=1, teacher_steps=2800, student_steps=8400,
                              student_dropout=0.1, keep_original_targets=True, reuse_original_student=True)
    argv = dict((name, argv) for name, _, argv in distill_bible.steps(args))["distilled-student"]
    assert "--keep_original_targets" in argv
    options = distill_bible.student_options(argv)
    assert options == ["--seed", "42", "--max_steps", "8400", "--config_overrides", "dropout=0.1"]  # distill's own out
    distill_bible.reuse_runs(args, source, options)
    manifest = json.loads((work / "distill" / "distill.json").read_text())
    assert list(manifest["completed"]) == ["translate"] and manifest["settings"]["keep_original_targets"] is True
    assert sorted(path.name for path in (work / "distill" / "distilled").iterdir()) == ["translations.txt"]
    assert (work / "student-original").is_symlink()
    assert json.loads((work / "entries" / "original-student.json").read_text())["wall_minutes"] == 61.7
    assert distill_bible.results_name(2800, 8400, 0.1, True) == "distill_bible_teachers2800_8400steps_dropout0.1_keep"


def test_reuse_from_a_folder_that_is_not_a_finished_study_is_refused_in_one_sentence(tmp_path):
    import pytest

    args = argparse.Namespace(work_dir=str(tmp_path / "new"), smoke=False, threads=1, teacher_steps=2800,
                              student_steps=8400, student_dropout=0.1, keep_original_targets=False,
                              reuse_original_student=False)
    with pytest.raises(SystemExit, match="teacher-a does not exist; give the WORK_DIR of a study"):
        distill_bible.reuse_runs(args, tmp_path / "typo", [])
    assert not (tmp_path / "new").exists()  # nothing written
