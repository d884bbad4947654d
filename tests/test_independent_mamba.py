"""diff on a mamba-minimal style Mamba port of transformers' MambaForCausalLM (tests/independent_mamba.py). The
port's mixer is a class named ``MambaBlock``, the name of transformers' layer; it calls ``conv1d`` and ``dt_proj``,
which transformers' mixer only reads the weights of, and scans in its own code. A faithful port compares equal in
every value mode, with and without rename rules; each injected bug is named where it lives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from graphtrace.compare import Comparison
from tests import independent_mamba
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_mamba.hf_mamba()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    ids = independent_mamba.token_ids()
    port_of = independent_mamba.port_of
    return port_traces(tmp_path_factory.mktemp("mamba"), original, {"input_ids": ids}, port_of, (ids,))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = independent_mamba.token_ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(independent_mamba.port_of(original)(ids), reference, atol=1e-5)
        for bug in independent_mamba.BUGS:
            assert (independent_mamba.port_of(original, bug)(ids) - reference).abs().max().item() > 1e-3, bug


def _named(result: Comparison) -> str:
    first = result.first_divergence
    return "equal" if result.equal else first.b.path.partition(".")[2] if first else "?"


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_compares_equal(captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_mamba.RULES if mapped else ())
    assert result.equal, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert pairs["backbone.layers.1"] == "layers.1", result.table()
    assert pairs["backbone.layers.1.mixer"] == "layers.1.mixer", result.table()
    assert pairs["backbone.layers.1.mixer.in_proj"] == "layers.1.mixer.in_proj", result.table()


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in independent_mamba.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_mamba.RULES if mapped else ())
    if values == "repr":
        expected = independent_mamba.STATS_EXPECTED.get(("mamba", bug), expected)
    assert _named(result) == expected, result.table()


def test_a_class_named_like_the_originals_layer_is_not_paired_with_it_after_a_divergence(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    """Every norm departs (eps outside the square root), so no statistic pairs the layers: the port's mixer, a
    ``MambaBlock`` of linear and convolution modules, has the type name of transformers' layer, a ``MambaBlock`` of a
    norm and a mixer, but not its make-up."""
    a, b = captured("eps_after_sqrt", "bundle")
    result = graphtrace.compare(a, b)
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert pairs["backbone.layers.0"] == "layers.0", result.table()
    assert pairs["backbone.layers.0.norm"] == "layers.0.norm", result.table()


@pytest.mark.parametrize("values", ["safetensors", "bundle"])
def test_a_projection_whose_halves_are_swapped_in_one_layer_departs_under_the_other_layers_layout(
    captured: Callable[..., tuple[Path, Path]], values: str
) -> None:
    """Layer 1's in_proj output is layer 0's layout with x and z swapped: equal up to a permutation of the last
    dimension by values alone, but layer 0, whose mixer agrees, shows none."""
    a, b = captured("zx_swapped", values)
    result = graphtrace.compare(a, b)
    in_proj = {call.b.path.partition(".")[2]: call for call in result.calls if call.b.path.endswith("in_proj")}
    assert in_proj["layers.0.mixer.in_proj"].status == "equal"
    assert in_proj["layers.0.mixer.in_proj"].outputs[0].equivalence == ""
    assert in_proj["layers.1.mixer.in_proj"].status == "diverged", result.table()
    assert in_proj["layers.1.mixer.in_proj"].inputs_agree
