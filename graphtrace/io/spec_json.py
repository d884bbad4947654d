"""The transformers trace format: ``{Class}_debug_tree_FULL_TENSORS.json`` and ``{Class}_debug_tree_SUMMARY.json``.

Writing follows transformers' ``model_addition_debugger_context`` key for key: node keys ``module_path``,
``inputs``, ``outputs``, ``children`` in that order; a submodule drops an empty ``args``/``kwargs`` and an empty
``children``; only leaf modules and the root carry outputs, and every node with children loses its ``outputs``; the
root loses its falsy keys. SUMMARY is FULL without the tensors' ``value`` (a keyword argument that happens to be
named ``value`` stays, unlike in transformers). A call that raised carries an extra ``error`` key. Op records
(``ops=True``) are not part of this format: they live in graphtrace's own file only.

Reading turns such files, written by graphtrace or by transformers, back into :class:`~graphtrace.model.CallNode`\\ s.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphtrace.errors import TraceFormatError
from graphtrace.io.json_text import dumps_key
from graphtrace.io.json_text import escape as _escape
from graphtrace.io.safe_paths import read_json_file, write_atomic
from graphtrace.model import CallNode, Stats, TensorRecord, Value
from graphtrace.reprs import spec_shape

__all__ = [
    "FULL_SUFFIX",
    "SUMMARY_SUFFIX",
    "read_spec_file",
    "spec_file_names",
    "spec_texts",
    "write_spec_files",
]

SUMMARY_SUFFIX = "_debug_tree_SUMMARY.json"
FULL_SUFFIX = "_debug_tree_FULL_TENSORS.json"


def spec_file_names(model_class: str) -> tuple[str, str]:
    """The (FULL_TENSORS, SUMMARY) file names for a model class."""
    return f"{model_class}{FULL_SUFFIX}", f"{model_class}{SUMMARY_SUFFIX}"


# -- writing -------------------------------------------------------------------------------------------------------


def _json_key(key: Any) -> Any:
    # json.dump accepts these key types itself (and converts them as transformers' files show); others become str.
    return key if isinstance(key, (str, int, float, bool)) or key is None else str(key)


def _node_fields(node: CallNode, root: bool) -> list[tuple[str, Any]]:
    """The keys of ``node``'s JSON object in order, with the recorded values they hold (children as CallNodes)."""
    inputs: dict[str, Any] = {}
    if root or node.args:
        inputs["args"] = node.args
    if root or node.kwargs:
        inputs["kwargs"] = node.kwargs
    fields: list[tuple[str, Any]] = [("module_path", node.path), ("inputs", inputs)]
    children = [child for child in node.children if child.kind != "op"]
    if not children:
        outputs = node.outputs if (root or node.leaf) else None
        if not root or outputs:  # the root drops falsy keys (a recorded value is falsy exactly when its JSON is)
            fields.append(("outputs", outputs))
    if children:
        fields.append(("children", children))
    if node.error is not None:
        fields.append(("error", node.error))
    return fields


def spec_texts(step: CallNode) -> tuple[str, str]:
    """The FULL_TENSORS and SUMMARY texts of one top-level call, as transformers' ``json.dump(tree, indent=2)`` writes
    them, produced together (SUMMARY is FULL_TENSORS without the tensors' values, at the same indentation)."""
    writer = _SpecWriter()
    writer.node(step, 0, True)
    chunks = writer.chunks
    full = "".join(chunks)
    for start, end in writer.values:  # blanked in place: deleting slices would shift the rest each time
        chunks[start:end] = [""] * (end - start)
    return full, "".join(chunks)


