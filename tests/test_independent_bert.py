"""diff on a from-scratch BERT encoder port of transformers' BertModel (tests/independent_bert.py), whose modules
are cut differently: transformers' self-attention ends before the output projection, and its output modules hold the
residual and the post-norm, where the port's blocks hold them. A faithful port compares equal (the containers that
cut the model elsewhere are not paired); each injected bug is named in the port's own terms, also when the module
that holds it has no counterpart in the original.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_bert
from tests.independent_cases import BERT_CASES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_bert.hf_bert()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = independent_bert.token_ids()
    return port_traces(tmp_path_factory.mktemp("bert"), original, {"input_ids": ids}, independent_bert.port_of, (ids,))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = independent_bert.token_ids()
    with torch.no_grad():
        reference = original(input_ids=ids)
        hidden, pooled = independent_bert.port_of(original)(ids)
        assert torch.allclose(hidden, reference.last_hidden_state, atol=1e-5)
        assert torch.allclose(pooled, reference.pooler_output, atol=1e-5)
        for bug in independent_bert.BUGS:  # the attention scale moves the output by ~6e-6 only: the subtle case
            hidden, pooled = independent_bert.port_of(original, bug)(ids)
            moved = max(
                (hidden - reference.last_hidden_state).abs().max(), (pooled - reference.pooler_output).abs().max()
            )
            assert moved.item() > 1e-6, bug


@pytest.mark.parametrize("values", ["bundle", "repr"])
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_with_other_module_boundaries_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_bert.RULES if mapped else ())
    assert result.equal, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert "encoder.layer.0.attention.self" not in pairs  # ends before the projection the port's attention holds
    assert pairs["encoder.layer.0.attention.output.dense"] == "layers.0.attn.out"
    assert pairs["encoder.layer.0.attention.output.LayerNorm"] == "layers.0.ln1"


@pytest.mark.parametrize("values", ["bundle", "repr"])
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in BERT_CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_bert.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_op_records_do_not_pull_the_modules_pairing(original: torch.nn.Module, tmp_path: Path) -> None:
    """With op records, the port's residual add comes after its misplaced norm: ops pair by path or not at all, so
    their order cannot drag the norm onto the original's dropout and blame the norm for the block's code."""
    ids = independent_bert.token_ids()
    graphtrace.capture(original, {"input_ids": ids}, path=tmp_path / "a", values="repr", ops=True)
    port = independent_bert.port_of(original, "norm_before_residual")
    graphtrace.capture(port, (ids,), path=tmp_path / "b", values="repr", ops=True)
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    first = result.first_divergence
    assert first is not None and first.b.path == "Encoder.layers.1", result.table()


def test_a_culprit_without_counterpart_is_marked_at_the_first_call_it_spoils(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    a, b = captured("tanh_gelu", "repr")
    table = graphtrace.compare(a, b).table()
    marked = [line for line in table.splitlines() if "◀ first divergence" in line]
    assert len(marked) == 1 and "layers.0.mlp.down" in marked[0], table
    assert "first divergence: encoder.layer.0 ↔ layers.0.mlp (FeedForward)" in table, table
