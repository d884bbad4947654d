"""torch's tensor printer, rebuilt from plain Python values for the cases transformers' files hold.

``repr(tensor)`` costs about half a millisecond through torch's printer, which dispatches a few tensor operations
per printed element; a module call of a small model takes less. The printer's output is a pure function of the
printed elements, the tensor's shape and dtype and the print options, so it can be produced from the elements alone:
format them, take the widest, and lay them out. This module does that, torch-free. It follows
``torch/_tensor_str.py`` (``_Formatter``, ``_vector_str``, ``_tensor_str_with_formatter``, ``_add_suffixes``) for
``sci_mode=True``, the mode transformers prints in; ``graphtrace.io.tensors`` decides when a tensor is plain enough
for it (and otherwise asks torch).

The layout of a shape is the same for every tensor of that shape, so it is built once as a format string with one
padded field per element and reused. For floating values that are all finite (the common case) the fields are
``%``-conversions, so that one C-level ``%`` formats, pads and lays out every element at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from graphtrace.reprs import with_suffixes

__all__ = ["PrintOptions", "blank_text", "shown_sizes", "tensor_text"]

PrintOptions = tuple[int, float, int, int]
"""``(precision, threshold, edgeitems, linewidth)`` of torch's print options."""

_PREFIX = "tensor("
_INDENT = len(_PREFIX)
_CACHE_LIMIT = 4096
_layouts: dict[tuple[object, ...], str] = {}
_sci_layouts: dict[tuple[object, ...], tuple[str, int]] = {}
_shown: dict[tuple[object, ...], tuple[tuple[int, ...], tuple[bool, ...]]] = {}


def shown_sizes(shape: Sequence[int], options: PrintOptions) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    """The number of printed entries along each dimension, and whether that dimension is cut (shown with ``...``).

    torch summarises a tensor of more than ``threshold`` elements by printing the first and last ``edgeitems``
    entries of every dimension longer than twice that."""
    key = (tuple(shape), options)
    shown = _shown.get(key)
    if shown is None:
        if len(_shown) >= _CACHE_LIMIT:
            _shown.clear()
        shown = _shown[key] = _shown_sizes(key[0], options)
    return shown


def _shown_sizes(shape: tuple[int, ...], options: PrintOptions) -> tuple[tuple[int, ...], tuple[bool, ...]]:
    _, threshold, edgeitems, _ = options
    if math.prod(shape) <= threshold:
        return shape, (False,) * len(shape)
    cut = tuple(size > 2 * edgeitems for size in shape)
    return tuple(2 * edgeitems if c else size for size, c in zip(shape, cut)), cut


def _float_strings(values: Sequence[float], precision: int) -> tuple[list[str], int]:
    """Each value as torch's ``_Formatter`` prints it in sci mode, unpadded, and the field width."""
    # One %-formatting of all values formats them in C: three times faster than a call per value.
    strings = ((f"%.{precision}e\n" * len(values)) % tuple(values)).split("\n")
    strings.pop()
    zero = f"{0.0:.{precision}e}"
    # The width comes from the non-zero finite values only; without any, torch prints in its integer mode.
    nonzero_finite = set(strings).difference((zero, "-" + zero, "nan", "inf", "-inf"))
    if nonzero_finite:
        return strings, max(map(len, nonzero_finite))
    return [f"{v:.0f}." if math.isfinite(v) else f"{v:.0f}" for v in values], 1


def _vector(count: int, cut: bool, width: int, field: str, indent: int, options: PrintOptions) -> str:
    _, _, edgeitems, linewidth = options
    data = [field] * count
    if cut:
        data[edgeitems:edgeitems] = [" ..."]
    per_line = max(1, math.floor((linewidth - indent) / (width + 2)))
    lines = [", ".join(data[i : i + per_line]) for i in range(0, len(data), per_line)]
    return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"


