"""torch.compile (inductor, CPU) works on every model family: ``fullgraph=True`` (a graph break is an error) for a
training step (forward with labels + backward) and for a decoding step (one new token on a cache), each giving the
eager results; Seq2SeqTrainer's ``torch_compile=True`` and `deepnmt train --torch_compile`. Speed is measured by the
benchmarks (benchmarks/RESULTS.md), never asserted here.

The Transformer cases switch several papers on at once (the switches compose, docs/transformer.md), so that three
tiny models cover every code path a switch adds: post-LN, pre-LN, liu2020 ADMIN, li2022 cross-attention drop (drawn
per forward, and p_net = 1 layers without cross-attention) with DDR and ALD, dou2018 dense / linear / iterative /
hierarchical aggregation, multi-layer attention and layer diversity; the plain post-LN Transformer is the
Seq2SeqTrainer test's. Compiling is slow on 2 CPU cores (10-30 s per training graph), hence so few models."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import dtmt_config, dtmt_model, tiny_model, train_argv
from torch._dynamo.utils import counters
from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer, Seq2SeqTrainingArguments
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from hf_deepnmt.errors import UserInputError

TRANSFORMER_CASES = {
    "post-ln+dou2018-linear-iterative-diversity": dict(
        encoder_layer_aggregation="linear", decoder_layer_aggregation="iterative", aggregation_activation="relu",
        diversity_weight=1.0),
    "pre-ln+dou2018-dense-hierarchical-mla+li2022-without-cross-attention": dict(
        layer_norm_position="pre", encoder_layers=3, decoder_layers=3, encoder_layer_aggregation="dense",
        decoder_layer_aggregation="hierarchical", multi_layer_attention_k=2, diversity_weight=1.0,
        cross_attention_drop_depth=1, cross_attention_drop_ratio=1.0),  # p_net = 1: the bottom layer has none
    "liu2020-admin+li2022-cad-ddr-ald": dict(
        residual_scaling="admin", admin_init="closed_form", encoder_layers=1, decoder_layers=2,
        cross_attention_drop_depth=1, cross_attention_drop_ratio=0.5, ddr_weight=1.0, ald_weight=0.5),
}


def transformer(name: str, **overrides) -> torch.nn.Module:
    model = tiny_model(**{**TRANSFORMER_CASES[name], **overrides})
    with torch.no_grad():  # linear aggregation starts as the vanilla stack (W = I for the newest layer): perturb it
        for parameter_name, parameter in model.named_parameters():
            if "layer_inputs" in parameter_name or "output_combination" in parameter_name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    return model


@pytest.fixture
def eager_random_numbers():
    """Compiled graphs draw the eager random numbers (inductor's ``fallback_random``), so that a training step with
    dropout, li2022's drop-net and ALD draws can be compared with the eager one number for number."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()
    with inductor_config.patch(fallback_random=True):
        yield
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------ Transformer
@pytest.mark.integration
@pytest.mark.parametrize("name", TRANSFORMER_CASES)
def test_compiled_transformer_training_step_matches_eager(name, batch, eager_random_numbers, monkeypatch):
    """Forward with labels in training mode (the full objective of the config, with transformers' Trainer's
    ``num_items_in_batch``) and backward compile as one graph, and give the eager loss and gradients.

    A compiled forward keeps the padded layout (docs/transformer.md, "Padding in training"), so the eager reference
    does too here: dropout then draws its numbers for the same positions in both, number for number. (That the
    packed eager forward equals the padded one is tests/test_fast_paths.py's.)"""
    from hf_deepnmt import modeling_deep_transformer

    monkeypatch.setattr(modeling_deep_transformer, "real_positions", lambda keep, training: None)
    eager = transformer(name).train()  # residual dropout 0.1
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)  # fullgraph: a graph break is an error
    losses = []
    for model in (eager, compiled):
        torch.manual_seed(7)  # the same dropout, drop-net and ALD draws
        loss = model(**batch, num_items_in_batch=torch.tensor(7)).loss
        loss.backward()
        losses.append(loss.detach())
    assert torch.isfinite(losses[0])
    assert torch.allclose(losses[1], losses[0], atol=1e-5), losses
    for (parameter_name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        if p.grad is None:  # compiled, li2022's dropped cross-attention is multiplied by 0 instead of skipped
            assert q.grad is None or not q.grad.any(), parameter_name
            continue
        assert q.grad is not None, parameter_name
        assert torch.allclose(q.grad, p.grad, atol=1e-5), parameter_name


def decoding_step_logits(model: torch.nn.Module, step: torch.nn.Module, batch: dict[str, torch.Tensor],
                         tokens: torch.Tensor) -> torch.Tensor:
    """The logits of ``step`` (the model or its compiled wrapper) for ``tokens`` ``(B, 1)``, after a first step of
    ``model`` filled the cache as `generate` builds it (the cross-attention memory and one self-attention entry)."""
    encoder_outputs = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    start = torch.full_like(tokens, model.config.decoder_start_token_id)
    cache = model(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], decoder_input_ids=start,
                  cache=cache, use_cache=True).cache
    return step(encoder_outputs=encoder_outputs, attention_mask=batch["attention_mask"], decoder_input_ids=tokens,
                cache=cache, use_cache=True).logits  # (B, 1, V)


