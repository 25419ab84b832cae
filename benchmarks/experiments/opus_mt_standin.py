"""A stand-in for a public OPUS-MT checkpoint, built and trained with transformers' own classes only.

The conversion study (``deepnmt convert`` of OPUS-MT/Marian checkpoints, then domain adaptation) needs a "public
checkpoint" to convert, and the Hub cannot be reached here. This script makes one: an OPUS-MT-shaped English→Spanish
``MarianMTModel`` with a ``MarianTokenizer`` folder, trained on the embedded Bible corpus
(``training/corpus/web-sparv``) by ``Seq2SeqTrainer``. None of ``hf_deepnmt``'s model, tokenizer or training code is
used, so the converter meets a checkpoint that it did not write, as it would meet Helsinki-NLP's.

Procedure
---------
1. Tokenizer. A SentencePiece unigram model (``--vocab_size``, default 8000 pieces) is trained with the
   ``sentencepiece`` package jointly on the English and Spanish training sentences (one thread, so the model is the
   same on every run), with ``</s>`` as id 0, ``<unk>`` as id 1 and no ``<s>`` or ``<pad>`` pieces, as OPUS-MT's.
   The one model is written as both ``source.spm`` and ``target.spm``; ``vocab.json`` maps the pieces to their
   SentencePiece ids and appends ``<pad>`` as the last id. ``MarianTokenizer`` reads the folder (it needs
   ``sacremoses`` for its punctuation normaliser).
2. Model: ``MarianConfig`` as OPUS-MT's transformer-align models: post-LN, 6 encoder and 6 decoder layers,
   ``activation_function="swish"``, static sinusoidal positions (512), ``scale_embedding=True``, one vocabulary shared
   by encoder and decoder (``share_encoder_decoder_embeddings=True``) and tied to the output layer, eos 0, unk 1,
   ``<pad>`` = the last id, also ``decoder_start_token_id``; dropout 0.1, no attention or activation dropout. The
   generation config is OPUS-MT's: ``bad_words_ids=[[pad]]``, ``forced_eos_token_id=0``, beam 4,
   ``max_length=512``, ``renormalize_logits=True``. Width: OPUS-MT is d_model 512 / FFN 2048 / 8 heads, which one
   CPU thread cannot train usefully in a couple of hours; the defaults here are d_model 256 / FFN 1024 / 4 heads
   (``--d_model``, ``--ffn_dim``, ``--heads``, ``--layers`` change them).
3. Output bias. transformers keeps Marian's ``final_logits_bias`` as a buffer that no optimizer step touches (zero
   after ``MarianMTModel(config)``); a real OPUS-MT checkpoint carries the learned, nonzero output bias of Marian.
   So that the stand-in has a meaningful nonzero bias for a converter to carry over, it is set before training to
   the log unigram frequency of the target training tokens (add-one smoothed, centred on the mean over the
   vocabulary; ``<pad>`` gets the lowest value) and stays fixed while the rest trains around it.
4. Training: ``Seq2SeqTrainer`` with label smoothing 0.1, AdamW (0.9, 0.98, eps 1e-9, no weight decay), peak
   learning rate 5e-4 after ``--warmup_steps`` (1000) of linear warm-up, then inverse square root decay (which does
   not depend on the run length), batches of 64 sentence pairs grouped by length, gradient norm clipped at 1.
   Training stops at ``--max_steps`` or after ``--max_minutes`` of training wall time, whichever comes first.
5. Evaluation, after training: the loss on the 983 validation verses, and beam-4 translation of the 998 test verses
   (batches of 32 sorted by length, so padding is small) scored with sacrebleu's corpus BLEU and chrF.
6. Output (``--output_dir``, default ``runs/opus_mt_standin``): ``config.json``, ``generation_config.json``,
   ``model.safetensors`` (``save_pretrained``), the tokenizer folder (``source.spm``, ``target.spm``,
   ``vocab.json``, ``tokenizer_config.json``), ``test.hyp.es`` (the test translations, one a line) and
   ``standin.json`` (the command, steps, minutes, threads, sizes, losses and scores). The saved folder is reloaded
   with ``MarianMTModel.from_pretrained`` before scoring, so the scores are those of the files a converter reads.

Run from the repository root (nothing is downloaded; ``HF_HUB_OFFLINE=1`` is set)::

    # smoke (about a minute): a tiny model, 20 steps, 40 test verses
    OMP_NUM_THREADS=1 python -m benchmarks.experiments.opus_mt_standin --smoke --output_dir runs/opus_mt_standin_smoke
    # the stand-in of the conversion study: one thread, 100 minutes of training
    OMP_NUM_THREADS=1 nohup python -m benchmarks.experiments.opus_mt_standin --threads 1 --max_minutes 100 \\
        --output_dir runs/opus_mt_standin > runs/opus_mt_standin.log 2>&1 &

It needs the ``sentencepiece`` and ``sacremoses`` packages besides transformers, torch, datasets and sacrebleu.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "training" / "corpus" / "web-sparv"
SOURCE_LANG, TARGET_LANG = "en", "es"
OPUS_MT_WIDTH = {"d_model": 512, "ffn_dim": 2048, "heads": 8}  # what a real OPUS-MT transformer-align has
MAX_LENGTH = 256  # tokens per side when training and translating (the longest Bible verse is far shorter)


def read_pairs(path: Path, limit: int | None = None) -> tuple[list[str], list[str]]:
    """English and Spanish sides of a ``{"translation": {"en": ..., "es": ...}}`` JSON-lines file (``.gz`` read)."""
    sources: list[str] = []
    targets: list[str] = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                translation = json.loads(line)["translation"]
                source, target = translation[SOURCE_LANG], translation[TARGET_LANG]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise SystemExit(f"error: {path} line {number} is not a {{\"translation\": {{\"en\", \"es\"}}}} "
                                 "record.") from None
            sources.append(source)
            targets.append(target)
            if limit is not None and len(sources) >= limit:
                break
    return sources, targets


def train_sentencepiece(sentences: Sequence[str], vocab_size: int, folder: Path) -> Path:
    """Train the joint unigram SentencePiece model of step 1 into ``folder``; return the model file."""
    import sentencepiece as spm

    text = folder / "spm_train.txt"
    text.write_text("".join(s.replace("\n", " ") + "\n" for s in sentences), encoding="utf-8")
    prefix = folder / "joint"
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(prefix), vocab_size=vocab_size, model_type="unigram",
        character_coverage=1.0, eos_id=0, unk_id=1, bos_id=-1, pad_id=-1, num_threads=1,
        input_sentence_size=0, shuffle_input_sentence=False, minloglevel=2,
    )
    return prefix.with_suffix(".model")


def write_marian_tokenizer(spm_model: Path, folder: Path) -> Any:
    """Write the MarianTokenizer files of step 1 into ``folder`` and load them back with MarianTokenizer."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    processor = spm.SentencePieceProcessor(model_file=str(spm_model))
    if processor.id_to_piece(0) != "</s>" or processor.id_to_piece(1) != "<unk>":
        raise RuntimeError("the SentencePiece model does not have </s> = 0 and <unk> = 1")
    vocab = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    vocab["<pad>"] = len(vocab)
    folder.mkdir(parents=True, exist_ok=True)
    data = spm_model.read_bytes()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "source.spm").write_bytes(data)
        (work / "target.spm").write_bytes(data)
        (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=2), encoding="utf-8")
        tokenizer = MarianTokenizer(source_spm=str(work / "source.spm"), target_spm=str(work / "target.spm"),
                                    vocab=str(work / "vocab.json"), source_lang=SOURCE_LANG,
                                    target_lang=TARGET_LANG, model_max_length=512)
        tokenizer.save_pretrained(folder)
    tokenizer = MarianTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id != len(vocab) - 1 or tokenizer.eos_token_id != 0 or tokenizer.unk_token_id != 1:
        raise RuntimeError(f"unexpected special ids: pad {tokenizer.pad_token_id}, eos {tokenizer.eos_token_id}, "
                           f"unk {tokenizer.unk_token_id}")
    return tokenizer


