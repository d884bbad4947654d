"""diff on a Llama port with as few modules as it can have (tests/independent_lean_llama.py): norms, embedding and
output projection are functions of block and model parameters, q/k/v and gate/up are fused, each attention has its
own rotary module. A faithful port compares equal in every value mode; each injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_lean_llama, independent_llama
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_llama.hf_llama()


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = _ids()
    return port_traces(
        tmp_path_factory.mktemp("lean"), original, {"input_ids": ids}, independent_lean_llama.port_of, (ids,)
    )


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = _ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(independent_lean_llama.port_of(original)(ids), reference, atol=1e-5)
        for bug in independent_lean_llama.BUGS:
            moved = (independent_lean_llama.port_of(original, bug)(ids) - reference).abs().max()
            assert moved.item() > 1e-4, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_with_few_modules_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_lean_llama.RULES if mapped else ())
    assert result.equal, result.table()
    fused = {call.b.path.rpartition(".")[2] for call in result.calls if call.how == "fused"}
    assert fused == {"c_attn", "gate_up"}, result.table()  # gate_up pairs with gate_proj and up_proj around act_fn


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in independent_lean_llama.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_lean_llama.RULES if mapped else ())
    if values == "repr":
        expected = independent_lean_llama.STATS_EXPECTED.get(("llama-lean", bug), expected)
    assert not result.equal, result.table()
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_a_fused_layout_unlike_the_other_blocks_is_blamed_on_the_fused_call(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    """Block 2's gate_up holds [up, gate]: a layout the values alone would accept (a port may order its parts
    either way), but blocks 0 and 1 show [gate, up], so block 2's gate part is compared with the columns its
    code treats as the gate, and departs."""
    a, b = captured("gate_up_swapped", "bundle")
    result = graphtrace.compare(a, b)
    by_pair = {(call.a.path.partition(".")[2], call.b.path.partition(".")[2]): call for call in result.calls}
    gate = by_pair[("model.layers.2.mlp.gate_proj", "blocks.2.mlp.gate_up")]
    assert gate.status == "diverged" and "[..., 0:128]" in gate.outputs[0].equivalence, result.table()
    assert by_pair[("model.layers.1.mlp.gate_proj", "blocks.1.mlp.gate_up")].status == "equal", result.table()
