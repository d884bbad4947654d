"""Tracing one module's forward into a torch.fx graph, specialised on one call.

A module is traced on its own: every module its forward calls becomes a ``call_module`` node (a leaf of the graph),
so the graph holds only the module's own operations. The graph is specialised on the call, which is what lets most
real forwards trace at all:

* the call's tensors (and objects graphtrace cannot treat as constants, such as a cache) become placeholders; every
  other argument -- None, numbers, strings, dtypes, flags -- is a constant, so ``if mask is not None`` and
  ``if output_attentions`` resolve as in the real call;
* every traced value carries its metadata, computed on fake tensors (no data, no real computation): ``x.shape``,
  ``x.size(-1)``, ``x.dtype``, ``x.device``, ``len(x)`` are concrete, so ``(*x.shape[:-1], -1, head_dim)`` and
  ``if q.shape[2] > 1`` trace (the graph is then specialised on shapes, which its signature keys on); a value
  that depends on tensor data (``if mask.all()``) still fails the trace, as it must;
* a child's output keeps its real structure: the child's own plan (traced on the fly for the arguments it receives)
  says what it returns, so ``attn_output, attn_weights = self.attn(x)``, ``outputs[1] is not None`` and
  ``outputs.last_hidden_state`` resolve as in the real call; the replay checks that the child's real output has
  that structure.

Tracing runs the module's Python code, so it is guarded: tensor writes and random draws are refused at the ATen
level (:class:`~graphtrace.engine.fx.guard.TraceGuard`), attributes the code sets on its module tree are put back
and refuse the graph, and assigning an attribute on a traced value (which fx silently drops) fails the trace.
"""

from __future__ import annotations

import bisect
import dis
import inspect
import logging
import math
import operator
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.node import map_aggregate
from torch.utils._python_dispatch import _disable_current_modes

from graphtrace.engine.fx.containers import Structure, flatten, leaf_paths, unflatten
from graphtrace.engine.fx.effects import EffectWatch, SideEffectAbort
from graphtrace.engine.fx.expectation import UNKNOWN, Expectation, Opaque
from graphtrace.engine.fx.graph_flow import ChildCall, child_calls
from graphtrace.engine.fx.guard import TraceGuard, dispatches_itself
from graphtrace.engine.fx.signature import CONSTANT, TENSOR, Signature, is_constant, leaf_kind
from graphtrace.engine.fx.snapshot import restore, snapshot
from graphtrace.errors import describe_error

__all__ = [
    "META",
    "METADATA_FUNCTIONS",
    "METADATA_METHODS",
    "STRUCTURAL_OPS",
    "UNKNOWN",
    "Opaque",
    "Plan",
    "TraceContext",
    "impurity",
    "trace_module",
]

META = "graphtrace_value"
"""``node.meta`` key: what the node's value is made of at trace time (fake tensors, constants, :class:`Opaque`)."""

STRUCTURAL_OPS = frozenset({operator.getitem, getattr})
"""Ops that take a value apart rather than compute one; not counted as a module's own operations."""
TENSOR_METADATA = frozenset(
    {
        "shape",
        "dtype",
        "device",
        "ndim",
        "layout",
        "is_cuda",
        "is_cpu",
        "is_sparse",
        "is_quantized",
        "is_nested",
        "requires_grad",
    }
)
METADATA_METHODS = frozenset(
    {
        "size",
        "dim",
        "ndimension",
        "numel",
        "nelement",
        "stride",
        "is_contiguous",
        "is_floating_point",
        "is_complex",
        "element_size",
        "get_device",
    }
)
METADATA_FUNCTIONS = frozenset({torch.is_floating_point, torch.is_complex, torch.numel})
_PURE_MODULES = frozenset({"torch", "operator", "_operator", "math"})


@dataclass(frozen=True, slots=True)
class Plan:
    """A module's graph for one signature: placeholders in the order of the call's non-constant leaves, tensor
    constants the trace created, the structure that rebuilds the forward's output from the graph's flat output
    tuple, and that output's trace-time value (what a parent's trace learns about this module's output); its
    child calls with their static data flow (what a structural replay checks and reports)."""

    graph: fx.Graph
    constants: Mapping[str, torch.Tensor]
    output: Structure
    output_meta: Any
    last_uses: Mapping[fx.Node, tuple[fx.Node, ...]]
    own_ops: int
    calls: tuple[ChildCall, ...]
    returns: Mapping[fx.Node, Expectation]
    """Per ``call_module`` node, what the child's real output must look like (its trace-time value, taken apart)."""
    output_expectation: Expectation


