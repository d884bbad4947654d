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
            with torch.no_grad(), model_addition_debugger_context(
                model, debug_path=str(directory), do_prune_layers=prune, use_repr=use_repr
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

        with torch.no_grad(), model_addition_debugger_context(
            model, debug_path=str(directory), do_prune_layers=prune, use_repr=use_repr
        ):
            model(**inputs)

    return run


_REPR, _TENSORS = "transformers repr", "transformers safetensors"

MODES: dict[str, Mode] = {
    mode.name: mode
    for mode in (
        Mode("plain", _plain, None, "model(**inputs) under torch.no_grad()"),
        Mode(_REPR, _transformers(True, False), None, "model_addition_debugger_context, use_repr=True, all layers"),
        Mode(_TENSORS, _transformers(False, False), None, "use_repr=False: one safetensors file per tensor"),
        Mode("transformers repr pruned", _transformers(True, True), None, "its defaults (do_prune_layers=True)"),
        Mode("capture repr auto", _capture("repr"), _REPR, "graphtrace.capture(path=...), the defaults"),
        Mode("capture repr eager", _capture("repr", "eager"), _REPR, "strategy='eager'"),
        Mode("capture repr auto ops", _capture("repr", ops=True), _REPR, "ops=True"),
        Mode("capture none", _capture("none"), _REPR, "values='none': statistics only"),
        Mode("capture safetensors", _capture("safetensors"), _TENSORS, "values='safetensors': a file per tensor"),
        Mode("capture bundle", _capture("bundle"), _TENSORS, "values='bundle': all tensors in one file"),
        Mode("shim repr", _shim(True, False), _REPR, "graphtrace's model_addition_debugger_context, all layers"),
        Mode("shim repr pruned", _shim(True, True), "transformers repr pruned", "its defaults"),
        Mode("shim safetensors", _shim(False, False), _TENSORS, "use_repr=False, all layers"),
    )
}

QUICK_MODES = (
    "plain", _REPR, _TENSORS, "capture repr auto", "capture none", "capture safetensors", "capture bundle",
    "shim repr pruned", "transformers repr pruned",
)