def _block(
    sizes: tuple[int, ...], cuts: tuple[bool, ...], width: int, field: str, indent: int, options: PrintOptions
) -> str:
    if len(sizes) == 1:
        return _vector(sizes[0], cuts[0], width, field, indent, options)
    inner = _block(sizes[1:], cuts[1:], width, field, indent + 1, options)
    slices = [inner] * sizes[0]
    if cuts[0]:
        slices[options[2] : options[2]] = ["..."]
    return "[" + ("," + "\n" * (len(sizes) - 1) + " " * (indent + 1)).join(slices) + "]"


def _layout(sizes: tuple[int, ...], cuts: tuple[bool, ...], width: int, field: str, options: PrintOptions) -> str:
    """The text of a tensor of these printed sizes up to its suffixes, with ``field`` in place of each element:
    ``{:>width}`` (for ``str.format``) or ``%{width}.{precision}e`` (for one ``%`` that also formats)."""
    key = (sizes, cuts, field, options)
    layout = _layouts.get(key)
    if layout is None:
        if len(_layouts) >= _CACHE_LIMIT:
            _layouts.clear()
        body = _block(sizes, cuts, width, field, _INDENT, options) if sizes else field
        layout = _layouts[key] = _PREFIX + body
    return layout


def _sci_text(
    values: Sequence[float], sizes: tuple[int, ...], cuts: tuple[bool, ...], options: PrintOptions
) -> str | None:
    """The text of finite ``values`` of which some are non-zero, formatted and padded by one ``%`` of a cached
    layout; None when that is not provably what :func:`_float_strings` and :func:`_layout` give.

    torch's field width is the longest non-zero finite value's string. In sci mode a string's length is that of
    ``1.0`` plus one for a minus sign plus any exponent digits beyond two, so the width is guessed from the sign
    alone; the guess is right exactly when no field came out wider than it (the text's length tells)."""
    if not math.isfinite(sum(values)) or not any(values):  # NaN or inf among them (or an overflowing sum); zeros
        return None
    key = (sizes, cuts, min(values) < 0, options)
    cached = _sci_layouts.get(key)
    if cached is None:
        if len(_sci_layouts) >= _CACHE_LIMIT:
            _sci_layouts.clear()
        width = len(f"{1.0:.{options[0]}e}") + key[2]
        layout = _layout(sizes, cuts, width, f"%{width}.{options[0]}e", options)
        # 1.0 prints in the narrowest sci form, so here every field is padded to exactly `width`
        cached = _sci_layouts[key] = (layout, len(layout % ((1.0,) * layout.count("%"))))
    layout, length = cached
    text = layout % tuple(values)
    return text if len(text) == length else None


def blank_text(shape: Sequence[int], width: int, suffixes: Sequence[str], options: PrintOptions) -> str:
    """The text :func:`tensor_text` gives for a tensor of ``shape`` whose printed elements are floating, finite, some
    non-zero, and each exactly ``width`` characters wide (the widest's width), with a NUL in place of every character
    of every element: a frame that :mod:`graphtrace.io.repr_batch` fills."""
    sizes, cuts = shown_sizes(shape, options)
    return with_suffixes(_layout(sizes, cuts, width, "\0" * width, options), suffixes, options[3])


def tensor_text(
    values: Sequence[float] | Sequence[int] | Sequence[bool],
    shape: Sequence[int],
    floating: bool,
    suffixes: Sequence[str],
    options: PrintOptions,
) -> str:
    """``repr`` of a plain, dense, non-empty CPU tensor as torch prints it with ``sci_mode=True``.

    ``values`` are the printed elements in row-major order (all of them, or for a summarised tensor the entries
    :func:`shown_sizes` keeps), as ``tolist()`` returns them; ``floating`` says whether the dtype is a floating one;
    ``suffixes`` are torch's (``"dtype=torch.float16"``)."""
    sizes, cuts = shown_sizes(shape, options)
    if floating:
        text = _sci_text(values, sizes, cuts, options)
        if text is not None:
            return with_suffixes(text, suffixes, options[3])
        strings, width = _float_strings(values, options[0])
    else:
        strings = list(map(str, values))
        width = max(map(len, strings))
    return with_suffixes(_layout(sizes, cuts, width, f"{{:>{width}}}", options).format(*strings), suffixes, options[3])
