"""graphtrace's own trace file, ``{Class}_graphtrace.json``: everything the transformers format cannot hold.

The spec files stay byte-compatible with transformers; this file sits beside them and keeps the whole trace
(every step, call indices, module types, capture strategy and fallbacks, numeric statistics, non-finite counts,
data flow, errors), so that ``show``, ``render`` and ``diff`` work on a saved trace without the model. Repr lines
of full values are not repeated here; safetensors file references are.

Non-finite floats are written as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` so that the file stays
standard JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

from graphtrace.errors import TraceFormatError
from graphtrace.io.json_text import escape
from graphtrace.model import (
    SCHEMA_VERSION,
    CallNode,
    DTensorInfo,
    SourceLine,
    Stats,
    StepInfo,
    TensorRecord,
    Trace,
    TraceMeta,
    Value,
)

__all__ = ["FORMAT_NAME", "trace_from_json", "trace_text", "trace_to_json"]

FORMAT_NAME = "graphtrace"
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _float_out(x: float) -> float | str:
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _float_in(x: Any) -> float:
    if isinstance(x, str) and x in _NONFINITE:
        return _NONFINITE[x]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return float(x)
    raise TraceFormatError(f"unreadable number in trace file: {str(x)[:80]!r} is not a number, 'NaN' or 'Infinity'")


def _count(value: Any, what: str) -> int:
    count: int = _typed(value, int, what)
    if count < 0:
        raise TraceFormatError(f"unreadable {what} in trace file: {count} is negative")
    return count


def _sizes(value: Any, what: str) -> tuple[int, ...]:
    """A shape: a list of non-negative ints."""
    sizes = _typed(value, list, what)
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in sizes):
        raise TraceFormatError(f"unreadable {what} in trace file: {str(sizes)[:80]!r}")
    return tuple(sizes)


def _optional(value: Any, kind: type, what: str) -> Any:
    return None if value is None else _typed(value, kind, what)


def _strings(value: Any, what: str) -> tuple[str, ...]:
    """A list of strings (data-flow sources)."""
    items = _typed(value, list, what)
    return tuple(_typed(item, str, what) for item in items)


def _tensor_out(record: TensorRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"shape": list(record.shape), "dtype": record.dtype, "device": record.device}
    if record.stats is not None:
        stats = record.stats
        out["stats"] = [_float_out(stats.mean), _float_out(stats.std), _float_out(stats.min), _float_out(stats.max)]
    if record.spec_stats is not None:
        out["spec_stats"] = list(record.spec_stats)
    if record.nan_count or record.inf_count:
        out["nan"], out["inf"] = record.nan_count, record.inf_count
    if record.file is not None:
        out["file"] = record.file
    if record.dtensor is not None:
        out["dtensor"] = dataclasses.asdict(record.dtensor)
    if record.sketch is not None:
        out["sketch"] = [_float_out(x) for x in record.sketch]
    return out


def _tensor_in(raw: Mapping[str, Any]) -> TensorRecord:
    dtensor = raw.get("dtensor")
    shape = _sizes(raw["shape"], "tensor shape")
    file = raw.get("file")
    if file is not None:
        _typed(file, str, "tensor file")
    stats = raw.get("stats")
    if stats is not None and (not isinstance(stats, list) or len(stats) != 4):
        raise TraceFormatError(f"unreadable tensor statistics in trace file: {str(stats)[:80]!r}")
    sketch = raw.get("sketch")
    if sketch is not None and (not isinstance(sketch, list) or len(sketch) % 2):
        raise TraceFormatError(f"unreadable value fingerprint in trace file: {str(sketch)[:80]!r}")
    spec_stats = raw.get("spec_stats")
    if spec_stats is not None and (
        not isinstance(spec_stats, list) or len(spec_stats) != 4 or not all(isinstance(x, str) for x in spec_stats)
    ):
        raise TraceFormatError(f"unreadable tensor statistics in trace file: {str(spec_stats)[:80]!r}")
    return TensorRecord(
        shape=shape,
        dtype=_typed(raw["dtype"], str, "tensor dtype"),
        device=_typed(raw.get("device", "cpu"), str, "tensor device"),
        stats=Stats(*(_float_in(x) for x in stats)) if stats is not None else None,
        spec_stats=(spec_stats[0], spec_stats[1], spec_stats[2], spec_stats[3]) if spec_stats is not None else None,
        nan_count=_count(raw.get("nan", 0), "NaN count"),
        inf_count=_count(raw.get("inf", 0), "Inf count"),
        file=file,
        sketch=tuple(_float_in(x) for x in sketch) if sketch is not None else None,
        dtensor=_dtensor_in(dtensor) if dtensor else None,
    )


def _dtensor_in(raw: Any) -> DTensorInfo:
    raw = _typed(raw, dict, "DTensor placement")
    return DTensorInfo(
        placements=_typed(raw["placements"], str, "DTensor placements"),
        mesh_shape=_sizes(raw["mesh_shape"], "DTensor mesh shape"),
        global_shape=_sizes(raw["global_shape"], "DTensor global shape"),
    )


def _value_out(value: Value) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, TensorRecord):
        return {"tensor": _tensor_out(value)}
    if isinstance(value, tuple):
        return [_value_out(item) for item in value]
    return {"dict": {str(key): _value_out(item) for key, item in value.items()}}


def _value_in(raw: Any) -> Value:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        return tuple(_value_in(item) for item in raw)
    if isinstance(raw, dict) and "tensor" in raw:
        return _tensor_in(raw["tensor"])
    if isinstance(raw, dict) and "dict" in raw:
        return {key: _value_in(item) for key, item in raw["dict"].items()}
    raise TraceFormatError(f"unreadable value in trace file: {str(raw)[:80]}")


def _node_out(node: CallNode) -> dict[str, Any]:
    out: dict[str, Any] = {
        "path": node.path,
        "index": node.index,
        "type": node.type_name,
        "kind": node.kind,
        "leaf": node.leaf,
        "strategy": node.strategy,
        "args": [_value_out(arg) for arg in node.args],
        "kwargs": {str(key): _value_out(value) for key, value in node.kwargs.items()},
        "outputs": None if node.outputs is None else _value_out(node.outputs),
    }
    if node.error is not None:
        out["error"] = node.error
    if node.inputs_from:
        out["inputs_from"] = list(node.inputs_from)
    if node.source is not None:
        source = node.source
        out["source"] = {"file": source.file, "line": source.line, "function": source.function, "text": source.text}
    out["children"] = [_node_out(child) for child in node.children]
    return out


def _typed(value: Any, kind: type, what: str) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__
        raise TraceFormatError(
            f"unreadable {what} in trace file: {str(value)[:80]!r} is not {'an' if name[0] in 'aeiou' else 'a'} {name}"
        )
    return value


def _node_in(raw: Mapping[str, Any]) -> CallNode:
    kind = raw.get("kind", "module")
    if kind not in ("module", "op"):
        raise TraceFormatError(f"unreadable call kind in trace file: {str(kind)[:80]!r}")
    return CallNode(
        path=_typed(raw["path"], str, "call path"),
        index=_typed(raw.get("index", 0), int, "call index"),
        type_name=_typed(raw.get("type", ""), str, "call type"),
        kind=kind,
        leaf=_typed(raw.get("leaf", True), bool, "leaf flag"),
        strategy=_typed(raw.get("strategy", "eager"), str, "strategy"),
        args=tuple(_value_in(arg) for arg in raw.get("args", ())),
        kwargs={key: _value_in(value) for key, value in raw.get("kwargs", {}).items()},
        outputs=None if raw.get("outputs") is None else _value_in(raw["outputs"]),
        children=tuple(_node_in(child) for child in raw.get("children", ())),
        error=_optional(raw.get("error"), str, "call error"),
        inputs_from=_strings(raw.get("inputs_from", []), "data-flow source"),
        source=_source_in(raw.get("source")),
    )


def _source_in(raw: Any) -> SourceLine | None:
    if raw is None:
        return None
    try:
        return SourceLine(str(raw["file"]), int(raw["line"]), str(raw["function"]), str(raw["text"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"unreadable op source in trace file: {str(raw)[:80]}") from exc


def _step_info_out(info: StepInfo) -> dict[str, Any]:
    # "phase" is derived from cached_tokens; it is written for people reading the file and ignored on reading.
    out: dict[str, Any] = {"phase": info.phase, "cached_tokens": info.cached_tokens, "new_tokens": info.new_tokens}
    if info.cache is not None:
        out["cache"] = _value_out(info.cache)
    return out


def _step_info_in(raw: Mapping[str, Any]) -> StepInfo:
    cache = raw.get("cache")
    cached, new = raw.get("cached_tokens"), raw.get("new_tokens")
    return StepInfo(
        cached_tokens=None if cached is None else _count(cached, "cached token count"),
        new_tokens=None if new is None else _count(new, "new token count"),
        cache=None if cache is None else _value_in(cache),
    )


def trace_to_json(trace: Trace) -> dict[str, Any]:
    """The JSON document of ``trace`` (without repr lines, which live in FULL_TENSORS)."""
    return {**_head_out(trace), "steps": [_node_out(step) for step in trace.steps]}


def _head_out(trace: Trace) -> dict[str, Any]:
    """The document's keys before its steps."""
    return {
        "format": FORMAT_NAME,
        "schema_version": SCHEMA_VERSION,
        "meta": dataclasses.asdict(trace.meta),
        "fallbacks": dict(trace.fallbacks),
        "step_info": [_step_info_out(info) for info in trace.step_info],
        "parameters": dict(trace.parameters),
        "hooks": {path: list(names) for path, names in trace.hooks.items()},
    }


