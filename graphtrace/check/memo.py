"""Calls inside a module run alone, answered from runs already made: a block run alone calls its norm on the very
input the norm was run alone on, and its output is known.

A run is known for a call of the port (by id) when the port's forward made it, or when the check ran the call's
module alone; while a container runs alone, the k-th call of each module inside it is that module's k-th call
inside the container in the port's own run, and when it is given the same arguments as a known run of that call
(every tensor still holding what it held then), the known output is returned, copied, without running the module
again. Modules are deterministic functions of their arguments and state here: a module that draws or writes into
the port's state is refused when it runs alone (:mod:`graphtrace.check.alone`).

"The same" is bit for bit, or, while :attr:`Known.tolerant`, :func:`alike`: equal up to rounding. Two faithful
implementations hand each other values a few units in the last place apart, so bit-for-bit matching re-ran every
module after the first rounding difference (a block's attention) and the check cost three forwards; values that
are alike give the same verdict, and a departure found through them is confirmed without (:class:`Known`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from graphtrace.check.live import live_tensors, replaced, version
from graphtrace.compare.measure import Tolerance
from graphtrace.engine.eager import PatchLedger, entry_point
from graphtrace.engine.fx.guard import dispatches_itself
from graphtrace.model import CallNode

__all__ = ["ALIKE", "APART", "SAME", "Known", "alike", "likeness", "same_bits"]

_PLAIN = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same dtype, shape, device and bits (NaN included where both hold it)."""
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    if a is b or torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()) or not _may_hold_nan(a):
        return False
    return bool(((a == b) | (a.isnan() & b.isnan())).all().item())


def _may_hold_nan(a: torch.Tensor) -> bool:
    """False when ``a`` holds no NaN: its sum is NaN whenever it holds one (and when infinities of both signs
    cancel), in one vectorised pass, where ``isnan`` is several."""
    total = complex(_widened(a).sum().item())
    return math.isnan(total.real) or math.isnan(total.imag)


_TOLERANCE_SHARE = 2
"""Elements of :func:`alike` tensors lie within this fraction (a half) of the dtype's default tolerance."""


