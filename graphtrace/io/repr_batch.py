"""The repr lines of many tensors at once: their printed values formatted together, their texts filled together.

:mod:`graphtrace.io.tensor_text` lays out one tensor at a time, at about 160 ns per printed value (Python's own
``%.4e``) plus a few microseconds per tensor. Here the floating values of every tensor in a batch go through
:func:`graphtrace.io.sci_digits.sci_chars` in one pass, and every tensor's text is a cached frame
(:func:`graphtrace.io.tensor_text.blank_text`) whose blanks are filled with the values' characters by one indexed
assignment over all frames. This holds for the common case, finite values some of which are non-zero and none a
negative zero in a tensor without negative values, where every field is exactly as wide as torch's widest; any other
tensor, and every non-floating one, takes :func:`tensor_text`. :class:`ReprBatch` collects tensors during a forward
and formats them when the first of their lines is needed (at the latest when the step's files are written).
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import torch

from graphtrace.io.sci_digits import MAX_PRECISION, sci_chars
from graphtrace.io.tensor_text import PrintOptions, blank_text, tensor_text

__all__ = ["BATCH_MIN_VALUES", "PendingLines", "PrintedValues", "ReprBatch", "lines_of_all"]

_CACHE_LIMIT = 4096
_CPU = torch.device("cpu")  # explicit: lines may be formatted under another default device
BATCH_MIN_VALUES = 4096
"""Fewer floating values than this are formatted one tensor at a time: a batch costs about 30 tensor operations,
some 300 µs, which Python's own formatting of 2,000 values matches."""
_NO_SIGN_TEXT = "\x01"  # written where a field has room for no sign, then removed
_NO_SIGN = ord(_NO_SIGN_TEXT)


class PrintedValues(NamedTuple):
    """What the repr of a plain tensor is made of: its printed elements (a 1-d host tensor of them, a copy, or as
    ``tolist()`` gives them), its shape, whether it is floating, torch's suffixes and the print options; ``ready``,
    when the elements are still on their way from a device, is the event to wait for before reading them."""

    values: torch.Tensor | list[Any]
    shape: tuple[int, ...]
    floating: bool
    suffixes: tuple[str, ...]
    options: PrintOptions
    ready: Any = None


class _Frame(NamedTuple):
    """A tensor's text with a NUL in place of each character of each printed value, a newline appended, as codes;
    its number of lines. Without a negative value, every field has one more NUL in front, for the sign that
    :func:`_floating_lines` writes as ``_NO_SIGN`` and removes."""

    codes: torch.Tensor
    line_count: int


_frames: dict[tuple[object, ...], _Frame] = {}


def _frame(printed: PrintedValues, negative: bool) -> _Frame:
    key = (printed.shape, negative, printed.suffixes, printed.options)
    frame = _frames.get(key)
    if frame is None:
        if len(_frames) >= _CACHE_LIMIT:
            _frames.clear()
        width = printed.options[0] + 6 + negative  # every value's string is of the narrowest sci form: 1.0000e+00
        text = blank_text(printed.shape, width, printed.suffixes, printed.options) + "\n"
        if not negative:  # the fields are runs of exactly `width` NULs, apart
            text = text.replace("\0" * width, "\0" * (width + 1))
        codes = torch.frombuffer(bytearray(text.encode("ascii")), dtype=torch.uint8)
        frame = _frames[key] = _Frame(codes, text.count("\n"))
    return frame


def _lines_each(batch: Sequence[PrintedValues | tuple[str, ...]]) -> list[tuple[str, ...]]:
    """Each tensor's lines by :func:`tensor_text` (or the lines torch's printer gave), the printed elements of all
    read at once per dtype (one ``tolist()`` each, not one per tensor)."""
    by_dtype: dict[torch.dtype, list[int]] = {}
    for index, printed in enumerate(batch):
        if isinstance(printed, PrintedValues) and isinstance(printed.values, torch.Tensor):
            by_dtype.setdefault(printed.values.dtype, []).append(index)
    plain: list[Any] = [None] * len(batch)
    for indices in by_dtype.values():
        tensors: list[torch.Tensor] = [batch[index].values for index in indices]  # type: ignore[union-attr,misc]
        values = (tensors[0] if len(tensors) == 1 else torch.cat(tensors)).tolist()
        at = 0
        for index, tensor in zip(indices, tensors):
            size = tensor.numel()
            plain[index] = values[at : at + size]
            at += size
    lines: list[tuple[str, ...]] = []
    for printed, values in zip(batch, plain):
        if isinstance(printed, PrintedValues):
            shown: Any = printed.values if values is None else values  # None: already as tolist() gives them
            text = tensor_text(shown, printed.shape, printed.floating, printed.suffixes, printed.options)
            lines.append(tuple(text.splitlines()))
        else:
            lines.append(printed)
    return lines


