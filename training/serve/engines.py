"""The engines that translate a batch (`Translator`s): the folder's translation pipeline over the torch model or
ONNX Runtime (`PipelineTranslator`), a CTranslate2 export (`CTranslate2Translator`), and `load_translator`, which
loads the one `options.choose_engine` chose. torch and the model are imported when one loads."""

from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .translators import (CTRANSLATE2_PARAMETERS, GENERATION_PARAMETERS, PIPELINE_PARAMETERS, More, Settings, Source,
                          Translator, budget_of, check_parameter_types, first_line, settings_key, too_long)

class PipelineTranslator:
    """The torch and ONNX engines: the folder's translation pipeline (`hf_deepnmt.TranslationPipeline`, over the
    torch model or `OnnxSeq2SeqLM`) with its own ``preprocess``, batching (``pad_collate_fn``), ``forward`` and
    ``postprocess``; only the grouping of texts into batches is the server's."""

    def __init__(self, pipeline: Any, engine: str, max_input_tokens: int | None = None,
                 retiring: bool = True, continuous: bool = False) -> None:
        from transformers.pipelines.base import pad_collate_fn

        from hf_deepnmt.errors import UserInputError

        self.pipeline = pipeline
        self.engine = engine
        self.retiring = retiring  # decode every budget in one retiring search where it takes the settings
        self.continuous = continuous  # sentences join a running search (a model with `admits_mid_search`)
        self.model_limit = pipeline._max_source_tokens()
        if max_input_tokens is not None and max_input_tokens > self.model_limit:
            raise UserInputError(f"`--max_input_tokens` = {max_input_tokens} is more than the model accepts "
                                 f"({self.model_limit} tokens); use {self.model_limit} or less.")
        self.max_input_tokens = max_input_tokens or self.model_limit
        self.collate = pad_collate_fn(pipeline.tokenizer, None)
        self.tokenizer_lock = threading.Lock()  # encode (event loop) and decode (worker) share one tokenizer
        config = pipeline.model.config
        # the decoder's positions bound the output: the start token takes one (None: the model has no such limit)
        positions = getattr(config, "max_position_embeddings", None)
        self.max_output = positions if isinstance(positions, int) and positions > 1 else None

    def continuous_refused(self) -> str | None:
        """Why sentences cannot join a running search here (None: they can, for the settings the search takes)."""
        if not self.retiring:
            return "--search generate decodes each batch in one generate call"
        model = self.pipeline.model
        if not getattr(model, "admits_mid_search", False):
            return (f"{type(model).__name__} takes sentences only into an empty search (the Transformer family of "
                    "the torch engine takes them half-way)")
        return None

    def prepare(self, parameters: dict[str, Any]) -> Settings:
        from hf_deepnmt.errors import UserInputError
        from hf_deepnmt.modeling_common import check_generation_arguments
        from hf_deepnmt.retiring_search import unsupported

        check_parameter_types(parameters, {**PIPELINE_PARAMETERS, **GENERATION_PARAMETERS}, self.engine)
        pipeline = self.pipeline
        preprocess, forward, postprocess = pipeline._sanitize_parameters(**parameters)  # checks the languages
        forward = {**pipeline._forward_params, **forward}
        check_generation_arguments(forward)
        config = copy.deepcopy(pipeline.model.generation_config)
        setting = {**config.to_dict(), **forward}
        beams, returned = setting.get("num_beams") or 1, setting.get("num_return_sequences") or 1
        if returned > beams and not setting.get("do_sample"):
            raise UserInputError(f"`parameters.num_return_sequences` = {returned} is more than `num_beams` = {beams}; "
                                 "beam search returns at most num_beams translations per text.")
        try:  # what `generate` refuses, refused before the request joins a batch
            config.update(**forward)
            config.validate()
        except ValueError as error:
            raise UserInputError(f"`parameters`: {first_line(error)}") from None
        for name, limit in (("max_new_tokens", None if self.max_output is None else self.max_output - 1),
                            ("max_length", self.max_output)):
            value = forward.get(name)
            if limit is not None and value is not None and value > limit:
                raise UserInputError(f"`parameters.{name}` = {value} is more than this model can generate "
                                     f"({limit}, its max_position_embeddings); use {limit} or less.")
        # one search over every budget when the request leaves the length to the budgets and the search takes the
        # settings (otherwise `generate`, one call per budget)
        mixes = (self.retiring and not {"max_new_tokens", "max_length"} & forward.keys()
                 and unsupported(pipeline.model, forward) is None)
        return Settings(key=settings_key(parameters), parameters=parameters,
                        num_return_sequences=int(parameters.get("num_return_sequences", 1) or 1),
                        preprocess={**pipeline._preprocess_params, **preprocess, "truncation": False},
                        forward=forward, postprocess={**pipeline._postprocess_params, **postprocess},
                        mixes_budgets=bool(mixes))

    def encode(self, text: str, index: int, settings: Settings) -> Source:
        pipeline = self.pipeline
        with self.tokenizer_lock:
            length = len(pipeline.tokenizer((pipeline.prefix or "") + text)["input_ids"])
            if length > self.max_input_tokens:
                raise too_long(index, length, self.max_input_tokens, self.model_limit)
            positions = getattr(pipeline.model.config, "max_position_embeddings", None) or 1024
            return Source(length, pipeline.preprocess(text, **settings.preprocess),
                          budget_of(length, settings.forward, positions))

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]:
        """Every source's translations, in order (those ``more`` added after them); with the retiring search,
        ``deliver(i, translations)`` gets source ``i``'s as soon as its search is over (the batch goes on with the
        others), and between decoder steps the sources ``more`` gives join the search (`ContinuousSearch`)."""
        pipeline = self.pipeline

        def decode(output_ids: torch.Tensor) -> list[str]:  # (1, sequences per text, length)
            with self.tokenizer_lock:
                return [record["translation_text"] for record in
                        pipeline.postprocess({"output_ids": output_ids}, **settings.postprocess)]

        if not settings.mixes_budgets:
            batch = self.collate([source.inputs for source in sources])
            output_ids = pipeline.forward(batch, **settings.forward)["output_ids"]  # (batch, sequences, length)
            return [decode(output_ids[row:row + 1]) for row in range(len(sources))]
        from hf_deepnmt.retiring_search import ContinuousSearch, search_settings

        search = ContinuousSearch(pipeline.model, search_settings(pipeline.model, settings.forward))
        decoded: dict[int, list[str]] = {}
        total = 0

        def admit(joining: Sequence[Source]) -> None:
            nonlocal total
            batch = self.collate([source.inputs for source in joining])
            search.admit(batch["input_ids"].to(pipeline.device), batch["attention_mask"].to(pipeline.device),
                         [source.budget for source in joining], range(total, total + len(joining)))
            total += len(joining)

        admit(sources)
        joins = more is not None and self.continuous and search.admits_mid_search
        while True:
            if joins:  # continuous batching: the sentences that arrived join between two decoder steps
                joining = more(len(search))
                if joining:
                    admit(joining)
            if not len(search):
                break
            for index, hypotheses in search.step():
                decoded[index] = decode(hypotheses.sequences[None])
                if deliver is not None:
                    deliver(index, decoded[index])
        return [decoded[index] for index in range(total)]


