"""Several forward calls: generate() traced step by step, prefill and decoding told apart, caches recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.model import CallNode, StepInfo, TensorRecord
from tests import zoo
from tests.conftest import assert_same_trace_files, run_ours, run_reference

NEW_TOKENS = 3


def _generate(model: nn.Module, ids: torch.Tensor):  # type: ignore[no-untyped-def]
    return model.generate(
        ids, max_new_tokens=NEW_TOKENS, do_sample=False, return_dict_in_generate=True, output_logits=True
    )


def test_generate_gives_one_step_per_forward_and_tells_prefill_from_decode(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model, inputs = zoo.llama()
    ids = inputs["input_ids"]
    plain = _generate(model, ids)
    with graphtrace.tracing(model, path=tmp_path, values="safetensors") as session:
        traced = _generate(model, ids)
    trace = session.trace
    assert trace is not None
    # generation is unchanged, token for token and logit for logit
    assert torch.equal(traced.sequences, plain.sequences)
    assert all(torch.equal(a, b) for a, b in zip(traced.logits, plain.logits, strict=True))

    assert len(trace.steps) == len(trace.step_info) == NEW_TOKENS
    assert [info.phase for info in trace.step_info] == ["prefill", "decode", "decode"]
    assert [info.cached_tokens for info in trace.step_info] == [0, 7, 8]
    assert [info.new_tokens for info in trace.step_info] == [7, 1, 1]
    for step, logits in zip(trace.steps, plain.logits, strict=True):  # step i is forward call i of generate()
        recorded = step.outputs["logits"]  # type: ignore[index]
        assert isinstance(recorded, TensorRecord) and recorded.stats is not None
        assert recorded.stats.mean == pytest.approx(logits.mean().item(), rel=1e-5)

    # the cache after the prefill holds the prompt's keys and values: the first 7 positions of the cache generate()
    # returns, with their statistics; after a decoding step the cache is recorded by shape only
    prefilled, last = trace.step_info[0].cache, trace.step_info[-1].cache
    assert isinstance(prefilled, dict) and prefilled["type"] == "DynamicCache"
    layers = prefilled["layers"]
    assert isinstance(layers, tuple) and len(layers) == zoo.LAYERS
    for i, (recorded_layer, real_layer) in enumerate(zip(layers, traced.past_key_values.layers, strict=True)):
        assert recorded_layer["type"] == "DynamicLayer"  # type: ignore[index]
        for name, real in (("keys", real_layer.keys), ("values", real_layer.values)):
            record = recorded_layer[name]  # type: ignore[index]
            assert isinstance(record, TensorRecord) and record.shape == (1, 2, 7, 8)
            assert record.stats is not None and record.value is None and record.file is None
            assert record.stats.mean == pytest.approx(real[:, :, :7].mean().item(), rel=1e-5)
            assert record.stats.max == real[:, :, :7].max().item()
        after = last["layers"][i]["keys"]  # type: ignore[index]
        assert after.shape == (1, 2, 7 + NEW_TOKENS - 1, 8) and after.stats is None

    # each step's files in its own folder; the decoding step's input is the one new token
    for i in range(NEW_TOKENS):
        assert (tmp_path / f"step_{i}" / "LlamaForCausalLM_debug_tree_SUMMARY.json").is_file()
    fed = load_file(str(tmp_path / "step_1" / "LlamaForCausalLM_inputs_kwargs_input_ids.safetensors"))["data"]
    assert fed.tolist() == [[plain.sequences[0, ids.shape[1]].item()]]

    loaded = graphtrace.load(str(tmp_path))
    assert loaded.step_info == trace.step_info


def test_encoder_decoder_generate_records_the_encoder_as_a_step() -> None:
    model, inputs = zoo.t5()
    ids = inputs["input_ids"]
    plain = _generate(model, ids)
    with graphtrace.tracing(model) as session:
        traced = _generate(model, ids)
    assert torch.equal(traced.sequences, plain.sequences)
    trace = session.trace
    assert trace is not None
    assert [step.path for step in trace.steps] == ["T5ForConditionalGeneration.encoder"] + [
        "T5ForConditionalGeneration"
    ] * NEW_TOKENS
    assert [info.phase for info in trace.step_info] == ["forward", "prefill", "decode", "decode"]
    encoder = trace.steps[0]
    assert encoder.type_name == "T5Stack" and encoder.children and isinstance(encoder.outputs, dict)
    cache = trace.step_info[1].cache
    assert isinstance(cache, dict) and cache["type"] == "EncoderDecoderCache"
    cross = cache["cross_attention_cache"]["layers"][0]["keys"]  # type: ignore[index]
    own = cache["self_attention_cache"]["layers"][0]["keys"]  # type: ignore[index]
    assert cross.shape[2] == ids.shape[1] and own.shape[2] == 1  # cross-attention keys span the encoded input


def test_a_submodule_called_on_its_own_is_a_step() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    with graphtrace.tracing(model) as session:
        model(torch.ones(1, 3))
        model[0](torch.ones(2, 3))
    trace = session.trace
    assert trace is not None
    assert [step.id for step in trace.steps] == ["Sequential@0", "Sequential.0@0"]
    assert trace.steps[1].outputs.shape == (2, 3)  # type: ignore[union-attr]
    assert trace.step_info == (StepInfo(), StepInfo())


def test_a_recorder_that_does_not_keep_steps_hands_each_one_over() -> None:
    from graphtrace.engine import PatchLedger, Recorder
    from graphtrace.engine.eager import attach_eager

    model = nn.Sequential(nn.Linear(3, 3))
    handed: list[tuple[int, ...]] = []

    def hand_over(step: CallNode) -> None:
        handed.append(step.args[0].shape)  # type: ignore[union-attr]

    recorder = Recorder(on_step=hand_over, keep_steps=False)
    ledger = PatchLedger()
    attach_eager(model, recorder, ledger, root_no_grad=False)
    try:
        model(torch.ones(1, 3))
        model(torch.ones(2, 3))
    finally:
        ledger.restore()
    assert handed == [(1, 3), (2, 3)] and recorder.steps == []  # the shim writes each step and keeps none


def test_a_single_forward_with_a_filled_cache_is_a_decoding_step() -> None:
    from transformers import DynamicCache

    model, inputs = zoo.llama()
    ids = inputs["input_ids"]
    cache = DynamicCache(config=model.config)
    first = graphtrace.capture(model, {"input_ids": ids, "past_key_values": cache})
    second = graphtrace.capture(model, {"input_ids": ids[:, :2], "past_key_values": cache})
    without = graphtrace.capture(model, {"input_ids": ids, "use_cache": False})
    assert (first.step_info[0].phase, first.step_info[0].cached_tokens, first.step_info[0].new_tokens) == (
        "prefill",
        0,
        7,
    )
    assert (second.step_info[0].phase, second.step_info[0].cached_tokens, second.step_info[0].new_tokens) == (
        "decode",
        7,
        2,
    )
    assert without.step_info == (StepInfo(),) and without.step_info[0].phase == "forward"


def test_show_tells_prefill_and_decoding_steps_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graphtrace.cli import main

    model, inputs = zoo.llama()
    with graphtrace.tracing(model, path=tmp_path):
        model.generate(inputs["input_ids"], max_new_tokens=NEW_TOKENS, do_sample=False)
    assert main(["show", str(tmp_path), "--depth", "0"]) == 0
    shown = capsys.readouterr().out
    lines = [line for line in shown.splitlines() if line.startswith("step ")]
    assert lines == [
        "step 0: prefill, 7 tokens into an empty cache; DynamicCache after: 6 x [1, 2, 7, 8] float32",
        "step 1: decode, 1 token after 7 cached; DynamicCache after: 6 x [1, 2, 8, 8] float32",
        "step 2: decode, 1 token after 8 cached; DynamicCache after: 6 x [1, 2, 9, 8] float32",
    ]
    own = json.loads((tmp_path / "LlamaForCausalLM_graphtrace.json").read_text())
    assert [info["phase"] for info in own["step_info"]] == ["prefill", "decode", "decode"]


@pytest.mark.parametrize("use_repr", [True, False], ids=["repr", "safetensors"])
def test_shim_keeps_the_last_forward_of_generate_like_transformers(tmp_path: Path, use_repr: bool) -> None:
    model, inputs = zoo.llama()

    def call() -> None:
        model.generate(inputs["input_ids"], max_new_tokens=NEW_TOKENS, do_sample=False)

    options = {"use_repr": use_repr, "do_prune_layers": False}
    ours = run_ours(model, call, tmp_path / "ours", **options)
    reference = run_reference(model, call, tmp_path / "reference", **options)
    assert_same_trace_files(reference, ours)
    summary = json.loads((ours / "LlamaForCausalLM_debug_tree_SUMMARY.json").read_text())
    assert summary["inputs"]["kwargs"]["input_ids"]["shape"] == "torch.Size([1, 1])"  # the last decoding step
    cache_repr = "DynamicCache(layers=[DynamicLayer, DynamicLayer, DynamicLayer])"
    assert summary["inputs"]["kwargs"]["past_key_values"] == cache_repr
    assert not list(ours.glob("step_*"))


def test_cli_capture_traces_generate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from graphtrace.cli import main

    factory = tmp_path / "factory.py"
    factory.write_text(
        "import torch\n"
        "from tests import zoo\n"
        "def build():\n"
        "    return zoo.llama()\n"
        "def plain():\n"
        "    return torch.nn.Linear(2, 2), torch.ones(1, 2)\n"
    )
    out = tmp_path / "out"
    assert main(["capture", f"{factory}:build", "-o", str(out), "--generate", "3", "--values", "none"]) == 0
    printed = capsys.readouterr().out
    assert "traced LlamaForCausalLM (3 forward calls" in printed and "step_0/ ... step_2/" in printed
    assert [info.phase for info in graphtrace.load(str(out)).step_info] == ["prefill", "decode", "decode"]
    assert main(["capture", f"{factory}:plain", "-o", str(tmp_path / "out2"), "--generate", "3"]) == 2
    assert "--generate needs a model with a generate() method" in capsys.readouterr().err
