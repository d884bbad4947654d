"""graphtrace's own file is written as text directly; its bytes must stay those of encoding the document of
``trace_to_json`` call by call (the writer before it was made fast, kept here as the oracle)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

import graphtrace
from graphtrace.io.trace_json import trace_from_json, trace_text, trace_to_json
from graphtrace.model import CallNode, DTensorInfo, SourceLine, Stats, StepInfo, TensorRecord, Trace, TraceMeta
from tests.zoo import gpt2, llama

_compact = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


def _document_text(trace: Trace) -> str:
    """The file as graphtrace wrote it before: the document's dicts, each call's encoded by json's C encoder."""
    doc = trace_to_json(trace)
    steps = doc.pop("steps")
    lines = [_compact(doc)[:-1] + ',"steps":[']
    for i, step in enumerate(steps):
        if i:
            lines[-1] += ","
        _node_lines(step, 0, lines)
    lines.append("]}")
    return "\n".join(lines) + "\n"


def _node_lines(node: dict[str, Any], depth: int, lines: list[str]) -> None:
    children = node.pop("children")
    head = " " * depth + _compact(node)[:-1] + ',"children":['
    if not children:
        lines.append(head + "]}")
        return
    lines.append(head)
    for i, child in enumerate(children):
        if i:
            lines[-1] += ","
        _node_lines(child, depth + 1, lines)
    lines.append(" " * depth + "]}")


@pytest.mark.parametrize(
    "options",
    [
        {"strategy": "eager"},
        {"values": "none"},
        {"ops": True},
        {"prune_layers": True, "strategy": "eager"},
    ],
    ids=["repr-eager", "none-auto", "ops", "pruned"],
)
def test_real_traces_are_written_as_their_document(options: dict[str, Any]) -> None:
    model, inputs = llama()
    trace = graphtrace.capture(model, inputs, **options)
    text = trace_text(trace)
    assert text == _document_text(trace)
    assert trace_from_json(json.loads(text)) == trace_from_json(trace_to_json(trace))


def test_generate_steps_with_their_cache_are_written_as_their_document() -> None:
    model, inputs = llama()
    with graphtrace.tracing(model) as session:
        model.generate(**inputs, max_new_tokens=2, do_sample=False)
    trace = session.trace
    assert trace is not None and len(trace.steps) == 2 and trace.step_info[-1].cache is not None
    assert trace_text(trace) == _document_text(trace)


def test_a_trace_with_safetensors_values_is_written_as_its_document(tmp_path: Any) -> None:
    model, inputs = gpt2()
    trace = graphtrace.capture(model, inputs, values="safetensors", path=tmp_path)
    assert any(record.file for node in trace.walk() for _, record in node.output_tensors())
    assert trace_text(trace) == _document_text(trace)


class _Float(float):
    def __repr__(self) -> str:
        return "not json"


def _odd_record(**changes: Any) -> TensorRecord:
    fields: dict[str, Any] = {
        "shape": (2, 3),
        "dtype": "torch.float32",
        "stats": Stats(0.1, 1e-300, -2.5, 3.0),
        "spec_stats": ("tensor(1.0000e-01)", "tensor(1.0000e-300)", "tensor(-2.5000e+00)", "tensor(3.0000e+00)"),
        "sketch": (0.1, -0.0, 1e22, 5e-324),
        **changes,
    }
    return TensorRecord(**fields)


@pytest.mark.parametrize(
    "record",
    [
        _odd_record(),
        _odd_record(stats=Stats(math.nan, math.nan, -math.inf, math.inf), nan_count=1, inf_count=2),
        _odd_record(sketch=(1.5, math.inf, -math.inf, math.nan)),
        _odd_record(stats=Stats(1, 0, -1, True), sketch=(1, 2.0, False, 3)),  # type: ignore[arg-type]
        _odd_record(stats=Stats(_Float(0.5), 0.25, 0.0, 1.0), sketch=(_Float(1e-7), 2.0)),
        _odd_record(file="./M.x_outputs.safetensors", device="cuda:0", sketch=None, stats=None, spec_stats=None),
        _odd_record(dtensor=DTensorInfo("(Shard(dim=2),)", (2,), (1, 7, 64)), shape=(True, 3)),  # type: ignore[arg-type]
    ],
    ids=["finite", "non-finite-stats", "non-finite-sketch", "ints-and-bools", "float-subclass", "file", "dtensor"],
)
def test_unusual_values_are_written_as_json_writes_them(record: TensorRecord) -> None:
    kwargs = {"ünïcode\n": record, 1: "None", "1": (record, "x"), None: {"inner": (record,)}}
    leaf = CallNode(
        path='M.x"y',
        index=1,
        type_name="Lïnear",
        outputs=(record, {"k": "None"}),
        kwargs=kwargs,  # type: ignore[arg-type]  # keys as a model may pass them
        error="ValueError: bad\tthing",
        inputs_from=("M@0", "M.w@1"),
        source=SourceLine("model.py", 12, "forward", "x = y * 2  # é"),
    )
    op = CallNode(path="M#add", kind="op", args=(record, ()), outputs=None, strategy="fx")
    root = CallNode(path="M", type_name="M", leaf=False, args=((),), children=(leaf, op))
    meta = TraceMeta(model_class="M", created="2026-11-25T10:00:00")
    info = (StepInfo(cached_tokens=3, new_tokens=1, cache={"layers": (record,)}),)
    trace = Trace(steps=(root, root), meta=meta, fallbacks={"M.x": "TraceError: ü"}, step_info=info)
    assert trace_text(trace) == _document_text(trace)
