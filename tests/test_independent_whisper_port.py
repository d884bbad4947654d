"""diff on an openai-whisper style port of transformers' WhisperForConditionalGeneration
(tests/independent_whisper_port.py). The port computes its encoder's sinusoids into a buffer and its decoder's
logits in the decoder's own code (no output projection module), scales q and k by d_head ** -0.25 each, and its
attention returns its pre-softmax scores where transformers' returns its softmax weights. A faithful port compares
equal in every value mode; each injected bug is named in the port's terms.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_whisper_port as whisper
from tests.independent_cases import MODES
from tests.port_traces import port_traces


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return whisper.hf_whisper()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    """(original, port) trace directories, captured once per (bug, mode)."""
    mel, tokens = whisper.inputs()
    hf_inputs = whisper.hf_inputs(mel, tokens)
    return port_traces(tmp_path_factory.mktemp("whisper"), original, hf_inputs, whisper.port_of, (mel, tokens))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    mel, tokens = whisper.inputs()
    with torch.no_grad():
        reference = original(**whisper.hf_inputs(mel, tokens)).logits
        assert torch.allclose(whisper.port_of(original)(mel, tokens), reference, atol=1e-5)
        for bug in whisper.BUGS:
            moved = (whisper.port_of(original, bug)(mel, tokens) - reference).abs().max()
            assert moved.item() > 1e-5, bug


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
def test_a_faithful_port_compares_equal(captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b, rules=whisper.RULES if mapped else ())
    assert result.equal, result.table()
    paired = {call.b.path.partition(".")[2]: call.a.path.partition(".")[2] for call in result.calls}
    assert paired["encoder.conv2"] == "model.encoder.conv2"
    assert paired["decoder.blocks.1.cross_attn.key"] == "model.decoder.layers.1.encoder_attn.k_proj"
    # transformers' decoder ends before proj_out, the port's computes the logits: they do not pair
    assert "decoder" not in paired, result.table()
    # each attention returns its weights (transformers) or its scores (the port) beside its output, and no call reads
    # them: set aside, not compared
    attention = next(call for call in result.calls if call.b.path.endswith("decoder.blocks.0.attn"))
    assert "outputs_1 (read by no call)" in attention.only_in_a, attention.only_in_a
    assert "outputs_1 (read by no call)" in attention.only_in_b, attention.only_in_b


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize("mapped", [False, True], ids=["structure", "rules"])
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in whisper.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, mapped: bool, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b, rules=whisper.RULES if mapped else ())
    first = result.first_divergence
    assert first is not None, result.table()
    if values == "repr":
        expected = whisper.STATS_EXPECTED.get(("whisper", bug), expected)
    assert first.b.path.partition(".")[2] == expected, result.table()


def test_a_leaf_returning_another_shape_pairs_by_what_it_is_given(captured: Callable[..., tuple[Path, Path]]) -> None:
    """conv2 without padding returns one frame fewer: no call of the encoder after it has its counterpart's shape,
    so nothing there pairs by structure; conv2 itself, the only convolution left and given what the original's
    conv2 is given, pairs and is named, not the decoder's cross-attention that reads the shorter encoder output."""
    a, b = captured("conv2_padding", "repr")
    result = graphtrace.compare(a, b)
    found = result.divergence
    assert found is not None and found.call.how == "structure", result.table()
    assert found.call.b.path.endswith("encoder.conv2") and not found.inside, result.table()
    assert "shape [1, 32, 8] vs [1, 32, 7]" in found.explanation, found.explanation


def test_a_projection_given_another_quantity_is_blamed_on_its_caller(
    captured: Callable[..., tuple[Path, Path]],
) -> None:
    """The cross-attention's key is given the decoder's state [1, 5, 32] where the original's is given the encoder's
    output [1, 8, 32]: its output has another shape because its input does, so the cross-attention's own code,
    which handed it that, is named."""
    a, b = captured("cross_reads_decoder", "safetensors")
    result = graphtrace.compare(a, b, rules=whisper.RULES)
    found = result.divergence
    assert found is not None and found.inside, result.table()
    assert found.before is not None and found.before.b.path.endswith("cross_attn.key"), result.table()
    assert "inputs_args_0: given shape [1, 8, 32] vs [1, 5, 32]" in found.explanation, found.explanation
