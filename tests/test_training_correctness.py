"""The training objective is the model's own and accumulates exactly (docs/training.md): a stock Seq2SeqTrainer
optimises what DeepNMTTrainer does; one batch == k accumulated micro-batches == k DDP processes for every term;
eval losses are unsmoothed; invalid combinations are refused; inputs_embeds equals input_ids."""

from __future__ import annotations

import ast
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY, tiny_config, tiny_model
from invariance_worker import PAD, TERMS, collate, examples, one_step

from hf_deepnmt import DeepDecoderTransformerConfig, admin_profile
from hf_deepnmt.losses import LossNormalizers, batch_normalizers, compute_losses, label_smoothed_nll_loss

ROOT = Path(__file__).resolve().parents[1]


def max_weight_difference(a: dict, b: dict) -> float:
    assert a["weights"].keys() == b["weights"].keys()
    return max((a["weights"][name] - b["weights"][name]).abs().max().item() for name in a["weights"])


@pytest.fixture(scope="module")
def one_batch(tmp_path_factory):
    """The reference: every term, all 6 pairs in one batch, one process."""
    folder = tmp_path_factory.mktemp("reference")
    return {term: one_step(term, str(folder / term), batch_size=6) for term in TERMS}


# ------------------------------------------------------------------------------------------------ item 0
def test_the_model_forward_returns_the_full_objective_in_training_mode(batch):
    model = tiny_model(decoder_layers=3, cross_attention_drop_depth=2, cross_attention_drop_ratio=0.5, dropout=0.1,
                       ddr_weight=1.0, ald_weight=1.0, label_smoothing=0.1).train()
    torch.manual_seed(0)
    out = model(**batch)
    torch.manual_seed(0)
    reference = compute_losses(model, batch, label_smoothing=0.1)
    torch.testing.assert_close(out.loss, reference.loss)
    assert set(out.loss_components) == {"nll", "smoothed_nll", "ddr", "ald"}
    assert out.loss_components["ald"] > 0 and out.loss_components["ddr"] > 0
    expected = (out.loss_components["smoothed_nll"] + out.loss_components["ddr"]
                + out.loss_components["ald"])  # one batch: every unit's count is this batch's own
    torch.testing.assert_close(out.loss.detach(), expected, rtol=1e-5, atol=1e-6)
    assert out.logits.shape[0] == batch["input_ids"].shape[0]  # the first decoder pass, (B, T, V)
    model.eval()
    with torch.no_grad():
        unsmoothed = model(**batch)
    assert set(unsmoothed.loss_components) == {"nll"}
    torch.testing.assert_close(unsmoothed.loss, unsmoothed.loss_components["nll"])


@pytest.mark.parametrize("term, accumulation", [("crt", 1), ("ddr", 2), ("dtmt", 2)])
def test_a_stock_seq2seq_trainer_trains_the_same_weights_as_ours(term, accumulation, tmp_path):
    """Three steps each. Exact with one micro-batch per step; with accumulation the stock Trainer passes only the
    target-token count, which is exact for token-level terms (NLL, DDR) — ALD needs DeepNMTTrainer's sentence count."""
    ours = one_step(term, str(tmp_path / "ours"), batch_size=6, steps=3)
    stock = one_step(term, str(tmp_path / "stock"), batch_size=6 // accumulation, accumulation=accumulation,
                     stock=True, steps=3)
    assert stock["loss"] == pytest.approx(ours["loss"], rel=1e-6)
    assert max_weight_difference(stock, ours) < 1e-5


# ------------------------------------------------------------------------------------------------ items 1 and 2
@pytest.mark.parametrize("term", sorted(TERMS))
def test_gradient_accumulation_equals_one_batch_for_every_term(term, one_batch, tmp_path):
    accumulated = one_step(term, str(tmp_path), batch_size=3, accumulation=2)
    assert accumulated["loss"] == pytest.approx(one_batch[term]["loss"], rel=1e-6)
    assert max_weight_difference(accumulated, one_batch[term]) < 1e-6


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    """Every term under torchrun with 2 CPU processes (gloo), 3 pairs each: one process start for all terms."""
    folder = tmp_path_factory.mktemp("ddp")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                             str(port), str(ROOT / "tests" / "invariance_worker.py"), str(folder)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return {term: torch.load(folder / f"{term}.pt", weights_only=True) for term in TERMS}


