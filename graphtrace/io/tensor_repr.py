"""``repr(tensor)`` as transformers writes it, without torch's printer where the result is provably the same.

torch's printer costs about half a millisecond per tensor. For a plain dense tensor the text is a function of the
printed elements, the device suffix and the dtype alone (:mod:`graphtrace.io.tensor_text` lays them out,
:mod:`graphtrace.io.repr_batch` many at once), so this module only takes them: a copy of the whole tensor, or for a
summarised one the first and last ``edgeitems`` along each dimension, in one ``take``; from a device, that copy goes
to the host without waiting (:mod:`graphtrace.io.host_copy`). Anything else torch's printer would decorate
(autograd, subclasses, wrappers) goes to torch."""

from __future__ import annotations

import torch
from torch._tensor_str import PRINT_OPTS

from graphtrace.io.host_copy import to_host
from graphtrace.io.repr_batch import PrintedValues, lines_of_all
from graphtrace.io.tensor_text import PrintOptions, shown_sizes
from graphtrace.reprs import SPEC_LINEWIDTH, device_suffix, sanitize_repr, spec_printoptions

__all__ = ["PrintedValues", "lines_of", "printed_values", "repr_lines"]

_TEXT_DTYPES = frozenset(
    {
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    }
)
"""The dtypes printed here (complex, float8 and the rarer integer types take torch's printer)."""

_CACHE_LIMIT = 4096
_gather_indices: dict[tuple[object, ...], torch.Tensor] = {}
_suffixes: dict[tuple[object, ...], tuple[str, ...]] = {}  # (dtype, default dtype, device facts) -> torch's suffixes


def repr_lines(tensor: torch.Tensor) -> tuple[str, ...]:
    """The lines ``print(tensor)`` shows under ``sci_mode=True, linewidth=120``, sanitised, as transformers writes
    them. Torch's print options are never changed for longer than a ``repr`` of an unusual tensor takes."""
    return lines_of(printed_values(tensor))


def printed_values(tensor: torch.Tensor) -> PrintedValues | tuple[str, ...]:
    """What :func:`repr_lines` needs of ``tensor``, taken now to be formatted later by :func:`lines_of` (for an
    unusual tensor, the lines themselves)."""
    options = (PRINT_OPTS.precision, PRINT_OPTS.threshold, PRINT_OPTS.edgeitems, SPEC_LINEWIDTH)
    if _printable_from_values(tensor, options):
        return _values(tensor, options)
    with spec_printoptions(SPEC_LINEWIDTH):
        text = repr(tensor)
    return tuple(sanitize_repr(text).splitlines())


def lines_of(printed: PrintedValues | tuple[str, ...]) -> tuple[str, ...]:
    """The lines of one tensor's :func:`printed_values` (many are formatted faster together: :func:`lines_of_all`)."""
    return lines_of_all([printed])[0]  # one tensor is formatted on its own


def _printable_from_values(tensor: torch.Tensor, options: PrintOptions) -> bool:
    """True when torch would print ``tensor`` as a plain dense tensor: no grad, layout or wrapper suffix, a device
    whose values it prints as they are (not one it copies to the CPU first, nor meta), and nothing torch's printer
    resolves first (negative or zero views, functorch or forward-AD wrappers)."""
    return (
        type(tensor) is torch.Tensor
        and tensor.dtype in _TEXT_DTYPES
        and (tensor.is_cpu or tensor.device.type not in _UNUSUAL_DEVICES)
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
    )


_UNUSUAL_DEVICES = frozenset({"meta", "xla", "lazy", "ipu", "mtia"})
"""Devices torch's printer treats apart (no values, or a copy to the CPU first)."""


def _values(tensor: torch.Tensor, options: PrintOptions) -> PrintedValues:
    shape = tuple(tensor.shape)
    _, cuts = shown_sizes(shape, options)
    if True in cuts:
        printed = _gather(tensor, shape, cuts, options[2])  # a new tensor
    else:
        printed = tensor.clone(memory_format=torch.contiguous_format).view(-1)  # kept from later in-place changes
    floating = tensor.dtype.is_floating_point
    if printed.is_cpu:
        return PrintedValues(printed, shape, floating, _suffixes_of(tensor), options)
    host = to_host(printed)  # from a device: copied without waiting, waited for when formatted
    return PrintedValues(host.data, shape, floating, _suffixes_of(tensor), options, host.ready)


def _suffixes_of(tensor: torch.Tensor) -> tuple[str, ...]:
    """torch's suffixes after a plain tensor's values: its device where torch prints one, its dtype where that is
    not implied."""
    dtype = tensor.dtype
    default = torch.get_default_dtype()
    default_kind = torch._C._get_default_device()
    device = None if tensor.is_cpu else tensor.device  # the common case keyed without a device object
    current = torch.cuda.current_device() if device is not None and device.type == "cuda" else None
    key = (dtype, default, device, default_kind, current)
    suffixes = _suffixes.get(key)
    if suffixes is None:
        if len(_suffixes) >= _CACHE_LIMIT:
            _suffixes.clear()
        device = tensor.device
        on_device = device_suffix(str(device), device.type, device.index, default_kind, current)
        plain = dtype in (default, torch.int64, torch.bool)
        suffixes = _suffixes[key] = (
            *(() if on_device is None else (on_device,)),
            *(() if plain else (f"dtype={dtype}",)),
        )
    return suffixes


def _gather(tensor: torch.Tensor, shape: tuple[int, ...], cuts: tuple[bool, ...], edgeitems: int) -> torch.Tensor:
    """The printed entries of a summarised tensor, in row-major order, with one ``take`` (whatever the strides)."""
    key = (shape, edgeitems)
    indices = _gather_indices.get(key)
    if indices is None:
        if len(_gather_indices) >= _CACHE_LIMIT:
            _gather_indices.clear()
        flat = [0]
        for size, cut in zip(shape, cuts):
            kept = [*range(edgeitems), *range(size - edgeitems, size)] if cut else range(size)
            flat = [base * size + i for base in flat for i in kept]
        indices = _gather_indices[key] = torch.tensor(flat, dtype=torch.int64)
    if not tensor.is_cpu:
        indices = _on_device(key, indices, tensor.device)
    return tensor.take(indices)


_device_indices: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def _on_device(key: tuple[object, ...], indices: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``indices`` on ``device``, copied once from pinned memory without waiting for the device (the pinned source
    is kept with the copy, so it outlives the transfer)."""
    found = _device_indices.get((*key, device))
    if found is None:
        if len(_device_indices) >= _CACHE_LIMIT:
            _device_indices.clear()
        try:
            source = indices.pin_memory()
        except RuntimeError:  # no pinned memory for this device: a plain copy, once per shape
            source = indices
        found = _device_indices[(*key, device)] = (source, source.to(device, non_blocking=source.is_pinned()))
    return found[1]
