"""Text rules shared by every layer (torch-free)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SPEC_LINEWIDTH", "sanitize_repr", "spec_printoptions", "spec_shape"]

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
