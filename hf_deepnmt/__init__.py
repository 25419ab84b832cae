"""hf_deepnmt: very deep neural machine translation as Hugging Face `transformers` models.

Importing the package registers every model type with `AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM`,
marks the classes for `register_for_auto_class` (so `save_pretrained` copies the code and writes `auto_map`), and
restores `pipeline("translation")` and `pipeline("translation_<src>_to_<tgt>")` (removed in transformers 5) for
seq2seq models, without `trust_remote_code` for the package's own saved folders.

Only torch, transformers and safetensors are needed at import time; the training tools live in `training`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedConfig

from . import losses
from .admin import admin_omega_closed_form, admin_profile, fold_admin, omega_values
from .cache_dtmt import DTMTCache
from .configuration_deep_transformer import (
    AdminTransformerConfig,
    DeepDecoderTransformerConfig,
    DeepRepresentationTransformerConfig,
    DeepTransformerConfig,
)
from .configuration_dtmt import DTMTConfig
from .conversion import convert_checkpoint, convert_model
from .ensemble import EnsembleCache, EnsembleForConditionalGeneration, load_ensemble
from .errors import UserInputError
from .export_marian import export_marian
from .modeling_deep_transformer import (
    AdminTransformerForConditionalGeneration,
    AdminTransformerModel,
    DeepDecoderTransformerForConditionalGeneration,
    DeepDecoderTransformerModel,
    DeepRepresentationTransformerForConditionalGeneration,
    DeepRepresentationTransformerModel,
    DeepTransformerForConditionalGeneration,
    DeepTransformerModel,
    DeepTransformerPreTrainedModel,
)
from .modeling_common import shift_tokens_right
from .modeling_dtmt import DTMTForConditionalGeneration, DTMTModel, DTMTPreTrainedModel
from .pipeline_translation import (
    TranslationPipeline,
    record_language_pair,
    recorded_language_pairs,
    register_translation_pipeline,
)
from .registry import MODEL_TYPES, ModelTypeEntry, model_type_entry, model_type_names
from .tokenization_fairseq import FairseqMosesBPETokenizer
from .warm_start import warm_start

__version__ = "0.1.0"

__all__ = [
    "AdminTransformerConfig",
    "AdminTransformerForConditionalGeneration",
    "AdminTransformerModel",
    "admin_omega_closed_form",
    "admin_profile",
    "convert_checkpoint",
    "convert_model",
    "export_marian",
    "fold_admin",
    "losses",
    "model_type_entry",
    "model_type_names",
    "omega_values",
    "DeepDecoderTransformerConfig",
    "DeepDecoderTransformerForConditionalGeneration",
    "DeepDecoderTransformerModel",
    "DeepRepresentationTransformerConfig",
    "DeepRepresentationTransformerForConditionalGeneration",
    "DeepRepresentationTransformerModel",
    "DeepTransformerConfig",
    "DeepTransformerForConditionalGeneration",
    "DeepTransformerModel",
    "DeepTransformerPreTrainedModel",
    "DTMTCache",
    "DTMTConfig",
    "DTMTForConditionalGeneration",
    "DTMTModel",
    "DTMTPreTrainedModel",
    "EnsembleCache",
    "EnsembleForConditionalGeneration",
    "FairseqMosesBPETokenizer",
    "MODEL_TYPES",
    "ModelTypeEntry",
    "TranslationPipeline",
    "UserInputError",
    "load_ensemble",
    "record_language_pair",
    "recorded_language_pairs",
    "register_translation_pipeline",
    "shift_tokens_right",
    "warm_start",
]


class _FairseqTokenizerOwner(PreTrainedConfig):
    """No model has this config: registering `FairseqMosesBPETokenizer` under it lets ``AutoTokenizer`` find the class
    by the name a converted folder's tokenizer_config.json gives, without remote code, in a process that imported
    hf_deepnmt."""

    model_type = "hf_deepnmt_fairseq_bpe_tokenizer"


def _register() -> None:
    AutoTokenizer.register(_FairseqTokenizerOwner, tokenizer_class=FairseqMosesBPETokenizer, exist_ok=True)
    for entry in MODEL_TYPES.values():
        AutoConfig.register(entry.model_type, entry.config_class, exist_ok=True)
        AutoModel.register(entry.config_class, entry.base_model_class, exist_ok=True)
        AutoModelForSeq2SeqLM.register(entry.config_class, entry.seq2seq_class, exist_ok=True)
        entry.config_class.register_for_auto_class("AutoConfig")
        entry.base_model_class.register_for_auto_class("AutoModel")
        entry.seq2seq_class.register_for_auto_class("AutoModelForSeq2SeqLM")
    register_translation_pipeline()


_register()
