"""Where plans live: shared by identical module instances and kept across captures of the same model.

A plan is cached under the module's :func:`module key <module_keys>` and the call's signature. The module key says
what a trace of the module may have specialised on besides the call: its type and forward function, the values of
its own non-tensor attributes (``layer_idx``, a sliding window, flags; compared by value for plain values, by
identity otherwise), its parameters' and buffers' metadata, its hooks, and the keys of its children. Two instances
with equal keys (the identical decoder layers of a model) trace to the same graph, resolved against each instance
when replayed (``call_module`` and ``get_attr`` targets are names, looked up on the instance replayed).

A :class:`PlanStore` is kept per captured model in a :class:`weakref.WeakKeyDictionary`: it dies with the model,
adds nothing to it, holds no strong reference to it (attributes compared by identity are held weakly; a module
with an attribute that cannot be, such as a dict of objects, gets no key and keeps per-capture plans), and drops
the plans of keys the model no longer has at the start of each capture (a changed attribute or forward). A plan
holds the tensor constants its trace created (a causal mask) and the trace-time values of its arguments: at most
``PLANS_PER_MODULE`` plans per key.

Instances whose keys differ only in what their graph does not use (a decoder layer whose attention holds another
``layer_idx``) are traced each, but a graph equal to one already kept -- the same nodes, targets, constants and
trace-time metadata, for a module of the same type and the same call -- is replaced by the kept plan
(:meth:`PlanStore.canonical`), so that it is verified once per capture for all of them.

Reuse is safe because plans are still checked in every capture: the first call of a plan in a capture is replayed
bit for bit against the real call, whatever capture or instance the plan was traced on.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Hashable
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.node import map_aggregate

from graphtrace.engine.fx.tracer import META, Opaque, Plan

__all__ = ["PLANS_PER_MODULE", "PlanStore", "module_keys", "store_for"]

PLANS_PER_MODULE = 8
"""Plans kept per module key, oldest dropped first: a plan holds the constants its trace created (a causal mask of
the sequence's length), and shape-specialised plans of a growing sequence are never needed again."""

_PLAIN = frozenset({type(None), bool, int, str, bytes, torch.dtype, torch.device, torch.layout, torch.memory_format})
_MODULE_INTERNALS = frozenset(vars(nn.Module()))
_HOOKS = tuple(sorted(name for name in _MODULE_INTERNALS if "hook" in name and name != "_is_full_backward_hook"))


class _Unkeyable(Exception):
    """An attribute that can be compared neither by value nor through a weak reference."""


class _Identity:
    """An object compared by identity, held weakly (a dead reference equals nothing)."""

    __slots__ = ("_ref", "_id")

    def __init__(self, value: Any) -> None:
        try:
            self._ref = weakref.ref(value)
        except TypeError:
            raise _Unkeyable from None
        self._id = id(value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Identity) or other._id != self._id:
            return False
        value = self._ref()
        return value is not None and value is other._ref()

    def __hash__(self) -> int:
        return self._id


def _value_key(value: Any) -> Hashable:
    # By the real type: isinstance asks an object that is not an instance for its ``__class__``, which a
    # transformers config answers through a ``__getattribute__`` of its own, twice per config-holding module.
    kind = type(value)
    if kind in _PLAIN or issubclass(kind, enum.Enum):
        return (kind, value)
    if issubclass(kind, (float, complex)):
        return (kind, repr(value))  # nan == nan, 0.0 != -0.0
    if kind in (tuple, list, torch.Size):
        return (kind, tuple(_value_key(item) for item in value))
    if kind in (set, frozenset):
        return (kind, frozenset(_value_key(item) for item in value))
    if kind is dict:
        return (dict, tuple((_value_key(k), _value_key(v)) for k, v in value.items()))
    return _Identity(value)


def _tensor_key(tensor: torch.Tensor | None) -> Hashable:
    if tensor is None:
        return None
    strides = tuple(tensor.stride()) if tensor.layout == torch.strided else None
    return (
        type(tensor),
        tensor.dtype,
        tensor.device,
        tensor.layout,
        tuple(tensor.shape),
        strides,
        tensor.requires_grad,
    )


def _forward_key(module: nn.Module) -> Hashable:
    forward = module.forward
    if getattr(forward, "__self__", None) is module:
        return _Identity(forward.__func__)  # type: ignore[attr-defined]  # a bound method
    return _Identity(forward)


def _own_key(module: nn.Module) -> Hashable:
    attributes, internals, plain = vars(module), _MODULE_INTERNALS, _PLAIN
    parameters, buffers, non_persistent = module._parameters, module._buffers, module._non_persistent_buffers_set
    # This runs for every module at the start of every capture: list comprehensions rather than generators, plain
    # values keyed inline (as _value_key keys them), and nothing built for what a module does not have.
    return (
        type(module),
        _forward_key(module),
        tuple(
            [
                (name, (type(value), value) if type(value) in plain else _value_key(value))
                for name, value in attributes.items()
                if name not in internals
            ]
        ),
        module.training,
        tuple([(name, _tensor_key(p)) for name, p in parameters.items()]) if parameters else (),
        tuple([(name, _tensor_key(b)) for name, b in buffers.items()]) if buffers else (),
        tuple(sorted(non_persistent)) if non_persistent else (),
        tuple(
            [
                (hooks, tuple([(k, _value_key(v)) for k, v in attributes[hooks].items()]))
                for hooks in _HOOKS
                if attributes.get(hooks)
            ]
        ),
    )


class _Key:
    """A module key: a nested tuple with its hash computed once (keys nest their children's)."""

    __slots__ = ("_parts", "_hash")

    def __init__(self, parts: tuple[Any, ...]) -> None:
        self._parts = parts
        self._hash = hash(parts)

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Key) and self._hash == other._hash and self._parts == other._parts)

    def __hash__(self) -> int:
        return self._hash


