"""Translation metrics with sacreBLEU (BLEU, chrF, TER), computed offline, with their signature strings.

`evaluate.load("sacrebleu")` needs the Hub (it loads the metric script from there, even for sacrebleu), so sacreBLEU is called
directly. Scores are corpus-level on detokenized text with sacreBLEU's defaults (BLEU ``tok:13a``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sacrebleu

from hf_deepnmt.errors import UserInputError


@dataclass
class TranslationScores:
    """Corpus scores and the sacreBLEU signatures that make them reproducible."""

    bleu: float
    chrf: float
    ter: float
    signatures: dict[str, str]
    num_sentences: int

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        return {f"{prefix}bleu": self.bleu, f"{prefix}chrf": self.chrf, f"{prefix}ter": self.ter}


def score_translations(hypotheses: Sequence[str], references: Sequence[str]) -> TranslationScores:
    """BLEU, chrF and TER of detokenized hypotheses against one reference each."""
    if len(hypotheses) != len(references):
        raise UserInputError(f"score_translations: {len(hypotheses)} hypotheses but {len(references)} references.")
    if not hypotheses:
        raise UserInputError("score_translations: nothing to score (no sentences).")
    bleu, chrf, ter = sacrebleu.BLEU(), sacrebleu.CHRF(), sacrebleu.TER()
    refs = [list(references)]
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    ter_score = ter.corpus_score(list(hypotheses), refs)
    signatures = {"bleu": str(bleu.get_signature()), "chrf": str(chrf.get_signature()), "ter": str(ter.get_signature())}
    return TranslationScores(
        bleu=round(float(bleu_score.score), 2),
        chrf=round(float(chrf_score.score), 2),
        ter=round(float(ter_score.score), 2),
        signatures=signatures,
        num_sentences=len(hypotheses),
    )


def decode_ids(tokenizer, ids: np.ndarray) -> list[str]:
    """Token ids (padded with -100 or pad) -> detokenized strings."""
    ids = np.where(ids < 0, tokenizer.pad_token_id, ids)
    return [text.strip() for text in tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)]


class TranslationMetrics:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`.

    Returns numeric scores only (the Trainer logs them to TensorBoard); the signatures of the last call are kept
    in ``self.last`` for metrics files and the model card.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.last: TranslationScores | None = None

    def __call__(self, eval_prediction) -> dict[str, float]:
        predictions = eval_prediction.predictions
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        hypotheses = decode_ids(self.tokenizer, np.asarray(predictions))
        references = decode_ids(self.tokenizer, np.asarray(eval_prediction.label_ids))
        self.last = score_translations(hypotheses, references)
        return self.last.as_dict()
