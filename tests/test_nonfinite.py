"""Where NaN and Inf first appear: Trace.first_nonfinite() and `graphtrace show --nonfinite`."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

import graphtrace
from tests.conftest import run_cli, run_reference
from tests.zoo import llama

UP_PROJ = "LlamaForCausalLM.model.layers.1.mlp.up_proj"


def _llama_with_nan() -> tuple[nn.Module, dict]:
    model, inputs = llama()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[5, 3] = math.nan
    return model, inputs


def test_a_nan_weight_is_found_where_it_first_shows(tmp_path: Path) -> None:
    model, inputs = _llama_with_nan()
    trace = graphtrace.capture(model, inputs, path=tmp_path)
    found = trace.first_nonfinite()
    assert found is not None and found.id == f"{UP_PROJ}@0"
    # the calls around it: the gate projection next to it is finite, everything after it is not
    assert trace.find("LlamaForCausalLM.model.layers.1.mlp.gate_proj").outputs.is_finite
    assert not trace.find("LlamaForCausalLM.model.layers.1.mlp.down_proj").outputs.is_finite
    assert graphtrace.load(str(tmp_path)).first_nonfinite().id == found.id  # type: ignore[union-attr]

    shown = run_cli("show", str(tmp_path), "--nonfinite", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1] == f"first non-finite output: {UP_PROJ}@0 (Linear); its inputs are finite"
    assert lines[2] == "  outputs [1, 7, 64]: nan 7, inf 0"  # one weight row: one NaN feature per token
    assert "├─" not in shown.stdout  # the answer, not the tree


def test_an_inf_made_inside_a_module_and_a_finite_trace(tmp_path: Path) -> None:
    class Overflow(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.exp()  # exp(100) overflows float32, not float64

    model = nn.Sequential(nn.Linear(2, 2), Overflow(), nn.Linear(2, 2))
    with torch.no_grad():
        model[0].weight.fill_(50.0)
    trace = graphtrace.capture(model, torch.ones(1, 2))
    found = trace.first_nonfinite()
    assert found is not None and found.path == "Sequential.1" and found.outputs.inf_count == 2
    assert graphtrace.capture(model, torch.zeros(1, 2)).first_nonfinite() is None
    assert graphtrace.capture(model.double(), torch.ones(1, 2, dtype=torch.float64)).first_nonfinite() is None


def test_non_finite_model_inputs_name_no_culprit(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    graphtrace.capture(model, torch.tensor([[math.nan, 1.0]]), path=tmp_path)
    assert graphtrace.load(str(tmp_path)).first_nonfinite() is None
    shown = run_cli("show", str(tmp_path), "--nonfinite", cwd=tmp_path)
    assert "every call that returns NaN or Inf already received them; the first is Sequential.0@0" in shown.stdout
    graphtrace.capture(model, torch.ones(1, 2), path=tmp_path / "fine")
    assert "no call returns NaN or Inf" in run_cli("show", "fine", "--nonfinite", cwd=tmp_path).stdout


def test_in_a_trace_written_by_transformers(tmp_path: Path) -> None:
    model, inputs = _llama_with_nan()
    run_reference(model, lambda: model(**inputs), tmp_path, do_prune_layers=False)
    found = graphtrace.load(str(tmp_path)).first_nonfinite()
    assert found is not None and found.path == UP_PROJ
    shown = run_cli("show", str(tmp_path), "--nonfinite", cwd=tmp_path)
    assert f"first non-finite output: {UP_PROJ}@0;" in shown.stdout and "counts are lower bounds" in shown.stdout
