"""How much of a trace torch.fx served, and why the rest was captured by forward wrapping (torch-free).

:class:`Coverage` is part of the data model (``Trace.coverage()``); this module words fallbacks for messages."""

from __future__ import annotations

from collections.abc import Mapping

from graphtrace.model import Coverage, coverage_of

__all__ = ["Coverage", "coverage_of", "describe_fallbacks"]


def describe_fallbacks(fallbacks: Mapping[str, str], limit: int = 3) -> list[str]:
    """One line per reason, most modules first: ``reason (N modules: a, b, c, ...)``."""
    by_reason: dict[str, list[str]] = {}
    for path, reason in fallbacks.items():
        by_reason.setdefault(reason, []).append(path)
    lines = []
    for reason, paths in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        shown = ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")
        count = f"{len(paths)} module{'s' if len(paths) != 1 else ''}"
        lines.append(f"{reason} ({count}: {shown})")
    return lines
