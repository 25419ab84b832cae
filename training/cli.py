"""`deepnmt`: the command line of hf_deepnmt.

    deepnmt quickstart            train + evaluate a deep Transformer on the embedded corpus (the main job)
    deepnmt train ...             train any model (run_translation arguments, --recipe, --max_tokens, ...)
    deepnmt evaluate ...          BLEU / chrF / TER of a saved model on a test file, with beam search
    deepnmt diagnose ...          does a saved model use its source? (li2022 collapse monitor, per-layer attention)
    deepnmt translate ...         translate a file or stdin, batched, to stdout (torch, CTranslate2 or ONNX Runtime)
    deepnmt export ...            export a model to CTranslate2, ONNX or a stock MarianMTModel (fast inference)
    deepnmt convert SRC OUT       a public checkpoint (OPUS-MT/Marian, FSMT, fairseq) as a model of hf_deepnmt
    deepnmt distill --teachers    teachers -> distilled training set -> shallow-decoder student -> int8 export
    deepnmt serve MODEL_DIR...    an HTTP translation server with dynamic batching (POST /, LibreTranslate's API)
    deepnmt push DIR --repo_id    upload model + tokenizer + code + pipeline + card to the Hub
    deepnmt average-checkpoints   average the weights of a run's last N checkpoints (liu2020: last 10)

`deepnmt <command> --help` documents every option. A mistake in what you passed is one sentence (exit status 2);
anything else shows its traceback. Set DEEPNMT_DEBUG=1 for tracebacks of the one-sentence errors too.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from typing import Any

# Only the standard library and the light modules below at import time: `deepnmt --help` and every
# `deepnmt <command> --help` answer without loading torch or transformers (each command imports what it needs after
# its arguments are parsed; tests/test_cli.py checks sys.modules).
from .arguments import (
    ENGINES,
    EXPORT_FORMATS,
    OPTION_ALIASES,
    QUANTIZATIONS,
    SEVERAL_MODEL_COMMANDS,
    TRAIN_ALIASES,
    CommandParser,
    add_device_option,
    add_ensemble_options,
    add_language_options,
    add_model_argument,
    add_model_option,
    canonical_options,
    model_argument,
    quiet_libraries,
    require_modules,
    resolve_language_pair,
    saved_language_pairs,
    underscored,
)
from .clock import RunClock
from .errors import CommandLineError, NonFiniteLossError, hub_lookup, is_user_mistake

EMBEDDED_TEST = "corpus:web-sparv/test.jsonl.gz"  # the embedded corpus' test books (English → Spanish)
COMMANDS = ("quickstart", "train", "evaluate", "diagnose", "translate", "export", "convert", "distill", "serve",
            "push", "average-checkpoints")

def _top_level_help() -> str:
    return __doc__.split("\n\n", 1)[1]


def _evaluate_parser() -> CommandParser:
    """The options of `deepnmt evaluate`."""
    parser = CommandParser(prog="deepnmt evaluate", description="Score a saved model on a test file "
                           "(BLEU, chrF, TER with sacreBLEU signatures) using beam search.")
    add_model_argument(parser, "Saved model folder (or Hub id), or a folder written by `deepnmt export` (scored "
                       "by its engine); several folders are scored as one ensemble (the tokenizer is the first "
                       "folder's)", several=True)
    add_ensemble_options(parser)
    parser.add_argument("--engine", choices=ENGINES, default=None, help="What runs the model, as for `deepnmt "
                        "translate` (default: an export folder's own engine — ctranslate2, onnx, or torch for a "
                        "marian export — and torch for a model folder; --engine onnx scores a model folder's ONNX "
                        "export in onnx/). Source reliance needs the torch model and is measured on torch only.")
    parser.add_argument("--threads", type=int, default=None, help="Intra-op threads of the engine (default: torch's "
                        "default thread count).")
    parser.add_argument("--test_file", required=True, help="Test data: .jsonl/.json/.tsv, a PREFIX of "
                        "PREFIX.<lang> files, or corpus:web-sparv/test.jsonl.gz (the embedded corpus).")
    add_language_options(parser, "of --test_file")
    parser.add_argument("--num_beams", type=int, default=4, help="Beam size (default: 4).")
    parser.add_argument("--batch_size", type=int, default=32, help="Sentences per generate() call (default: 32).")
    parser.add_argument("--max_samples", type=int, default=None, help="Score only the first N pairs.")
    parser.add_argument("--output_json", default=None, help="Also write the scores and signatures to this file.")
    parser.add_argument("--hypotheses", default=None, help="Also write the translations, one per line, here.")
    add_device_option(parser, "scores")
    parser.add_argument("--reliance_pairs", type=int, default=64, help="Pairs on which to measure source reliance, "
                        "the mean per-token KL between predictions with the real and an all-<unk> source (li2022 "
                        "collapse monitor; default: 64).")
    return parser


def _evaluate(argv: Sequence[str]) -> int:
    parser = _evaluate_parser()
    args = parser.parse_args(argv)
    model_of(parser, args, needs_tokenizer=True)
    if args.num_beams < 1 or args.batch_size < 1 or args.reliance_pairs < 1:
        parser.error("--num_beams, --batch_size and --reliance_pairs must be ≥ 1.")
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads {args.threads} is not allowed; use 1 or more")
    check_ensemble_options(args, parser)
    languages_of(args, required=True)
    engine_name = args.engine
    if engine_name is None and not (Path(args.model[0]).expanduser() / "deepnmt_export.json").is_file():
        engine_name = "torch"  # a model folder is scored as trained (its onnx/ export: --engine onnx)
    from .data import read_parallel_file
    from .recipes import resolve_path
    from .translate import corpus_source_reliance, evaluate_model, load_translation_engine

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    quiet_libraries()
    engine, tokenizer, described = load_translation_engine(args.model, engine_name, args.threads, False,
                                                           args.weights, args.combination, command="evaluate",
                                                           device=args.device)
    from hf_deepnmt.export import OnnxEngine, TorchEngine

    torch_model = isinstance(engine, TorchEngine) and not isinstance(engine, OnnxEngine)
    model = engine.model if torch_model else None  # the torch model, on which source reliance is measured
    if model is not None:
        languages_of(args, required=True, model=model)
    corpus = read_parallel_file(resolve_path(args.test_file), args.source_lang, args.target_lang, args.max_samples)
    scores, hypotheses = evaluate_model(args.model[0], args.test_file, args.source_lang, args.target_lang,
                                        num_beams=args.num_beams, batch_size=args.batch_size,
                                        max_samples=args.max_samples, model=engine, tokenizer=tokenizer,
                                        corpus=corpus)
    reliance = (corpus_source_reliance(model, tokenizer, corpus.sources, corpus.targets, args.reliance_pairs)
                if model is not None else None)
    _report_evaluation(args, scores, hypotheses, reliance, model, described, len(corpus.sources))
    return 0


def _report_evaluation(args: Any, scores: Any, hypotheses: list[str], reliance: float | None, model: Any,
                       described: str, test_pairs: int) -> None:
    """Print `deepnmt evaluate`'s scores, source reliance and signatures; write --output_json and --hypotheses."""
    report = {**scores.as_dict(), "sentences": scores.num_sentences, "num_beams": args.num_beams,
              "engine": described, "source_reliance": None if reliance is None else round(reliance, 4),
              "signatures": scores.signatures}
    if len(args.model) > 1:
        report["ensemble"] = {"models": list(args.model), "weights": model.config.weights,
                              "combination": args.combination}
        print(f"an ensemble of {len(args.model)} models ({args.combination}, weights "
              f"{', '.join(f'{weight:g}' for weight in model.config.weights)})")
    print(f"BLEU {scores.bleu}  chrF {scores.chrf}  TER {scores.ter}  ({scores.num_sentences} sentences, "
          f"beam {args.num_beams}, {described})")
    if reliance is None:
        print("source reliance: not measured (it needs the torch model; score the model folder with --engine torch "
              "for it)")
    else:
        print(f"source reliance {reliance:.4f} nats/token on {min(args.reliance_pairs, test_pairs)} pairs "
              "(li2022 collapse monitor: ≈ 0 means the decoder ignores the source)")
    for name, signature in scores.signatures.items():
        print(f"  {name}: {signature}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.hypotheses:
        Path(args.hypotheses).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")


def _diagnose(argv: Sequence[str]) -> int:
    parser = CommandParser(prog="deepnmt diagnose", description="Tell a collapsed or stalled model from a "
                           "healthy one: source reliance (li2022's collapse monitor), and per decoder layer "
                           "the cross-attention share ‖CrossAttn(h)‖/‖h‖ and its attention entropy.")
    add_model_argument(parser, "Saved model folder (or Hub id)")
    parser.add_argument("--test_file", default=None, help="Sentence pairs to measure on (any format `deepnmt "
                        f"evaluate` reads; default: the embedded corpus' test books, {EMBEDDED_TEST}, for an "
                        "English→Spanish model).")
    add_language_options(parser, "of --test_file")
    parser.add_argument("--pairs", type=int, default=64, help="Sentence pairs to use (default: 64).")
    parser.add_argument("--output_json", default=None, help="Also write the measurements to this file.")
    args = parser.parse_args(argv)
    model_of(parser, args, needs_tokenizer=True)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs} is not allowed; use 1 or more.")
    embedded_pair = ("en", "es") if args.test_file is None else None  # the embedded corpus' languages
    languages_of(args, required=args.test_file is not None, default=embedded_pair)
    from .data import read_parallel_file
    from .diagnose import diagnose
    from .recipes import resolve_path

    model, tokenizer = load_model_and_tokenizer(args.model)
    if not hasattr(model.get_decoder(), "layers"):
        raise CommandLineError(f"deepnmt diagnose: {args.model} is a {model.config.model_type} model; the "
                               "per-layer cross-attention measurements need a Transformer of this package.")
    languages_of(args, required=args.test_file is not None, model=model, default=embedded_pair)
    if args.test_file is None:
        if (args.source_lang, args.target_lang) != embedded_pair:
            raise CommandLineError(f"{args.model} translates {args.source_lang} → {args.target_lang}, and the "
                                   f"default --test_file, the embedded corpus, is English → Spanish; pass --test_file "
                                   "with sentence pairs in the model's languages.")
        args.test_file = EMBEDDED_TEST
    corpus = read_parallel_file(resolve_path(args.test_file), args.source_lang, args.target_lang, args.pairs)
    result = diagnose(model, tokenizer, corpus.sources, corpus.targets, args.pairs)
    print(result.report())
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(result.as_dict(), indent=2) + "\n", encoding="utf-8")
    return 0


