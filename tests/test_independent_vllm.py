"""diff on a Qwen2 written the way vLLM writes its models (tests/independent_vllm.py): transformers' module names on
other code. A name shared by modules that compute other things (a SiLU ``act_fn`` and a ``SiluAndMul`` one, a layer
returning its output whole or apart from the residual) does not pair them, and a norm given the residual to add is
given other quantities than transformers', not a departure: fed by calls that agree, it is judged by its output. A
faithful port compares equal; each bug is named where it lives."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_vllm
from tests.independent_cases import MODES
from tests.port_traces import port_traces


def _ids() -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def original() -> torch.nn.Module:
    return independent_vllm.hf_qwen()


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, original: torch.nn.Module) -> Callable[..., tuple[Path, Path]]:
    ids = _ids()
    return port_traces(tmp_path_factory.mktemp("vllm"), original, {"input_ids": ids}, independent_vllm.port_of, (ids,))


def test_the_port_is_faithful_and_each_bug_changes_the_output(original: torch.nn.Module) -> None:
    ids = _ids()
    with torch.no_grad():
        reference = original(input_ids=ids).logits
        assert torch.allclose(independent_vllm.port_of(original)(ids), reference, atol=1e-5)
        for _, bug, _, _ in independent_vllm.CASES:
            assert (independent_vllm.port_of(original, bug)(ids) - reference).abs().max().item() > 1e-4, bug


@pytest.mark.parametrize("values", MODES)
def test_a_faithful_port_with_transformers_names_on_other_code_compares_equal(
    captured: Callable[..., tuple[Path, Path]], values: str
) -> None:
    a, b = captured(None, values)
    result = graphtrace.compare(a, b)
    assert result.equal, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert "model.layers.0.mlp.act_fn" not in pairs, result.table()  # SiLU of the gate is not SiluAndMul
    assert pairs["model.layers.1.post_attention_layernorm"] == "model.layers.1.post_attention_layernorm"


@pytest.mark.parametrize("values", MODES)
@pytest.mark.parametrize(("bug", "expected"), [(bug, expected) for _, bug, _, expected in independent_vllm.CASES])
def test_each_bug_is_named_in_the_ports_terms(
    captured: Callable[..., tuple[Path, Path]], values: str, bug: str, expected: str
) -> None:
    a, b = captured(bug, values)
    result = graphtrace.compare(a, b)
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()
