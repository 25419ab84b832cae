"""`deepnmt distill`: sequence-level knowledge distillation (Kim & Rush 2016) in one command, every stage cached.

    stage translate  the teacher(s) translate every source of the training file (beam search)
                     -> OUT/distilled/translations.txt
    stage dataset    source + the teachers' translation (+ the original target) -> OUT/distilled/train.jsonl
    stage train      `deepnmt train --recipe student` on it -> OUT/student (model, card, metrics)
    stage export     int8 -> OUT/student/onnx (every model), OUT/student-ctranslate2 (a standard Transformer)

``OUT/distill.json`` records the settings of the run and every completed stage; it is rewritten atomically (beside
itself, then renamed) only after a stage's outputs are complete, so a stage that is not in it is never taken as done,
whatever files it left. Rerunning the same command resumes: completed stages are skipped; the translation continues
after its last complete line (`hf_deepnmt_training.translate.translate_corpus`; under torchrun / accelerate launch each process
continues its share); the dataset is written again from the translations (seconds); training continues from the
newest complete checkpoint (`--resume_from_checkpoint last`); an export is redone from the start in a staging folder
that is renamed into place when complete. Rerunning with other settings in the same folder is refused in one sentence
(every stage's output depends on them).

Every input is checked before anything is written: the teachers (folders that are models, one vocabulary, the
language pair), the training file (readable, both languages), the student recipe with every option passed on to
`deepnmt train` (the config it would build, its position limit against the data's length limits, the export formats
it allows). docs/distillation.md describes the method and each decision.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import CommandLineError

STAGES: tuple[str, ...] = ("translate", "dataset", "train", "export")
MANIFEST_NAME = "distill.json"
DEFAULT_RECIPE = "student"
EXPORT_QUANTIZATION = "int8"
# Options of the student's `deepnmt train` that `deepnmt distill` sets itself: passing them is refused.
OWN_TRAIN_OPTIONS: tuple[str, ...] = ("--output_dir", "--tokenizer_name", "--model_name_or_path", "--model",
                                      "--resume_from_checkpoint", "--dataset_label", "--train_file",
                                      "--validation_file", "--test_file", "--source_lang", "--target_lang",
                                      "--recipe")


@dataclass
class DistillOptions:
    """What `deepnmt distill` was told (`hf_deepnmt_training.cli._distill` parses the command line)."""

    teachers: list[str]
    output_dir: str
    weights: list[float] | None = None
    combination: str = "mean"
    train_file: str | None = None  # default: the recipe's
    validation_file: str | None = None
    test_file: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None
    recipe: str = DEFAULT_RECIPE
    num_beams: int = 4
    batch_size: int = 32
    window: int = 10_000
    threads: int | None = None
    engine: str | None = None  # None: the fastest the (single) teacher folder has
    device: str | None = None  # where the teachers translate (`translate.translation_device`); None: auto
    keep_original_targets: bool = False
    export_formats: list[str] | None = None  # None: onnx, and ctranslate2 when the student is a standard Transformer
    train_argv: list[str] = field(default_factory=list)  # passed on to the student's `deepnmt train`


@dataclass(frozen=True)
class DistillPaths:
    """Where each stage writes, under ``--output_dir``."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST_NAME

    @property
    def translations(self) -> Path:
        return self.root / "distilled" / "translations.txt"

    @property
    def dataset(self) -> Path:
        return self.root / "distilled" / "train.jsonl"

    @property
    def student(self) -> Path:
        return self.root / "student"

    def export(self, export_format: str) -> Path:
        """The ONNX export inside the student's folder (its `handler.py` and `deepnmt serve` look there), the
        CTranslate2 export beside it."""
        return self.student / "onnx" if export_format == "onnx" else self.root / "student-ctranslate2"


@dataclass
class Plan:
    """The checked inputs of a run: resolved files and languages, the teachers' engine, the student's arguments."""

    options: DistillOptions
    paths: DistillPaths
    train_file: str
    source_lang: str
    target_lang: str
    engine: str
    export_formats: list[str]
    student_argv: list[str]
    settings: dict[str, Any]


