"""`TranslationPipeline`: ``pipeline("translation")`` for encoder-decoder models under transformers 5.

transformers 5 removed the ``translation`` task (PR huggingface/transformers#43256). This pipeline brings it
back in two ways:

* in-process, ``import hf_deepnmt`` calls `register_translation_pipeline`, which registers the task (and the
  ``"translation_<src>_to_<tgt>"`` names) for every ``AutoModelForSeq2SeqLM`` model:
  ``pipeline("translation", model=model, tokenizer=tokenizer)``, and for the package's saved folders
  ``pipeline("translation", model=folder)`` without ``trust_remote_code`` (the installed config classes leave the
  folder's ``custom_pipelines`` entry out, see ``configuration_common.without_pipelines_served_in_process``);
  ``pipeline(..., pipeline_class=TranslationPipeline)`` names the class explicitly;
* on the Hub, every saved DeepTransformer folder carries this file and a ``custom_pipelines`` entry, so
  ``pipeline("translation", model=folder_or_repo, trust_remote_code=True)`` works where hf_deepnmt is not installed
  (there transformers 5 itself refuses ``"translation_<src>_to_<tgt>"`` task names as a removed task; pass
  ``src_lang=`` / ``tgt_lang=`` instead).

Behaviour: a string gives ``[{"translation_text": ...}]``, a list of strings gives one dict per string (a list of
dicts per string when ``num_return_sequences > 1``); generation keyword arguments (``num_beams``,
``max_new_tokens``, …) pass through to ``generate``; an empty or blank string translates to ``""`` without calling
the model; an input longer than the model accepts is truncated with a warning. Unless the call (or the pipeline's
construction) sets ``max_new_tokens`` or ``max_length``, each text's translation may have `new_token_budget` tokens
(1.5 × its source + 10), as `deepnmt translate` decodes: a hypothesis that never ends stops there instead of at the
generation config's limit, and a text's translation does not depend on the texts batched with it.

Languages: a model is trained for one language pair, which ``deepnmt train`` records in the config the way
transformers' T5 checkpoints do, as a ``task_specific_params`` key ``"translation_<src>_to_<tgt>"``
(`record_language_pair`). ``src_lang=`` / ``tgt_lang=`` (at construction or per call) and a task named
``"translation_<src>_to_<tgt>"`` are checked against that record: equal languages (compared case-insensitively) are
accepted and change nothing, since the model has one direction; a different one raises one ``ValueError`` naming the
argument, its value and the model's languages. A model whose config records no pair accepts any language: there is
nothing to check against. (A config recording several pairs accepts each of them but does not steer the model
between them.)

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only transformers
and torch, and works with the pipeline API of transformers 5.17 through 5.x.
"""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import Pipeline

from .errors import UserInputError

# The `custom_pipelines` entry written into config.json by DeepTransformer models' save_pretrained
# (configuration_common.OUR_PIPELINE_IMPL repeats its "impl").
TRANSLATION_PIPELINE_SPEC: dict[str, Any] = {
    "impl": "pipeline_translation.TranslationPipeline",
    "pt": ["AutoModelForSeq2SeqLM"],
    "type": "text",
}


BUDGET_STEP = 8  # new-token budgets are multiples of this, so that sentences of similar length share one search


