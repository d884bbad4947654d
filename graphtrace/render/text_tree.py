"""A trace's call tree as text for a terminal: what ``graphtrace show`` and ``Trace.show()`` print.

Each call is one line: its name, module type, output shapes, statistics (mean, std, min, max), parameter count and
marks (NaN/Inf, an error, hooks, and in a porter's words why torch.fx did not serve it: ``recorded by wrapping
forward: the model passes a cache object``, the technical reason with ``why``). Repeated blocks fold as the call
graph and the explorer fold them (:class:`~graphtrace.render.graph._Folder`): the first block of a run of identical
ones is shown with its calls, the others as one line each, so that a 24-layer model prints about 40 lines and still
shows every layer's statistics. The lines are rich Text, never wrapped or cut by rich (a terminal wraps a long line
as it wraps any other).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO, TypedDict, Unpack

from rich.console import Console, RenderableType
from rich.text import Text
from rich.tree import Tree

from graphtrace.errors import CallNotFoundError, InvalidOptionError
from graphtrace.model import (
    WRAPPED,
    CallNode,
    StepInfo,
    TensorRecord,
    Trace,
    Value,
    fallback_in_words,
    iter_tensors,
    locate,
)
from graphtrace.render.graph import _Folder

__all__ = [
    "LINE_WIDTH",
    "ShowOptions",
    "call_tree",
    "console",
    "describe_step",
    "describe_value",
    "head_line",
    "print_trace",
    "trace_lines",
]

LINE_WIDTH = 1_000_000
"""rich's width for the tree: wide enough that no line is ever cut or wrapped by rich itself."""


def describe_value(value: Value | None, limit: int = 3) -> str:
    """Shapes and dtypes of the tensors in ``value``: ``[1, 12, 64] float32``."""
    if value is None:
        return ""
    if isinstance(value, TensorRecord):
        text = value.brief()
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
            groups[record.brief()] = groups.get(record.brief(), 0) + 1
        held = ", ".join(f"{count} x {key}" for key, count in groups.items()) or "empty"
        bad = sum(not record.is_finite for record in records)
        text += f"; {info.cache.get('type', 'cache')} after: {held}" + (f", {bad} NON-FINITE" if bad else "")
    return text


def _first_tensor(value: Value | None) -> TensorRecord | None:
    return next((record for _, record in iter_tensors(value)), None)


def _markers(node: CallNode, trace: Trace, why: bool) -> list[tuple[str, str]]:
    """``(text, style)`` of each mark a call carries; with ``why``, a fallback's technical reason beside its words."""
    marks = []
    tensor = _first_tensor(node.outputs)
    if tensor is not None and tensor.stats is not None:
        stats = tensor.stats
        marks.append((f"mean {stats.mean:.3g} std {stats.std:.3g} min {stats.min:.3g} max {stats.max:.3g}", "dim"))
    parameters = trace.parameters.get(node.path) if node.kind == "module" else None
    if parameters:
        marks.append((f"{parameters:,} params", "dim"))
    bad = [r for _, r in node.output_tensors() if not r.is_finite]
    if bad:
        nan, inf = sum(r.nan_count for r in bad), sum(r.inf_count for r in bad)
        marks.append((f"NON-FINITE (nan {nan}, inf {inf})", "bold red"))
    hooks = trace.hooks.get(node.path) if node.kind == "module" else None
    if hooks:
        marks.append((f"hooks: {', '.join(hooks)}", "magenta"))
    reason = trace.fallbacks.get(node.path)
    if reason is not None and node.kind == "module":
        words = fallback_in_words(reason, hooks=node.path in trace.hooks)
        marks.append((f"{WRAPPED}: {words}" + (f" (why: {reason})" if why else ""), "dim"))
    if node.error is not None:
        marks.append((f"RAISED {node.error}", "bold red"))
    return marks


def _name(call: CallNode, root: bool, paths: bool) -> str:
    if root:
        return call.path
    if paths and call.kind == "module":
        return call.path.partition(".")[2] or call.path
    return call.name


def _label(call: CallNode, trace: Trace, *, root: bool, paths: bool, why: bool, folded: str = "") -> Text:
    label = Text(no_wrap=True, overflow="ignore")
    name = _name(call, root, paths)
    label.append(name + (f" #{call.index + 1}" if call.index else ""), style="bold" if call.children else "")
    if call.type_name:
        label.append(f" ({call.type_name})", style="cyan")
    outputs = describe_value(call.outputs)
    if outputs:
        label.append(f" -> {outputs}", style="blue")
    if call.source is not None:
        label.append(f"  {call.source}", style="dim")
    for text, style in _markers(call, trace, why):
        label.append("  ")
        label.append(text, style=style)
    if folded:
        label.append(f"  {folded}", style="dim")
    return label


def _dim(text: str) -> Text:
    return Text(text, style="dim", no_wrap=True, overflow="ignore")


