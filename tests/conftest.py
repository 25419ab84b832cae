"""Shared fixtures: offline Hub, tiny configs (d_model 16, 2+2 layers, vocab 99), deprecation policing."""

from __future__ import annotations

import logging
import os
import tempfile

# Offline, and a private HF_HOME so dynamic (trust_remote_code) modules never leak between runs or users.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hf_deepnmt_tests_hf_home_"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

import hf_deepnmt  # noqa: E402,F401  (registers Auto classes and the translation pipeline)
from hf_deepnmt import (  # noqa: E402
    DeepTransformerConfig,
    DeepTransformerForConditionalGeneration,
    DTMTConfig,
    DTMTForConditionalGeneration,
)

# Two threads at most (the project's machines have 2 cores); fewer when OMP_NUM_THREADS says so, e.g. beside other
# work on the same cores, where two spinning threads per process slow small operations down many times.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1, int(os.environ.get("OMP_NUM_THREADS") or 2))))

TINY = dict(
    vocab_size=99,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=64,
)


def tiny_config(**overrides) -> DeepTransformerConfig:
    return DeepTransformerConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides) -> DeepTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return DeepTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


TINY_DTMT = dict(vocab_size=99, d_model=16, transition_depth=2, attention_heads=4, max_position_embeddings=64)


def dtmt_config(**overrides) -> DTMTConfig:
    return DTMTConfig(**{**TINY_DTMT, **overrides})


def dtmt_model(seed: int = 0, **overrides) -> DTMTForConditionalGeneration:
    torch.manual_seed(seed)
    return DTMTForConditionalGeneration(dtmt_config(**overrides)).eval()


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    """Two right-padded source sentences and their (-100 padded) labels; ids avoid the specials 0-3."""
    input_ids = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 12, 2, 0, 0]])
    labels = torch.tensor([[13, 14, 15, 16, 2], [17, 18, 2, -100, -100]])
    return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels}


# --------------------------------------------------------------------------------------------------------------
# transformers deprecations fail the tests: both the `warnings` kind (pyproject filterwarnings) and the logged kind
# (`logger.warning_once("... is deprecated ...")`), which the handler below collects.
# --------------------------------------------------------------------------------------------------------------
class _DeprecationCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if is_deprecation_message(message):
            self.messages.append(message)


def is_deprecation_message(message: str) -> bool:
    lowered = message.lower()
    return "deprecat" in lowered or "will be removed" in lowered or "no longer supported" in lowered


@pytest.fixture(autouse=True)
def _fail_on_transformers_deprecations():
    collector = _DeprecationCollector()
    logger = logging.getLogger("transformers")
    logger.addHandler(collector)
    try:
        yield
    finally:
        logger.removeHandler(collector)
    assert not collector.messages, f"transformers logged deprecations: {collector.messages}"


# --------------------------------------------------------------------------------------------------------------
# A tiny saved model + joint BPE tokenizer, shared by the pipeline, remote-code and tokenizer tests.
# --------------------------------------------------------------------------------------------------------------
PARALLEL = [
    ("In the beginning God created the heavens and the earth.", "En el principio creó Dios los cielos y la tierra."),
    ("And God said, Let there be light, and there was light.", "Y dijo Dios: Sea la luz, y fué la luz."),
    ("And God saw the light, that it was good.", "Y vió Dios que la luz era buena."),
    ("The earth was without form and void.", "Y la tierra estaba desordenada y vacía."),
    ("And the evening and the morning were the first day.", "Y fué la tarde y la mañana un día."),
    ("Blessed are the meek, for they shall inherit the earth.", "Bienaventurados los mansos, porque heredarán la tierra."),
]


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from hf_deepnmt_training.tokenizer import train_joint_bpe

    sources, targets = zip(*PARALLEL)
    return train_joint_bpe(sources * 3, targets * 3, vocab_size=120, min_frequency=1, model_max_length=64)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory, tiny_tokenizer):
    """A saved tiny model with its tokenizer, as `save_pretrained` leaves it for the Hub."""
    folder = tmp_path_factory.mktemp("tiny_model")
    model = tiny_model(vocab_size=len(tiny_tokenizer))
    model.save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder


