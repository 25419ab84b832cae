"""NMT defaults of `deepnmt train` for a model trained from scratch without a recipe (docs/defaults.md).

transformers' `Seq2SeqTrainingArguments` defaults are fine-tuning defaults (learning rate 5e-5, linear decay, no
warm-up, no label smoothing, 8-sentence batches, no evaluation, ``generation_max_length`` 20). A translation model
trained from scratch needs other ones. When `deepnmt train` starts a new model and no ``--recipe`` is given, every
option below that the command line does not set takes the value chosen here, from the size of the training data
and the device, and the resolved choices are printed before training starts. ``--nmt_defaults false`` restores
transformers' defaults (and this package's label smoothing 0.1 stays: see ``--label_smoothing_factor``).

Two stages, because the model size depends on the data:

* `PARSE_TIME_DEFAULTS` — before the arguments are parsed: options that depend on nothing (the schedule, Adam's β₂,
  evaluation with generation, logging);
* `resolve` — after the training data is read: the model size, learning rate, warm-up, token batch, vocabulary,
  evaluation interval and evaluation sample count; and once the model is known, its label smoothing
  (`label_smoothing_for`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

# Options of every from-scratch run that depend on nothing else. (transformers' default in the comment.)
PARSE_TIME_DEFAULTS: dict[str, Any] = {
    "lr_scheduler_type": "inverse_sqrt",  # linear: Vaswani et al. (2017) §5.3, the schedule of every paper here
    "adam_beta2": 0.98,  # 0.999: Vaswani et al. (2017) §5.3
    "max_grad_norm": 1.0,  # 1.0 (kept; stated because NMT recipes differ)
    "weight_decay": 0.0,  # 0.0 (kept)
    "eval_strategy": "steps",  # no: a run that has validation data reports validation BLEU while it trains
    "predict_with_generate": True,  # False: BLEU needs translations, not just the loss
    "generation_num_beams": 1,  # greedy during training (fast); the final test uses --eval_num_beams
    "per_device_eval_batch_size": 64,  # 8
    "logging_steps": 50,  # 500
    "save_total_limit": 3,  # None: keep the newest three checkpoints
}


@dataclass(frozen=True)
class SizeClass:
    """One row of the model-size table (docs/defaults.md): used when the training data has fewer than
    ``max_pairs`` pairs (and the device matches)."""

    name: str
    max_pairs: float
    model: dict[str, Any]
    learning_rate: float
    warmup_steps: int
    max_tokens: int
    vocab_size: int
    max_eval_samples: int | None
    provenance: str
    # the row's other measured models, used in place of ``model`` when --model_type names their type
    alternatives: tuple[dict[str, Any], ...] = ()

    def model_for(self, model_type: str | None) -> dict[str, Any] | None:
        """The row's model of ``model_type`` (None: the row's default model); None when the row has none."""
        return next((m for m in (self.model, *self.alternatives) if model_type in (None, m["model_type"])), None)


def _transformer(d_model: int, layers: tuple[int, int], heads: int, ffn: int, dropout: float) -> dict[str, Any]:
    return {
        "model_type": "deep_transformer", "d_model": d_model, "encoder_layers": layers[0],
        "decoder_layers": layers[1], "encoder_attention_heads": heads, "decoder_attention_heads": heads,
        "encoder_ffn_dim": ffn, "decoder_ffn_dim": ffn, "dropout": dropout, "attention_dropout": 0.0,
        "activation_dropout": 0.0, "activation_function": "relu", "layer_norm_position": "pre",
        "scale_embedding": True, "tie_word_embeddings": True,
    }


def _dtmt(d_model: int, heads: int, transition_depth: int, init_range: float, dropout: float) -> dict[str, Any]:
    """meng2019's DTMT#``transition_depth`` (L-GRU transitions) at ``d_model``, every dropout ``dropout``; the other
    fields are `DTMTConfig`'s (the paper's: separate source and target embeddings, GNMT length penalty)."""
    return {
        "model_type": "dtmt", "d_model": d_model, "attention_heads": heads, "transition_depth": transition_depth,
        "rnn_cell": "lgru", "init_range": init_range, "max_position_embeddings": 256,
        **dict.fromkeys(("dropout", "rnn_dropout", "readout_dropout"), dropout),
    }


# CPU: the model must learn something in minutes to hours on a few cores.
# The first row's model is meng2019's DTMT#1 at d_model 128 (since 2026-11-28): issue 63's study, at 25 minutes on
# three corpora no default was tuned on, measured it 2.06 (Bible es→en), 7.02 (software messages en→es) and 1.56
# (en→de) BLEU above the Transformer it replaced, with the row's learning rate, warm-up and batch and the run-length
# dropout (docs/defaults.md, "Round two"; benchmarks/experiments/results/defaults_budget.md). Its init range 0.23 is
# the paper's ±0.08 at d 1024 scaled to d 128 (docs/meng2019-dtmt.md). That Transformer stays the row's alternative
# (`--model_type deep_transformer`, or --config_overrides naming its fields): the quickstart's model, chosen by
# measurement on this project's 2-core CPU (benchmarks/experiments/results/quickstart_probes.md: a shallow encoder
# and a deep decoder learn fastest per step at equal cost), and the one to take for CTranslate2 or Marian export.
CPU_SIZES: tuple[SizeClass, ...] = (
    # warm-up 400 (200 until 2026-11-26): issue 41's study, on corpora no default was tuned on, found it best or within
    # 0.16 BLEU of the best at every corpus size and budget it ran (docs/defaults.md, "The warm-up")
    SizeClass("cpu-small", 200_000, _dtmt(128, 4, 1, 0.23, 0.0), 3e-3, 400, 2048, 4000, 500,
              "measured: DTMT#1 from issue 63's three-corpus study, warm-up from issue 41's, docs/defaults.md",
              alternatives=(_transformer(128, (2, 6), 4, 512, 0.0),)),
    SizeClass("cpu-medium", float("inf"), _transformer(256, (6, 6), 4, 1024, 0.1), 2e-3, 1000, 4096, 8000, 500,
              "scaled from cpu-small: width ×2, lr 2/3, warm-up ×5 (not measured at this size)"),
)
# GPU: the standard shapes for the data size (fairseq's transformer_iwslt_de_en, Vaswani et al.'s Base and Big),
# pre-LN so that they train without a tuned warm-up.
GPU_SIZES: tuple[SizeClass, ...] = (
    SizeClass("gpu-low-resource", 500_000, _transformer(512, (6, 6), 4, 1024, 0.3), 1e-3, 4000, 4096, 16000,
              None, "the IWSLT'14 de-en shape (~160k pairs): fairseq transformer_iwslt_de_en, dropout 0.3"),
    SizeClass("gpu-base", 10_000_000, _transformer(512, (6, 6), 8, 2048, 0.1), 1e-3, 4000, 4096, 32000, None,
              "Transformer Base (Vaswani et al. 2017), pre-LN: lr 1e-3 (post-LN would need ~7e-4)"),
    SizeClass("gpu-big", float("inf"), _transformer(1024, (6, 6), 16, 4096, 0.3), 5e-4, 4000, 4096, 32000, None,
              "Transformer Big (Vaswani et al. 2017), pre-LN, dropout 0.3 as for WMT14 en-de"),
)


# The model fields the run-length rule sets, by model type: every dropout of the model that the rows measured at one
# value (DTMT's embedding/output, recurrent and readout dropouts alike: the issue-63 rows, docs/defaults.md). A
# command line that sets any of them keeps all of them.
DROPOUT_FIELDS: dict[str, tuple[str, ...]] = {"deep_transformer": ("dropout",),
                                              "dtmt": ("dropout", "rnn_dropout", "readout_dropout")}


# The CPU rows' dropout by the run's length in passes over the training data (hf_deepnmt_training.run_length): rows
# of (fewer than this many epochs, dropout). Measured by issue 41's study on corpora no default was tuned on
# (docs/defaults.md, "Dropout from the run's length"; benchmarks/experiments/results/defaults_budget.md).
# Dropout 0.0 won at ~3 passes (quickstart probes), tied at ~6 and lost to 0.1 from ~7 passes on (by 4.3 BLEU at
# ~20 passes, where 0.3 was 0.6 below 0.1); 0.3 won nowhere measured, so the table stops at 0.1.
DROPOUT_BY_EPOCHS: tuple[tuple[float, float], ...] = ((5.0, 0.0), (float("inf"), 0.1))


def dropout_for_epochs(epochs: float) -> float:
    """The CPU rows' dropout for a run of ``epochs`` passes over its training data (`DROPOUT_BY_EPOCHS`)."""
    return next(dropout for below, dropout in DROPOUT_BY_EPOCHS if epochs < below)


