"""Replaying a module's graph beside its real call, to verify the graph and to learn what only the graph knows.

The real call runs the module's own forward (so its output, its children's calls and every recorded value are
exactly those of eager capture). Its graph is replayed in lockstep by :class:`Replay`: a :class:`torch.fx.Interpreter`
whose node execution it keeps (``call_function``, ``call_method``, ``fetch_args_kwargs_from_env``, ``fetch_attr``)
but whose ``run`` loop it replaces by a generator, :meth:`Replay._run`, which computes the module's own operations
up to the next ``call_module`` node and stops there; when the real forward calls that child, the replay checks
that it is the child the graph expected, with arguments equal bit for bit to those the graph computed, continues
with the child's real output (the child runs once, for real), and at the end checks the forward's output the same
way. A replay
that deviates anywhere, raises, or is refused by the :class:`~graphtrace.engine.fx.guard.ReplayGuard` fails, and
the call counts as eager capture, with the reason.

A verified replay contributes the data flow of the module's body: which child calls feed each child call, through
any reshapes and arithmetic in between. (Op records come from the op tier, engine/ops.py, during the real call.)
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from typing import Any

import torch
from torch import fx, nn

from graphtrace.engine.frame import Frame
from graphtrace.engine.fx.containers import unflatten
from graphtrace.engine.fx.guard import Refused, ReplayGuard, difference, tensors_in
from graphtrace.engine.fx.lockstep import END, Lockstep
from graphtrace.engine.fx.tracer import STRUCTURAL_OPS, Plan, impurity
from graphtrace.engine.recorder import Recorder
from graphtrace.errors import describe_error

__all__ = ["Replay"]


def _unique(ids: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(ids))


class Mismatch(Exception):
    """The replay and the real call went different ways."""


class _Call:
    """The replay stopped at a ``call_module`` node: the child it expects and the arguments it computed."""

    __slots__ = ("node", "module", "args", "kwargs")

    def __init__(self, node: fx.Node, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.node, self.module, self.args, self.kwargs = node, module, args, kwargs


class _Return:
    """The replay reached the output node: the forward's output as the graph computes it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


_NO_SUBMODULES = nn.Module()


