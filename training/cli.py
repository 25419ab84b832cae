"""`deepnmt`: the command line of hf_deepnmt.

    deepnmt quickstart            train + evaluate a deep Transformer on the embedded corpus (the main job)
    deepnmt train ...             train any model (run_translation arguments, --recipe, --max_tokens, ...)
    deepnmt evaluate ...          BLEU / chrF / TER of a saved model on a test file, with beam search
    deepnmt diagnose ...          does a saved model use its source? (li2022 collapse monitor, per-layer attention)
    deepnmt translate ...         translate a file or stdin, batched, to stdout (torch, CTranslate2 or ONNX Runtime)
    deepnmt export ...            export a model to CTranslate2, ONNX or a stock MarianMTModel (fast inference)
    deepnmt serve MODEL_DIR       an HTTP translation server with dynamic batching (POST /, /health, /metrics)
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
from collections.abc import Sequence
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
    TRAIN_ALIASES,
    CommandParser,
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
COMMANDS = ("quickstart", "train", "evaluate", "diagnose", "translate", "export", "serve", "push",
            "average-checkpoints")

def _top_level_help() -> str:
    return __doc__.split("\n\n", 1)[1]


def _evaluate(argv: Sequence[str]) -> int:
    parser = CommandParser(prog="deepnmt evaluate", description="Score a saved model on a test file "
                           "(BLEU, chrF, TER with sacreBLEU signatures) using beam search.")
    add_model_argument(parser, "Saved model folder (or Hub id)")
    parser.add_argument("--test_file", required=True, help="Test data: .jsonl/.json/.tsv, a PREFIX of "
                        "PREFIX.<lang> files, or corpus:web-sparv/test.jsonl.gz (the embedded corpus).")
    add_language_options(parser, "of --test_file")
    parser.add_argument("--num_beams", type=int, default=4, help="Beam size (default: 4).")
    parser.add_argument("--batch_size", type=int, default=32, help="Sentences per generate() call (default: 32).")
    parser.add_argument("--max_samples", type=int, default=None, help="Score only the first N pairs.")
    parser.add_argument("--output_json", default=None, help="Also write the scores and signatures to this file.")
    parser.add_argument("--hypotheses", default=None, help="Also write the translations, one per line, here.")
    parser.add_argument("--reliance_pairs", type=int, default=64, help="Pairs on which to measure source reliance, "
                        "the mean per-token KL between predictions with the real and an all-<unk> source (li2022 "
                        "collapse monitor; default: 64).")
    args = parser.parse_args(argv)
    model_of(parser, args, needs_tokenizer=True)
    if args.num_beams < 1 or args.batch_size < 1 or args.reliance_pairs < 1:
        parser.error("--num_beams, --batch_size and --reliance_pairs must be ≥ 1.")
    languages_of(args, required=True)
    from .data import read_parallel_file
    from .recipes import resolve_path
    from .translate import corpus_source_reliance, evaluate_model

    model, tokenizer = load_model_and_tokenizer(args.model)
    languages_of(args, required=True, model=model)
    corpus = read_parallel_file(resolve_path(args.test_file), args.source_lang, args.target_lang, args.max_samples)
    scores, hypotheses = evaluate_model(args.model, args.test_file, args.source_lang, args.target_lang,
                                        num_beams=args.num_beams, batch_size=args.batch_size,
                                        max_samples=args.max_samples, model=model, tokenizer=tokenizer, corpus=corpus)
    reliance = corpus_source_reliance(model, tokenizer, corpus.sources, corpus.targets, args.reliance_pairs)
    report = {**scores.as_dict(), "sentences": scores.num_sentences, "num_beams": args.num_beams,
              "source_reliance": round(reliance, 4), "signatures": scores.signatures}
    print(f"BLEU {scores.bleu}  chrF {scores.chrf}  TER {scores.ter}  ({scores.num_sentences} sentences, "
          f"beam {args.num_beams})")
    print(f"source reliance {reliance:.4f} nats/token on {min(args.reliance_pairs, len(corpus.sources))} pairs "
          "(li2022 collapse monitor: ≈ 0 means the decoder ignores the source)")
    for name, signature in scores.signatures.items():
        print(f"  {name}: {signature}")
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.hypotheses:
        Path(args.hypotheses).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    return 0


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


def _translate(argv: Sequence[str]) -> int:
    parser = CommandParser(prog="deepnmt translate", description="Translate one sentence per line "
                           "from a file or stdin to stdout (batched, beam search).")
    add_model_argument(parser, "Saved model folder (or Hub id); with --engine ctranslate2 or onnx, a folder "
                       "written by `deepnmt export --format ENGINE`")
    add_language_options(parser, "of the input (checked against the model's pair; the model has one direction, so "
                         "they never change the translation)")
    parser.add_argument("--engine", choices=ENGINES, default="torch", help="What runs the model: torch "
                        "(`generate`, default), ctranslate2 or onnx (ONNX Runtime); same batching, and the same output "
                        "up to float32 rounding at exact ties — for ctranslate2, when the model's generation config "
                        "has early_stopping=true, the default of models trained with this package (CTranslate2 "
                        "always stops a sentence once num_beams hypotheses have finished; docs/fast-inference.md).")
    parser.add_argument("--input", default="-", help="Input file, one sentence per line (default: stdin).")
    parser.add_argument("--output", default="-", help="Output file (default: stdout).")
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
                        "already in --output and translate the input from the next line on (needs --output FILE).")
    parser.add_argument("--bf16", action="store_true", help="torch engine: run under bfloat16 autocast (CPU or "
                        "GPU); see benchmarks/RESULTS.md for its speed and BLEU on this project's CPU.")
    parser.add_argument("--threads", type=int, default=None, help="Intra-op threads of the engine (default: "
                        "torch's default thread count).")
    args = parser.parse_args(argv)
    model_of(parser, args, needs_tokenizer=True)
    for name in ("num_beams", "batch_size", "window", "threads", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} {value} is not allowed; use 1 or more")
    if args.input != "-" and not Path(args.input).is_file():
        parser.error(f"--input {args.input} does not exist")
    if args.resume and args.output == "-":
        parser.error("--resume needs --output FILE (the lines already translated are read from it)")
    languages_of(args, required=False)
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    from hf_deepnmt.export import load_engine

    from .translate import completed_lines, translate_windows

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    quiet_libraries()
    with hub_lookup(args.model):
        engine = load_engine(args.model, args.engine, intra_threads=args.threads or torch.get_num_threads(),
                             bf16=args.bf16)
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    if hasattr(engine, "model"):  # torch: a Hub id's pair is known once its config is loaded
        languages_of(args, required=False, model=engine.model)
    window = args.batch_size if args.stream else args.window
    done = completed_lines(args.output) if args.resume else 0
    total = None
    if args.input != "-":
        with open(args.input, "rb") as handle:
            total = sum(1 for _ in handle)  # for the progress bar; a cheap pass over the bytes
    with contextlib.ExitStack() as files:
        output = sys.stdout if args.output == "-" else files.enter_context(
            open(args.output, "a" if args.resume else "w", encoding="utf-8"))
        source = sys.stdin if args.input == "-" else files.enter_context(open(args.input, encoding="utf-8"))
        lines = itertools.islice(source, done, None)
        if done:
            print(f"[deepnmt] resuming: {done} lines of {args.output} are complete; translating from line {done + 1}",
                  file=sys.stderr)
        bar = files.enter_context(tqdm(total=total, initial=done, unit="line", desc="translating", file=sys.stderr,
                                       disable=args.input == "-" or args.stream))
        translated = 0
        for translation in translate_windows(engine, tokenizer, lines, window=window, batch_size=args.batch_size,
                                             progress=bar, num_beams=args.num_beams,
                                             max_new_tokens=args.max_new_tokens):
            output.write(translation + "\n")
            translated += 1
            if args.stream:
                output.flush()
    if not translated:
        source = "stdin" if args.input == "-" else args.input
        print(f"[deepnmt] translate: {source} has no {'more ' if done else ''}lines to translate; nothing was "
              "written.", file=sys.stderr)
    return 0


def _export(argv: Sequence[str]) -> int:
    quantizations = sorted({name for names in QUANTIZATIONS.values() for name in names})
    parser = CommandParser(prog="deepnmt export", description="Export a saved model for fast inference: "
                           "ctranslate2 (CTranslate2 model + vocabulary), onnx (encoder.onnx + "
                           "decoder.onnx with the key/value cache, for ONNX Runtime) or marian (a stock "
                           "transformers MarianMTModel). ADMIN models are folded first; the tokenizer is "
                           "copied beside the export. Run the result with `deepnmt translate --engine`. "
                           "MODEL and OUTPUT may also be given as --model_name_or_path and --output_dir.")
    parser.add_argument("positional", nargs="*", metavar="MODEL OUTPUT", help="Saved model folder (or Hub id), then "
                        "the folder to write (must not exist or be empty, unless --force).")
    add_model_option(parser, "Saved model folder (or Hub id), instead of the first positional.", required=False)
    parser.add_argument("--output_dir", default=None, help="Folder to write, instead of the second positional.")
    parser.add_argument("--format", required=True, choices=EXPORT_FORMATS, help="Export format.")
    parser.add_argument("--quantization", choices=quantizations, default=None, help="Weight type: ctranslate2 "
                        f"{'/'.join(QUANTIZATIONS['ctranslate2'])}, onnx {'/'.join(QUANTIZATIONS['onnx'])}, marian "
                        f"{'/'.join(QUANTIZATIONS['marian'])} (default: float32).")
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
    article = "an" if args.format == "onnx" else "a"
    print(f"wrote {article} {args.format} export ({args.quantization or 'float32'}) of {args.model} to {output}; try: "
          f"deepnmt translate --engine {'torch' if args.format == 'marian' else args.format} --model {output}")
    return 0


def _serve(argv: Sequence[str]) -> int:
    parser = CommandParser(prog="deepnmt serve", description="Serve a model over HTTP with dynamic batching: POST / "
                           "or /predict with {\"inputs\": \"text\" or [\"text\", ...], \"parameters\": {...}} "
                           "(the Inference Endpoints payload) answers [{\"translation_text\": ...}, ...] as the "
                           "folder's translation pipeline does; GET /health, GET /metrics (Prometheus). Requests that "
                           "arrive together are translated together. SIGTERM/SIGINT: stop accepting, answer every "
                           "request in flight, exit 0. Needs the serve extra (pip install 'hf_deepnmt[serve]'); "
                           "docs/serving.md.")
    parser.add_argument("folder", nargs="?", metavar="MODEL_DIR", help="A saved model folder, or a `deepnmt export` "
                        "folder (or --model_name_or_path).")
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
    parser.add_argument("--threads", type=int, default=None, help="Intra-op threads of the engine (default: torch's "
                        "default thread count).")
    args = parser.parse_args(argv)
    if bool(args.folder) == bool(args.model):
        parser.error("give the model folder once, as MODEL_DIR or --model_name_or_path")
    folder = args.folder or args.model
    if args.folder:
        check_reference("MODEL_DIR", folder)
    if not Path(folder).expanduser().is_dir():
        raise CommandLineError(f"MODEL_DIR {folder!r} is not a folder here; pass a folder written by `deepnmt train`, "
                               "`save_pretrained` or `deepnmt export`.")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not allowed; use 0 (a free port) to 65535")
    for name in ("max_batch_size", "max_queue", "max_input_tokens", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} {value} is not allowed; use 1 or more")
    if not (args.max_wait_ms >= 0 and args.max_wait_ms < float("inf")):
        parser.error(f"--max_wait_ms {args.max_wait_ms} is not allowed; use 0 or more milliseconds")
    require_modules("serve", ("starlette", "uvicorn"), "the server")
    quiet_libraries()
    from .serve import ServeOptions, serve

    return serve(ServeOptions(model=folder, engine=args.engine, host=args.host, port=args.port,
                              max_batch_size=args.max_batch_size, max_wait_ms=args.max_wait_ms,
                              max_queue=args.max_queue, max_input_tokens=args.max_input_tokens,
                              threads=args.threads))


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
MODEL_REFERENCE_FLAGS = ("--model", "--model_name_or_path", "--warm_start_from", "--tokenizer_name")
SAVED_MARKERS = ("config.json", "tokenizer.json", "deepnmt_export.json")


def model_of(parser: CommandParser, args: Any, needs_tokenizer: bool = False) -> str:
    """The model of a command taking `add_model_argument`'s MODEL: given once; a positional one checked as
    `check_references` checks the options; with ``needs_tokenizer`` a local model folder must hold its tokenizer."""
    model = model_argument(parser, args)
    if args.positional_model:
        check_reference("MODEL", model)
    if needs_tokenizer:
        check_tokenizer("MODEL" if args.positional_model else "--model", model)
    return model


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "spiece.model", "sentencepiece.bpe.model",
                   "source.spm", "vocab.txt")


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
    pairs = saved_language_pairs(args.model)
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
    args.source_lang, args.target_lang = resolve_language_pair(args.model, pairs, args.source_lang, args.target_lang,
                                                               required)


def check_references(argv: Sequence[str]) -> None:
    """Refuse, before anything loads, a model/tokenizer option that names a local path that does not exist, a file,
    or a folder holding no saved model — which the Hub client would otherwise report as an invalid repository id or a
    failed connection — and an ``--output_dir`` that is an existing file."""
    for index, token in enumerate(argv):
        flag, has_value, value = token.partition("=")
        if not has_value:
            value = argv[index + 1] if index + 1 < len(argv) else ""
        if flag in MODEL_REFERENCE_FLAGS and value:
            check_reference(flag, value)
        if flag == "--output_dir" and value and Path(value).expanduser().is_file():
            raise CommandLineError(f"`--output_dir` = {value!r} is an existing file; pass a folder (it is created).")


def check_reference(flag: str, value: str) -> None:
    """`check_references` for one option (or positional, named ``flag``) that names a model folder or Hub id."""
    path = Path(value).expanduser()
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
        check_references(rest)  # names the option as the user spelt it (`--model` or `--model_name_or_path`)
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
            code = {"evaluate": _evaluate, "diagnose": _diagnose, "translate": _translate, "export": _export,
                    "serve": _serve, "push": _push, "quickstart": lambda rest: _quickstart(rest, clock),
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
                             "lines are kept)."}.get("train" if command == "quickstart" else command, "")
        print(f"deepnmt {command}: interrupted.{hint}", file=sys.stderr)
        return 130
    return code  # train and quickstart said "finished in X min" once, in their summaries


if __name__ == "__main__":
    sys.exit(main())
