"""``graphtrace show TRACE``: the call tree of a saved trace in the terminal."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from graphtrace.model import CallNode, StepInfo, TensorRecord, Trace, Value, iter_tensors


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "show",
        help="print the call tree of a saved trace",
        description="Print the call tree of a trace directory written by graphtrace or by transformers.",
    )
    parser.add_argument("trace", metavar="TRACE", help="trace directory (or one of its JSON files)")
    parser.add_argument("--depth", type=int, default=None, help="show calls down to this depth (root = 0)")
    parser.add_argument("--step", type=int, default=None, help="show only this top-level call (default: all)")
    parser.add_argument(
        "--nonfinite",
        action="store_true",
        help="name the first call whose output holds NaN or Inf while its inputs are finite, instead of the tree",
    )
    parser.set_defaults(run=run)


def describe_value(value: Value | None, limit: int = 3) -> str:
    """Shapes and dtypes of the tensors in ``value``: ``[1, 12, 64] float32``."""
    if value is None:
        return ""
    if isinstance(value, TensorRecord):
        text = f"[{', '.join(map(str, value.shape))}] {value.dtype.removeprefix('torch.')}"
        if value.dtensor is not None:
            placements = value.dtensor.placements.removeprefix("(").removesuffix(")").rstrip(",")
            text += f" (local shard of {list(value.dtensor.global_shape)}: {placements})"
        return text
    if isinstance(value, str):
        return value if len(value) <= 24 else value[:21] + "..."
    items = list(value) if isinstance(value, tuple) else list(value.values())
    parts = [describe_value(item, limit) for item in items[:limit]]
    more = ", ..." if len(items) > limit else ""
    return f"({', '.join(parts)}{more})"


def _first_tensor(value: Value | None) -> TensorRecord | None:
    if isinstance(value, TensorRecord):
        return value
    if isinstance(value, tuple):
        items = list(value)
    elif isinstance(value, dict):
        items = list(value.values())
    else:
        return None
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


def _markers(node: CallNode, trace: Trace) -> str:
    marks = []
    tensor = _first_tensor(node.outputs)
    if tensor is not None and tensor.stats is not None:
        marks.append(f"mean {tensor.stats.mean:.3g} std {tensor.stats.std:.3g}")
    bad = [r for _, r in node.output_tensors() if not r.is_finite]
    if bad:
        marks.append(f"NON-FINITE (nan {sum(r.nan_count for r in bad)}, inf {sum(r.inf_count for r in bad)})")
    reason = trace.fallbacks.get(node.path)
    if reason is not None and node.kind == "module":
        marks.append(f"eager: {reason}")
    if node.error is not None:
        marks.append(f"RAISED {node.error}")
    return "  ".join(marks)


def describe_step(info: StepInfo) -> str:
    """What a step did to its key/value cache: ``decode, 1 token after 7 cached; DynamicCache after: 6 x [1, 2, 8, 8]
    float32``; empty for a step without a cache."""
    if info.phase == "forward":
        return ""
    tokens = "" if info.new_tokens is None else f", {info.new_tokens} token{'s' if info.new_tokens != 1 else ''}"
    where = f" after {info.cached_tokens} cached" if info.phase == "decode" else " into an empty cache"
    text = f"{info.phase}{tokens}{where}"
    if isinstance(info.cache, dict):
        groups: dict[str, int] = {}
        records = [record for _, record in iter_tensors(info.cache)]
        for record in records:
            key = f"[{', '.join(map(str, record.shape))}] {record.dtype.removeprefix('torch.')}"
            groups[key] = groups.get(key, 0) + 1
        held = ", ".join(f"{count} x {key}" for key, count in groups.items()) or "empty"
        bad = sum(not record.is_finite for record in records)
        text += f"; {info.cache.get('type', 'cache')} after: {held}" + (f", {bad} NON-FINITE" if bad else "")
    return text


def tree_lines(trace: Trace, node: CallNode, depth: int | None) -> Iterator[str]:
    """The lines of ``node``'s subtree, box-drawn."""

    def visit(call: CallNode, prefix: str, last: bool, level: int) -> Iterator[str]:
        connector = "" if level == 0 else ("└─ " if last else "├─ ")
        label = call.path if level == 0 else call.name
        if call.index:
            label += f" #{call.index + 1}"
        kind = f" ({call.type_name})" if call.type_name else ""
        outputs = describe_value(call.outputs)
        arrow = f" -> {outputs}" if outputs else ""
        marks = _markers(call, trace)
        yield f"{prefix}{connector}{label}{kind}{arrow}" + (f"  {marks}" if marks else "")
        if depth is not None and level >= depth:
            if call.children:
                child_prefix = prefix + ("" if level == 0 else ("   " if last else "│  "))
                yield f"{child_prefix}└─ ... {sum(1 for _ in call.walk()) - 1} calls below"
            return
        child_prefix = prefix + ("" if level == 0 else ("   " if last else "│  "))
        for i, child in enumerate(call.children):
            yield from visit(child, child_prefix, i == len(call.children) - 1, level + 1)

    yield from visit(node, "", True, 0)


def run(args: argparse.Namespace) -> int:
    from graphtrace.io import load_trace

    trace = load_trace(args.trace)
    calls = sum(1 for _ in trace.walk())
    meta = trace.meta
    rank = f"rank {meta.rank} of {meta.world_size}, " if meta.world_size > 1 else ""
    print(f"{meta.model_class}: {rank}{len(trace.steps)} forward call(s), {calls} calls, captured with {meta.strategy}")
    if args.nonfinite:
        from graphtrace.compare.nonfinite import describe_nonfinite

        print(describe_nonfinite(trace))
        return 0
    print(f"coverage: {trace.coverage()}")
    steps = list(enumerate(trace.steps))
    if args.step is not None:
        steps = [steps[args.step]]
    for number, step in steps:
        about = describe_step(trace.step_info[number]) if number < len(trace.step_info) else ""
        if len(trace.steps) > 1 or about:
            print(f"step {number}:" + (f" {about}" if about else ""))
        for line in tree_lines(trace, step, args.depth):
            print(line)
    return 0