@pytest.mark.integration
@pytest.mark.parametrize("term", sorted(TERMS))
def test_two_ddp_processes_equal_one_batch_for_every_term(term, one_batch, two_processes):
    assert two_processes[term]["loss"] == pytest.approx(one_batch[term]["loss"], rel=1e-6)
    assert max_weight_difference(two_processes[term], one_batch[term]) < 1e-6


def test_pad_id_labels_are_not_counted_as_targets(one_batch, tmp_path):
    """Labels padded with the pad id (not -100): the step's count and the update are those of -100 padding."""
    padded = one_step("crt", str(tmp_path), batch_size=3, accumulation=2, label_pad=PAD)
    assert padded["loss"] == pytest.approx(one_batch["crt"]["loss"], rel=1e-6)
    assert max_weight_difference(padded, one_batch["crt"]) < 1e-6
    counts = batch_normalizers(collate(examples(), label_pad=PAD), PAD)
    assert counts == LossNormalizers(target_tokens=36.0, source_tokens=39.0, sentences=6.0)


# ------------------------------------------------------------------------------------------------ item 3
@pytest.mark.parametrize("predict_with_generate", [False, True])
def test_eval_loss_is_the_unsmoothed_nll_on_every_path(predict_with_generate, tmp_path):
    from datasets import Dataset
    from transformers import Seq2SeqTrainingArguments

    from hf_deepnmt_training.trainer import DeepNMTTrainer

    model = tiny_model(dropout=0.1)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path), label_smoothing_factor=0.3, per_device_eval_batch_size=6, report_to="none",
        use_cpu=True, predict_with_generate=predict_with_generate, generation_max_length=6, generation_num_beams=1,
        disable_tqdm=True, dataloader_num_workers=0)
    data = Dataset.from_list(examples())
    trainer = DeepNMTTrainer(model=model, args=args, eval_dataset=data, data_collator=collate,
                             source_reliance_samples=0)
    metrics = trainer.evaluate()
    batch = collate(examples())
    model.eval()
    with torch.no_grad():
        outputs = model(**batch)
        unsmoothed = outputs.loss.item()
        # what the eval loss would be if it were smoothed: the same logits, ε = 0.3 (no dropout draw in it)
        smoothed_sum, nll_sum, count = label_smoothed_nll_loss(outputs.logits, batch["labels"], 0.3,
                                                               model.config.pad_token_id)
    assert metrics["eval_loss"] == pytest.approx(unsmoothed, rel=1e-5)
    assert unsmoothed == pytest.approx((nll_sum / count).item(), rel=1e-5)
    assert abs(metrics["eval_loss"] - (smoothed_sum / count).item()) > 1e-3  # the smoothed value differs


# ------------------------------------------------------------------------------------------------ item 4
def test_admin_profiling_runs_every_cross_attention_whatever_the_seed(batch):
    overrides = dict(decoder_layers=3, cross_attention_drop_depth=2, cross_attention_drop_ratio=0.5, dropout=0.0,
                     residual_scaling="admin")
    profiles = []
    for seed in (0, 1, 2):
        model = tiny_model(**overrides)
        torch.manual_seed(seed)
        profiles.append(admin_profile(model, batch))
        assert [layer.cross_attention_keep for layer in model.model.decoder.layers] == [0.5, 0.5, 1.0]  # restored
    assert profiles[0] == profiles[1] == profiles[2]
    full = tiny_model(**{**overrides, "cross_attention_drop_depth": 0, "cross_attention_drop_ratio": 0.0})
    assert admin_profile(full, batch) == profiles[0]  # the same as the model whose cross-attention always runs


# ------------------------------------------------------------------------------------------------ item 5
def test_data_parallel_is_refused_with_a_launch_hint(tmp_path, monkeypatch):
    from transformers import Seq2SeqTrainingArguments

    from hf_deepnmt_training.trainer import DeepNMTTrainer

    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    monkeypatch.setattr(type(args), "n_gpu", property(lambda self: 2))
    with pytest.raises(ValueError, match=r"2 GPUs are visible to one process.*nn.DataParallel.*torchrun "
                                         r"--nproc_per_node 2"):
        DeepNMTTrainer(model=tiny_model(), args=args)