# --------------------------------------------------------------------------------------------------------------
# Small data files for the training-system tests (taken from the embedded corpus).
# --------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """train/valid/test JSONL files (run_translation format) with 160/24/24 short verse pairs."""
    import gzip
    import json

    from hf_deepnmt_training.corpus import corpus_dir

    folder = tmp_path_factory.mktemp("small_corpus")
    sizes = {"train": 160, "valid": 24, "test": 24}
    for split, size in sizes.items():
        records = []
        with gzip.open(corpus_dir() / f"{split}.jsonl.gz", "rt", encoding="utf-8") as handle:
            for line in handle:
                record = json.loads(line)
                if len(record["translation"]["en"]) < 90:
                    records.append(line)
                if len(records) == size:
                    break
        (folder / f"{split}.jsonl").write_text("".join(records), encoding="utf-8")
    return folder


TINY_TRAIN_ARGS = [
    "--config_overrides", "d_model=16,encoder_layers=2,decoder_layers=2,encoder_attention_heads=2,"
    "decoder_attention_heads=2,encoder_ffn_dim=32,decoder_ffn_dim=32,max_position_embeddings=64",
    "--vocab_size", "200", "--bpe_min_frequency", "1",
    "--max_source_length", "48", "--max_target_length", "48",
    "--learning_rate", "3e-3", "--warmup_steps", "0", "--lr_scheduler_type", "constant",
    "--logging_steps", "1", "--report_to", "none", "--use_cpu", "true", "--seed", "3",
    "--per_device_train_batch_size", "8", "--eval_strategy", "no", "--save_strategy", "no",
    "--dataloader_num_workers", "0", "--disable_tqdm", "true",
    "--nmt_defaults", "false",  # every option is given here; tests/test_defaults.py tests the from-scratch defaults
]


def train_argv(corpus_folder, output_dir, *extra: str) -> list[str]:
    return [
        "--train_file", str(corpus_folder / "train.jsonl"),
        "--validation_file", str(corpus_folder / "valid.jsonl"),
        "--test_file", str(corpus_folder / "test.jsonl"),
        "--output_dir", str(output_dir),
        *TINY_TRAIN_ARGS,
        *extra,
    ]


# --------------------------------------------------------------------------------------------------------------
# `integration`: a test that spawns a Python interpreter (or a launcher of one) or trains through the command line
# must say so with @pytest.mark.integration, so that `pytest -m "not integration"` is a fast loop that does neither.
# Checked while the tests run: such a call from a test without the marker fails it, naming what it did.
# --------------------------------------------------------------------------------------------------------------
import subprocess  # noqa: E402
import sys  # noqa: E402

_CURRENT_TEST: list = [None]
_INTERPRETERS = ("python", "torchrun", "accelerate", "deepnmt")


def pytest_runtest_setup(item) -> None:
    _CURRENT_TEST[0] = item


def pytest_runtest_teardown(item, nextitem) -> None:
    _CURRENT_TEST[0] = None


def require_integration_marker(what: str) -> None:
    item = _CURRENT_TEST[0]
    if item is not None and item.get_closest_marker("integration") is None:
        pytest.fail(f"{item.nodeid} {what}: mark it @pytest.mark.integration (pytest -m 'not integration' must "
                    "neither spawn interpreters nor train through the command line).", pytrace=False)


_popen_init = subprocess.Popen.__init__


def _checked_popen_init(self, args, *rest, **kwargs):
    program = str(args[0] if isinstance(args, (list, tuple)) and args else args)
    if program == sys.executable or any(name in os.path.basename(program) for name in _INTERPRETERS):
        require_integration_marker(f"spawns {os.path.basename(program)}")
    return _popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _checked_popen_init

import hf_deepnmt_training.train  # noqa: E402
from hf_deepnmt_training.trainer import DeepNMTTrainer  # noqa: E402

_cli_runs: list[bool] = []
_train, _trainer_train = hf_deepnmt_training.train.train, DeepNMTTrainer.train


def _checked_train(*args, **kwargs):
    _cli_runs.append(True)  # `deepnmt train` (or the quickstart) is running: its training loop will say so
    try:
        return _train(*args, **kwargs)
    finally:
        _cli_runs.pop()


def _checked_trainer_train(self, *args, **kwargs):
    if _cli_runs:
        require_integration_marker("trains through the command line")
    return _trainer_train(self, *args, **kwargs)


hf_deepnmt_training.train.train = _checked_train
DeepNMTTrainer.train = _checked_trainer_train
