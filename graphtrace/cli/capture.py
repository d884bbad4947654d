"""``graphtrace capture TARGET``: trace a model built by a factory function of yours."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path
from typing import Any

from graphtrace.cli.common import (
    add_capture_options,
    capture_options,
    capture_with_options,
    describe_files,
    graph_warnings_reported,
    trace_summary,
)
from graphtrace.cli.user_errors import add_traceback_option
from graphtrace.errors import InvalidOptionError
from graphtrace.model import Trace


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "capture",
        help="trace a model built by your factory function",
        description=(
            "Trace the model that TARGET builds. TARGET is 'package.module:function' or 'path/to/file.py:function'; "
            "the function takes no arguments and returns (model, inputs), inputs being a dict of keyword "
            "arguments, a tuple of positional arguments or a tensor."
        ),
    )
    parser.add_argument(
        "target", metavar="TARGET", help="module:function or file.py:function returning (model, inputs)"
    )
    parser.add_argument("-o", "--output", required=True, help="directory for the trace files")
    parser.add_argument(
        "--generate",
        type=int,
        metavar="N",
        help="trace model.generate(**inputs, max_new_tokens=N, do_sample=False) instead of one forward: "
        "one step per forward call (prefill, then each decoding step)",
    )
    add_capture_options(parser)
    add_traceback_option(parser)
    parser.set_defaults(run=run)


def load_factory(target: str) -> Any:
    """The callable named by ``module:function`` or ``file.py:function``."""
    location, sep, name = target.rpartition(":")
    if not sep or not location or not name:
        raise InvalidOptionError(f"TARGET {target!r} must look like 'package.module:function' or 'file.py:function'.")
    if location.endswith(".py"):
        path = Path(location)
        if not path.is_file():
            raise InvalidOptionError(f"TARGET file {location!r} does not exist.")
        spec = importlib.util.spec_from_file_location(f"graphtrace_target_{path.stem}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent.resolve()))
        sys.modules[spec.name] = module  # as an import does: a dataclass in the file looks its module up there
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(spec.name, None)
            raise
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as exc:
            raise InvalidOptionError(f"cannot import {location!r} for TARGET {target!r}: {exc}") from exc
    factory = getattr(module, name, None)
    if not callable(factory):
        raise InvalidOptionError(f"{location!r} has no function {name!r} (TARGET {target!r}).")
    return factory


def built_by(target: str) -> tuple[Any, Any]:
    """The ``(model, inputs)`` pair the factory ``target`` names returns."""
    built = load_factory(target)()
    if not (isinstance(built, tuple) and len(built) == 2):
        raise InvalidOptionError(f"{target} returned {type(built).__name__}; it must return a (model, inputs) pair.")
    return built[0], built[1]


def run(args: argparse.Namespace) -> int:
    model, inputs = built_by(args.target)
    started = time.perf_counter()
    trace = (
        generate_with_options(model, inputs, args)
        if args.generate is not None
        else capture_with_options(model, inputs, args)
    )
    print(f"graphtrace capture: traced {trace_summary(trace)} in {time.perf_counter() - started:.2f} s")
    print(describe_files(Path(args.output)))
    return 0


def generate_with_options(model: Any, inputs: Any, args: argparse.Namespace) -> Trace:
    """Greedy ``model.generate(**inputs, max_new_tokens=args.generate)`` under ``graphtrace.tracing``."""
    import torch

    from graphtrace.api import tracing

    if args.generate < 1:
        raise InvalidOptionError(f"--generate {args.generate}: the number of new tokens must be at least 1.")
    if not callable(getattr(model, "generate", None)):
        raise InvalidOptionError(
            f"--generate needs a model with a generate() method (a transformers model); {type(model).__name__} has "
            "none. Leave out --generate to trace one forward call."
        )
    if isinstance(inputs, torch.Tensor):
        inputs = {"input_ids": inputs}
    if not isinstance(inputs, dict):
        raise InvalidOptionError(
            f"--generate passes the inputs to generate() as keyword arguments; {args.target} returned "
            f"{type(inputs).__name__}. Return a dict (e.g. a tokenizer's output) or the input ids tensor."
        )
    with graph_warnings_reported(args), tracing(model, **capture_options(args)) as session:  # type: ignore[arg-type]
        model.generate(**inputs, max_new_tokens=args.generate, do_sample=False)
    assert session.trace is not None
    return session.trace