def _translate_parser() -> CommandParser:
    """The options of `deepnmt translate`."""
    parser = CommandParser(prog="deepnmt translate", description="Translate one sentence per line from a file or "
                           "stdin to stdout (batched, beam search), or the source side of a training file "
                           "(--input_format); several --model folders translate as one ensemble. Under "
                           "torchrun / accelerate launch each process translates a strided share and the output "
                           "keeps the input's order.")
    add_model_argument(parser, "Saved model folder (or Hub id); with --engine ctranslate2 or onnx, a folder written "
                       "by `deepnmt export --format ENGINE` (or a model folder holding an ONNX export in onnx/). "
                       "Several folders: an ensemble of models sharing one vocabulary (torch engine; the tokenizer "
                       "is the first folder's)", several=True)
    add_ensemble_options(parser)
    parser.add_argument("--engine", choices=ENGINES, default=None, help="What runs the model (default: the fastest "
                        "the folder has: an export folder's own engine; a model folder's ONNX export in onnx/ when "
                        "no GPU is visible; else torch `generate`). The same batching, and the same output up to "
                        "float32 rounding at exact ties (an int8 export is its own model) — for ctranslate2, when "
                        "the model's generation config has early_stopping=true, the default of models trained with "
                        "this package (CTranslate2 always stops a sentence once num_beams hypotheses have finished; "
                        "docs/fast-inference.md).")
    parser.add_argument("--input", default="-", help="Input file, one sentence per line (default: stdin), or a "
                        "training file whose source side is translated (--input_format).")
    parser.add_argument("--input_format", choices=INPUT_FORMATS, default="auto", help="text: one sentence per line; "
                        "parallel: a training file as `deepnmt train` reads it — .jsonl/.json (run_translation), "
                        ".tsv, or the PREFIX of PREFIX.<source_lang>/PREFIX.<target_lang> (corpus:web-sparv/"
                        "train.jsonl.gz: the embedded corpus) — whose sources are translated, one output line per "
                        "record in file order (needs --source_lang and --target_lang); auto (default): parallel for "
                        ".jsonl/.json(.gz) files and for a PREFIX, text otherwise (a .tsv training file needs "
                        "--input_format parallel).")
    add_language_options(parser, "of the input (checked against the model's pair; the model has one direction, so "
                         "they never change the translation); a parallel input's side to translate and its other side")
    parser.add_argument("--output", default="-", help="Output file (default: stdout).")
    parser.add_argument("--max_samples", type=int, default=None, help="Translate only the first N input sentences.")
    parser.add_argument("--num_beams", type=int, default=4, help="Beam size (default: 4).")
    parser.add_argument("--batch_size", type=int, default=32, help="Sentences per batch (default: 32).")
    parser.add_argument("--max_new_tokens", type=int, default=None,
                        help="Longest translation in tokens (default: 1.5 × source length + 10).")
    parser.add_argument("--stream", action="store_true", help="Translate --batch_size lines at a time and write "
                        "each batch's translations at once (pipes, interactive use); same as --window BATCH_SIZE.")
    parser.add_argument("--window", type=int, default=10_000, help="Lines read, sorted by length into batches and "
                        "translated at a time (default: 10000): memory stays bounded however long the input; the "
                        "output keeps the input's order.")
    parser.add_argument("--resume", action="store_true", help="Continue an interrupted run: keep the complete lines "
                        "already in --output and translate the input from the next line on (needs --output FILE); "
                        "under a launcher, each process continues its part (same number of processes).")
    parser.add_argument("--bf16", action="store_true", help="torch engine: run under bfloat16 autocast (CPU or "
                        "GPU); see benchmarks/RESULTS.md for its speed and BLEU on this project's CPU.")
    parser.add_argument("--threads", type=int, default=None, help="Intra-op threads of the engine, per process "
                        "(default: torch's default thread count).")
    add_device_option(parser)
    return parser


