"""Trace directories of an original model and its ports, captured once per (bug, value mode): shared by the tests of
the independent ports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import graphtrace

PortOf = Callable[[torch.nn.Module, str | None], torch.nn.Module]


def port_traces(
    root: Path, original: torch.nn.Module, original_inputs: Any, port_of: PortOf, port_inputs: Any
) -> Callable[[str | None, str], tuple[Path, Path]]:
    """``get(bug, values)`` -> (the original's trace, the port's), each captured on first request."""
    done: dict[tuple[str | None, str], tuple[Path, Path]] = {}

    def get(bug: str | None, values: str) -> tuple[Path, Path]:
        if (bug, values) not in done:
            reference = root / f"original-{values}"
            if not reference.exists():
                graphtrace.capture(original, original_inputs, path=reference, values=values)  # type: ignore[arg-type]
            port = root / f"{bug}-{values}"
            graphtrace.capture(port_of(original, bug), port_inputs, path=port, values=values)  # type: ignore[arg-type]
            done[(bug, values)] = (reference, port)
        return done[(bug, values)]

    return get
