"""Faults of transformers' debugger that the shim fixes, residue, and bad input."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch._tensor_str import PRINT_OPTS

import graphtrace
from graphtrace import model_addition_debugger_context
from graphtrace.errors import GraphtraceError, InvalidModelError, OutputPathError
from tests.conftest import run_reference


class SharedNorm(nn.Module):
    """One LayerNorm called twice on different tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.lin(self.norm(x)))


def _values(path: Path, module_path: str) -> list[str]:
    tree = json.loads(path.read_text())
    found = []

    def visit(node: dict) -> None:
        if node["module_path"] == module_path:
            found.append(node["inputs"]["args"][0]["value"])
        for child in node.get("children", []):
            visit(child)

    visit(tree)
    return found


def test_repeated_call_keeps_each_calls_tensors(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = SharedNorm()
    x = torch.randn(2, 4)
    with model_addition_debugger_context(model, debug_path=str(tmp_path), use_repr=False):
        model(x)
    files = _values(tmp_path / "SharedNorm_debug_tree_FULL_TENSORS.json", "SharedNorm.norm")
    assert files == ["./SharedNorm.norm_inputs_args_0.safetensors", "./SharedNorm.norm@1_inputs_args_0.safetensors"]
    first = load_file(str(tmp_path / files[0]))["data"]
    second = load_file(str(tmp_path / files[1]))["data"]
    assert torch.equal(first, x)
    with torch.no_grad():
        assert torch.equal(second, model.lin(model.norm(x)))


def test_repeated_call_is_a_fault_in_the_reference(tmp_path: Path) -> None:
    """The reference points both calls at one file holding the last call's input: why the fix above matters. The shim
    and capture() on the same model and input keep one file per call, each with its own call's input."""
    torch.manual_seed(0)
    model = SharedNorm()
    x = torch.randn(2, 4)
    with torch.no_grad():
        second_input = model.lin(model.norm(x))
    run_reference(model, lambda: model(x), tmp_path / "reference", use_repr=False)
    files = _values(tmp_path / "reference" / "SharedNorm_debug_tree_FULL_TENSORS.json", "SharedNorm.norm")
    assert files[0] == files[1]
    assert not torch.equal(load_file(str(tmp_path / "reference" / files[0]))["data"], x)

    with model_addition_debugger_context(model, debug_path=str(tmp_path / "shim"), use_repr=False):
        model(x)
    ours = _values(tmp_path / "shim" / "SharedNorm_debug_tree_FULL_TENSORS.json", "SharedNorm.norm")
    assert len(ours) == 2 and ours[0] != ours[1]
    assert torch.equal(load_file(str(tmp_path / "shim" / ours[0]))["data"], x)
    assert torch.equal(load_file(str(tmp_path / "shim" / ours[1]))["data"], second_input)

    trace = graphtrace.capture(model, x, path=tmp_path / "capture", values="safetensors")
    norms = [node for node in trace.walk() if node.path == "SharedNorm.norm"]
    assert [node.id for node in norms] == ["SharedNorm.norm@0", "SharedNorm.norm@1"]
    stored = [norm.args[0].file for norm in norms]
    assert stored[0] != stored[1]
    assert torch.equal(load_file(str(tmp_path / "capture" / stored[0]))["data"], x)
    assert torch.equal(load_file(str(tmp_path / "capture" / stored[1]))["data"], second_input)


class ValueKwarg(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attn()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, key=x, value=x * 2, value_mode="sum")


class Attn(nn.Module):
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, value_mode: str) -> torch.Tensor:
        return query + key + value


def test_kwarg_named_value_stays_in_summary(tmp_path: Path) -> None:
    model = ValueKwarg()
    with model_addition_debugger_context(model, debug_path=str(tmp_path)):
        model(torch.ones(1, 3))
    summary = json.loads((tmp_path / "ValueKwarg_debug_tree_SUMMARY.json").read_text())
    kwargs = summary["children"][0]["inputs"]["kwargs"]
    assert list(kwargs) == ["key", "value", "value_mode"]
    assert kwargs["value"]["shape"] == "torch.Size([1, 3])" and "value" not in kwargs["value"]
    assert kwargs["value"]["mean"] == "tensor(2.0000e+00)"
    full = json.loads((tmp_path / "ValueKwarg_debug_tree_FULL_TENSORS.json").read_text())
    assert full["children"][0]["inputs"]["kwargs"]["value"]["value"] == [
        "tensor([[2.0000e+00, 2.0000e+00, 2.0000e+00]])"
    ]


class Exploding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3)
        self.middle = Boom()
        self.last = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(self.middle(self.first(x)))


class Boom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inner(x)
        raise ValueError("shapes do not line up\nsecond line")


def _state(model: nn.Module) -> tuple:
    return (
        {name: dict(module.__dict__) for name, module in model.named_modules()},
        dict(vars(PRINT_OPTS)),
        torch.is_grad_enabled(),
    )


