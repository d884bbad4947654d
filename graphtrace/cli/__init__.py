"""The ``graphtrace`` command: ``demo``, ``capture``, ``show``, ``render``, ``view``, ``diff``, ``check``.

Each subcommand lives in its own module with ``add_parser(subparsers)``, which sets the function that runs it.
``show``, ``render``, ``view`` and ``diff`` read saved traces and never need the model. Exit codes: 0 success, 1 a
difference found (``diff``, ``check``), 2 bad input (a message on stderr, no traceback), 3 the user's code raised
(``capture``, ``check``: the model or its factory; its own error and the partial trace's location first, then the
traceback of its own code, graphtrace's frames only with ``--traceback``).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

from graphtrace.errors import GraphtraceError

__all__ = ["main"]

EXIT_OK, EXIT_DIFFERENT, EXIT_BAD_INPUT, EXIT_USER_CODE_RAISED = 0, 1, 2, 3

_SUBCOMMANDS = ("demo", "capture", "show", "render", "view", "diff", "check")


def _parser() -> argparse.ArgumentParser:
    from graphtrace.version import __version__

    parser = argparse.ArgumentParser(
        prog="graphtrace",
        description="Record what happens inside a PyTorch model's forward pass, module by module.",
    )
    parser.add_argument("--version", action="version", version=f"graphtrace {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    import importlib

    for name in _SUBCOMMANDS:
        try:
            module = importlib.import_module(f"graphtrace.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"graphtrace.cli.{name}":
                raise
            continue
        module.add_parser(subparsers)
    return parser


_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")


def _printable(message: str) -> str:
    """``message`` with its control characters (but newlines) as escapes: an error names files of a trace directory,
    and a crafted file name (or a link's target) holding ``ESC [2J`` would otherwise drive the terminal."""
    return _CONTROL.sub(lambda match: ascii(match.group())[1:-1], message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or EXIT_OK)
    except GraphtraceError as exc:
        print(f"graphtrace {args.command}: error: {_printable(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # output piped into head or less that closed early
        return EXIT_OK
    except Exception as exc:  # the model's own error reads first; a fault of graphtrace's keeps its whole traceback
        from graphtrace.cli.user_errors import describe_user_error, raised_by_user_code

        if getattr(args, "traceback", False) or not raised_by_user_code(exc):
            raise
        print(_printable(describe_user_error(exc, args)), file=sys.stderr)
        return EXIT_USER_CODE_RAISED
