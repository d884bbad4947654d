"""The benchmarked ways of running a model: plain, transformers' tracer, and graphtrace's capture and shim.

Every traced mode writes its files into a fresh directory (the time includes writing SUMMARY, FULL_TENSORS and,
for graphtrace, its own trace file). Each mode names the transformers mode it is compared with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["MODES", "QUICK_MODES", "Mode"]


@dataclass(frozen=True)
class Mode:
    name: str
    run: Callable[[torch.nn.Module, dict[str, Any], Path], None]
    reference: str | None = None
    """The transformers mode this one is compared with."""
    description: str = ""


def _plain(model: torch.nn.Module, inputs: dict[str, Any], directory: Path) -> None:
    with torch.no_grad():
        model(**inputs)


def _transformers(use_repr: bool, prune: bool) -> Callable[[torch.nn.Module, dict[str, Any], Path], None]:
    def run(model: torch.nn.Module, inputs: dict[str, Any], directory: Path) -> None:
        from torch._tensor_str import PRINT_OPTS
        from transformers.model_debugging_utils import model_addition_debugger_context

        options = dict(vars(PRINT_OPTS))
        try:
            with (
                torch.no_grad(),
                model_addition_debugger_context(
                    model, debug_path=str(directory), do_prune_layers=prune, use_repr=use_repr
                ),
            ):
                model(**inputs)
        finally:
            # transformers leaves an instance `forward` on every module and its print options changed
            for module in model.modules():
                module.__dict__.pop("forward", None)
            for key, value in options.items():
                setattr(PRINT_OPTS, key, value)

    return run


def _capture(values: str, strategy: str = "auto", ops: bool = False) -> Callable[..., None]:
    def run(model: torch.nn.Module, inputs: dict[str, Any], directory: Path) -> None:
        import graphtrace

        graphtrace.capture(model, inputs, path=directory, values=values, strategy=strategy, ops=ops)  # type: ignore[arg-type]

    return run


def _shim(use_repr: bool, prune: bool) -> Callable[[torch.nn.Module, dict[str, Any], Path], None]:
    def run(model: torch.nn.Module, inputs: dict[str, Any], directory: Path) -> None:
        from graphtrace import model_addition_debugger_context

        with (
            torch.no_grad(),
            model_addition_debugger_context(model, debug_path=str(directory), do_prune_layers=prune, use_repr=use_repr),
        ):
            model(**inputs)

    return run


_REPR, _TENSORS = "transformers repr", "transformers safetensors"


def _capture_modes() -> list[Mode]:
    modes = []
    for values, reference, what in (
        ("repr", _REPR, "repr lines"),
        ("none", _REPR, "statistics only"),
        ("safetensors", _TENSORS, "a safetensors file per tensor"),
        ("bundle", _TENSORS, "all tensors in one file"),
    ):
        for strategy in ("auto", "eager"):
            modes.append(
                Mode(
                    f"capture {values} {strategy}",
                    _capture(values, strategy),
                    reference,
                    f"graphtrace.capture(path=..., values={values!r}, strategy={strategy!r}): {what}",
                )
            )
    for strategy in ("auto", "eager"):
        modes.append(
            Mode(
                f"capture repr {strategy} ops",
                _capture("repr", strategy, ops=True),
                _REPR,
                f"values='repr', strategy={strategy!r}, ops=True",
            )
        )
    return modes


MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode("plain", _plain, None, "model(**inputs) under torch.no_grad()"),
        Mode(_REPR, _transformers(True, False), None, "model_addition_debugger_context, use_repr=True, all layers"),
        Mode(_TENSORS, _transformers(False, False), None, "use_repr=False: one safetensors file per tensor"),
        Mode("transformers repr pruned", _transformers(True, True), None, "its defaults (do_prune_layers=True)"),
        *_capture_modes(),
        Mode("shim repr", _shim(True, False), _REPR, "graphtrace's model_addition_debugger_context, all layers"),
        Mode("shim repr pruned", _shim(True, True), "transformers repr pruned", "its defaults"),
        Mode("shim safetensors", _shim(False, False), _TENSORS, "use_repr=False, all layers"),
    )
}

QUICK_MODES = (
    "plain",
    _REPR,
    _TENSORS,
    "capture repr auto",
    "capture repr eager",
    "capture none eager",
    "capture safetensors eager",
    "capture bundle eager",
    "shim repr pruned",
    "transformers repr pruned",
)
