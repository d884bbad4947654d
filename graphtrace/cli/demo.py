"""``graphtrace demo``: trace the built-in demo transformer and say where the files are."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from graphtrace.cli.common import add_capture_options, capture_with_options, describe_files, trace_summary

DEFAULT_DIRECTORY = "graphtrace-demo"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="trace the built-in demo transformer (no download) into ./graphtrace-demo/",
        description="Trace graphtrace's built-in 4-layer demo transformer and write the trace files.",
    )
    parser.add_argument("-o", "--output", default=DEFAULT_DIRECTORY, help="directory for the trace files")
    parser.add_argument("--layers", type=int, default=4, help="number of decoder layers (default: 4)")
    parser.add_argument("--tokens", type=int, default=12, help="sequence length of the input (default: 12)")
    add_capture_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from graphtrace.demo import DemoConfig, demo_inputs, demo_model
    from graphtrace.errors import InvalidOptionError

    if args.layers < 1 or args.tokens < 1:
        raise InvalidOptionError("--layers and --tokens must be at least 1.")
    model = demo_model(DemoConfig(num_layers=args.layers))
    inputs = demo_inputs(args.tokens)
    started = time.perf_counter()
    trace = capture_with_options(model, inputs, args)
    elapsed = time.perf_counter() - started
    print(f"graphtrace demo: traced {trace_summary(trace)} in {elapsed:.2f} s")
    print(describe_files(Path(args.output)))
    print(f"next: graphtrace show {args.output}")
    return 0
