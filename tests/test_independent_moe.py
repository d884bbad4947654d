"""diff on a mistral-inference style Mixtral port of transformers' MixtralForCausalLM (tests/independent_moe.py). The
original's experts are one fused module (3D parameters, a loop over the hit experts inside one call) behind a router;
the port holds a list of per-expert ``FeedForward`` modules, each called once per forward with the tokens routed to
it, routes by top-k logits then a softmax, flattens the batch (``[T, D]`` for ``[1, T, D]``) and rotates interleaved
pairs. A faithful port compares equal in every value mode, its extra per-expert calls left unmatched, not divergent;
each injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_moe
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_moe.hf_mixtral()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    a_inputs, b_inputs = independent_moe.inputs(independent_moe.token_ids())
    return port_traces(tmp_path_factory.mktemp("moe"), original, a_inputs, independent_moe.port_of, b_inputs)


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    a_inputs, (ids,) = independent_moe.inputs(independent_moe.token_ids())
    with torch.no_grad():
        reference = original(**a_inputs).logits[0]
        assert torch.allclose(independent_moe.port_of(original)(ids), reference, atol=1e-5)
        for bug in independent_moe.BUGS:
            moved = (independent_moe.port_of(original, bug)(ids) - reference).abs().max()
            assert moved.item() > 1e-5, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_with_per_expert_modules_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_moe.RULES if mapped else ())
    assert result.equal, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    for i in range(3):  # the batch-flattened port pairs call for call, its experts left over
        assert pairs[f"model.layers.{i}.mlp"] == f"layers.{i}.feed_forward", result.table()
        assert pairs[f"model.layers.{i}.mlp.gate"] == f"layers.{i}.feed_forward.gate", result.table()
        assert pairs[f"model.layers.{i}.self_attn.q_proj"] == f"layers.{i}.attention.wq", result.table()
    unmatched = [u.call.path.partition(".")[2] for u in result.only_in_b]
    assert unmatched and all(".feed_forward.experts." in path for path in unmatched), unmatched


def _expected(bug: str, values: str, expected: str) -> str:
    return independent_moe.STATS_EXPECTED.get(("moe", bug), expected) if values == "repr" else expected


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in independent_moe.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_moe.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == _expected(bug, values, expected), result.table()
