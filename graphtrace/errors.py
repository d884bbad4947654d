"""Errors raised by graphtrace.

Every user mistake raises a subclass of :class:`GraphtraceError` that also subclasses the builtin a caller would
naturally catch (``TypeError`` for a wrong kind of object, ``ValueError`` for a wrong value, ...), so that
``except ValueError`` keeps working. Messages name the offending thing, state the rule and give the remedy.

Errors raised inside the user's own forward are never wrapped: they propagate with their own type. The one warning,
:class:`GraphvizWarning`, says that a call graph could not be drawn where a trace was saved regardless.
"""

from __future__ import annotations

__all__ = [
    "describe_error",
    "GraphtraceError",
    "InvalidOptionError",
    "InvalidModelError",
    "InvalidInputsError",
    "OutputPathError",
    "TraceFormatError",
    "CallNotFoundError",
    "UnsupportedTensorError",
    "FxCaptureError",
    "GraphvizNotFoundError",
    "GraphvizFailedError",
    "GraphvizWarning",
]


class GraphtraceError(Exception):
    """Base class of every error graphtrace raises on its own account."""


class InvalidOptionError(GraphtraceError, ValueError):
    """An option has a value outside its allowed set."""


class InvalidModelError(GraphtraceError, TypeError):
    """What was passed as the model is not a ``torch.nn.Module``."""


class InvalidInputsError(GraphtraceError, TypeError):
    """The inputs are of a kind graphtrace cannot pass to a forward."""


class OutputPathError(GraphtraceError, ValueError):
    """The output directory is a file, or cannot be created or written."""


class TraceFormatError(GraphtraceError, ValueError):
    """A saved trace is missing, malformed, or of an unknown schema version."""


class CallNotFoundError(GraphtraceError, KeyError):
    """A trace holds no call by the name asked for (``trace.find(...)``, ``--focus``); ``detail`` says what is there
    instead (the closest paths, how many calls the module had). A KeyError, printed as a sentence."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name!r}: {detail}")
        self.name = name
        self.detail = detail

    def __str__(self) -> str:  # KeyError's own prints the repr of the message
        return str(self.args[0])


class UnsupportedTensorError(GraphtraceError, TypeError):
    """A tensor cannot be stored the requested way (for instance a sparse tensor as safetensors)."""


class FxCaptureError(GraphtraceError, RuntimeError):
    """``strategy="fx"`` was requested but some modules cannot be traced by torch.fx.

    ``fallbacks`` maps each such module's path to the reason; ``trace`` is the trace that was recorded anyway (the
    forward ran, those modules captured by forward wrapping)."""

    def __init__(self, message: str, fallbacks: dict[str, str] | None = None, trace: object = None) -> None:
        super().__init__(message)
        self.fallbacks = dict(fallbacks or {})
        self.trace = trace


class GraphvizNotFoundError(GraphtraceError, RuntimeError):
    """Graphviz's ``dot`` program is not installed."""


class GraphvizFailedError(GraphtraceError, RuntimeError):
    """Graphviz's ``dot`` ran but could not draw the call graph."""


class GraphvizWarning(UserWarning):
    """The call graph beside a saved trace could not be drawn; the trace itself was saved."""


def describe_error(exc: BaseException) -> str:
    """``"Type: first line of the message"``: how a trace names an exception (a call that raised, a fallback)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
