"""diff on a timm style ConvNeXt port of transformers' ConvNextForImageClassification
(tests/independent_convnext_port.py). The images are square (H == W); the port's norm in a LayerNorm2d, its head's
pooled ``[B, C, 1, 1]`` features and, in its ``conv_mlp`` variant, its blocks' norm and MLP hold their values in
another order of dimensions than transformers' where two of them have the same size. A faithful port compares equal
in every value mode; each injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from graphtrace.compare.measure import Tolerance, measure
from graphtrace.model import TensorRecord
from tests import independent_convnext_port as convnext
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return convnext.hf_convnext()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    pixels = convnext.pixels()
    return port_traces(
        tmp_path_factory.mktemp("convnext"), original, {"pixel_values": pixels}, convnext.port_of, (pixels,)
    )


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    pixels = convnext.pixels()
    with torch.no_grad():
        reference = original(pixel_values=pixels).logits
        for variant in (None, *convnext.VARIANTS):
            assert torch.allclose(convnext.port_of(original, variant)(pixels), reference, atol=1e-5), variant
        for bug in convnext.BUGS:
            moved = (convnext.port_of(original, bug)(pixels) - reference).abs().max()
            assert moved.item() > 1e-5, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize("variant", [None, *convnext.VARIANTS], ids=["timm", *convnext.VARIANTS])
def test_a_faithful_port_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, variant: str | None
) -> None:
    a, b = captured(variant, values)
    result = graphtrace.compare(a, b, rules=convnext.RULES if mapped else ())
    assert result.equal, result.table()
    paired = {call.b.path.partition(".")[2]: call.a.path.partition(".")[2] for call in result.calls}
    assert paired["stages.1.blocks.0.conv_dw"] == "convnext.encoder.stages.1.layers.0.dwconv", result.table()
    assert paired["stages.1.blocks.1.mlp.fc2"] == "convnext.encoder.stages.1.layers.1.pwconv2", result.table()
    assert paired["head.norm"] == "convnext.layernorm", result.table()


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in convnext.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=convnext.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    if values == "repr":
        expected = convnext.STATS_EXPECTED.get(("convnext", bug), expected)
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_dims_of_the_same_size_take_the_order_under_which_the_values_agree() -> None:
    """``[B, H, W, C]`` against ``[B, C, W, H]`` with ``H == W``: the shapes allow two orders; the values agree under
    one. The same dims transposed in the same shape are no re-ordering and diverge."""
    a = torch.randn(2, 8, 8, 16, generator=torch.Generator().manual_seed(0))
    record = TensorRecord(shape=(2, 8, 8, 16), dtype="torch.float32")
    for b in (a.permute(0, 3, 1, 2), a.permute(0, 3, 2, 1)):
        other = TensorRecord(shape=tuple(b.shape), dtype="torch.float32")
        diff = measure("outputs", record, "outputs", other, Tolerance(), values=(a, b.contiguous()))
        assert diff.status == "equal" and "the same dims in another order" in diff.equivalence, diff
    transposed = a.transpose(1, 2).contiguous()
    diff = measure("outputs", record, "outputs", record, Tolerance(), values=(a, transposed))
    assert diff.status == "diverged", diff