@dataclass(frozen=True, slots=True)
class TraceContext:
    """What every trace of one capture shares: the fake-tensor mode metadata is computed in, and the way to the
    plan of a child module for given (fake) arguments."""

    fake_mode: FakeTensorMode
    plan_for: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Plan | str]


def impurity(op: str, target: Any, receiver: Any) -> str | None:
    """Why running this node again could change Python state the tensor guard cannot see (a method of a
    non-tensor object such as a cache's ``update``, a function from outside torch and the standard library);
    None when it cannot."""
    if isinstance(receiver, torch.Tensor) and dispatches_itself(receiver):
        return f"computes on {type(receiver).__name__} values, whose operators may communicate with other processes"
    if op == "call_method":
        if isinstance(receiver, torch.Tensor):
            return None
        return f"calls {type(receiver).__name__}.{target}, which a replay would repeat"
    if target in (operator.setitem, operator.delitem) and not isinstance(receiver, torch.Tensor):
        return f"changes a {type(receiver).__name__} in place ({target.__name__}), which a replay would repeat"
    if target in STRUCTURAL_OPS or (isinstance(target, type) and issubclass(target, tuple)):
        return None
    module = (getattr(target, "__module__", None) or "").split(".")[0]
    if module in _PURE_MODULES:
        return None
    return f"calls {module}.{getattr(target, '__qualname__', target)}, which a replay would repeat"


class _MissingMeta(Exception):
    pass


class _MetaProxy(fx.Proxy):
    """A proxy whose tensor metadata is concrete when known, and that refuses attribute assignment (fx would keep
    the attribute on the proxy object and drop it from the graph)."""

    def __getattr__(self, name: str) -> Any:
        meta = self.node.meta.get(META, UNKNOWN)
        if name in TENSOR_METADATA and isinstance(meta, torch.Tensor):
            return getattr(meta, name)
        return super().__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("node", "tracer") or name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        raise fx.proxy.TraceError(f"assigns attribute {name!r} on a traced value, which torch.fx cannot record")

    def __setitem__(self, key: Any, value: Any) -> None:  # ``x[mask] = 0``: fx records no node for it
        self.tracer.create_proxy("call_function", operator.setitem, (self, key, value), {})

    def _length(self) -> int | None:
        meta = self.node.meta.get(META, UNKNOWN)
        if isinstance(meta, torch.Tensor):
            return int(meta.shape[0]) if meta.dim() else None
        if isinstance(meta, (tuple, list, dict)):
            return len(meta)
        return None

    def __len__(self) -> int:
        length = self._length()
        if length is None:
            raise RuntimeError("'len' is not supported in symbolic tracing by default")
        return length

    def __iter__(self) -> Any:
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        with EffectWatch.paused():  # graphtrace reading the caller's bytecode: no model code runs here
            return self._iterate(caller)

    def _iterate(self, caller: Any) -> Any:
        meta = self.node.meta.get(META, UNKNOWN)
        if isinstance(meta, dict):
            return iter(list(meta))
        length = self._length()
        if length is not None:
            return (self[i] for i in range(length))  # type: ignore[index]  # fx's Proxy indexes by __getattr__
        # fx's own rule: unpacking into a fixed number of names works without knowing the length
        if caller is not None:
            instructions = list(dis.get_instructions(caller.f_code))
            index = bisect.bisect_left(instructions, caller.f_lasti, key=lambda inst: inst.offset)
            if index < len(instructions) and instructions[index].opname == "UNPACK_SEQUENCE":
                return (self[i] for i in range(instructions[index].argval))  # type: ignore[index]
        return self.tracer.iter(self)


def _define_inplace(name: str) -> None:
    """``x += y`` on a proxy: fx would record ``x + y`` (Python's fallback), a new tensor where the forward writes
    into ``x``; record the in-place operator itself so that the replay does what the forward does."""
    target = getattr(operator, name)

    def inplace(self: _MetaProxy, other: Any) -> Any:
        return self.tracer.create_proxy("call_function", target, (self, other), {})

    setattr(_MetaProxy, f"__{name}__", inplace)


