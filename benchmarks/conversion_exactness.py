"""How exact `deepnmt convert` is, per source variant: the figures docs/public-checkpoints.md quotes.

For every variant of tests/public_checkpoints.py (five OPUS-MT / Marian variants, an FSMT folder, fairseq checkpoints
in three layouts with Moses + subword-nmt, a pre-LN fairseq checkpoint with sentencepiece), random weights, float32:
the max |logit difference| of the converted model against its reference under teacher forcing over a padded batch,
whether greedy and beam-4 (4-best) token ids are identical, and whether the converted tokenizer's ids equal the
reference pipeline's on the multilingual sample. The references are transformers' MarianMTModel, FSMT and M2M100
and fairseq's text pipeline rebuilt from sacremoses, subword-nmt and sentencepiece (tests/test_conversion.py asserts
the same things; this prints them).

    python -m benchmarks.conversion_exactness
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import public_checkpoints as fixtures  # noqa: E402

from hf_deepnmt import convert_model  # noqa: E402


def measure(name: str, converted, reference, reference_tokenizer, ids_reference=None) -> dict:
    """One row: logit difference, identical searches, identical token ids."""
    ours, tokenizer = converted.model.eval(), converted.tokenizer
    batch = reference_tokenizer(fixtures.SOURCE_SAMPLE, padding=True, return_tensors="pt")
    targets = tokenizer(text_target=fixtures.TARGET_SAMPLE, padding=True, return_tensors="pt").input_ids
    targets = targets.masked_fill(targets == ours.config.pad_token_id, 5)
    start = torch.full((targets.size(0), 1), ours.config.decoder_start_token_id)
    decoder_input_ids = torch.cat([start, targets[:, :-1]], dim=1)
    settings = {key: value for key in ("bad_words_ids", "forced_eos_token_id", "early_stopping")
                if (value := getattr(ours.generation_config, key)) is not None}
    with torch.no_grad():
        difference = float((ours(**batch, decoder_input_ids=decoder_input_ids).logits
                            - reference(**batch, decoder_input_ids=decoder_input_ids, use_cache=False).logits)
                           .abs().max())
        searches = []
        for beams in (1, 4):
            extra = {"num_return_sequences": 4} if beams > 1 else {}
            got = ours.generate(**batch, num_beams=beams, max_new_tokens=12, **settings, **extra)
            expected = reference.generate(**batch, num_beams=beams, max_new_tokens=12,
                                          decoder_start_token_id=ours.config.decoder_start_token_id, **settings,
                                          **extra)
            searches.append(torch.equal(got, expected))
    if ids_reference is None:
        same_ids = all(tokenizer(**side).input_ids == reference_tokenizer(**side).input_ids
                       for side in ({"text": fixtures.SAMPLE}, {"text_target": fixtures.SAMPLE}))
    else:
        same_ids = all(tokenizer(line).input_ids == ids_reference(line) for line in fixtures.SAMPLE)
    return {"variant": name, "reference": type(reference).__name__, "max_abs_logit_difference": difference,
            "greedy_identical": searches[0], "beam4_nbest_identical": searches[1], "token_ids_identical": same_ids}


def main() -> None:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    rows = []
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        for variant in fixtures.MARIAN_VARIANTS:
            source = fixtures.marian_source(root / variant, variant)
            rows.append(measure(f"marian:{variant}", convert_model(str(source)),
                                AutoModelForSeq2SeqLM.from_pretrained(source).eval(),
                                AutoTokenizer.from_pretrained(source)))
        source = fixtures.fsmt_source(root / "fsmt")
        converted = convert_model(str(source))
        rows.append(measure("fsmt", converted, AutoModelForSeq2SeqLM.from_pretrained(source).eval(),
                            converted.tokenizer,
                            lambda line: fixtures.fairseq_bpe_ids(root / "fsmt" / "fairseq", line)))
        for style in ("args", "cfg", "old_names"):
            directory, reference = fixtures.fairseq_bpe_checkpoint(root / f"fairseq-{style}", style=style)
            converted = convert_model(directory)
            rows.append(measure(f"fairseq:post-LN+moses+subword-nmt:{style}", converted, reference,
                                converted.tokenizer, lambda line, d=directory: fixtures.fairseq_bpe_ids(d, line)))
        directory, reference = fixtures.fairseq_sentencepiece_checkpoint(root / "fairseq-spm")
        converted = convert_model(directory)
        rows.append(measure("fairseq:pre-LN+sentencepiece", converted, reference, converted.tokenizer,
                            lambda line: fixtures.fairseq_sentencepiece_ids(directory, line)))
    print("| variant | reference | max abs logit diff | greedy ids | beam-4 4-best ids | tokenizer ids |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['variant']} | {row['reference']} | {row['max_abs_logit_difference']:.2e} | "
              f"{'identical' if row['greedy_identical'] else 'DIFFER'} | "
              f"{'identical' if row['beam4_nbest_identical'] else 'DIFFER'} | "
              f"{'identical' if row['token_ids_identical'] else 'DIFFER'} |")


if __name__ == "__main__":
    main()