@pytest.mark.integration
@pytest.mark.parametrize("name", TRANSFORMER_CASES)
def test_compiled_transformer_decoding_step_matches_eager(name, batch):
    """One incremental decoding step (evaluation mode, a cache from a previous call) compiles as one graph and gives
    the eager next-token logits."""
    torch._dynamo.reset()
    model = transformer(name).eval()
    tokens = torch.tensor([[7], [8]])
    with torch.no_grad():
        eager = decoding_step_logits(model, model, batch, tokens)
        compiled = decoding_step_logits(model, torch.compile(model, fullgraph=True), batch, tokens)
    assert torch.allclose(compiled, eager, atol=1e-5)


# ------------------------------------------------------------------------------------------------ DTMT
# DTMT's cases (its recurrence compiled per time step, `DTMTPreTrainedModel.compile_recurrence`) go here.


# ------------------------------------------------------------------------------------------------ trainers
@pytest.mark.integration
def test_seq2seq_trainer_with_torch_compile_runs(batch, tmp_path):
    """The plain post-LN Transformer under transformers' own ``torch_compile=True`` (inductor, no fullgraph): two
    steps, one graph, no graph break."""
    torch._dynamo.reset()
    counters.clear()
    rows = [{key: value[i] for key, value in batch.items()} for i in range(batch["input_ids"].size(0))]
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), torch_compile=True, max_steps=2,
                                    per_device_train_batch_size=2, report_to="none", use_cpu=True,
                                    save_strategy="no", disable_tqdm=True)
    result = Seq2SeqTrainer(model=tiny_model().train(), args=args, train_dataset=rows).train()
    assert result.global_step == 2
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1


# ------------------------------------------------------------------------------------------------ deepnmt train
def compile_args(tmp_path, **overrides) -> Seq2SeqTrainingArguments:
    return Seq2SeqTrainingArguments(**{**dict(output_dir=str(tmp_path), torch_compile=True, use_cpu=True,
                                              report_to="none", save_strategy="no", disable_tqdm=True),
                                       **overrides})


def test_deepnmt_train_documents_and_parses_torch_compile(capsys):
    from hf_deepnmt_training.train_arguments import parse_train_args

    base = ["--train_file", "x.jsonl", "--output_dir", "runs/x"]
    assert parse_train_args(base + ["--torch_compile", "true"])[2].torch_compile is True
    assert parse_train_args(base)[2].torch_compile is False
    with pytest.raises(SystemExit):
        parse_train_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "A Transformer is compiled whole by the Trainer" in help_text
    assert "a DTMT model compiles each timestep of its recurrence instead (compile_recurrence" in help_text


def test_torch_compile_of_a_transformer_is_the_trainers_and_new_batch_shapes_reuse_its_graph(tmp_path, tiny_tokenizer):
    """`deepnmt train --torch_compile` on a Transformer: the Trainer compiles the whole model, and token-budget batches
    of other lengths and sizes run on the first graph (dynamo's own ``eager`` backend: the graphs are what is
    counted here, inductor's code is the tests above)."""
    from datasets import Dataset

    from hf_deepnmt_training.build import prepare_torch_compile
    from hf_deepnmt_training.trainer import DeepNMTTrainer

    generator = torch.Generator().manual_seed(0)
    rows = []
    for length in [4, 5, 6, 7, 9, 11, 13, 16, 19, 23] * 2:  # sources of 4-23 tokens, targets one shorter
        ids = torch.randint(4, 99, (length,), generator=generator).tolist()
        rows.append({"input_ids": ids, "attention_mask": [1] * length, "labels": ids[1:], "length": length})
    model = tiny_model(vocab_size=len(tiny_tokenizer)).train()
    args = compile_args(tmp_path, torch_compile_backend="eager", max_steps=5, learning_rate=1e-3,
                        dataloader_num_workers=0)
    assert "the Trainer compiles the whole model (eager)" in prepare_torch_compile(model, args)
    assert args.torch_compile
    collator = DataCollatorForSeq2Seq(tiny_tokenizer, model=model, label_pad_token_id=-100)
    shapes = []

    def recording_collator(features):
        collated = collator(features)
        shapes.append((tuple(collated["input_ids"].shape), tuple(collated["labels"].shape)))
        return collated

    torch._dynamo.reset()
    counters.clear()
    trainer = DeepNMTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             data_collator=recording_collator, processing_class=tiny_tokenizer, max_tokens=48)
    trainer.train()
    torch._dynamo.reset()
    assert len({batch for batch, _ in shapes}) >= 3 and len({size for (size, _), _ in shapes}) >= 2, shapes
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1, shapes


