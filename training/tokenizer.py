"""Joint source+target BPE tokenizer, trained with `tokenizers` and wrapped as a `PreTrainedTokenizerFast`.

One vocabulary for both languages (docs/transformer.md: shared embeddings need a joint BPE). Specials are, in this order,
``<pad>=0 <s>=1 </s>=2 <unk>=3`` — the ids `DeepTransformerConfig` defaults to; ``<unk>`` is also the mask token of
li2022's ALD loss. Every encoded sequence ends with ``</s>``; the decoder start ``<s>`` is added by the model when
it shifts the labels right. Text is NFKC-normalised and split SentencePiece-style (Metaspace, ``▁`` marks a word
start) so that decoding restores the original spacing exactly – except that one leading space is lost: it becomes
the ``▁`` of the first word, which decoding strips (tests/test_properties.py states the round trip precisely).

The saved tokenizer is plain `tokenizer.json` + `tokenizer_config.json`: ``AutoTokenizer.from_pretrained`` reloads
it with no custom code.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from hf_deepnmt.errors import UserInputError

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<s>", "</s>", "<unk>")
PAD, BOS, EOS, UNK = SPECIAL_TOKENS


def _interleave(sources: Iterable[str], targets: Iterable[str]) -> Iterator[str]:
    for source, target in zip(sources, targets, strict=True):
        yield source
        yield target


def train_joint_bpe(
    sources: Iterable[str],
    targets: Iterable[str],
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train one BPE on source and target sentences together and wrap it for transformers.

    Args:
        sources: source-language sentences.
        targets: target-language sentences, aligned with ``sources`` (same count).
        vocab_size: size of the joint vocabulary, specials included (≥ 100).
        min_frequency: minimum pair frequency for a merge.
        model_max_length: longest sequence (in tokens) the tokenizer truncates to when asked; match the model's
            ``max_position_embeddings``.
        show_progress: show the `tokenizers` training progress bar.
    """
    return train_joint_bpe_from_texts(_interleave(sources, targets), None, vocab_size, min_frequency,
                                      model_max_length, show_progress)


def train_joint_bpe_from_texts(
    texts: Iterable[str],
    length: int | None = None,
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """`train_joint_bpe` on one stream of sentences of both languages (source, target, source, …), e.g. a sample
    of a corpus too large for memory read from its Arrow file; ``length`` (the number of sentences) lets the
    progress bar count."""
    if not isinstance(vocab_size, int) or vocab_size < 100:
        raise UserInputError(f"train_joint_bpe: `vocab_size` = {vocab_size!r} is not allowed; use an integer ≥ 100.")
    if not isinstance(min_frequency, int) or min_frequency < 1:
        raise UserInputError(f"train_joint_bpe: `min_frequency` = {min_frequency!r} is not allowed; use an integer ≥ 1.")
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    if tokenizer.get_vocab_size() < len(SPECIAL_TOKENS) + 2:
        raise UserInputError("train_joint_bpe: the training text is empty; pass at least one non-empty sentence pair.")
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}",
        pair=f"$A {EOS} $B {EOS}",
        special_tokens=[(EOS, tokenizer.token_to_id(EOS))],
    )
    return wrap_tokenizer(tokenizer, model_max_length=model_max_length)


def wrap_tokenizer(tokenizer: Tokenizer, model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """Wrap a trained `tokenizers.Tokenizer` with our specials, right padding and truncation limit."""
    ids = [tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
    if ids != [0, 1, 2, 3]:
        raise UserInputError(f"wrap_tokenizer: special tokens {SPECIAL_TOKENS} must have ids 0-3, found {ids}.")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="right",
        truncation_side="right",
        model_max_length=model_max_length,
    )


def train_and_save(
    sources: Iterable[str],
    targets: Iterable[str],
    output_dir: str | os.PathLike,
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """`train_joint_bpe`, then ``save_pretrained(output_dir)`` (beside the model)."""
    tokenizer = train_joint_bpe(sources, targets, vocab_size, min_frequency, model_max_length, show_progress)
    tokenizer.save_pretrained(output_dir)
    return tokenizer
