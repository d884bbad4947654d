"""The spec files' fast writer against json.dumps of the spec dicts, and graphtrace's own file layout."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import graphtrace
from graphtrace.io.spec_json import spec_texts
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


# The same tree as transformers' debugger records it (a dict per call, tensors serialised as it serialises them,
# keys in its order), written by hand from the format's rules: a submodule's inputs keep only non-empty args and
# kwargs, a module with submodules records outputs None, empty children are dropped, the root keeps args and kwargs
# and loses its falsy keys. graphtrace's extension, a call that raised, carries an "error" key last.
STATS = {"mean": "tensor(5.0000e-01)", "std": "tensor(1.0000e-01)", "min": "tensor(0.)", "max": "tensor(1.)"}
LINES = {"shape": "torch.Size([1, 2])", "dtype": "torch.float32", "value": ["tensor([[0.0000e+00, 1.0000e+00]])"]}
LINES.update(STATS)
PLAIN = {"shape": "torch.Size([1, 2])", "dtype": "torch.float32", **STATS}
IN_FILE = {"shape": "torch.Size([1, 2])", "dtype": "torch.float32", "value": "./f.safetensors", **STATS}
RECORDED = {
    "module_path": "M",
    "inputs": {"args": [], "kwargs": {"x": LINES}},
    "outputs": {"logits": PLAIN},
    "children": [
        {
            "module_path": "M.blocks.0",
            "inputs": {},
            "outputs": PLAIN,
            "children": [
                {
                    "module_path": "M.blocks.0.proj",
                    "inputs": {
                        "args": [LINES, "None", [], {}],
                        "kwargs": {"value": "a kwarg named value", 3: LINES, 'é\u2028"q"': ["x", {"k": IN_FILE}]},
                    },
                    "outputs": [{"shape": "torch.Size([1, 2])", "dtype": "torch.int64", "value": []}, "True"],
                }
            ],
        },
        {
            "module_path": "M.blocks.1",
            "inputs": {},
            "outputs": None,
            "children": [
                {"module_path": "M.blocks.1.inner", "inputs": {}, "outputs": None, "error": "ValueError: bad"}
            ],
            "error": 'ValueError: bad "input"',
        },
        {"module_path": "M.never", "inputs": {}, "outputs": None},
    ],
}


def _transformers_writes(tree: dict, tmp_path: Path) -> tuple[str, str]:
    """transformers' own writer (log_model_debug_trace: outputs pruned where there are children, values stripped for
    SUMMARY, json.dump with indent=2) on ``tree``: the FULL_TENSORS and SUMMARY texts."""
    from types import SimpleNamespace

    from transformers.model_debugging_utils import log_model_debug_trace

    model = SimpleNamespace(_call_tree=copy.deepcopy(tree), _debugger_module_dump_name="M")
    log_model_debug_trace(str(tmp_path), model)
    full, summary = (tmp_path / f"M_debug_tree_{kind}.json" for kind in ("FULL_TENSORS", "SUMMARY"))
    return full.read_text(encoding="utf-8"), summary.read_text(encoding="utf-8")


def test_texts_equal_transformers_writer(tmp_path: Path) -> None:
    full, summary = spec_texts(_tree())
    expected_full, expected_summary = _transformers_writes(RECORDED, tmp_path)
    assert full == expected_full
    # SUMMARY strips tensors' values only: transformers also strips a keyword argument that happens to be named value
    assert '"value": "a kwarg named value"' in summary and '"value": "a kwarg named value"' not in expected_summary
    stripped = json.loads(summary)
    del stripped["children"][0]["children"][0]["inputs"]["kwargs"]["value"]
    assert json.dumps(stripped, indent=2) == expected_summary
    assert json.loads(expected_summary) == {  # and by hand: no tensor keeps a value, everything else stays
        "module_path": "M",
        "inputs": {"args": [], "kwargs": {"x": PLAIN}},
        "children": [
            {
                "module_path": "M.blocks.0",
                "inputs": {},
                "children": [
                    {
                        "module_path": "M.blocks.0.proj",
                        "inputs": {
                            "args": [PLAIN, "None", [], {}],
                            "kwargs": {"3": PLAIN, 'é\u2028"q"': ["x", {"k": PLAIN}]},
                        },
                        "outputs": [{"shape": "torch.Size([1, 2])", "dtype": "torch.int64"}, "True"],
                    }
                ],
            },
            {
                "module_path": "M.blocks.1",
                "inputs": {},
                "children": [
                    {"module_path": "M.blocks.1.inner", "inputs": {}, "outputs": None, "error": "ValueError: bad"}
                ],
                "error": 'ValueError: bad "input"',
            },
            {"module_path": "M.never", "inputs": {}, "outputs": None},
        ],
    }


def test_root_without_children_keeps_or_drops_outputs_as_transformers(tmp_path: Path) -> None:
    serialised = {"None": "None", "": "", (): [], None: None}
    for outputs in (_record(), "None", "", (), None):
        root = CallNode(path="L", type_name="Linear", outputs=outputs)
        recorded = {
            "module_path": "L",
            "inputs": {"args": [], "kwargs": {}},
            "outputs": PLAIN if outputs is not None and not isinstance(outputs, (str, tuple)) else serialised[outputs],
            "children": [],
        }
        recorded = {key: value for key, value in recorded.items() if value}  # the root loses its falsy keys
        assert spec_texts(root)[0] == _transformers_writes(recorded, tmp_path)[0], outputs


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
