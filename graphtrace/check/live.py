"""The port's module calls as they happened: each call's actual arguments and output, kept while the port runs once
under capture, so that each module can be run again alone.

Every module's entry point is wrapped (``forward``, or around its hooks where it has some, as capture records it:
:func:`~graphtrace.engine.eager.entry_point`; through the engine's :class:`~graphtrace.engine.PatchLedger`, put back
exactly on exit, also on error) before capture wraps it in turn: a call is named ``path@index`` as the recorder names
it, so the live call and its :class:`~graphtrace.model.CallNode` meet by id. Arguments are kept by reference with the
version counter of every tensor in them: a tensor the port changed in place after the call no longer holds what the
call was given, and is never used as if it did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch
from torch import nn

from graphtrace.engine.eager import PatchLedger, entry_point, module_paths

__all__ = ["LiveCall", "LiveCalls", "live_tensors", "replaced", "version"]


def version(tensor: torch.Tensor) -> int:
    """``tensor``'s version counter: it moves when the tensor is changed in place."""
    try:
        return int(tensor._version)
    except RuntimeError:  # an inference tensor has no version counter, and cannot be changed in place outside one
        return -1


def live_tensors(value: Any, name: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside ``value``, named as the recorder names it (``_args_0``, ``_kwargs_mask``, ``_0_1``):
    sequences by position, mappings by key."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from live_tensors(item, f"{name}_{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from live_tensors(item, f"{name}_{key}")


def replaced(value: Any, name: str, new: dict[str, torch.Tensor]) -> Any:
    """``value`` with the tensors named in ``new`` replaced (containers rebuilt where something inside changed, the
    rest the very objects)."""
    if isinstance(value, torch.Tensor):
        return new.get(name, value)
    if isinstance(value, (list, tuple)):
        items = [replaced(item, f"{name}_{i}", new) for i, item in enumerate(value)]
        if all(a is b for a, b in zip(items, value)):
            return value
        if isinstance(value, list):
            return items
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    if isinstance(value, dict):
        changed = {key: replaced(item, f"{name}_{key}", new) for key, item in value.items()}
        if all(changed[key] is item for key, item in value.items()):
            return value
        copy = value.copy()  # a ModelOutput copies as its own type
        copy.update(changed)
        return copy
    return value


def _versions(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    return {name: version(tensor) for name, tensor in tensors.items()}


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return dict((*live_tensors(args, "_args"), *live_tensors(kwargs, "_kwargs")))


@dataclass
class LiveCall:
    """One call of a module of the port: what it was given and what it returned, with the tensors' versions then."""

    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    inputs: dict[str, torch.Tensor]
    """The tensor arguments by name (``_args_0``, ``_kwargs_mask``), as the recorder names them."""
    given: dict[str, int]
    output: Any = None
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    """The output tensors by name (``""`` for a lone tensor, ``_0``, ``_logits``)."""
    returned: dict[str, int] = field(default_factory=dict)
    finished: bool = False

    def input_intact(self, name: str) -> bool:
        """Whether the tensor argument ``name`` still holds what the call was given."""
        return version(self.inputs[name]) == self.given[name]

    @property
    def output_intact(self) -> bool:
        """The call returned, and nothing it returned was changed in place since."""
        return self.finished and _versions(self.outputs) == self.returned


@dataclass
class LiveCalls:
    """Inside the block, every call of ``model``'s modules is kept in :attr:`calls` by id (``Class.path@index``)."""

    model: nn.Module
    calls: dict[str, LiveCall] = field(default_factory=dict)
    _ledger: PatchLedger = field(default_factory=PatchLedger)

    def __enter__(self) -> LiveCalls:
        counts: dict[str, int] = {}
        try:
            for path, module in module_paths(self.model):  # what the caller gave and got, hooks included
                name, method = entry_point(module, after_hooks=True)
                self._ledger.set_instance_attr(module, name, self._wrapper(path, module, method, counts))
        except BaseException:
            self._ledger.restore()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._ledger.restore()

    def _wrapper(
        self, path: str, module: nn.Module, forward: Callable[..., Any], counts: dict[str, int]
    ) -> Callable[..., Any]:
        calls = self.calls

        def keeping_forward(*args: Any, **kwargs: Any) -> Any:
            index = counts.get(path, 0)
            counts[path] = index + 1
            given = _arguments(args, kwargs)
            call = calls[f"{path}@{index}"] = LiveCall(module, args, kwargs, given, _versions(given))
            output = forward(*args, **kwargs)
            call.output, call.outputs = output, dict(live_tensors(output))
            call.returned, call.finished = _versions(call.outputs), True
            return output

        return keeping_forward
