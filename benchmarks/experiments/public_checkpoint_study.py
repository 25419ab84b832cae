"""Issue 61, item 5: a public checkpoint converted with `deepnmt convert`, adapted to a new domain, and deepened.

The Hub cannot be reached here, so the "public checkpoint" is a stand-in
(``benchmarks/experiments/opus_mt_standin.py``): an OPUS-MT-shaped ``MarianMTModel`` with a ``MarianTokenizer``
(sentencepiece), trained on the embedded Bible corpus by transformers' own ``Seq2SeqTrainer`` — none of this
package's code made it. The domain is English→Spanish software messages from this machine's gettext catalogs
(``training/corpus/build_gettext_corpus.py``: whole catalogs held out for validation and test, so the test messages
come from programs the training data never saw).

One command runs the study, every stage through the command line a user has:

1. ``deepnmt convert STANDIN --output_dir WORK/converted`` (the stand-in's logits are checked against transformers'
   MarianMTModel before anything is written);
2. the stand-in as is: ``deepnmt evaluate`` of the converted folder on the gettext test set and, for reference, on
   the Bible test verses it was trained for (beam 4);
3. the learning rate of the fine-tune rows (unless ``--learning_rate`` gives it): the plain fine-tune trained
   ``--probe_minutes`` with each of ``--probe_learning_rates``, each scored on the first ``--probe_valid_samples``
   validation pairs (beam 4, ``deepnmt evaluate``); the best validation BLEU is the rate of every fine-tune row.
   The test set is not looked at to choose it;
4. the rows, one after the other, each ``deepnmt train --max_train_minutes MINUTES`` (the same wall-clock budget,
   evaluations included) into ``WORK/<row>/``, tested at its end on the gettext test set with beam 4:

   * ``fine-tune`` — ``--model_name_or_path WORK/converted``;
   * ``dou2018`` — ``--warm_start_from WORK/converted --model_type deep_representation_transformer``: dou2018's
     warm start into hierarchical layer aggregation in both stacks with the layer-diversity term (λ 1.0), the
     model type's defaults;
   * ``grow`` — ``--warm_start_method grow`` to ``+GROW_LAYERS`` layers in each stack (6+6 → 8+8; Wu et al. 2019:
     the trained layers at the bottom, new top layers initialised), the trained layers held for ``--hold_steps``
     optimizer steps (default 20, about a tenth of what a plain fine-tune row trains in 10 minutes here) while the
     new ones learn, as Wu et al. train in two stages;
   * ``stack`` — ``--warm_start_method stack`` to twice the encoder layers, the decoder kept (6+6 → 12+6; Li et
     al. 2020: the new top layers copies of the trained top layers). 12+6 rather than 9+9 because shallow-to-deep
     training deepens the encoder (6 → 12 → 18 → 24-layer encoders over a 6-layer decoder), and encoder layers cost
     less per step than decoder layers (no cross-attention) and nothing per decoding step;
   * ``cad`` — li2022's cross-attention drop switched on for fine-tuning: a copy warm start with
     ``cross_attention_drop_depth=round(21/27 · decoder layers)`` (li2022's depth rule: 5 of 6) and
     ``cross_attention_drop_ratio=0.5``;
   * ``admin`` — ``--model_type admin_transformer`` (liu2020 ADMIN) warm-started: ω starts at 1, so the model starts
     as the trained post-LN Transformer, and trains;
   * ``scratch`` — a new model from the data and the languages alone: the package's own NMT defaults (model size,
     tokenizer, learning rate, warm-up, batch, dropout from the data size and the budget; docs/defaults.md).

   Every fine-tune and deepening row has the same explicit options (`FINE_TUNE_OPTIONS`, the learning rate from step
   3), because the NMT defaults apply only to a model trained from scratch: inverse square root after a 50-step
   warm-up (it does not depend on the run length, as ``--max_train_minutes`` without ``--max_steps`` requires),
   label smoothing 0.1, Adam β2 0.98, clipping 1.0, 2,048-token batches (at about 2.7 s a step for the 13M-parameter
   stand-in on one thread, 4,096-token batches leave only about 90 updates in 10 minutes; 2,048 is also what the
   defaults give the scratch row on this corpus), validation loss on 500 pairs every 100 steps, no checkpoints;
5. the fine-tuned model on the Bible test verses as well (what the new domain cost the old one);
6. ``results/public_checkpoint_study.json`` and ``.md``: one table (BLEU, chrF, training minutes, optimizer steps,
   parameters and the exact command of every row) and the reading: the issue's goals — fine-tuning ≥ scratch + 5
   BLEU at the same budget, a deepened model above plain fine-tuning — met or not, with the numbers.

Each row's outcome is kept in ``WORK/<row>/record.json``; ``--reuse`` skips a row that has one (a killed study
continues where it stopped), ``--rows`` runs a subset, and the page is built from every record in WORK.
``--render_only`` rewrites the markdown from the JSON; ``--reading FILE`` puts a hand-written reading (markdown) into
the JSON and the page.

    # the study of issue 61 (about 2 hours of one CPU thread, rows one after the other)
    OMP_NUM_THREADS=1 python -m benchmarks.experiments.public_checkpoint_study --minutes 10 --threads 1
    # smoke: the tiny stand-in, 0.3 minutes a row, 40 test pairs, results outside results/
    OMP_NUM_THREADS=1 python -m benchmarks.experiments.public_checkpoint_study --minutes 0.3 \\
        --standin runs/opus_mt_standin_smoke --work_dir runs/public_checkpoint_study_smoke --probe_minutes 0.2 \\
        --max_test_samples 40 --probe_valid_samples 40 --results runs/public_checkpoint_study_smoke/results

Nothing is downloaded (``HF_HUB_OFFLINE=1`` for every process).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .common import chosen_rows, experiment_parser, provenance

NAME = "public_checkpoint_study"
REPO = Path(__file__).resolve().parents[2]
BIBLE_TEST = "corpus:web-sparv/test.jsonl.gz"
SOURCE_LANG, TARGET_LANG = "en", "es"
SEED = 42

# The rows in page order; "standin" is evaluated, every other row trained.
ROWS: tuple[str, ...] = ("standin", "fine-tune", "dou2018", "grow", "stack", "cad", "admin", "scratch")
LABELS: dict[str, str] = {
    "standin": "stand-in as is (converted, no training)",
    "fine-tune": "fine-tuned",
    "dou2018": "dou2018 warm start (hierarchical aggregation + diversity)",
    "grow": "depth growing (Wu et al. 2019)",
    "stack": "shallow-to-deep stacking (Li et al. 2020)",
    "cad": "li2022 CAD during fine-tuning",
    "admin": "ADMIN (liu2020) warm start",
    "scratch": "from scratch (package defaults)",
}
DEEPENED: tuple[str, ...] = ("dou2018", "grow", "stack", "cad", "admin")
WARM_UP_STEPS = 50
EVAL_STEPS = 100
EVAL_SAMPLES = 500
MAX_TOKENS = 2048
# The options of every fine-tune and deepening row besides the learning rate (module docstring, step 4).
FINE_TUNE_OPTIONS: tuple[str, ...] = (
    "--lr_scheduler_type", "inverse_sqrt", "--warmup_steps", str(WARM_UP_STEPS), "--label_smoothing_factor", "0.1",
    "--max_tokens", str(MAX_TOKENS), "--adam_beta1", "0.9", "--adam_beta2", "0.98", "--weight_decay", "0.0",
    "--max_grad_norm", "1.0", "--eval_strategy", "steps", "--eval_steps", str(EVAL_STEPS), "--max_eval_samples",
    str(EVAL_SAMPLES), "--predict_with_generate", "false", "--save_strategy", "no", "--eval_num_beams", "4",
    "--logging_steps", "10", "--use_cpu", "true", "--dataloader_pin_memory", "false",
)
# Log-only options of every training row (they change nothing that is trained).
QUIET: tuple[str, ...] = ("--disable_tqdm", "true", "--report_to", "none")
# Below this Bible test BLEU the page says that the stand-in is a weak starting point.
WEAK_STANDIN_BLEU = 15.0


# --- the commands -------------------------------------------------------------------------------------------------


def data_options(corpus: Path, *, test: bool = True) -> list[str]:
    """Training, validation and (``test``) test files of the domain corpus, and the language pair."""
    return ["--train_file", str(corpus / "train.jsonl.gz"), "--validation_file", str(corpus / "valid.jsonl.gz"),
            *(["--test_file", str(corpus / "test.jsonl.gz")] if test else []),
            "--source_lang", SOURCE_LANG, "--target_lang", TARGET_LANG]


def stack_shape(encoder: int, decoder: int) -> tuple[int, int]:
    """Shallow-to-deep stacking's target: twice the encoder layers, the decoder kept (module docstring)."""
    return 2 * encoder, decoder


