"""One module of the port run alone, on arguments the check chose, without changing anything of the port.

The module runs under ``torch.no_grad()`` and under the engine's :class:`~graphtrace.engine.fx.guard.ReplayGuard`
with the port's own tensors protected (its parameters, buffers and tensor attributes): a write into one of them (a
key/value cache kept in the module) or a random draw (dropout in training mode) is refused before it happens, and the
module is reported as one that cannot be run alone. Attributes the module's Python code sets (a step counter, a
cache object) are put back as they were, and reported the same way. Every tensor the module is handed is the
check's own (the original's values, or copies of the port's), so what it writes into its arguments stays there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphtrace.check.live import version
from graphtrace.engine.fx.guard import Refused, ReplayGuard, tensors_in
from graphtrace.errors import describe_error

__all__ = ["Alone", "Guard", "port_tensors", "run_alone", "state_kept"]


@dataclass(frozen=True, slots=True)
class Alone:
    """What a module run alone returned, or why it could not be run alone: ``why`` in a few words (the same for
    every module refused for that reason), ``refused`` in full."""

    output: Any = None
    why: str = ""
    refused: str | None = None


def _held(model: nn.Module) -> list[torch.Tensor]:
    """The tensors ``model``'s modules keep beside their parameters: buffers, and tensors in plain attributes (a Meta
    style attention's ``cache_k``), also inside lists and dicts."""
    found: list[torch.Tensor] = list(model.buffers())
    for module in model.modules():
        registered = (module._parameters, module._buffers, module._modules)
        found += tensors_in(
            [
                value
                for value in vars(module).values()
                if isinstance(value, (torch.Tensor, list, dict)) and not any(value is table for table in registered)
            ]
        )
    return found


def port_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The tensors that are the port's state: parameters and :func:`_held` tensors."""
    return [*model.parameters(), *_held(model)]


@contextmanager
def state_kept(model: nn.Module) -> Iterator[None]:
    """``model``'s state put back as it was when the block ends, also on error: the attributes its modules' code
    sets (a step counter, a cache object) and the values of its buffers and tensor attributes (a key/value cache
    written in place). Its own forward runs in the block; parameters are not written by a forward."""
    snapshot = _snapshot(model)
    held = [(tensor, version(tensor), tensor.detach().clone()) for tensor in _held(model)]
    try:
        yield
    finally:
        _put_back(snapshot)
        with torch.no_grad():
            for tensor, then, value in held:
                if version(tensor) != then:
                    tensor.copy_(value)


class Guard(ReplayGuard):
    """The replay guard over the port's own tensors (:func:`port_tensors`), entered once per module run alone; it
    remembers its first refusal of a run, so that a module's code that catches exceptions broadly cannot hide that
    it tried."""

    refusal: str | None = None

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.protect(port_tensors(model))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        except Refused as exc:
            self.refusal = self.refusal or str(exc)
            raise


_Snapshot = list[tuple[nn.Module, list[tuple[dict[str, Any], dict[str, Any]]]]]


def _snapshot(module: nn.Module) -> _Snapshot:
    return [
        (inner, [(table, dict(table)) for table in (vars(inner), inner._parameters, inner._buffers, inner._modules)])
        for inner in module.modules()
    ]


def _put_back(snapshot: _Snapshot) -> str | None:
    """Restore every attribute table of the snapshot; the first attribute that had changed, if any."""
    changed = None
    for inner, tables in snapshot:
        for table, before in tables:
            if table.keys() == before.keys() and all(table[key] is value for key, value in before.items()):
                continue
            if changed is None:
                key = next((k for k in table.keys() ^ before.keys()), None)
                key = key or next(k for k, value in before.items() if table[k] is not value)
                changed = f"{type(inner).__name__}.{key}"
            table.clear()
            table.update(before)
    return changed


def run_alone(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], guard: Guard) -> Alone:
    """Call ``module(*args, **kwargs)`` under ``torch.no_grad()`` and ``guard``, the module's attributes put back
    after; its output, or why it could not be run alone."""
    guard.refusal = None
    snapshot = _snapshot(module)
    try:
        with torch.no_grad(), guard:
            output = module(*args, **kwargs)
    except Exception as exc:
        if guard.refusal is None:
            return Alone(why="run alone, it raised", refused=f"run alone, it raised {describe_error(exc)}")
    finally:
        changed = _put_back(snapshot)
    if guard.refusal is not None:  # "writes in place into a tensor it did not create (aten::add_)"
        return Alone(why=f"it {guard.refusal.partition(' (')[0]}", refused=f"it {guard.refusal}")
    if changed is not None:
        return Alone(why="it sets attributes of the port", refused=f"it sets {changed}, which was put back")
    return Alone(output)