def _check_translate_args(parser: CommandParser, args: Any) -> tuple[bool, Any]:
    """Refuse `deepnmt translate` options that do not fit together; whether --input is a training file, and this
    process's share (`shard_from_environment`)."""
    model_of(parser, args, needs_tokenizer=True)
    for name in ("num_beams", "batch_size", "window", "threads", "max_new_tokens", "max_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} {value} is not allowed; use 1 or more")
    check_ensemble_options(args, parser)
    languages_of(args, required=False)  # the model's recorded pair completes --source_lang/--target_lang
    training_file = parallel_input(args.input, args.input_format, args.source_lang)
    if training_file and args.input == "-":
        parser.error("--input_format parallel reads a training file: give it as --input FILE")
    if training_file and not (args.source_lang and args.target_lang):
        parser.error(f"the training file {args.input} is read with both --source_lang and --target_lang (the side "
                     "to translate and the other; the model records no language pair)")
    if args.input != "-" and not training_file and not Path(args.input).is_file():
        parser.error(f"--input {args.input} does not exist")
    if args.resume and args.output == "-":
        parser.error("--resume needs --output FILE (the lines already translated are read from it)")
    shard = shard_from_environment()
    if shard.world > 1 and (args.output == "-" or args.input == "-" or args.stream):
        parser.error(f"{shard.world} processes translate shares of one --input FILE into one --output FILE (no "
                     "stdin, stdout or --stream)")
    return training_file, shard


def _translate(argv: Sequence[str]) -> int:
    parser = _translate_parser()
    args = parser.parse_args(argv)
    training_file, shard = _check_translate_args(parser, args)
    import torch

    from .translate import load_translation_engine

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    quiet_libraries()
    engine, tokenizer, described = load_translation_engine(args.model, args.engine, args.threads, args.bf16,
                                                           args.weights, args.combination, device=args.device)
    if shard.rank == 0:
        print(f"[deepnmt] translating with {described}", file=sys.stderr)
    if hasattr(engine, "model"):  # torch: a Hub id's pair is known once its config is loaded
        languages_of(args, required=False, model=engine.model)
    resumed, translated = _write_translations(args, engine, tokenizer, training_file, shard)
    if not translated and shard.world == 1:
        source = "stdin" if args.input == "-" else args.input
        print(f"[deepnmt] translate: {source} has no {'more ' if resumed else ''}lines to translate; nothing was "
              "written.", file=sys.stderr)
    return 0


def _open_translation_input(args: Any, training_file: bool, files: contextlib.ExitStack) -> Iterable[str]:
    """The lines `deepnmt translate` reads: a training file's sources, stdin or --input, cut at --max_samples."""
    from .recipes import resolve_path
    from .translate import training_file_sources

    if training_file:
        lines = training_file_sources(resolve_path(args.input), args.source_lang, args.target_lang)
    else:
        lines = sys.stdin if args.input == "-" else files.enter_context(open(args.input, encoding="utf-8"))
    if args.max_samples is not None:
        lines = itertools.islice(lines, args.max_samples)
    return lines


def _count_input_lines(args: Any, training_file: bool, shard: Any) -> int | None:
    """How many lines the progress bar of `deepnmt translate` counts to (None: unknown)."""
    total = None
    if args.input != "-" and not training_file and shard.world == 1:
        with open(args.input, "rb") as handle:
            total = sum(1 for _ in handle)  # for the progress bar; a cheap pass over the bytes
        total = min(total, args.max_samples or total)
    return total


def _write_translations(args: Any, engine: Any, tokenizer: Any, training_file: bool, shard: Any) -> tuple[int, int]:
    """Translate the input into --output (`translate_corpus`) or to stdout; the lines resumed from and translated."""
    from tqdm.auto import tqdm

    from .translate import translate_corpus, translate_windows

    window = args.batch_size if args.stream else args.window
    options = dict(num_beams=args.num_beams, max_new_tokens=args.max_new_tokens)
    with contextlib.ExitStack() as files:
        lines = _open_translation_input(args, training_file, files)
        total = _count_input_lines(args, training_file, shard)
        bar = files.enter_context(tqdm(total=total, unit="line", desc="translating", file=sys.stderr,
                                       disable=args.input == "-" or args.stream or shard.rank != 0))
        if args.output != "-":
            result = translate_corpus(engine, tokenizer, lines, args.output, resume=args.resume, shard=shard,
                                      window=window, batch_size=args.batch_size, progress=bar, **options)
            if result.merged and shard.world > 1:
                print(f"[deepnmt] {shard.world} processes' parts merged into {args.output} in input order",
                      file=sys.stderr)
            resumed, translated = result.resumed_from, result.translated
        else:
            resumed, translated = 0, 0
            for translation in translate_windows(engine, tokenizer, lines, window=window, batch_size=args.batch_size,
                                                 progress=bar, **options):
                sys.stdout.write(translation + "\n")
                translated += 1
                if args.stream:
                    sys.stdout.flush()
    return resumed, translated