def grow_shape(encoder: int, decoder: int, added: int) -> tuple[int, int]:
    """Depth growing's target: ``added`` new top layers in each stack."""
    return encoder + added, decoder + added


def cad_depth(decoder_layers: int) -> int:
    """li2022's drop depth for a decoder of this depth: round(21/27 · L), as DeepDecoderTransformerConfig's default."""
    return max(1, round(21 / 27 * decoder_layers))


def row_arguments(row: str, args: argparse.Namespace, converted: Path, shape: tuple[int, int],
                  learning_rate: float) -> list[str]:
    """The ``deepnmt train`` arguments of one trained row (without the program name)."""
    work, corpus = Path(args.work_dir), Path(args.corpus)
    common = ["train", *data_options(corpus), "--output_dir", str(work / row), "--max_train_minutes",
              f"{args.minutes:g}", *(["--max_predict_samples", str(args.max_test_samples)]
                                     if args.max_test_samples else []), *QUIET]
    if row == "scratch":
        return common
    tuned = ["--learning_rate", f"{learning_rate:g}", *FINE_TUNE_OPTIONS, "--seed", str(SEED)]
    if row == "fine-tune":
        return [*common, "--model_name_or_path", str(converted), *tuned]
    warm = [*common, "--warm_start_from", str(converted)]
    encoder, decoder = shape
    if row == "dou2018":
        return [*warm, "--model_type", "deep_representation_transformer", *tuned]
    if row == "grow":
        layers = grow_shape(encoder, decoder, args.grow_layers)
        return [*warm, "--warm_start_method", "grow", "--config_overrides",
                f"encoder_layers={layers[0]},decoder_layers={layers[1]}", "--warm_start_hold_pretrained_steps",
                str(args.hold_steps), *tuned]
    if row == "stack":
        layers = stack_shape(encoder, decoder)
        return [*warm, "--warm_start_method", "stack", "--config_overrides",
                f"encoder_layers={layers[0]},decoder_layers={layers[1]}", *tuned]
    if row == "cad":
        return [*warm, "--config_overrides", f"cross_attention_drop_depth={cad_depth(decoder)},"
                f"cross_attention_drop_ratio={args.cad_ratio:g}", *tuned]
    if row == "admin":
        return [*warm, "--model_type", "admin_transformer", *tuned]
    raise ValueError(f"no such row: {row}")


