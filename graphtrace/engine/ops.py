"""The op tier: every functional op a module's own code calls, recorded during the one real forward.

A :class:`torch.overrides.TorchFunctionMode` sees each call of a torch function, tensor method or operator made while
it is active (as torch's own ``DebugMode`` does, one level up: at the Python API, where the user's code calls). For a
call that a recorded module's forward makes itself, the op is recorded under that module call: its output tensors as
module outputs are (statistics, values, files), the calls that produced its tensor inputs, and the line of user code
that called it. This works whether or not torch.fx can trace the module (cache-updating attention included), and
the values are those of the real forward: the mode only looks.

Not recorded: views and metadata (``view``, ``reshape``, ``transpose``, ``size``... they move no value), calls
made by torch's own code or by graphtrace (a module implemented in torch, such as ``nn.Linear``, is one op: its
module record says it all), and ops of code compiled with ``torch.compile`` (its graph runs as compiled).
"""

from __future__ import annotations

import linecache
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.compiler import is_compiling
from torch.overrides import TorchFunctionMode

from graphtrace.engine.recorder import Recorder
from graphtrace.model import SourceLine

__all__ = ["OpTier"]

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_GRAPHTRACE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DEMO_FILE = _GRAPHTRACE_DIR + "demo.py"  # the built-in demo model is user code like any other

_MOVES_NO_VALUE = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous", "expand", "expand_as",
        "unsqueeze", "squeeze", "flatten", "unflatten", "split", "split_with_sizes", "chunk", "unbind", "narrow",
        "select", "__getitem__", "t", "T", "mT", "movedim", "swapaxes", "swapdims", "detach", "view_as_real",
        "view_as_complex", "size", "dim", "numel", "stride", "is_contiguous", "data_ptr", "element_size",
        "storage_offset", "__get__", "__set__", "__len__", "__iter__", "__bool__", "__index__", "__int__",
        "__float__", "item", "tolist", "is_floating_point", "is_complex", "requires_grad_", "__setitem__",
        "__repr__", "__format__", "__hash__", "__eq__", "__ne__", "new_empty", "empty_like", "zeros_like",
        "ones_like", "full_like", "arange", "zeros", "ones", "empty", "full", "tensor", "as_tensor",
    }
)  # fmt: skip
"""Ops that only look at, re-shape or allocate a tensor: no value of the model's computation is made by them."""


def _op_name(func: Callable[..., Any]) -> str | None:
    """The op's name (``mul`` for ``x * y``, ``rmul`` and ``__mul__`` alike), or None for one that moves no value."""
    name = getattr(func, "__name__", None) or type(func).__name__
    if name in _MOVES_NO_VALUE:
        return None
    if name.startswith("__") and name.endswith("__"):
        name = name[2:-2]
        if name.startswith("r") and name[1:] in ("add", "sub", "mul", "truediv", "matmul", "pow"):
            name = name[1:]  # 2 * x is a mul like x * 2
    return None if name in _MOVES_NO_VALUE else name


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _real(value: Any) -> bool:
    # fx tracing runs the forward on fake tensors to learn shapes: those ops are not the model's
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)


def _holds_tensor(value: Any) -> bool:
    return _real(value) or (isinstance(value, (list, tuple)) and bool(value) and all(_real(item) for item in value))


def _user_line() -> SourceLine | None:
    """The first frame outside torch and this module's handler: the user's line that called the op, or None when
    it is graphtrace's own code (statistics, an fx replay) or torch's (a module implemented by torch)."""
    frame = sys._getframe(2)
    while frame is not None:
        file = frame.f_code.co_filename
        if file.startswith(_GRAPHTRACE_DIR) and file != _DEMO_FILE:
            return None
        if not file.startswith(_TORCH_DIR):
            line = frame.f_lineno
            return SourceLine(file, line, frame.f_code.co_name, linecache.getline(file, line).strip())
        frame = frame.f_back  # type: ignore[assignment]
    return None


class OpTier(TorchFunctionMode):
    """Records the ops of the current module call into ``recorder`` (see the module docstring). ``paused`` says when
    the forward code running is not the model's call (torch.fx tracing a module to build its graph)."""

    def __init__(self, recorder: Recorder, paused: Callable[[], bool] | None = None) -> None:
        super().__init__()
        self.recorder = recorder
        self.paused = paused
        self._names: dict[Any, str | None] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if is_compiling():  # torch.compile traces this handler too: compiled code runs unrecorded, and unbroken
            return func(*args, **(kwargs or {}))
        output = func(*args, **(kwargs or {}))
        recorder = self.recorder
        if recorder.current_module() is None:
            return output
        name = self._names.get(func, "")
        if name == "":
            name = self._names[func] = _op_name(func)
        if name is None:
            if isinstance(output, torch.Tensor) and args and isinstance(args[0], torch.Tensor):
                recorder.alias(output, args[0])  # a view: data flow goes through it
            elif isinstance(output, (list, tuple)) and args and isinstance(args[0], torch.Tensor):
                for item in output:
                    if isinstance(item, torch.Tensor):
                        recorder.alias(item, args[0])  # split, chunk, unbind
            return output
        if not _holds_tensor(output):
            return output
        if self.paused is not None and self.paused():
            return output
        source = _user_line()
        if source is None:
            return output
        inputs = [*_tensors(args), *_tensors(list((kwargs or {}).values()))]
        recorder.record_op(name, inputs, output, source)
        return output
