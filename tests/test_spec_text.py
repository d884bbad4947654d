"""The spec files' fast writer against json.dumps of the spec dicts, and graphtrace's own file layout."""

from __future__ import annotations

import json
import math
from pathlib import Path

import graphtrace
from graphtrace.io.spec_json import node_to_spec, spec_texts
from graphtrace.model import CallNode, Stats, TensorRecord, Trace, TraceMeta


def _record(**changes: object) -> TensorRecord:
    base = dict(
        shape=(1, 2),
        dtype="torch.float32",
        stats=Stats(0.5, 0.1, 0.0, 1.0),
        spec_stats=("tensor(5.0000e-01)", "tensor(1.0000e-01)", "tensor(0.)", "tensor(1.)"),
    )
    return TensorRecord(**{**base, **changes})  # type: ignore[arg-type]


def _tree() -> CallNode:
    lines = _record(value=("tensor([[0.0000e+00, 1.0000e+00]])",))
    leaf = CallNode(
        path="M.blocks.0.proj",
        type_name="Linear",
        args=(lines, "None", (), {}),
        kwargs={"value": "a kwarg named value", 3: lines, 'é\u2028"q"': ("x", {"k": _record(file="./f.safetensors")})},
        outputs=(_record(dtype="torch.int64", stats=None, spec_stats=None, value=()), "True"),
    )
    failed = CallNode(
        path="M.blocks.1",
        type_name="Block",
        leaf=False,
        error='ValueError: bad "input"',
        children=(CallNode(path="M.blocks.1.inner", outputs=None, error="ValueError: bad"),),
    )
    op = CallNode(path="M.blocks.0.relu", kind="op", outputs=_record())
    block = CallNode(path="M.blocks.0", type_name="Block", leaf=False, children=(leaf, op), outputs=_record())
    unused = CallNode(path="M.never", type_name="Sequential", leaf=False)
    return CallNode(
        path="M",
        type_name="M",
        leaf=False,
        kwargs={"x": lines},
        children=(block, failed, unused),
        outputs={"logits": _record()},
    )


def test_texts_equal_json_dumps_of_the_spec_dicts() -> None:
    root = _tree()
    full, summary = spec_texts(root)
    assert full == json.dumps(node_to_spec(root, full=True), indent=2)
    assert summary == json.dumps(node_to_spec(root, full=False), indent=2)
    assert '"value": "a kwarg named value"' in summary  # only tensors lose their value


def test_root_without_children_keeps_or_drops_outputs_as_transformers() -> None:
    for outputs in (_record(), "None", "", (), None):
        root = CallNode(path="L", type_name="Linear", outputs=outputs)
        assert spec_texts(root)[0] == json.dumps(node_to_spec(root, full=True), indent=2)


def test_own_file_has_one_call_per_line_and_loads_back(tmp_path: Path) -> None:
    root = _tree()
    nan = _record(stats=Stats(math.nan, math.inf, -math.inf, 0.0), nan_count=1, inf_count=2)
    trace = Trace(steps=(root, CallNode(path="M", type_name="M", outputs=nan)), meta=TraceMeta(model_class="M"))
    trace.save(tmp_path)
    text = (tmp_path / "M_graphtrace.json").read_text()
    json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(AssertionError(name)))
    paths = [
        json.loads(line.strip().rstrip(",") + "]}")["path"]
        for line in text.splitlines()[1:]
        if line.lstrip().startswith('{"path"') and line.rstrip().endswith('"children":[')
    ]
    assert paths == ["M", "M.blocks.0", "M.blocks.1"]
    loaded = graphtrace.load(str(tmp_path))
    assert [n.id for n in loaded.walk()] == [n.id for n in trace.walk()]
    assert loaded.steps[1].outputs.inf_count == 2 and math.isnan(loaded.steps[1].outputs.stats.mean)