@pytest.mark.integration
def test_deepnmt_train_torch_compile_trains_the_compiled_model(small_corpus, tmp_path, capsys):
    """The flag through the whole command: the Trainer trains the compiled model, one graph, no graph break
    (dynamo's ``eager`` backend, so that no code is generated)."""
    from torch._dynamo.eval_frame import OptimizedModule

    from hf_deepnmt_training.train import train

    torch._dynamo.reset()
    counters.clear()
    outcome = train(train_argv(small_corpus, tmp_path / "run", "--max_steps", "2", "--torch_compile", "true",
                               "--torch_compile_backend", "eager", "--max_predict_samples", "4"))
    torch._dynamo.reset()
    assert isinstance(outcome.trainer.model_wrapped, OptimizedModule)
    assert "[deepnmt] --torch_compile: the Trainer compiles the whole model (eager)" in capsys.readouterr().err
    assert counters["stats"]["unique_graphs"] >= 1 and not counters["graph_break"], dict(counters["graph_break"])


def test_torch_compile_of_a_dtmt_model_compiles_its_recurrence_not_the_whole_model(tmp_path):
    """DTMT: `compile_recurrence` with ``--torch_compile_mode``, and nothing for the Trainer to compile (the compiled
    recurrence itself is checked by tests/test_compile_dtmt.py)."""
    from accelerate.utils import DynamoBackend

    from hf_deepnmt import modeling_dtmt
    from hf_deepnmt_training.build import prepare_torch_compile
    from hf_deepnmt_training.trainer import DeepNMTTrainer

    model = dtmt_model().train()
    args = compile_args(tmp_path, torch_compile_mode="max-autotune-no-cudagraphs")
    assert "DTMT's recurrence is compiled per timestep" in prepare_torch_compile(model, args)
    stacks = [module for module in model.modules() if isinstance(module, modeling_dtmt._DTMTStack)]
    assert len(stacks) == 2  # encoder and decoder
    assert all(stack.compiled_recurrence and stack.compile_mode == "max-autotune-no-cudagraphs" for stack in stacks)
    assert (args.torch_compile, args.torch_compile_backend, args.torch_compile_mode) == (False, None, None)
    trainer = DeepNMTTrainer(model=model, args=args, train_dataset=[{"input_ids": [5, 2], "labels": [6, 2]}])
    assert trainer.accelerator.state.dynamo_plugin.backend == DynamoBackend.NO


def test_torch_compile_options_that_cannot_work_are_refused_before_anything_is_written(small_corpus, tmp_path):
    from hf_deepnmt_training.train import train

    with pytest.raises(UserInputError, match="`--torch_compile_mode` = 'fastest' is not allowed"):
        train(train_argv(small_corpus, tmp_path / "run", "--torch_compile_mode", "fastest"))
    with pytest.raises(UserInputError, match="`--torch_compile_backend` = 'aot_eager' is not allowed for a DTMT"):
        train(["--recipe", "meng2019-bible-dtmt4", "--train_file", str(small_corpus / "train.jsonl"),
               "--validation_file", str(small_corpus / "valid.jsonl"), "--output_dir", str(tmp_path / "run"),
               "--torch_compile_backend", "aot_eager"])
    assert not (tmp_path / "run").exists()


def test_torch_compile_refuses_what_cannot_work_for_dtmt(tmp_path):
    from hf_deepnmt_training.build import prepare_torch_compile

    for model in (tiny_model(), dtmt_model()):  # a mode torch.compile does not know: one sentence, for each family
        with pytest.raises(UserInputError, match="`--torch_compile_mode` = 'fastest' is not allowed; use one of"):
            prepare_torch_compile(model, compile_args(tmp_path, torch_compile_mode="fastest"))

    with pytest.raises(UserInputError, match="`--torch_compile_backend` = 'aot_eager' is not allowed for a DTMT "
                                             "model"):
        prepare_torch_compile(dtmt_model(), compile_args(tmp_path, torch_compile_backend="aot_eager"))

    class SavedByAnOlderRelease(torch.nn.Module):  # a DTMT model whose code has no compile_recurrence
        config = dtmt_config()

    with pytest.raises(UserInputError, match="has no `compile_recurrence`"):
        prepare_torch_compile(SavedByAnOlderRelease(), compile_args(tmp_path))