_compact = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode  # C-accelerated: no indent


def trace_text(trace: Trace) -> str:
    """The file text of ``trace``: the document of :func:`trace_to_json` with one call per line, indented by depth.

    Compact JSON per call lets a diff of two files line up call by call. The calls are written as text directly
    (:class:`_CallLines`), each distinct tensor record once: building the document's dicts first and encoding them
    cost more than the capture of a small model."""
    lines = [_compact(_head_out(trace))[:-1] + ',"steps":[']
    calls = _CallLines(lines)
    for i, step in enumerate(trace.steps):
        if i:
            lines[-1] += ","
        calls.node(step, 0)
    lines.append("]}")
    return "\n".join(lines) + "\n"


def _scalar(value: Any) -> str:
    """A leaf value as ``json`` writes it: the common exact types here, anything else by ``_compact`` itself."""
    kind = type(value)
    if kind is str:
        return escape(value)
    if kind is int:
        return int.__repr__(value)
    if kind is bool:
        return "true" if value else "false"
    return _compact(value)


def _floats(values: Any) -> str:
    """A list of statistics as :func:`_float_out` and ``json`` write it.

    ``float.__repr__`` is what json's encoder calls for a float (subclasses included); it refuses anything else,
    and only a non-finite float's text (``nan``, ``inf``) holds an ``n``: both go the general way."""
    try:
        text = ",".join(map(float.__repr__, values))
    except TypeError:
        text = "n"
    if "n" in text:
        return _compact([_float_out(x) for x in values])
    return "[" + text + "]"


