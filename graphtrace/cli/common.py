"""Pieces shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from graphtrace.errors import GraphvizWarning
from graphtrace.model import Trace

_FILE_ROLES = {
    "_debug_tree_SUMMARY.json": "shapes and statistics of every call (transformers format)",
    "_debug_tree_FULL_TENSORS.json": "the same with tensor values (transformers format)",
    "_graphtrace.json": "graphtrace's own trace, for show / render / diff",
    "_call_graph.svg": "the call graph",
    "_call_graph.dot": "the call graph's Graphviz source",
}


def add_capture_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--values",
        choices=("repr", "safetensors", "bundle", "none"),
        default="repr",
        help="what FULL_TENSORS holds: repr lines (default), one safetensors file per tensor, all tensors in one "
        "safetensors file, or nothing",
    )
    parser.add_argument(
        "--prune-layers", action="store_true", help="keep only the first and last of repeated layer blocks"
    )
    parser.add_argument(
        "--strategy",
        choices=("auto", "fx", "eager"),
        default="auto",
        help="capture through torch.fx where trustworthy (auto), fx only, or forward wrapping only",
    )
    parser.add_argument("--ops", action="store_true", help="also record the ops each module calls, with source lines")
    parser.add_argument(
        "--modules",
        metavar="GLOB",
        action="append",
        default=None,
        help="record only the modules whose path (relative to the model) matches, and what is inside them, e.g. "
        "'model.layers.0' or 'model.layers.*.mlp' (repeatable); the modules around them are kept without values",
    )
    parser.add_argument(
        "--ranks",
        type=parse_ranks,
        default=0,
        metavar="RANKS",
        help="in a torch.distributed job (torchrun; your factory initializes the process group): the rank that "
        "records (default 0), 'all', or a comma-separated list such as 0,1; several ranks write OUTPUT/rank_{r}/",
    )


def parse_ranks(text: str) -> int | str | list[int]:
    """``--ranks``: ``"0"`` -> 0, ``"all"`` -> "all", ``"0,1"`` -> [0, 1]; a single rank stays an int, which writes
    no rank folder."""
    if text.strip() == "all":
        return "all"
    try:
        ranks = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a rank, a comma-separated list of ranks or 'all' (e.g. --ranks 0, --ranks 0,1)"
        ) from None
    return ranks[0] if len(ranks) == 1 else ranks  # capture checks them against the job


def capture_options(args: argparse.Namespace) -> dict[str, object]:
    """The keyword arguments of ``graphtrace.capture`` / ``tracing`` that :func:`add_capture_options` parsed, with
    ``path`` set to ``args.output``."""
    return {
        "path": args.output,
        "values": args.values,
        "prune_layers": args.prune_layers,
        "strategy": args.strategy,
        "ops": args.ops,
        "ranks": args.ranks,
        "modules": args.modules,
    }


def capture_with_options(model: object, inputs: object, args: argparse.Namespace) -> Trace:
    """``graphtrace.capture`` with the options of :func:`add_capture_options`, saving into ``args.output``; a call
    graph that could not be drawn is reported as one line on stderr."""
    from graphtrace.api import capture

    with graph_warnings_reported(args):
        trace: Trace = capture(model, inputs, **capture_options(args))  # type: ignore[call-overload]
        return trace


@contextmanager
def graph_warnings_reported(args: argparse.Namespace) -> Iterator[None]:
    """Saving inside the block reports a call graph that could not be drawn as one line on stderr; every other
    warning (the model's, transformers') is shown as it happens, under the filters in force."""
    with warnings.catch_warnings():  # restores showwarning and the filters on exit
        show = warnings.showwarning

        def show_graphviz_briefly(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
            if issubclass(category, GraphvizWarning):
                print(f"graphtrace {args.command}: warning: {message}", file=sys.stderr)
            else:
                show(message, category, *rest, **kw)

        warnings.showwarning = show_graphviz_briefly
        warnings.simplefilter("always", GraphvizWarning)
        yield


def trace_summary(trace: Trace) -> str:
    """One line: model, forward calls, module calls."""
    calls = sum(1 for node in trace.walk() if node.kind == "module")
    steps = len(trace.steps)
    return f"{trace.meta.model_class} ({steps} forward call{'s' if steps != 1 else ''}, {calls} module calls)"


def _size(path: Path) -> str:
    size = float(path.stat().st_size)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def describe_files(directory: Path) -> str:
    """The trace files in ``directory``, with sizes and what each is for."""
    lines = [f"wrote {directory}/"]
    tensors = sorted(directory.rglob("*.safetensors"))
    for path in sorted(directory.iterdir()):
        role = next((text for suffix, text in _FILE_ROLES.items() if path.name.endswith(suffix)), None)
        if role is not None:
            lines.append(f"  {path.name:<48} {_size(path):>9}  {role}")
    ranks = sorted(path.name for path in directory.glob("rank_*") if path.is_dir())
    if ranks:
        lines.append(f"  {', '.join(name + '/' for name in ranks):<48} {'':>9}  one trace per recording rank")
    steps = sorted(directory.glob("step_*"), key=lambda path: int(path.name.removeprefix("step_")))
    if steps:
        folders = f"{steps[0].name}/ ... {steps[-1].name}/"
        lines.append(f"  {folders:<48} {'':>9}  each forward call's files (transformers format)")
    if tensors:
        total = sum(path.stat().st_size for path in tensors)
        lines.append(f"  {len(tensors)} .safetensors files, {total / 2**20:.1f} MB in all")
    return "\n".join(lines)
