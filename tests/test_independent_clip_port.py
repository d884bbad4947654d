"""diff on an open_clip style port of transformers' CLIPModel (tests/independent_clip_port.py). The port's two towers
are made of the same blocks as transformers' (and as each other), its attention is one ``nn.MultiheadAttention``
(q, k and v in one ``in_proj_weight``, no call of a projection), an ``Identity`` follows each attention and each MLP,
and its class token, positions, pooling, projections and logit scale live in its own code. A faithful port compares
equal in every value mode; each injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_clip_port as clip
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return clip.hf_clip()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    pixels, ids = clip.inputs()
    return port_traces(
        tmp_path_factory.mktemp("clip"), original, clip.hf_inputs(pixels, ids), clip.port_of, (pixels, ids)
    )


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    pixels, ids = clip.inputs()
    assert ids.argmax(dim=-1).tolist() == [4, 6]  # the EOS token, where CLIP pools, at another position per row
    with torch.no_grad():
        reference = original(**clip.hf_inputs(pixels, ids)).logits_per_image
        assert torch.allclose(clip.port_of(original)(pixels, ids)[0], reference, atol=1e-5)
        for bug in clip.BUGS:
            moved = (clip.port_of(original, bug)(pixels, ids)[0] - reference).abs().max()
            assert moved.item() > 1e-5, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_compares_equal(captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=clip.RULES if mapped else ())
    assert result.equal, result.table()
    paired = {call.b.path.partition(".")[2]: call.a.path.partition(".")[2] for call in result.calls}
    # the two towers are made of the same blocks: text pairs with text, vision with vision
    assert paired["transformer.resblocks.1.attn"] == "text_model.encoder.layers.1.self_attn", result.table()
    assert paired["visual.transformer.resblocks.0.attn"] == "vision_model.encoder.layers.0.self_attn", result.table()
    # nn.MultiheadAttention calls no projection: transformers' q/k/v/out_proj have no counterpart, and the Identity
    # after the attention, which returns what it was given, is not taken for out_proj
    assert "visual.transformer.resblocks.0.ls_1" not in paired, result.table()
    unmatched = {entry.call.path.partition(".")[2] for entry in result.only_in_a}
    assert "text_model.encoder.layers.0.self_attn.out_proj" in unmatched, unmatched


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in clip.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=clip.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    if values == "repr":
        expected = clip.STATS_EXPECTED.get(("clip", bug), expected)
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_a_module_that_drops_in_for_an_identity_is_no_counterpart(captured: Callable[..., tuple[Path, Path]]) -> None:
    """Without ln_pre the port's patch_dropout (an Identity) is the only call where the original calls its
    pre-norm: a call that returns what it was given computes nothing the norm does, so it does not pair, and the
    vision tower's own code is named, not the Identity."""
    a, b = captured("no_ln_pre", "safetensors")
    result = graphtrace.compare(a, b)
    found = result.divergence
    assert found is not None and found.inside, result.table()
    assert found.call.b.path.endswith("CLIP.visual"), result.table()
    assert not any(call.b.path.endswith("patch_dropout") for call in result.calls), result.table()


def test_an_argument_withheld_by_the_caller_names_the_caller(captured: Callable[..., tuple[Path, Path]]) -> None:
    """Text block 0 does not hand its attention the causal mask: the attention computes faithfully from what it was
    given (its input agrees, the mask is an extra argument on A's side), but the same attention of block 1 is given
    the mask, and transformers' attention is given it in every block: the block withheld it."""
    a, b = captured("no_causal_mask", "repr")
    result = graphtrace.compare(a, b)
    found = result.divergence
    assert found is not None and found.inside, result.table()
    assert found.before is not None and found.before.b.path.endswith("transformer.resblocks.0.attn"), result.table()
    assert "is not given _kwargs_attn_mask" in found.explanation, found.explanation