class _SpecWriter:
    """Emits the spec JSON of a call tree as text chunks, remembering where each tensor's ``value`` item lies."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.values: list[tuple[int, int]] = []
        self.newline = _Breaks().__getitem__  # a line break and the indentation of a level
        self._tensors: dict[tuple[int, int], tuple[str, str | None, str]] = {}

    def node(self, node: CallNode, level: int, root: bool) -> None:
        append = self.chunks.append
        inner = self.newline(level + 1)
        first = "{"
        for key, value in _node_fields(node, root):
            append(first + inner + '"' + key + '": ')
            first = ","
            if key == "inputs":
                self.inputs(value, level + 1)
            elif key == "children":
                deeper = self.newline(level + 2)
                for i, child in enumerate(value):
                    append(("[" if i == 0 else ",") + deeper)
                    self.node(child, level + 2, False)
                append(inner + "]")
            elif key == "outputs":
                self.value(value, level + 1)
            else:
                append(_escape(value))
        append(self.newline(level) + "}")

    def inputs(self, inputs: dict[str, Any], level: int) -> None:
        if not inputs:
            self.chunks.append("{}")
            return
        inner = self.newline(level + 1)
        first = "{"
        for key, value in inputs.items():
            self.chunks.append(first + inner + '"' + key + '": ')
            first = ","
            self.value(value if key == "kwargs" else tuple(value), level + 1)
        self.chunks.append(self.newline(level) + "}")

    def value(self, value: Any, level: int) -> None:
        append = self.chunks.append
        if type(value) is TensorRecord:
            self.tensor(value, level)
        elif isinstance(value, str):
            append(_escape(value))
        elif value is None:
            append("null")
        elif isinstance(value, tuple):
            if not value:
                append("[]")
                return
            inner = self.newline(level + 1)
            for i, item in enumerate(value):
                append(("[" if i == 0 else ",") + inner)
                self.value(item, level + 1)
            append(self.newline(level) + "]")
        elif isinstance(value, TensorRecord):
            self.tensor(value, level)
        else:
            if not value:
                append("{}")
                return
            inner = self.newline(level + 1)
            first = "{"
            for key, item in value.items():
                append(first + inner + _json_key_text(key) + ": ")
                first = ","
                self.value(item, level + 1)
            append(self.newline(level) + "}")

    def tensor(self, record: TensorRecord, level: int) -> None:
        # A tensor passed from call to call is the same record in each place; at the same depth, the same text.
        key = (id(record), level)
        texts = self._tensors.get(key)
        if texts is None:
            texts = self._tensors[key] = self._tensor_texts(record, level)
        head, value, tail = texts
        chunks = self.chunks
        chunks.append(head)
        if value is not None:
            self.values.append((len(chunks), len(chunks) + 1))
            chunks.append(value)
        chunks.append(tail)

    def _tensor_texts(self, record: TensorRecord, level: int) -> tuple[str, str | None, str]:
        """The text of a tensor entry: before its ``value`` item, the item (None without a value), after it."""
        inner = self.newline(level + 1)
        head = f'{{{inner}"shape": "{spec_shape(record.shape)}",{inner}"dtype": {_escape(record.dtype)}'
        value = None
        if record.value is not None:
            lines = self.newline(level + 2)
            text = f"[{lines}{(',' + lines).join(map(_escape, record.value))}{inner}]" if record.value else "[]"
            value = f',{inner}"value": {text}'
        elif record.file is not None:
            value = f',{inner}"value": {_escape(record.file)}'
        tail = self.newline(level) + "}"
        if record.spec_stats is not None:
            mean, std, low, high = map(_escape, record.spec_stats)
            tail = f',{inner}"mean": {mean},{inner}"std": {std},{inner}"min": {low},{inner}"max": {high}{tail}'
        return head, value, tail


class _Breaks(dict[int, str]):
    """``"\\n"`` and two spaces per level, made once per level."""

    def __missing__(self, level: int) -> str:
        text = self[level] = "\n" + "  " * level
        return text


def _json_key_text(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it."""
    return dumps_key(_json_key(key))