INPUT_FORMATS: tuple[str, ...] = ("auto", "text", "parallel")
PARALLEL_SUFFIXES: tuple[str, ...] = (".jsonl", ".json", ".jsonl.gz", ".json.gz")


def parallel_input(path: str, input_format: str, source_lang: str | None) -> bool:
    """Whether `deepnmt translate` reads ``path`` as a training file (its source side) rather than as lines of
    text: ``--input_format``, or under ``auto`` a JSON(-lines) file or a PREFIX of PREFIX.<source_lang> files."""
    if input_format != "auto":
        return input_format == "parallel"
    if path == "-":
        return False
    from .recipes import resolve_path

    resolved = Path(str(resolve_path(path)))
    if resolved.name.endswith(PARALLEL_SUFFIXES):
        return True
    return not resolved.exists() and source_lang is not None and any(
        Path(f"{resolved}.{source_lang}{gz}").is_file() for gz in ("", ".gz"))


def check_ensemble_options(args: Any, parser: CommandParser) -> None:
    """``--weights`` and ``--combination`` fit the ``--model`` folders given."""
    if args.weights is not None and len(args.weights) != len(args.model):
        parser.error(f"--weights has {len(args.weights)} values for {len(args.model)} --model folder(s); give one "
                     "weight per folder")
    if args.weights is not None and not all(weight > 0 and weight < float("inf") for weight in args.weights):
        parser.error(f"--weights {' '.join(map(str, args.weights))} is not allowed; every weight must be a finite "
                     "number > 0")


def shard_from_environment() -> Any:
    """This process's share of a corpus under torchrun / accelerate launch (`hf_deepnmt_training.translate.Shard`), read
    without importing torch."""
    for name in ("RANK", "WORLD_SIZE"):
        value = os.environ.get(name, "")
        if value and not value.isdigit():
            raise CommandLineError(f"{name}={value!r} is not allowed; a launcher such as torchrun sets it to an "
                                   "integer ≥ 0.")
    rank, world = int(os.environ.get("RANK") or 0), int(os.environ.get("WORLD_SIZE") or 1)
    if world < 1 or rank >= world:
        raise CommandLineError(f"RANK={rank} and WORLD_SIZE={world} are not allowed; a launcher gives each of "
                               "WORLD_SIZE ≥ 1 processes a RANK from 0 to WORLD_SIZE − 1.")
    from .translate import Shard

    return Shard(rank, world)


def _distill_parser() -> CommandParser:
    """The options of `deepnmt distill` (any other option is the student's `deepnmt train`'s)."""
    parser = CommandParser(prog="deepnmt distill", description="Sequence-level knowledge distillation in one "
                           "command: the teacher(s) translate the training file's sources with beam search "
                           "(several teachers as one ensemble), the sources and translations become the distilled "
                           "training set, a student (recipe `student`: 6-layer encoder, 2-layer decoder) is trained on "
                           "it, and exported to int8 (ONNX; CTranslate2 too when the student is a standard "
                           "Transformer). Every stage is cached in --output_dir (distill.json): rerun the same command "
                           "after an interruption and it resumes. Any other option is passed to the student's `deepnmt "
                           "train` (e.g. --max_steps 2000, --config_overrides ...). Under torchrun / accelerate launch "
                           "the translation is shared by the processes and the student trains data-parallel. "
                           "docs/distillation.md.")
    parser.add_argument("--teachers", "--model_name_or_path", "--model", dest="model", nargs="+", required=True,
                        metavar="TEACHER", help="The teacher model folder(s) (or Hub ids); several translate as one "
                        "ensemble sharing one vocabulary, whose tokenizer the student also uses (the first folder's).")
    add_ensemble_options(parser)
    parser.add_argument("--output_dir", default=None, help="The folder that caches every stage (default: a new "
                        "runs/distill-<date>-<time>); rerun with the same folder to resume.")
    parser.add_argument("--train_file", default=None, help="The training data whose sources the teachers translate "
                        "(.jsonl/.json/.tsv or PREFIX of PREFIX.<lang>; default: the recipe's, the embedded corpus).")
    parser.add_argument("--validation_file", default=None, help="The student's validation data (default: the "
                        "recipe's).")
    parser.add_argument("--test_file", default=None, help="The student's test data (default: the recipe's).")
    parser.add_argument("--source_lang", default=None, help="Source language (default: the recipe's).")
    parser.add_argument("--target_lang", default=None, help="Target language (default: the recipe's).")
    parser.add_argument("--recipe", default="student", help="The student's recipe (default: student, "
                        "training/recipes/student.yaml); its data section's files and languages are replaced by "
                        "distill's.")
    parser.add_argument("--keep_original_targets", action="store_true", help="Train the student on each source twice: "
                        "with the teachers' translation and with the original target (default: the translation "
                        "only).")
    parser.add_argument("--num_beams", type=int, default=4, help="The teachers' beam size (default: 4).")
    parser.add_argument("--engine", choices=ENGINES, default=None, help="What runs a single teacher (default: the "
                        "fastest its folder has, as `deepnmt translate`); an ensemble runs on torch.")
    parser.add_argument("--batch_size", type=int, default=32, help="Sentences per translation batch (default: 32).")
    parser.add_argument("--window", type=int, default=10_000, help="Lines read and sorted at a time while "
                        "translating (default: 10000).")
    parser.add_argument("--threads", type=int, default=None, help="Intra-op threads per process (default: torch's).")
    add_device_option(parser, "translates with the teachers (the student trains where `deepnmt train` puts it: "
                      "the GPU when there is one)")
    parser.add_argument("--export", nargs="+", choices=("onnx", "ctranslate2", "none"), default=None,
                        metavar="FORMAT", help="The student's int8 exports: onnx (into STUDENT/onnx, where `deepnmt "
                        "serve` and handler.py look) and/or ctranslate2 (OUTPUT_DIR/student-ctranslate2), or none "
                        "(default: onnx, and ctranslate2 when the student is a standard Transformer).")
    return parser


