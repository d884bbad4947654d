"""diff on a flat, from-scratch T5 port of transformers' T5ForConditionalGeneration (tests/independent_t5.py). The
original computes its relative position bias in the first block's attention and wraps every sub-layer; the port
computes the bias once in each stack, calls its embedding from the model's own code, fuses self-attention's qkv and
cross-attention's kv, and has no dropouts. A faithful port compares equal in every value mode; each injected bug is
named in the port's terms, the encoder's with the encoder's and the decoder's with the decoder's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_t5
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_t5.hf_t5()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids, target = independent_t5.inputs()
    hf_inputs = independent_t5.hf_inputs(ids, target)
    return port_traces(tmp_path_factory.mktemp("t5"), original, hf_inputs, independent_t5.port_of, (ids, target))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids, target = independent_t5.inputs()
    with torch.no_grad():
        reference = original(**independent_t5.hf_inputs(ids, target)).logits
        assert torch.allclose(independent_t5.port_of(original)(ids, target), reference, atol=1e-5)
        for bug in independent_t5.BUGS:
            moved = (independent_t5.port_of(original, bug)(ids, target) - reference).abs().max()
            assert moved.item() > 1e-3, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_compares_equal_stack_by_stack(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_t5.RULES if mapped else ())
    assert result.equal, result.table()
    stacks = {"encoder", "decoder"}
    for call in result.calls:  # same make-up in both stacks: never a call of the encoder with one of the decoder
        stack_a = stacks & set(call.a.path.split("."))
        stack_b = stacks & set(call.b.path.split("."))
        assert not (stack_a and stack_b) or stack_a == stack_b, (call.a.path, call.b.path)
    paired = {call.b.path.partition(".")[2]: call.a.path.partition(".")[2] for call in result.calls}
    # the bias each stack computes once pairs with the one transformers computes in the first block's attention
    assert paired["encoder.rel_bias"] == "encoder.block.0.layer.0.SelfAttention.relative_attention_bias"
    assert paired["decoder.rel_bias"] == "decoder.block.0.layer.0.SelfAttention.relative_attention_bias"
    # and the first blocks, which hold the lookup in one model and not in the other, still pair: a block given the
    # bias computes the same quantity as one that looked it up
    assert paired["encoder.blocks.0"] == "encoder.block.0" and paired["decoder.blocks.0"] == "decoder.block.0"
    assert paired["decoder.blocks.0.attn"] == "decoder.block.0.layer.0.SelfAttention"
    fused = {call.b.path.partition(".")[2] for call in result.calls if call.how == "fused"}
    assert "decoder.blocks.1.cross.kv" in fused and "encoder.blocks.0.attn.qkv" in fused, fused


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in independent_t5.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_t5.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    if values == "repr":
        expected = independent_t5.STATS_EXPECTED.get(("t5", bug), expected)
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_buckets_computed_in_the_stack_are_blamed_on_it_even_by_statistics(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    """The integer buckets are the bias lookup's input: compared exactly from their value fingerprint, they show
    the departure lies in the encoder's own code, before the lookup, not in the lookup's weights."""
    a, b = captured("causal_bucket_encoder", "repr")
    table = graphtrace.compare(a, b, rules=independent_t5.RULES).table()
    assert "first divergence: encoder (T5Stack): the departure lies in its own code" in table, table
    assert "before encoder.block.0.layer.0.SelfAttention.relative_attention_bias ↔ encoder.rel_bias" in table, table
    assert "the value fingerprint of integers" in table, table