def lines_of_all(batch: Sequence[PrintedValues | tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The repr lines of each tensor in ``batch``, exactly as :func:`tensor_text` gives them (the copies still
    arriving from a device waited for first)."""
    _wait(batch)
    lines: list[tuple[str, ...] | None] = [None] * len(batch)
    by_precision: dict[int, list[int]] = {}
    singles: list[int] = []
    for index, printed in enumerate(batch):
        if (
            isinstance(printed, PrintedValues)
            and printed.floating
            and isinstance(printed.values, torch.Tensor)
            and 1 <= printed.options[0] <= MAX_PRECISION
        ):
            by_precision.setdefault(printed.options[0], []).append(index)
        else:
            singles.append(index)
    for precision, indices in by_precision.items():
        group: list[PrintedValues] = [batch[index] for index in indices]  # type: ignore[misc]
        counts = [printed.values.numel() for printed in group]  # type: ignore[union-attr]
        if sum(counts) < BATCH_MIN_VALUES:
            singles += indices
            continue
        for index, text in zip(indices, _floating_lines(group, counts, precision)):
            if text is None:
                singles.append(index)
            else:
                lines[index] = text
    for index, text in zip(singles, _lines_each([batch[index] for index in singles])):
        lines[index] = text
    return lines  # type: ignore[return-value]


def _wait(batch: Sequence[PrintedValues | tuple[str, ...]]) -> None:
    """Wait for the copies from devices in ``batch`` (their events, each once)."""
    waited: set[int] = set()
    for printed in batch:
        ready = printed.ready if isinstance(printed, PrintedValues) else None
        if ready is not None and id(ready) not in waited:
            waited.add(id(ready))
            ready.synchronize()


def _floating_lines(group: list[PrintedValues], sizes: list[int], precision: int) -> list[tuple[str, ...] | None]:
    """The lines of each tensor of ``group`` filled into its frame; None for one whose fields would not all be of
    torch's widest width (it takes :func:`tensor_text`)."""
    tensors: list[torch.Tensor] = [printed.values for printed in group]  # type: ignore[misc]
    counts = torch.tensor(sizes, device=_CPU)
    values = torch.cat(tensors).to(torch.float64)
    chars, irregular = sci_chars(values, precision)
    owner = torch.repeat_interleave(counts)
    flags = torch.stack([irregular, values != 0, values < 0, torch.signbit(values)], dim=1).cumsum(0)
    ends = flags[counts.cumsum(0) - 1]
    tallies = torch.diff(ends, dim=0, prepend=torch.zeros((1, 4), dtype=ends.dtype, device=_CPU)).tolist()
    frames: list[_Frame | None] = []
    for (irregulars, nonzeros, negatives, signed), printed in zip(tallies, group):
        filled = irregulars == 0 and nonzeros > 0 and (negatives > 0) == (signed > 0)
        frames.append(_frame(printed, negatives > 0) if filled else None)
    lines: list[tuple[str, ...] | None] = [None] * len(group)
    used = [frame for frame in frames if frame is not None]
    if not used:
        return lines
    signless = torch.tensor([tally[2] == 0 for tally in tallies], device=_CPU)
    chars[:, 0].masked_fill_(signless.index_select(0, owner), _NO_SIGN)
    if len(used) < len(frames):
        chars = chars[torch.tensor([frame is not None for frame in frames], device=_CPU).index_select(0, owner)]
    codes = torch.cat([frame.codes for frame in used])
    codes.masked_scatter_(codes == 0, chars)
    text = ctypes.string_at(codes.data_ptr(), codes.numel()).decode("ascii").replace(_NO_SIGN_TEXT, "").split("\n")
    at = 0
    for index, frame in enumerate(frames):
        if frame is not None:
            lines[index] = tuple(text[at : at + frame.line_count])
            at += frame.line_count
    return lines


class ReprBatch:
    """Printed values waiting to be formatted together: :meth:`add` hands out their lines-to-be."""

    def __init__(self) -> None:
        # Held weakly: the lines hold their batch, and a trace dropped unread frees its snapshots at once (a strong
        # reference back would leave them to the garbage collector).
        self._waiting: list[weakref.ref[PendingLines]] = []

    def add(self, printed: PrintedValues) -> PendingLines:
        pending = PendingLines(self, printed)
        self._waiting.append(weakref.ref(pending))
        return pending

    def format(self) -> None:
        """Format every value waiting (the snapshots are released). Whatever is not filled when formatting fails or
        is interrupted stays waiting, and a value added meanwhile waits for the next call."""
        refs, self._waiting = self._waiting, []
        waiting = [pending for pending in (ref() for ref in refs) if pending is not None]
        filled = 0
        try:
            if waiting:
                formatted = lines_of_all([pending._printed for pending in waiting])
                for pending, lines in zip(waiting, formatted):
                    pending._fill(lines)
                    filled += 1
        finally:
            if filled < len(waiting):
                self._waiting = [weakref.ref(pending) for pending in waiting[filled:]] + self._waiting


class PendingLines(Sequence[str]):
    """A tensor's repr lines, formatted with the rest of its batch when first read; equal to (and hashed as) the
    tuple of them, and pickled as that tuple."""

    __slots__ = ("__weakref__", "_batch", "_lines", "_printed")

    def __init__(self, batch: ReprBatch, printed: PrintedValues) -> None:
        self._batch: ReprBatch | None = batch
        self._printed: Any = printed
        self._lines: tuple[str, ...] = ()

    def _fill(self, lines: tuple[str, ...]) -> None:
        self._lines, self._batch, self._printed = lines, None, None

    @property
    def lines(self) -> tuple[str, ...]:
        batch = self._batch
        if batch is not None:
            batch.format()
            if self._batch is not None:  # not filled: never read as no lines
                raise RuntimeError("repr lines were not formatted: their batch lost them")
        return self._lines

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...
    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        return self.lines[index]

    def __len__(self) -> int:
        return len(self.lines)

    def __iter__(self) -> Iterator[str]:
        return iter(self.lines)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PendingLines):
            other = other.lines
        return self.lines == other

    def __hash__(self) -> int:
        return hash(self.lines)

    def __repr__(self) -> str:
        return repr(self.lines)

    def __reduce__(self) -> tuple[type[tuple[str, ...]], tuple[tuple[str, ...]]]:
        return tuple, (self.lines,)