def _distill_output_dir(args: Any) -> str:
    """--output_dir, or a new runs/distill-<date>-<time> for a single process (said on stderr)."""
    from datetime import datetime

    output_dir = args.output_dir
    if output_dir is None:
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            raise CommandLineError("--output_dir is required when several processes distil together (every process "
                                   "must use the same folder).")
        output_dir = f"runs/distill-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        print(f"[deepnmt] no --output_dir given: distilling into {output_dir} (rerun with --output_dir {output_dir} "
              "to resume it)", file=sys.stderr)
    return output_dir


def _distill(argv: Sequence[str]) -> int:
    parser = _distill_parser()
    args, rest = parser.parse_known_args(list(argv))
    for name in ("num_beams", "batch_size", "window", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} {value} is not allowed; use 1 or more")
    check_ensemble_options(args, parser)
    if args.export and "none" in args.export and len(args.export) > 1:
        parser.error("--export none excludes the other formats")
    export_formats = [] if args.export == ["none"] else args.export
    from .distill import DistillOptions, distill, summary
    from .translate import Shard

    output_dir = _distill_output_dir(args)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    options = DistillOptions(
        teachers=list(args.model), output_dir=output_dir, weights=args.weights, combination=args.combination,
        train_file=args.train_file, validation_file=args.validation_file, test_file=args.test_file,
        source_lang=args.source_lang, target_lang=args.target_lang, recipe=args.recipe, num_beams=args.num_beams,
        batch_size=args.batch_size, window=args.window, threads=args.threads, engine=args.engine, device=args.device,
        keep_original_targets=args.keep_original_targets, export_formats=export_formats, train_argv=rest)
    outcome = distill(options)
    if Shard.from_environment().rank == 0:
        print(summary(outcome))
    _close_process_group()
    return 0


def _export(argv: Sequence[str]) -> int:
    quantizations = sorted({name for names in QUANTIZATIONS.values() for name in names})
    parser = CommandParser(prog="deepnmt export", description="Export a saved model for fast inference: "
                           "ctranslate2 (CTranslate2 model + vocabulary), onnx (encoder.onnx + "
                           "decoder.onnx with the key/value cache, for ONNX Runtime), marian (a stock "
                           "transformers MarianMTModel) or argos (an Argos Translate .argosmodel package for "
                           "argostranslate and LibreTranslate). ADMIN models are folded first; the tokenizer is "
                           "copied beside the export. Run the result with `deepnmt translate --engine`. "
                           "MODEL and OUTPUT may also be given as --model_name_or_path and --output_dir.")
    parser.add_argument("positional", nargs="*", metavar="MODEL OUTPUT", help="Saved model folder (or Hub id), then "
                        "the folder to write (must not exist or be empty, unless --force).")
    add_model_option(parser, "Saved model folder (or Hub id), instead of the first positional.", required=False)
    parser.add_argument("--output_dir", default=None, help="Folder to write, instead of the second positional.")
    parser.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="Export format.")
    parser.add_argument("--quantization", choices=quantizations, default=None, help="Weight type: ctranslate2 "
                        f"{'/'.join(QUANTIZATIONS['ctranslate2'])}, onnx {'/'.join(QUANTIZATIONS['onnx'])}, marian "
                        f"{'/'.join(QUANTIZATIONS['marian'])}, argos as ctranslate2 (default: float32).")
    parser.add_argument("--force", action="store_true", help="Replace the output folder if it holds files.")
    args = parser.parse_args(argv)
    given = list(args.positional)
    args.model = args.model or (given.pop(0) if given else None)
    args.output = args.output_dir or (given.pop(0) if given else None)
    if given or not args.model or not args.output:
        parser.error("give one model (MODEL or --model_name_or_path) and one output folder (OUTPUT or --output_dir)")
    output = Path(args.output)
    if output.exists() and any(output.iterdir()) and not args.force:
        raise CommandLineError(f"the output folder {output} is not empty; choose a new one or pass --force.")
    check_reference("MODEL", args.model)
    check_tokenizer("MODEL", args.model)
    from hf_deepnmt.export import check_modules, export_model

    check_modules("export", args.format)  # before the model loads

    model, tokenizer = load_model_and_tokenizer(args.model)
    export_model(model, tokenizer, output, args.format, args.quantization)
    if args.format == "argos":
        package = next(output.glob("*.argosmodel"))
        print(f"wrote an argos package ({args.quantization or 'float32'}) of {args.model} to {package}; install it "
              f"with: python -c \"import argostranslate.package as p; p.install_from_path('{package}')\"")
        return 0
    article = "an" if args.format == "onnx" else "a"
    print(f"wrote {article} {args.format} export ({args.quantization or 'float32'}) of {args.model} to {output}; try: "
          f"deepnmt translate --engine {'torch' if args.format == 'marian' else args.format} --model {output}")
    return 0


def _folders_first(parser: CommandParser, argv: Sequence[str]) -> list[str]:
    """``argv`` with its positional arguments first: several MODEL_DIRs may stand anywhere among the options (argparse
    takes one run of positionals only)."""
    positional, options, values = [], [], 0
    for token in canonical_options(argv):
        if values:
            options.append(token)
            values -= 1
        elif token.startswith("-") and token != "-":
            options.append(token)
            action = parser._option_string_actions.get(token)  # `--name=value` carries its value
            values = 1 if action is not None and action.nargs != 0 else 0
        else:
            positional.append(token)
    return positional + options