def module_keys(model: nn.Module, canonical: dict[Hashable, Hashable] | None = None) -> dict[int, Hashable | None]:
    """The key of ``model`` and every submodule, by ``id``; None for a module that cannot have one (an attribute
    that cannot be compared, or such a descendant). Computed before the capture patches any forward.

    With ``canonical`` (a store's :attr:`PlanStore.canonical_keys`), equal keys are one object, this capture's and
    earlier ones': a plan lookup under a key then ends at its identity instead of comparing nested tuples."""
    keys: dict[int, Hashable | None] = {}
    _key_of(model, keys, canonical)  # a module-level recursion: a nested one would be a cycle left to the collector
    return keys


def _key_of(
    module: nn.Module, keys: dict[int, Hashable | None], canonical: dict[Hashable, Hashable] | None
) -> Hashable | None:
    if id(module) in keys:
        return keys[id(module)]
    keys[id(module)] = None  # a module that contains itself
    try:
        own = _own_key(module)
    except _Unkeyable:
        own = None
    children = tuple(
        [(name, _key_of(child, keys, canonical)) for name, child in module._modules.items() if child is not None]
    )
    key: Hashable | None = None
    if own is not None and not any([child is None for _, child in children]):
        key = _Key((own, children))
    if key is not None and canonical is not None:
        key = canonical.setdefault(key, key)  # children first: a parent's parts hold its children's canonical keys
    keys[id(module)] = key
    return key


class PlanStore:
    """The plans of one model, by module key and signature, and the fake-tensor mode their metadata lives in."""

    def __init__(self) -> None:
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.plans: dict[Hashable, dict[Hashable, Plan | str]] = {}
        # Leaf plans replayed bit for bit in an earlier capture: a leaf has no data flow to learn, so later captures
        # check its calls structurally (by id; the plan is held here, so the id stays its own).
        self.proven_leaves: dict[int, Plan] = {}
        self._by_graph: dict[Hashable, list[Plan]] = {}
        self.canonical_keys: dict[Hashable, Hashable] = {}
        """One object for each module key met (:func:`module_keys`)."""

    def keep_only(self, keys: set[Hashable]) -> None:
        """Drop the plans of module keys the model no longer has."""
        for key in [key for key in self.plans if key not in keys]:
            del self.plans[key]
        for key in [key for key in self.canonical_keys if key not in keys]:
            del self.canonical_keys[key]
        kept = {id(plan) for plans in self.plans.values() for plan in plans.values()}
        self.proven_leaves = {key: plan for key, plan in self.proven_leaves.items() if key in kept}
        for fingerprint, plans in list(self._by_graph.items()):
            plans[:] = [plan for plan in plans if id(plan) in kept]
            if not plans:
                del self._by_graph[fingerprint]

    def canonical(self, module: nn.Module, call: Hashable, plan: Plan) -> Plan:
        """The plan already kept with a graph equal to ``plan``'s for a module of this type and this call, else
        ``plan`` (kept from now on)."""
        fingerprint = (type(module), call, _graph_fingerprint(plan))
        candidates = self._by_graph.setdefault(fingerprint, [])
        for kept in candidates:
            if all(torch.equal(kept.constants[name], value) for name, value in plan.constants.items()):
                return kept
        candidates.append(plan)
        return plan


def _meta_fingerprint(meta: Any) -> Any:
    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _tensor_key(value)
        if isinstance(value, Opaque):
            return (Opaque, type(value.value))
        return repr(value)

    return repr(map_aggregate(meta, convert))


def _graph_fingerprint(plan: Plan) -> Hashable:
    """What makes two plans interchangeable, tensor constants' values aside: the graph's text (ops, targets,
    constant arguments, names), every node's trace-time metadata, the output's structure, the constants' metadata."""
    return (
        str(plan.graph),
        tuple(_meta_fingerprint(node.meta.get(META)) for node in plan.graph.nodes),
        plan.output,
        tuple((name, _tensor_key(value)) for name, value in plan.constants.items()),
    )


_STORES: weakref.WeakKeyDictionary[nn.Module, PlanStore] = weakref.WeakKeyDictionary()


def store_for(model: nn.Module) -> PlanStore:
    """The plan store of ``model``, made on its first capture."""
    store = _STORES.get(model)
    if store is None:
        store = _STORES[model] = PlanStore()
    return store
