"""diff on a Llama port that keeps its activations sequence-first, [T, B, D] (tests/independent_seq_first.py),
against transformers' [B, T, D], with a batch of two: no activation has its original's shape, only the same
dimensions in another order. A faithful port compares equal in every value mode with every call paired; each
injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_llama, independent_seq_first
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_llama.hf_llama()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = independent_seq_first.token_ids()
    return port_traces(
        tmp_path_factory.mktemp("seq_first"), original, {"input_ids": ids}, independent_seq_first.port_of, (ids,)
    )


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = independent_seq_first.token_ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(independent_seq_first.port_of(original)(ids), reference, atol=1e-5)
        for bug in independent_seq_first.BUGS:
            moved = (independent_seq_first.port_of(original, bug)(ids) - reference).abs().max()
            assert moved.item() > 1e-4, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_sequence_first_port_compares_equal_call_by_call(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_seq_first.RULES if mapped else ())
    assert result.equal, result.table()
    assert not result.only_in_b, result.table()  # every call of the port paired, the embedding of [T, B] ids too
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert pairs["model.layers.1.self_attn.k_proj"] == "layers.1.attn.k", result.table()
    if values != "repr":
        notes = {d.equivalence for call in result.calls for d in call.outputs}
        assert "shapes [2, 8, 64] and [8, 2, 64]: the same dims in another order" in notes, notes


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in independent_seq_first.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_seq_first.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()