def describe_dropout_rule() -> str:
    """`DROPOUT_BY_EPOCHS` in words: "dropout 0.0 below 5 passes, 0.1 from 5"."""
    parts, low = [], None
    for below, dropout in DROPOUT_BY_EPOCHS:
        if low is None:
            parts.append(f"dropout {dropout} below {below:g} passes")
        elif below == float("inf"):
            parts.append(f"{dropout} from {low:g}")
        else:
            parts.append(f"{dropout} from {low:g} to {below:g}")
        low = below
    return ", ".join(parts)


def warmup_for_length(row_warmup: int, steps: float) -> int:
    """A size row's warm-up for a run of ``steps`` optimizer steps: the row's, at most a fifth of the run (at least
    one step), so that a short run spends most of its steps after the warm-up."""
    return min(row_warmup, max(1, int(steps // 5)))


# The model types whose warm-up the run-length rule also caps at a fifth of an *estimated* length (a
# --max_train_minutes budget, or --num_train_epochs); a --max_steps run's warm-up is capped for every model in
# `resolve`. DTMT only: issue 63's study measured DTMT#1's warm-up 200 above its 400 on all three corpora at 10
# minutes (~1,000 steps; mean of two seeds, three on the Bible) and below it on two of three at 25 (~2,500 steps),
# which a fifth of the run's steps gives, and the rule itself +1.50 BLEU over warm-up 400 on the mean of the three
# at 10 (docs/defaults.md, "The DTMT warm-up rule"); issue 41 measured the Transformer row's warm-up 400 above 200 at
# ~1,100 steps on two of three corpus sizes, so its budget runs keep 400.
WARMUP_BY_LENGTH_TYPES: tuple[str, ...] = ("dtmt",)


# The CPU rows' label smoothing by model type where it is not the package's 0.1 (`hf_deepnmt_training.
# train_arguments.NMT_DEFAULTS`, every paper's): issue 63's study measured 0.2 on the row's DTMT#1 +0.78, +2.05
# and −0.19 BLEU from 0.1 at 10 minutes on its three corpora (Bible es→en, software messages en→es and en→de;
# means of 2–5 runs each, under the warm-up rule) and +0.46, +0.77 and +0.64 at 25 (2–3 runs): the defaults then
# within 1 BLEU of every corpus's best row at both budgets, which 0.1 missed by 2 on en→es at 10
# (docs/defaults.md, "Label smoothing 0.2 for DTMT#1"; the study's rows `dtmt1-ls0.2` and `dtmt1-ls0.1`). Applied
# where the size row's model is one of these types (not a --config_name model, nor the row's Transformer
# alternative, whose 0.2 issue 41 measured below 0.1 on most of its cells) and the command line leaves
# --label_smoothing_factor unset.
LABEL_SMOOTHING_BY_TYPE: dict[str, float] = {"dtmt": 0.2}


def label_smoothing_for(model: dict[str, Any], device: str) -> float | None:
    """The label smoothing a from-scratch run's defaults choose for the size row's ``model`` (its fields; empty: the
    model is not the row's) on ``device``; None: the package's 0.1 stays."""
    return LABEL_SMOOTHING_BY_TYPE.get(model.get("model_type", "")) if device == "cpu" else None


def describe_model(m: dict[str, Any]) -> str:
    """A size row's model in words, as `deepnmt train` prints it: "deep_transformer 2-6 layers, d_model 128, 4 heads,
    FFN 512, pre-LN, tied embeddings" or "dtmt DTMT#1 (transition depth 1, lgru), d_model 128, 4 heads"."""
    if m["model_type"] == "dtmt":
        return (f"dtmt DTMT#{m['transition_depth']} (transition depth {m['transition_depth']}, {m['rnn_cell']}), "
                f"d_model {m['d_model']}, {m['attention_heads']} heads")
    return (f"{m['model_type']} {m['encoder_layers']}-{m['decoder_layers']} layers, d_model {m['d_model']}, "
            f"{m['encoder_attention_heads']} heads, FFN {m['encoder_ffn_dim']}, {m['layer_norm_position']}-LN, "
            + ("tied" if m.get("tie_word_embeddings") else "untied") + " embeddings")


def size_class(pairs: int, device: str) -> SizeClass:
    """The size row for ``pairs`` training pairs on ``device`` ('cpu' or 'gpu')."""
    table = CPU_SIZES if device == "cpu" else GPU_SIZES
    return next(row for row in table if pairs < row.max_pairs)


def _by_size(attribute: str, table: Sequence[SizeClass]) -> str:
    """One column of a size table in words: "0.003 below 200,000 pairs, 0.002 above"."""
    def shown(value: Any) -> str:
        return "all" if value is None else f"{value:g}" if isinstance(value, float) else f"{value:,}"

    rows: list[tuple[str, float]] = []  # (value, up to how many pairs), rows of one value merged
    for row in table:
        value = shown(getattr(row, attribute))
        if rows and rows[-1][0] == value:
            rows.pop()
        rows.append((value, row.max_pairs))
    if len(rows) == 1:
        return rows[0][0]
    return ", ".join(f"{value} above" if bound == float("inf") else f"{value} below {bound:,.0f}"
                     + (" pairs" if index == 0 else "") for index, (value, bound) in enumerate(rows))


def _by_device(attribute: str) -> str:
    return f"CPU {_by_size(attribute, CPU_SIZES)}; GPU {_by_size(attribute, GPU_SIZES)}"


def resolved_option_rules() -> dict[str, str]:
    """For `deepnmt train --help`: how a new model's run without a recipe chooses each option it sets from the
    data, the device and the other options (`resolve`, the size rows' values; `hf_deepnmt_training.train`'s
    evaluation plan and generation length), in words. The parser's own default of these options is transformers'
    (or this package's), which only ``--nmt_defaults false``, a recipe or a trained model keep."""
    return {
        "learning_rate": _by_device("learning_rate"),
        "warmup_steps": f"{_by_device('warmup_steps')}; at most a fifth of --max_steps, and for the CPU rows' "
                        f"{', '.join(WARMUP_BY_LENGTH_TYPES)} at most a fifth of the steps planned without it "
                        "(those a --max_train_minutes budget is estimated to train, or --num_train_epochs)",
        "max_tokens": f"{_by_device('max_tokens')}; none (sentence batches) when --per_device_train_batch_size is "
                      "given",
        "vocab_size": f"{_by_device('vocab_size')}; unused when --tokenizer_name gives the tokenizer",
        "max_eval_samples": _by_device("max_eval_samples"),
        "label_smoothing_factor": "; ".join(f"{value} for the CPU rows' {model_type} model" for model_type, value
                                            in LABEL_SMOOTHING_BY_TYPE.items()) + ", 0.1 for every other model",
        "eval_steps": "--max_steps / 4 rounded up (four validations, the last at the end), every 1000 steps without "
                      "--max_steps, every quarter of the minutes with --max_train_minutes alone",
        "save_steps": "--eval_steps (a checkpoint at every validation) unless --save_strategy is given",
        "dataloader_pin_memory": "false on a CPU",
        "eval_strategy": "steps when --validation_file is given",
        "generation_max_length": "1.5 × the longest validation source + 10 new tokens, plus the start token (the "
                                 "translate rule), at most --max_target_length",
        "load_best_model_at_end": "true in a run that validates and saves a checkpoint at every validation (the "
                                  "best checkpoint is the saved and tested model)",
        "metric_for_best_model": "bleu (loss without --predict_with_generate) when the best checkpoint is kept",
        "greater_is_better": "true for bleu when the best checkpoint is kept",
    }


def given_options(argv: Sequence[str]) -> set[str]:
    """The option names (without ``--``, underscores) that ``argv`` sets, ``--x=1`` and ``--x 1`` alike."""
    return {token[2:].split("=", 1)[0].replace("-", "_") for token in argv if token.startswith("--")}


@dataclass
class Resolution:
    """What `resolve` chose: the size row, the model fields and the options it set."""

    size: SizeClass
    device: str
    pairs: int
    model: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    # the row's dropout is chosen from the run's length once the data is tokenized (`dropout_for_epochs`): a CPU row
    # whose model the command line did not replace and whose dropout it did not set
    dropout_by_length: bool = False
    # the row's warm-up is capped at a fifth of the run's estimated length then too (`warmup_for_length`): a CPU row
    # of `WARMUP_BY_LENGTH_TYPES` whose warm-up the command line did not set, in a run without --max_steps
    warmup_by_length: bool = False
    # a --max_train_minutes run without --max_steps that validates and whose command line sets none of --eval_steps,
    # --save_steps, --save_strategy validates and saves at every quarter of its minutes instead of every --eval_steps
    # (`hf_deepnmt_training.train.plan_evaluations`): its chosen --eval_steps / --save_steps are never reached
    by_the_clock: bool = False

    def describe(self, effective_model: dict[str, Any] | None = None) -> list[str]:
        """The lines `deepnmt train` prints at start; ``effective_model``: the chosen model fields with the command
        line's ``--config_overrides`` applied."""
        lines = [f"[deepnmt] training from scratch without a recipe: NMT defaults for {self.pairs:,} pairs on "
                 f"{self.device.upper()} (size '{self.size.name}': {self.size.provenance}); any of them can be set "
                 "on the command line, --nmt_defaults false turns them off (docs/defaults.md)"]
        if self.model:
            m = {**self.model, **(effective_model or {})}
            lines.append(f"[deepnmt]   model: {describe_model(m)}, "
                         + ("dropout from the run's length (below)" if self.dropout_by_length
                            else f"dropout {m['dropout']}") + " (--config_name / --config_overrides to change"
                         + "".join(f"; --model_type {other['model_type']} for the row's {describe_model(other)}"
                                   for other in (self.size.model, *self.size.alternatives)
                                   if other["model_type"] != m["model_type"]) + ")")
        for key, value in self.options.items():
            if self.by_the_clock and key in ("eval_steps", "save_steps"):
                if key == "eval_steps":
                    lines.append("[deepnmt]   --eval_steps, --save_steps: none; a validation and a checkpoint at "
                                 "every quarter of --max_train_minutes, by the clock")
                continue
            lines.append(f"[deepnmt]   --{key} {value}" + (" at most: a fifth of the run's length (below)"
                                                          if key == "warmup_steps" and self.warmup_by_length else
                                                          f" (the CPU row's {self.model['model_type']} model's; 0.1 "
                                                          "for the others)" if key == "label_smoothing_factor"
                                                          else ""))
        return lines


def resolve(pairs: int, device: str, given: set[str], model_fields_given: bool, max_steps: int,
            model_type: str | None = None) -> Resolution:
    """The data- and device-dependent defaults of a from-scratch run without a recipe.

    ``given``: options the command line set (they are never changed); ``model_fields_given``: the model comes from
    ``--config_name`` (then only the training options are chosen here; ``--config_overrides`` applies on top of the
    row's model instead); ``model_type``: ``--model_type``, which picks the row's model of that type (`SizeClass.
    model_for`; a type the row has no model of: the type's own config defaults, no model chosen here).
    """
    size = size_class(pairs, device)
    resolution = Resolution(size=size, device=device, pairs=pairs)
    if not model_fields_given:
        resolution.model = dict(size.model_for(model_type) or {})
    chosen: dict[str, Any] = {
        "learning_rate": size.learning_rate,
        "warmup_steps": size.warmup_steps if max_steps <= 0 else warmup_for_length(size.warmup_steps, max_steps),
        "max_tokens": size.max_tokens,
        "vocab_size": size.vocab_size,
        "max_eval_samples": size.max_eval_samples,
        # four evaluations in a run of known length (the last at its end: transformers evaluates the last step), else
        # one per 1000 steps
        "eval_steps": -(-max_steps // 4) if max_steps > 0 else 1000,
    }
    if "save_strategy" not in given:
        chosen["save_steps"] = chosen["eval_steps"]  # a checkpoint at every evaluation
    if "per_device_train_batch_size" in given:  # batches of sentences were asked for: no token batching
        chosen.pop("max_tokens")
    if "tokenizer_name" in given:  # no tokenizer is trained: a vocabulary size would be unused (and misread)
        chosen.pop("vocab_size")
    resolution.options = {key: value for key, value in chosen.items() if key not in given and value is not None}
    return resolution