def test_forward_that_raises_writes_partial_trace_and_reraises(tmp_path: Path) -> None:
    model = Exploding()
    before = _state(model)
    with pytest.raises(ValueError, match="shapes do not line up") as raised:
        with model_addition_debugger_context(model, debug_path=str(tmp_path)):
            model(torch.ones(1, 3))
    assert type(raised.value) is ValueError
    summary = json.loads((tmp_path / "Exploding_debug_tree_SUMMARY.json").read_text())
    assert summary["error"] == "ValueError: shapes do not line up"
    first, middle = summary["children"]
    assert first["module_path"] == "Exploding.first" and "error" not in first and "outputs" in first
    assert middle["module_path"] == "Exploding.middle"
    assert middle["error"] == "ValueError: shapes do not line up"
    assert middle["children"][0]["module_path"] == "Exploding.middle.inner"  # recorded before the raise
    assert _state(model) == before


def test_no_residue_after_a_normal_run(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = SharedNorm()
    custom = lambda x: x  # noqa: E731 - a forward patched by the user beforehand must come back as it was
    model.lin.forward = custom
    torch.set_printoptions(precision=6, linewidth=77)
    before = _state(model)
    with torch.enable_grad(), model_addition_debugger_context(model, debug_path=str(tmp_path)):
        model(torch.randn(1, 4))
    assert _state(model) == before
    assert model.lin.__dict__["forward"] is custom
    assert "forward" not in model.norm.__dict__ and "forward" not in model.__dict__
    assert PRINT_OPTS.precision == 6 and PRINT_OPTS.linewidth == 77 and PRINT_OPTS.sci_mode is None


def test_reference_leaves_residue_that_we_do_not(tmp_path: Path) -> None:
    """transformers' debugger leaves its call tree on the model and sci_mode on torch's printer; the shim and
    capture() on the same model and input leave both as they were."""
    from transformers.model_debugging_utils import model_addition_debugger_context as reference

    model = SharedNorm()
    x = torch.randn(1, 4)
    assert PRINT_OPTS.sci_mode is not True
    with reference(model, debug_path=str(tmp_path / "reference")):
        model(x)
    assert "_call_tree" in model.__dict__ and PRINT_OPTS.sci_mode is True

    model = SharedNorm()  # a clean model and printer again: the reference's residue is not ours to undo
    torch.set_printoptions(profile="default")
    PRINT_OPTS.sci_mode = None
    before = _state(model)
    with model_addition_debugger_context(model, debug_path=str(tmp_path / "shim")):
        model(x)
    assert (tmp_path / "shim" / "SharedNorm_debug_tree_SUMMARY.json").is_file()
    assert _state(model) == before and "_call_tree" not in model.__dict__ and PRINT_OPTS.sci_mode is None
    graphtrace.capture(model, x, path=tmp_path / "capture")
    assert (tmp_path / "capture" / "SharedNorm_debug_tree_SUMMARY.json").is_file()
    assert _state(model) == before and "_call_tree" not in model.__dict__ and PRINT_OPTS.sci_mode is None


def test_std_of_one_element_is_nan_without_warnings(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(3, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with model_addition_debugger_context(model, debug_path=str(tmp_path)):
            model(torch.ones(1, 3))
    summary = json.loads((tmp_path / "Sequential_debug_tree_SUMMARY.json").read_text())
    assert summary["children"][0]["outputs"]["std"] == "tensor(nan)"


def test_rejects_a_non_module_before_anything_runs() -> None:
    with pytest.raises(InvalidModelError, match="torch.nn.Module") as raised:
        with model_addition_debugger_context(lambda x: x):
            pass
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, GraphtraceError)


def test_debug_path_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "taken"
    path.write_text("")
    calls = []
    model = nn.Linear(2, 2)
    model.register_forward_hook(lambda *args: calls.append(1))
    with pytest.raises(ValueError, match="is a file"):
        with model_addition_debugger_context(model, debug_path=str(path)):
            model(torch.ones(1, 2))
    assert calls == [] and "forward" not in model.__dict__


def test_debug_path_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputPathError, match="Unexpected or existing debug_path") as raised:
        with model_addition_debugger_context(nn.Linear(2, 2), debug_path=str(blocker / "sub")):
            pass
    assert isinstance(raised.value.__cause__, OSError)


def test_pruned_layers_keep_their_safetensors_files_in_the_shim_and_not_in_capture(tmp_path: Path) -> None:
    model = nn.Sequential(*(nn.Sequential(nn.Linear(2, 2)) for _ in range(5)))
    with model_addition_debugger_context(model, debug_path=str(tmp_path / "shim"), use_repr=False):
        model(torch.ones(1, 2))
    layers = {p.name.split("_")[0] for p in (tmp_path / "shim").glob("Sequential.*.safetensors")}
    assert layers == {f"Sequential.{i}" for i in range(5)} | {f"Sequential.{i}.0" for i in range(5)}  # as transformers
    summary = (tmp_path / "shim" / "Sequential_debug_tree_SUMMARY.json").read_text()
    assert "Sequential.2" not in summary  # only the JSON is pruned
    graphtrace.capture(model, torch.ones(1, 2), path=tmp_path / "capture", values="safetensors", prune_layers=True)
    layers = {p.name.split("_")[0] for p in (tmp_path / "capture").glob("Sequential.*.safetensors")}
    assert layers == {"Sequential.0", "Sequential.0.0", "Sequential.4", "Sequential.4.0"}  # capture() stays cheaper