def _serve_parser() -> CommandParser:
    """The options of `deepnmt serve`."""
    parser = CommandParser(prog="deepnmt serve", description="Serve a model over HTTP with dynamic batching: POST / "
                           "or /predict with {\"inputs\": \"text\" or [\"text\", ...], \"parameters\": {...}} "
                           "(the Inference Endpoints payload) answers [{\"translation_text\": ...}, ...] as the "
                           "folder's translation pipeline does; GET /health, GET /metrics (Prometheus). Requests that "
                           "arrive together are translated together. SIGTERM/SIGINT: stop accepting, answer every "
                           "request in flight, exit 0. Several MODEL_DIRs: one server, each request routed by its language pair; "
                           "LibreTranslate's API on the same port (POST /translate, /detect, GET /languages). "
                           "Needs the serve extra (pip install 'hf_deepnmt[serve]'); "
                           "docs/serving.md.")
    parser.add_argument("folder", nargs="*", metavar="MODEL_DIR", help="A saved model folder, or a `deepnmt export` "
                        "folder (or --model_name_or_path); several serve several language pairs on one port, each "
                        "request going to the model of its pair (each folder must record one pair, no two the same).")
    add_model_option(parser, "The model folder, instead of the positional MODEL_DIR.", required=False)
    parser.add_argument("--engine", choices=ENGINES, default=None, help="What runs the model (default: the fastest "
                        "the folder has: an export folder's own engine; for a model folder ONNX Runtime when it holds "
                        "an ONNX export in onnx/ and no GPU is visible, else torch).")
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on (default: 127.0.0.1, this machine "
                        "only; 0.0.0.0 for every interface).")
    parser.add_argument("--port", type=int, default=8000, help="Port (default: 8000; 0: a free port, printed at "
                        "start).")
    parser.add_argument("--max_batch_size", type=int, default=32, help="Most sentences per generate call (default: "
                        "32; 1 turns batching off).")
    parser.add_argument("--max_wait_ms", type=float, default=10.0, help="How long the oldest waiting sentence waits "
                        "for others to fill its batch (default: 10 ms).")
    parser.add_argument("--max_queue", type=int, default=256, help="Most sentences waiting for a batch; a request that "
                        "does not fit gets 503 with Retry-After (default: 256).")
    parser.add_argument("--max_input_tokens", type=int, default=None, help="Longest text in tokens; a longer one gets "
                        "413, never truncated (default: the longest the model accepts).")
    parser.add_argument("--threads", type=int, default=None, help="Intra-op threads of the engine, of each worker "
                        "(default: torch's default thread count divided among the workers, at least 1 each).")
    parser.add_argument("--workers", type=int, default=None, help="Model instances, each decoding one batch at a "
                        "time on its own thread, so that a full batch is decoded while another is (default: 2 for the "
                        "torch engine on a CPU of 2 or more cores without --threads, else 1; docs/serving.md, "
                        "\"Workers\").")
    parser.add_argument("--search", choices=("retiring", "generate"), default="retiring", help="torch and onnx "
                        "engines: 'retiring' (default) decodes texts of every new-token budget in one search that "
                        "drops each sentence from the batch once it is done, with generate's results; 'generate' "
                        "makes one transformers generate call per budget (docs/serving.md).")
    parser.add_argument("--continuous_batching", action="store_true", help="torch engine, Transformer family, "
                        "retiring search: sentences that arrive while a search runs join it between two decoder steps "
                        "(up to --max_batch_size) instead of waiting for the next batch; each gets the translation it "
                        "gets alone. On the 2-core CPU measured it lowers throughput (docs/serving.md, \"Continuous "
                        "batching\"); off by default.")
    parser.add_argument("--api_keys", default=None, metavar="FILE", help="A file of the API keys the server accepts, "
                        "one per line, each optionally followed by a requests-per-minute limit (# comments and blank "
                        "lines allowed); requests without a valid key get 403, over the limit 429. Without it the "
                        "server is open (docs/serving.md, \"API keys\").")
    return parser


def _check_serve_args(parser: CommandParser, args: Any) -> list[str]:
    """Refuse `deepnmt serve` options that do not fit; the model folders to serve, the first one the default."""
    if bool(args.folder) == bool(args.model):
        parser.error("give the model folder once, as MODEL_DIR or --model_name_or_path")
    folders = args.folder or [args.model]
    for folder in folders:
        if args.folder:
            check_reference("MODEL_DIR", folder)
        if not Path(folder).expanduser().is_dir():
            raise CommandLineError(f"MODEL_DIR {folder!r} is not a folder here; pass a folder written by `deepnmt "
                                   "train`, `save_pretrained` or `deepnmt export`.")
    if len(set(folders)) < len(folders):
        parser.error(f"MODEL_DIR {next(f for f in folders if folders.count(f) > 1)} is given twice; give each "
                     "model folder once")
    if args.api_keys is not None and not Path(args.api_keys).is_file():
        parser.error(f"--api_keys {args.api_keys} is not a file here; give a file of keys, one per line")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not allowed; use 0 (a free port) to 65535")
    for name in ("max_batch_size", "max_queue", "max_input_tokens", "threads", "workers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} {value} is not allowed; use 1 or more")
    if not (args.max_wait_ms >= 0 and args.max_wait_ms < float("inf")):
        parser.error(f"--max_wait_ms {args.max_wait_ms} is not allowed; use 0 or more milliseconds")
    return folders


def _serve(argv: Sequence[str]) -> int:
    parser = _serve_parser()
    args = parser.parse_args(_folders_first(parser, argv))
    folders = _check_serve_args(parser, args)
    require_modules("serve", ("starlette", "uvicorn", "prometheus_client", "lingua"), "the server")
    quiet_libraries()
    from .serve import ServeOptions, serve

    return serve(ServeOptions(model=folders[0], more_models=tuple(folders[1:]), api_keys=args.api_keys,
                              engine=args.engine, host=args.host, port=args.port,
                              max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                              max_queue=args.max_queue, max_input_tokens=args.max_input_tokens,
                              threads=args.threads, workers=args.workers, search=args.search,
                              continuous_batching=args.continuous_batching))


