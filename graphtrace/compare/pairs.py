"""One matched pair of calls -> a :class:`CallDiff`: their tensors paired up and measured.

Tensors pair by position first (``inputs_args_0`` with ``inputs_args_0``, ``outputs_logits`` with
``outputs_logits``); what is left pairs in order among tensors of the same shape, so that a port passing
``hidden_states`` by keyword still compares with an original passing it positionally. Inputs left over stay apart
(extra arguments, not a difference), but for one attention mask on each side in other conventions (boolean and
additive, or broadcast over the batch), compared by the positions it keeps; outputs left over pair in order anyway,
so that an output of the wrong shape is reported. Full values are loaded (through the :class:`ValueFiles` the caller
opens) only when both traces hold files.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from graphtrace.compare.align import Match, MatchKind, without_block_number
from graphtrace.compare.fused import FusedMatch, concatenated_record
from graphtrace.compare.fused_layout import PartColumns, part_columns
from graphtrace.compare.measure import (
    Status,
    TensorDiff,
    Tolerance,
    broadcastable,
    mask_record,
    measure,
    measure_masks,
    padding,
    shape_key,
)
from graphtrace.errors import TraceFormatError
from graphtrace.model import CallNode, TensorRecord, Trace

__all__ = [
    "CallDiff",
    "Given",
    "OpenValues",
    "StoredValues",
    "ValueFiles",
    "diff_call",
    "diff_fused",
    "given",
    "taught_layouts",
    "unread_padding",
]

Named = tuple[str, TensorRecord]


@dataclass(frozen=True, slots=True)
class CallDiff:
    """A matched pair of calls (``a`` in trace A, ``b`` in trace B, of step ``step``) and how they differ.

    ``status`` is about the outputs: ``"diverged"`` when an output tensor is outside tolerance or differs in shape,
    or when only one call raised (``error`` says which); ``"equal"`` when some output was compared and none
    diverged; ``"unchecked"`` when no output could be compared (a container in transformers' format has none).
    """

    step: int
    a: CallNode
    b: CallNode
    how: MatchKind
    inputs: tuple[TensorDiff, ...]
    outputs: tuple[TensorDiff, ...]
    only_in_a: tuple[str, ...] = ()
    only_in_b: tuple[str, ...] = ()
    error: str | None = None

    @property
    def status(self) -> Status:
        if self.error is not None or any(d.status == "diverged" for d in self.outputs):
            return "diverged"
        return "equal" if any(d.status == "equal" for d in self.outputs) else "unchecked"

    @property
    def inputs_agree(self) -> bool:
        """No input tensor diverges (inputs that could not be compared count as agreeing)."""
        return not any(d.status == "diverged" for d in self.inputs)

    @property
    def reason(self) -> str:
        """Why the pair diverges, in words ("" when it does not)."""
        if self.error is not None:
            return self.error
        worst = self.worst
        if worst is not None and worst.status == "diverged":
            return f"{worst.name_a}: {worst.reason}"
        changed = next((d for d in self.inputs if d.status == "diverged"), None)
        return f"{changed.name_a}: {changed.reason}" if changed is not None else ""

    @property
    def worst(self) -> TensorDiff | None:
        """The output that differs most (a diverged one when there is one)."""
        ranked = sorted(self.outputs, key=lambda d: (d.status == "diverged", d.largest or 0.0))
        return ranked[-1] if ranked else None


def _pair(
    a_items: Iterable[Named], b_items: Iterable[Named], *, any_shape: bool
) -> tuple[list[tuple[Named, Named]], list[str], list[str]]:
    """Pairs of tensors, and the names left unpaired in A and in B. With ``any_shape``, tensors still unpaired after
    the name and shape passes pair in order anyway (so that an output of the wrong shape is reported)."""
    rest_b = list(b_items)
    by_name = {name: k for k, (name, _) in enumerate(rest_b)}
    pairs: list[tuple[Named, Named]] = []
    rest_a: list[Named] = []
    taken: set[int] = set()
    for item in a_items:
        k = by_name.get(item[0])
        # an input passed at the same place but of another shape is another quantity (a port passing a bias where
        # the original passes a mask): it stays apart, as an extra argument; an output is reported
        if k is None or not any_shape and not _same_quantity(rest_b[k][1], item[1]):
            rest_a.append(item)
        else:
            pairs.append((item, rest_b[k]))
            taken.add(k)
    rest_b = [item for k, item in enumerate(rest_b) if k not in taken]
    unpaired_a: list[Named] = []
    for item in rest_a:  # same shape first, in order
        k = next((k for k, other in enumerate(rest_b) if _same_quantity(other[1], item[1])), None)
        if k is None:
            unpaired_a.append(item)
        else:
            pairs.append((item, rest_b.pop(k)))
    left = min(len(unpaired_a), len(rest_b)) if any_shape else 0
    pairs += list(zip(unpaired_a[:left], rest_b[:left]))
    return pairs, [name for name, _ in unpaired_a[left:]], [name for name, _ in rest_b[left:]]


def _same_quantity(a: TensorRecord, b: TensorRecord) -> bool:
    """Whether two tensors may hold the same quantity: shapes alike (:class:`~graphtrace.compare.measure.ShapeKey`)
    and both boolean or neither (a port's boolean mask, where the original adds a floating one, is another
    quantity)."""
    return shape_key(a.shape) == shape_key(b.shape) and (a.dtype == "torch.bool") == (b.dtype == "torch.bool")


class ValueFiles(Protocol):
    """The full values of one step of a saved trace (``graphtrace.io.tensors.TensorFiles``): ``load`` reads the
    tensor a record's ``file`` names."""

    directory: Path

    def load(self, file: str, shape: tuple[int, ...] | None = None) -> Any: ...


OpenValues = Callable[[Trace, int], "ValueFiles | None"]
"""Opens the stored values of a trace's step; None when the trace keeps none on disk. Handed to
:func:`graphtrace.compare.compare` by the layer that reads files (the package's top, through io)."""


class StoredValues:
    """Where each trace's full values of one step live, read on demand: the files are opened (and torch imported)
    only when a value is read, and a bundle shard is opened once for all the tensors it holds."""

    def __init__(self, open_a: Callable[[], ValueFiles | None], open_b: Callable[[], ValueFiles | None]) -> None:
        self._open = (open_a, open_b)
        self._files: list[ValueFiles | None] = [None, None]
        self._opened = [False, False]

    def both(self, a: TensorRecord, b: TensorRecord) -> tuple[Any, Any] | None:
        """The values of ``a`` (trace A) and ``b`` (trace B), or None when either has no file."""
        if not a.file or not b.file:
            return None
        files_a, files_b = self._files_of(0), self._files_of(1)
        if files_a is None or files_b is None:
            return None
        return _load(files_a, a, "A"), _load(files_b, b, "B")

    def _files_of(self, side: int) -> ValueFiles | None:
        if not self._opened[side]:
            self._files[side] = self._open[side]()
            self._opened[side] = True
        return self._files[side]


def _load(files: ValueFiles, record: TensorRecord, where: str) -> Any:
    """The value of ``record``, checked to be the tensor the trace describes: a file that holds another shape (a
    crafted or mixed-up trace directory) would be compared element by element against the wrong tensor."""
    file = record.file
    assert file is not None
    value = _read(files, file, record.shape, where)
    shape = tuple(getattr(value, "shape", ()))
    if shape != record.shape:
        raise TraceFormatError(
            f"trace {where} refers to {file} in {files.directory}, which holds a tensor of shape {list(shape)} where "
            f"the trace records {list(record.shape)}; the file does not belong to this trace (copy the trace "
            "directory whole, or capture it again)."
        )
    return value


def _read(files: ValueFiles, file: str, shape: tuple[int, ...], where: str) -> Any:
    try:
        return files.load(file, shape)  # a reader that can checks the shape before reading the bytes
    except TraceFormatError:
        raise  # a reference leading out of the trace's directory: said as it is
    # re-raised with context: a file that cannot be opened or parsed (OSError, safetensors' own SafetensorError,
    # a header torch cannot map), named with the trace and the remedy
    except Exception as exc:
        raise TraceFormatError(
            f"trace {where} refers to {file}, which cannot be read from {files.directory} "
            f"({type(exc).__name__}: {exc}). Copy the trace directory with all its .safetensors files."
        ) from exc


def _measure_pairs(
    prefix: str,
    pairs: list[tuple[Named, Named]],
    tolerance: Tolerance,
    stored: StoredValues,
    *,
    any_dims_order: bool = True,
    layouts: Sequence[str] | None = None,
) -> tuple[TensorDiff, ...]:
    diffs = []
    for k, ((name_a, a), (name_b, b)) in enumerate(pairs):
        alike = shape_key(a.shape) == shape_key(b.shape) or padding(a.shape, b.shape) is not None
        values = stored.both(a, b) if alike else None
        layout = layouts[k] if layouts is not None and k < len(layouts) else None
        diffs.append(
            measure(
                prefix + name_a, a, prefix + name_b, b, tolerance, values, any_dims_order=any_dims_order, layout=layout
            )
        )
    return tuple(diffs)


def _error(a: CallNode, b: CallNode) -> str | None:
    if a.error == b.error:
        return None
    if b.error is None:
        return f"only A raised: {a.error}"
    if a.error is None:
        return f"only B raised: {b.error}"
    return f"A raised {a.error}; B raised {b.error}"


def _called_from_inside(node: CallNode) -> bool:
    """Whether ``node`` is a call inside the model (not the step's root, whose output its caller reads)."""
    return "." in node.path or node.kind == "op"


Given = frozenset[tuple[object, ...]]
"""What the calls of a step are given: each input tensor by element count, dtype and statistics (:func:`given`)."""


def _given_key(record: TensorRecord) -> tuple[object, ...]:
    return (math.prod(record.shape), record.dtype, repr(record.stats))  # repr: NaN statistics compare alike


def given(root: CallNode) -> Given:
    """Every tensor some call of ``root``'s step (``root`` included, ops too) is given, viewed in any shape."""
    return frozenset(
        _given_key(record) for node in root.walk() for _, record in node.input_tensors() if record.stats is not None
    )


def _side_outputs(
    out_pairs: list[tuple[Named, Named]], a: CallNode, b: CallNode, reads: tuple[Given, Given] | None
) -> list[tuple[Named, Named]]:
    """The pairs of outputs beyond each call's first that no call of either trace is given (by statistics): a side
    product (transformers' attention returns its weights, openai-whisper's its pre-softmax scores, and their
    callers drop them) that nothing downstream computes from. Another quantity on each side is no departure."""
    if reads is None or not _called_from_inside(a):
        return []
    first_a = next((name for name, _ in a.output_tensors()), None)
    first_b = next((name for name, _ in b.output_tensors()), None)

    def unread(name: str, record: TensorRecord, first: str | None, seen: Given) -> bool:
        return name != first and record.stats is not None and _given_key(record) not in seen

    return [
        ((name_a, ra), (name_b, rb))
        for (name_a, ra), (name_b, rb) in out_pairs
        if unread(name_a, ra, first_a, reads[0]) and unread(name_b, rb, first_b, reads[1])
    ]


def _masks_apart(a: CallNode, b: CallNode, in_a: list[str], in_b: list[str]) -> tuple[Named, Named] | None:
    """The attention masks the two calls are given in other conventions, when each call is given exactly one mask
    left unpaired (a boolean ``[1, 1, T, T]`` of the port against transformers' additive ``[B, 1, T, T]``) and their
    shapes broadcast to one another: the same quantity, compared by the positions it keeps."""
    left_a = [(name, record) for name, record in a.input_tensors() if name in in_a and mask_record(record)]
    left_b = [(name, record) for name, record in b.input_tensors() if name in in_b and mask_record(record)]
    if len(left_a) != 1 or len(left_b) != 1 or broadcastable(left_a[0][1].shape, left_b[0][1].shape) is None:
        return None
    return left_a[0], left_b[0]


def _measure_masks(masks: tuple[Named, Named] | None, stored: StoredValues) -> tuple[TensorDiff, ...]:
    if masks is None:
        return ()
    (name_a, a), (name_b, b) = masks
    return (measure_masks("inputs" + name_a, a, "inputs" + name_b, b, stored.both(a, b)),)


def diff_call(
    step: int,
    match: Match,
    tolerance: Tolerance,
    stored: StoredValues,
    reads: tuple[Given, Given] | None = None,
    layouts: Sequence[str] | None = None,
) -> CallDiff:
    """Compare the inputs and outputs of one matched pair; ``stored`` reads the traces' full values. ``reads`` (what
    the calls of each step are given, :func:`given`) sets aside outputs beyond the first that no call reads.
    ``layouts``: the only re-ordering of the last dimension allowed for in each output ("" none), else any."""
    a, b = match.a, match.b
    in_pairs, in_a, in_b = _pair(a.input_tensors(), b.input_tensors(), any_shape=False)
    masks = _masks_apart(a, b, in_a, in_b)
    if masks is not None:
        in_a, in_b = [n for n in in_a if n != masks[0][0]], [n for n in in_b if n != masks[1][0]]
    out_pairs, out_a, out_b = _pair(a.output_tensors(), b.output_tensors(), any_shape=True)
    side = _side_outputs(out_pairs, a, b, reads)
    if side:
        out_pairs = [pair for pair in out_pairs if pair not in side]
        out_a = [*out_a, *(f"{name} (read by no call)" for (name, _), _ in side)]
        out_b = [*out_b, *(f"{name} (read by no call)" for _, (name, _) in side)]
    return CallDiff(
        step=step,
        a=a,
        b=b,
        how=match.how,
        inputs=_measure_pairs("inputs", in_pairs, tolerance, stored) + _measure_masks(masks, stored),
        # the model's own output is read as it is laid out: a transposed result is another shape
        outputs=_measure_pairs(
            "outputs", out_pairs, tolerance, stored, any_dims_order=_called_from_inside(a), layouts=layouts
        ),
        only_in_a=tuple([f"inputs{n}" for n in in_a] + [f"outputs{n}" for n in out_a]),
        only_in_b=tuple([f"inputs{n}" for n in in_b] + [f"outputs{n}" for n in out_b]),
        error=_error(a, b),
    )


def diff_fused(
    step: int,
    found: Sequence[FusedMatch],
    caller: Callable[[FusedMatch], CallDiff | None],
    tolerance: Tolerance,
    stored: StoredValues,
) -> list[CallDiff]:
    """One pair per part of each fused projection of a step: the part against its columns of the fused output (with
    full values: side by side or per head, see compare/fused_layout.py), or the concatenation of the parts against
    the fused output (with statistics only). ``caller`` gives the pair of calls that call a fused one and its parts.

    Values alone cannot tell a port that lays its parts out in another order from one that swapped two parts of the
    same width on load (k's rows and v's, gate's and up's: each then computes what the other's columns hold). The
    same fused projection in every block is the same code and lays its parts out alike, so where its callers agree
    (its path with the block number left out) they show the layout, and a block whose caller departs is compared
    under it when all of them show the same: a swap in one block departs at the part, and so do parts that fit no
    layout after a departure upstream."""
    values = [_fused_values(fused, stored) for fused in found]
    layouts = [_layout(fused, pair, tolerance) for fused, pair in zip(found, values, strict=True)]
    agreeing = [_caller_agrees(caller(fused)) for fused in found]
    shown: dict[tuple[object, ...], dict[tuple[int, tuple[int, ...]], PartColumns]] = {}
    for fused, layout, agrees in zip(found, layouts, agreeing, strict=True):
        if layout is not None and layout.proven and agrees:
            shown.setdefault(_fused_code(fused), {})[layout.key] = layout
    for k, (fused, pair, layout, agrees) in enumerate(zip(found, values, layouts, agreeing, strict=True)):
        lessons = shown.get(_fused_code(fused), {})
        if layout is None or pair is None or agrees or len(lessons) != 1:
            continue
        (usual,) = lessons.values()
        if usual.key != layout.key:
            layouts[k] = usual.like([int(part.shape[-1]) for part in pair[1]], pair[0]) or layout
    diffs = []
    for fused, pair, layout in zip(found, values, layouts, strict=True):
        diffs += _diff_fused(step, fused, tolerance, stored, pair, layout)
    return diffs


def taught_layouts(
    calls: Sequence[CallDiff],
    caller: Callable[[CallNode], CallDiff | None],
    tolerance: Tolerance,
    stored: StoredValues,
    reads: tuple[Given, Given] | None = None,
) -> list[CallDiff]:
    """``calls``, those whose outputs are equal only up to a re-ordering of their last dimension that the same call
    in other blocks does not show compared again under the one they show.

    Values alone accept any re-ordering of the last dimension as a port's layout: a projection whose output halves
    were swapped on load (Mamba's x and z) is then equal up to a permutation, and its caller is blamed. The same
    call in every block is the same code and lays its output out alike: where the calls whose callers agree (by
    their paths with block numbers left out) agree under one layout, a call whose caller departs is held to it."""
    shown: dict[tuple[str, str], set[tuple[str, ...]]] = {}
    for call in calls:
        if call.how != "fused" and call.status == "equal" and _caller_agrees(caller(call.a)):
            shown.setdefault(_code(call), set()).add(tuple(d.layout for d in call.outputs))
    taught = []
    for call in calls:
        layouts = tuple(d.layout for d in call.outputs)
        lessons = shown.get(_code(call), set())
        if any(layouts) and len(lessons) == 1 and layouts not in lessons and not _caller_agrees(caller(call.a)):
            (usual,) = lessons
            call = diff_call(call.step, Match(call.a, call.b, call.how), tolerance, stored, reads, layouts=usual)
        taught.append(call)
    return taught


def unread_padding(calls: Sequence[CallDiff], caller: Callable[[CallNode], CallDiff | None]) -> list[CallDiff]:
    """``calls``, those whose only departure is an output B pads along one dimension (compared without values)
    made unchecked where their caller agrees: what the port added is never read (the logits of a head over a padded
    vocabulary, cut back by the model). A caller whose own padding is unread agrees too (a head module whose
    projection pads, under a model that cuts). Under a caller that departs, the padding stays a departure."""
    unread: dict[int, bool] = {}

    def is_unread(call: CallDiff) -> bool:
        chain: list[CallDiff] = []  # padded-only calls up to one whose answer is known (iterative: deep nests)
        node: CallDiff | None = call
        verdict = False
        while node is not None and id(node.a) not in unread:
            if not _padded_only(node):
                verdict = node is not call and node.status == "equal"
                break
            chain.append(node)
            unread[id(node.a)] = False  # a cycle in a hostile trace ends here
            node = caller(node.a)
        else:
            verdict = node is not None and unread[id(node.a)]
        for link in reversed(chain):
            unread[id(link.a)] = verdict
        return unread.get(id(call.a), False)

    kept = []
    for call in calls:
        if call.error is None and caller(call.a) is None and any(d.padded for d in call.outputs):
            # the model's own output, or a call no matched caller reads: its padding is read as it is
            call = _restated_padding(
                call,
                "diverged",
                lambda d: f"shape {list(d.shape_a)} vs {list(d.shape_b)}: B's padding, returned by the model",
            )
        elif is_unread(call):
            call = _restated_padding(
                call, "unchecked", lambda d: f"{d.reason}: B's padding, unread (its caller agrees)"
            )
        kept.append(call)
    return kept


def _restated_padding(call: CallDiff, status: Status, reason: Callable[[TensorDiff], str]) -> CallDiff:
    """``call`` with each padded output given ``status`` and ``reason(output)``."""
    outputs = tuple(dataclasses.replace(d, status=status, reason=reason(d)) if d.padded else d for d in call.outputs)
    return dataclasses.replace(call, outputs=outputs)


def _padded_only(call: CallDiff) -> bool:
    """Whether a call's only departure is an output B pads (compared without values)."""
    diverged = [d for d in call.outputs if d.status == "diverged"]
    return bool(diverged) and call.error is None and all(d.padded for d in diverged)


def _code(call: CallDiff) -> tuple[str, str]:
    """What a pair of calls shares with the same pair in another block: their paths without block numbers."""
    return without_block_number(call.a.path), without_block_number(call.b.path)


def _caller_agrees(call: CallDiff | None) -> bool:
    return call is not None and call.status == "equal"


def _fused_code(fused: FusedMatch) -> tuple[object, ...]:
    """What a fused match shares with the same fused call and parts of another block: their paths without block
    numbers."""
    return (
        fused.fused_in_a,
        without_block_number(fused.fused.path),
        tuple(without_block_number(part.path) for part in fused.parts),
    )


def _layout(fused: FusedMatch, values: tuple[Any, list[Any]] | None, tolerance: Tolerance) -> PartColumns | None:
    if values is None:
        return None
    rtol, atol = tolerance.for_dtypes(_single(fused.fused).dtype, _single(fused.parts[0]).dtype)
    return part_columns(values[0], values[1], rtol, atol)


def _diff_fused(
    step: int,
    fused: FusedMatch,
    tolerance: Tolerance,
    stored: StoredValues,
    values: tuple[Any, list[Any]] | None,
    layout: PartColumns | None,
) -> list[CallDiff]:
    fused_out = fused.side_by_side(_single(fused.fused))
    part_outs = [_single(part) for part in fused.parts]
    combined = concatenated_record(part_outs)
    diffs = []
    for k, (part, part_out, offset) in enumerate(zip(fused.parts, part_outs, fused.offsets)):
        a, b = (fused.fused, part) if fused.fused_in_a else (part, fused.fused)
        in_pairs, in_a, in_b = _pair(a.input_tensors(), b.input_tensors(), any_shape=False)
        width = part_out.shape[-1]
        where = f"[..., {offset}:{offset + width}]" if layout is None else layout.where(k)
        if fused.stacked and (layout is None or layout.key == (1, tuple(fused.offsets))):
            where = f"[{k}]"  # the parts in their order on the leading axis
        if values is not None and layout is not None:
            whole, own = values[0], values[1][k]
            sliced = whole.index_select(-1, layout.columns[k]).reshape(own.shape)
            pair = (sliced, own) if fused.fused_in_a else (own, sliced)
            a_rec = b_rec = part_out  # the slice has the part's shape and dtype
            name_a, name_b = ("outputs" + where, "outputs") if fused.fused_in_a else ("outputs", "outputs" + where)
            output = measure(name_a, a_rec, name_b, b_rec, tolerance, pair)
        elif combined is not None:
            a_rec, b_rec = (fused_out, combined) if fused.fused_in_a else (combined, fused_out)
            output = measure("outputs", a_rec, "outputs", b_rec, tolerance)
            output = dataclasses.replace(
                output,
                equivalence=_join_note(
                    output.equivalence, "statistics of the fused output against those of its parts side by side"
                ),
            )
        else:
            a_out, b_out = (fused_out, part_out) if fused.fused_in_a else (part_out, fused_out)
            output = measure("outputs", a_out, "outputs", b_out, tolerance)
        kind = "a slice" if layout is None or layout.groups == 1 else "a per-head slice"
        note = f"{kind} {where} of the fused {fused.fused.path.rpartition('.')[2]}"
        output = dataclasses.replace(output, equivalence=_join_note(note, output.equivalence))
        diffs.append(
            CallDiff(
                step=step,
                a=a,
                b=b,
                how="fused",
                inputs=_measure_pairs("inputs", in_pairs, tolerance, stored),
                outputs=(output,),
                only_in_a=tuple(f"inputs{n}" for n in in_a),
                only_in_b=tuple(f"inputs{n}" for n in in_b),
                error=_error(a, b),
            )
        )
    return diffs


def _fused_values(fused: FusedMatch, stored: StoredValues) -> tuple[Any, list[Any]] | None:
    """The fused output's values and each part's, or None unless every one of them has a file."""
    fused_out = _single(fused.fused)
    whole = None
    own = []
    for part_out in (_single(part) for part in fused.parts):
        a_out, b_out = (fused_out, part_out) if fused.fused_in_a else (part_out, fused_out)
        values = stored.both(a_out, b_out)
        if values is None:
            return None
        fused_values, part_values = (values[0], values[1]) if fused.fused_in_a else (values[1], values[0])
        whole = fused_values if whole is None else whole
        own.append(part_values)
    if whole is not None and fused.stacked:  # [S, *part] laid out as the parts side by side: [..., S * width]
        shape = tuple(own[0].shape)
        whole = whole.reshape(len(own), *shape).movedim(0, -2).reshape(*shape[:-1], len(own) * shape[-1])
    elif whole is not None and fused.split:  # [..., 3, H, Dh] as [..., 3 * H * Dh]
        whole = whole.reshape(*own[0].shape[:-1], sum(int(part.shape[-1]) for part in own))
    return (whole, own) if whole is not None else None


def _single(node: CallNode) -> TensorRecord:
    outputs = node.outputs
    if isinstance(outputs, tuple):
        outputs = outputs[0]
    assert isinstance(outputs, TensorRecord)
    return outputs


def _join_note(first: str, second: str) -> str:
    return f"{first}; {second}" if first and second else first or second
