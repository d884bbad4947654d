"""Eager capture: every module's ``forward`` wrapped so that its calls reach the recorder.

This is transformers' own strategy and the fallback of the fx engine for modules torch.fx cannot trace. Every patch
goes through a :class:`PatchLedger` and is undone, in reverse order, when capture ends, also when the forward raised:
afterwards a module has exactly the ``forward`` it had (no instance attribute where there was none).

A module with forward hooks or forward pre-hooks (its own or torch's global ones, present when capture starts) is
recorded around ``nn.Module.__call__``'s body instead (``_call_impl``: pre-hooks, forward, hooks), so that its call
holds what its caller passed and what ``module(x)`` returned after the hooks changed it (quantization, adapters, a
probe). transformers' debugger records around ``forward``, before the hooks; its shim keeps doing so
(``after_hooks=False``) so that its files stay transformers' exactly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import nn

from graphtrace.engine.frame import Frame
from graphtrace.engine.recorder import Recorder

__all__ = [
    "PatchLedger",
    "attach_eager",
    "entry_point",
    "forward_hooks",
    "module_paths",
    "parameter_counts",
    "without_grad",
]

_MISSING = object()


class PatchLedger:
    """Instance attributes set during capture, with what they replaced, restored in reverse order."""

    def __init__(self) -> None:
        self._patches: list[tuple[Any, str, Any] | Callable[[], None]] = []

    def set_instance_attr(self, obj: Any, name: str, value: Any) -> None:
        """Set ``obj.name`` in the instance ``__dict__`` (no ``nn.Module.__setattr__`` side effects)."""
        self._patches.append((obj, name, obj.__dict__.get(name, _MISSING)))
        obj.__dict__[name] = value

    def enter(self, context: AbstractContextManager[Any]) -> None:
        """Enter ``context`` (a torch function mode) now and exit it with the other patches, in reverse order."""
        context.__enter__()

        def undo() -> None:
            context.__exit__(None, None, None)

        self._patches.append(undo)

    def on_restore(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the patches are undone, in its place in the reverse order."""
        self._patches.append(callback)

    def restore(self) -> None:
        """Undo every patch, newest first; safe to call twice."""
        while self._patches:
            patch = self._patches.pop()
            if callable(patch):
                patch()
                continue
            obj, name, old = patch
            if old is _MISSING:
                obj.__dict__.pop(name, None)
            else:
                obj.__dict__[name] = old

    def __len__(self) -> int:
        return len(self._patches)