# ------------------------------------------------------------------------------------------------ item 6
@pytest.mark.parametrize("overrides, field, words", [
    (dict(decoder_layers=3, cross_attention_drop_depth=3, cross_attention_drop_ratio=1.0), "cross_attention_drop_depth",
     "no decoder layer would keep a cross-attention"),
    (dict(unk_token_id=1), "unk_token_id", "must differ from bos_token_id"),
    (dict(admin_init="closed_form"), "admin_init", "apply only with residual_scaling='admin'"),
    (dict(admin_omega_trainable=False), "admin_omega_trainable", "apply only with residual_scaling='admin'"),
    (dict(admin_profiled=True), "admin_profiled", "apply only with residual_scaling='admin'"),
    (dict(residual_scaling="admin", admin_init="closed_form", admin_profiled=True), "admin_profiled",
     "never profiled"),
    (dict(label_smoothing=1.0), "label_smoothing", "[0, 1)"),
])
def test_contradictory_settings_raise_one_sentence(overrides, field, words):
    with pytest.raises(ValueError) as error:
        tiny_config(**overrides)
    message = str(error.value)
    assert f"`{field}` = " in message and words in message and len(message.splitlines()) == 1


@pytest.mark.parametrize("overrides, words", [
    (dict(decoder_layers=3, cross_attention_drop_depth=3, cross_attention_drop_ratio=0.0), "has no effect with "
     "cross_attention_drop_ratio=0.0"),
    (dict(ddr_weight=0.7, dropout=0.0), "ddr_weight=0.7 has no effect"),
])
def test_settings_that_do_nothing_warn(overrides, words, caplog):
    with caplog.at_level(logging.WARNING):
        tiny_config(**overrides)
    assert any(words in record.getMessage() for record in caplog.records), caplog.text


def test_the_deep_decoder_default_drop_depth_follows_the_decoder_depth():
    assert DeepDecoderTransformerConfig().cross_attention_drop_depth == 12  # of 15
    assert DeepDecoderTransformerConfig(decoder_layers=6).cross_attention_drop_depth == 5
    assert DeepDecoderTransformerConfig(decoder_layers=27).cross_attention_drop_depth == 21  # li2022 Fig. 2's peak
    assert DeepDecoderTransformerConfig(decoder_layers=6, cross_attention_drop_depth=2).cross_attention_drop_depth == 2


# ------------------------------------------------------------------------------------------------ item 7
def test_deepnmt_train_smooths_labels_by_default(capsys):
    from hf_deepnmt_training.train_arguments import parse_train_args

    base = ["--train_file", "x.jsonl", "--output_dir", "runs/x"]
    assert parse_train_args(base)[2].label_smoothing_factor == 0.1
    assert parse_train_args(base + ["--label_smoothing_factor", "0.0"])[2].label_smoothing_factor == 0.0
    with pytest.raises(SystemExit):
        parse_train_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "deepnmt's default 0.1" in help_text


# ------------------------------------------------------------------------------------------------ item 9
def test_inputs_embeds_equal_input_ids_in_forward_and_generate(batch):
    model = tiny_model()
    embed = model.get_input_embeddings()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(batch["labels"])
    by_ids = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=decoder_input_ids).logits
    by_embeds = model(inputs_embeds=embed(batch["input_ids"]), attention_mask=batch["attention_mask"],
                      decoder_inputs_embeds=embed(decoder_input_ids)).logits
    torch.testing.assert_close(by_embeds, by_ids)
    kwargs = dict(attention_mask=batch["attention_mask"], max_new_tokens=6, num_beams=2, do_sample=False)
    torch.testing.assert_close(model.generate(inputs_embeds=embed(batch["input_ids"]), **kwargs),
                               model.generate(input_ids=batch["input_ids"], **kwargs))


# ------------------------------------------------------------------------------------------------ item 8
PACKAGES = ("hf_deepnmt", "training", "model_cards", "benchmarks")
# who may import whom (besides itself): the library nothing of ours, the benchmarks everything
ALLOWED = {"hf_deepnmt": set(), "training": {"hf_deepnmt", "model_cards"}, "model_cards": {"hf_deepnmt"},
           "benchmarks": {"hf_deepnmt", "training", "model_cards"}}


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (annotations only, never executed)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (child for orelse in node.orelse for child in [orelse, *_runtime_nodes(orelse)])
            continue
        yield node
        yield from _runtime_nodes(node)


