"""Reading traces: transformers-written directories, graphtrace's own file, malformed input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import TraceFormatError
from graphtrace.model import CallNode, Stats, TensorRecord, Trace, TraceMeta
from tests.conftest import run_reference
from tests.zoo import llama


def test_load_a_trace_written_by_transformers(tmp_path: Path) -> None:
    model, inputs = llama()
    run_reference(model, lambda: model(**inputs), tmp_path, do_prune_layers=False, use_repr=False)
    trace = graphtrace.load(str(tmp_path))
    assert trace.meta.model_class == "LlamaForCausalLM" and trace.meta.values == "safetensors"
    q_proj = trace.find("LlamaForCausalLM.model.layers.1.self_attn.q_proj")
    record = q_proj.outputs
    assert isinstance(record, TensorRecord) and record.shape == (1, 7, 32) and record.file is not None
    assert record.stats is not None and record.spec_stats is not None
    assert record.stats.mean == float(record.spec_stats[0][len("tensor(") : -1])
    assert (tmp_path / record.file).is_file()


def test_own_file_round_trips_non_finite_statistics(tmp_path: Path) -> None:
    record = TensorRecord(
        shape=(2,),
        dtype="torch.float32",
        stats=Stats(math.nan, math.nan, -math.inf, math.inf),
        spec_stats=("tensor(nan)", "tensor(nan)", "tensor(-inf)", "tensor(inf)"),
        nan_count=1,
        inf_count=1,
    )
    root = CallNode(
        path="M",
        type_name="M",
        leaf=False,
        children=(CallNode(path="M.x", type_name="Linear", outputs=(record, {"k": "None"}), inputs_from=("M@0",)),),
    )
    trace = Trace(steps=(root,), meta=TraceMeta(model_class="M"))
    trace.save(tmp_path)
    text = (tmp_path / "M_graphtrace.json").read_text()
    json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
    loaded = graphtrace.load(str(tmp_path))
    out = loaded.find("M.x").outputs
    assert isinstance(out, tuple) and out[1] == {"k": "None"}
    got = out[0]
    assert math.isnan(got.stats.mean) and got.stats.max == math.inf and (got.nan_count, got.inf_count) == (1, 1)


def test_malformed_and_missing_traces(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        graphtrace.load(str(tmp_path / "missing"))
    with pytest.raises(TraceFormatError, match="holds no trace"):
        graphtrace.load(str(tmp_path))
    (tmp_path / "M_graphtrace.json").write_text('{"format": "graphtrace", "schema_version": 99}')
    with pytest.raises(TraceFormatError, match="schema version 99"):
        graphtrace.load(str(tmp_path))
    (tmp_path / "M_graphtrace.json").write_text("{truncated")
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        graphtrace.load(str(tmp_path))


def test_directory_with_two_models_asks_which(tmp_path: Path) -> None:
    for model in (nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2))):
        graphtrace.capture(model, torch.ones(1, 2), path=tmp_path)
    with pytest.raises(TraceFormatError, match="several models"):
        graphtrace.load(str(tmp_path))
    assert graphtrace.load(str(tmp_path / "Linear_graphtrace.json")).meta.model_class == "Linear"
