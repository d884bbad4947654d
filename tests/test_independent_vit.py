"""diff on a timm-style Vision Transformer port of transformers' ViT (tests/independent_vit.py): other names, a
fused ``qkv``, the class token and position embedding in the model's own code, identity and dropout modules the
original lacks. A faithful port compares equal; each injected bug is named where it lives, with and without rename
rules, by values and by statistics alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_vit
from tests.independent_cases import VIT_CASES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_vit.hf_vit()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    pixels = independent_vit.pixels()
    return port_traces(
        tmp_path_factory.mktemp("vit"), original, {"pixel_values": pixels}, independent_vit.port_of, (pixels,)
    )


def test_the_port_is_faithful_and_each_bug_changes_the_logits(original: torch.nn.Module) -> None:
    pixels = independent_vit.pixels()
    with torch.no_grad():
        reference = original(pixel_values=pixels).logits
        assert torch.allclose(independent_vit.port_of(original)(pixels), reference, atol=1e-5)
        for bug in independent_vit.BUGS:
            assert (independent_vit.port_of(original, bug)(pixels) - reference).abs().max().item() > 1e-5, (
                bug
            )  # tanh GELU: ~3e-5


@pytest.mark.parametrize("values", ["bundle", "repr"])
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_compares_equal(captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=independent_vit.RULES if mapped else ())
    assert result.equal, result.table()
    assert result.matched_by()["fused"] == 9  # each block's qkv slices against q_proj, k_proj, v_proj


@pytest.mark.parametrize("values", ["bundle", "repr"])
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in VIT_CASES])
def test_each_bug_is_named_where_it_lives(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=independent_vit.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_after_a_divergence_the_blocks_stay_aligned_without_rules(captured: Callable[..., tuple[Path, Path]]) -> None:
    """Statistics stop telling calls apart once values diverge: the block still pairs with the block, not with
    the attention inside it or the Sequential around it, by what the containers are made of and were given."""
    a, b = captured("scale_1_over_d", "repr")
    result = graphtrace.compare(a, b)
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    for i in range(3):
        assert pairs[f"vit.layers.{i}"] == f"blocks.{i}"
        assert pairs[f"vit.layers.{i}.attention"] == f"blocks.{i}.attn"
        assert pairs[f"vit.layers.{i}.mlp"] == f"blocks.{i}.mlp"
