"""``graphtrace view TRACE``: the trace as one self-contained HTML page (call tree, tensors, clickable call graph)."""

from __future__ import annotations

import argparse
from pathlib import Path

from graphtrace.render import DEFAULT_MAX_BOXES

PAGE_SUFFIX = "_trace.html"
"""``graphtrace view`` writes ``TRACE/{Class}_trace.html`` unless told otherwise."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "view",
        help="write a saved trace as one HTML page to explore in a browser",
        description=(
            "Write a trace directory (graphtrace's or transformers') as one self-contained HTML page: the call tree "
            "(collapsible, identical repeated blocks folded, search by path), each call's inputs and outputs with "
            "their statistics, and the call graph, whose boxes select their calls. The page needs no network and "
            "opens from the file system. Needs Graphviz's dot for the graph; without it the page says so."
        ),
    )
    parser.add_argument("trace", metavar="TRACE", help="trace directory (or one of its JSON files)")
    parser.add_argument(
        "-o", "--output", default=None, help=f"the page to write (default: TRACE/{{Class}}{PAGE_SUFFIX})"
    )
    parser.add_argument(
        "--max-boxes",
        type=int,
        default=DEFAULT_MAX_BOXES,
        help=f"box budget of the call graph (default: {DEFAULT_MAX_BOXES}; 0: no budget)",
    )
    parser.add_argument("--no-graph", action="store_true", help="leave the call graph out (no Graphviz needed)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from graphtrace.io import load_trace
    from graphtrace.render.html import write_html

    trace = load_trace(args.trace)
    assert trace.directory is not None
    output = Path(args.output) if args.output else Path(trace.directory) / f"{trace.meta.model_class}{PAGE_SUFFIX}"
    written = write_html(trace, output, graph=not args.no_graph, max_boxes=args.max_boxes or None)
    calls = sum(1 for _ in trace.walk())
    print(f"graphtrace view: {calls} calls, {written.stat().st_size / 1024:.0f} KB")
    print(f"wrote {written}")
    return 0
