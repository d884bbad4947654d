"""Calls inside a module run alone, answered from runs already made: a block run alone calls its norm on the very
input the norm was run alone on, and its output is known.

A run is known for a call of the port (by id) when the port's forward made it, or when the check ran the call's
module alone; while a container runs alone, the k-th call of each module inside it is that module's k-th call
inside the container in the port's own run, and when it is given the same arguments as a known run of that call,
bit for bit (every tensor still holding what it held then), the known output is returned, copied, without running
the module again. Modules are deterministic functions of their arguments and state here: a module that draws or
writes into the port's state is refused when it runs alone (:mod:`graphtrace.check.alone`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from graphtrace.check.live import live_tensors, replaced, version
from graphtrace.engine.eager import PatchLedger, entry_point
from graphtrace.model import CallNode

__all__ = ["Known"]

_PLAIN = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same dtype, shape, device and bits (NaN included where both hold it)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a is b or torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()) or not bool(a.isnan().any().item()):
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all().item())


def _same_arguments(a: Any, b: Any) -> bool:
    """Arguments alike: tensors bit for bit, containers item by item, plain values equal, other objects the same."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and same_bits(a, b)
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same_arguments, a, b))
    if isinstance(a, dict) or isinstance(b, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same_arguments(a[k], b[k]) for k in a)
    if a is b:
        return True
    return type(a) is type(b) and isinstance(a, _PLAIN) and a == b


@dataclass(frozen=True, slots=True)
class _Run:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    versions: tuple[tuple[torch.Tensor, int], ...]
    """Every tensor of the arguments and the output, with its version when the run was made."""

    @property
    def intact(self) -> bool:
        return all(version(tensor) == then for tensor, then in self.versions)


class Known:
    """The known runs of the port's calls, by call id."""

    def __init__(self) -> None:
        self._runs: dict[str, list[_Run]] = {}

    def add(
        self,
        call: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        versions: dict[int, tuple[torch.Tensor, int]] | None = None,
    ) -> None:
        """A run of ``call`` (``Class.path@index``); ``versions`` (by ``id``) are the tensors' versions when it was
        made, when that was earlier than now (the port's own call)."""
        tensors = {id(t): t for _, t in (*live_tensors((args, kwargs)), *live_tensors(output))}
        then = versions or {}
        kept = tuple((t, then[key][1] if key in then else version(t)) for key, t in tensors.items())
        self._runs.setdefault(call, []).append(_Run(args, kwargs, output, kept))

    def output(self, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """(True, a copy of the output) of a known, intact run of ``call`` given these arguments; (False, None)
        when there is none."""
        for run in self._runs.get(call, ()):
            if run.intact and _same_arguments(run.args, args) and _same_arguments(run.kwargs, kwargs):
                copies = {name: tensor.clone() for name, tensor in live_tensors(run.output)}
                return True, replaced(run.output, "", copies)
        return False, None

    @contextmanager
    def answering(self, node: CallNode, module: nn.Module, paths: dict[int, str]) -> Iterator[None]:
        """Inside the block, the calls of the modules inside ``module`` (run alone for the port's call ``node``)
        are answered from known runs where they can be; ``paths`` names each module of the port as calls do."""
        recorded: dict[str, list[str]] = {}
        for inner in node.walk():
            if inner is not node and inner.kind == "module":
                recorded.setdefault(inner.path, []).append(inner.id)
        counts: dict[str, int] = {}
        ledger = PatchLedger()
        try:
            for inner_module in module.modules():
                path = paths.get(id(inner_module))
                if inner_module is not module and path in recorded:  # answered where the calls were kept: hooks in
                    name, method = entry_point(inner_module, after_hooks=True)
                    ledger.set_instance_attr(inner_module, name, self._answering(path, method, recorded[path], counts))
            yield
        finally:
            ledger.restore()

    def _answering(
        self, path: str, forward: Callable[..., Any], calls: list[str], counts: dict[str, int]
    ) -> Callable[..., Any]:
        def answered_forward(*args: Any, **kwargs: Any) -> Any:
            k = counts.get(path, 0)
            counts[path] = k + 1
            if k < len(calls):
                found, output = self.output(calls[k], args, kwargs)
                if found:
                    return output
            return forward(*args, **kwargs)

        return answered_forward
