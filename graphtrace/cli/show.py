"""``graphtrace show TRACE``: the call tree of a saved trace in the terminal (drawn by
:mod:`graphtrace.render.text_tree`, as ``Trace.show()`` draws it).

Printed through rich: colours on a terminal (none when ``NO_COLOR`` is set, https://no-color.org; rich also honours
``FORCE_COLOR``), plain text with the same lines for pipes and files; lines are never wrapped or cut by rich.
"""

from __future__ import annotations

import argparse

from rich.text import Text

from graphtrace.render.text_tree import LINE_WIDTH, console, head_line, trace_lines

__all__ = ["LINE_WIDTH", "add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "show",
        help="print the call tree of a saved trace",
        description="Print the call tree of a trace directory written by graphtrace or by transformers: each call's "
        "output shape, statistics (mean, std, min, max) and parameter count; identical repeated blocks folded "
        "(the first shown with its calls, the others one line each).",
    )
    parser.add_argument("trace", metavar="TRACE", help="trace directory (or one of its JSON files)")
    parser.add_argument("--depth", type=int, default=None, help="show calls down to this depth (root = 0)")
    parser.add_argument("--step", type=int, default=None, help="show only this top-level call (default: all)")
    parser.add_argument(
        "--focus",
        metavar="PATH",
        default=None,
        help="show only this call and what it calls, e.g. model.layers.3.mlp (add @N for its N-th call)",
    )
    parser.add_argument(
        "--paths", action="store_true", help="name each call by its path relative to the model (for grep)"
    )
    parser.add_argument("--unfold", action="store_true", help="show every repeated block with its calls")
    parser.add_argument(
        "--why", action="store_true", help="add the technical reason wherever torch.fx did not serve a call"
    )
    parser.add_argument(
        "--ops", action="store_true", help="list each module's op records with their source lines (folded by default)"
    )
    parser.add_argument(
        "--nonfinite",
        action="store_true",
        help="name the first call whose output holds NaN or Inf while its inputs are finite, instead of the tree",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from graphtrace.io import load_trace

    trace = load_trace(args.trace)
    out = console()
    if args.nonfinite:
        from graphtrace.compare.nonfinite import describe_nonfinite

        out.print(head_line(trace))
        out.print(Text(describe_nonfinite(trace)))
        return 0
    options = {"step": args.step, "depth": args.depth, "focus": args.focus, "unfold": args.unfold}
    for line in trace_lines(trace, ops=args.ops, paths=args.paths, why=args.why, **options):
        out.print(line)
    return 0