def _push(argv: Sequence[str]) -> int:
    from .hub import card_license, files_to_upload, push_folder, subfolders_left_out

    parser = CommandParser(prog="deepnmt push", description="Upload a trained model folder (weights, "
                           "config, generation config, tokenizer, remote code, translation pipeline, model "
                           "card, metrics and plots; never checkpoints) to the Hugging Face Hub.")
    parser.add_argument("folder", nargs="?", help="The model folder written by `deepnmt train` / `deepnmt "
                        "quickstart` (or --model_name_or_path).")
    add_model_option(parser, "The model folder, instead of the positional FOLDER.", required=False)
    parser.add_argument("--repo_id", required=True, help="USER/NAME on the Hub.")
    parser.add_argument("--private", action="store_true", help="Create the repository as private.")
    parser.add_argument("--token", default=None, help="Hub token (default: the logged-in one).")
    parser.add_argument("--commit_message", default="Upload hf_deepnmt model", help="Commit message.")
    parser.add_argument("--dry_run", action="store_true", help="Only list the files that would be uploaded.")
    parser.add_argument("--include_subfolders", action="store_true", help="Also upload the folder's subfolders "
                        "(e.g. averaged-lastN/ of `deepnmt average-checkpoints`); default: the model's own files only.")
    parser.add_argument("--license", default=None, help="The model's license for the uploaded card's `license` "
                        "field: a Hub license id (https://huggingface.co/docs/hub/repositories-licenses, e.g. "
                        "apache-2.0, mit, cc-by-4.0); default: the one given to `deepnmt train --license`, if any "
                        "(without one the card says the license is unknown). Choose one the training data allows.")
    args = parser.parse_args(argv)
    if bool(args.folder) == bool(args.model):
        parser.error("give the model folder once, as FOLDER or --model_name_or_path")
    from hf_deepnmt_model_cards.licenses import license_problem

    if license_problem(args.license):
        raise CommandLineError(license_problem(args.license))
    args.folder = args.folder or args.model
    skipped = subfolders_left_out(args.folder, args.include_subfolders)
    if skipped:
        print(f"[deepnmt] not uploading the subfolder(s) {', '.join(s + '/' for s in skipped)} (other models; "
              "--include_subfolders uploads them)", file=sys.stderr)
    if (args.license or card_license(args.folder)) is None:
        print("[deepnmt] the card states no license (unknown to users of the model); --license ID sets one",
              file=sys.stderr)
    if args.dry_run:
        print("\n".join(files_to_upload(args.folder, args.include_subfolders)))
        return 0
    files = push_folder(args.folder, args.repo_id, private=args.private, token=args.token,
                        commit_message=args.commit_message, include_subfolders=args.include_subfolders,
                        license=args.license)
    print(f"uploaded {len(files)} files to https://huggingface.co/{args.repo_id}")
    return 0


def _average(argv: Sequence[str]) -> int:
    parser = CommandParser(prog="deepnmt average-checkpoints", description="Average the weights of the "
                           "last N complete checkpoint-* folders of a run into a complete model folder "
                           "(liu2020 and fairseq evaluate the average of the last 10).")
    parser.add_argument("run_dir", help="The --output_dir of a `deepnmt train` run.")
    parser.add_argument("--last", type=int, default=10, help="How many of the newest checkpoints (default: 10).")
    parser.add_argument("--output", default=None, help="Where to write the averaged model (default: "
                        "RUN_DIR/averaged-lastN).")
    args = parser.parse_args(argv)
    from .checkpoints import average_checkpoints

    print(average_checkpoints(args.run_dir, args.last, args.output))
    return 0


def _quickstart(argv: Sequence[str], clock: RunClock | None = None) -> int:
    from .quickstart import run_quickstart

    parser = CommandParser(
        prog="deepnmt quickstart",
        description="The main job: train a small Transformer with a deep decoder (2-layer encoder, 6-layer decoder) on "
        "the embedded WEB ↔ RV1909 (en→es) corpus on "
        "this machine's CPU, evaluate BLEU/chrF/TER on the test books with beam search, translate a few sentences, "
        "and write the model, its card, metrics.json and plots to --output_dir. Any `deepnmt train` option may "
        "follow and overrides the quickstart recipe (e.g. --max_steps 200).",
    )
    parser.add_argument("--output_dir", default=None, help="Where to write everything (default: "
                        "runs/quickstart-<date>-<time>, never an existing run).")
    args, rest = parser.parse_known_args(argv)
    return run_quickstart(args.output_dir, rest, clock)


# Options that name a saved model or tokenizer: a local folder, or a Hub id ("owner/name").
MODEL_REFERENCE_FLAGS = ("--model", "--model_name_or_path", "--teachers", "--warm_start_from", "--tokenizer_name")
SAVED_MARKERS = ("config.json", "tokenizer.json", "deepnmt_export.json")


def model_of(parser: CommandParser, args: Any, needs_tokenizer: bool = False) -> Any:
    """The model of a command taking `add_model_argument`'s MODEL: given once (a list of folders where the command
    takes several); a positional one checked as `check_references` checks the options; with ``needs_tokenizer`` a
    local model folder must hold its tokenizer (the first folder of several: theirs is the ensemble's)."""
    model = model_argument(parser, args)
    folders = model if isinstance(model, list) else [model]
    flag = "MODEL" if args.positional_model else "--model"
    if args.positional_model:
        for folder in folders:
            check_reference(flag, folder)
    if needs_tokenizer:
        check_tokenizer(flag, folders[0])
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "source.spm", "vocab.txt", "vocab-src.json")


def check_tokenizer(flag: str, value: str) -> None:
    """One sentence when a local model folder holds no tokenizer (transformers' own error speaks of sentencepiece or
    tiktoken): `deepnmt train` saves it beside the weights, a model saved by hand needs
    ``tokenizer.save_pretrained(folder)``."""
    folder = Path(value).expanduser()
    if (folder / "config.json").is_file() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise CommandLineError(f"`{flag}` = {value!r} holds a model but no tokenizer (no tokenizer.json); save it "
                               "beside the weights with `tokenizer.save_pretrained(folder)` (`deepnmt train` does).")


def languages_of(args: Any, required: bool, model: Any = None, default: tuple[str, str] | None = None) -> None:
    """Set ``args.source_lang`` / ``args.target_lang`` from the pair the model records
    (`hf_deepnmt_training.arguments.resolve_language_pair`): from a local folder's saved files before anything loads, or — for a
    Hub id, once loaded — from ``model``'s config. ``default``: the pair to use when the model records none and none
    was given."""
    first = args.model[0] if isinstance(args.model, list) else args.model  # an ensemble's members share one pair
    pairs = saved_language_pairs(first)
    if model is None and pairs is None:
        return  # a Hub id: checked once it is loaded
    if model is not None:
        if pairs is not None:
            return  # done from the saved files
        from hf_deepnmt import recorded_language_pairs

        pairs = recorded_language_pairs(model.config)
    if not pairs and default is not None and args.source_lang is None and args.target_lang is None:
        args.source_lang, args.target_lang = default
        return
    args.source_lang, args.target_lang = resolve_language_pair(first, pairs, args.source_lang, args.target_lang,
                                                               required)