for _name in (
    "iadd",
    "isub",
    "imul",
    "itruediv",
    "ifloordiv",
    "imod",
    "ipow",
    "iand",
    "ior",
    "ixor",
    "ilshift",
    "irshift",
    "imatmul",
):
    _define_inplace(_name)


class _ModuleTracer(fx.Tracer):
    """Traces one call of a module: every module it calls is a leaf, the call's leaves feed placeholders, values
    carry their trace-time metadata."""

    def __init__(self, forward: Callable[..., Any], call: Signature, context: TraceContext) -> None:
        super().__init__(autowrap_modules=(math,))
        self._forward = forward
        self._call = call
        self._context = context
        self._fake_mode = context.fake_mode
        self.constants: dict[str, torch.Tensor] = {}
        self.output: Structure | None = None
        self.output_meta: Any = UNKNOWN
        self._buffers: set[int] | None = None

    # -- how the module's own code is turned into nodes ------------------------------------------------------------

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _MetaProxy(node, self)

    def create_args_for_root(self, root_fn: Any, is_module: bool, concrete_args: Any = None) -> tuple[Any, list[Any]]:
        values: list[Any] = []
        proxies: list[Any] = []
        for i, (leaf, kind) in enumerate(zip(self._call.leaves, self._call.kinds)):
            if kind == CONSTANT:
                values.append(leaf)
                continue
            proxy = self.create_proxy("placeholder", f"input_{i}", (), {})
            proxy.node.meta[META] = self._fake(leaf) if kind == TENSOR else Opaque(leaf)
            values.append(proxy)
            proxies.append(proxy)

        def traced(*_: Any) -> tuple[Any, ...]:
            args, kwargs = unflatten(values, self._call.structure)
            leaves, self.output = flatten(self._forward(*args, **kwargs))
            metas = [self._meta_or_unknown(leaf) for leaf in leaves]
            known = not any(meta is UNKNOWN for meta in metas)
            self.output_meta = unflatten(metas, self.output) if known else UNKNOWN
            return tuple(leaves)

        return traced, proxies

    def create_arg(self, a: Any) -> Any:
        # fx stores a tensor made during the trace as an attribute of the traced module; keep it here instead.
        if isinstance(a, torch.Tensor) and not isinstance(a, nn.Parameter) and a not in self.tensor_attrs:
            if self._buffers is None:
                self._buffers = {id(b) for b in self.root.buffers()}
            if id(a) not in self._buffers:
                name = f"_graphtrace_constant_{len(self.constants)}"
                self.constants[name] = a
                self.tensor_attrs[a] = name
                return self.create_node("get_attr", name, (), {})
        return super().create_arg(a)

    def create_proxy(
        self,
        kind: str,
        target: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
        proxy_factory_fn: Any = None,
    ) -> Any:
        with EffectWatch.paused():  # torch's code on fake tensors: no model code runs here
            if kind in ("call_function", "call_method"):
                answer = self._answer(kind, target, args, kwargs)
                if answer is not UNKNOWN:
                    return answer
            proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
            if kind in ("call_function", "call_method"):
                proxy.node.meta[META] = self._run_on_fakes(kind, target, args, kwargs)
            elif kind == "get_attr":
                proxy.node.meta[META] = self._fake(self._fetch(target))
            return proxy

    def call_module(self, m: nn.Module, forward: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        qualname = self.path_of_module(m)
        meta = self._child_output(m, args, kwargs)
        proxy = self.create_proxy("call_module", qualname, args, kwargs)
        proxy.node.meta[META] = meta
        return self._structured(proxy, meta)

    # -- trace-time values ------------------------------------------------------------------------------------------

    def _fetch(self, target: str) -> Any:
        """The real attribute behind a ``get_attr`` target (read past the tracer's patched ``Module.__getattr__``)."""
        value: Any = self.root
        for atom in target.split("."):
            if isinstance(value, nn.Module):
                for registry in ("_parameters", "_buffers", "_modules"):
                    if atom in value.__dict__.get(registry, ()):
                        value = value.__dict__[registry][atom]
                        break
                else:
                    value = object.__getattribute__(value, atom)
            else:
                value = getattr(value, atom)
        return value

    def _fake(self, value: Any) -> Any:
        if isinstance(value, FakeTensor) or not isinstance(value, torch.Tensor):
            return value
        if dispatches_itself(value):  # a DTensor parameter: not made fake, not looked into
            return Opaque(value)
        with _disable_current_modes(), EffectWatch.paused():
            return self._fake_mode.from_tensor(value)

    def _meta_or_unknown(self, value: Any) -> Any:
        try:
            return self._metas(value, opaque=True)
        except _MissingMeta:
            return UNKNOWN

    def _metas(self, value: Any, *, opaque: bool) -> Any:
        """``value`` with every proxy replaced by its trace-time value and every real tensor by a fake one; raises
        when one is unknown (or opaque, unless ``opaque``: then the opaque object itself stands in)."""

        def convert(item: Any) -> Any:
            if isinstance(item, fx.Proxy):
                meta = item.node.meta.get(META, UNKNOWN)
                if meta is UNKNOWN or (isinstance(meta, Opaque) and not opaque):
                    raise _MissingMeta
                return meta
            if isinstance(item, torch.Tensor):
                return self._fake(item)
            return item

        return map_aggregate(value, convert)

    def _run_on_fakes(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The op's result on fake tensors, or UNKNOWN (unknown inputs, an impure op, a data-dependent result)."""
        try:
            fake_args = self._metas(args, opaque=False)
            fake_kwargs = self._metas(kwargs, opaque=False)
        except _MissingMeta:
            return UNKNOWN
        if impurity(kind, target, fake_args[0] if fake_args else None) is not None:
            return UNKNOWN
        try:
            with _disable_current_modes(), self._fake_mode:
                if kind == "call_method":
                    return getattr(fake_args[0], target)(*fake_args[1:], **fake_kwargs)
                return target(*fake_args, **fake_kwargs)
        # A boundary: any op of the user's forward, run on fake tensors (fake-tensor refusals, data-dependent
        # results, a user function's own checks); an op fake tensors cannot answer simply has no known metadata.
        except Exception:
            return UNKNOWN

    def _answer(self, kind: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A concrete answer, without a node, to a question about metadata (``x.size(-1)``, ``x.dim()``) or about
        the structure of a child's output (``outputs[1]`` when that is None); UNKNOWN when there is none."""
        if not args or not isinstance(args[0], fx.Proxy):
            return UNKNOWN
        meta = args[0].node.meta.get(META, UNKNOWN)
        if isinstance(meta, torch.Tensor):
            if (kind == "call_method" and target in METADATA_METHODS) or target in METADATA_FUNCTIONS:
                return self._run_on_fakes(kind, target, args, kwargs)
            if target is getattr and args[1] in TENSOR_METADATA:
                return getattr(meta, args[1])
            return UNKNOWN
        if target in STRUCTURAL_OPS and (isinstance(meta, (tuple, list, dict)) or _is_dataclass(meta)):
            if isinstance(args[1], fx.Proxy):
                return UNKNOWN
            try:
                element = meta[args[1]] if target is operator.getitem else getattr(meta, args[1])
            except (LookupError, TypeError, AttributeError):  # no such item or field (or an unusable key)
                return UNKNOWN
            return element if is_constant(element) else UNKNOWN
        return UNKNOWN

    def _child_output(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """What the child returns for these arguments, from its own plan; UNKNOWN when that cannot be known."""
        with EffectWatch.paused():  # graphtrace's own work (the child's trace watches itself)
            return self._child_plan_output(module, args, kwargs)

    def _child_plan_output(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            fake_args = self._metas(args, opaque=True)
            fake_kwargs = self._metas(kwargs, opaque=True)
        except _MissingMeta:
            return UNKNOWN
        unwrap = lambda item: item.value if isinstance(item, Opaque) else item  # noqa: E731
        plan = self._context.plan_for(module, map_aggregate(fake_args, unwrap), map_aggregate(fake_kwargs, unwrap))
        return plan.output_meta if isinstance(plan, Plan) else UNKNOWN

    def _structured(self, proxy: fx.Proxy, meta: Any) -> Any:
        """The child's output as the real call will have it: its containers rebuilt around proxies for its tensors
        (and opaque objects), its constants (None, flags, sizes) as they are."""
        if meta is UNKNOWN or isinstance(meta, (torch.Tensor, Opaque)):
            return proxy
        leaves, structure = flatten(meta)
        if structure.is_leaf:
            return proxy
        values = []
        for path, leaf in zip(leaf_paths(structure), leaves):
            if leaf_kind(leaf) == CONSTANT:
                values.append(leaf)
                continue
            value: Any = proxy
            for step, key in path:
                value = self.create_proxy(
                    "call_function", operator.getitem if step == "item" else getattr, (value, key), {}
                )
            values.append(value)
        try:
            return unflatten(values, structure)
        # A boundary: the child's container classes (ModelOutput, the user's dataclasses and named tuples) are
        # constructed with proxies, and their __init__/__post_init__ may check their fields any way they like.
        except Exception:  # a container that will not hold proxies: the child's output stays one opaque value
            return proxy


def _is_dataclass(value: Any) -> bool:
    return hasattr(type(value), "__dataclass_fields__")


# -- the trace and its checks -----------------------------------------------------------------------------------------


class _DropRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence what only tracing says: Python warnings about traced values, and the fake-tensor log of ops without
    a shape rule (their metadata is then unknown, which is not an error). Filters are put back on exit."""
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    drop = _DropRecords()
    fake_log.addFilter(drop)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        fake_log.removeFilter(drop)


def _impure_node(graph: fx.Graph) -> str | None:
    """``"Refused: ..."`` for the first node a replay could not run without repeating a Python side effect, as far as
    the trace-time values tell (the replay checks the rest)."""
    for node in graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        receiver = node.args[0] if node.args else None
        if isinstance(receiver, fx.Node):
            receiver = receiver.meta.get(META, UNKNOWN)
        if receiver is UNKNOWN and node.op == "call_method":
            continue
        reason = impurity(node.op, node.target, receiver.value if isinstance(receiver, Opaque) else receiver)
        if reason is not None:
            return f"Refused: {reason}"
    return None


def _last_uses(graph: fx.Graph) -> dict[fx.Node, tuple[fx.Node, ...]]:
    """For each node, the values no later node needs once it has run (freed as the replay goes)."""
    seen: set[fx.Node] = set()
    uses: dict[fx.Node, list[fx.Node]] = {}
    for node in reversed(graph.nodes):
        for used in node.all_input_nodes:
            if used not in seen:
                seen.add(used)
                uses.setdefault(node, []).append(used)
    return {node: tuple(values) for node, values in uses.items()}


def _stopped(watch: EffectWatch) -> str:
    return f"SideEffect: {watch.effect} (stopped before it ran while tracing, so that it runs once, in the real call)"


def trace_module(module: nn.Module, forward: Callable[..., Any], call: Signature, context: TraceContext) -> Plan | str:
    """The plan of ``module``'s ``forward`` for calls like ``call``, or why there is none (``"Type: message"``)."""
    with EffectWatch.paused():  # a child traced while its parent is: only the child's own trace is watched
        return _trace(module, forward, call, context)


def _trace(module: nn.Module, forward: Callable[..., Any], call: Signature, context: TraceContext) -> Plan | str:
    tracer = _ModuleTracer(forward, call, context)
    states = snapshot(module)
    watch = EffectWatch(module)
    try:
        with _quiet(), TraceGuard(), watch:
            graph = tracer.trace(module)
    except SideEffectAbort:
        restore(states)
        return _stopped(watch)
    # The documented boundary of fx capture (docs/fx.md): tracing runs the user's forward on proxies, and any failure
    # of it, whatever its type, is the module's fallback reason ("Type: message"), never an error of the capture.
    except Exception as exc:
        restore(states)
        if watch.effect is not None:
            return _stopped(watch)  # the forward caught the abort and failed on
        # a trace that stumbled over a value coming out of a cache's method names the method, not the stumble
        return _impure_node(tracer.graph) or describe_error(exc)
    changed = restore(states)
    if watch.effect is not None:
        return _stopped(watch)  # the forward caught the abort and traced on
    if changed is not None:
        return (
            f"SideEffect: tracing the forward changes {changed!r} of a module (put back), which a graph cannot replay"
        )
    impure = _impure_node(graph)
    if impure is not None:
        return impure
    assert tracer.output is not None
    own_ops = sum(
        1 for node in graph.nodes if node.op in ("call_function", "call_method") and node.target not in STRUCTURAL_OPS
    )
    returns = {node: Expectation(node.meta.get(META, UNKNOWN)) for node in graph.nodes if node.op == "call_module"}
    return Plan(
        graph,
        tracer.constants,
        tracer.output,
        tracer.output_meta,
        _last_uses(graph),
        own_ops,
        child_calls(graph),
        returns,
        Expectation(tracer.output_meta),
    )
