"""Trace directories of an original model and its ports, captured once per (bug, value mode): shared by the tests of
the independent ports."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

import graphtrace

PortOf = Callable[[torch.nn.Module, str | None], torch.nn.Module]
ModelT = TypeVar("ModelT", bound=torch.nn.Module)


def randomized(model: ModelT, std: float) -> ModelT:
    """``model`` with every parameter drawn from N(0, std): transformers starts norms at ones and zeros and some
    embeddings at zeros, where random values make a swapped or misplaced module show."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, std)
    return model


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
