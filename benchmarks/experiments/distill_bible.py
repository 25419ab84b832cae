"""Issue 37 on the embedded corpus: two quickstart teachers, their ensemble, and a distilled student.

Runs, one after the other (each skipped when its folder is already complete, so a killed run continues):

1. teacher A: ``deepnmt train --recipe quickstart --seed 42`` (test BLEU on the 998 test verses, beam 4, at its end);
2. teacher B: the same recipe with ``--seed 43`` and A's tokenizer (an ensemble needs one vocabulary);
3. the ensemble: ``deepnmt evaluate --model A B`` on the same 998 verses, beam 4;
4. ``deepnmt distill --teachers A B`` with the ``student`` recipe (6-layer encoder, 2-layer decoder; the teachers'
   beam-4 translation of the 29,024 training sources, then 1,400 student steps, then int8 exports);
5. the same student trained on the original data for the same steps (``deepnmt train --recipe student
   --tokenizer_name A``);
6. the distilled student's int8 exports (ONNX Runtime, CTranslate2) translating the test verses (``deepnmt
   translate --engine``), scored as ``deepnmt evaluate`` scores.

Then writes ``results/distill_bible.json`` and ``results/distill_bible.md``: every test score with the command that
produced it, and the issue's goals (ensemble ≥ best member + 0.5 BLEU; distilled student ≥ the student on the
original data, within 1 BLEU of the ensemble). Decoding speed (teacher vs student, torch and int8, beam 4, batch 16
and 1) is measured apart, on a quiet machine: ``python -m benchmarks.distill_speed --work_dir WORK_DIR`` adds it to
the same results.

    python -m benchmarks.experiments.distill_bible                       # the whole study, ~2-3 h of one CPU thread
    python -m benchmarks.experiments.distill_bible --smoke               # minutes: tiny steps and 200 sentences
    python -m benchmarks.experiments.distill_bible --render_only         # the markdown from the JSON

Longer runs: ``--student_steps N`` trains both students N steps instead of the recipe's 1400, ``--teacher_steps T``
both teachers T steps (the learning-rate schedule, inverse square root, does not depend on the run length, so their
first 1400 steps are the default run's); the results are then
``results/distill_bible[_teachers<T>][_<N>steps].{json,md}``. On a machine with two cores the study runs in two lanes
at once: ``--only NAME[,NAME]`` runs only those runs (each run's outcome is kept in ``WORK_DIR/entries/NAME.json``, so
lanes do not overwrite each other's), ``--translate_processes 2`` shares the distillation's translation stage between
two ``torchrun`` processes (one thread each; their output is line for line the one process's,
tests/test_corpus_translation.py) and trains the student in one process after it; a last run without ``--only``
collects every run and writes the page. The lanes of 2026-11-26: lane 1 ``--only teacher-a``, then (after teacher B)
``--only distilled-student --translate_processes 2``; lane 2 ``--only teacher-b`` once teacher A's tokenizer is
written, then (after the dataset stage) ``--only original-student,ensemble,ensemble-tuned``, then (after the export)
``--only distilled-student-onnx-int8,distilled-student-ctranslate2-int8``.

A longer-student study of the same teachers need not retrain them nor translate the corpus again: ``--reuse_from
OTHER_WORK_DIR`` links the other study's teachers and ensemble rows and starts the distillation folder from its
translation and dataset stages (`reuse_runs`; `deepnmt distill` then resumes at the student's training).
``--student_dropout D`` gives both students dropout D (``--config_overrides dropout=D``). The study of 2026-11-27:
``--teacher_steps 2800 --student_steps 8400 --student_dropout 0.1 --work_dir runs/distill_bible_t2800_s8400_d01
--reuse_from runs/distill_bible_t2800``, lane 1 ``--only distilled-student``, lane 2 ``--only original-student``,
then the int8 rows and a run without ``--only``. ``--continue_students`` (with ``--reuse_from`` and more
``--student_steps``) starts both students from the other study's newest student checkpoints instead of from scratch
(`continue_students`: the longer run, its first steps not repeated). The study of 2026-11-27 evening:
``--teacher_steps 7000 --teacher_dropout 0.1 --teacher_warmup_steps 400 --student_steps 14000 --student_dropout 0.1
--work_dir runs/distill_bible_t7000_s14000 --reuse_from runs/distill_bible_t7000_s7000 --continue_students``, lane 1
``--only distilled-student``, lane 2 (once lane 1 had copied the checkpoints) ``--only original-student``.

A run killed part-way continues where its newest checkpoint left off when the study is run again: ``deepnmt train``
with ``--resume_from_checkpoint last`` (added to the command that row shows), ``deepnmt distill`` by itself.

On a lent GPU: ``--device cuda`` trains every model there (``--use_cpu false``; translation uses the GPU by itself),
``--stop_after dataset`` stops the distillation after the teachers' translation (the students then train at home, on
the CPU, by the same command without it) and ``benchmarks/gpu_distill.sh`` runs the lanes in one device call.

Report whatever happens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .common import experiment_parser

NAME = "distill_bible"
RUN_NAMES = ("teacher-a", "teacher-b", "ensemble", "distilled-student", "original-student",
             "distilled-student-onnx-int8", "distilled-student-ctranslate2-int8", "ensemble-tuned")
TEST_FILE = "corpus:web-sparv/test.jsonl.gz"
TRAIN_RUNS = ("teacher-a", "teacher-b", "original-student")  # the `deepnmt train` runs (`distill` resumes itself)


def steps(args: argparse.Namespace) -> list[tuple[str, Path, list[str]]]:
    """``(name, folder, deepnmt arguments)`` of every run, in order; a run is done when its folder holds its
    result (`done`)."""
    work = Path(args.work_dir)
    teacher_a, teacher_b = work / "teacher-a", work / "teacher-b"
    small = ["--max_steps", "20", "--eval_steps", "10", "--save_steps", "10", "--max_train_samples", "400",
             "--max_eval_samples", "20", "--max_predict_samples", "40"] if args.smoke else []
    threads = ["--threads", str(args.threads)]
    teacher_small = list(small)
    if args.teacher_steps is not None:
        teacher_small = [*teacher_small, "--max_steps", str(args.teacher_steps)]
    if getattr(args, "teacher_warmup_steps", None) is not None:
        teacher_small = [*teacher_small, "--warmup_steps", str(args.teacher_warmup_steps)]
    if getattr(args, "teacher_dropout", None) is not None:
        teacher_small = [*teacher_small, "--config_overrides", f"dropout={args.teacher_dropout}"]
    if args.student_steps is not None:
        small = [*small, "--max_steps", str(args.student_steps)]
    if args.student_dropout is not None:
        small = [*small, "--config_overrides", f"dropout={args.student_dropout}"]
    # --device cuda: every `deepnmt train` (teachers, students) on the GPU; the shipped recipes say --use_cpu true.
    # On a machine without one transformers' Trainer falls back to the CPU, so the same study command resumes there.
    on_gpu = ["--use_cpu", "false"] if getattr(args, "device", "cpu") == "cuda" else []
    teacher_small, small = [*teacher_small, *on_gpu], [*small, *on_gpu]
    batch = [] if getattr(args, "translate_batch_size", None) is None else ["--batch_size",
                                                                            str(args.translate_batch_size)]
    return [
        ("teacher-a", teacher_a, ["train", "--recipe", "quickstart", "--output_dir", str(teacher_a), "--seed", "42",
                                  *teacher_small]),
        ("teacher-b", teacher_b, ["train", "--recipe", "quickstart", "--output_dir", str(teacher_b), "--seed", "43",
                                  "--tokenizer_name", str(teacher_a), *teacher_small]),
        ("ensemble", work / "ensemble", ["evaluate", "--model", str(teacher_a), str(teacher_b), "--test_file",
                                         TEST_FILE, "--num_beams", "4", "--output_json",
                                         str(work / "ensemble" / "scores.json"),
                                         *(["--max_samples", "40"] if args.smoke else [])]),
        ("distilled-student", work / "distill", ["distill", "--teachers", str(teacher_a), str(teacher_b),
                                                 "--output_dir", str(work / "distill"), "--seed", "42", *threads,
                                                 *batch,
                                                 *(["--keep_original_targets"] if args.keep_original_targets else []),
                                                 *(["--train_file", str(work / "smoke-train.jsonl")] if args.smoke
                                                   else []), *small]),
        ("original-student", work / "student-original", ["train", "--recipe", "student", "--tokenizer_name",
                                                         str(teacher_a), "--output_dir",
                                                         str(work / "student-original"), "--seed", "42", *small]),
        *[(f"distilled-student-{engine}-int8", work / f"student-{engine}-int8",
           ["translate", "--model", str(work / "distill" / folder), "--engine", engine, "--input", TEST_FILE,
            "--source_lang", "en", "--target_lang", "es", "--num_beams", "4", *threads, "--output",
            str(work / f"student-{engine}-int8" / "test_translations.txt"),
            *(["--max_samples", "40"] if args.smoke else [])])
          for engine, folder in (("onnx", "student/onnx"), ("ctranslate2", "student-ctranslate2"))],
    ]


def done(name: str, folder: Path) -> bool:
    if name == "ensemble":
        return (folder / "scores.json").is_file()
    if name.endswith("-int8"):
        return (folder / "scores.json").is_file()
    if name == "distilled-student":
        manifest = folder / "distill.json"
        return manifest.is_file() and len(json.loads(manifest.read_text())["completed"]) == 4
    return (folder / "metrics.json").is_file()


def test_scores(name: str, folder: Path) -> dict | None:
    """The test scores of a finished run (beam 4 on the test verses)."""
    if name == "ensemble" or name.endswith("-int8"):
        path = folder / "scores.json"
        return json.loads(path.read_text()) if path.is_file() else None
    metrics = (folder / "student" if name == "distilled-student" else folder) / "metrics.json"
    return json.loads(metrics.read_text()).get("test") if metrics.is_file() else None


def score_export(folder: Path, max_samples: int | None) -> None:
    """BLEU/chrF/TER of an export's test translations (`deepnmt translate --engine`), as `deepnmt evaluate` scores
    a model folder, into ``scores.json``."""
    import itertools

    from hf_deepnmt_training.data import iter_local_pairs
    from hf_deepnmt_training.metrics import score_translations
    from hf_deepnmt_training.recipes import resolve_path

    pairs = itertools.islice(iter_local_pairs(Path(resolve_path(TEST_FILE)), "en", "es"), max_samples)
    hypotheses = (folder / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    kept = [(hypothesis, target) for (source, target), hypothesis in zip(pairs, hypotheses) if source and target]
    scores = score_translations([hypothesis for hypothesis, _ in kept], [target for _, target in kept])
    (folder / "scores.json").write_text(json.dumps({**scores.as_dict(), "sentences": scores.num_sentences,
                                                    "signatures": scores.signatures}, indent=2) + "\n")


VALIDATION_FILE = "corpus:web-sparv/valid.jsonl.gz"
# Ensemble weights tried on the validation verses (teacher A first: the stronger member on validation).
WEIGHT_GRID: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (3, 1))


def tune_ensemble_weights(args: argparse.Namespace, env: dict) -> dict:
    """Choose the ensemble's weights as a practitioner does, on held-out data: each of `WEIGHT_GRID` scored on the
    validation verses (beam 4), the best one then scored once on the test verses. Each evaluation is a `deepnmt
    evaluate` run whose scores file is kept in ``WORK_DIR/ensemble-tuned`` (a rerun reuses it)."""
    work = Path(args.work_dir)
    folder = work / "ensemble-tuned"
    folder.mkdir(parents=True, exist_ok=True)
    teachers = [str(work / "teacher-a"), str(work / "teacher-b")]
    smoke = ["--max_samples", "40"] if args.smoke else []

    def evaluate(split: str, data: str, weights: tuple[int, int] | None) -> tuple[dict, str]:
        label = "-".join(map(str, weights)) if weights else "member"
        path = folder / f"{split}-{label}.json"
        argv = ["evaluate", *teachers, "--test_file", data, "--num_beams", "4", "--reliance_pairs", "1",
                "--weights", *map(str, weights), "--output_json", str(path), *smoke]
        if not path.is_file():
            with open(work / "ensemble-tuned.log", "a") as log:
                subprocess.run([sys.executable, "-m", "hf_deepnmt_training.cli", *argv], env=env, stdout=log,
                               stderr=log, check=True)
        return json.loads(path.read_text()), "deepnmt " + " ".join(argv)

    validation = {weights: evaluate("valid", VALIDATION_FILE, weights) for weights in WEIGHT_GRID}
    best = max(WEIGHT_GRID, key=lambda weights: validation[weights][0]["bleu"])
    test, command = evaluate("test", TEST_FILE, best)
    return {"weights": list(best), "command": command, "test": test,
            "validation": {":".join(map(str, weights)): {"bleu": scores["bleu"], "command": used}
                           for weights, (scores, used) in validation.items()}}


def smoke_training_file(path: Path) -> None:
    """The first 200 training pairs, for ``--smoke``."""
    import gzip

    from hf_deepnmt_training.corpus import corpus_dir

    with gzip.open(corpus_dir() / "train.jsonl.gz", "rt", encoding="utf-8") as handle:
        path.write_text("".join(line for _, line in zip(range(200), handle)), encoding="utf-8")


def results_name(teacher_steps: int | None, student_steps: int | None, student_dropout: float | None = None,
                 keep_original_targets: bool = False, teacher_dropout: float | None = None,
                 teacher_warmup_steps: int | None = None, device: str = "cpu") -> str:
    """``distill_bible`` (both recipes' 1400 steps), ``distill_bible_<N>steps`` (students N steps),
    ``distill_bible_teachers<T>[-dropout<D>][-warmup<W>][_<N>steps]`` (teachers T steps, their dropout and warmup),
    ``…_dropout<D>`` (students' dropout D), ``…_keep`` (the distilled student also sees the original targets),
    ``…_cuda`` (trained on a GPU)."""
    teachers = "" if teacher_steps is None else f"_teachers{teacher_steps}"
    teachers += "" if teacher_dropout is None else f"-dropout{teacher_dropout:g}"
    teachers += "" if teacher_warmup_steps is None else f"-warmup{teacher_warmup_steps}"
    return (NAME + teachers
            + ("" if student_steps is None else f"_{student_steps}steps")
            + ("" if student_dropout is None else f"_dropout{student_dropout:g}")
            + ("_keep" if keep_original_targets else "")
            + ("_cuda" if device == "cuda" else ""))


def results_name_of(args: argparse.Namespace) -> str:
    """`results_name` of a study's options (this script's or `benchmarks.distill_speed`'s, which names the same
    file)."""
    return results_name(args.teacher_steps, args.student_steps, args.student_dropout, args.keep_original_targets,
                        args.teacher_dropout, args.teacher_warmup_steps, args.device)


REUSED_RUNS: tuple[str, ...] = ("teacher-a", "teacher-b", "ensemble", "ensemble-tuned")
FOLDERS = {"original-student": "student-original"}  # a run's folder where its name is not its folder's


def student_options(distill_argv: list[str]) -> list[str]:
    """What `deepnmt distill` records as ``student_options`` for the study's ``distill`` arguments: every argument
    after ``--output_dir DIR`` that is not distill's own (the study passes only ``--threads N``, ``--batch_size N``
    and ``--keep_original_targets`` of those)."""
    rest = distill_argv[distill_argv.index("--output_dir") + 2:]
    kept, skip = [], False
    for token in rest:
        if skip:
            skip = False
        elif token in ("--threads", "--batch_size"):
            skip = True
        elif token != "--keep_original_targets":
            kept.append(token)
    return kept


def reuse_runs(args: argparse.Namespace, source: Path, student_options: list[str]) -> None:
    """Start WORK_DIR from another study of the same teachers (``--reuse_from SOURCE``): the teachers and both
    ensemble rows are linked, not retrained (with ``--reuse_original_student`` the student on the original data too);
    the distillation folder starts with SOURCE's translation stage, and its dataset stage when the dataset is built
    the same way (``--keep_original_targets`` alike), under SOURCE's manifest settings with this study's student
    options, so `deepnmt distill` resumes at the dataset or the student's training. Nothing in SOURCE is
    changed."""
    work = Path(args.work_dir)
    reused = [*REUSED_RUNS, *(["original-student"] if args.reuse_original_student else [])]
    missing = [str(source / path) for path in (*(FOLDERS.get(name, name) for name in reused), "distill/distill.json")
               if not (source / path).exists()]
    if missing:
        raise SystemExit(f"--reuse_from {source}: {missing[0]} does not exist; give the WORK_DIR of a study whose "
                         "teachers, ensemble rows and distillation translation are complete.")
    manifest = json.loads((source / "distill" / "distill.json").read_text())
    points = (continuation_points(args, source, dict(manifest["settings"]), student_options)
              if getattr(args, "continue_students", False) else {})
    (work / "entries").mkdir(parents=True, exist_ok=True)
    for name in reused:
        link, kept = work / FOLDERS.get(name, name), work / "entries" / f"{name}.json"
        if not link.exists():
            link.symlink_to((source / FOLDERS.get(name, name)).resolve(), target_is_directory=True)
        if (source / "entries" / f"{name}.json").is_file() and not kept.is_file():
            kept.write_text((source / "entries" / f"{name}.json").read_text())
    if args.reuse_original_student:  # a linked student that SOURCE continued: its minutes are those after that step
        step = continued_step(source, "original-student")
        kept = work / "entries" / "original-student.json"
        entry = json.loads(kept.read_text()) if kept.is_file() else {}
        if step is not None and entry.get("continued_from_step") != step:
            kept.write_text(json.dumps({**entry, "continued_from_step": step}, indent=2) + "\n")
    distill = work / "distill"
    if not distill.exists():
        start_distillation(args, source, manifest, student_options)
    if points:
        continue_students(work, points)


def continued_step(study: Path, name: str) -> int | None:
    """The step from which ``study`` continued its run ``name`` (`continue_students`), or None."""
    continued = study / "entries" / "continued.json"
    return json.loads(continued.read_text()).get(name) if continued.is_file() else None


def start_distillation(args: argparse.Namespace, source: Path, manifest: dict, student_options: list[str]) -> None:
    """WORK_DIR/distill from SOURCE's translation stage (and its dataset stage when built the same way)."""
    work, distill = Path(args.work_dir), Path(args.work_dir) / "distill"
    missing = [stage for stage in ("translate", "dataset") if stage not in manifest["completed"]]
    if missing:
        raise SystemExit(f"--reuse_from {source}: its distillation has not completed {missing}")
    staging = work / "distill.partial"
    shutil.rmtree(staging, ignore_errors=True)
    (staging / "distilled").mkdir(parents=True)
    # the dataset too when it is built the same way; otherwise distill writes it again from the translations
    same_dataset = manifest["settings"].get("keep_original_targets", False) == args.keep_original_targets
    stages = ("translate", "dataset") if same_dataset else ("translate",)
    for file in ("translations.txt", "train.jsonl") if same_dataset else ("translations.txt",):
        shutil.copyfile(source / "distill" / "distilled" / file, staging / "distilled" / file)
    manifest["settings"]["student_options"] = student_options
    manifest["settings"]["keep_original_targets"] = args.keep_original_targets
    manifest["completed"] = {stage: manifest["completed"][stage] for stage in stages}
    (staging / "distill.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    staging.rename(distill)


def _without_max_steps(options: list[str]) -> list[str]:
    return [token for index, token in enumerate(options)
            if token != "--max_steps" and (index == 0 or options[index - 1] != "--max_steps")]


LENGTH_FREE_SCHEDULES = ("inverse_sqrt", "constant", "constant_with_warmup")  # none reads --max_steps
CONTINUED_LABELS = {"distilled-student": "the student on the distilled data",
                    "original-student": "the student on the original data"}


def continuation_points(args: argparse.Namespace, source: Path, source_settings: dict,
                        options: list[str]) -> dict[str, tuple[Path, Path, int]]:
    """``--continue_students``: ``{run: (its folder here, SOURCE's newest checkpoint of it, its step)}``, or
    refused in one sentence (before anything is written) unless SOURCE's students ran with the same options and
    dataset but fewer steps than ``--student_steps``."""
    from hf_deepnmt_training.checkpoints import last_checkpoint
    from hf_deepnmt_training.recipes import load_recipe

    schedule = load_recipe("student")["training"].get("lr_scheduler_type", "linear")
    if schedule not in LENGTH_FREE_SCHEDULES:
        raise SystemExit(f"--continue_students: the student recipe's lr_scheduler_type {schedule!r} depends on the "
                         f"run's length, so a continued run would not be the longer run; it needs one of "
                         f"{LENGTH_FREE_SCHEDULES}.")
    if args.reuse_original_student:
        raise SystemExit("--continue_students trains the student on the original data on from the reused study's "
                         "checkpoint; do not also link it (--reuse_original_student).")
    if source_settings.get("keep_original_targets", False) != args.keep_original_targets:
        raise SystemExit(f"--continue_students: {source}'s distilled student learned from another dataset "
                         "(--keep_original_targets differs); it can only be continued on its own.")
    if _without_max_steps(source_settings["student_options"]) != _without_max_steps(options):
        raise SystemExit(f"--continue_students: {source}'s students ran with {source_settings['student_options']}, "
                         f"this study's with {options}; only --max_steps may differ.")
    work, points = Path(args.work_dir), {}
    for name, mine, theirs in (("distilled-student", work / "distill" / "student", source / "distill" / "student"),
                               ("original-student", work / "student-original", source / "student-original")):
        found = last_checkpoint(theirs) if theirs.is_dir() else None
        if found is None:
            raise SystemExit(f"--continue_students: {theirs} holds no complete checkpoint to continue from.")
        step = int(Path(found).name.split("-")[-1])
        if args.student_steps is None or args.student_steps <= step:
            raise SystemExit(f"--continue_students: --student_steps {args.student_steps} must be more than the "
                             f"{step} steps {Path(found)} holds.")
        points[name] = (mine, Path(found), step)
    return points


def continue_students(work: Path, points: dict[str, tuple[Path, Path, int]]) -> dict[str, int]:
    """Both students of WORK_DIR start from the newest checkpoints of SOURCE's students (`continuation_points`) and
    train on to ``--student_steps``: `deepnmt distill` and `run_one` continue a folder that holds a checkpoint. The
    students' learning-rate schedule (inverse square root after the warm-up) does not depend on the run length and a
    resumed `Trainer` restores the optimizer, the scheduler, the random states and the place in the data, so the
    result is the longer run's without its first steps again (tests/test_resume_and_distributed.py,
    `test_a_run_continued_to_more_steps_is_the_longer_run`). Copies (through a staging folder); never changes SOURCE;
    a folder that already holds a checkpoint (an earlier lane's copy, or a run under way) is left alone. Returns
    ``{run: the step it continues from}``, also kept in ``WORK_DIR/entries/continued.json``."""
    started = {}
    for name, (mine, found, step) in points.items():
        started[name] = step
        if mine.is_dir() and any(mine.glob("checkpoint-*")):
            continue
        staging = mine.parent / f"{mine.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(found, staging / found.name)
        staging.rename(mine)
    kept = work / "entries" / "continued.json"
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(json.dumps(started, indent=2) + "\n")
    return started


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_until_stage(command: list[str], folder: Path, stage: str, env: dict, log: object) -> int:
    """Run ``command`` (a ``deepnmt distill`` of ``folder``) until its manifest records ``stage`` as complete, then
    stop it (its process group, as `deepnmt distill` resumes after a kill). Returns the command's exit code, or 0 when
    it was stopped after the stage (or the stage was complete before)."""
    manifest = folder / "distill.json"

    def stage_done() -> bool:
        try:
            return stage in json.loads(manifest.read_text())["completed"]
        except (OSError, ValueError, KeyError):
            return False

    if stage_done():
        return 0
    process = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
    while process.poll() is None:
        if stage_done():
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return 0
        time.sleep(5)
    return 0 if stage_done() else process.returncode


def translate_in_processes(deepnmt: list[str], folder: Path, processes: int, env: dict, log: object) -> int:
    """Run ``deepnmt distill`` under ``torchrun`` with ``processes`` processes until its translation and dataset stages
    are complete (the manifest says so), then stop it: the student is trained afterwards by one process, exactly as
    without this option. Returns torchrun's exit code, or 0 when it was stopped after the dataset stage."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
               str(free_port()), "-m", "hf_deepnmt_training.cli", *deepnmt]
    return run_until_stage(command, folder, "dataset", env, log)


def where(name: str, device: str) -> str:
    """Where run ``name`` ran, for its row: the GPU's name where torch sees one and the run uses it (training only
    under ``--device cuda``, as `deepnmt train --use_cpu false`; the torch engine's translation always, its
    automatic ``--device``; the int8 exports never), else the CPU."""
    import platform

    import torch

    uses_gpu = {"teacher-a": device == "cuda", "teacher-b": device == "cuda", "original-student": device == "cuda",
                "ensemble": True, "distilled-student": True}.get(name, False)
    if uses_gpu and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({platform.machine()}, {os.cpu_count()} cores)"


def run_one(name: str, folder: Path, deepnmt: list[str], args: argparse.Namespace, env: dict) -> dict:
    """Run one step of the study (unless its folder is complete); its outcome is kept in ``WORK_DIR/entries``."""
    work = Path(args.work_dir)
    kept = work / "entries" / f"{name}.json"
    entry = json.loads(kept.read_text()) if kept.is_file() else {}
    if not done(name, folder):
        if name in TRAIN_RUNS and any(folder.glob("checkpoint-*")):  # a killed `deepnmt train`: continue it
            deepnmt = [*deepnmt, "--resume_from_checkpoint", "last"]
        (folder if name == "ensemble" or name.endswith("-int8") else folder.parent).mkdir(parents=True, exist_ok=True)
        begun = time.time()
        with open(work / f"{name}.log", "a") as log:
            code = 0
            if name == "distilled-student" and args.translate_processes > 1:
                code = translate_in_processes(deepnmt, folder, args.translate_processes, env, log)
            command = [sys.executable, "-m", "hf_deepnmt_training.cli", *deepnmt]
            if code == 0 and name == "distilled-student" and args.stop_after is not None:
                code = run_until_stage(command, folder, args.stop_after, env, log)
            elif code == 0:
                code = subprocess.run(command, env=env, stdout=log, stderr=log, check=False).returncode
        if code == 0 and name.endswith("-int8"):
            score_export(folder, 40 if args.smoke else None)
        prior, entry = entry, {"exit_code": code, "wall_minutes": round((time.time() - begun) / 60, 1),
                               "where": where(name, args.device)}
        if prior.get("stopped_after"):  # an earlier run of this step stopped after a stage (--stop_after): add it
            entry["wall_minutes"] = round(prior["wall_minutes"] + entry["wall_minutes"], 1)
            if prior.get("where") != entry["where"]:
                entry["where"] = f"{prior.get('where')} up to its {prior['stopped_after']} stage, then {entry['where']}"
        if name == "distilled-student" and args.stop_after is not None and code == 0:
            entry["stopped_after"] = args.stop_after
        if args.only is not None:
            entry["lane"] = True
        if name == "distilled-student" and args.translate_processes > 1:
            entry["translate_processes"] = args.translate_processes
        if code != 0:
            print(f"{name}: exit {code}; see {work / f'{name}.log'}", file=sys.stderr)
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text(json.dumps(entry, indent=2) + "\n")
    entry.update(command="deepnmt " + " ".join(deepnmt), folder=str(folder), test=test_scores(name, folder))
    if name == "distilled-student" and (folder / "distill.json").is_file():
        entry["distill"] = json.loads((folder / "distill.json").read_text())["completed"]
    print(f"{name}: test {(entry.get('test') or {}).get('bleu')}", file=sys.stderr, flush=True)
    return entry


def main() -> None:
    parser = experiment_parser(__doc__, work_dir="runs/distill_bible", threads=1, device=True, helps={
        "device": "cuda: every `deepnmt train` of the study runs with --use_cpu false (the recipes say true) and the "
                  "translations use the GPU; the results go to …_cuda.{json,md}."})
    parser.add_argument("--smoke", action="store_true", help="Tiny steps and data: checks the script, measures "
                        "nothing (results go to WORK_DIR, not --results).")
    parser.add_argument("--student_steps", type=int, default=None, help="Training steps of both students (default: "
                        "the student recipe's 1400); the results go to distill_bible_<N>steps.{json,md}.")
    parser.add_argument("--teacher_steps", type=int, default=None, help="Training steps of both teachers (default: "
                        "the quickstart recipe's 1400); the results go to "
                        "distill_bible_teachers<T>[_<N>steps].{json,md}.")
    parser.add_argument("--student_dropout", type=float, default=None, help="Dropout of both students (default: the "
                        "student recipe's 0.0; longer runs want 0.1, docs/defaults.md); the results go to "
                        "…_dropout<D>.{json,md}.")
    parser.add_argument("--teacher_dropout", type=float, default=None, help="Dropout of both teachers (default: "
                        "the quickstart recipe's 0.0); the results go to …_teachers<T>-dropout<D>….")
    parser.add_argument("--teacher_warmup_steps", type=int, default=None, help="Warm-up steps of both teachers "
                        "(default: the quickstart recipe's 200); the results go to …-warmup<W>….")
    parser.add_argument("--translate_batch_size", type=int, default=None, help="Sentences per translation batch of "
                        "the distillation's translation stage (`deepnmt distill --batch_size`; default: its 32).")
    parser.add_argument("--stop_after", choices=("translate", "dataset", "train"), default=None, help="Stop the "
                        "distilled student's `deepnmt distill` once this stage is recorded (e.g. train on a lent GPU "
                        "whose image lacks the export packages); the same command without it resumes the rest.")
    parser.add_argument("--reuse_from", default=None, help="Another study's WORK_DIR with the same teachers: link "
                        "its teachers and ensemble rows and start from its distilled data (`reuse_runs`).")
    parser.add_argument("--keep_original_targets", action="store_true", help="The distilled student learns from the "
                        "teachers' translations and the original targets (`deepnmt distill --keep_original_targets`); "
                        "the results go to …_keep.{json,md}.")
    parser.add_argument("--reuse_original_student", action="store_true", help="With --reuse_from: link its student "
                        "trained on the original data too (when this study would run the same command: same steps, "
                        "dropout and seed).")
    parser.add_argument("--continue_students", action="store_true", help="With --reuse_from and more "
                        "--student_steps: both students continue from the newest checkpoints of the reused study's "
                        "students instead of starting again (`continue_students`: the same run, its first steps not "
                        "repeated).")
    parser.add_argument("--only", default=None, help="Comma-separated runs to do now (a lane of a parallel study): "
                        f"of {RUN_NAMES}; without it, every run in order and the results page.")
    parser.add_argument("--translate_processes", type=int, default=1, help="Processes (torchrun, one thread each) "
                        "that share the distillation's translation stage; the student then trains in one process.")
    args = parser.parse_args()
    only = None if args.only is None else [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(only or ()) - set(RUN_NAMES))
    if unknown:
        parser.error(f"--only {args.only!r} names {unknown}; the runs are {RUN_NAMES}")
    for option in ("continue_students", "reuse_original_student"):
        if getattr(args, option) and args.reuse_from is None:
            parser.error(f"--{option} works on the study named by --reuse_from, which is not given; give it.")
    if args.translate_processes < 1:
        parser.error(f"--translate_processes {args.translate_processes} must be 1 or more")
    name = results_name_of(args)
    results = Path(args.work_dir) if args.smoke else Path(args.results)
    if args.render_only:
        if not (results / f"{name}.json").is_file():
            parser.error(f"--render_only: {results / f'{name}.json'} does not exist; run the study with these options "
                         "first (the file's name follows --teacher_steps, --student_steps, --student_dropout, "
                         "--teacher_dropout, --teacher_warmup_steps, --keep_original_targets and --device)")
        report = json.loads((results / f"{name}.json").read_text())
        write_markdown(report, results / f"{name}.md")
        return
    work = Path(args.work_dir)
    if args.reuse_from is not None:  # first: a refused --reuse_from/--continue_students leaves no WORK_DIR behind
        distill_argv = {name: argv for name, _, argv in steps(args)}["distilled-student"]
        reuse_runs(args, Path(args.reuse_from), student_options(distill_argv))
    work.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    if args.smoke:
        smoke_training_file(work / "smoke-train.jsonl")
    if args.device == "cuda" and not args.smoke:
        import torch

        if not torch.cuda.is_available():  # the continuation at home of a study started on a lent GPU
            print("[distill_bible] --device cuda: no GPU is visible here, so what is left trains and translates on the "
                  "CPU (each row's `where` says where it ran)", file=sys.stderr)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    if only is not None:
        for step in steps(args):
            if step[0] in only and run_one(*step, args, env).get("exit_code", 0) != 0:
                sys.exit(1)
        if "ensemble-tuned" in only:
            tune_ensemble_weights(args, env)
        return
    path = results / f"{name}.json"
    report = json.loads(path.read_text()) if path.is_file() else {"runs": {}}
    report["command"] = " ".join(["python", "-m", "benchmarks.experiments.distill_bible", *sys.argv[1:]])
    report["threads"] = args.threads
    if args.student_steps is not None:
        report["student_steps"] = args.student_steps
    if args.teacher_steps is not None:
        report["teacher_steps"] = args.teacher_steps
    if args.student_dropout is not None:
        report["student_dropout"] = args.student_dropout
    for key in ("teacher_dropout", "teacher_warmup_steps", "translate_batch_size"):
        if getattr(args, key) is not None:
            report[key] = getattr(args, key)
    report["device"] = args.device
    if args.reuse_from is not None:
        report["reused_from"] = args.reuse_from
        report["reused_original_student"] = args.reuse_original_student
    continued = Path(args.work_dir) / "entries" / "continued.json"
    if args.continue_students and continued.is_file():
        report["continued_students"] = json.loads(continued.read_text())
    if args.keep_original_targets:
        report["keep_original_targets"] = True
    for step in steps(args):
        entry = run_one(*step, args, env)
        report["runs"][step[0]] = entry
        report["lanes"] = report.get("lanes", False) or bool(entry.get("lane"))
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        if entry.get("exit_code", 0) != 0:
            break
    else:
        report["runs"]["ensemble-tuned"] = tune_ensemble_weights(args, env)
        path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        print(f"ensemble-tuned: weights {report['runs']['ensemble-tuned']['weights']}, test "
              f"{report['runs']['ensemble-tuned']['test']['bleu']}", file=sys.stderr, flush=True)
    write_markdown(report, results / f"{name}.md")


def write_markdown(report: dict, path: Path) -> None:
    """The results page of ``report`` (`render`) written to ``path``."""
    path.write_text(render(report), encoding="utf-8")


def _bleu(report: dict, name: str) -> float | None:
    return ((report["runs"].get(name) or {}).get("test") or {}).get("bleu")


def render(report: dict) -> str:
    """The results page: the scores with their commands, the goals, the speed section when measured."""
    runs = report["runs"]
    steps = (f", {report['student_steps']} steps" if "student_steps" in report else "") + (
        f", dropout {report['student_dropout']:g}" if "student_dropout" in report else "")
    steps = f"{steps}," if steps else ""
    how_run = ("several runs at a time in lanes (`--only`, the script's docstring): that changes their minutes, not "
               "their results" if report.get("lanes") else "one run at a time")
    threads = report.get("threads")
    threads_text = (f"{threads} CPU thread per run" if threads == 1 else f"{threads} CPU threads per run" + (
        " of this study; the reused runs as their own study's page says" if report.get("reused_from") else ""))
    teacher = (f", {report['teacher_steps']} steps" if "teacher_steps" in report else "") + (
        f", dropout {report['teacher_dropout']:g}" if "teacher_dropout" in report else "") + (
        f", warmup {report['teacher_warmup_steps']}" if "teacher_warmup_steps" in report else "")
    rows = [(f"teacher A (quickstart{teacher}, seed 42)", "teacher-a"),
            (f"teacher B (quickstart{teacher}, seed 43)", "teacher-b"),
            ("ensemble A + B (mean of probabilities)", "ensemble"),
            ("ensemble A + B, weights chosen on the validation verses", "ensemble-tuned"),
            (f"student 6-2{steps} on the distilled data"
             + (" and the original targets" if report.get("keep_original_targets") else ""), "distilled-student"),
            (f"student 6-2{steps} on the original data", "original-student"),
            ("the distilled student, ONNX Runtime int8", "distilled-student-onnx-int8"),
            ("the distilled student, CTranslate2 int8", "distilled-student-ctranslate2-int8")]
    lines = ["# Distillation on the embedded corpus: two teachers, their ensemble, a distilled student", "",
             f"Command: `{report.get('command')}` ({threads_text}, {how_run}). "
             "Test: the 998 verses of the held-out books, beam 4. Every command below ran as written "
             "(`deepnmt` = `python -m hf_deepnmt_training.cli`)."
             + (f" The teachers, both ensemble rows and the teachers' translation of the training corpus were taken "
                f"from {report['reused_from']} (`--reuse_from`)"
                + (", and the student on the original data too (`--reuse_original_student`: the same command"
                   + (f"; {report['reused_from']} had continued it from step "
                      f"{runs['original-student']['continued_from_step']} of an earlier study, so its minutes are "
                      "those after that step" if (runs.get("original-student") or {}).get("continued_from_step")
                      else "") + ")"
                   if report.get("reused_original_student") else "")
                + ": the same runs, not repeated." if report.get("reused_from")
                else "")
             + (f" Continued from the same runs of {report['reused_from']} (`--continue_students`: same options; "
                "inverse-square-root schedule, optimizer, random states and place in the data restored): "
                + " and ".join(f"{CONTINUED_LABELS.get(name, name)} from step {step}"
                               for name, step in report["continued_students"].items())
                + "; their minutes are those after that step." if report.get("continued_students") else ""), "",
             "| model | test BLEU | chrF | minutes | where | command |", "|---|---|---|---|---|---|"]
    for label, name in rows:
        entry = runs.get(name) or {}
        test = entry.get("test") or {}
        lines.append(f"| {label} | {test.get('bleu', 'n/a')} | {test.get('chrf', 'n/a')} | "
                     f"{entry.get('wall_minutes', 'n/a')} | {entry.get('where', 'CPU')} | "
                     f"`{entry.get('command', '')}` |")
    a, b, ensemble = _bleu(report, "teacher-a"), _bleu(report, "teacher-b"), _bleu(report, "ensemble")
    distilled, original = _bleu(report, "distilled-student"), _bleu(report, "original-student")
    lines += ["", "Goals of issue 37 (met / not met, from the rows above):", ""]
    if None not in (a, b, ensemble):
        best = max(a, b)
        lines.append(f"- ensemble ≥ best member + 0.5 BLEU: {ensemble} vs {best} + 0.5 → "
                     f"{'met' if ensemble >= best + 0.5 else 'not met'} (Δ {ensemble - best:+.2f})")
    tuned = (runs.get("ensemble-tuned") or {})
    if None not in (a, b) and tuned.get("test"):
        best = max(a, b)
        tried = ", ".join(f"{weights} → {entry['bleu']}" for weights, entry in tuned["validation"].items())
        lines.append(f"- the same with weights chosen on the validation verses (A:B {tried} validation BLEU; chosen "
                     f"{':'.join(map(str, tuned['weights']))}): {tuned['test']['bleu']} vs {best} + 0.5 → "
                     f"{'met' if tuned['test']['bleu'] >= best + 0.5 else 'not met'} "
                     f"(Δ {tuned['test']['bleu'] - best:+.2f})")
    if None not in (distilled, original):
        lines.append(f"- distilled student ≥ student on the original data: {distilled} vs {original} → "
                     f"{'met' if distilled >= original else 'not met'} (Δ {distilled - original:+.2f})")
    if None not in (distilled, ensemble):
        lines.append(f"- distilled student within 1 BLEU of the ensemble: {distilled} vs {ensemble} → "
                     f"{'met' if distilled >= ensemble - 1 else 'not met'} (Δ {distilled - ensemble:+.2f})")
    stages = (runs.get("distilled-student") or {}).get("distill") or {}
    processes = (runs.get("distilled-student") or {}).get("translate_processes", 1)
    if stages:
        lines += ["", "Distillation stages (`distill.json`): " + "; ".join(
            f"{stage} {info.get('seconds', '?')} s" for stage, info in stages.items())
            + (f"; {stages['dataset']['pairs']:,} distilled pairs, {stages['dataset']['same_as_original']:,} equal "
               "to their original target" if "dataset" in stages else "")
            + (f"; the translation shared by {processes} `torchrun` processes of one thread each "
               "(`--translate_processes`), the student trained by one" if processes > 1 else "")]
    speed = report.get("speed")
    lines += ["", "## Decoding speed", ""]
    if speed:
        lines += [f"Command: `{speed['command']}` ({speed['machine']}).", "", *speed["table"]]
    else:
        study = "".join(f" --{key} {report[key]:g}" for key in ("teacher_steps", "student_steps", "student_dropout",
                                                                 "teacher_dropout", "teacher_warmup_steps")
                        if key in report)
        study += (" --keep_original_targets" if report.get("keep_original_targets") else "") + (
            " --device cuda" if report.get("device") == "cuda" else "")
        work = (runs.get("teacher-a") or {}).get("folder", "runs/distill_bible/teacher-a").rsplit("/", 1)[0]
        lines.append(f"Not measured for this study (it needs a quiet machine): `python -m benchmarks.distill_speed "
                     f"--work_dir {work}{study}` adds the table here.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