class CTranslate2Translator:
    """A CTranslate2 export (`hf_deepnmt.export_ctranslate2.CTranslate2Engine`): the tokenizer that travels with it,
    CTranslate2's beam search (``early_stopping=True``, docs/fast-inference.md) and the pipeline's decoding
    (``skip_special_tokens``). Its parameters are the engine's: `CTRANSLATE2_PARAMETERS`."""

    @staticmethod
    def continuous_refused() -> str:
        return "CTranslate2 decodes each batch with its own search"

    engine = "ctranslate2"

    def __init__(self, engine: Any, tokenizer: Any, max_input_tokens: int | None = None) -> None:
        from hf_deepnmt.errors import UserInputError

        self.ct2 = engine
        self.tokenizer = tokenizer
        limits = (engine.max_positions, tokenizer.model_max_length)
        self.model_limit = min(int(limit) for limit in limits if isinstance(limit, int) and 0 < limit < 10**9)
        if max_input_tokens is not None and max_input_tokens > self.model_limit:
            raise UserInputError(f"`--max_input_tokens` = {max_input_tokens} is more than the model accepts "
                                 f"({self.model_limit} tokens); use {self.model_limit} or less.")
        self.max_input_tokens = max_input_tokens or self.model_limit
        generation = engine.manifest.get("generation", {})
        self.defaults = {"num_beams": generation.get("num_beams") or 1}  # the length: each text's own budget
        self.tokenizer_lock = threading.Lock()

    def prepare(self, parameters: dict[str, Any]) -> Settings:
        from hf_deepnmt.errors import UserInputError

        allowed = {name: {**PIPELINE_PARAMETERS, **GENERATION_PARAMETERS}[name] for name in CTRANSLATE2_PARAMETERS}
        check_parameter_types(parameters, allowed, self.engine)
        forward = {**self.defaults, **{k: v for k, v in parameters.items() if k != "clean_up_tokenization_spaces"}}
        for name in ("num_beams", "max_new_tokens"):
            if forward.get(name, 1) < 1:
                raise UserInputError(f"`parameters.{name}` = {forward[name]} is not allowed; it must be an integer ≥ 1.")
        if forward.get("min_new_tokens", 0) < 0:
            raise UserInputError(f"`parameters.min_new_tokens` = {forward['min_new_tokens']} is not allowed; it must "
                                 "be an integer ≥ 0.")
        if forward.get("early_stopping") is not None and forward["early_stopping"] is not True:
            raise UserInputError(f"`parameters.early_stopping` = {json.dumps(forward['early_stopping'])} is not "
                                 "available with the ctranslate2 engine, whose beam search stops a text once num_beams "
                                 "hypotheses have finished (true); serve the model with the torch or onnx engine.")
        return Settings(key=settings_key(parameters), parameters=parameters, num_return_sequences=1, forward=forward,
                        postprocess={"clean_up_tokenization_spaces":
                                     parameters.get("clean_up_tokenization_spaces", False)})

    def encode(self, text: str, index: int, settings: Settings) -> Source:
        with self.tokenizer_lock:
            ids = self.tokenizer(text)["input_ids"]
        if len(ids) > self.max_input_tokens:
            raise too_long(index, len(ids), self.max_input_tokens, self.model_limit)
        return Source(len(ids), ids, budget_of(len(ids), settings.forward, self.ct2.max_positions))

    def translate(self, sources: Sequence[Source], settings: Settings,
                  deliver: Callable[[int, list[str]], None] | None = None,
                  more: More | None = None) -> list[list[str]]:
        """Every source's translations, in order (one batch: CTranslate2 takes no sentences mid-search)."""
        from hf_deepnmt.pipeline_translation import rows_by_budget

        # each text's own budget (`Source.budget`; None: the request's max_new_tokens), one call per budget, as the
        # pipeline of the torch and onnx engines decodes (the batcher already hands over texts of one budget)
        outputs: list[list[int]] = [[]] * len(sources)
        for budget, rows in rows_by_budget([source.budget for source in sources]):
            length = {} if budget is None else {"max_new_tokens": budget}
            for row, ids in zip(rows, self.ct2.generate([sources[row].inputs for row in rows], **settings.forward,
                                                       **length)):
                outputs[row] = ids
        with self.tokenizer_lock:
            return [[self.tokenizer.decode(ids, skip_special_tokens=True, **settings.postprocess)] for ids in outputs]


