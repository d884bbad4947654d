"""Python side effects of a module's code, stopped before they happen while the module is traced.

Tracing runs the forward's Python code once more, on symbolic values, beside the real call. What that code does to
tensors is guarded at the ATen level (``guard.py``) and what it does to its module tree is snapshotted and put back
(``snapshot.py``); what it does to the rest of the Python world (appends to a global list, prints, assigns a global,
starts a nested capture) cannot be put back. :class:`EffectWatch` sees those through the interpreter's profile hook,
which runs *before* each call: the first one found aborts the trace before it happens, the module falls back to
eager capture, and the effect runs exactly once, in the real call.

What it sees, in code outside torch, graphtrace and the standard library:

- a call of ``print``, ``input``, ``breakpoint``, ``exec`` (which runs arbitrary code), a draw from Python's or numpy's
  random streams, a write to a file or stream;
- a method that changes a list, dict, set, deque or bytearray reachable from outside the call: from the calling
  code's globals (and the classes and plain objects they hold), its closure, or the module tree;
- a function whose code assigns a global or a variable of an enclosing function (``global``/``nonlocal``), or
  assigns into an item or attribute of a global (``REGISTRY[key] = x``): decided from its bytecode when it is
  called, so even a branch that would not have run counts;
- logging that would emit a record, and a nested ``graphtrace.capture``.

It does not see attribute writes on plain objects held elsewhere (``holder.count += 1`` where ``holder`` is an
argument's attribute), nor effects made by C extensions; the guard and snapshot cover tensors and the module tree.
A profiler already installed (cProfile, pyinstrument) is left alone and nothing is watched.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import dis
import gc
import io
import logging
import os
import random
import sys
import sysconfig
import threading
import types
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from torch import nn

__all__ = ["EffectWatch", "SideEffectAbort"]


class SideEffectAbort(BaseException):
    """Raised from the profile hook to stop a trace before a side effect. A BaseException, so that a forward's own
    ``except Exception`` does not swallow it and trace on."""


_EFFECTFUL_BUILTINS = frozenset({builtins.print, builtins.input, builtins.breakpoint, builtins.exec})
_WRITING_METHODS = frozenset({"write", "writelines", "flush", "truncate"})
_MUTATORS: dict[type, frozenset[str]] = {
    list: frozenset({"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "__setitem__"}),
    dict: frozenset({"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}),
    set: frozenset({"add", "update", "discard", "remove", "pop", "clear", "difference_update", "intersection_update"}),
    collections.deque: frozenset({"append", "appendleft", "extend", "extendleft", "pop", "popleft", "clear", "remove"}),
    bytearray: frozenset({"append", "extend", "insert", "pop", "remove", "clear"}),
}
_MUTATED_TYPES = tuple(_MUTATORS)
_GLOBAL_STORES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL"})
_ITEM_STORES = frozenset({"STORE_SUBSCR", "DELETE_SUBSCR", "STORE_ATTR", "DELETE_ATTR"})
_SIMPLE_LOADS = frozenset({"LOAD_FAST", "LOAD_CONST", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF"})


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""graphtrace's own folder."""


def _folders(*paths: str) -> tuple[str, ...]:
    return tuple(os.path.join(os.path.realpath(path), "") for path in paths)


def _library_roots() -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The folders of torch and graphtrace, of the standard library, and of installed packages (which lie inside
    the standard library's folder: transformers or a port installed there is model code)."""
    import torch

    paths = sysconfig.get_paths()
    return (
        _folders(os.path.dirname(torch.__file__), _PACKAGE),
        _folders(paths["stdlib"], paths["platstdlib"]),
        _folders(paths["purelib"], paths["platlib"]),
    )


_LIBRARY_ROOTS: tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]] | None = None
_CODE_VERDICTS: dict[types.CodeType, tuple[bool, str | None]] = {}  # code -> (is user code, effect its body makes)
_CODE_VERDICTS_LIMIT = 100_000
_LOGGING_HANDLE = logging.Logger.handle.__code__
_ENTRY_PASSAGES = (contextlib.__file__, os.path.join(_PACKAGE, ""))


