"""Side-effect guards for code graphtrace runs on its own account, and the bitwise comparison of results.

Tracing a module runs its Python code, and verifying a graph replays the module's own operations next to the real
call. Neither may change anything the real call can see. Python-level effects (attributes set on modules, methods
called on opaque objects) are refused where the graph is built (see ``tracer``); tensor-level effects are refused
here, at the ATen level, below every Python wrapper, so that no functional API can hide a write from the guard:

* a write into a tensor's storage that the guarded code did not allocate (``add_``, ``copy_``, ``out=``, the running
  statistics ``batch_norm`` updates in training mode, ...);
* an operator that draws random numbers (it would advance the generator the real call depends on): an operator
  that may draw (tagged ``nondeterministic_seeded``) runs with the generators' states kept, and if it drew they are
  put back and it is refused;
* a collective operation, or any operation on a tensor subclass that dispatches itself, such as a DTensor (other
  ranks would not take part).

The offending operator is refused with :class:`Refused` before it runs (a random draw: after, with the generators
restored), so nothing has changed when it is raised.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["ReplayGuard", "Refused", "TraceGuard", "difference", "dispatches_itself", "tensors_in"]

_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_dtensor"})


class Refused(Exception):
    """Guarded code tried something that would be visible outside it; raised before the operation runs."""


def tensors_in(value: Any) -> Iterable[torch.Tensor]:
    """The tensors inside ``value`` (nested sequences and mappings)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def dispatches_itself(tensor: torch.Tensor) -> bool:
    """A tensor subclass with its own ``__torch_dispatch__`` (a DTensor): its operators run code of its own, which
    may communicate with other ranks below any guard. Fake tensors, graphtrace's own metadata, are not counted."""
    kind = type(tensor)
    return kind.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__ and not issubclass(kind, FakeTensor)


def _storage_key(tensor: torch.Tensor) -> int | None:
    if isinstance(tensor, FakeTensor):  # no storage of its own: never real data
        return None
    try:
        return tensor.untyped_storage().data_ptr() or None
    except (RuntimeError, NotImplementedError):  # sparse, nested and some subclass tensors have no plain storage
        return None


class _Guard(TorchDispatchMode):
    """Refuses random and collective operators, and writes that :meth:`may_write` does not allow."""

    def may_write(self, tensor: torch.Tensor) -> bool:
        raise NotImplementedError

    def produced(self, result: Any) -> None:
        """Called with every operator's result."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = func.name()
        if func.namespace in _COLLECTIVE_NAMESPACES:
            raise Refused(f"communicates with other processes ({name})")
        for tensor in tensors_in((args, kwargs)):
            if dispatches_itself(tensor):
                raise Refused(f"computes on {type(tensor).__name__} values, whose operators may communicate ({name})")
        schema = func._schema
        if schema.is_mutable:
            for position, argument in enumerate(schema.arguments):
                if argument.alias_info is None or not argument.alias_info.is_write:
                    continue
                value = kwargs.get(argument.name) if position >= len(args) else args[position]
                if any(not self.may_write(t) for t in tensors_in(value)):
                    raise Refused(f"writes in place into a tensor it did not create ({name})")
        if torch.Tag.nondeterministic_seeded in func.tags:
            result = _without_drawing(func, args, kwargs)
        else:
            result = func(*args, **kwargs)
        self.produced(result)
        return result


def _without_drawing(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run an operator that may draw random numbers (attention kernels may, when their dropout is on); if it did,
    put the generators back as they were and refuse."""
    devices = {t.device for t in tensors_in((args, kwargs)) if t.device.type == "cuda"}
    cpu_state = torch.random.get_rng_state()
    cuda_states = {device: torch.cuda.get_rng_state(device) for device in devices}
    result = func(*args, **kwargs)
    drew = not torch.equal(cpu_state, torch.random.get_rng_state()) or any(
        not torch.equal(state, torch.cuda.get_rng_state(device)) for device, state in cuda_states.items()
    )
    if drew:
        torch.random.set_rng_state(cpu_state)
        for device, state in cuda_states.items():
            torch.cuda.set_rng_state(state, device)
        raise Refused(f"draws random numbers ({func.name()})")
    return result


class TraceGuard(_Guard):
    """Active while a module's forward is traced: real tensor operations may only write into tensors made during
    the trace (the trace is one uninterrupted stretch, so storages allocated in it are all the guard's own)."""

    def __init__(self) -> None:
        super().__init__()
        self._own: set[int] = set()

    def may_write(self, tensor: torch.Tensor) -> bool:
        key = _storage_key(tensor)
        return key is not None and key in self._own

    def produced(self, result: Any) -> None:
        for tensor in tensors_in(result):
            key = _storage_key(tensor)
            if key is not None:
                self._own.add(key)