class _CallLines:
    """Appends the lines of calls to ``lines``; the text of a tensor record seen again is reused (a layer's output
    is the next layer's input: the same record object in both places, alive while the trace is)."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self._tensors: dict[int, str] = {}

    def node(self, node: CallNode, depth: int) -> None:
        value = self.value
        head = [
            " " * depth,
            '{"path":',
            _scalar(node.path),
            ',"index":',
            _scalar(node.index),
            ',"type":',
            _scalar(node.type_name),
            ',"kind":',
            _scalar(node.kind),
            ',"leaf":',
            _scalar(node.leaf),
            ',"strategy":',
            _scalar(node.strategy),
            ',"args":[',
            ",".join(map(value, node.args)),
            '],"kwargs":',
            self.mapping(node.kwargs),
            ',"outputs":',
            "null" if node.outputs is None else value(node.outputs),
        ]
        if node.error is not None:
            head += (',"error":', _scalar(node.error))
        if node.inputs_from:
            head += (',"inputs_from":[', ",".join(map(_scalar, node.inputs_from)), "]")
        if node.source is not None:
            source = node.source
            head += (',"source":{"file":', _scalar(source.file), ',"line":', _scalar(source.line))
            head += (',"function":', _scalar(source.function), ',"text":', _scalar(source.text), "}")
        lines = self.lines
        if not node.children:
            head.append(',"children":[]}')
            lines.append("".join(head))
            return
        head.append(',"children":[')
        lines.append("".join(head))
        for i, child in enumerate(node.children):
            if i:
                lines[-1] += ","
            self.node(child, depth + 1)
        lines.append(" " * depth + "]}")

    def value(self, value: Value) -> str:
        if isinstance(value, str):
            return escape(value)
        if isinstance(value, TensorRecord):
            text = self._tensors.get(id(value))
            if text is None:
                text = self._tensors[id(value)] = '{"tensor":' + _tensor_text(value) + "}"
            return text
        if isinstance(value, tuple):
            return "[" + ",".join(map(self.value, value)) + "]"
        return '{"dict":' + self.mapping(value) + "}"

    def mapping(self, values: Mapping[Any, Value]) -> str:
        # keys as _value_out makes them: str() of each, a later equal key's value replacing an earlier one's
        texts = {str(key): self.value(item) for key, item in values.items()}
        return "{" + ",".join(escape(key) + ":" + text for key, text in texts.items()) + "}"


def _tensor_text(record: TensorRecord) -> str:
    """``_compact(_tensor_out(record))``, written directly."""
    parts = [
        '{"shape":[',
        ",".join(map(_scalar, record.shape)),
        '],"dtype":',
        _scalar(record.dtype),
        ',"device":',
        _scalar(record.device),
    ]
    stats = record.stats
    if stats is not None:
        parts += (',"stats":', _floats((stats.mean, stats.std, stats.min, stats.max)))
    if record.spec_stats is not None:
        parts += (',"spec_stats":[', ",".join(map(_scalar, record.spec_stats)), "]")
    if record.nan_count or record.inf_count:
        parts += (',"nan":', _scalar(record.nan_count), ',"inf":', _scalar(record.inf_count))
    if record.file is not None:
        parts += (',"file":', _scalar(record.file))
    if record.dtensor is not None:
        parts += (',"dtensor":', _compact(dataclasses.asdict(record.dtensor)))
    if record.sketch is not None:
        parts += (',"sketch":', _floats(record.sketch))
    parts.append("}")
    return "".join(parts)


def trace_from_json(raw: Any, directory: str | None = None) -> Trace:
    """The trace of a document written by :func:`trace_to_json`; ``directory`` is where its files live."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise TraceFormatError("not a graphtrace trace file (its 'format' is not 'graphtrace')")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise TraceFormatError(
            f"trace schema version {version} is not the version this graphtrace reads ({SCHEMA_VERSION}); "
            "install the graphtrace version that wrote it, or capture the trace again."
        )
    try:
        meta = _meta_in(raw["meta"])
        steps = tuple(_node_in(step) for step in _typed(raw["steps"], list, "steps"))
        step_info = tuple(_step_info_in(info) for info in raw.get("step_info", ()))
        fallbacks = _fallbacks_in(raw.get("fallbacks", {}))
        parameters = _parameters_in(raw.get("parameters", {}))
        hooks = _hooks_in(raw.get("hooks", {}))
    except TraceFormatError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceFormatError(f"malformed graphtrace trace file: {type(exc).__name__}: {exc}") from exc
    for step in steps:
        _check_unique_ids(step)
    return Trace(
        steps=steps,
        meta=meta,
        fallbacks=fallbacks,
        directory=directory,
        step_info=step_info,
        parameters=parameters,
        hooks=hooks,
    )