def _is_user_code(filename: str) -> bool:
    global _LIBRARY_ROOTS
    if _LIBRARY_ROOTS is None:
        _LIBRARY_ROOTS = _library_roots()
    if filename.startswith(("<frozen", "<built-in")):
        return False
    ours, standard, installed = _LIBRARY_ROOTS
    path = os.path.realpath(filename)
    if path.startswith(ours):
        return False
    return path.startswith(installed) or not path.startswith(standard)


def _body_effect(code: types.CodeType) -> str | None:
    """An effect the function's bytecode makes on the world outside it, wherever in its body it is."""
    instructions = list(dis.get_instructions(code))
    for i, ins in enumerate(instructions):
        if ins.opname in _GLOBAL_STORES:
            return f"assigns the global {ins.argval!r}"
        if ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
            return f"assigns {ins.argval!r} of an enclosing function (nonlocal)"
        if ins.opname in _ITEM_STORES:
            # ``G[k] = v`` / ``G.a = v``: the stored-into object is loaded right before the key (or is the last load)
            back = 1 if ins.opname.endswith("ATTR") else 2
            if i >= back and (back == 1 or instructions[i - 1].opname in _SIMPLE_LOADS):
                target = instructions[i - back]
                if target.opname in ("LOAD_GLOBAL", "LOAD_NAME") or (
                    target.opname == "LOAD_DEREF" and target.argval in code.co_freevars
                ):
                    what = "an item" if "SUBSCR" in ins.opname else f"the attribute {ins.argval!r}"
                    return f"assigns {what} of the global {target.argval!r}"
    return None


def _verdict(frame: types.FrameType) -> tuple[bool, str | None]:
    """(whether the frame runs model code, the effect its function's body makes), cached per code object."""
    code = frame.f_code
    verdict = _CODE_VERDICTS.get(code)
    if verdict is None:
        if code.co_filename.startswith("<") and not code.co_filename.startswith("<frozen"):
            # code made by exec (torch.fx's generated lambdas, a dataclass's __init__): whose it is, its globals say
            user = not _library_module(str(frame.f_globals.get("__name__", "")))
        else:
            user = _is_user_code(code.co_filename)
        verdict = (user, _body_effect(code) if user else None)
        if len(_CODE_VERDICTS) >= _CODE_VERDICTS_LIMIT:
            _CODE_VERDICTS.clear()
        _CODE_VERDICTS[code] = verdict
    return verdict


def _library_module(name: str) -> bool:
    top = name.partition(".")[0]
    return top in ("torch", "graphtrace") or top in sys.stdlib_module_names


def _is_numpy_random(receiver: Any) -> bool:
    """numpy's RandomState or Generator (without importing numpy: only if the model's code already did)."""
    module = type(receiver).__module__
    return module.startswith("numpy.random") and type(receiver).__name__ in ("RandomState", "Generator")


def _logged_by_user_code(frame: types.FrameType) -> bool:
    """Whether the logging call that reached ``frame`` (``Logger.handle``) was made by model code, not by torch's
    own logs while tracing (which tracing silences)."""
    caller = frame.f_back
    while caller is not None and caller.f_code.co_filename == logging.__file__:
        caller = caller.f_back
    return caller is not None and _verdict(caller)[0]


def _shallow_values(holder: Any) -> Iterable[Any]:
    """What ``holder`` holds one level down: a container's items, an object's or class's attributes."""
    if isinstance(holder, dict):
        return list(holder.values())
    if isinstance(holder, list | tuple):
        return holder
    namespace = getattr(holder, "__dict__", None)
    if isinstance(namespace, dict | types.MappingProxyType):
        return list(namespace.values())
    return ()