def new_token_budget(source_tokens: int, limit: int) -> int:
    """How many tokens a translation of a ``source_tokens``-token source may have: 1.5 × the source + 10, rounded up
    to a multiple of ``BUDGET_STEP``, at most ``limit`` − 1 (the decoder start token takes one position). It
    depends on the sentence alone, never on the sentences translated with it (docs/training.md, "Translating"): the
    default of this pipeline (so of ``handler.py`` and `deepnmt serve`), `deepnmt translate` and `deepnmt evaluate`,
    and, applied to the longest validation source, the NMT default ``generation_max_length`` (= this + 1) of
    evaluation in training. A ``max_new_tokens`` or ``max_length`` given to the call replaces it."""
    budget = -(-(int(1.5 * source_tokens) + 10) // BUDGET_STEP) * BUDGET_STEP
    return min(limit - 1, budget)


def rows_by_budget(budgets: list[int | None]) -> list[tuple[int | None, list[int]]]:
    """The row indices of each distinct budget (smallest first; ``None``, a length the call set, last): the rows
    that one decoding call takes."""
    distinct = sorted(set(budgets), key=lambda budget: (budget is None, budget or 0))
    return [(budget, [row for row, own in enumerate(budgets) if own == budget]) for budget in distinct]


# "translation_en_to_es" -> ("en", "es"): the task name of transformers 4 and the key T5 configs use in
# `task_specific_params`. The source code is the shortest prefix before "_to_", so codes may hold underscores
# ("pt_BR") but not "_to_" (`record_language_pair` refuses that).
_TRANSLATION_TASK = re.compile(r"translation_(?P<src>.+?)_to_(?P<tgt>.+)")


def parse_translation_task(task: Any) -> tuple[str, str] | None:
    """``(source, target)`` of a task name ``"translation_<src>_to_<tgt>"``; ``None`` for any other value."""
    match = _TRANSLATION_TASK.fullmatch(task) if isinstance(task, str) else None
    return (match["src"], match["tgt"]) if match else None


def recorded_language_pairs(config: Any) -> list[tuple[str, str]]:
    """The ``(source, target)`` pairs a model config records as ``task_specific_params`` keys
    ``"translation_<src>_to_<tgt>"`` (written by `record_language_pair`, present in T5 checkpoints); ``[]`` when
    it records none."""
    params = getattr(config, "task_specific_params", None)
    if not isinstance(params, dict):
        return []
    return [pair for pair in map(parse_translation_task, params) if pair is not None]


def record_language_pair(config: Any, source_lang: str, target_lang: str) -> None:
    """Record in ``config`` that the model translates ``source_lang`` into ``target_lang``, so the pair travels with
    the weights (config.json) and `TranslationPipeline` can check ``src_lang`` / ``tgt_lang`` and task names.

    Sets ``config.task_specific_params["translation_<src>_to_<tgt>"]`` (keeping that entry's parameters if it
    exists) and drops every other ``translation_*_to_*`` entry: the model now translates this pair; entries for
    other tasks are kept.
    """
    for field, value in (("source_lang", source_lang), ("target_lang", target_lang)):
        if not isinstance(value, str) or not value.strip() or "_to_" in value or value != value.strip():
            raise UserInputError(f"record_language_pair: `{field}` = {_preview(value)} is not allowed; use a language "
                             "code such as 'en' (a non-empty string without surrounding spaces or '_to_').")
    params = getattr(config, "task_specific_params", None)
    params = dict(params) if isinstance(params, dict) else {}
    key = f"translation_{source_lang}_to_{target_lang}"
    kept = {name: value for name, value in params.items() if parse_translation_task(name) is None}
    kept[key] = params.get(key) or {}
    config.task_specific_params = kept


def _describe_pairs(pairs: list[tuple[str, str]]) -> str:
    return ", ".join(f"{source} → {target}" for source, target in pairs)


def _preview(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters, for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class TranslationPipeline(Pipeline):
    """Translate text with any encoder-decoder model that has a tokenizer (``AutoModelForSeq2SeqLM``).

    Example:

    ```python
    >>> from transformers import pipeline
    >>> translate = pipeline("translation", model="path/to/model", trust_remote_code=True)
    >>> translate(["In the beginning God created the heavens and the earth."], num_beams=4, max_new_tokens=64)
    [{'translation_text': 'En el principio creó Dios los cielos y la tierra.'}]
    >>> translate("Let there be light.", src_lang="en", tgt_lang="es")  # checked against the model's pair
    [{'translation_text': 'Sea la luz.'}]
    ```

    ``src_lang`` / ``tgt_lang`` and a ``"translation_<src>_to_<tgt>"`` task are checked against the pair the model's
    config records (see the module docstring); they never change the translation.
    """

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    # None: transformers' `pipeline()` tries to load the tokenizer but hands over None when that fails, so that a
    # model folder without one gets the sentence below instead of transformers' advice to install sentencepiece.
    _load_tokenizer = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """`Pipeline.__init__`, then a ``"translation_<src>_to_<tgt>"`` task is checked against the model's pair."""
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            self._explain_missing_tokenizer()
        pair = parse_translation_task(self.task)
        if pair is not None:
            self._check_languages("task", self.task, *pair)

    def _explain_missing_tokenizer(self) -> None:
        """Raise one sentence for a pipeline without a tokenizer; a folder whose tokenizer files exist but do not
        load gets transformers' own error (loading them again)."""
        name = getattr(self.model, "name_or_path", "") or ""
        folder = Path(name).expanduser() if name else None
        if folder is not None and folder.is_dir() and any(folder.glob("tokenizer*.json")):
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(name)  # raises what is wrong with those files
        where = f"the model folder {name!r} holds no tokenizer (no tokenizer.json)" if name else "no tokenizer was given"
        raise UserInputError(f"TranslationPipeline: {where}; save the tokenizer beside the weights "
                             "(`tokenizer.save_pretrained(folder)`, as `deepnmt train` does) or pass `tokenizer=`.")

    def _check_languages(self, argument: str, value: Any, source: str | None, target: str | None) -> None:
        """Raise one `ValueError` sentence unless ``source`` / ``target`` (``None``: not given) is a pair the model's
        config records; a model that records none accepts anything."""
        pairs = recorded_language_pairs(self.model.config)
        if not pairs:
            return

        def same(given: str | None, recorded: str) -> bool:
            return given is None or given.lower() == recorded.lower()

        if any(same(source, pair[0]) and same(target, pair[1]) for pair in pairs):
            return
        recorded = _describe_pairs(pairs)
        if argument == "task":
            tasks = " or ".join(repr(f"translation_{s}_to_{t}") for s, t in pairs)
            allowed = f"this model translates {recorded}, so use 'translation' or {tasks}"
        else:
            what = "the pair" if len(pairs) == 1 else "the pairs"
            allowed = f"this model translates {recorded} ({what} recorded in its config's task_specific_params)"
        raise UserInputError(f"TranslationPipeline: `{argument}` = {_preview(value)} is not allowed; {allowed}.")

    def _sanitize_parameters(
        self,
        truncation: bool | None = None,
        return_tensors: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        **generate_kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        for argument, language in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
            if language is not None and not isinstance(language, str):
                raise UserInputError(f"TranslationPipeline: `{argument}` = {_preview(language)} "
                                 f"({type(language).__name__}) is not allowed; pass a language code such as 'en'.")
        if src_lang is not None:
            self._check_languages("src_lang", src_lang, src_lang, None)
        if tgt_lang is not None:
            self._check_languages("tgt_lang", tgt_lang, None, tgt_lang)
        if src_lang is not None and tgt_lang is not None:
            self._check_languages("src_lang/tgt_lang", (src_lang, tgt_lang), src_lang, tgt_lang)
        preprocess_params: dict[str, Any] = {}
        if truncation is not None:
            preprocess_params["truncation"] = truncation
        codes = getattr(self.model.config, "target_language_codes", None)
        if tgt_lang is not None and codes:  # a multi-target OPUS-MT model: the source starts with >>tgt<<
            code = f">>{tgt_lang}<<"
            if code not in codes:
                raise UserInputError(f"TranslationPipeline: `tgt_lang` = {_preview(tgt_lang)} is not allowed; this "
                                     f"multi-target model's codes are {', '.join(codes)}.")
            preprocess_params["target_code"] = code
        postprocess_params: dict[str, Any] = {}
        if return_tensors is not None:
            postprocess_params["return_tensors"] = return_tensors
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, inputs: str | list[str], **kwargs: Any) -> list:
        """Translate one string or a list of strings; see the class docstring for the output format."""
        single = isinstance(inputs, str)
        if not single and not isinstance(inputs, (list, tuple)):
            raise UserInputError(f"TranslationPipeline: `inputs` = {_preview(inputs)} ({type(inputs).__name__}) is not "
                             "allowed; pass a string or a list of strings.")
        texts = [inputs] if single else list(inputs)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise UserInputError(f"TranslationPipeline: `inputs[{index}]` = {_preview(text)} "
                                 f"({type(text).__name__}) is not allowed; every item must be a string.")
        n_return = int(kwargs.get("num_return_sequences", 1) or 1)
        filled = [i for i, text in enumerate(texts) if text.strip()]
        results: list = [[{"translation_text": ""} for _ in range(n_return)] for _ in texts]
        if filled:
            translated = super().__call__([texts[i] for i in filled], **kwargs)
            for i, result in zip(filled, translated):
                results[i] = result
        if single:
            return results[0]
        if n_return == 1:
            return [result[0] for result in results]
        return results

    def _max_source_tokens(self) -> int:
        """The longest source the model and tokenizer accept (tokenizers without a limit report ~1e30)."""
        limits = (getattr(self.model.config, "max_position_embeddings", None), self.tokenizer.model_max_length)
        usable = [int(limit) for limit in limits if isinstance(limit, int) and 0 < limit < 10**9]
        return min(usable) if usable else 1024

    def preprocess(self, text: str, truncation: bool = True, target_code: str | None = None) -> dict[str, torch.Tensor]:
        """``target_code``: a multi-target model's ``>>xx<<`` (``tgt_lang``), put before the text as Marian's
        tokenizer expects it (docs/public-checkpoints.md)."""
        if target_code is not None and not text.startswith(">>"):
            text = f"{target_code} {text}"
        if self.prefix:
            text = self.prefix + text
        limit = self._max_source_tokens()
        encoded = self.tokenizer(text, return_tensors="pt")
        length = encoded["input_ids"].shape[-1]
        if length > limit:
            if not truncation:
                raise UserInputError(
                    f"TranslationPipeline: the input has {length} tokens, more than the model accepts ({limit}); "
                    "pass truncation=True to cut it."
                )
            warnings.warn(
                f"TranslationPipeline: an input of {length} tokens was truncated to the {limit} tokens the model "
                "accepts.",
                UserWarning,
                stacklevel=2,
            )
            encoded = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=limit)
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    def _length_given(self, generate_kwargs: dict[str, Any]) -> bool:
        """Whether the call or the construction set the output length (``max_new_tokens`` / ``max_length``, also
        inside a passed ``generation_config``)."""
        given = {**(getattr(self, "_generate_kwargs", None) or {}), **generate_kwargs}
        config = given.get("generation_config")
        lengths = {"max_new_tokens", "max_length"}
        return bool(lengths & given.keys()) or (config is not None and bool(lengths & config.to_diff_dict().keys()))

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs: Any) -> dict[str, torch.Tensor]:
        budgeted = not self._length_given(generate_kwargs)
        if hasattr(self, "_prepare_generate_kwargs"):  # transformers >= 5.2x
            generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        else:
            generate_kwargs = self._legacy_generate_kwargs(generate_kwargs)
        batch = model_inputs["input_ids"].shape[0]
        if not budgeted:
            output_ids = self.model.generate(**model_inputs, **generate_kwargs)
            # (B * n, T) -> (B, n, T): the pipeline un-batches along dim 0.
            return {"output_ids": output_ids.reshape(batch, output_ids.shape[0] // batch, *output_ids.shape[1:])}
        # Each source's own new-token budget (`new_token_budget`), as `deepnmt translate` decodes: the rows of one
        # budget are one `generate` call, so a translation never depends on the sentences batched with it.
        positions = getattr(self.model.config, "max_position_embeddings", None) or 1024
        budgets = [new_token_budget(int(n), positions) for n in model_inputs["attention_mask"].sum(-1)]
        outputs: list[torch.Tensor] = [torch.empty(0)] * batch
        for budget, rows in rows_by_budget(budgets):
            index = torch.tensor(rows, device=model_inputs["input_ids"].device)
            inputs = {name: value[index] for name, value in model_inputs.items()}
            output_ids = self.model.generate(**inputs, **{**generate_kwargs, "max_new_tokens": budget})
            output_ids = output_ids.reshape(len(rows), output_ids.shape[0] // len(rows), -1)  # (rows, n, T)
            for row, ids in zip(rows, output_ids):
                outputs[row] = ids
        width = max(ids.shape[-1] for ids in outputs)
        pad = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        padded = [torch.nn.functional.pad(ids, (0, width - ids.shape[-1]), value=pad) for ids in outputs]
        return {"output_ids": torch.stack(padded)}  # (B, n, T)

    def _legacy_generate_kwargs(self, generate_kwargs: dict[str, Any]) -> dict[str, Any]:
        """transformers < 5.2x keeps the parameters given at construction in ``self.generation_config`` (with the
        global defaults filled in). Passing that object along with call-time kwargs is deprecated there and makes
        ``max_length=20`` look user-set, so pass only what construction changed, under the call's own kwargs."""
        prepared = getattr(self, "generation_config", None)
        prepare = getattr(self.model, "_prepare_generation_config", None)
        if prepared is None or prepare is None or "generation_config" in generate_kwargs:
            return generate_kwargs
        reference = prepare(generation_config=copy.deepcopy(self.model.generation_config))[0].to_dict()
        preset = {
            key: value
            for key, value in prepared.to_dict().items()
            if not key.startswith("_") and key != "transformers_version" and reference.get(key) != value
        }
        return {**preset, **generate_kwargs}

    def postprocess(
        self,
        model_outputs: dict[str, torch.Tensor],
        return_tensors: bool = False,
        clean_up_tokenization_spaces: bool = False,
    ) -> list[dict[str, Any]]:
        records = []
        for ids in model_outputs["output_ids"][0]:
            if return_tensors:
                records.append({"translation_token_ids": ids})
            else:
                text = self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
                records.append({"translation_text": text})
        return records


_REGISTERED = False


class _NoDefaultModel(dict):
    """The ``translation`` task's defaults: none. transformers looks a default model up (``"model" in defaults``, or
    the language pair's entry) only when `pipeline` got no model; that look-up raises one sentence instead."""

    def __contains__(self, key: object) -> bool:
        raise UserInputError("pipeline('translation') needs a model: the task has no default model, so pass "
                             "model=<a saved folder or a Hub id of a translation model>, e.g. "
                             "pipeline('translation', model='runs/my-model').")


def register_translation_pipeline() -> None:
    """Register the ``translation`` task for ``AutoModelForSeq2SeqLM`` models in this process (idempotent).

    transformers 5.2x lists ``translation`` among removed tasks and refuses it before looking at the registry; the
    task is taken off that list here, which restores it for every seq2seq model, ours or not. transformers 5 also
    dropped the parsing of ``"translation_<src>_to_<tgt>"`` task names: the registry's ``check_task`` is wrapped so
    that such a name resolves to this pipeline, which receives the name as its ``task`` and checks the pair against
    the model.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AutoModelForSeq2SeqLM
    from transformers import pipelines as hf_pipelines

    removed = getattr(hf_pipelines, "REMOVED_TASKS", None)
    if isinstance(removed, dict):
        removed.pop("translation", None)
    registry = hf_pipelines.PIPELINE_REGISTRY
    registry.register_pipeline(
        "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
    # No default model: `pipeline("translation")` without one asks for it in one sentence (transformers reads the
    # task's "default" only when no model is given; a missing key was a bare KeyError).
    registry.supported_tasks["translation"]["default"] = _NoDefaultModel()
    check_task = registry.check_task

    def check_task_with_language_pairs(task: str) -> tuple[str, dict, Any]:
        pair = parse_translation_task(task)
        if pair is not None and "translation" in registry.supported_tasks:
            return "translation", registry.supported_tasks["translation"], pair
        return check_task(task)

    registry.check_task = check_task_with_language_pairs
    _REGISTERED = True