def module_paths(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """Every distinct module with the path transformers gives it: the class name, then ``.{named_modules name}``.

    A module registered under several names is reported once, under its first name, as ``named_modules`` does. The
    walk is ``named_modules``' own (preorder, the same memo) without a generator per level; a model with a class
    that overrides ``named_modules`` is walked by that method."""
    root = type(model).__name__
    paths = _preorder(model, root)
    if paths is None:
        paths = [((f"{root}.{name}" if name else root), module) for name, module in model.named_modules()]
    return iter(paths)


_NAMED_MODULES = nn.Module.named_modules
_CHILDREN = nn.Module.children
_NAMED_CHILDREN = nn.Module.named_children


def _preorder(model: nn.Module, root: str) -> list[tuple[str, nn.Module]] | None:
    """``named_modules``' walk, or None when a class on the way has its own ``named_modules``."""
    seen: set[nn.Module] = set()
    paths = []
    pending: list[tuple[str, nn.Module]] = [(root, model)]
    while pending:
        path, module = pending.pop()
        if module in seen:
            continue
        if type(module).named_modules is not _NAMED_MODULES:
            return None
        seen.add(module)
        paths.append((path, module))
        children = [(f"{path}.{name}", child) for name, child in module._modules.items() if child is not None]
        pending.extend(reversed(children))
    return paths


def is_leaf(module: nn.Module) -> bool:
    """A module without child modules: the transformers format records outputs only for these (and the root)."""
    kind = type(module)
    if kind.children is _CHILDREN and kind.named_children is _NAMED_CHILDREN:
        # what children() yields: the entries of _modules that are not None
        return all(child is None for child in module._modules.values())
    return next(iter(module.children()), None) is None


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """The number of parameter elements each module holds, itself and its submodules (a tied weight once, as
    ``module.parameters()`` counts it), by path; modules without parameters are left out. Parameters a lazy module
    has not made yet do not count. Summed up the tree in one pass; a model that shares a weight or a module between
    places is counted module by module instead."""
    paths = list(module_paths(model))
    modules = [module for _, module in paths]
    own = [[p for p in module._parameters.values() if p is not None and _counted(p)] for module in modules]
    held = [p for found in own for p in found]
    references = sum(1 for module in modules for child in module._modules.values() if child is not None)
    if references != len(modules) - 1 or len({id(p) for p in held}) != len(held):  # something is shared
        totals = [sum(p.numel() for p in module.parameters() if _counted(p)) for module in modules]
    else:
        index = {id(module): k for k, module in enumerate(modules)}
        totals = [sum(parameter.numel() for parameter in found) for found in own]
        for k in range(len(modules) - 1, -1, -1):  # preorder reversed: children before their parents
            totals[k] += sum(totals[index[id(child)]] for child in modules[k]._modules.values() if child is not None)
    return {path: total for (path, _), total in zip(paths, totals, strict=True) if total}


def _counted(parameter: nn.Parameter) -> bool:
    return not isinstance(parameter, nn.parameter.UninitializedParameter)


def forward_hooks(module: nn.Module) -> tuple[str, ...]:
    """The forward pre-hooks and forward hooks that run when ``module`` is called, torch's global ones first (as they
    run), each by its kind and name: ``("forward hook: Quantizer.dequantize",)``. torch.distributed's own hooks are
    left out: tensor parallelism's redistribution of inputs and outputs and FSDP's gathering of parameters are how a
    sharded model runs, and its calls are recorded as its forward sees them, DTensors with their placements."""
    from torch.nn.modules import module as torch_module  # torch's global hooks live there, mutated in place

    if not (
        module._forward_hooks
        or module._forward_pre_hooks
        or torch_module._global_forward_hooks
        or torch_module._global_forward_pre_hooks
    ):
        return ()  # nearly every module: nothing to name
    kinds = (
        ("forward pre-hook", torch_module._global_forward_pre_hooks, module._forward_pre_hooks),
        ("forward hook", torch_module._global_forward_hooks, module._forward_hooks),
    )
    return tuple(
        f"{kind}: {_callable_name(hook)}"
        for kind, *hooks in kinds
        for found in hooks
        for hook in found.values()
        if not _distributed(hook)
    )


def _function(hook: Any) -> Any:
    return getattr(hook, "func", hook)  # a functools.partial by what it calls


def _callable_name(hook: Any) -> str:
    function = _function(hook)
    return str(getattr(function, "__qualname__", None) or type(function).__qualname__)


def _distributed(hook: Any) -> bool:
    return str(getattr(_function(hook), "__module__", "") or "").startswith("torch.distributed.")


def entry_point(module: nn.Module, after_hooks: bool) -> tuple[str, Callable[..., Any]]:
    """The method that capture wraps on ``module`` (its name and current value): ``forward``; or, when ``after_hooks``
    and hooks run around the module's forward, ``_call_impl`` (``nn.Module.__call__``'s body), so that the call is
    recorded as its caller sees it. A compiled module (``module.compile()``) and one whose class has its own
    ``__call__`` keep ``forward``: their calls may not reach ``_call_impl``."""
    if (
        after_hooks
        and type(module).__call__ is _MODULE_CALL
        and module._compiled_call_impl is None
        and forward_hooks(module)
    ):
        return "_call_impl", module._call_impl
    return "forward", module.forward


_MODULE_CALL = nn.Module.__call__


def without_grad(forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` run under no_grad, the caller's grad mode restored after: what ``torch.no_grad()`` does, without
    a context manager object per module call."""
    set_grad_enabled, is_grad_enabled = torch._C._set_grad_enabled, torch.is_grad_enabled

    def run(*args: Any, **kwargs: Any) -> Any:
        mode = is_grad_enabled()
        set_grad_enabled(False)
        try:
            return forward(*args, **kwargs)
        finally:
            set_grad_enabled(mode)

    return run


class CallWatcher(Protocol):
    """What another engine adds around each recorded call (the fx engine, engine/fx/dispatch.py, replays the
    module's graph beside it). The forward wrapper is the same for every engine; a watcher only hears the call."""

    def passes_through(self) -> bool:
        """Whether the forward runs unrecorded and unwatched (torch.fx tracing through it)."""
        ...

    def before(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call is about to be recorded; returns what :meth:`start` needs (called even when nothing records)."""
        ...

    def start(self, before: Any, module: nn.Module, path: str, frame: Frame, args: Any, kwargs: Any) -> Any:
        """The recorder has begun ``frame``; returns the watch of this call (raising marks the call as failed)."""
        ...

    def returned(self, watch: Any, module: nn.Module, path: str, output: Any) -> None:
        """The real call returned ``output``; the recorder has not ended it yet."""
        ...

    def failed(self, watch: Any) -> None:
        """The real call raised."""
        ...


def make_wrapper(
    recorder: Recorder,
    module: nn.Module,
    path: str,
    forward: Callable[..., Any],
    *,
    root: bool,
    no_grad: bool,
    watcher: CallWatcher | None = None,
) -> Callable[..., Any]:
    """A forward that reports its call to ``recorder`` around ``forward`` (and to ``watcher``, if any).

    Inputs are recorded before and outputs after the call, in the caller's grad mode (as transformers does); the
    call itself runs under ``torch.no_grad()`` when ``no_grad``.
    """
    type_name = type(module).__name__
    leaf = is_leaf(module)
    begin, end, fail = recorder.begin, recorder.end, recorder.fail

    if watcher is None:
        set_grad_enabled, is_grad_enabled = torch._C._set_grad_enabled, torch.is_grad_enabled

        def recording_forward(*args: Any, **kwargs: Any) -> Any:
            # without_grad's work inline: one Python frame per call instead of two
            frame = begin(path, type_name, leaf, args, kwargs, root=root)
            mode = is_grad_enabled()
            if no_grad:
                set_grad_enabled(False)
            try:
                output = forward(*args, **kwargs)
            except BaseException as exc:
                if no_grad:
                    set_grad_enabled(mode)
                if frame is not None:
                    fail(frame, exc)
                raise
            if no_grad:
                set_grad_enabled(mode)
            if frame is not None:
                end(frame, output)
            return output

        return functools.wraps(forward)(recording_forward)

    call = without_grad(forward) if no_grad else forward

    def watched_forward(*args: Any, **kwargs: Any) -> Any:
        if watcher.passes_through():
            return forward(*args, **kwargs)
        before = watcher.before(module, args, kwargs)
        frame = begin(path, type_name, leaf, args, kwargs, root=root)
        if frame is None:
            return call(*args, **kwargs)
        try:
            watch = watcher.start(before, module, path, frame, args, kwargs)
        except BaseException as exc:  # an interrupt while tracing: the call is marked, the trace kept
            fail(frame, exc)
            raise
        try:
            output = call(*args, **kwargs)
        except BaseException as exc:
            watcher.failed(watch)
            fail(frame, exc)
            raise
        watcher.returned(watch, module, path, output)
        end(frame, output)
        return output

    return functools.wraps(forward)(watched_forward)


def attach_eager(
    model: nn.Module,
    recorder: Recorder,
    ledger: PatchLedger,
    *,
    root_no_grad: bool,
    after_hooks: bool = True,
    only: set[str] | None = None,
) -> None:
    """Wrap the forward of ``model`` and of every submodule (or only of the paths in ``only``); with
    ``after_hooks``, a module with hooks is wrapped around its hooks too (see :func:`entry_point`).

    Submodule calls always run under ``torch.no_grad()``; the root's own body does so when ``root_no_grad``
    (transformers leaves the root in the caller's grad mode).
    """
    for path, module in module_paths(model):
        if only is not None and path not in only:
            continue
        is_root = module is model
        name, call = entry_point(module, after_hooks)
        wrapper = make_wrapper(recorder, module, path, call, root=is_root, no_grad=root_no_grad if is_root else True)
        ledger.set_instance_attr(module, name, wrapper)
