"""diff on a llama.c style Phi-3 port of transformers' Phi3ForCausalLM (tests/independent_phi3.py). The original fuses
``qkv_proj`` (grouped-query: k and v half as wide as q) and ``gate_up_proj``; the port splits them into ``wq``, ``wk``,
``wv`` and ``w1``, ``w3``, rotates interleaved pairs of three quarters of each head's channels, and holds dropouts
the original lacks. A faithful port compares equal in every value mode; each injected bug is named in the port's
terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_phi3
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_phi3.hf_phi3()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = independent_phi3.token_ids()
    return port_traces(tmp_path_factory.mktemp("phi3"), original, {"input_ids": ids}, independent_phi3.port_of, (ids,))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = independent_phi3.token_ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(independent_phi3.port_of(original)(ids), reference, atol=1e-5)
        assert torch.allclose(independent_phi3.port_of(original, "up_first")(ids), reference, atol=1e-5)
        for bug in independent_phi3.BUGS:
            moved = (independent_phi3.port_of(original, bug)(ids) - reference).abs().max()
            assert moved.item() > 1e-5, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize("variant", [None, *independent_phi3.VARIANTS])
def test_a_faithful_port_of_fused_projections_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, variant: str | None
) -> None:
    a, b = captured(variant, values)
    result = graphtrace.compare(a, b, rules=independent_phi3.RULES if mapped else ())
    assert result.equal, result.table()
    fused = {call.b.path.rpartition(".")[2] for call in result.calls if call.how == "fused"}
    assert fused == {"wq", "wk", "wv", "w1", "w3"}, result.table()


def _expected(bug: str, values: str, expected: str) -> str:
    return independent_phi3.STATS_EXPECTED.get(("phi3", bug), expected) if values == "repr" else expected


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(
    ("bug", "expected"),
    [(bug, expected) for _, bug, _, expected in independent_phi3.CASES + independent_phi3.COMPOUND_CASES],
)
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_phi3.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == _expected(bug, values, expected), result.table()