class Replay(Lockstep, fx.Interpreter):
    """One call of a module, replayed from its :class:`Plan` in lockstep with the real call (see module docs): the
    shared :class:`~graphtrace.engine.fx.lockstep.Lockstep` walk, reaching each child call by computing the graph up
    to it. Its own loop (:meth:`_run`) stands in for ``Interpreter.run``, which cannot stop between nodes."""

    def __init__(
        self,
        module: nn.Module,
        plan: Plan,
        inputs: list[Any],
        recorder: Recorder,
        frame: Frame,
    ) -> None:
        Lockstep.__init__(self, module, plan, frame)
        # fx.Interpreter.__init__ maps every submodule of its module (a walk of the whole model for the root's
        # replay), a map nothing of the Interpreter's that runs here reads: it is made on an empty module, and
        # ``fetch_attr`` (which call_module and get_attr nodes use) walks the replayed module itself.
        fx.Interpreter.__init__(self, _NO_SUBMODULES, garbage_collect_values=False, graph=plan.graph)
        self.module = module
        self.name = "graphtrace.Replay"
        self.recorder = recorder
        self.guard = ReplayGuard()
        self._sources: dict[fx.Node, tuple[str, ...]] = {}
        self._step: _Call | _Return | None = None
        self._steps = self._run(inputs)

    # -- the walk's steps -------------------------------------------------------------------------------------------

    def _guarded(self, method: Any, *args: Any) -> Any:
        try:
            return method(*args)
        # A boundary: this runs inside the user's forward; whatever goes wrong verifying it (graphtrace's own
        # bookkeeping, a user's object compared with the graph's) makes the call unverified, not the forward fail.
        except Exception as exc:  # graphtrace's own trouble with this replay must never reach the user's forward
            self._fail(describe_error(exc))
            return None

    def _next_node(self) -> Any:
        step = self._step = self._advance()
        if step is None:
            return None
        return step.node if isinstance(step, _Call) else END

    def _accept(self, node: fx.Node, module: nn.Module, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
        step = self._step
        assert isinstance(step, _Call)
        found = difference((step.args, step.kwargs), (tuple(args), dict(kwargs)))
        if found is not None:
            self._fail(f"Mismatch: the input of {node.target}: {found}")
            return False
        # From here on the replay works on the very objects the child receives, so that what the child does to
        # them (an in-place activation) is seen by both.
        self._substitute(node.args, args)
        self._substitute(node.kwargs, kwargs)
        self.guard.protect((args, dict(kwargs)))
        return True

    def _flow_into(self, node: fx.Node) -> tuple[str, ...]:
        return _unique(source for used in node.all_input_nodes for source in self._sources.get(used, ()))

    def _begun(self, node: fx.Node, frame: Frame) -> None:
        self._sources[node] = (frame.id,)

    def _output_difference(self, output: Any) -> str | None:
        step = self._step
        assert isinstance(step, _Return)
        return difference(unflatten(list(step.value), self.plan.output), output)

    def _verified(self) -> None:
        self._steps.close()

    def _fail(self, reason: str) -> None:
        super()._fail(reason)
        self._steps.close()
        self.env.clear()

    def _advance(self) -> _Call | _Return | None:
        pending = self._take_returned()
        try:
            with torch.no_grad():
                return self._steps.send(pending)
        # A boundary: the replay runs the graph's ops, the user's code as traced, on real values; any exception
        # from it (an op's own error, the guard's Refused, a Mismatch) only says that this graph cannot be trusted.
        except Exception as exc:  # anything the replay raises only means this graph cannot be trusted
            self._fail(describe_error(exc))
            return None

    def _substitute(self, pattern: Any, actual: Any) -> None:
        if isinstance(pattern, fx.Node):
            if pattern in self.env:
                self.env[pattern] = actual
        elif isinstance(pattern, (list, tuple)) and isinstance(actual, (list, tuple)):
            for p, a in zip(pattern, actual):
                self._substitute(p, a)
        elif isinstance(pattern, dict) and isinstance(actual, dict):
            for key, p in pattern.items():
                if key in actual:
                    self._substitute(p, actual[key])

    # -- the replay -------------------------------------------------------------------------------------------------

    def _run(self, inputs: list[Any]) -> Generator[_Call | _Return, Any, None]:
        values = iter(inputs)
        env, sources, guard = self.env, self._sources, self.guard
        external: set[fx.Node] = set()
        for node in self.graph.nodes:
            op = node.op
            if op == "placeholder":
                value = next(values)
                sources[node] = _unique(p for t in tensors_in(value) if (p := self.recorder.producer_of(t)) is not None)
            elif op == "get_attr":
                constant = self.plan.constants.get(node.target)
                value = constant if constant is not None else self.fetch_attr(node.target)
                sources[node] = ()
            elif op == "call_module":
                args, kwargs = self.fetch_args_kwargs_from_env(node)
                value = yield _Call(node, self.fetch_attr(node.target), args, kwargs)
                found = self.plan.returns[node].nonconforming(value)
                if found is not None:
                    raise Mismatch(f"{node.target} returned {found} than the graph was traced with")
            elif op == "output":
                yield _Return(self.map_nodes_to_values(node.args[0], node))
                return
            else:
                value = self._run_op(node)
            if (op != "call_function" and op != "call_method") or _reads_from(node, external):
                external.add(node)  # a value the real call can see, not one the replay made
                guard.protect(value)
            env[node] = value
            for used in self.plan.last_uses.get(node, ()):
                env.pop(used, None)
                sources.pop(used, None)

    def _run_op(self, node: fx.Node) -> Any:
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        reason = impurity(node.op, node.target, args[0] if args else None)
        if reason is not None:
            raise Refused(reason)
        with self.guard:
            value = getattr(self, node.op)(node.target, args, kwargs)
        self._sources[node] = _unique(s for used in node.all_input_nodes for s in self._sources.get(used, ()))
        return value


def _reads_from(node: fx.Node, external: set[fx.Node]) -> bool:
    """An attribute or item read out of a value the real call can see (``past_key_values.layers[0].keys``, a child's
    output tuple): what it returns is not the replay's own either."""
    return (
        node.target in STRUCTURAL_OPS
        and bool(node.args)
        and isinstance(node.args[0], fx.Node)
        and (node.args[0] in external)
    )