_COLLECTION_LOCK = threading.Lock()
_COLLECTION = {"pausers": 0, "was_enabled": False}


def _pause_collection() -> None:
    with _COLLECTION_LOCK:
        if _COLLECTION["pausers"] == 0:
            _COLLECTION["was_enabled"] = gc.isenabled()
            gc.disable()
        _COLLECTION["pausers"] += 1


def _resume_collection() -> None:
    with _COLLECTION_LOCK:
        _COLLECTION["pausers"] -= 1
        if _COLLECTION["pausers"] == 0 and _COLLECTION["was_enabled"]:
            gc.enable()


class EffectWatch:
    """A context manager that aborts the model code running inside it (with :class:`SideEffectAbort`) at the first
    side effect it sees; :attr:`effect` says which.

    Two interpreter hooks, on this thread only: the trace hook sees every Python call (a function's body is judged
    when it is entered, and the profile hook switched on exactly while model code runs); the profile hook then sees
    the builtins that model code calls. torch's own code, which makes most of the calls while tracing, costs one
    lookup per call. A watch started inside another (a child traced while its parent is) reports to the innermost
    and hands the hooks back on exit; a tracer or profiler someone else installed (a debugger, coverage, cProfile)
    is left alone, and nothing is watched."""

    _stack: ClassVar[threading.local] = threading.local()

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self.effect: str | None = None
        self._active = False
        self._profiling = False  # of the outermost watch, whose methods are the hooks
        self._saved: tuple[Any, bool] = (None, False)
        self._collecting = False

    @classmethod
    def _watches(cls) -> list[EffectWatch]:
        watches: list[EffectWatch] | None = getattr(cls._stack, "watches", None)
        if watches is None:
            watches = cls._stack.watches = []
        return watches

    def __enter__(self) -> EffectWatch:
        watches = self._watches()
        if not watches and (sys.gettrace() is not None or sys.getprofile() is not None):
            return self  # someone else traces or profiles this thread: leave their hooks, watch nothing
        if not watches:
            # a collection's callbacks (gc.callbacks) would run inside the watch as if the model's code called them;
            # gc is the process's, so it is switched off while any thread watches and back on when the last ends
            _pause_collection()
            self._collecting = True
        watches.append(self)
        self._active = True
        hooks = watches[0]
        self._saved = (sys.gettrace(), hooks._profiling)
        sys.settrace(hooks._on_call)
        hooks._profile(False)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._active:
            return
        watches = self._watches()
        hooks = watches[0]
        watches.pop()
        trace, profiling = self._saved
        sys.settrace(trace)  # also after an abort, which made the interpreter drop the hook that raised
        hooks._profiling = not profiling  # force the call: the interpreter may have dropped the profile hook
        hooks._profile(profiling)
        if not watches and self._collecting:
            self._collecting = False
            _resume_collection()

    @classmethod
    @contextmanager
    def paused(cls) -> Iterator[None]:
        """No watching inside: for graphtrace's own work while tracing that runs no model code (an op run on fake
        tensors, a proxy made, a child's plan looked up), which is where most of a trace's Python calls are."""
        watches = cls._watches()
        if not watches:
            yield
            return
        hooks = watches[0]
        saved = (sys.gettrace(), hooks._profiling)
        sys.settrace(None)
        hooks._profile(False)
        try:
            yield
        finally:
            sys.settrace(saved[0])
            hooks._profile(saved[1])

    def _abort(self, effect: str) -> None:
        watch = self._watches()[-1]
        watch.effect = effect
        # Nothing more is watched until the watch exits (the interpreter drops the hook that raises anyway): the
        # code unwinding the trace (torch.fx putting back its patches) must run unhindered.
        self._profile(False)
        sys.settrace(None)
        raise SideEffectAbort(effect)

    def _profile(self, on: bool) -> None:
        if on != self._profiling:
            self._profiling = on
            sys.setprofile(self._on_builtin if on else None)

    def _on_call(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        """The trace hook for every new Python frame (``event`` is ``"call"``)."""
        code = frame.f_code
        user, effect = _verdict(frame)
        if effect is not None:
            self._abort(f"{code.co_qualname}() {effect}")
        if not user:
            if code is _LOGGING_HANDLE and _logged_by_user_code(frame):
                self._abort(f"logs through {frame.f_locals.get('self')!r}")
            if _starts_a_capture(code):
                caller = frame.f_back
                while caller is not None and caller.f_code.co_filename.startswith(_ENTRY_PASSAGES):
                    caller = caller.f_back  # graphtrace's lazy names, contextlib for tracing()
                if caller is not None and _verdict(caller)[0]:
                    self._abort(f"{caller.f_code.co_qualname}() starts a nested graphtrace {code.co_name}()")
        caller = frame.f_back
        returns_to_user = caller is not None and _verdict(caller)[0]
        self._profile(user)
        if user == returns_to_user:
            return None
        frame.f_trace_lines = False
        return self._on_return

    def _on_return(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        """The local trace hook of a frame whose caller is of the other kind (model code calling torch, or torch
        calling model code): the profile hook follows the caller when it returns."""
        if event == "return":
            caller = frame.f_back
            self._profile(caller is not None and _verdict(caller)[0])
        return self._on_return

    def _on_builtin(self, frame: types.FrameType, event: str, function: Any) -> None:
        """The profile hook, on while model code runs: the builtins it calls."""
        if event != "c_call" or not _verdict(frame)[0]:
            return
        caller = frame.f_code.co_qualname
        if function in _EFFECTFUL_BUILTINS:
            self._abort(f"{caller}() calls {function.__name__}()")
        receiver = getattr(function, "__self__", None)
        if isinstance(receiver, random.Random) or _is_numpy_random(receiver):
            self._abort(f"{caller}() draws from {type(receiver).__name__}.{function.__name__} (a random stream)")
        if isinstance(receiver, io.IOBase) and function.__name__ in _WRITING_METHODS:
            self._abort(f"{caller}() writes to {type(receiver).__name__}.{function.__name__}")
        if not isinstance(receiver, _MUTATED_TYPES):
            return
        mutators = next(names for kind, names in _MUTATORS.items() if isinstance(receiver, kind))
        if function.__name__ in mutators and self._reachable(receiver, frame):
            kind = type(receiver).__name__
            self._abort(f"{caller}() calls {kind}.{function.__name__} on a {kind} held outside the call")

    def _reachable(self, target: Any, frame: types.FrameType) -> bool:
        """Whether ``target`` is held by the calling code's globals (or one level into the classes and plain
        objects among them), its closure, or an attribute of a module in the tree (one level into each)."""
        roots: list[Any] = list(frame.f_globals.values())
        if frame.f_code.co_freevars:
            roots += [frame.f_locals.get(name) for name in frame.f_code.co_freevars]
        roots += [value for module in self._module.modules() for value in vars(module).values()]
        for value in roots:
            if value is target:
                return True
            if isinstance(value, types.ModuleType | types.FunctionType | nn.Module):
                continue  # imported modules are too wide to search; the module tree is searched below
            if any(inner is target for inner in _shallow_values(value)):
                return True
        return False


_NESTED_ENTRIES = frozenset(
    {
        (os.path.join(_PACKAGE, "api.py"), "capture"),
        (os.path.join(_PACKAGE, "api.py"), "tracing"),
        (os.path.join(_PACKAGE, "compat.py"), "model_addition_debugger_context"),
    }
)
"""The functions through which model code would start a capture of its own, by file and name (the engine imports
nothing of the layer above it)."""


_NESTED_NAMES = frozenset(name for _, name in _NESTED_ENTRIES)


def _starts_a_capture(code: types.CodeType) -> bool:
    return code.co_name in _NESTED_NAMES and (os.path.abspath(code.co_filename), code.co_name) in _NESTED_ENTRIES
