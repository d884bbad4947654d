"""diff on a lit-gpt style Pythia port of transformers' GPTNeoXForCausalLM (tests/independent_neox.py). The original
lays its fused ``query_key_value`` out per head (``[q0 k0 v0 q1 k1 v1 ...]``); the port has separate q, k and v,
rotates interleaved pairs of the first quarter of each head's channels, and holds dropouts the original lacks. A
faithful port compares equal in every value mode; each injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_neox
from tests.independent_cases import COMPOUND_CASES, MODES, NEOX_CASES, STATS_EXPECTED
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_neox.hf_neox()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = independent_neox.token_ids()
    return port_traces(tmp_path_factory.mktemp("neox"), original, {"input_ids": ids}, independent_neox.port_of, (ids,))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = independent_neox.token_ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(independent_neox.port_of(original)(ids), reference, atol=1e-5)
        for bug in independent_neox.BUGS:  # the final eps moves the logits by ~2e-6 only, within tolerance
            moved = (independent_neox.port_of(original, bug)(ids) - reference).abs().max()
            assert moved.item() > 1e-6, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_of_a_per_head_fused_projection_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_neox.RULES if mapped else ())
    assert result.equal, result.table()
    fused = {call.b.path.rpartition(".")[2] for call in result.calls if call.how == "fused"}
    assert fused == {"q", "k", "v"}, result.table()
    if values != "repr":  # each part against its own columns: every head's chunk, not a third of the output
        notes = {d.equivalence for call in result.calls if call.how == "fused" for d in call.outputs}
        assert any("per-head slice [..., 16:32 of each of 4 head groups]" in note for note in notes), notes


def _expected(bug: str, values: str, expected: str) -> str:
    return STATS_EXPECTED.get(("neox", bug), expected) if values == "repr" else expected


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(
    ("bug", "expected"),
    [(bug, expected) for _, bug, _, expected in NEOX_CASES]
    + [(bug, expected) for arch, bug, _, expected in COMPOUND_CASES if arch == "neox"],
)
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_neox.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == _expected(bug, values, expected), result.table()


def test_statistics_name_the_caller_of_fused_parts_they_cannot_tell_apart(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    a, b = captured("q_without_bias", "repr")
    table = graphtrace.compare(a, b).table()
    assert "first divergence: gpt_neox.layers.1.attention.query_key_value ↔ transformer.h.1.attn" in table, table
    assert "statistics cannot tell which of them departs" in table, table
    marked = [line for line in table.splitlines() if "◀ first divergence" in line]
    assert len(marked) == 1 and "transformer.h.1.attn.q" in marked[0], table


def test_fused_parts_after_a_divergence_still_pair_with_the_fused_call(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    """Block 1 departs; block 2's q, k and v read a hidden state that differs from the original's, but they read
    the output of the norm paired with the one the fused projection reads."""
    a, b = captured("q_without_bias", "repr")
    result = graphtrace.compare(a, b)
    fused = {call.b.path.partition(".")[2] for call in result.calls if call.how == "fused"}
    assert {"transformer.h.2.attn.q", "transformer.h.2.attn.k", "transformer.h.2.attn.v"} <= fused, result.table()
    assert not [u.call.path for u in result.only_in_b if ".h.2.attn" in u.call.path and "drop" not in u.call.path]


@pytest.mark.parametrize("values", ["bundle", "repr"])
def test_a_port_running_the_parallel_mlp_branch_first_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str
) -> None:
    """The parallel residual lets a port run its MLP before its attention: inside blocks whose outputs agree, the
    sublayers pair by what they compute, not by when they run."""
    a, b = captured("mlp_first", values)
    result = graphtrace.compare(a, b)
    assert result.equal, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert pairs["gpt_neox.layers.1.attention"] == "transformer.h.1.attn"
    assert pairs["gpt_neox.layers.1.input_layernorm"] == "transformer.h.1.norm_1"
    assert pairs["gpt_neox.layers.1.mlp"] == "transformer.h.1.mlp"


def test_in_bfloat16_a_faithful_port_compares_equal_by_values_and_a_bug_is_still_named(tmp_path: Path) -> None:
    """In bfloat16, an attention output near zero is off by a unit of rounding of the values it was summed from
    (7.8e-3 at magnitude 1), far beyond torch.testing's atol of 1e-5 for that element."""
    original = independent_neox.hf_neox()
    ids = independent_neox.token_ids()
    ports = {bug: independent_neox.port_of(original, bug) for bug in (None, "q_without_bias")}
    graphtrace.capture(original.to(torch.bfloat16), {"input_ids": ids}, path=tmp_path / "a", values="bundle")
    named = {}
    for bug, port in ports.items():
        port = port.to(torch.bfloat16)
        port.angles = port.angles.float()  # its rotary angles stay in float32, as transformers' do
        graphtrace.capture(port, (ids,), path=tmp_path / str(bug), values="bundle")
        result = graphtrace.compare(tmp_path / "a", tmp_path / str(bug))
        first = result.first_divergence
        named[bug] = "equal" if result.equal else first.b.path.partition(".")[2] if first else "?"
    assert named == {None: "equal", "q_without_bias": "transformer.h.1.attn.q"}
