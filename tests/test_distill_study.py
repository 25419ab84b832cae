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
    argv = {name: argv for name, _, argv in distill_bible.steps(args)}["distilled-student"]
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
    argv = {name: argv for name, _, argv in distill_bible.steps(args)}["distilled-student"]
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


def test_a_linked_original_student_that_its_study_continued_says_so_on_the_page(tmp_path):
    source, work = tmp_path / "s14000", tmp_path / "s14000_keep"
    _source_study(source)
    (source / "student-original").mkdir()
    (source / "entries" / "original-student.json").write_text('{"exit_code": 0, "wall_minutes": 70.8}\n')
    (source / "entries" / "continued.json").write_text('{"distilled-student": 7000, "original-student": 7000}\n')
    args = argparse.Namespace(work_dir=str(work), smoke=False, threads=2, teacher_steps=2800, student_steps=14000,
                              student_dropout=0.1, keep_original_targets=True, reuse_original_student=True)
    options = distill_bible.student_options({n: a for n, _, a in distill_bible.steps(args)}["distilled-student"])
    distill_bible.reuse_runs(args, source, options)
    distill_bible.reuse_runs(args, source, options)  # a second lane: the same entry
    entry = json.loads((work / "entries" / "original-student.json").read_text())
    assert entry == {"exit_code": 0, "wall_minutes": 70.8, "continued_from_step": 7000}
    report = {"runs": {"original-student": entry}, "command": "c", "threads": 2, "reused_from": str(source),
              "reused_original_student": True}
    page = distill_bible.render(report)
    assert (f"(`--reuse_original_student`: the same command; {source} had continued it from step 7000 of an earlier "
            "study, so its minutes are those after that step)" in page)
    (source / "entries" / "continued.json").unlink()  # a student the source trained from step 0: nothing to say
    other = tmp_path / "other"
    distill_bible.reuse_runs(argparse.Namespace(**{**vars(args), "work_dir": str(other)}), source, options)
    assert "continued_from_step" not in json.loads((other / "entries" / "original-student.json").read_text())
    assert "had continued it" not in distill_bible.render({**report, "runs": {}})
    assert "(2 CPU threads per run of this study; the reused runs as their own study's page says, " in page


def test_reuse_from_a_folder_that_is_not_a_finished_study_is_refused_in_one_sentence(tmp_path):
    import pytest

    args = argparse.Namespace(work_dir=str(tmp_path / "new"), smoke=False, threads=1, teacher_steps=2800,
                              student_steps=8400, student_dropout=0.1, keep_original_targets=False,
                              reuse_original_student=False)
    with pytest.raises(SystemExit, match="teacher-a does not exist; give the WORK_DIR of a study"):
        distill_bible.reuse_runs(args, tmp_path / "typo", [])
    assert not (tmp_path / "new").exists()  # nothing written


def _gpu_study_args(work):
    return argparse.Namespace(work_dir=str(work), smoke=False, threads=2, teacher_steps=8400, student_steps=8400,
                              student_dropout=0.1, keep_original_targets=False, teacher_dropout=0.1,
                              teacher_warmup_steps=400, translate_batch_size=512, device="cuda", only=None,
                              translate_processes=1, stop_after=None)


def test_a_gpu_study_trains_every_model_on_the_gpu_and_names_its_teachers_settings(tmp_path):
    runs = {name: argv for name, _, argv in distill_bible.steps(_gpu_study_args(tmp_path))}
    for name in ("teacher-a", "teacher-b"):
        assert runs[name][-8:] == ["--max_steps", "8400", "--warmup_steps", "400", "--config_overrides",
                                   "dropout=0.1", "--use_cpu", "false"]
    assert runs["original-student"][-6:] == ["--max_steps", "8400", "--config_overrides", "dropout=0.1", "--use_cpu",
                                             "false"]
    distill = runs["distilled-student"]
    assert distill[distill.index("--batch_size") + 1] == "512"
    # the translation's batch is distill's own option, not the student's: a CPU rerun resumes the same folder
    assert distill_bible.student_options(distill) == ["--seed", "42", "--max_steps", "8400", "--config_overrides",
                                                      "dropout=0.1", "--use_cpu", "false"]
    assert (distill_bible.results_name(8400, 8400, 0.1, False, 0.1, 400, "cuda")
            == "distill_bible_teachers8400-dropout0.1-warmup400_8400steps_dropout0.1_cuda")
    cpu = argparse.Namespace(**{**vars(_gpu_study_args(tmp_path)), "device": "cpu"})
    assert "--use_cpu" not in {token for _, _, argv in distill_bible.steps(cpu) for token in argv}


