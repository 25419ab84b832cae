"""The tokenizer of a converted fairseq BPE model (Moses + fastBPE / subword-nmt codes, two dictionaries):
transformers' `FSMTTokenizer` with a target side of its own (docs/public-checkpoints.md, "Tokenizers").

`FSMTTokenizer` is transformers' port of fairseq's WMT19 text pipeline, written for translation only: its
``text_target=`` side runs Moses for the *source* language and looks the BPE pieces up in the *source* dictionary, so
labels built with it are wrong ids for a model with two dictionaries (the pitfall of transformers #6262). Here the
target side (``tokenizer(text_target=...)``, which transformers switches to with ``_switch_to_target_mode``) runs
Moses for the target language and reads the target dictionary; the source side and decoding are `FSMTTokenizer`'s,
unchanged.

Copied next to a converted model's tokenizer files by ``save_pretrained`` (``auto_map``), so it imports only
transformers.
"""

from __future__ import annotations

from typing import Any

from transformers import FSMTTokenizer


class FairseqMosesBPETokenizer(FSMTTokenizer):
    """`FSMTTokenizer` whose target side uses the target language's Moses rules and the target dictionary."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # fairseq ends every sequence with </s>, which FSMTTokenizer appends as its `sep_token` without naming an
        # `eos_token`; naming it lets code that truncates or detects the end (every seq2seq trainer) find it
        kwargs.setdefault("eos_token", kwargs.get("sep_token", "</s>"))
        super().__init__(*args, **kwargs)
        self.target_encoder = {token: index for index, token in self.decoder.items()}  # the target dictionary
        self._target_side = False

    def _switch_to_target_mode(self) -> None:
        self._target_side = True

    def _switch_to_input_mode(self) -> None:
        self._target_side = False

    def _tokenize(self, text: str, lang: str = "en", bypass_tokenizer: bool = False) -> list[str]:
        """`FSMTTokenizer._tokenize` in the side's language: punctuation normalisation and Moses for the source or
        the target language, then BPE (fairseq's ``--tokenizer moses --bpe fastbpe|subword_nmt``)."""
        lang = self.tgt_lang if self._target_side else self.src_lang
        if self.do_lower_case:
            text = text.lower()
        words = text.split() if bypass_tokenizer else self.moses_tokenize(self.moses_pipeline(text, lang=lang), lang=lang)
        return [piece for word in words if word for piece in self.bpe(word).split(" ")]

    def _convert_token_to_id(self, token: str) -> int:
        if self._target_side:
            return self.target_encoder.get(token, self.target_encoder.get(self.unk_token))
        return super()._convert_token_to_id(token)
