"""How a value of the original is laid out where the port holds it, and back: the one seam between the check and the
correspondence of values.

The check hands a module of the port the original's tensor in the port's layout (:meth:`View.to_port`) and reads the
module's output back in the original's layout (:meth:`View.to_original`) to compare it. Every such mapping goes
through a :class:`View`; :func:`view_between` derives one from the two shapes alone, for the layouts whose
correspondence the shapes make certain:

- the same shape (nothing to do);
- the same shape up to size-1 dimensions (``[1, T, D]`` and ``[T, D]``): the values lie in the same order;
- the same dimensions in another order, every size distinct (a sequence-first port's ``[T, B, D]`` for ``[B, T, D]``):
  which dimension is which is then certain; with two of the same size it is not, and no view is derived;
- a last dimension split into several or merged (``[B, T, H, Dh]`` for ``[B, T, H*Dh]``): the same elements in the
  same order.

Anything else (a slice of a fused projection, a permuted last dimension such as a rotary layout, a mask in another
convention, padding) has no view here: an input then stays the port's own and an output is not compared. Views that
values prove (the diff's correspondence) will arrive through the same protocol.

Torch-free: views only call tensor methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from graphtrace.compare.measure import dims_orders, split_alike, squeezed

__all__ = ["View", "view_between"]

Shape = tuple[int, ...]


class View(Protocol):
    """A correspondence between a tensor of the original and one of the port that holds the same values."""

    @property
    def description(self) -> str:
        """What the view allows for, in words ("" for none)."""
        ...

    def to_port(self, original: Any) -> Any:
        """The original's tensor laid out as the port holds it."""
        ...

    def to_original(self, port: Any) -> Any:
        """The port's tensor laid out as the original holds it."""
        ...


@dataclass(frozen=True, slots=True)
class _Same:
    description: str = ""

    def to_port(self, original: Any) -> Any:
        return original

    def to_original(self, port: Any) -> Any:
        return port


@dataclass(frozen=True, slots=True)
class _Reshaped:
    """The same elements in the same order, in another shape (size-1 dims, a split or merged last dim)."""

    original: Shape
    port: Shape
    description: str

    def to_port(self, original: Any) -> Any:
        return original.reshape(self.port)

    def to_original(self, port: Any) -> Any:
        return port.reshape(self.original)


@dataclass(frozen=True, slots=True)
class _Permuted:
    """The same dims in another order: ``order`` takes the port's (squeezed) dims to the original's."""

    original: Shape
    port: Shape
    order: Shape
    description: str

    def to_port(self, original: Any) -> Any:
        back = tuple(self.order.index(k) for k in range(len(self.order)))
        return original.reshape(squeezed(self.original)).permute(back).contiguous().reshape(self.port)

    def to_original(self, port: Any) -> Any:
        return port.reshape(squeezed(self.port)).permute(self.order).contiguous().reshape(self.original)


def view_between(original: Shape, port: Shape, *, reorder: bool = True) -> View | None:
    """The view that makes a tensor of shape ``original`` and one of shape ``port`` hold the same values, when the
    shapes make it certain (see the module docstring); None otherwise. Without ``reorder`` (the model's own output,
    which its caller reads as it is laid out) only size-1 dims may differ."""
    if original == port:
        return _Same()
    if squeezed(original) == squeezed(port):
        return _Reshaped(original, port, f"shapes {list(original)} and {list(port)} differ only by size-1 dims")
    if not reorder:
        return None
    orders = dims_orders(original, port)
    if len(orders) == 1:
        return _Permuted(
            original, port, orders[0], f"shapes {list(original)} and {list(port)}: the same dims in another order"
        )
    if not orders and split_alike(original, port):
        return _Reshaped(original, port, f"shapes {list(original)} and {list(port)}: a last dim split")
    return None
