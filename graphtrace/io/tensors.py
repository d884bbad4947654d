"""Full tensor values: repr lines for FULL_TENSORS.json, or safetensors files streamed to disk during the forward.

Capture hands every tensor whose value is wanted to a *sink* (``graphtrace.engine.recorder.ValueSink``); the sink returns what the trace keeps: the repr lines,
or the relative path of the file it wrote. Writing while the forward runs keeps the tensor in memory no longer than
the call that produced it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from torch._tensor_str import PRINT_OPTS

from graphtrace.errors import OutputPathError, UnsupportedTensorError
from graphtrace.io.tensor_text import PrintOptions, shown_sizes, tensor_text
from graphtrace.reprs import SPEC_LINEWIDTH, sanitize_repr, spec_printoptions

__all__ = ["ReprSink", "SafetensorsSink", "load_tensor", "repr_lines"]

_TEXT_DTYPES = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
})
"""The dtypes :func:`graphtrace.io.tensor_text.tensor_text` prints (complex, float8 and the rarer integer types take
torch's printer)."""

_CACHE_LIMIT = 4096
_gather_offsets: dict[tuple, tuple[torch.Tensor, int]] = {}


def repr_lines(tensor: torch.Tensor) -> tuple[str, ...]:
    """The lines ``print(tensor)`` shows under ``sci_mode=True, linewidth=120``, sanitised, as transformers writes
    them. Torch's print options are never changed for longer than a ``repr`` of an unusual tensor takes."""
    options = (PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems, SPEC_LINEWIDTH)
    if _printable_from_values(tensor, options):
        return tuple(_text_from_values(tensor, options).splitlines())
    with spec_printoptions(SPEC_LINEWIDTH):
        text = repr(tensor)
    return tuple(sanitize_repr(text).splitlines())


def _printable_from_values(tensor: torch.Tensor, options: PrintOptions) -> bool:
    """True when torch would print ``tensor`` as a plain dense CPU tensor: no device, grad, layout or wrapper suffix
    and nothing torch's printer resolves first (negative or zero views, functorch or forward-AD wrappers)."""
    return (
        type(tensor) is torch.Tensor
        and tensor.dtype in _TEXT_DTYPES
        and tensor.device.type == "cpu"
        and not tensor.requires_grad
        and tensor.layout == torch.strided
        and not tensor.is_nested
        and tensor.numel() > 0
        and options[2] > 0
        and not tensor.is_neg()
        and not tensor._is_zerotensor()
        and not torch._C._functorch.is_functorch_wrapped_tensor(tensor)
        and not torch._is_functional_tensor(tensor)
        and torch.autograd.forward_ad._current_level < 0
        and torch._C._get_default_device() == "cpu"
    )


def _text_from_values(tensor: torch.Tensor, options: PrintOptions) -> str:
    shape = tuple(tensor.shape)
    sizes, cuts = shown_sizes(shape, options)
    if True in cuts:
        values = _gather(tensor, shape, cuts, options[2]).tolist()
    else:
        values = tensor.reshape(-1).tolist()
    dtype = tensor.dtype
    suffixes = () if dtype in (torch.get_default_dtype(), torch.int64, torch.bool) else (f"dtype={dtype}",)
    return tensor_text(values, shape, dtype.is_floating_point, suffixes, options)


def _gather(tensor: torch.Tensor, shape: tuple[int, ...], cuts: tuple[bool, ...], edgeitems: int) -> torch.Tensor:
    """The printed entries of a summarised tensor, in row-major order, with one indexing operation."""
    stride = tensor.stride()
    key = (shape, stride, edgeitems)
    cached = _gather_offsets.get(key)
    if cached is None:
        if len(_gather_offsets) >= _CACHE_LIMIT:
            _gather_offsets.clear()
        flat = [0]
        for size, step, cut in zip(shape, stride, cuts):
            kept = [*range(edgeitems), *range(size - edgeitems, size)] if cut else range(size)
            flat = [base + i * step for base in flat for i in kept]
        # strides are never negative, so the last entry lies furthest into the storage
        cached = _gather_offsets[key] = (torch.tensor(flat, dtype=torch.int64), flat[-1] + 1)
    offsets, span = cached
    return tensor.as_strided((span,), (1,))[offsets]


class ReprSink:
    """Keeps the repr lines of each tensor (``use_repr=True``)."""

    per_name = False
    linewidth: int | None = SPEC_LINEWIDTH

    def store(self, tensor: torch.Tensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        return repr_lines(tensor), None


class SafetensorsSink:
    """Writes each tensor to ``{directory}/{name}.safetensors`` under the key ``data`` (``use_repr=False``)."""

    per_name = True
    linewidth: int | None = None  # transformers leaves the line width alone in this mode

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.written: list[Path] = []

    def store(self, tensor: torch.Tensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        filename = name.replace("/", "_")
        if not filename.endswith(".safetensors"):
            filename += ".safetensors"
        target = self.directory / filename
        try:
            data = tensor.detach().contiguous().cpu()
        except (RuntimeError, NotImplementedError) as exc:
            raise UnsupportedTensorError(
                f"cannot store tensor {name!r} ({tensor.dtype}, layout {tensor.layout}) as safetensors: {exc}. "
                "Capture with values='repr' (use_repr=True), or convert the tensor to a dense strided one."
            ) from exc
        try:
            save_file({"data": data}, str(target))
        except OSError as exc:
            raise OutputPathError(
                f"cannot write {target}: {exc.strerror or exc}. Free some space or choose another directory."
            ) from exc
        except Exception as exc:  # safetensors raises its own error types for dtypes it cannot store
            raise UnsupportedTensorError(
                f"cannot store tensor {name!r} ({tensor.dtype}) as safetensors: {exc}. "
                "Capture with values='repr' (use_repr=True) for this model."
            ) from exc
        self.written.append(target)
        return None, f"./{filename}"


def load_tensor(directory: str | os.PathLike[str], file: str) -> torch.Tensor:
    """The tensor stored under ``data`` in ``file`` (a ``./name.safetensors`` path relative to ``directory``)."""
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / file))["data"]
