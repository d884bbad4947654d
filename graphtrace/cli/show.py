"""``graphtrace show TRACE``: the call tree of a saved trace in the terminal.

Printed through rich: colours on a terminal (none when ``NO_COLOR`` is set, https://no-color.org; rich also honours
``FORCE_COLOR``), plain text with the same lines for pipes and files; lines are never wrapped or cut by rich.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from graphtrace.model import CallNode, StepInfo, TensorRecord, Trace, Value, iter_tensors

LINE_WIDTH = 1_000_000
"""rich's width for the tree: wide enough that no line is ever cut or wrapped by rich itself."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "show",
        help="print the call tree of a saved trace",
        description="Print the call tree of a trace directory written by graphtrace or by transformers.",
    )
    parser.add_argument("trace", metavar="TRACE", help="trace directory (or one of its JSON files)")
    parser.add_argument("--depth", type=int, default=None, help="show calls down to this depth (root = 0)")
    parser.add_argument("--step", type=int, default=None, help="show only this top-level call (default: all)")
    parser.add_argument(
        "--ops", action="store_true", help="list each module's op records with their source lines (folded by default)"
    )
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


def _markers(node: CallNode, trace: Trace) -> list[tuple[str, str]]:
    """``(text, style)`` of each mark a call carries."""
    marks = []
    tensor = _first_tensor(node.outputs)
    if tensor is not None and tensor.stats is not None:
        marks.append((f"mean {tensor.stats.mean:.3g} std {tensor.stats.std:.3g}", "dim"))
    bad = [r for _, r in node.output_tensors() if not r.is_finite]
    if bad:
        nan, inf = sum(r.nan_count for r in bad), sum(r.inf_count for r in bad)
        marks.append((f"NON-FINITE (nan {nan}, inf {inf})", "bold red"))
    reason = trace.fallbacks.get(node.path)
    if reason is not None and node.kind == "module":
        marks.append((f"eager: {reason}", "yellow"))
    if node.error is not None:
        marks.append((f"RAISED {node.error}", "bold red"))
    return marks


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


def _label(call: CallNode, trace: Trace, root: bool) -> Text:
    label = Text(no_wrap=True, overflow="ignore")
    name = call.path if root else call.name
    label.append(name + (f" #{call.index + 1}" if call.index else ""), style="bold" if call.children else "")
    if call.type_name:
        label.append(f" ({call.type_name})", style="cyan")
    outputs = describe_value(call.outputs)
    if outputs:
        label.append(f" -> {outputs}", style="blue")
    if call.source is not None:
        label.append(f"  {call.source}", style="dim")
    for text, style in _markers(call, trace):
        label.append("  ")
        label.append(text, style=style)
    return label


def call_tree(trace: Trace, node: CallNode, depth: int | None, ops: bool = False) -> Tree:
    """``node``'s subtree as a rich Tree, cut at ``depth`` (the calls below counted). A module's op records are
    folded into one line (how many, of which kinds) unless ``ops``; listed, each shows the line that called it."""
    tree = Tree(_label(node, trace, True), guide_style="dim")
    stack = [(node, tree, 0)]
    while stack:
        call, branch, level = stack.pop()
        if depth is not None and level >= depth:
            if call.children:
                below = sum(1 for _ in call.walk()) - 1
                branch.add(Text(f"... {below} calls below", style="dim", no_wrap=True, overflow="ignore"))
            continue
        children = call.children if ops else tuple(child for child in call.children if child.kind != "op")
        added = [(child, branch.add(_label(child, trace, False)), level + 1) for child in children]
        folded = len(call.children) - len(children)
        if folded:
            kinds = dict.fromkeys(child.name for child in call.children if child.kind == "op")
            names = ", ".join(list(kinds)[:6]) + (", ..." if len(kinds) > 6 else "")
            line = f"· {folded} op{'s' if folded > 1 else ''} ({names}); --ops lists them"
            branch.add(Text(line, style="dim", no_wrap=True, overflow="ignore"))
        stack.extend(reversed(added))
    return tree


def console(stream: TextIO | None = None) -> Console:
    """A console for ``stream`` (stdout): colours on a terminal unless NO_COLOR. Lines are never cut at the
    console's width: a terminal wraps them, as it wraps any long line."""
    return Console(file=stream or sys.stdout, markup=False, highlight=False, soft_wrap=True, width=LINE_WIDTH)


def run(args: argparse.Namespace) -> int:
    from graphtrace.io import load_trace

    trace = load_trace(args.trace)
    out = console()
    calls = sum(1 for _ in trace.walk())
    meta = trace.meta
    rank = f"rank {meta.rank} of {meta.world_size}, " if meta.world_size > 1 else ""
    head = f"{meta.model_class}: {rank}{len(trace.steps)} forward call(s), {calls} calls, captured with {meta.strategy}"
    out.print(Text(head, style="bold"))
    if args.nonfinite:
        from graphtrace.compare.nonfinite import describe_nonfinite

        out.print(Text(describe_nonfinite(trace)))
        return 0
    out.print(Text(f"coverage: {trace.coverage()}"))
    steps = list(enumerate(trace.steps))
    if args.step is not None:
        steps = [steps[args.step]]
    for number, step in steps:
        about = describe_step(trace.step_info[number]) if number < len(trace.step_info) else ""
        if len(trace.steps) > 1 or about:
            out.print(Text(f"step {number}:" + (f" {about}" if about else ""), style="bold"))
        out.print(call_tree(trace, step, args.depth, args.ops))
    return 0
