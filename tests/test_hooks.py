"""Forward hooks (quantization, adapters, a user's probe): capture records what ``module(x)`` returned to its caller,
after the hooks, and marks the modules with hooks; the transformers shim keeps transformers' files exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
from tests.conftest import assert_same_trace_files, run_ours, run_reference
from tests.zoo import llama


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))


def _scale(factor: float) -> Any:
    def dequantize(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        return output * factor

    return dequantize


def probe(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
    """A user's probe: looks, changes nothing."""


@pytest.mark.parametrize("strategy", ["eager", "auto"])
def test_a_call_holds_what_its_hooks_returned_and_the_module_is_marked(strategy: str, tmp_path: Path) -> None:
    model = _model()
    model[0].register_forward_hook(_scale(2.0))
    model[2].register_forward_hook(probe)
    x = torch.randn(3, 4)
    trace, output = graphtrace.capture(model, x, strategy=strategy, path=tmp_path, return_output=True)
    received = model[0](x)  # hooks run: what the ReLU was given
    linear, relu = trace.find("Sequential.0"), trace.find("Sequential.1")
    assert linear.outputs == relu.args[0]  # the record of the tensor the ReLU received
    assert isinstance(linear.outputs, graphtrace.TensorRecord) and linear.outputs.stats is not None
    assert linear.outputs.stats.max == pytest.approx(received.max().item())
    assert trace.root.outputs.stats.mean == pytest.approx(output.mean().item())  # type: ignore[union-attr]
    assert trace.hooks == {
        "Sequential.0": ("forward hook: _scale.<locals>.dequantize",),
        "Sequential.2": ("forward hook: probe",),
    }
    assert graphtrace.load(tmp_path).hooks == trace.hooks  # in graphtrace's own file
    if strategy == "auto":  # fx verifies the forward's graph; the hook that changes the output keeps it eager
        assert trace.find("Sequential.2").strategy == "fx" and linear.strategy == "eager"
    assert all("_call_impl" not in module.__dict__ and "forward" not in module.__dict__ for module in model.modules())


def test_pre_hooks_are_marked_and_the_call_holds_what_the_caller_passed() -> None:
    model = _model()
    model[2].register_forward_pre_hook(lambda module, args: (args[0] + 1,))
    x = torch.randn(3, 4)
    trace = graphtrace.capture(model, x, strategy="eager")
    relu, head = trace.find("Sequential.1"), trace.find("Sequential.2")
    assert head.args[0] == relu.outputs  # what the caller passed, before the pre-hook added 1
    assert trace.hooks["Sequential.2"][0].startswith("forward pre-hook: ")


def test_a_diff_names_the_module_whose_hook_departs(tmp_path: Path) -> None:
    x = torch.randn(3, 4)
    graphtrace.capture(_model(), x, path=tmp_path / "a", values="safetensors")
    port = _model()
    port[0].register_forward_hook(_scale(1.5))  # a dequantization scale off by 1.5
    graphtrace.capture(port, x, path=tmp_path / "b", values="safetensors")
    found = graphtrace.compare(tmp_path / "a", tmp_path / "b").first_divergence
    assert found is not None and found.a.path == "Sequential.0"  # not the Sequential around it


def test_first_nonfinite_names_the_module_whose_hook_made_a_nan() -> None:
    model = _model()
    model[0].register_forward_hook(lambda module, args, output: output / 0.0 * 0.0)
    trace = graphtrace.capture(model, torch.randn(3, 4))
    found = trace.first_nonfinite()
    assert found is not None and found.path == "Sequential.0"


def test_a_hook_that_raises_marks_its_module_and_capture_puts_everything_back() -> None:
    model = _model()

    def broken(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
        raise RuntimeError("the probe broke")

    model[2].register_forward_hook(broken)
    with pytest.raises(RuntimeError, match="the probe broke") as caught:
        graphtrace.capture(model, torch.randn(3, 4))
    trace = caught.value.graphtrace_trace  # type: ignore[attr-defined]
    failed = trace.failed_call()
    assert failed is not None and failed.path == "Sequential.2" and failed.error == "RuntimeError: the probe broke"
    assert all("_call_impl" not in module.__dict__ for module in model.modules())
    assert len(model[2]._forward_hooks) == 1  # the user's hook stays


def test_the_shim_writes_transformers_files_exactly_with_hooks(tmp_path: Path) -> None:
    """transformers records a module's output before its forward hooks: the shim must write the same bytes."""
    model, inputs = llama()
    model.model.layers[0].mlp.down_proj.register_forward_hook(_scale(3.0))
    run_reference(model, lambda: model(**inputs), tmp_path / "reference")
    run_ours(model, lambda: model(**inputs), tmp_path / "ours")
    assert_same_trace_files(tmp_path / "reference", tmp_path / "ours")
    assert "_call_impl" not in model.model.layers[0].mlp.down_proj.__dict__