def evaluate_arguments(model: Path, test_file: str, output: Path, threads: int, max_samples: int | None) -> list[str]:
    """``deepnmt evaluate`` of ``model`` on ``test_file`` (beam 4) into ``output``."""
    return ["evaluate", "--model_name_or_path", str(model), "--test_file", test_file, "--source_lang", SOURCE_LANG,
            "--target_lang", TARGET_LANG, "--num_beams", "4", "--threads", str(threads), "--output_json",
            str(output), *(["--max_samples", str(max_samples)] if max_samples else [])]


def shown(arguments: Sequence[str], threads: int) -> str:
    """A command as the page shows it: ``OMP_NUM_THREADS=N deepnmt …``."""
    return f"OMP_NUM_THREADS={threads} deepnmt " + shlex.join(arguments)


def run_deepnmt(arguments: Sequence[str], log: Path, threads: int) -> float:
    """Run ``deepnmt ARGUMENTS`` (this interpreter's ``hf_deepnmt_training.cli``) with its output in ``log``;
    returns its wall seconds. A failure stops the study with the command and the log's last lines."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"$ {shown(arguments, threads)}  (log: {log})")
    started = time.monotonic()
    with log.open("w") as handle:
        code = subprocess.run([sys.executable, "-m", "hf_deepnmt_training.cli", *arguments], env=env, stdout=handle,
                              stderr=subprocess.STDOUT, cwd=REPO).returncode
    seconds = time.monotonic() - started
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"`{shown(arguments, threads)}` failed (exit {code}) after {seconds:.0f} s; its log "
                         f"{log} ends:\n{tail}")
    say(f"  done in {seconds / 60:.1f} min")
    return seconds


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- what a finished run left -------------------------------------------------------------------------------------


def parameter_count(folder: Path) -> int:
    """Parameters of a saved model folder (the model as loaded; tied weights once)."""
    import torch

    import hf_deepnmt  # noqa: F401  (registers the package's model types with the Auto classes)
    from transformers import AutoModelForSeq2SeqLM

    from transformers.utils import logging as transformers_logging

    torch.set_num_threads(1)
    transformers_logging.disable_progress_bar()
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    return sum(parameter.numel() for parameter in model.parameters())


def scores_of(scores: dict) -> dict:
    """BLEU, chrF, sentences and signatures of a `deepnmt evaluate` / metrics.json ``test`` entry."""
    return {"bleu": scores["bleu"], "chrf": scores["chrf"], "sentences": scores.get("sentences"),
            "num_beams": scores.get("num_beams", 4), "signatures": {key: scores["signatures"][key]
                                                                    for key in ("bleu", "chrf")}}


def layers_of(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    return f"{config['encoder_layers']}+{config['decoder_layers']}"


def trained_record(row: str, folder: Path, arguments: Sequence[str], threads: int, seconds: float) -> dict:
    """What the page shows of a finished training row: its command, minutes, steps, parameters, test scores."""
    metrics = json.loads((folder / "metrics.json").read_text())
    state = json.loads((folder / "trainer_state.json").read_text())
    log = (folder.parent / f"{row}.log").read_text(errors="replace")
    new = re.search(r"([\d,]+) parameters new", log)
    config = json.loads((folder / "config.json").read_text())
    validation = [(entry["step"], round(entry["eval_loss"], 4)) for entry in state["log_history"]
                  if "eval_loss" in entry]
    timings = metrics["timings_seconds"]
    return {
        "row": row, "label": LABELS[row], "command": shown(arguments, threads),
        "train_minutes": round(timings["train_seconds"] / 60, 2),
        "total_minutes": round(timings["total_seconds"] / 60, 2), "wall_minutes": round(seconds / 60, 2),
        "steps": metrics["global_step"], "epochs": metrics["epochs"],
        "seconds_per_step": round(timings["train_seconds"] / max(1, metrics["global_step"]), 2),
        "parameters": parameter_count(folder), "new_parameters": int(new.group(1).replace(",", "")) if new else None,
        "model_type": config["model_type"], "layers": layers_of(folder), "d_model": config["d_model"],
        "learning_rate": _option(arguments, "--learning_rate"),
        "validation_loss": validation, "validations": len(validation),
        "validation_seconds": round(sum(entry.get("eval_runtime", 0.0) for entry in state["log_history"]
                                        if "eval_loss" in entry), 1),
        "test": scores_of(metrics["test"]),
    }


def _option(arguments: Sequence[str], name: str) -> str | None:
    return arguments[arguments.index(name) + 1] if name in arguments else None


# --- the stages ---------------------------------------------------------------------------------------------------


def convert(args: argparse.Namespace) -> dict:
    """Stage 1: the stand-in converted into WORK/converted (kept when ``--reuse`` finds it complete)."""
    work = Path(args.work_dir)
    converted = work / "converted"
    record_path = work / "conversion.json"
    if args.reuse and record_path.is_file() and (converted / "model.safetensors").is_file():
        return json.loads(record_path.read_text())
    shutil.rmtree(converted, ignore_errors=True)
    arguments = ["convert", str(args.standin), "--output_dir", str(converted), "--source_lang", SOURCE_LANG,
                 "--target_lang", TARGET_LANG]
    seconds = run_deepnmt(arguments, work / "convert.log", args.threads)
    said = [line for line in (work / "convert.log").read_text(errors="replace").splitlines()
            if "[deepnmt] converted" in line]
    config = json.loads((converted / "config.json").read_text())
    record = {"command": shown(arguments, args.threads), "seconds": round(seconds, 1),
              "printed": said[-1].split("Writing model shards")[0].strip() if said else None,
              "converted_from": config.get("converted_from"), "layers": layers_of(converted),
              "parameters": parameter_count(converted)}
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    return record


def standin_row(args: argparse.Namespace, converted: Path) -> dict:
    """Stage 2: the converted stand-in scored as is on the domain test set and on the Bible test verses."""
    folder = Path(args.work_dir) / "standin"
    folder.mkdir(parents=True, exist_ok=True)
    domain = evaluate_arguments(converted, str(Path(args.corpus) / "test.jsonl.gz"), folder / "gettext-test.json",
                                args.threads, args.max_test_samples)
    bible = evaluate_arguments(converted, BIBLE_TEST, folder / "bible-test.json", args.threads, args.max_test_samples)
    seconds = run_deepnmt(domain, folder / "gettext-test.log", args.threads)
    seconds += run_deepnmt(bible, folder / "bible-test.log", args.threads)
    return {"row": "standin", "label": LABELS["standin"], "command": shown(domain, args.threads),
            "wall_minutes": round(seconds / 60, 2), "train_minutes": 0.0, "steps": 0,
            "parameters": parameter_count(converted), "layers": layers_of(converted),
            "test": scores_of(json.loads((folder / "gettext-test.json").read_text())),
            "bible_test": {**scores_of(json.loads((folder / "bible-test.json").read_text())),
                           "command": shown(bible, args.threads)}}


def probe_learning_rate(args: argparse.Namespace, converted: Path, shape: tuple[int, int]) -> dict:
    """Stage 3: the plain fine-tune for ``--probe_minutes`` at each candidate rate, scored on validation pairs."""
    work = Path(args.work_dir)
    kept = work / "lr-probe.json"
    rates = [float(rate) for rate in args.probe_learning_rates.split(",")]
    if args.reuse and kept.is_file():
        record = json.loads(kept.read_text())
        if record["candidates"] == rates and record["minutes"] == args.probe_minutes:
            return record
    tried = {}
    for rate in rates:
        name = f"lr-probe-{rate:g}"
        folder = work / name
        shutil.rmtree(folder, ignore_errors=True)
        arguments = row_arguments("fine-tune", argparse.Namespace(**{**vars(args), "minutes": args.probe_minutes,
                                                                     "max_test_samples": None}),
                                  converted, shape, rate)
        arguments = _without_test(arguments)
        arguments[arguments.index("--output_dir") + 1] = str(folder)
        run_deepnmt(arguments, work / f"{name}.log", args.threads)
        scored = folder / "valid-scores.json"
        evaluation = evaluate_arguments(folder, str(Path(args.corpus) / "valid.jsonl.gz"), scored, args.threads,
                                        args.probe_valid_samples)
        run_deepnmt(evaluation, work / f"{name}-valid.log", args.threads)
        metrics = json.loads((folder / "metrics.json").read_text())
        tried[f"{rate:g}"] = {"command": shown(arguments, args.threads), "steps": metrics["global_step"],
                              "train_minutes": round(metrics["timings_seconds"]["train_seconds"] / 60, 2),
                              "evaluate_command": shown(evaluation, args.threads),
                              "validation": scores_of(json.loads(scored.read_text()))}
    best = max(tried, key=lambda rate: tried[rate]["validation"]["bleu"])
    record = {"candidates": rates, "minutes": args.probe_minutes, "valid_samples": args.probe_valid_samples,
              "tried": tried, "chosen": float(best)}
    kept.write_text(json.dumps(record, indent=2) + "\n")
    return record


def _without_test(arguments: list[str]) -> list[str]:
    kept, skip = [], False
    for token in arguments:
        if skip:
            skip = False
        elif token in ("--test_file", "--max_predict_samples"):
            skip = True
        else:
            kept.append(token)
    return kept


def train_row(row: str, args: argparse.Namespace, converted: Path, shape: tuple[int, int],
              learning_rate: float) -> dict:
    """Stage 4 for one row: train it (its folder replaced), test it, and keep its record in WORK/<row>/."""
    work = Path(args.work_dir)
    folder = work / row
    shutil.rmtree(folder, ignore_errors=True)
    arguments = row_arguments(row, args, converted, shape, learning_rate)
    seconds = run_deepnmt(arguments, work / f"{row}.log", args.threads)
    record = trained_record(row, folder, arguments, args.threads, seconds)
    if row in ("grow", "stack"):
        record["deepening"] = {"from": f"{shape[0]}+{shape[1]}", "to": record["layers"],
                               "hold_steps": args.hold_steps if row == "grow" else 0}
    if row == "fine-tune":  # stage 5: what the domain cost the Bible
        bible = evaluate_arguments(folder, BIBLE_TEST, folder / "bible-test.json", args.threads,
                                   args.max_test_samples)
        run_deepnmt(bible, work / "fine-tune-bible-test.log", args.threads)
        record["bible_test"] = {**scores_of(json.loads((folder / "bible-test.json").read_text())),
                                "command": shown(bible, args.threads)}
    return record


# --- the study ----------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = experiment_parser(__doc__, work_dir="runs/public_checkpoint_study", threads=1, rows=",".join(ROWS),
                               row_names=ROWS, helps={"threads": "torch threads (OMP_NUM_THREADS) of every run; the "
                                                      "rows run one after the other."})
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="Training budget of every row (deepnmt train --max_train_minutes; default 10).")
    parser.add_argument("--standin", type=Path, default=Path("runs/opus_mt_standin"),
                        help="The MarianMTModel folder that plays the public checkpoint "
                             "(default: runs/opus_mt_standin).")
    parser.add_argument("--corpus", type=Path, default=Path("runs/corpora/gettext-en-es"),
                        help="Folder of the domain corpus' train/valid/test.jsonl.gz "
                             "(default: runs/corpora/gettext-en-es).")
    parser.add_argument("--reuse", action="store_true",
                        help="Skip the conversion, the probe and every row whose outputs exist in WORK_DIR.")
    parser.add_argument("--learning_rate", type=float, default=None,
                        help="Learning rate of every fine-tune row (default: chosen by the probe).")
    parser.add_argument("--probe_learning_rates", default="3e-4,1e-3",
                        help="Candidate learning rates of the probe (default 3e-4,1e-3).")
    parser.add_argument("--probe_minutes", type=float, default=4.0,
                        help="Training minutes of each probe run (default 4).")
    parser.add_argument("--probe_valid_samples", type=int, default=500,
                        help="Validation pairs that score each probe run (default 500).")
    parser.add_argument("--hold_steps", type=int, default=20,
                        help="grow: optimizer steps during which the trained layers are held (default 20).")
    parser.add_argument("--grow_layers", type=int, default=2, help="grow: new top layers per stack (default 2).")
    parser.add_argument("--cad_ratio", type=float, default=0.5, help="cad: cross_attention_drop_ratio (default 0.5).")
    parser.add_argument("--max_test_samples", type=int, default=None,
                        help="Score only the first N test pairs (smoke tests; default: all).")
    parser.add_argument("--reading", type=Path, default=None,
                        help="A markdown file with the hand-written reading, stored in the JSON and shown on the page.")
    args = parser.parse_args(argv)
    args.row_list = chosen_rows(parser, args.rows, ROWS)
    if args.minutes <= 0 or args.probe_minutes <= 0:
        parser.error("--minutes and --probe_minutes must be positive.")
    if not args.render_only:
        if not (args.standin / "config.json").is_file():
            parser.error(f"--standin {args.standin} holds no config.json (is the stand-in trained yet?).")
        missing = [split for split in ("train", "valid", "test") if not (args.corpus / f"{split}.jsonl.gz").is_file()]
        if missing:
            parser.error(f"--corpus {args.corpus} lacks {missing}: build it with "
                         "training/corpus/build_gettext_corpus.py.")
    return args


def standin_facts(folder: Path) -> dict:
    """What ``standin.json`` (written by opus_mt_standin.py) says of the stand-in's own training."""
    path = folder / "standin.json"
    if not path.is_file():
        return {"folder": str(folder)}
    facts = json.loads(path.read_text())
    return {"folder": str(folder), "command": facts["command"], "steps": facts["steps"],
            "train_minutes": facts["train_minutes"], "threads": facts["threads"], "model": facts["model"],
            "corpus": facts["corpus"], "bible_test": facts["test"], "smoke": facts.get("smoke", False)}