class ReplayGuard(_Guard):
    """Active while a graph's own operations are replayed: the tensors the real call can see (the module's inputs,
    parameters, buffers and constants, and every tensor that went into or came out of a child call) are protected;
    a replay is interleaved with the real call, so protection names what to keep, not what was made."""

    def __init__(self) -> None:
        super().__init__()
        self._protected: set[int] = set()

    def protect(self, value: Any) -> None:
        for tensor in tensors_in(value):
            key = _storage_key(tensor)
            if key is not None:
                self._protected.add(key)

    def may_write(self, tensor: torch.Tensor) -> bool:
        key = _storage_key(tensor)
        return key is not None and key not in self._protected


# -- comparison ---------------------------------------------------------------------------------------------------


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    if dispatches_itself(a) or dispatches_itself(b):  # comparing two DTensors could communicate: never done
        return False
    if type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a.layout != torch.strided or b.layout != torch.strided:
        return bool(torch.equal(a, b))
    if a.numel() == 0:
        return True
    bytes_a = a.detach().contiguous().reshape(-1).view(torch.uint8)
    bytes_b = b.detach().contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(bytes_a, bytes_b))


def _plain(value: Any) -> type:
    """The type a value is compared as: fx's immutable list and dict stand for list and dict."""
    kind = type(value)
    if kind.__name__ == "immutable_list" and isinstance(value, list):
        return list
    if kind.__name__ == "immutable_dict" and isinstance(value, dict):
        return dict
    return kind


def difference(replayed: Any, actual: Any, where: str = "") -> str | None:
    """None when ``replayed`` equals ``actual`` bit for bit (tensors), item for item (sequences, mappings,
    dataclasses of the same type), by value (scalars, compared through their repr so that 0.0 and -0.0 differ) or by
    identity (any other object); else where they first differ."""
    if isinstance(replayed, torch.Tensor) or isinstance(actual, torch.Tensor):
        return _tensor_difference(replayed, actual, where)
    if _plain(replayed) is not _plain(actual):
        return (
            f"{where or 'value'} is {_plain(replayed).__name__} in the graph, {_plain(actual).__name__} in the forward"
        )
    if isinstance(actual, (list, tuple)):
        return _sequence_difference(replayed, actual, where)
    if isinstance(actual, dict):
        return _mapping_difference(replayed, actual, where)
    if replayed is actual:
        return None
    if dataclasses.is_dataclass(actual) and not isinstance(actual, type):
        return _first_difference(
            (getattr(replayed, item.name), getattr(actual, item.name), f"{where}.{item.name}")
            for item in dataclasses.fields(actual)
        )
    if isinstance(actual, _SCALARS) or actual is None:
        return _scalar_difference(replayed, actual, where)
    return _object_difference(replayed, actual, where)


_SCALARS = (bool, int, float, complex, str, bytes)
_VALUE_OBJECTS = (torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format, slice, range)


def _first_difference(items: Iterable[tuple[Any, Any, str]]) -> str | None:
    """The first difference among (replayed, actual, where) triples, compared lazily in order."""
    for replayed, actual, where in items:
        found = difference(replayed, actual, where)
        if found:
            return found
    return None


def _tensor_difference(replayed: Any, actual: Any, where: str) -> str | None:
    if isinstance(replayed, torch.Tensor) and isinstance(actual, torch.Tensor) and _same_bits(replayed, actual):
        return None
    return f"tensor{where} differs"


def _sequence_difference(replayed: Sequence[Any], actual: Sequence[Any], where: str) -> str | None:
    if len(replayed) != len(actual):
        return f"{where or 'sequence'} has {len(replayed)} items in the graph, {len(actual)} in the forward"
    return _first_difference((r, a, f"{where}[{i}]") for i, (r, a) in enumerate(zip(replayed, actual)))


def _mapping_difference(replayed: Mapping[Any, Any], actual: Mapping[Any, Any], where: str) -> str | None:
    if list(replayed) != list(actual):
        return f"{where or 'mapping'} has keys {list(replayed)} in the graph, {list(actual)} in the forward"
    return _first_difference((replayed[key], actual[key], f"{where}[{key!r}]") for key in actual)


def _scalar_difference(replayed: Any, actual: Any, where: str) -> str | None:
    """Scalars by their repr, so that 0.0 and -0.0 differ; NaN equals NaN."""
    if repr(replayed) == repr(actual) or (isinstance(actual, float) and math.isnan(actual) and math.isnan(replayed)):
        return None
    return f"{where or 'value'} is {replayed!r} in the graph, {actual!r} in the forward"


def _object_difference(replayed: Any, actual: Any, where: str) -> str | None:
    """Objects that are not the same: equal when they are values (a dtype, a size, a slice), else different."""
    try:
        if type(replayed) in _VALUE_OBJECTS and replayed == actual:
            return None
    except (RuntimeError, TypeError, ValueError):  # a slice holding tensors or arrays: == has no single truth value
        pass  # compared by identity only; anything stranger is the replay's boundary (Replay._safely) to catch
    return f"{where or 'value'} is another {type(actual).__name__} object in the graph than in the forward"
