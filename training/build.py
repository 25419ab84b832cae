"""What `deepnmt train` builds before training: the tokenizer (loaded, or a joint BPE trained on the training data), the
model (fine-tuned, warm-started or new, from a preset / recipe / ``--config_overrides``), how ``--torch_compile``
compiles it, the optimizer and the learning-rate schedule.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainingArguments

import hf_deepnmt  # noqa: F401  (registers the model types)
from hf_deepnmt import record_language_pair
from hf_deepnmt.errors import UserInputError
from hf_deepnmt.papers import DTMT
from hf_deepnmt.registry import MODEL_TYPES

from .data import DataArguments
from .errors import hub_lookup
from .recipes import model_fields
from .schedules import SCHEDULES, rnnplus_scheduler_factory
from .tokenizer import train_joint_bpe_from_texts

if TYPE_CHECKING:
    from .train_arguments import ModelArguments


def load_or_train_tokenizer(model_args: ModelArguments, data_args: DataArguments, training_args: Any,
                            train_read: Any) -> Any:
    """The tokenizer of a run: the one named (or the fine-tuned / warm-start model's), the run's own when
    resuming, else a joint BPE of the training data (`hf_deepnmt_training.preprocess.ReadSplit`)."""
    if model_args.tokenizer_name or model_args.model_name_or_path or model_args.warm_start_from:
        name, flag = next((getattr(model_args, option), f"--{option}") for option in
                          ("tokenizer_name", "model_name_or_path", "warm_start_from") if getattr(model_args, option))
        converted = converted_source(name) if flag != "--tokenizer_name" else None
        if converted is not None:  # a Marian / FSMT model: the converted model's tokenizer (FSMT's targets fixed)
            return converted[1]
        with hub_lookup(name, flag):
            return AutoTokenizer.from_pretrained(name)
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(desc="joint BPE"):
        if (output_dir / "tokenizer.json").exists():  # resuming, or another process trained it
            return AutoTokenizer.from_pretrained(output_dir)
        if train_read is None:
            raise UserInputError("No tokenizer: pass --tokenizer_name or training data to train a joint BPE on.")
        return _joint_bpe(model_args, data_args, training_args, train_read, output_dir)


def _joint_bpe(model_args: ModelArguments, data_args: DataArguments, training_args: Any, train_read: Any,
               output_dir: Path) -> Any:
    """The joint BPE of the training data: reused from the cache when the same data, size and options were trained
    before (`hf_deepnmt_training.preprocess.bpe_folder`), else trained on every pair or on a random sample of
    ``--bpe_sample_pairs`` pairs (docs/data.md) and kept in the cache."""
    from .preprocess import bpe_folder, bpe_texts

    limit = max(data_args.max_source_length, data_args.max_target_length)
    sample = model_args.bpe_sample_pairs
    options = dict(vocab_size=model_args.vocab_size, min_frequency=model_args.bpe_min_frequency,
                   model_max_length=limit, sample_pairs=min(sample, len(train_read)), seed=training_args.seed)
    folder = bpe_folder(train_read, **options)
    started = time.time()
    if (folder / "tokenizer.json").exists():
        print(f"[deepnmt] reusing the joint BPE trained before on the same data and options ({folder})",
              file=sys.stderr)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    else:
        texts, pairs = bpe_texts(train_read, sample, training_args.seed)
        of = "" if pairs == len(train_read) else f" (a random sample of {len(train_read):,})"
        print(f"[deepnmt] training a joint BPE ({model_args.vocab_size} tokens) on {pairs:,} pairs{of}",
              file=sys.stderr)
        tokenizer = train_joint_bpe_from_texts(
            texts, 2 * pairs, vocab_size=model_args.vocab_size, min_frequency=model_args.bpe_min_frequency,
            model_max_length=limit, show_progress=training_args.local_process_index == 0
            and not training_args.disable_tqdm)
        staged = folder.with_name(f".{folder.name}-{os.getpid()}")
        tokenizer.save_pretrained(staged)
        if folder.exists():  # another run finished the same BPE meanwhile: keep theirs
            shutil.rmtree(staged, ignore_errors=True)
        else:
            os.replace(staged, folder)
    tokenizer.save_pretrained(output_dir)
    train_read.bpe_seconds = round(time.time() - started, 1)
    return tokenizer


def build_model(model_args: ModelArguments, data_args: DataArguments, recipe_model: dict, tokenizer,
                 label_smoothing: float = 0.0):
    """The model to train: fine-tuned, warm-started or new, its config recording the language pair it is trained
    for (`hf_deepnmt.record_language_pair`, read by ``pipeline("translation")`` to check ``src_lang``/``tgt_lang``)."""
    model = new_or_loaded_model(model_args, data_args, recipe_model, tokenizer, label_smoothing)
    record_language_pair(model.config, data_args.source_lang, data_args.target_lang)
    return model


def new_model_config(model_args: ModelArguments, data_args: DataArguments, recipe_model: dict, tokenizer,
                     label_smoothing: float) -> Any:
    """The config of a model trained from scratch (preset / recipe / --config_overrides, the tokenizer's vocabulary
    and special tokens), checked: one sentence for a field its config refuses, or a position limit shorter than
    --max_source_length / --max_target_length. Builds no weights (`deepnmt distill` checks a student with it before
    anything runs)."""
    model_type, fields = model_fields(model_args.config_name, model_args.config_overrides, model_args.model_type,
                                     recipe_model)
    fields.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        unk_token_id=tokenizer.unk_token_id,
        # a converted OPUS-MT model's MarianTokenizer has no <s>: decoding starts from <pad>, as Marian's does
        decoder_start_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.pad_token_id,
    )
    target = target_vocabulary_size(tokenizer)
    if target is not None:  # two vocabularies (a converted model's tokenizer, docs/public-checkpoints.md)
        fields.update(share_encoder_decoder_embeddings=False, decoder_vocab_size=target)
    longest = max(data_args.max_source_length, data_args.max_target_length)
    fields.setdefault("max_position_embeddings", max(1024, longest))
    if fields["max_position_embeddings"] < longest:
        raise UserInputError(
            f"`max_position_embeddings` = {fields['max_position_embeddings']} is not allowed with "
            f"--max_source_length/--max_target_length {longest}; it must be at least as long."
        )
    fields["label_smoothing"] = label_smoothing  # the objective the model is trained with, recorded in its config
    return AutoConfig.for_model(model_type, **fields)


def converted_source(name: str) -> tuple[Any, Any] | None:
    """A Marian or FSMT model named by ``--model_name_or_path`` / ``--warm_start_from``, converted once per process
    into the package's Transformer (`hf_deepnmt_training.convert.convert_for_training`, which says so in one line):
    ``(model, tokenizer)``; None for any other model."""
    if name not in _CONVERTED:
        from .convert import convert_for_training

        _CONVERTED[name] = convert_for_training(name)
    return _CONVERTED[name]


_CONVERTED: dict[str, tuple[Any, Any] | None] = {}


def target_vocabulary_size(tokenizer: Any) -> int | None:
    """The size of a tokenizer's own target vocabulary where it has one apart from the source's (MarianTokenizer with
    separate vocabularies, FairseqMosesBPETokenizer), else None: every id the target side can produce, plus one."""
    target = getattr(tokenizer, "target_encoder", None)
    if not isinstance(target, dict) or target == getattr(tokenizer, "encoder", None):
        return None
    return max(target.values()) + 1


def new_or_loaded_model(model_args: ModelArguments, data_args: DataArguments, recipe_model: dict, tokenizer,
                         label_smoothing: float):
    if model_args.model_name_or_path:
        converted = converted_source(model_args.model_name_or_path)
        if converted is not None:
            model = converted[0]
        else:
            with hub_lookup(model_args.model_name_or_path, "--model_name_or_path"):
                model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
            check_foreign_model(model, model_args)
        if hasattr(model.config, "label_smoothing"):
            model.config.label_smoothing = label_smoothing
        return model
    if model_args.warm_start_from:
        if model_args.model_name_or_path:
            raise UserInputError("--warm_start_from and --model_name_or_path exclude each other: fine-tune a model with "
                             "the latter, or start a new one from a trained model's weights with the former.")
        from hf_deepnmt import warm_start

        converted = converted_source(model_args.warm_start_from)  # a Marian / FSMT model, converted first
        with hub_lookup(model_args.warm_start_from, "--warm_start_from"):
            source = (converted[0] if converted is not None
                      else AutoModelForSeq2SeqLM.from_pretrained(model_args.warm_start_from))
        config = warm_start_config(source.config, model_args, data_args, recipe_model, label_smoothing)
        model = warm_start(source, config=config, method=model_args.warm_start_method)
        layers = f"{config.encoder_layers}+{config.decoder_layers} layers"
        how = {"copy": "", "grow": f", grown to {layers} (Wu et al. 2019: new top layers)",
               "stack": f", stacked to {layers} (Li et al. 2020: top layers copied)"}[model_args.warm_start_method]
        print(f"[deepnmt] warm start: {config.model_type} initialised from {model_args.warm_start_from}{how}; "
              f"{sum(p.numel() for n, p in model.named_parameters() if n in model.warm_start_new_parameters):,} "
              "parameters new", file=sys.stderr)
        return model
    config = new_model_config(model_args, data_args, recipe_model, tokenizer, label_smoothing)
    return AutoModelForSeq2SeqLM.from_config(config)


def warm_start_config(source: Any, model_args: ModelArguments, data_args: DataArguments, recipe_model: dict,
                      label_smoothing: float) -> Any:
    """The config of a model warm-started from a trained one whose config is ``source``: the trained model's
    backbone (`hf_deepnmt.warm_start.BACKBONE_FIELDS`: its shape, positions, vocabularies, tokens, regularisation),
    then what the preset / recipe / ``--config_overrides`` give — the mechanisms to add, a regularisation to change,
    more layers for ``--warm_start_method grow|stack`` — on ``--model_type`` (default ``deep_transformer``). A shape
    field given with another value than the trained model's is one sentence (the weights would not fit)."""
    from hf_deepnmt.warm_start import BACKBONE_FIELDS, SHAPE_FIELDS

    from .recipes import load_model_config_dict, parse_overrides

    model_type, _ = model_fields(model_args.config_name, model_args.config_overrides, model_args.model_type,
                                 recipe_model)  # checks the override keys
    given = load_model_config_dict(model_args.config_name, recipe_model)
    given.update(parse_overrides(model_args.config_overrides))
    given.pop("model_type", None)
    fields = {key: getattr(source, key) for key in BACKBONE_FIELDS if hasattr(source, key)}
    for key, value in given.items():
        if key in SHAPE_FIELDS and key in fields and value != fields[key]:
            raise UserInputError(f"`{key}` = {value!r} is not allowed with --warm_start_from: the trained model has "
                                 f"{key}={fields[key]!r}, and a warm start keeps its weights' shapes (leave {key} out "
                                 "of the recipe / --config_overrides).")
        fields[key] = value
    longest = max(data_args.max_source_length, data_args.max_target_length)
    if fields.get("max_position_embeddings", longest) < longest:
        raise UserInputError(f"`--max_source_length`/`--max_target_length` {longest} is not allowed with --warm_start_from "
                             f"{model_args.warm_start_from}: its positions end at {fields['max_position_embeddings']}; "
                             "use at most that.")
    fields["label_smoothing"] = label_smoothing
    return AutoConfig.for_model(model_type, **fields)


def check_foreign_model(model: Any, model_args: ModelArguments) -> None:
    """A seq2seq model of another package (BART, T5, M2M100, ...) fine-tunes with the label-smoothed NLL
    (`hf_deepnmt.losses.stock_model_objective`); what needs this package's models is refused in one sentence."""
    if getattr(model, "computes_translation_objective", False):
        return
    model_type = getattr(model.config, "model_type", type(model).__name__)
    if model_args.config_overrides:
        raise UserInputError(f"`--config_overrides` = {model_args.config_overrides!r} is not allowed with a {model_type!r} "
                             "model: the papers' mechanisms and losses need a model of hf_deepnmt (`deepnmt convert` "
                             "turns Marian, FSMT and fairseq checkpoints into one); fine-tune this one without it.")
    if not hasattr(model, "prepare_decoder_input_ids_from_labels"):
        raise UserInputError(f"`--model_name_or_path` names a {model_type!r} model, which cannot be trained on labels "
                             "(it has no prepare_decoder_input_ids_from_labels); use a seq2seq translation model.")
    print(f"[deepnmt] fine-tuning a {model_type!r} model of transformers with the label-smoothed NLL (the papers' "
          "losses need a model of hf_deepnmt: `deepnmt convert` makes one from Marian, FSMT or fairseq)",
          file=sys.stderr)


def check_torch_compile_options(training_args: Seq2SeqTrainingArguments, model_type: str | None) -> None:
    """One sentence for ``--torch_compile`` options that cannot work: a mode torch.compile does not know, or another
    backend than inductor for a DTMT model (``model_type``; None: not known yet). `deepnmt train` asks before it
    writes anything; `prepare_torch_compile` asks again with the built model, for callers of the API."""
    from torch._inductor import list_mode_options

    if not training_args.torch_compile:
        return
    mode = training_args.torch_compile_mode
    if mode is not None and mode not in list_mode_options():
        raise UserInputError(f"`--torch_compile_mode` = {mode!r} is not allowed; use one of "
                             f"{sorted(list_mode_options())} or leave it unset.")
    entry = MODEL_TYPES.get(model_type)
    backend = training_args.torch_compile_backend or "inductor"
    if entry is not None and entry.family == DTMT and backend != "inductor":
        raise UserInputError(f"`--torch_compile_backend` = {backend!r} is not allowed for a DTMT model: --torch_compile "
                             "compiles its recurrence per timestep with inductor (compile_recurrence); leave the "
                             "backend unset.")


def prepare_torch_compile(model: torch.nn.Module, training_args: Seq2SeqTrainingArguments) -> str | None:
    """What ``--torch_compile`` compiles, set up on ``model`` and ``training_args`` before the Trainer is built; returns
    the sentence `deepnmt train` prints (None: no compilation). docs/training.md, "Compiling".

    * A Transformer (and any other model): transformers' Trainer compiles the whole model (``torch_compile=True``, one
      graph for forward and backward, ``fullgraph``-clean: tests/test_compile.py); `DeepNMTTrainer` marks the batch and
      length dimensions of every batch dynamic, so batches of other shapes reuse the graph instead of compiling again.
    * DTMT: its time loop would be unrolled into the graph and compiled again for every new length, so the Trainer
      compiles nothing (``torch_compile`` is switched off, with its backend, which accelerate would otherwise still
      apply) and each timestep of the recurrence is compiled instead (``DTMTPreTrainedModel.compile_recurrence``,
      with ``--torch_compile_mode``). Its recurrence is compiled with inductor: another ``--torch_compile_backend`` is
      refused.
    """
    if not training_args.torch_compile:
        return None
    model_type = getattr(model.config, "model_type", None)
    check_torch_compile_options(training_args, model_type)
    backend, mode = training_args.torch_compile_backend or "inductor", training_args.torch_compile_mode
    entry = MODEL_TYPES.get(model_type)
    if entry is None or entry.family != DTMT:
        return (f"--torch_compile: the Trainer compiles the whole model ({backend}"
                + (f", mode {mode}" if mode else "") + "); batch and length dimensions are dynamic")
    compile_recurrence = getattr(model, "compile_recurrence", None)
    if compile_recurrence is None:
        raise UserInputError(f"--torch_compile: this {type(model).__name__} has no `compile_recurrence` (code saved by "
                             "an older hf_deepnmt?); train it without --torch_compile, or load it with this hf_deepnmt.")
    compile_recurrence(mode=mode)
    training_args.torch_compile = False  # the Trainer must not compile the whole model (an unrolled time loop)
    training_args.torch_compile_backend = training_args.torch_compile_mode = None
    return "--torch_compile: DTMT's recurrence is compiled per timestep (inductor" + (
        f", mode {mode}" if mode else "") + "); the time loop stays in Python, so new lengths do not recompile"


def lr_scheduler_factory(model_args: ModelArguments, training_args: Seq2SeqTrainingArguments):
    if model_args.lr_schedule is None:
        return None
    if model_args.lr_schedule not in SCHEDULES:
        raise UserInputError(f"`--lr_schedule` = {model_args.lr_schedule!r} is not allowed; use one of {list(SCHEDULES)} "
                         "or leave it unset (--lr_scheduler_type).")
    replicas = model_args.lr_replicas or training_args.world_size * training_args.gradient_accumulation_steps
    return rnnplus_scheduler_factory(int(training_args.warmup_steps), model_args.lr_decay_start,
                                     model_args.lr_decay_end, replicas)


def optimizer_setting(model_args: Any, training_args: Seq2SeqTrainingArguments
                      ) -> tuple[type[torch.optim.Optimizer], dict[str, Any]] | None:
    """``--optimizer radam``: liu2020's RAdam with the Adam options of the command line; None: transformers' --optim."""
    if model_args.optimizer not in (None, "radam"):
        raise UserInputError(f"`--optimizer` = {model_args.optimizer!r} is not allowed; use 'radam' or leave it unset (--optim).")
    if model_args.optimizer != "radam":
        return None
    return (torch.optim.RAdam, {"lr": training_args.learning_rate, "eps": training_args.adam_epsilon,
                                "betas": (training_args.adam_beta1, training_args.adam_beta2)})