def test_a_killed_training_of_the_study_continues_from_its_checkpoint(tmp_path, monkeypatch):
    args = _gpu_study_args(tmp_path)
    (tmp_path / "teacher-a" / "checkpoint-7000").mkdir(parents=True)
    calls = []

    def run(command, **kwargs):
        calls.append(command)
        return argparse.Namespace(returncode=0)

    monkeypatch.setattr(distill_bible.subprocess, "run", run)
    name, folder, argv = distill_bible.steps(args)[0]
    entry = distill_bible.run_one(name, folder, argv, args, {})
    assert calls[0][-2:] == ["--resume_from_checkpoint", "last"]
    assert entry["command"].endswith("--resume_from_checkpoint last")
    name, folder, argv = distill_bible.steps(args)[1]  # teacher B has no checkpoint: a plain run
    distill_bible.run_one(name, folder, argv, args, {})
    assert "--resume_from_checkpoint" not in calls[1]


def test_a_distillation_stopped_after_a_stage_adds_up_with_its_continuation(tmp_path, monkeypatch):
    """`--stop_after` on a lent GPU, then the same study at home: one row, both parts' minutes and machines."""
    args = argparse.Namespace(**{**vars(_gpu_study_args(tmp_path)), "stop_after": "dataset"})
    folder = tmp_path / "distill"
    folder.mkdir()
    (folder / "distill.json").write_text(json.dumps({"completed": {"translate": {}, "dataset": {}}}))
    monkeypatch.setattr(distill_bible, "where", lambda name, device: "NVIDIA H200")
    name, _, argv = distill_bible.steps(args)[3]
    assert name == "distilled-student"
    first = distill_bible.run_one(name, folder, argv, args, {})  # the stage is recorded: nothing runs
    assert first["stopped_after"] == "dataset" and first["where"] == "NVIDIA H200"
    kept = json.loads((tmp_path / "entries" / "distilled-student.json").read_text())
    (tmp_path / "entries" / "distilled-student.json").write_text(json.dumps({**kept, "wall_minutes": 1.5}))
    monkeypatch.setattr(distill_bible, "where", lambda name, device: "CPU (x86_64, 2 cores)")
    monkeypatch.setattr(distill_bible.subprocess, "run", lambda command, **kwargs: argparse.Namespace(returncode=0))
    home = argparse.Namespace(**{**vars(args), "stop_after": None})
    second = distill_bible.run_one(name, folder, argv, home, {})
    assert second["where"] == "NVIDIA H200 up to its dataset stage, then CPU (x86_64, 2 cores)"
    assert second["wall_minutes"] >= 1.5 and "stopped_after" not in second


def test_the_speed_script_finds_the_results_file_of_a_study_with_teachers_options():
    """`benchmarks.distill_speed` adds its table to the study's own results file: the same options give the same
    name, teachers' dropout and warm-up included (before, a study with them had no speed table to be given)."""
    from benchmarks import distill_speed

    argv = ["--teacher_steps", "7000", "--teacher_dropout", "0.1", "--teacher_warmup_steps", "400", "--student_steps",
            "7000", "--student_dropout", "0.1"]
    args = distill_speed.build_parser().parse_args(["--work_dir", "runs/x", *argv])
    assert (distill_bible.results_name_of(args)
            == "distill_bible_teachers7000-dropout0.1-warmup400_7000steps_dropout0.1")
    study = argparse.Namespace(**{**vars(_gpu_study_args("runs/x")), "teacher_steps": 7000, "student_steps": 7000,
                                  "device": "cpu"})
    assert distill_bible.results_name_of(study) == distill_bible.results_name_of(args)
    report = {"runs": {"teacher-a": {"folder": "runs/x/teacher-a"}}, "teacher_steps": 7000, "student_steps": 7000,
              "student_dropout": 0.1, "teacher_dropout": 0.1, "teacher_warmup_steps": 400, "device": "cpu"}
    page = distill_bible.render(report)
    assert f"python -m benchmarks.distill_speed --work_dir runs/x {' '.join(argv[:2])}" in page
    for option in argv[2::2]:
        assert option in page.split("## Decoding speed")[1]


def _checkpointed(folder, *steps):
    for step in steps:
        (folder / f"checkpoint-{step}").mkdir(parents=True)
        for name in ("model.safetensors", "trainer_state.json", "optimizer.pt", "scheduler.pt"):
            (folder / f"checkpoint-{step}" / name).write_text(f"{name} {step}")


def _continue_args(work, **changes):
    values = {"work_dir": str(work), "smoke": False, "threads": 1, "teacher_steps": 2800, "student_steps": 14000,
              "student_dropout": 0.1, "keep_original_targets": False, "reuse_original_student": False,
              "continue_students": True}
    return argparse.Namespace(**{**values, **changes})