def _import_graph(annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of our packages it imports when it runs, function-level imports included (and, with
    ``annotations``, those under ``if TYPE_CHECKING:`` too)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            edges = set()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in (ast.walk(tree) if annotations else _runtime_nodes(tree)):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:  # relative: resolve against this module's package
                        base = module.split(".")[: -node.level] if path.name != "__init__.py" else module.split(".")
                        if path.name == "__init__.py" and node.level > 1:
                            base = base[: 1 - node.level]
                        prefix = ".".join(base + ([node.module] if node.module else []))
                    else:
                        prefix = node.module or ""
                    names = [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
                for name in names:
                    while name and name not in graph and not (ROOT / (name.replace(".", "/") + ".py")).exists() \
                            and not (ROOT / name.replace(".", "/") / "__init__.py").exists():
                        name = name.rpartition(".")[0]
                    if name and name.split(".")[0] in PACKAGES and name != module:
                        edges.add(name)
            graph[module] = edges
    return graph


def test_imports_follow_the_layering_and_form_no_circle():
    """hf_deepnmt imports nothing of ours, training never imports benchmarks, and no module reaches itself through
    its imports (function-level ones included: a circle there is a circle too)."""
    graph = _import_graph()
    for module, targets in graph.items():
        for target in targets:
            home, there = module.split(".")[0], target.split(".")[0]
            assert there == home or there in ALLOWED[home], f"{module} imports {target}"

    def visit(module: str, trail: tuple[str, ...]) -> None:
        assert module not in trail, " -> ".join(trail + (module,))
        for target in graph.get(module, ()):
            if target.rpartition(".")[0] == module or module.rpartition(".")[0] == target:
                continue  # a package and its own submodules (e.g. __init__ re-exports)
            visit(target, trail + (module,))

    for module in graph:
        visit(module, ())


# `deepnmt train`'s stages in the order a run goes through them (docs/architecture.md, "deepnmt train, stage by
# stage"); `training.train` runs them and imports them all.
TRAIN_STAGES: tuple[tuple[str, frozenset[str]], ...] = tuple((name, frozenset(f"training.{module}" for module in modules))
                                                          for name, modules in (
    ("parse", ("arguments", "train_options")),
    ("resolve", ("recipes", "defaults", "train_arguments")),
    ("build", ("build", "schedules", "tokenizer", "preprocess")),
    ("train", ("trainer", "checkpoints")),
    ("report", ("report", "plots", "hub")),
    ("run", ("train",)),
))


def test_deepnmt_train_flows_one_way():
    """No module of a stage of `deepnmt train` imports a module of a later stage, annotation-only imports included,
    so the training modules form no circle even under ``TYPE_CHECKING`` (build <-> train_arguments and report <->
    train did)."""
    graph = _import_graph(annotations=True)
    stage_of = {module: index for index, (_, modules) in enumerate(TRAIN_STAGES) for module in modules}
    assert set(stage_of) <= set(graph)
    for module, index in stage_of.items():
        later = sorted(target for target in graph[module] if stage_of.get(target, -1) > index)
        assert not later, f"{module} ({TRAIN_STAGES[index][0]}) imports {later} of a later stage"

    def visit(module: str, trail: tuple[str, ...]) -> None:
        assert module not in trail, " -> ".join(trail + (module,))
        for target in graph.get(module, ()):
            if target.startswith("training.") and target.count(".") == 1:
                visit(target, trail + (module,))

    for module in graph:
        if module.startswith("training.") and module.count(".") == 1:
            visit(module, ())


def test_no_forward_argument_is_mistaken_for_labels_by_the_trainer():
    """transformers' Trainer treats every forward argument whose name contains "label" as a label; a second one
    would make it skip the evaluation loss."""
    from transformers.utils.generic import find_labels

    from hf_deepnmt import DeepTransformerForConditionalGeneration

    assert find_labels(DeepTransformerForConditionalGeneration) == ["labels"]
