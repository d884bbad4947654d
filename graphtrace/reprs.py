"""Text rules shared by every layer (torch-free)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["SPEC_LINEWIDTH", "device_suffix", "sanitize_repr", "spec_printoptions", "spec_shape", "with_suffixes"]

_MEMORY_ADDRESS = re.compile(r"object at 0x[0-9A-Fa-f]+")


def sanitize_repr(text: str) -> str:
    """Replace memory addresses (``object at 0x7f...``) with a stable placeholder, as transformers does, so that
    two traces of the same model diff cleanly."""
    if "object at 0x" not in text:
        return text
    return _MEMORY_ADDRESS.sub("object at 0xXXXXXXXX", text)


def spec_shape(shape: tuple[int, ...]) -> str:
    """``repr(torch.Size(shape))`` without torch: ``"torch.Size([1, 5])"``."""
    return f"torch.Size([{', '.join(map(str, shape))}])"


def device_suffix(device: str, kind: str, index: int | None, default_kind: str, current_cuda: int | None) -> str | None:
    """The ``device='...'`` suffix torch prints after a tensor's values (``_str_intern``: a device other than the
    default one, a CUDA device other than the current one, and MPS always), or None; ``device`` is the tensor's
    device as text, ``kind`` and ``index`` its type and index, ``default_kind`` the default device's type."""
    if kind != default_kind or (kind == "cuda" and current_cuda != index) or kind == "mps":
        return f"device='{device}'"
    return None


def with_suffixes(text: str, suffixes: Sequence[str], linewidth: int) -> str:
    """``text`` (a tensor's repr up to its values) closed with torch's suffixes, as ``_add_suffixes`` wraps them."""
    last_line = len(text) - text.rfind("\n") + 1  # torch's own arithmetic, off by one included
    parts = [text]
    for suffix in suffixes:
        if last_line + len(suffix) + 2 > linewidth:
            parts.append(",\n" + " " * _INDENT + suffix)
            last_line = _INDENT + len(suffix)
        else:
            parts.append(", " + suffix)
            last_line += len(suffix) + 2
    parts.append(")")
    return "".join(parts)


_INDENT = len("tensor(")

SPEC_LINEWIDTH = 120
"""The line width transformers prints tensor values with."""


@contextmanager
def spec_printoptions(linewidth: int | None = None) -> Iterator[None]:
    """torch's print options as transformers has them while it serialises: ``sci_mode=True`` (and ``linewidth`` when
    given), restored on exit so that the caller's options are never changed."""
    from torch._tensor_str import PRINT_OPTS  # imported here: this module stays importable without torch

    saved = PRINT_OPTS.sci_mode, PRINT_OPTS.linewidth
    PRINT_OPTS.sci_mode = True
    if linewidth is not None:
        PRINT_OPTS.linewidth = linewidth
    try:
        yield
    finally:
        PRINT_OPTS.sci_mode, PRINT_OPTS.linewidth = saved