def load_translator(engine: str, folder: str | os.PathLike, threads: int | None = None,
                    max_input_tokens: int | None = None, search: str = "retiring",
                    continuous: bool = False, workers: int = 1) -> Translator:
    """Load ``engine`` for ``folder`` (as `choose_engine` returned them) with ``threads`` intra-op threads (default:
    torch's thread count divided among the ``workers`` instances the server loads, at least one each);
    ``search``: how the torch and onnx engines decode a batch (`ServeOptions.search`); ``continuous``: sentences join
    a running retiring search (`ServeOptions.continuous_batching`)."""
    import torch
    from transformers import AutoTokenizer

    import hf_deepnmt  # noqa: F401  (registers the model types and pipeline("translation"))
    from hf_deepnmt.pipeline_translation import TranslationPipeline

    if not threads and workers > 1:
        threads = max(1, torch.get_num_threads() // workers)
    if threads:
        torch.set_num_threads(threads)
    threads = threads or torch.get_num_threads()
    if engine == "ctranslate2":
        from hf_deepnmt.export_ctranslate2 import CTranslate2Engine

        return CTranslate2Translator(CTranslate2Engine(folder, intra_threads=threads),
                                     AutoTokenizer.from_pretrained(folder), max_input_tokens)
    if engine == "onnx":
        from hf_deepnmt.ort_generation import OnnxSeq2SeqLM

        model = OnnxSeq2SeqLM.from_export(folder, threads)
        pipeline = TranslationPipeline(model=model, tokenizer=AutoTokenizer.from_pretrained(folder),
                                       task="translation")
    else:
        from transformers import pipeline as make_pipeline

        pipeline = make_pipeline("translation", model=str(folder), device=0 if torch.cuda.is_available() else -1)
    if search == "generate":
        # transformers' own loop per budget, the way before the retiring search: a model's `generate` would
        # otherwise run that search on each budget's rows (docs/transformer.md, "`generate`")
        pipeline.model.generate_by_retiring_search = False
    return PipelineTranslator(pipeline, engine, max_input_tokens, retiring=search == "retiring",
                              continuous=continuous)