def call_tree(
    trace: Trace,
    node: CallNode,
    depth: int | None = None,
    ops: bool = False,
    unfold: bool = False,
    paths: bool = False,
    why: bool = False,
) -> Tree:
    """``node``'s subtree as a rich Tree, cut at ``depth`` (the calls below counted). Runs of identical repeated
    blocks fold unless ``unfold``: the first block is shown with its calls, the others as one line each. A
    module's op records are folded into one line (how many, of which kinds) unless ``ops``; listed, each shows the
    line that called it. ``paths`` names each module call by its path relative to the model (what a grep for a
    path finds) instead of its short name; ``why`` adds each fallback's technical reason to its words."""
    folder = _Folder(trace.fallbacks, enabled=not unfold)
    tree = Tree(_label(node, trace, root=True, paths=paths, why=why), guide_style="dim")
    stack: list[tuple[CallNode, Tree, int]] = [(node, tree, 0)]
    while stack:
        call, branch, level = stack.pop()
        if depth is not None and level >= depth:
            if call.children:
                branch.add(_dim(f"... {sum(1 for _ in call.walk()) - 1} calls below"))
            continue
        children = call.children if ops else tuple(child for child in call.children if child.kind != "op")
        added = []
        for start, stop in folder.runs(children):
            first = children[start]
            for position in range(start, stop):
                child = children[position]
                note = ""
                if stop - start > 1 and position == start:
                    note = f"(first of {stop - start} identical blocks; --unfold shows the others' calls)"
                elif position > start:
                    inside = sum(1 for _ in child.walk()) - 1
                    note = f"({inside} calls inside, as in {_name(first, False, paths)})" if inside else ""
                twig = branch.add(_label(child, trace, root=False, paths=paths, why=why, folded=note))
                if position == start:
                    added.append((child, twig, level + 1))
        folded = len(call.children) - len(children)
        if folded:
            kinds = dict.fromkeys(child.name for child in call.children if child.kind == "op")
            names = ", ".join(list(kinds)[:6]) + (", ..." if len(kinds) > 6 else "")
            branch.add(_dim(f"· {folded} op{'s' if folded > 1 else ''} ({names}); --ops lists them"))
        stack.extend(reversed(added))
    return tree


def _steps(trace: Trace, step: int | None) -> list[int]:
    count = len(trace.steps)
    if step is None:
        return list(range(count))
    if isinstance(step, bool) or not isinstance(step, int) or not -count <= step < count:
        raise InvalidOptionError(
            f"step {step!r} does not exist: the trace has {count} forward call(s), numbered 0..{count - 1}. "
            "Leave the step out to show them all."
        )
    return [step % count]


def _focused(trace: Trace, numbers: Sequence[int], focus: str) -> list[tuple[int, CallNode]]:
    """The call ``focus`` names in each of the steps ``numbers`` that has it; an error naming the closest paths when
    none has it."""
    found, missing = [], None
    for number in numbers:
        try:
            found.append((number, locate(trace.steps[number], focus)))
        except CallNotFoundError as exc:
            missing = exc
    if not found and missing is not None:
        raise InvalidOptionError(f"focus {focus!r}: {missing.detail}")
    return found


def head_line(trace: Trace) -> Text:
    """``LlamaForCausalLM: 1 forward call(s), 45 calls, captured with auto``."""
    calls = sum(1 for _ in trace.walk())
    meta = trace.meta
    rank = f"rank {meta.rank} of {meta.world_size}, " if meta.world_size > 1 else ""
    head = f"{meta.model_class}: {rank}{len(trace.steps)} forward call(s), {calls} calls, captured with {meta.strategy}"
    return Text(head, style="bold")


def trace_lines(
    trace: Trace,
    *,
    step: int | None = None,
    depth: int | None = None,
    focus: str | None = None,
    ops: bool = False,
    unfold: bool = False,
    paths: bool = False,
    why: bool = False,
) -> list[RenderableType]:
    """What ``graphtrace show`` prints: a head line (model, calls, strategy), fx coverage in words (with ``why``,
    also its technical reasons), then the tree of each step (or of the call ``focus`` names in it), as
    :func:`call_tree` draws them."""
    coverage = trace.coverage()
    lines: list[RenderableType] = [head_line(trace), Text(f"coverage: {coverage.in_words()}")]
    if why and coverage.eager:
        lines.append(Text(f"why: {coverage.summary()}", style="dim"))
    numbers = _steps(trace, step)
    roots = _focused(trace, numbers, focus) if focus is not None else [(n, trace.steps[n]) for n in numbers]
    for number, root in roots:
        about = describe_step(trace.step_info[number]) if number < len(trace.step_info) else ""
        if len(trace.steps) > 1 or about:
            lines.append(Text(f"step {number}:" + (f" {about}" if about else ""), style="bold"))
        lines.append(call_tree(trace, root, depth, ops, unfold, paths, why))
    return lines


def console(stream: TextIO | None = None) -> Console:
    """A console for ``stream`` (stdout): colours on a terminal unless NO_COLOR. Lines are never cut at the
    console's width: a terminal wraps them, as it wraps any long line."""
    return Console(file=stream or sys.stdout, markup=False, highlight=False, soft_wrap=True, width=LINE_WIDTH)


class ShowOptions(TypedDict, total=False):
    """The options of :func:`trace_lines`, as ``Trace.show()`` passes them on."""

    step: int | None
    depth: int | None
    focus: str | None
    ops: bool
    unfold: bool
    paths: bool
    why: bool


def print_trace(trace: Trace, *, file: TextIO | None = None, **options: Unpack[ShowOptions]) -> None:
    """Print :func:`trace_lines` to ``file``, stdout by default: ``Trace.show()``."""
    out = console(file)
    for line in trace_lines(trace, **options):
        out.print(line)