@dataclass
class DistillOutcome:
    """What a `distill` run leaves behind: the folders, the manifest as this process last read or wrote it."""

    paths: DistillPaths
    manifest: dict[str, Any]
    ran: list[str]
    """The stages run by this invocation (the others were cached)."""


# ------------------------------------------------------------------------------------------------ checks
def _pairs_in_words(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{source} → {target}" for source, target in pairs)


def distillation_pair(options: DistillOptions, recorded: dict[str, list[tuple[str, str]]], data: dict[str, Any],
                      recipe_corpus: str | None) -> tuple[str, str]:
    """The language pair to distil: ``--source_lang`` / ``--target_lang`` where given, completed from the pair the
    teachers record (``recorded``: each teacher's pairs), else from the recipe's when its own corpus is distilled
    (``recipe_corpus``: that corpus, None when ``--train_file`` was given). One sentence, naming where each language
    came from, when a teacher translates another pair or several, when nothing names a pair, and when the recipe's
    corpus lacks a language of the pair (before 2026-11-28 the recipe's en → es was taken for the user's own data
    and a teacher of another pair was refused as "not --source_lang en → --target_lang es")."""
    source, target = options.source_lang, options.target_lang
    named = {name: pairs for name, pairs in recorded.items() if pairs}
    origin = {"source": "--source_lang", "target": "--target_lang"}
    if (source is None or target is None) and named:
        name, pairs = next(iter(named.items()))  # the first teacher that records a pair completes the given ones
        fitting = [pair for pair in pairs if source in (None, pair[0]) and target in (None, pair[1])]
        if len(fitting) != 1:
            given = " and ".join(f"--{side}_lang {value}" for side, value in (("source", source), ("target", target))
                                 if value is not None)
            raise CommandLineError(f"the teacher {name} translates {_pairs_in_words(pairs)}"
                                   + (f", not {given}; distil with teachers of the data's pair." if not fitting else
                                      "; give --source_lang and --target_lang to choose the pair to distil."))
        origin = {side: origin[side] if given is not None else f"{name}'s"
                  for side, given in (("source", source), ("target", target))}
        source, target = fitting[0]
    if (source is None or target is None) and recipe_corpus is not None:
        origin = {side: origin[side] if given is not None else f"the recipe {options.recipe!r}'s"
                  for side, given in (("source", source), ("target", target))}
        source, target = source or data.get("source_lang"), target or data.get("target_lang")
    if source is None or target is None:
        where = (f"the recipe {options.recipe!r} names no language pair" if recipe_corpus is not None
                 else f"the teachers record no language pair, and --train_file {options.train_file} is not the "
                      "recipe's corpus")
        raise CommandLineError(f"give --source_lang and --target_lang ({where}).")
    for name, pairs in named.items():
        if (source, target) not in pairs:
            hint = ("distil with teachers of the data's pair" if options.source_lang and options.target_lang else
                    "the teachers of an ensemble translate one pair")
            raise CommandLineError(f"the teacher {name} translates {_pairs_in_words(pairs)}, not {origin['source']} "
                                   f"{source} → {origin['target']} {target}; {hint}.")
    corpus_languages = {data.get("source_lang"), data.get("target_lang")}
    held = " and ".join(sorted(str(language) for language in corpus_languages))
    if recipe_corpus is not None and not {source, target} <= corpus_languages:
        raise CommandLineError(f"the pair to distil is {origin['source']} {source} → {origin['target']} {target}, "
                               f"and the recipe {options.recipe!r}'s corpus {recipe_corpus} holds {held}; pass "
                               "--train_file (with --validation_file and --test_file) in the pair's languages.")
    if not {source, target} <= corpus_languages:
        for flag in ("validation_file", "test_file"):
            if getattr(options, flag) is None and data.get(flag):
                raise CommandLineError(f"--{flag} defaults to the recipe {options.recipe!r}'s {data[flag]}, which "
                                       f"holds {held}, not the pair to distil, {source} → {target}; pass --{flag} "
                                       "in that pair.")
    return source, target


def plan_distillation(options: DistillOptions) -> Plan:
    """Check every input and resolve the run's settings; writes nothing. One sentence for: a teacher folder that
    does not translate the data's language pair, teachers that do not share a vocabulary, a training file that
    cannot be read, a student recipe or option that `deepnmt train` would refuse or that does not fit the data,
    an export format the student cannot have, a ``--device`` this machine lacks or one given to an exported
    engine."""
    from transformers import AutoTokenizer

    from hf_deepnmt.ensemble import check_same_tokens

    from .data import DataError, iter_local_pairs
    from .errors import hub_lookup
    from .recipes import load_recipe, resolve_path
    from .translate import translation_device

    device = translation_device(options.device)  # a device this machine lacks: refused before anything is written
    _refuse_own_train_options(options.train_argv)
    recipe = load_recipe(options.recipe)
    data = recipe["data"]
    train_file = options.train_file or data.get("train_file")
    if not train_file:
        raise CommandLineError(f"no training data: pass --train_file (the recipe {options.recipe!r} names none).")
    train_file = str(resolve_path(train_file))
    validation_file = options.validation_file or data.get("validation_file")
    test_file = options.test_file or data.get("test_file")

    # the teachers: translate this pair, share one vocabulary
    recorded = _teacher_language_pairs(options.teachers)
    source_lang, target_lang = distillation_pair(options, recorded, data, train_file if options.train_file is None
                                                 else None)
    with hub_lookup(options.teachers[0]):
        tokenizers = [AutoTokenizer.from_pretrained(teacher) for teacher in options.teachers]
    if len(tokenizers) > 1:
        check_same_tokens(tokenizers, list(options.teachers))
    engine = _teacher_engine(options, device)

    # the training file: readable, with both languages, not empty
    try:
        next(iter_local_pairs(Path(train_file), source_lang, target_lang))
    except StopIteration:
        raise DataError(f"{train_file} holds no sentence pair to distil.") from None

    # the student: what `deepnmt train` would build from the recipe and the options passed on
    paths = DistillPaths(Path(options.output_dir))
    student_argv = ["--recipe", options.recipe, *options.train_argv, "--train_file", str(paths.dataset),
                    "--source_lang", source_lang, "--target_lang", target_lang,
                    "--tokenizer_name", options.teachers[0], "--output_dir", str(paths.student),
                    "--dataset_label", distillation_label(options, train_file)]
    for flag, value in (("--validation_file", validation_file), ("--test_file", test_file)):
        if value:
            student_argv += [flag, str(resolve_path(value))]
    formats = _student_export_formats(options, student_argv, tokenizers[0])

    settings = {
        "teachers": [str(Path(teacher).resolve()) if Path(teacher).exists() else teacher
                     for teacher in options.teachers],
        "weights": options.weights, "combination": options.combination, "engine": engine,
        "num_beams": options.num_beams, "train_file": train_file, "source_lang": source_lang,
        "target_lang": target_lang, "keep_original_targets": options.keep_original_targets,
        "recipe": options.recipe, "validation_file": validation_file, "test_file": test_file,
        "student_options": list(options.train_argv), "export": formats, "quantization": EXPORT_QUANTIZATION,
    }
    return Plan(options, paths, train_file, source_lang, target_lang, engine, formats, student_argv, settings)


def _refuse_own_train_options(train_argv: Sequence[str]) -> None:
    """One sentence for a student training option that distill sets itself (`OWN_TRAIN_OPTIONS`)."""
    for token in train_argv:
        flag = token.partition("=")[0]
        if flag in OWN_TRAIN_OPTIONS:
            raise CommandLineError(f"`{flag}` is not allowed among the student's training options: deepnmt distill "
                                   "sets it itself (the distilled data, the teachers' tokenizer, "
                                   "OUTPUT_DIR/student); give distill's own options (deepnmt distill --help).")


def _teacher_language_pairs(teachers: Sequence[str]) -> dict[str, list[tuple[str, str]]]:
    """The language pairs each teacher records (a model folder or Hub id: its config; an export folder: its
    manifest); model teachers that cannot form one ensemble are refused (`check_compatible`)."""
    from transformers import AutoConfig

    import hf_deepnmt
    from hf_deepnmt.ensemble import check_compatible

    from .arguments import saved_language_pairs
    from .errors import hub_lookup

    configs, names = [], []
    for teacher in teachers:
        if (Path(teacher) / "config.json").is_file() or not Path(teacher).exists():
            with hub_lookup(teacher):
                configs.append(AutoConfig.from_pretrained(teacher))
            names.append(teacher)
    if len(configs) > 1:
        check_compatible(configs, names)
    recorded = {name: hf_deepnmt.recorded_language_pairs(config) for config, name in zip(configs, names)}
    for teacher in teachers:
        if teacher not in recorded:  # an export folder: the pair its manifest records
            recorded[teacher] = saved_language_pairs(teacher) or []
    return recorded


def _teacher_engine(options: DistillOptions, device: Any) -> str:
    """The engine the teachers translate with: torch for an ensemble, else `choose_engine`'s; a --device an
    exported engine cannot use is refused."""
    from .serve import choose_engine

    if len(options.teachers) > 1:
        if options.engine not in (None, "torch"):
            raise CommandLineError(f"`--engine` = {options.engine!r} is not allowed for {len(options.teachers)} "
                                   "teachers: an ensemble runs on torch (its members are combined at every step).")
        return "torch"
    engine = choose_engine(options.teachers[0], options.engine, cuda=device.type == "cuda", command="distill")[0]
    if engine != "torch" and device.type != "cpu" and options.device not in (None, "auto"):
        raise CommandLineError(f"`--device` = {options.device!r} runs the torch engine only, and the teacher "
                               f"{options.teachers[0]} is run by the {engine} engine, on the CPU here; use "
                               "--engine torch with the model folder, or --device cpu.")
    return engine


def _student_export_formats(options: DistillOptions, student_argv: list[str], tokenizer: Any) -> list[str]:
    """The student's export formats (--export, or onnx and ctranslate2 when CTranslate2 can express the student
    `deepnmt train` would build from ``student_argv``); --export ctranslate2 for a student it cannot is refused."""
    from transformers import AutoConfig

    from hf_deepnmt.export import export_blockers

    from .build import new_model_config
    from .train_arguments import parse_train_args

    model_args, data_args, training_args, student_recipe = parse_train_args(student_argv)
    if model_args.model_name_or_path is None:
        config = new_model_config(model_args, data_args, student_recipe["model"], tokenizer,
                                  training_args.label_smoothing_factor)
    else:
        config = AutoConfig.from_pretrained(model_args.model_name_or_path)
    blocked = export_blockers(config, "ctranslate2")
    formats = options.export_formats
    if formats is None:
        formats = ["onnx"] + ([] if blocked else ["ctranslate2"])
    elif "ctranslate2" in formats and blocked:
        raise CommandLineError(f"`--export ctranslate2` is not allowed for the student of recipe {options.recipe!r}: "
                               f"CTranslate2 cannot express {blocked[0]}; use --export onnx.")
    return formats


def distillation_label(options: DistillOptions, train_file: str) -> str:
    """How the student's card names its training data."""
    kind = "ensemble" if len(options.teachers) > 1 else "teacher"
    originals = " and the original targets" if options.keep_original_targets else ""
    return (f"sequence-level distillation data (Kim & Rush 2016): the sources of {train_file} with the beam-"
            f"{options.num_beams} translations of the {kind} {', '.join(options.teachers)}{originals}")


# ------------------------------------------------------------------------------------------------ the manifest
def read_manifest(paths: DistillPaths) -> dict[str, Any] | None:
    if not paths.manifest.is_file():
        return None
    try:
        return json.loads(paths.manifest.read_text(encoding="utf-8"))
    except ValueError:
        raise CommandLineError(f"{paths.manifest} is not readable JSON; it is written atomically by deepnmt distill, "
                               "so something else changed it: choose a new --output_dir.") from None


def write_manifest(paths: DistillPaths, manifest: dict[str, Any]) -> None:
    from .translate import write_atomically

    write_atomically(paths.manifest, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")


def check_settings(paths: DistillPaths, recorded: dict[str, Any], settings: dict[str, Any]) -> None:
    """A folder is resumed with the settings it was started with, or refused in one sentence naming the first one
    that differs."""
    for key, value in settings.items():
        if recorded.get(key) != value:
            raise CommandLineError(f"{paths.root} was distilled with {key} = {recorded.get(key)!r}, not {value!r}; "
                                   "rerun with its settings to resume it, or choose a new --output_dir.")


def wait_for_stage(paths: DistillPaths, stage: str, poll_seconds: float = 1.0) -> dict[str, Any]:
    """Processes other than rank 0 wait until rank 0 has recorded ``stage`` as complete."""
    while True:
        manifest = read_manifest(paths)
        if manifest is not None and stage in manifest.get("completed", {}):
            return manifest
        time.sleep(poll_seconds)


# ------------------------------------------------------------------------------------------------ the stages
def stage_translate(plan: Plan, shard: Any) -> dict[str, Any]:
    """The teachers' beam-``num_beams`` translation of every source of the training file, one line per record, in
    file order; continued after the complete lines of an interrupted run; shared by the launcher's processes."""
    from tqdm.auto import tqdm

    from .translate import load_translation_engine, training_file_sources, translate_corpus

    options = plan.options
    engine, tokenizer, described = load_translation_engine(options.teachers, plan.engine, options.threads,
                                                           weights=options.weights, combination=options.combination,
                                                           command="distill", device=options.device)
    plan.paths.translations.parent.mkdir(parents=True, exist_ok=True)
    if shard.rank == 0:
        print(f"[deepnmt] distill: translating the sources of {plan.train_file} with {described}, beam "
              f"{options.num_beams}", file=sys.stderr)
    lines = training_file_sources(plan.train_file, plan.source_lang, plan.target_lang)
    with tqdm(unit="line", desc="distilling", file=sys.stderr, disable=shard.rank != 0) as bar:
        result = translate_corpus(engine, tokenizer, lines, plan.paths.translations, resume=True, shard=shard,
                                  window=options.window, batch_size=options.batch_size, progress=bar,
                                  num_beams=options.num_beams)
    return {"engine": described, "translated_now": result.translated, "resumed_after": result.resumed_from}


def distilled_records(plan: Plan) -> Iterator[tuple[str, dict[str, int]]]:
    """The lines of the distilled training set (run_translation JSON) with running counts: each training record with
    a non-empty source and translation becomes (source, teachers' translation) and, with
    ``--keep_original_targets``, also (source, original target); records with an empty side are dropped."""
    import itertools

    from .data import iter_local_pairs

    counts = {"records": 0, "distilled": 0, "original": 0, "dropped_empty": 0, "same_as_original": 0}
    source_lang, target_lang = plan.source_lang, plan.target_lang
    with open(plan.paths.translations, encoding="utf-8") as translations:
        pairs = iter_local_pairs(Path(plan.train_file), source_lang, target_lang)
        for pair, line in itertools.zip_longest(pairs, translations):
            if pair is None or line is None:
                raise CommandLineError(f"{plan.paths.translations} does not hold one line per record of "
                                       f"{plan.train_file} (it ends {'after' if pair is None else 'before'} it); the "
                                       "training file changed since it was translated: choose a new --output_dir.")
            counts["records"] += 1
            source, original, hypothesis = pair[0], pair[1], line.rstrip("\n")
            if not source or not hypothesis:
                counts["dropped_empty"] += 1
                continue
            counts["distilled"] += 1
            counts["same_as_original"] += hypothesis == original
            yield json.dumps({"translation": {source_lang: source, target_lang: hypothesis}},
                             ensure_ascii=False) + "\n", counts
            if plan.options.keep_original_targets and original:
                counts["original"] += 1
                yield json.dumps({"translation": {source_lang: source, target_lang: original}},
                                 ensure_ascii=False) + "\n", counts


def stage_dataset(plan: Plan) -> dict[str, Any]:
    """Write the distilled training set (`distilled_records`) beside its final name and rename it into place."""
    final = plan.paths.dataset
    staging = final.with_name(f".{final.name}.partial")
    counts: dict[str, int] = {}
    with open(staging, "w", encoding="utf-8") as handle:
        for line, counts in distilled_records(plan):
            handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())
    if not counts.get("distilled"):
        staging.unlink(missing_ok=True)
        raise CommandLineError(f"the teachers translated none of the sources of {plan.train_file} into a non-empty "
                               "sentence; nothing to train a student on.")
    os.replace(staging, final)
    counts = dict(counts)
    counts["pairs"] = counts["distilled"] + counts["original"]
    print(f"[deepnmt] distill: {final} holds {counts['pairs']:,} pairs ({counts['distilled']:,} distilled"
          + (f", {counts['original']:,} original" if plan.options.keep_original_targets else "")
          + f"; {counts['dropped_empty']:,} records dropped for an empty side)", file=sys.stderr)
    return counts


def stage_train(plan: Plan, shard: Any, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """``deepnmt train`` of the student on the distilled set, continued from its newest complete checkpoint; then
    (rank 0) the card names the teachers and the distillation data. Returns the test scores (rank 0)."""
    from .checkpoints import last_checkpoint
    from .train import train

    student = plan.paths.student
    argv = list(plan.student_argv)
    if last_checkpoint(student):
        argv += ["--resume_from_checkpoint", "last"]
        if shard.rank == 0:
            print(f"[deepnmt] distill: continuing the student from {last_checkpoint(student)}", file=sys.stderr)
    elif (student / "model.safetensors").exists():
        if shard.world > 1:
            raise CommandLineError(f"{student} holds a trained student but no checkpoint to continue from, and its "
                                   "stage was not completed; remove the folder to train the student again.")
        print(f"[deepnmt] distill: {student} holds an unfinished student without checkpoints; training it again",
              file=sys.stderr)
        shutil.rmtree(student)
    outcome = train(argv)
    if not outcome.trainer.is_world_process_zero():
        return None
    describe_distillation(plan, manifest)
    scores = outcome.test_scores
    return {"steps": outcome.trainer.state.global_step,
            "test": None if scores is None else {**scores.as_dict(), "sentences": scores.num_sentences}}


def describe_distillation(plan: Plan, manifest: dict[str, Any]) -> None:
    """The student's card and metrics name its teachers and its distillation data."""
    from hf_deepnmt_model_cards import EvalRow, write_model_card

    options, student = plan.options, plan.paths.student
    stored = json.loads((student / "deepnmt_card.json").read_text(encoding="utf-8"))
    counts = manifest["completed"]["dataset"]
    ensemble = (f" (an ensemble, {options.combination} of the probabilities" if options.combination == "mean"
                else f" (an ensemble, {options.combination} combination") if len(options.teachers) > 1 else ""
    weights = f", weights {', '.join(f'{weight:g}' for weight in options.weights)})" if (
        ensemble and options.weights) else (")" if ensemble else "")
    stored["training"]["teachers"] = ", ".join(options.teachers) + ensemble + weights
    stored["training"]["distillation data"] = (
        f"{counts['pairs']:,} pairs in {plan.paths.dataset}: the {counts['distilled']:,} sources of {plan.train_file} "
        f"with the teachers' beam-{options.num_beams} translations (run by "
        f"{manifest['completed']['translate']['engine']})"
        + (f", and {counts['original']:,} original targets beside them" if options.keep_original_targets else "")
        + f"; {counts['dropped_empty']:,} records dropped for an empty side; {counts['same_as_original']:,} "
        "translations equal their original target")
    (student / "deepnmt_card.json").write_text(json.dumps(stored, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    stored["results"] = [EvalRow(**row) for row in stored.get("results", [])]
    write_model_card(student, **stored)
    metrics_path = student / "metrics.json"
    metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
    metrics["distillation"] = {"teachers": list(options.teachers), "weights": options.weights,
                               "combination": options.combination, "num_beams": options.num_beams,
                               "train_file": plan.train_file, "dataset": str(plan.paths.dataset), **counts}
    metrics_path.write_text(json.dumps(metrics, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def stage_export(plan: Plan) -> dict[str, Any]:
    """The student in every export format of the plan (int8), each written to a staging folder and renamed into
    place when complete; a folder left by a killed export (staging or final: this stage was not recorded) is
    removed first."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_deepnmt.export import export_model

    student = plan.paths.student
    written = {}
    for export_format in plan.export_formats:
        final = plan.paths.export(export_format)
        staging = final.with_name(f".{final.name}.incomplete")
        for leftover in (staging, final):
            shutil.rmtree(leftover, ignore_errors=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(student)  # afresh: an export may change the model it is given
        tokenizer = AutoTokenizer.from_pretrained(student)
        export_model(model, tokenizer, staging, export_format, EXPORT_QUANTIZATION)
        os.replace(staging, final)
        written[export_format] = str(final)
        print(f"[deepnmt] distill: wrote the student's {export_format} export ({EXPORT_QUANTIZATION}) to {final}",
              file=sys.stderr)
    return written


# ------------------------------------------------------------------------------------------------ the run
def distill(options: DistillOptions, poll_seconds: float = 1.0) -> DistillOutcome:
    """Run every stage that ``OUT/distill.json`` does not record as complete, in order (module docstring)."""
    from .translate import Shard

    plan = plan_distillation(options)
    paths, shard = plan.paths, Shard.from_environment()
    if shard.rank == 0:
        manifest = read_manifest(paths)
        if manifest is None:
            if paths.root.exists() and any(paths.root.iterdir()):
                raise CommandLineError(f"--output_dir {paths.root} holds files but no {MANIFEST_NAME}; deepnmt "
                                       "distill resumes only its own folders: choose a new --output_dir.")
            paths.root.mkdir(parents=True, exist_ok=True)
            manifest = {"settings": plan.settings, "completed": {}}
            write_manifest(paths, manifest)
        else:
            check_settings(paths, manifest["settings"], plan.settings)
    else:
        while (manifest := read_manifest(paths)) is None:
            time.sleep(poll_seconds)
        check_settings(paths, manifest["settings"], plan.settings)
    ran = []
    for stage in STAGES:
        if stage in manifest["completed"]:
            if shard.rank == 0:
                print(f"[deepnmt] distill: stage {stage} is complete (cached in {paths.root})", file=sys.stderr)
            continue
        if stage in ("dataset", "export") and shard.rank != 0:
            if stage == "export":
                break  # rank 0 exports; the other processes are done
            manifest = wait_for_stage(paths, stage, poll_seconds)
            continue
        started = time.time()
        if stage == "translate":
            info = stage_translate(plan, shard)
            if shard.rank != 0:
                ran.append(stage)
                continue  # rank 0 merges the shares and records the stage
        elif stage == "dataset":
            info = stage_dataset(plan)
        elif stage == "train":
            info = stage_train(plan, shard, manifest)
            if shard.rank != 0:
                ran.append(stage)
                break
        else:
            info = stage_export(plan)
        info = {**(info or {}), "seconds": round(time.time() - started, 1)}
        manifest["completed"][stage] = info
        write_manifest(paths, manifest)
        ran.append(stage)
    return DistillOutcome(paths, manifest, ran)


def summary(outcome: DistillOutcome) -> str:
    """What `deepnmt distill` prints at the end: the folders, the student's test score and how to use it."""
    paths, completed = outcome.paths, outcome.manifest["completed"]
    test = completed.get("train", {}).get("test")
    lines = ["", f"deepnmt distill finished -> {paths.root} (ran: {', '.join(outcome.ran) or 'nothing, all cached'})",
             f"distilled data: {paths.dataset} ({completed['dataset']['pairs']:,} pairs)",
             f"student: {paths.student}" + (f"  test BLEU {test['bleu']}  chrF {test['chrf']}  ({test['sentences']} "
                                            "sentences)" if test else "")]
    for export_format, folder in completed.get("export", {}).items():
        if export_format != "seconds":
            lines.append(f"{export_format} int8: {folder}   deepnmt translate --model {folder} --input FILE")
    lines.append(f"serve:   deepnmt serve {paths.student}   (ONNX Runtime on a CPU: its onnx/ export)")
    return "\n".join(lines)