def _options(args):
    return distill_bible.student_options({n: a for n, _, a in distill_bible.steps(args)}["distilled-student"])


def test_continue_students_starts_both_students_from_the_reused_studys_newest_checkpoints(tmp_path):
    source, work = tmp_path / "s7000", tmp_path / "s14000"
    manifest = _source_study(source)
    manifest["settings"]["student_options"] = ["--seed", "42", "--max_steps", "7000", "--config_overrides",
                                               "dropout=0.1"]
    (source / "distill" / "distill.json").write_text(json.dumps(manifest))
    _checkpointed(source / "distill" / "student", 6300, 7000)
    _checkpointed(source / "student-original", 6300, 7000)
    args = _continue_args(work)
    distill_bible.reuse_runs(args, source, _options(args))
    distill_bible.reuse_runs(args, source, _options(args))  # the second lane: nothing copied again
    for mine in (work / "distill" / "student", work / "student-original"):
        assert sorted(path.name for path in mine.iterdir()) == ["checkpoint-7000"]
        assert (mine / "checkpoint-7000" / "optimizer.pt").read_text() == "optimizer.pt 7000"
        assert not mine.is_symlink()  # a copy: the continued run never writes into the reused study
    assert json.loads((work / "entries" / "continued.json").read_text()) == {"distilled-student": 7000,
                                                                            "original-student": 7000}
    assert list(json.loads((work / "distill" / "distill.json").read_text())["completed"]) == ["translate", "dataset"]
    report = {"runs": {}, "command": "c", "threads": 1, "reused_from": str(source),
              "continued_students": {"distilled-student": 7000, "original-student": 7000}}
    page = distill_bible.render(report)
    assert (f"Continued from the same runs of {source} (`--continue_students`" in page
            and "the student on the distilled data from step 7000 and the student on the original data from step "
                "7000;" in page)


def test_continue_students_is_refused_in_one_sentence_when_it_would_not_continue_the_same_run(tmp_path):
    import pytest

    source = tmp_path / "s7000"
    manifest = _source_study(source)
    manifest["settings"]["student_options"] = ["--seed", "42", "--max_steps", "7000", "--config_overrides",
                                               "dropout=0.1"]
    (source / "distill" / "distill.json").write_text(json.dumps(manifest))
    _checkpointed(source / "distill" / "student", 7000)
    _checkpointed(source / "student-original", 7000)
    refusals = [({"student_steps": 7000}, "--student_steps 7000 must be more than the 7000 steps"),
                ({"student_dropout": 0.2}, "only --max_steps may differ"),
                ({"reuse_original_student": True}, "do not also link it"),
                ({"keep_original_targets": True}, "--keep_original_targets differs")]
    for index, (changes, message) in enumerate(refusals):
        work = tmp_path / f"new{index}"
        args = _continue_args(work, **changes)
        with pytest.raises(SystemExit, match=message):
            distill_bible.reuse_runs(args, source, _options(args))
        assert not (work / "distill" / "student").exists() and not (work / "student-original").exists()


def test_continue_students_is_refused_when_the_student_schedule_depends_on_the_run_length(tmp_path, monkeypatch):
    import pytest
    from hf_deepnmt_training import recipes

    source = tmp_path / "s7000"
    _source_study(source)
    real = recipes.load_recipe
    monkeypatch.setattr(recipes, "load_recipe", lambda name: {**real(name), "training": {
        **real(name)["training"], "lr_scheduler_type": "linear"}})
    args = _continue_args(tmp_path / "new")
    with pytest.raises(SystemExit, match="lr_scheduler_type 'linear' depends on the run's length"):
        distill_bible.reuse_runs(args, source, _options(args))
    assert not (tmp_path / "new").exists()
    assert real("student")["training"]["lr_scheduler_type"] in distill_bible.LENGTH_FREE_SCHEDULES


def test_options_of_a_reused_study_without_reuse_from_are_refused_in_one_sentence(tmp_path, monkeypatch, capsys):
    import sys

    import pytest

    def no_run(*args, **kwargs):
        raise AssertionError("the study ran a step instead of refusing the option")

    monkeypatch.setattr(distill_bible, "run_one", no_run)
    for option in ("--continue_students", "--reuse_original_student"):
        monkeypatch.setattr(sys, "argv", ["distill_bible", "--work_dir", str(tmp_path / "w"), option])
        with pytest.raises(SystemExit):
            distill_bible.main()
        assert (f"{option} works on the study named by --reuse_from, which is not given; give it."
                in capsys.readouterr().err)
    assert not (tmp_path / "w").exists()  # refused before anything is written
