"""`TranslationPipeline`: ``pipeline("translation")`` for encoder-decoder models under transformers 5.

transformers 5 removed the ``translation`` task (PR huggingface/transformers#43256). This pipeline brings it
back in two ways:

* in-process, ``import hf_deepnmt`` calls `register_translation_pipeline`, which registers the task for every
  ``AutoModelForSeq2SeqLM`` model: ``pipeline("translation", model=model, tokenizer=tokenizer)``;
* on the Hub, every saved DeepTransformer folder carries this file and a ``custom_pipelines`` entry, so
  ``pipeline("translation", model=folder_or_repo, trust_remote_code=True)`` works where hf_deepnmt is not installed.

Behaviour: a string gives ``[{"translation_text": ...}]``, a list of strings gives one dict per string (a list of
dicts per string when ``num_return_sequences > 1``); generation keyword arguments (``num_beams``,
``max_new_tokens``, …) pass through to ``generate``; an empty or blank string translates to ``""`` without calling
the model; an input longer than the model accepts is truncated with a warning.

This file is copied next to the weights by ``save_pretrained`` (trust_remote_code): it imports only transformers
and torch, and works with the pipeline API of transformers 5.17 through 5.x.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from transformers import Pipeline

# The `custom_pipelines` entry written into config.json by DeepTransformer models' save_pretrained.
TRANSLATION_PIPELINE_SPEC: dict[str, Any] = {
    "impl": "pipeline_translation.TranslationPipeline",
    "pt": ["AutoModelForSeq2SeqLM"],
    "type": "text",
}


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
    ```
    """

    _pipeline_calls_generate = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(
        self,
        truncation: bool | None = None,
        return_tensors: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        **generate_kwargs: Any,
    ) -> tuple[dict, dict, dict]:
        preprocess_params: dict[str, Any] = {}
        if truncation is not None:
            preprocess_params["truncation"] = truncation
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
            raise ValueError(f"TranslationPipeline: `inputs` = {_preview(inputs)} ({type(inputs).__name__}) is not "
                             "allowed; pass a string or a list of strings.")
        texts = [inputs] if single else list(inputs)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                raise ValueError(f"TranslationPipeline: `inputs[{index}]` = {_preview(text)} "
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

    def preprocess(self, text: str, truncation: bool = True) -> dict[str, torch.Tensor]:
        if self.prefix:
            text = self.prefix + text
        limit = self._max_source_tokens()
        encoded = self.tokenizer(text, return_tensors="pt")
        length = encoded["input_ids"].shape[-1]
        if length > limit:
            if not truncation:
                raise ValueError(
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

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs: Any) -> dict[str, torch.Tensor]:
        if hasattr(self, "_prepare_generate_kwargs"):  # transformers >= 5.2x
            generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        else:
            generate_kwargs = self._legacy_generate_kwargs(generate_kwargs)
        batch = model_inputs["input_ids"].shape[0]
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        # (B * n, T) -> (B, n, T): the pipeline un-batches along dim 0.
        output_ids = output_ids.reshape(batch, output_ids.shape[0] // batch, *output_ids.shape[1:])
        return {"output_ids": output_ids}

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


def register_translation_pipeline() -> None:
    """Register the ``translation`` task for ``AutoModelForSeq2SeqLM`` models in this process (idempotent).

    transformers 5.2x lists ``translation`` among removed tasks and refuses it before looking at the registry; the
    task is taken off that list here, which restores it for every seq2seq model, ours or not.
    """
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AutoModelForSeq2SeqLM
    from transformers import pipelines as hf_pipelines

    removed = getattr(hf_pipelines, "REMOVED_TASKS", None)
    if isinstance(removed, dict):
        removed.pop("translation", None)
    hf_pipelines.PIPELINE_REGISTRY.register_pipeline(
        "translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
    )
    _REGISTERED = True