def check_references(argv: Sequence[str], several: bool = False) -> None:
    """Refuse, before anything loads, a model/tokenizer option that names a local path that does not exist, a file,
    or a folder holding no saved model — which the Hub client would otherwise report as an invalid repository id or a
    failed connection — and an ``--output_dir`` that is an existing file. ``several``: a model option may name
    several folders (an ensemble), each checked."""
    for index, token in enumerate(argv):
        flag, has_value, value = token.partition("=")
        if not has_value:
            value = argv[index + 1] if index + 1 < len(argv) else ""
        if flag in MODEL_REFERENCE_FLAGS and value:
            check_reference(flag, value)
            if several and not has_value and flag in ("--model", "--model_name_or_path", "--teachers"):
                for more in itertools.takewhile(lambda token: not token.startswith("-"), argv[index + 2:]):
                    check_reference(flag, more)
        if flag == "--output_dir" and value and Path(value).expanduser().is_file():
            raise CommandLineError(f"`--output_dir` = {value!r} is an existing file; pass a folder (it is created).")


def check_reference(flag: str, value: str) -> None:
    """`check_references` for one option (or positional, named ``flag``) that names a model folder or Hub id."""
    path = Path(value).expanduser()
    fairseq = path.suffix == ".pt" and path.is_file() or path.is_dir() and any(path.glob("*.pt")) \
        and not (path / "config.json").exists()
    if fairseq:  # a fairseq checkpoint (docs/public-checkpoints.md)
        raise CommandLineError(f"`{flag}` = {value!r} is a fairseq checkpoint; convert it first: deepnmt convert "
                               f"{value} --output_dir FOLDER, then pass FOLDER.")
    if path.is_file():
        raise CommandLineError(f"`{flag}` = {value!r} is a file; it must be a saved model folder or a Hub id.")
    if path.is_dir() and not any((path / marker).exists() for marker in SAVED_MARKERS):
        raise CommandLineError(f"`{flag}` = {value!r} is a folder without a saved model (no "
                               f"{', '.join(SAVED_MARKERS)}); pass the folder that `deepnmt train` or "
                               "`save_pretrained` wrote.")
    # "name" or "owner/name" may be a Hub id (looked up when loading, `hub_lookup`); anything else that looks
    # like a path names a missing folder
    looks_local = value.startswith(("/", "./", "../", "~", ".")) or value.count("/") > 1
    if not path.exists() and looks_local:
        raise CommandLineError(f"`{flag}` = {value!r} does not exist; pass a saved model folder or a Hub id "
                               "(owner/name).")
    exported = (path / "deepnmt_export.json").is_file()  # a `deepnmt export` folder has its engine's config
    if flag != "--tokenizer_name" and (path / "config.json").is_file() and not exported:
        check_saved_model(path, flag)


def check_saved_model(folder: Path, flag: str = "--model") -> None:
    """One sentence naming the file when a saved model folder cannot load (`hf_deepnmt_training.checkpoints.saved_model_problem`:
    unreadable ``config.json``, a ``model_type`` nobody registered, no weights, a truncated/corrupted
    ``model.safetensors``)."""
    from .checkpoints import saved_model_problem

    problem = saved_model_problem(folder)
    if problem:
        raise CommandLineError(f"`{flag}`: {problem}.")


def load_model_and_tokenizer(value: str) -> tuple[Any, Any]:
    """The model and tokenizer of a saved folder or Hub id (`hub_lookup` names a missing one)."""
    quiet_libraries()
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_deepnmt  # noqa: F401  (registers this package's model types with the Auto classes)

    with hub_lookup(value):
        return AutoModelForSeq2SeqLM.from_pretrained(value), AutoTokenizer.from_pretrained(value)


def train_help() -> str:
    """`deepnmt train --help`: rendered by transformers' argument parser once, then read from the cache
    (`hf_deepnmt_training.help_cache`), so that it answers without loading torch."""
    from .help_cache import cached_help, store_help

    text = cached_help("train")
    if text is None:
        import io

        from .train_arguments import parse_train_args

        rendered = io.StringIO()
        with contextlib.redirect_stdout(rendered):
            try:
                parse_train_args(["--help"])
            except SystemExit:  # argparse prints the help and exits
                pass
        text = rendered.getvalue()
        store_help("train", text)
    return text


def _close_process_group() -> None:
    """End a finished distributed run cleanly: a gloo group left open at interpreter exit can abort a rank
    ("terminate called without an active exception") after everything was saved, failing the launcher."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: deepnmt {" + ",".join(COMMANDS) + "} [options]\n\n" + _top_level_help())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"deepnmt: unknown command {command!r}; use one of {', '.join(COMMANDS)} (deepnmt --help).",
              file=sys.stderr)
        return 2
    clock = RunClock(command)  # the run time that train/quickstart write into the card and print at the end
    try:
        rest = underscored(rest)
        check_references(rest, several=command in SEVERAL_MODEL_COMMANDS)  # as the user spelt the option
        rest = canonical_options(rest, TRAIN_ALIASES if command in ("train", "quickstart") else OPTION_ALIASES)
        if command == "train" and rest in (["--help"], ["-h"]):
            print(train_help(), end="")
            return 0
        if command in ("train", "quickstart"):
            from .train_options import precheck

            precheck(rest)  # a mistake in well under a second, before torch loads
        if command == "train":
            from .report import print_train_summary
            from .train import train

            print_train_summary(train(rest, clock=clock))
            _close_process_group()
            code = 0
        else:
            from .convert import convert_command

            code = {"evaluate": _evaluate, "diagnose": _diagnose, "translate": _translate, "export": _export,
                    "convert": convert_command, "distill": _distill, "serve": _serve, "push": _push,
                    "quickstart": lambda rest: _quickstart(rest, clock),
                    "average-checkpoints": _average}[command](rest)
    except NonFiniteLossError as error:
        print(f"deepnmt {command}: {error}", file=sys.stderr)
        return 3
    except Exception as error:
        if not is_user_mistake(error) or os.environ.get("DEEPNMT_DEBUG"):
            raise  # a bug shows its traceback; only the project's own user-mistake errors are one sentence
        print(f"deepnmt {command}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if os.environ.get("DEEPNMT_DEBUG"):
            raise
        hint = {"train": " Continue it with the same command plus `--resume_from_checkpoint last` (it restarts from "
                         "the newest complete checkpoint-N in --output_dir).",
                "translate": " With --output FILE, continue it with the same command plus `--resume` (the complete "
                             "lines are kept).",
                "distill": " Continue it with the same command and --output_dir: the completed stages are cached and "
                           "the interrupted one resumes."}.get("train" if command == "quickstart" else command, "")
        print(f"deepnmt {command}: interrupted.{hint}", file=sys.stderr)
        return 130
    return code  # train and quickstart said "finished in X min" once, in their summaries


if __name__ == "__main__":
    sys.exit(main())