def corpus_facts(folder: Path) -> dict:
    stats = folder / "stats.json"
    if not stats.is_file():
        return {"folder": str(folder)}
    facts = json.loads(stats.read_text())
    return {"folder": str(folder), "pairs": facts["pairs"], "command": facts.get("command"),
            "catalog_folder": facts.get("catalog_folder"),
            "held_out": {split: [entry["catalog"] for entry in facts["catalogs"][split]]
                         for split in ("valid", "test")}}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    results = Path(args.results)
    if args.render_only:
        report = json.loads((results / f"{NAME}.json").read_text())
        if args.reading is not None:
            report["reading"] = args.reading.read_text(encoding="utf-8").strip()
            (results / f"{NAME}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        render(report, results)
        return 0
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    conversion = convert(args)
    converted = work / "converted"
    config = json.loads((converted / "config.json").read_text())
    shape = (config["encoder_layers"], config["decoder_layers"])
    trained = [row for row in args.row_list if row not in ("standin", "scratch")]
    if args.learning_rate is not None:
        learning_rate, probe = args.learning_rate, None
    elif trained:
        probe = probe_learning_rate(args, converted, shape)
        learning_rate = probe["chosen"]
    else:
        kept = work / "lr-probe.json"
        probe = json.loads(kept.read_text()) if kept.is_file() else None
        learning_rate = probe["chosen"] if probe else float(args.probe_learning_rates.split(",")[0])
    for row in args.row_list:
        record_path = work / row / "record.json"
        if args.reuse and record_path.is_file():
            say(f"{row}: kept ({record_path})")
            continue
        record = standin_row(args, converted) if row == "standin" else train_row(row, args, converted, shape,
                                                                                   learning_rate)
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        say(f"{row}: test BLEU {record['test']['bleu']}, chrF {record['test']['chrf']}")
    rows = {row: json.loads((work / row / "record.json").read_text()) for row in ROWS
            if (work / row / "record.json").is_file()}
    previous = results / f"{NAME}.json"
    reading = (args.reading.read_text(encoding="utf-8").strip() if args.reading is not None
               else json.loads(previous.read_text()).get("reading") if previous.is_file() else None)
    report = {
        **provenance(NAME), "work_dir": str(work), "minutes": args.minutes, "threads": args.threads,
        "study_minutes_this_invocation": round((time.time() - started) / 60, 1),
        "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "standin": standin_facts(args.standin), "corpus": corpus_facts(args.corpus), "conversion": conversion,
        "fine_tune": {"learning_rate": learning_rate, "learning_rate_from": "given" if args.learning_rate else "probe",
                      "probe": probe, "options": ["--learning_rate", f"{learning_rate:g}", *FINE_TUNE_OPTIONS,
                                                  "--seed", str(SEED)],
                      "hold_steps": args.hold_steps, "grow_layers": args.grow_layers,
                      "cad": {"depth": cad_depth(shape[1]), "ratio": args.cad_ratio}},
        "rows": rows, "reading": reading,
    }
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{NAME}.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    render(report, results)
    say(f"wrote {results / (NAME + '.json')} and {results / (NAME + '.md')}")
    return 0


# --- the page -----------------------------------------------------------------------------------------------------


def _bleu(report: dict, row: str) -> float | None:
    entry = report["rows"].get(row)
    return None if entry is None else entry["test"]["bleu"]


def _count(value: int | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1e6:.2f} M" if value >= 100_000 else f"{value:,}"


def goal_lines(report: dict) -> list[str]:
    """The issue's two goals, met or not, from the rows' numbers."""
    lines = []
    fine, scratch = _bleu(report, "fine-tune"), _bleu(report, "scratch")
    if fine is not None and scratch is not None:
        gap = fine - scratch
        lines.append(f"- Fine-tuning ≥ from scratch + 5 BLEU at the same {report['minutes']:g}-minute budget: "
                     f"{fine} vs {scratch} (Δ {gap:+.2f}) → **{'met' if gap >= 5 else 'not met'}**.")
    else:
        lines.append("- Fine-tuning vs from scratch: not both rows ran.")
    deepened = {row: _bleu(report, row) for row in DEEPENED if _bleu(report, row) is not None}
    if fine is not None and deepened:
        best = max(deepened, key=lambda row: deepened[row])
        each = "; ".join(f"{row} {bleu} ({bleu - fine:+.2f})" for row, bleu in deepened.items())
        met = deepened[best] > fine
        lines.append(f"- A deepened model above plain fine-tuning ({fine}): {each} → "
                     f"**{'met' if met else 'not met'}** (best: {best}, Δ {deepened[best] - fine:+.2f}).")
    standin = report["rows"].get("standin")
    if fine is not None and standin is not None:
        lines.append(f"- What fine-tuning added to the stand-in on the domain: {standin['test']['bleu']} → {fine} "
                     f"BLEU (Δ {fine - standin['test']['bleu']:+.2f}).")
    return lines


def standin_lines(report: dict) -> list[str]:
    facts = report["standin"]
    standin = report["rows"].get("standin")
    lines = []
    if "steps" in facts:
        model = facts["model"]
        lines.append(
            f"The stand-in: `{facts['command']}` — a MarianMTModel "
            f"{model['encoder_layers']}+{model['decoder_layers']} layers, d_model {model['d_model']}, "
            f"FFN {model['ffn_dim']}, {model['heads']} heads, "
            f"{model['parameters']:,} parameters (transformers' count), trained by transformers' Seq2SeqTrainer on "
            f"the {facts['corpus']['train']:,} Bible training pairs for {facts['steps']:,} steps "
            f"({facts['train_minutes']} min, {facts['threads']} thread); its own script scored its Bible test "
            f"{facts['bible_test']['bleu']} BLEU / {facts['bible_test']['chrf']} chrF "
            f"(transformers' generate, beam {facts['bible_test']['num_beams']}, "
            f"{facts['corpus']['test']} verses).")
    if standin is not None and "bible_test" in standin:
        lines.append(f"Converted (`{report['conversion']['command']}`), it scores {standin['bible_test']['bleu']} "
                     f"BLEU / {standin['bible_test']['chrf']} chrF on the Bible test verses "
                     f"(`{standin['bible_test']['command']}`).")
    bleu = (standin or {}).get("bible_test", {}).get("bleu", facts.get("bible_test", {}).get("bleu"))
    if bleu is not None and bleu < WEAK_STANDIN_BLEU:
        lines.append(f"**A weak starting point:** {bleu} BLEU on its own test set is far below a real OPUS-MT model "
                     f"(one CPU thread trained it for {facts.get('steps', '?')} steps); what it knows bounds what "
                     "fine-tuning can gain over training from scratch.")
    return lines


def render(report: dict, results_dir: Path) -> None:
    """``public_checkpoint_study.md`` from the study's JSON."""
    rows = report["rows"]
    fine_tune = report["fine_tune"]
    corpus = report["corpus"]
    lines = ["# A public checkpoint converted, adapted to a domain, and deepened (issue 61, item 5)", "",
             f"Study command: `{report['command']}` (commit {report['commit']}, finished {report['finished']}; "
             f"runs in `{report['work_dir']}`). Every row trains with the same wall-clock budget, "
             f"`--max_train_minutes {report['minutes']:g}` (validation included), on {report['threads']} CPU thread, "
             "one row at a time; each is tested at its end on the domain test set, beam 4, by sacreBLEU.", ""]
    lines += standin_lines(report)
    if "pairs" in corpus:
        pairs = corpus["pairs"]
        lines += ["", f"Domain: English→Spanish software messages from this machine's gettext catalogs "
                      f"(`{corpus['command']}`, {corpus['catalog_folder']}): {pairs['train']:,} training, "
                      f"{pairs['valid']:,} validation and {pairs['test']:,} test pairs; whole catalogs are held out "
                      f"(validation: {', '.join(corpus['held_out']['valid'])}; test: "
                      f"{', '.join(corpus['held_out']['test'])})."]
    lines += ["", "## Results", "",
              "| row | test BLEU | test chrF | train minutes | steps | s/step (validation included) | parameters | "
              "layers | command |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        entry = rows.get(row)
        if entry is None:
            continue
        steps = entry.get("steps", 0)
        per_step = entry.get("seconds_per_step", "—") if steps else "—"
        lines.append(f"| {entry['label']} | {entry['test']['bleu']} | {entry['test']['chrf']} | "
                     f"{entry.get('train_minutes', 0)} | {steps} | {per_step} | {_count(entry.get('parameters'))}"
                     + (f" ({_count(entry['new_parameters'])} new)" if entry.get("new_parameters") else "")
                     + f" | {entry.get('layers', '')} | `{entry['command']}` |")
    signatures = next((entry["test"]["signatures"] for entry in rows.values()), None)
    sentences = next((entry["test"]["sentences"] for entry in rows.values()), None)
    if signatures:
        lines += ["", f"Test: {sentences} pairs of the domain test set. sacreBLEU signatures: BLEU "
                      f"`{signatures['bleu']}`, chrF `{signatures['chrf']}`."]
    lines += ["", "## Goals", "", *goal_lines(report)]
    if report.get("reading"):
        lines += ["", "## Reading", "", report["reading"]]
    lines += ["", "## How the rows were trained", ""]
    options = " ".join(fine_tune["options"])
    lines.append(f"Every fine-tune and deepening row: `{options}` (the NMT defaults apply only to a model trained "
                 "from scratch, so they are given; inverse square root does not depend on the run length). "
                 f"The scratch row gives only the data, the languages and the budget: the package's defaults choose "
                 "the rest.")
    probe = fine_tune.get("probe")
    if probe:
        tried = "; ".join(f"{rate}: validation BLEU {entry['validation']['bleu']} after {entry['steps']} steps "
                          f"(`{entry['command']}`, then `{entry['evaluate_command']}`)"
                          for rate, entry in probe["tried"].items())
        candidates = ", ".join(f"{rate:g}" for rate in probe["candidates"])
        lines += ["", f"Learning rate: {fine_tune['learning_rate']:g}, chosen by the plain fine-tune trained "
                      f"{probe['minutes']:g} minutes at each of {candidates} and scored on the first "
                      f"{probe['valid_samples']} validation pairs (beam 4; the test set was not used): {tried}."]
    else:
        lines += ["", f"Learning rate: {fine_tune['learning_rate']:g} ({fine_tune['learning_rate_from']})."]
    grow = rows.get("grow")
    fine = rows.get("fine-tune")
    if grow is not None:
        share = (f", {100 * fine_tune['hold_steps'] / fine['steps']:.0f}% of the {fine['steps']} steps the plain "
                 "fine-tune trained" if fine and fine.get("steps") else "")
        lines += ["", f"Depth growing held the trained layers for {fine_tune['hold_steps']} optimizer steps{share}, "
                      "while the new top layers learned (Wu et al. 2019 train the grown layers on a frozen base "
                      "first)."]
    cad = fine_tune["cad"]
    lines += ["", f"CAD: `cross_attention_drop_depth={cad['depth']}` (li2022's rule, round(21/27 × decoder layers)), "
                  f"`cross_attention_drop_ratio={cad['ratio']:g}`; stacking doubles the encoder and keeps the decoder "
                  "(shallow-to-deep training deepens the encoder; encoder layers cost nothing per decoding step)."]
    conversion = report["conversion"]
    lines += ["", f"Conversion: `{conversion['command']}` ({conversion['seconds']} s): {conversion['printed']}"]
    curves = [(entry["label"], entry["validation_loss"]) for row, entry in rows.items() if entry.get("validation_loss")]
    if curves:
        lines += ["", f"Validation loss at each validation (step: loss; the unsmoothed NLL per target token on the "
                      f"first {EVAL_SAMPLES} validation pairs, no auxiliary term; comparable between the rows that "
                      "share the stand-in's tokenizer, not with the scratch row's own BPE):", ""]
        lines += [f"- {label}: " + ", ".join(f"{step}: {loss}" for step, loss in curve) for label, curve in curves]
    spent = [f"{entry['label']} {entry['validations']} ({entry['validation_seconds']} s)" for entry in rows.values()
             if "validation_seconds" in entry]
    if spent:
        lines += ["", "Validations inside each row's budget (count, seconds): " + "; ".join(spent) + ". The scratch "
                      "row validates as its defaults do (BLEU of greedy translations every quarter of the budget and "
                      "at its end, the best checkpoint kept); the others on the loss only."]
    if fine and "bible_test" in fine:
        standin = rows.get("standin", {}).get("bible_test")
        before = f"{standin['bleu']} → " if standin else ""
        lines += ["", f"The fine-tuned model on the Bible test verses: {before}{fine['bible_test']['bleu']} BLEU "
                      f"(`{fine['bible_test']['command']}`)."]
    (Path(results_dir) / f"{NAME}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