_META_TYPES = {"str": str, "bool": bool, "int": int}


def _meta_in(raw: Any) -> TraceMeta:
    """The trace's metadata, each known field of the type TraceMeta declares (unknown fields, from a later minor
    version, are left out); show and render format them as they are."""
    values = {}
    for field in dataclasses.fields(TraceMeta):
        if field.name in _typed(raw, dict, "trace metadata"):
            values[field.name] = _typed(raw[field.name], _META_TYPES[str(field.type)], f"trace metadata {field.name}")
    return TraceMeta(**values)


def _fallbacks_in(raw: Any) -> dict[str, str]:
    fallbacks = _typed(raw, dict, "fallback reasons")
    return {path: _typed(reason, str, "fallback reason") for path, reason in fallbacks.items()}


def _parameters_in(raw: Any) -> dict[str, int]:
    counts = _typed(raw, dict, "parameter counts")
    return {path: _count(count, "parameter count") for path, count in counts.items()}


def _hooks_in(raw: Any) -> dict[str, tuple[str, ...]]:
    hooks = _typed(raw, dict, "module hooks")
    return {path: _strings(names, "hook name") for path, names in hooks.items()}


def _check_unique_ids(step: CallNode) -> None:
    """Every call of a step has its own id (``path@index``): the call graph and the comparison key calls by it, and
    a call sharing its id with an ancestor would make the graph's nesting a cycle."""
    seen: set[str] = set()
    for node in step.walk():
        if node.id in seen:
            raise TraceFormatError(
                f"malformed graphtrace trace file: the call {node.id[:120]!r} appears twice in one step; each call "
                "of a step has its own path and index."
            )
        seen.add(node.id)