def write_spec_files(step: CallNode, directory: str | os.PathLike[str], model_class: str) -> list[Path]:
    """Write FULL_TENSORS then SUMMARY for one top-level call into ``directory``; returns both paths."""
    written = []
    for name, text in zip(spec_file_names(model_class), spec_texts(step)):
        written.append(write_atomic(Path(directory) / name, text))
    return written


# -- reading -------------------------------------------------------------------------------------------------------

_SHAPE = re.compile(r"^torch\.Size\(\[([0-9, ]*)\]\)$")
_SCALAR = re.compile(r"^(?:Parameter containing:\s*)?tensor\(\s*([^,)\s]+)")


def _parse_scalar(text: str) -> float:
    match = _SCALAR.match(text)
    if not match:
        return math.nan
    try:
        return float(match.group(1))
    except ValueError:
        return math.nan


def _is_tensor_entry(value: Mapping[str, Any]) -> bool:
    shape = value.get("shape")
    return isinstance(shape, str) and "dtype" in value and bool(_SHAPE.match(shape))


def _tensor_from_spec(value: Mapping[str, Any]) -> TensorRecord:
    match = _SHAPE.match(value["shape"])
    assert match is not None
    dims = tuple(int(d) for d in match.group(1).split(",") if d.strip())
    spec_stats = None
    stats = None
    nan_count = inf_count = 0
    if all(key in value for key in ("mean", "std", "min", "max")):
        spec_stats = (value["mean"], value["std"], value["min"], value["max"])
        stats = Stats(*(_parse_scalar(text) for text in spec_stats))
        # The format keeps no counts: a NaN/Inf extreme proves at least one such element.
        nan_count = int(math.isnan(stats.min) or math.isnan(stats.max) or math.isnan(stats.mean))
        inf_count = int(math.isinf(stats.min) or math.isinf(stats.max))
    raw = value.get("value")
    return TensorRecord(
        shape=dims,
        dtype=str(value["dtype"]),
        stats=stats,
        spec_stats=spec_stats,
        nan_count=nan_count,
        inf_count=inf_count,
        value=tuple(raw) if isinstance(raw, list) else None,
        file=raw if isinstance(raw, str) else None,
    )


def _value_from_spec(value: Any) -> Value:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return tuple(_value_from_spec(item) for item in value)
    if isinstance(value, dict):
        if _is_tensor_entry(value):
            return _tensor_from_spec(value)
        return {key: _value_from_spec(item) for key, item in value.items()}
    return json.dumps(value)  # numbers or null where a writer put them directly


def _node_from_spec(raw: Mapping[str, Any], counts: dict[str, int]) -> CallNode:
    path = raw.get("module_path")
    if not isinstance(path, str):
        raise TraceFormatError(f"a node has no 'module_path' string (keys: {sorted(raw)}); is this a trace file?")
    index = counts.get(path, 0)
    counts[path] = index + 1
    inputs = raw.get("inputs") or {}
    children = tuple(_node_from_spec(child, counts) for child in raw.get("children") or ())
    outputs = raw.get("outputs")
    error = raw.get("error")
    if error is not None and not isinstance(error, str):
        raise TraceFormatError(f"the node {path[:120]!r} has an 'error' that is not a string: {str(error)[:80]!r}")
    return CallNode(
        path=path,
        index=index,
        leaf=not children,
        args=tuple(_value_from_spec(arg) for arg in inputs.get("args", ())),
        kwargs={key: _value_from_spec(v) for key, v in (inputs.get("kwargs") or {}).items()},
        outputs=None if outputs is None else _value_from_spec(outputs),
        children=children,
        error=error,
    )


def read_spec_file(path: str | os.PathLike[str]) -> CallNode:
    """The call tree of a SUMMARY or FULL_TENSORS file (graphtrace's or transformers')."""
    raw = read_json_file(path)
    if not isinstance(raw, dict):
        raise TraceFormatError(f"{path} does not hold a call tree (its top level is a {type(raw).__name__})")
    return _node_from_spec(raw, {})