def build_model(vocab_size: int, pad_id: int, d_model: int, ffn_dim: int, heads: int, layers: int) -> Any:
    """The OPUS-MT-shaped MarianMTModel of step 2, with OPUS-MT's generation config."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d_model,
        encoder_layers=layers, decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
        encoder_ffn_dim=ffn_dim, decoder_ffn_dim=ffn_dim, activation_function="swish",
        max_position_embeddings=512, scale_embedding=True, share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=pad_id, eos_token_id=0, bos_token_id=0, decoder_start_token_id=pad_id,
        forced_eos_token_id=0,
    )
    model = MarianMTModel(config)
    model.generation_config = GenerationConfig(
        bad_words_ids=[[pad_id]], bos_token_id=0, decoder_start_token_id=pad_id, eos_token_id=0,
        forced_eos_token_id=0, max_length=512, num_beams=4, pad_token_id=pad_id, renormalize_logits=True,
    )
    return model


def unigram_log_bias(label_ids: Sequence[Sequence[int]], vocab_size: int, pad_id: int) -> Any:
    """Step 3: centred, add-one-smoothed log unigram frequency of the target tokens; ``<pad>`` the lowest value."""
    import torch

    counts = torch.ones(vocab_size, dtype=torch.float64)
    for ids in label_ids:
        counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size).double()
    counts[pad_id] = 1.0
    log_p = counts.log() - counts.sum().log()
    keep = torch.ones(vocab_size, dtype=torch.bool)
    keep[pad_id] = False
    bias = log_p - log_p[keep].mean()
    bias[pad_id] = bias[keep].min()
    return bias.float().unsqueeze(0)


def translate(model: Any, tokenizer: Any, sources: Sequence[str], num_beams: int, batch_size: int) -> list[str]:
    """Beam-search translations of ``sources`` (in their order), batched by length."""
    import torch

    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[str] = [""] * len(sources)
    model.eval()
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = [sources[i] for i in order[start:start + batch_size]]
            inputs = tokenizer(batch, return_tensors="pt", padding=True, truncation=True, max_length=MAX_LENGTH)
            generated = model.generate(**inputs, num_beams=num_beams, max_length=MAX_LENGTH + 1)
            for i, text in zip(order[start:start + batch_size],
                               tokenizer.batch_decode(generated, skip_special_tokens=True)):
                outputs[i] = text
    return outputs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=Path("runs/opus_mt_standin"),
                        help="Folder of the model, tokenizer and standin.json (default: runs/opus_mt_standin).")
    parser.add_argument("--corpus_dir", type=Path, default=CORPUS,
                        help="Folder with train/valid/test.jsonl.gz (default: the embedded Bible corpus).")
    parser.add_argument("--max_steps", type=int, default=1_000_000,
                        help="Training steps at most (default: no practical limit; --max_minutes decides).")
    parser.add_argument("--max_minutes", type=float, default=100.0,
                        help="Training wall-clock minutes at most (default 100); evaluation comes after.")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1).")
    parser.add_argument("--seed", type=int, default=42, help="Seed of initialisation, dropout and batching.")
    parser.add_argument("--d_model", type=int, default=256, help="Model width (OPUS-MT: 512; default 256).")
    parser.add_argument("--ffn_dim", type=int, default=1024, help="Feed-forward width (OPUS-MT: 2048; default 1024).")
    parser.add_argument("--heads", type=int, default=4, help="Attention heads (OPUS-MT: 8; default 4).")
    parser.add_argument("--layers", type=int, default=6, help="Encoder and decoder layers each (OPUS-MT: 6).")
    parser.add_argument("--vocab_size", type=int, default=8000, help="SentencePiece pieces (default 8000).")
    parser.add_argument("--batch_size", type=int, default=64, help="Sentence pairs per training step (default 64).")
    parser.add_argument("--learning_rate", type=float, default=5e-4, help="Peak learning rate (default 5e-4).")
    parser.add_argument("--warmup_steps", type=int, default=1000, help="Linear warm-up steps (default 1000).")
    parser.add_argument("--logging_steps", type=int, default=50, help="Log the loss every this many steps.")
    parser.add_argument("--num_beams", type=int, default=4, help="Beam size of the test translation (default 4).")
    parser.add_argument("--test_samples", type=int, default=None,
                        help="Translate only the first N test verses (default: all 998).")
    parser.add_argument("--smoke", action="store_true",
                        help="Test the script end to end in about a minute: d_model 32, FFN 64, 2 heads, 2 layers, "
                             "1000 pieces, 20 steps, warm-up 10, 2000 training pairs, 40 test verses, beam 2.")
    args = parser.parse_args(argv)
    if args.smoke:
        args.d_model, args.ffn_dim, args.heads, args.layers, args.vocab_size = 32, 64, 2, 2, 1000
        args.max_steps, args.warmup_steps, args.logging_steps = min(args.max_steps, 20), 10, 5
        args.test_samples, args.num_beams = args.test_samples or 40, 2
    for name in ("max_steps", "threads", "d_model", "ffn_dim", "heads", "layers", "batch_size", "num_beams",
                 "logging_steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1.")
    if args.max_minutes <= 0:
        parser.error("--max_minutes must be positive.")
    if args.d_model % args.heads:
        parser.error(f"--d_model {args.d_model} is not divisible by --heads {args.heads}.")
    if args.vocab_size < 100:
        parser.error("--vocab_size must be at least 100.")
    if args.warmup_steps < 0:
        parser.error("--warmup_steps must be 0 or more.")
    for split in ("train", "valid", "test"):
        if not (args.corpus_dir / f"{split}.jsonl.gz").is_file():
            parser.error(f"{args.corpus_dir / f'{split}.jsonl.gz'} does not exist.")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import datasets
    import sacrebleu
    import sentencepiece
    import torch
    import transformers
    from transformers import (DataCollatorForSeq2Seq, MarianMTModel, MarianTokenizer, PrinterCallback,
                              Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback)

    torch.set_num_threads(args.threads)
    transformers.set_seed(args.seed)
    datasets.disable_progress_bars()
    output_dir: Path = args.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{(time.monotonic() - started) / 60:6.1f} min] {message}", flush=True)

    train_limit = 2000 if args.smoke else None
    train_src, train_tgt = read_pairs(args.corpus_dir / "train.jsonl.gz", train_limit)
    valid_src, valid_tgt = read_pairs(args.corpus_dir / "valid.jsonl.gz", 200 if args.smoke else None)
    test_src, test_tgt = read_pairs(args.corpus_dir / "test.jsonl.gz", args.test_samples)
    say(f"corpus: {len(train_src)} train, {len(valid_src)} valid, {len(test_src)} test pairs")

    with tempfile.TemporaryDirectory() as scratch:
        spm_model = train_sentencepiece(train_src + train_tgt, args.vocab_size, Path(scratch))
        tokenizer = write_marian_tokenizer(spm_model, output_dir)
    pad_id = tokenizer.pad_token_id
    vocab_size = len(tokenizer.encoder)
    say(f"tokenizer: {vocab_size} ids (pad {pad_id}, eos {tokenizer.eos_token_id}, unk {tokenizer.unk_token_id})")

    def encode(sources: list[str], targets: list[str]) -> datasets.Dataset:
        encoded = tokenizer(sources, text_target=targets, truncation=True, max_length=MAX_LENGTH)
        return datasets.Dataset.from_dict({"input_ids": encoded["input_ids"],
                                           "attention_mask": encoded["attention_mask"],
                                           "labels": encoded["labels"]})

    train_set, valid_set = encode(train_src, train_tgt), encode(valid_src, valid_tgt)
    unk_share = sum(ids.count(tokenizer.unk_token_id) for ids in train_set["labels"]) / max(
        1, sum(len(ids) for ids in train_set["labels"]))
    say(f"encoded: {sum(len(x) for x in train_set['input_ids'])} source and "
        f"{sum(len(x) for x in train_set['labels'])} target tokens; <unk> share of targets {unk_share:.5f}")

    model = build_model(vocab_size, pad_id, args.d_model, args.ffn_dim, args.heads, args.layers)
    with torch.no_grad():
        model.final_logits_bias.copy_(unigram_log_bias(train_set["labels"], vocab_size, pad_id))
    parameters = sum(p.numel() for p in model.parameters())
    say(f"model: MarianMTModel d_model {args.d_model}, FFN {args.ffn_dim}, {args.heads} heads, "
        f"{args.layers}+{args.layers} layers, {parameters / 1e6:.2f}M parameters; "
        f"final_logits_bias range [{model.final_logits_bias.min():.2f}, {model.final_logits_bias.max():.2f}]")

    class Budget(TrainerCallback):
        """Stop after --max_minutes of training; print a progress line with the step speed."""

        def __init__(self) -> None:
            self.start = 0.0
            self.minutes = 0.0

        def on_train_begin(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.monotonic()

        def on_step_end(self, targs: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.minutes = (time.monotonic() - self.start) / 60
            if self.minutes >= args.max_minutes:
                control.should_training_stop = True

        def on_log(self, targs: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                elapsed = time.monotonic() - self.start
                say(f"step {state.global_step}: loss {logs['loss']:.4f}, lr {logs.get('learning_rate', 0):.2e}, "
                    f"{state.global_step / max(elapsed, 1e-9):.3f} steps/s")

    budget = Budget()
    training_args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir / "trainer"), max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=32,
        learning_rate=args.learning_rate, lr_scheduler_type="inverse_sqrt", warmup_steps=args.warmup_steps,
        adam_beta1=0.9, adam_beta2=0.98, adam_epsilon=1e-9, weight_decay=0.0, max_grad_norm=1.0,
        label_smoothing_factor=0.1, train_sampling_strategy="group_by_length", seed=args.seed,
        logging_steps=args.logging_steps, eval_strategy="no", save_strategy="no", report_to="none",
        disable_tqdm=True, use_cpu=True, dataloader_num_workers=0, predict_with_generate=False,
    )
    trainer = Seq2SeqTrainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=valid_set,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
                             processing_class=tokenizer, callbacks=[budget])
    trainer.remove_callback(PrinterCallback)  # Budget prints the progress lines
    say(f"training: at most {args.max_steps} steps or {args.max_minutes:g} minutes, {args.threads} thread(s)")
    result = trainer.train()
    steps = trainer.state.global_step
    train_minutes = budget.minutes
    stopped_by = "max_minutes" if steps < args.max_steps else "max_steps"
    say(f"trained {steps} steps in {train_minutes:.1f} minutes ({stopped_by}); mean loss {result.training_loss:.4f}")
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]

    eval_start = time.monotonic()
    valid_loss = trainer.evaluate()["eval_loss"]
    say(f"validation loss {valid_loss:.4f} (label-smoothed)")
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    del trainer
    try:
        (output_dir / "trainer").rmdir()  # the Trainer's own folder, empty without checkpoints
    except OSError:
        pass

    loaded = MarianMTModel.from_pretrained(output_dir)
    loaded_tokenizer = MarianTokenizer.from_pretrained(output_dir)
    if not torch.equal(loaded.final_logits_bias, model.final_logits_bias):
        raise RuntimeError("final_logits_bias did not survive save_pretrained/from_pretrained")
    hypotheses = translate(loaded, loaded_tokenizer, test_src, args.num_beams, 32)
    (output_dir / "test.hyp.es").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
    bleu = bleu_metric.corpus_score(hypotheses, [test_tgt])
    chrf = chrf_metric.corpus_score(hypotheses, [test_tgt])
    eval_minutes = (time.monotonic() - eval_start) / 60
    say(f"test ({len(test_src)} verses, beam {args.num_beams}): BLEU {bleu.score:.2f}, chrF {chrf.score:.2f} "
        f"({eval_minutes:.1f} minutes of evaluation)")

    record = {
        "command": "OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", "unset") + " python -m "
                   "benchmarks.experiments.opus_mt_standin " + shlex.join(sys.argv[1:]),
        "smoke": args.smoke,
        "steps": steps,
        "stopped_by": stopped_by,
        "train_minutes": round(train_minutes, 2),
        "steps_per_second": round(steps / max(train_minutes * 60, 1e-9), 4),
        "eval_minutes": round(eval_minutes, 2),
        "threads": args.threads,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "seed": args.seed,
        "corpus": {"dir": str(args.corpus_dir), "train": len(train_src), "valid": len(valid_src),
                   "test": len(test_src)},
        "model": {"class": "MarianMTModel", "d_model": args.d_model, "ffn_dim": args.ffn_dim, "heads": args.heads,
                  "encoder_layers": args.layers, "decoder_layers": args.layers, "vocab_size": vocab_size,
                  "parameters": parameters, "opus_mt_width": OPUS_MT_WIDTH,
                  "width_note": "narrower than OPUS-MT (d_model 512, FFN 2048, 8 heads) so that one CPU thread "
                                "trains it in the budget" if args.d_model < 512 else None},
        "tokenizer": {"class": "MarianTokenizer", "sentencepiece": "unigram, joint en+es", "pieces": args.vocab_size,
                      "target_unk_share": round(unk_share, 6)},
        "final_logits_bias": "centred log unigram frequency of the target training tokens (not trained)",
        "training": {"batch_size": args.batch_size, "learning_rate": args.learning_rate,
                     "lr_scheduler": "inverse_sqrt", "warmup_steps": args.warmup_steps, "label_smoothing": 0.1,
                     "optimizer": "adamw_torch (0.9, 0.98, 1e-9)", "max_steps": args.max_steps,
                     "max_minutes": args.max_minutes, "mean_train_loss": round(result.training_loss, 4),
                     "last_logged_loss": losses[-1] if losses else None},
        "valid_loss": round(valid_loss, 4),
        "test": {"num_beams": args.num_beams, "bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2),
                 "bleu_signature": str(bleu_metric.get_signature()),
                 "chrf_signature": str(chrf_metric.get_signature())},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "sentencepiece": sentencepiece.__version__, "sacrebleu": sacrebleu.__version__,
                     "python": sys.version.split()[0]},
    }
    (output_dir / "standin.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    say(f"wrote {output_dir} (model, tokenizer, test.hyp.es, standin.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
