"""What a porter types first in a REPL: short reprs of a trace, a call, a record and a comparison; ``trace.show()``
printing the tree ``graphtrace show`` prints; ``trace.find()`` by the names the tables print."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

import graphtrace
from graphtrace.errors import CallNotFoundError, GraphtraceError
from tests.conftest import run_cli
from tests.zoo import llama


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama captured with full values (a/), and again with one MLP weight of layer 1 scaled by 1.0001 (b/)."""
    root = tmp_path_factory.mktemp("python-view")
    model, inputs = llama()
    graphtrace.capture(model, inputs, path=root / "a", values="safetensors")
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(1.0001)
    graphtrace.capture(model, inputs, path=root / "b", values="safetensors")
    return root


def test_reprs_are_one_short_line(saved: Path) -> None:
    trace = graphtrace.load(saved / "a")
    assert repr(trace) == f"Trace(LlamaForCausalLM, 1 forward call, 45 calls, directory={str(saved / 'a')!r})"
    mlp = trace.find("model.layers.1.mlp")
    assert repr(mlp) == (
        "CallNode(LlamaForCausalLM.model.layers.1.mlp@0, LlamaMLP, -> [1, 7, 32] float32, 4 calls directly inside)"
    )
    record = mlp.outputs
    assert isinstance(record, graphtrace.TensorRecord) and record.stats is not None
    assert repr(record) == (
        f"TensorRecord([1, 7, 32] float32, mean {record.stats.mean:.4g} std {record.stats.std:.4g} "
        f"min {record.stats.min:.4g} max {record.stats.max:.4g}, file {record.file})"
    )
    comparison = graphtrace.compare(saved / "a", saved / "b")
    assert repr(comparison) == (
        f"Comparison(A={str(saved / 'a')!r}, B={str(saved / 'b')!r}, 45 matched calls, "
        "DIVERGED at model.layers.1.mlp.up_proj)"
    )
    assert "EQUAL)" in repr(graphtrace.compare(saved / "a", saved / "a"))
    for value in (trace, trace.root, comparison):  # a REPL prints these: never the records inside
        assert len(repr(value)) < 200


def test_trace_show_prints_the_tree_graphtrace_show_prints(saved: Path) -> None:
    trace = graphtrace.load(saved / "a")
    for options, flags in (
        ({}, []),
        ({"depth": 2}, ["--depth", "2"]),
        ({"focus": "model.layers.1.mlp", "paths": True}, ["--focus", "model.layers.1.mlp", "--paths"]),
    ):
        out = io.StringIO()
        trace.show(file=out, **options)  # type: ignore[arg-type]
        shown = run_cli("show", str(saved / "a"), *flags)
        assert shown.returncode == 0, shown.stderr
        assert out.getvalue() == shown.stdout
    out = io.StringIO()
    trace.show(focus="model.layers.1.mlp", file=out)
    assert out.getvalue().splitlines()[2].startswith("LlamaForCausalLM.model.layers.1.mlp (LlamaMLP) -> [1, 7, 32]")


def test_find_takes_the_names_the_tables_print(saved: Path) -> None:
    trace = graphtrace.load(saved / "a")
    full = trace.find("LlamaForCausalLM.model.layers.1.mlp")
    assert trace.find("model.layers.1.mlp") is full
    assert trace.find("model.layers.1.mlp@0") is full
    with pytest.raises(CallNotFoundError) as missed:
        trace.find("model.layers.1.mpl")
    assert isinstance(missed.value, KeyError) and isinstance(missed.value, GraphtraceError)
    assert str(missed.value) == (
        "'model.layers.1.mpl': no such call in this step. Did you mean model.layers.1.mlp, model.layers.2.mlp, "
        "model.layers.0.mlp?"
    )
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp was called 1 time\(s\); use @0\.\.@0"):
        trace.find("model.layers.1.mlp", index=2)
    with pytest.raises(KeyError, match=r"step 3 does not exist: the trace has 1 forward call\(s\), 0\.\.0"):
        trace.find("model.layers.1.mlp", step=3)