def alike(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same bits, or floating values of one dtype and shape that the diff's measure would itself call equal,
    with margin: every element within half the dtype's default tolerance of ``b``'s (``torch.testing``'s, whatever
    the user set), and no lean: the mean difference, and the mean difference along ``b``'s signs, within one unit
    in the last place of the mean magnitude, a quarter of the smallest lean the measure can see. Rounding between
    two faithful implementations stays far inside both (GPT-2 small after 12 blocks: at most 0.39 of the tolerance,
    leans of 0.08 units); a departure the measure could see, even one within the tolerance (a 1.0000005x scaling
    of float32 values, a lean), does not."""
    return _tensor_likeness(a, b, tolerant=True) != APART


_HEAD = 4096
"""Elements compared first: two tensors that are not alike (after a departure upstream) mostly differ there
already, and are told apart without reading the rest."""


def _tensor_likeness(a: torch.Tensor, b: torch.Tensor, tolerant: bool) -> int:
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return APART
    if dispatches_itself(a) or dispatches_itself(b):  # comparing them may communicate (a DTensor all-reduces)
        return APART  # never compared: the call runs alone, where the guard refuses it with its reason
    if a is b or torch.equal(a, b):
        return SAME
    if not tolerant or not a.is_floating_point():
        return SAME if same_bits(a, b) else APART  # NaN where both hold it; complex values
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    if flat_a.numel() > _HEAD and _apart(flat_a[:_HEAD], flat_b[:_HEAD]):
        return APART
    extremes = [float(x.item()) for t in (a, b) for x in _widened(t).aminmax()]
    if any(math.isnan(x) for x in extremes):  # NaN somewhere: bit for bit only
        return SAME if same_bits(a, b) else APART
    if not all(math.isfinite(x) for x in extremes):  # an infinity: never mere rounding
        return APART
    return ALIKE if _within_rounding(flat_a, flat_b) else APART


def _widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in its dtype, or float32 for the one-byte floats, whose extremes and sums torch does not compute."""
    return t if t.element_size() > 1 else t.float()


def _wide(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` read in their dtype, at least float32 (the means' own rounding is far below the unit they are
    held to), and the bound each difference is held to: half the dtype's default tolerance."""
    rtol, atol = Tolerance().for_dtypes(str(a.dtype), str(b.dtype))
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    x, y = a.to(wide), b.to(wide)
    return x, y, y.abs().mul_(rtol / _TOLERANCE_SHARE).add_(atol / _TOLERANCE_SHARE)


def _apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Some element of ``a`` is beyond rounding of ``b``'s and not the same value (equal infinities and NaN on both
    sides are left to the whole tensor's reading): the tensors are neither alike nor the same bits."""
    x, y, bound = _wide(a, b)
    beyond = ~((x - y).abs() <= bound) & (x != y) & ~(x.isnan() & y.isnan())
    return bool(beyond.any().item())


def _within_rounding(a: torch.Tensor, b: torch.Tensor) -> bool:
    """See :func:`alike`; ``a`` and ``b`` flat and finite."""
    x, y, bound = _wide(a, b)
    difference = x - y
    if not bool((difference.abs() <= bound).all().item()):
        return False
    allowed = torch.finfo(a.dtype).eps * float(y.abs().mean().item())
    offset, scaling = float(difference.mean().item()), float((difference * y.sign()).mean().item())
    return abs(offset) <= allowed and abs(scaling) <= allowed


SAME, ALIKE, APART = 2, 1, 0
"""How alike two sets of arguments are (:func:`likeness`): every tensor bit for bit, some only up to rounding, or
not alike."""


def likeness(a: Any, b: Any, tolerant: bool = True) -> int:
    """:data:`SAME`, :data:`ALIKE` (only while ``tolerant``) or :data:`APART`: tensors by their bits or
    :func:`alike`, containers item by item (the least alike item), plain values equal, other objects the same."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return APART
        return _tensor_likeness(a, b, tolerant)
    if isinstance(a, (list, tuple, dict)) or isinstance(b, (list, tuple, dict)):
        if type(a) is not type(b) or len(a) != len(b) or (isinstance(a, dict) and list(a) != list(b)):
            return APART
        pairs = ((a[k], b[k]) for k in a) if isinstance(a, dict) else zip(a, b, strict=True)
        least = SAME
        for x, y in pairs:
            least = min(least, likeness(x, y, tolerant))
            if least == APART:
                break
        return least
    if a is b or (type(a) is type(b) and isinstance(a, _PLAIN) and a == b):
        return SAME
    return APART


@dataclass(frozen=True, slots=True)
class _Run:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any
    versions: tuple[tuple[torch.Tensor, int], ...]
    """Every tensor of the arguments and the output, with its version when the run was made."""
    approximate: bool
    """Made while calls inside were answered from runs given alike, not identical, arguments."""

    @property
    def intact(self) -> bool:
        return all(version(tensor) == then for tensor, then in self.versions)


class Known:
    """The known runs of the port's calls, by call id.

    While ``tolerant``, a call given arguments :func:`alike` a known run's is answered from it, and ``approximations``
    counts those answers; a judge that found a departure through any of them judges again with ``tolerant`` off,
    where only identical arguments answer and no run made through an approximation is used."""

    def __init__(self) -> None:
        self._runs: dict[str, list[_Run]] = {}
        self.tolerant = True
        self.approximations = 0

    @contextmanager
    def exactly(self) -> Iterator[None]:
        """Only identical arguments answer, inside the block."""
        before, self.tolerant = self.tolerant, False
        try:
            yield
        finally:
            self.tolerant = before

    def add(
        self,
        call: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
        versions: dict[int, tuple[torch.Tensor, int]] | None = None,
        *,
        approximate: bool = False,
    ) -> None:
        """A run of ``call`` (``Class.path@index``); ``versions`` (by ``id``) are the tensors' versions when it was
        made, when that was earlier than now (the port's own call); ``approximate``: made through approximations."""
        tensors = {id(t): t for _, t in (*live_tensors((args, kwargs)), *live_tensors(output))}
        then = versions or {}
        kept = tuple((t, then[key][1] if key in then else version(t)) for key, t in tensors.items())
        self._runs.setdefault(call, []).append(_Run(args, kwargs, output, kept, approximate))

    def output(self, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[bool, Any]:
        """(True, a copy of the output) of a known, intact run of ``call`` given these arguments; (False, None)
        when there is none. A run given identical arguments is preferred to one given (while tolerant) alike ones."""
        best: tuple[int, _Run] | None = None  # identical arguments first, then a run made exactly
        for run in self._runs.get(call, ()):
            if not run.intact or (run.approximate and not self.tolerant):
                continue
            match = likeness(run.args, args, self.tolerant)
            if match != APART:
                match = min(match, likeness(run.kwargs, kwargs, self.tolerant))
            if match == APART:
                continue
            rank = 2 * (match == SAME) + (not run.approximate)
            if best is None or rank > best[0]:
                best = rank, run
            if rank == 3:
                break
        if best is None:
            return False, None
        rank, found = best
        if rank < 3:
            self.approximations += 1
        copies = {name: tensor.clone() for name, tensor in live_tensors(found.output)}
        return True, replaced(found.output, "", copies)

    @contextmanager
    def answering(self, node: CallNode, module: nn.Module, paths: dict[int, str]) -> Iterator[None]:
        """Inside the block, the calls of the modules inside ``module`` (run alone for the port's call ``node``)
        are answered from known runs where they can be; ``paths`` names each module of the port as calls do."""
        recorded: dict[str, list[str]] = {}
        for inner in node.walk():
            if inner is not node and inner.kind == "module":
                recorded.setdefault(inner.path, []).append(inner.id)
        counts: dict[str, int] = {}
        ledger = PatchLedger()
        try:
            for inner_module in module.modules():
                path = paths.get(id(inner_module))
                if inner_module is not module and path in recorded:  # answered where the calls were kept: hooks in
                    name, method = entry_point(inner_module, after_hooks=True)
                    ledger.set_instance_attr(inner_module, name, self._answering(path, method, recorded[path], counts))
            yield
        finally:
            ledger.restore()

    def _answering(
        self, path: str, forward: Callable[..., Any], calls: list[str], counts: dict[str, int]
    ) -> Callable[..., Any]:
        def answered_forward(*args: Any, **kwargs: Any) -> Any:
            k = counts.get(path, 0)
            counts[path] = k + 1
            if k < len(calls):
                with _disable_current_modes():  # the lookup is the check's work, not the module's: unguarded
                    found, output = self.output(calls[k], args, kwargs)
                if found:
                    return output
            return forward(*args, **kwargs)

        return answered_forward
