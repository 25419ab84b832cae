"""`deepnmt convert`: a public checkpoint (OPUS-MT / Marian, FSMT, fairseq) as a saved model folder of the package
(`hf_deepnmt.conversion.convert_checkpoint`; docs/public-checkpoints.md).

Also what `deepnmt train --model_name_or_path` does with a Marian or FSMT model (`convert_for_training`): it converts
it first, in memory, saying so in one line, so that fine-tuning, the papers' losses, warm starts and the exports take
it like a model of their own.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .arguments import CommandParser
from .errors import CommandLineError, hub_lookup

CONVERTIBLE_MODEL_TYPES = ("marian", "fsmt")


def convert_command(argv: Sequence[str]) -> int:
    """``deepnmt convert SOURCE --output_dir OUT [options]``."""
    parser = CommandParser(
        prog="deepnmt convert",
        description="Convert a public checkpoint into a model folder of hf_deepnmt that computes exactly what the "
                    "source does: a MarianMTModel folder or Hub id (OPUS-MT: shared or separate vocabularies, "
                    "multi-target >>xx<< models), an FSMT folder, or a fairseq Transformer checkpoint directory "
                    "(checkpoint*.pt or model.pt with dict.<src>.txt, dict.<tgt>.txt and its BPE codes or "
                    "sentencepiece model). The tokenizer is kept. Marian and FSMT sources are checked against "
                    "transformers' own model before anything is written. docs/public-checkpoints.md.")
    parser.add_argument("positional", nargs="*", metavar="SOURCE [OUTPUT]",
                        help="The checkpoint to convert, then (instead of --output_dir) the folder to write.")
    parser.add_argument("--output_dir", default=None, help="The new model folder (must not exist, or be empty).")
    parser.add_argument("--checkpoint", default=None, help="fairseq: the .pt file of a directory holding several "
                        "(default: checkpoint_best.pt, checkpoint_last.pt, model.pt, or the only one).")
    parser.add_argument("--source_lang", default=None, help="The source language to record when the checkpoint "
                        "does not (fairseq records it; Marian folders often do not).")
    parser.add_argument("--target_lang", default=None, help="The target language to record when the checkpoint "
                        "does not.")
    parser.add_argument("--bpe", choices=("fastbpe", "subword_nmt", "sentencepiece"), default=None,
                        help="fairseq: the BPE the text was segmented with, when the checkpoint does not record it.")
    parser.add_argument("--tokenizer", choices=("moses", "none"), default=None,
                        help="fairseq: the pre-tokenizer before BPE, when the checkpoint does not record it.")
    parser.add_argument("--trust_checkpoint", action="store_true",
                        help="fairseq: unpickle a checkpoint that holds Python objects beyond tensors and its options "
                             "(only for a file you trust: unpickling runs code).")
    args = parser.parse_args(argv)
    if not args.positional or len(args.positional) > 2:
        parser.error("give SOURCE, and the folder to write as OUTPUT or --output_dir")
    source = args.positional[0]
    if len(args.positional) == 2:
        if args.output_dir is not None:
            parser.error("give the folder to write once, as OUTPUT or --output_dir")
        args.output_dir = args.positional[1]
    if args.output_dir is None:
        parser.error("the folder to write is required: --output_dir OUT")
    from hf_deepnmt.conversion import convert_model, save_converted

    output = Path(args.output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise CommandLineError(f"`--output_dir` = {args.output_dir!r} exists and is not an empty folder; choose a new "
                               "one (a conversion never writes into an existing model).")
    with hub_lookup(source, "SOURCE"):
        converted = convert_model(source, checkpoint=args.checkpoint, source_lang=args.source_lang,
                                  target_lang=args.target_lang, bpe=args.bpe, tokenizer=args.tokenizer,
                                  trust_checkpoint=args.trust_checkpoint)
    save_converted(converted, output)
    print(describe(converted, output))
    return 0


def describe(converted: Any, output: Path | None = None) -> str:
    """One line: what was converted into what, the check, the pair, and what differs where (notes)."""
    config = converted.model.config
    parts = [f"[deepnmt] converted the {converted.source_format} model {converted.source}"
             + (f" into {output}" if output is not None else "")
             + f": {config.encoder_layers}+{config.decoder_layers} layers, d_model {config.d_model}, "
             f"{config.layer_norm_position}-LN, {config.activation_function}, {config.position_encoding} positions"]
    if converted.max_abs_logit_difference is not None:
        parts.append(f"teacher-forced logits within {converted.max_abs_logit_difference:.1g} of transformers' "
                     f"{converted.reference} on a probe batch")
    if converted.source_lang and converted.target_lang:
        parts.append(f"{converted.source_lang} → {converted.target_lang}")
    parts += converted.notes
    return "; ".join(parts)


def source_model_type(name: str) -> str | None:
    """The ``model_type`` a model folder or Hub id declares (None: no config.json to read)."""
    path = Path(name).expanduser()
    if path.is_dir():
        import json

        config = path / "config.json"
        return json.loads(config.read_text(encoding="utf-8")).get("model_type") if config.is_file() else None
    from transformers import AutoConfig

    with hub_lookup(name, "--model_name_or_path"):
        return AutoConfig.from_pretrained(name).model_type


def convert_for_training(name: str) -> tuple[Any, Any] | None:
    """A Marian or FSMT ``--model_name_or_path`` converted in memory for `deepnmt train` (one line says so), as
    ``(model, tokenizer)``; None for any other model."""
    if source_model_type(name) not in CONVERTIBLE_MODEL_TYPES:
        return None
    from hf_deepnmt.conversion import convert_model

    with hub_lookup(name, "--model_name_or_path"):
        converted = convert_model(name)
    converted.model.config.converted_from = converted.provenance()  # the run's card and config say where it began
    print(describe(converted) + " — fine-tuning the converted model (save it once with `deepnmt convert`)",
          file=sys.stderr)
    return converted.model, converted.tokenizer
