"""The fx engine's per-module forwards: each call is recorded as eager capture records it, and verified against
its module's graph.

Every module's ``forward`` is replaced (through the :class:`~graphtrace.engine.eager.PatchLedger`) by a forward that
reports the call to the recorder exactly as the eager engine does -- same events, same arguments, same grad mode,
hooks untouched -- and runs the module's own forward. Beside it, the module's graph for this call's signature
(traced on first sight, cached per module key and signature in the model's
:class:`~graphtrace.engine.fx.plans.PlanStore`, across captures and identical instances) is replayed in lockstep
(:class:`~graphtrace.engine.fx.replay.Replay`) the first time the plan is used in a capture; later calls of a plan
verified in this capture are checked structurally (:class:`~graphtrace.engine.fx.structural_replay.StructuralReplay`).
When the replay matches the real call bit for bit, the call is recorded as served by fx (``strategy="fx"``) with
the graph's data flow (op records come from the op tier, engine/ops.py, for every engine alike). When the
module cannot be traced, or its graph deviates once, that module and signature keep eager capture, and the reason
goes into the trace's fallbacks.

So the real forward runs exactly once, and the model's output, the module tree and every recorded value are those
of eager capture whatever fx does; fx adds verified structure and never replaces a value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

from torch import nn

from graphtrace.engine.eager import PatchLedger, entry_point, make_wrapper, module_paths
from graphtrace.engine.frame import Frame
from graphtrace.engine.fx.lockstep import Lockstep
from graphtrace.engine.fx.plans import PLANS_PER_MODULE, PlanStore, module_keys, store_for
from graphtrace.engine.fx.replay import Replay
from graphtrace.engine.fx.signature import CONSTANT, Signature, signature
from graphtrace.engine.fx.structural_replay import StructuralReplay
from graphtrace.engine.fx.tracer import Plan, TraceContext, trace_module
from graphtrace.engine.recorder import Recorder
from graphtrace.errors import describe_error

__all__ = ["PLANS_PER_MODULE", "FxEngine", "attach_fx"]


class FxEngine:
    """The state of fx capture for one model: the plan store and the module keys, the plans verified in this
    capture, the replays in progress, and the fallbacks (module path -> reason)."""

    def __init__(
        self,
        recorder: Recorder,
        store: PlanStore,
        keys: dict[int, Hashable | None],
    ) -> None:
        self.recorder = recorder
        self.fallbacks: dict[str, str] = {}
        self._store = store
        self._keys = keys
        self._local: dict[Hashable, dict[Hashable, Plan | str]] = {}  # modules without a key: this capture only
        self._failed: dict[tuple[Hashable, Hashable], str] = {}  # replays that deviated in this capture
        self._verified: dict[int, Plan] = {}  # plans replayed bit for bit in this capture
        self._forwards: dict[int, Callable[..., Any]] = {}
        self._replays: list[Lockstep | None] = []
        self._tracing = 0
        self._context = TraceContext(self._store.fake_mode, self.plan_for)

    def release(self) -> None:
        """Capture is over: the trace context no longer plans through this engine, and the model's forwards are let
        go. Without these references back, the engine and its recorder are freed with their last user, not left to
        the garbage collector (which is slow to come, and meanwhile keeps every record alive)."""
        self._context = dataclasses.replace(self._context, plan_for=_capture_ended)
        self._forwards.clear()
        self._replays.clear()

    def wrap(
        self,
        module: nn.Module,
        path: str,
        forward: Callable[..., Any],
        call: Callable[..., Any],
        *,
        root: bool,
        no_grad: bool,
    ) -> Callable[..., Any]:
        """A replacement for ``call`` (``module``'s forward, or its ``_call_impl`` when hooks run around it) that
        records its calls (the eager engine's wrapper) and verifies them against the graph of ``forward`` (this
        engine, as the wrapper's :class:`~graphtrace.engine.eager.CallWatcher`): hooks that change what the call
        returns make the graph deviate, and the module keeps eager capture."""
        self._forwards[id(module)] = forward
        return make_wrapper(self.recorder, module, path, call, root=root, no_grad=no_grad, watcher=self)

    # -- the CallWatcher of every module's forward ----------------------------------------------------------------

    def passes_through(self) -> bool:
        return self._tracing > 0  # a trace reached a forward directly (``child.forward(x)``): fx traces through it

    def before(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        caller = self._replays[-1] if self._replays else None
        if caller is not None:
            caller.child_call(module, args, kwargs)
        return caller

    def start(self, before: Any, module: nn.Module, path: str, frame: Frame, args: Any, kwargs: Any) -> Any:
        caller: Lockstep | None = before
        if caller is not None:
            caller.child_begun(frame)
        replay, key = self._start_replay(module, path, args, kwargs, frame)
        self._replays.append(replay)
        return caller, replay, key

    def returned(self, watch: Any, module: nn.Module, path: str, output: Any) -> None:
        caller, replay, key = watch
        self._replays.pop()
        if replay is not None:
            self._settle(replay, module, key, path, output)
        if caller is not None:
            caller.child_returned(output)

    def failed(self, watch: Any) -> None:
        _, replay, _ = watch
        self._replays.pop()
        if replay is not None:
            replay.abandon()

    def tracing(self) -> bool:
        """Whether a module is being traced now: the forward code that runs is torch.fx's, not the model's call."""
        return self._tracing > 0

    def plan_for(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan | str:
        """The plan of ``module`` for a call with these arguments (traced on first sight), or why there is none."""
        return self._plan(module, signature(module, args, kwargs))

    def _cache_key(self, module: nn.Module) -> Hashable:
        key = self._keys.get(id(module))
        return key if key is not None else ("instance", id(module))

    def _plan(self, module: nn.Module, call: Signature) -> Plan | str:
        module_key = self._cache_key(module)
        if self._failed:
            failure = self._failed.get((module_key, call.key))
            if failure is not None:
                return failure
        shared = self._keys.get(id(module)) is not None
        kept = self._store.plans if shared else self._local
        plans = kept.get(module_key)
        if plans is None:
            plans = kept[module_key] = {}
        plan = plans.get(call.key)
        if plan is None:
            forward = self._forwards.get(id(module))
            if forward is None:
                return "NameError: the module is not part of the traced model"
            self._tracing += 1
            try:
                plan = trace_module(module, forward, call, self._context)
            finally:
                self._tracing -= 1
            if len(plans) >= PLANS_PER_MODULE:  # shapes that change every call (generate without a cache)
                del plans[next(iter(plans))]
            if shared and isinstance(plan, Plan):
                plan = self._store.canonical(module, call.key, plan)
            plans[call.key] = plan
        return plan

    def _start_replay(
        self, module: nn.Module, path: str, args: tuple[Any, ...], kwargs: dict[str, Any], frame: Frame
    ) -> tuple[Lockstep | None, Hashable]:
        """The replay that verifies this call, and the signature it is cached under; no replay (and the reason in
        the fallbacks) when the module has no plan for it."""
        try:
            call = signature(module, args, kwargs)
            plan = self._plan(module, call)
        # A boundary (docs/fx.md): this runs inside the user's forward, on the user's arguments (their containers,
        # hashes, tensor subclasses) and on graphtrace's plan store; whatever fails here only means this call is
        # not verified, never that the forward fails. The reason is kept in the trace's fallbacks.
        except Exception as exc:  # an argument graphtrace cannot key a cache on: this call stays eager
            self.fallbacks.setdefault(path, describe_error(exc))
            return None, None
        if isinstance(plan, str):
            self.fallbacks.setdefault(path, plan)
            return None, call.key
        inputs = (
            [leaf for leaf, kind in zip(call.leaves, call.kinds) if kind != CONSTANT]
            if CONSTANT in call.kinds
            else call.leaves
        )
        if id(plan) in self._verified or (frame.leaf and id(plan) in self._store.proven_leaves):
            return StructuralReplay(module, plan, inputs, self.recorder, frame), call.key
        return Replay(module, plan, inputs, self.recorder, frame), call.key

    def _settle(self, replay: Lockstep, module: nn.Module, key: Hashable, path: str, output: Any) -> None:
        if replay.finish(output):
            replay.frame.strategy = "fx"
            self._verified[id(replay.plan)] = replay.plan
            if (
                replay.frame.leaf
                and not isinstance(replay, StructuralReplay)
                and self._keys.get(id(module)) is not None
            ):
                self._store.proven_leaves[id(replay.plan)] = replay.plan
            return
        assert replay.failure is not None
        # A graph that deviated once is not trusted again in this capture, for this module and its identical twins.
        self._failed[(self._cache_key(module), key)] = replay.failure
        self.fallbacks.setdefault(path, replay.failure)


def _capture_ended(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    return "the capture had ended"


def attach_fx(
    model: nn.Module, recorder: Recorder, ledger: PatchLedger, *, root_no_grad: bool, after_hooks: bool = True
) -> FxEngine:
    """Install the fx engine's forwards on ``model`` and every submodule (around their hooks too, with
    ``after_hooks``: :func:`~graphtrace.engine.eager.entry_point`); returns the engine (its ``fallbacks`` fill as
    the model runs)."""
    paths = list(module_paths(model))
    store = store_for(model)
    keys = module_keys(model, store.canonical_keys)  # before any forward is patched
    store.keep_only({key for key in keys.values() if key is not None})
    engine = FxEngine(recorder, store, keys)
    ledger.on_restore(engine.release)
    for path, module in paths:
        is_root = module is model
        name, call = entry_point(module, after_hooks)
        no_grad = root_no_grad if is_root else True
        wrapper = engine.wrap(module, path, module.forward, call, root=is_root, no_grad=no_grad)
        ledger.set_instance_attr(module, name, wrapper)
    return engine
