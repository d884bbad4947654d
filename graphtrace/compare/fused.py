"""Fused projections: one call of one trace whose output is the concatenation of several calls' outputs in the other.

A port often computes q, k and v with one ``wqkv`` (or GPT-2's ``c_attn``) where the original has ``q_proj``,
``k_proj`` and ``v_proj`` (or the other way round). No call-to-call alignment can pair them: their output shapes
differ. Here, among the calls alignment left unmatched, a *fused* call pairs with a run of *parts* when

- the fused call's nearest matched caller is matched with the parts' nearest matched caller (they sit at the same
  place in both models, though one may wrap them in a container the other lacks),
- every part is a module call taking an input of the fused call's shape, in execution order, a leaf when the
  fused call is one, and
- the parts' outputs, concatenated along the last dimension, have the fused output's shape and dtype, and
- every part was given what the fused call was given: its first input's statistics agree, or (after a divergence
  upstream, when they no longer do) it reads the output of a call paired with the one the fused call reads. A
  projection fused with others reads the same hidden state, while calls that merely have fitting shapes (an MLP's
  up projection and the two norms of a block) read different ones.

Each part is then compared with its columns of the fused output, side by side or per head
(compare/fused_layout.py), with the usual equivalences such as a rotary layout permutation; with statistics only,
the fused output's statistics are compared with those of the concatenation, which follow exactly from the parts'
(count-weighted means and variances, min of mins, max of maxes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from graphtrace.compare.measure import StatPoint, Tolerance, split_alike, squeezed
from graphtrace.model import CallNode, Stats, TensorRecord

__all__ = ["FusedMatch", "concatenated_record", "find_fused"]


@dataclass(frozen=True, slots=True)
class FusedMatch:
    """``fused`` (in trace A when ``fused_in_a``, else in B) holds the outputs of ``parts`` (in the other trace)
    side by side: part ``k`` is the fused output's last-dimension slice ``offsets[k]:offsets[k] + width``."""

    fused: CallNode
    parts: tuple[CallNode, ...]
    offsets: tuple[int, ...]
    fused_in_a: bool
    stacked: bool = False  # the parts stacked on a new leading axis ([2, B, T, ...]), compared as if side by side
    split: bool = False  # the parts side by side in a last dim split into several ([B, T, 3, H, Dh])

    def side_by_side(self, record: TensorRecord) -> TensorRecord:
        """The fused output's record as its parts side by side along the last dimension: itself, or, when they are
        stacked on a leading axis or the last dim is split, with the parts' leading shape and their widths summed
        (no fingerprint when stacked: its groups follow the stacking)."""
        if not self.stacked and not self.split:
            return record
        part = _single_output(self.parts[0])
        assert part is not None
        shape = (*part.shape[:-1], part.shape[-1] * len(self.parts))
        return dataclasses.replace(record, shape=shape, sketch=None if self.stacked else record.sketch)


def _single_output(node: CallNode) -> TensorRecord | None:
    outputs = node.outputs
    if isinstance(outputs, TensorRecord):
        return outputs
    if isinstance(outputs, tuple) and len(outputs) == 1 and isinstance(outputs[0], TensorRecord):
        return outputs[0]
    return None


def _first_input(node: CallNode) -> TensorRecord | None:
    return next((record for _, record in node.input_tensors()), None)


def _parents(root: CallNode) -> dict[int, CallNode]:
    parents: dict[int, CallNode] = {}
    for node in root.walk():
        for child in node.children:
            parents[id(child)] = node
    return parents


def _matched_ancestor(node: CallNode, parents: dict[int, CallNode], matched: dict[int, CallNode]) -> CallNode | None:
    """The nearest caller of ``node`` that alignment matched (a port's attention may be matched where the
    original's q, k and v sit one container deeper, in a ``self`` attention the port has no counterpart of)."""
    parent = parents.get(id(node))
    while parent is not None and id(parent) not in matched:
        parent = parents.get(id(parent))
    return parent


def _same_output(one: CallNode, other: CallNode) -> bool:
    a, b = _single_output(one), _single_output(other)
    return a is not None and b is not None and (squeezed(a.shape) == squeezed(b.shape) or split_alike(a.shape, b.shape))


def _same_input(given: TensorRecord, other: TensorRecord, tolerance: Tolerance) -> bool:
    """Whether two calls were given the same tensor, as far as statistics tell (True when either has none)."""
    x, y = StatPoint.of(given), StatPoint.of(other)
    return x is None or y is None or x.close_to(y, *tolerance.for_dtypes(x.dtype, y.dtype))


def _fed_alike(flow: Callable[[], Sequence[tuple[CallNode, CallNode]]]) -> Callable[[CallNode, CallNode], bool]:
    """Whether two calls (``one`` of trace A, ``other`` of B) received the output of calls paired with each other
    (data flow): after a divergence upstream their inputs differ in both traces alike, and they still read the same
    thing. The pairs come from ``flow``, asked once, on first use."""
    counterparts: list[tuple[dict[str, str], dict[str, str]]] = []

    def fed_alike(one: CallNode, other: CallNode) -> bool:
        if not counterparts:
            pairs = flow()
            counterparts.append(({a.id: b.id for a, b in pairs}, {b.id: a.id for a, b in pairs}))
        by_id_a, by_id_b = counterparts[0]
        for mapping, mine, theirs in ((by_id_a, one, other), (by_id_b, other, one)):
            fed = {mapping[source] for source in mine.inputs_from if source in mapping}
            if fed & set(theirs.inputs_from):
                return True
        return False

    return fed_alike


def _stacked_like(out: tuple[int, ...], part: tuple[int, ...]) -> bool:
    """Whether a fused output of shape ``out`` holds parts of shape ``part`` stacked on a new leading axis (an
    einsum over a weight ``[2, D, K, Dh]`` returns k and v as ``[2, B, T, K, Dh]``), each part's elements in its
    own order (its last dimension possibly split)."""
    whole = squeezed(out)
    if len(whole) < 2 or whole[0] < 2:
        return False
    rest = whole[1:]
    return squeezed(part) == rest or split_alike(rest, part)


def _runs(
    fused: CallNode,
    candidates: Sequence[CallNode],
    tolerance: Tolerance,
    fed_alike: Callable[[CallNode, CallNode], bool],
    fused_in_a: bool,
) -> Iterator[tuple[tuple[CallNode, ...], bool]]:
    """Runs of candidates whose outputs, side by side or stacked on a leading axis (True), make up ``fused``'s
    output: consecutive among those that could be parts (an MLP's gate and up projections with its activation
    called between them)."""
    out, given = _single_output(fused), _first_input(fused)
    if out is None or given is None or not out.shape:
        return
    width, lead = out.shape[-1], squeezed(out.shape[:-1])
    tokens, whole = squeezed(given.shape[:-1]), squeezed(out.shape)
    if len(whole) > len(tokens) + 1 and whole[: len(tokens)] == tokens:  # a split last dim: [B, T, 3, H, Dh]
        width, lead = math.prod(whole[len(tokens) :]), tokens
    usable: list[int | None] = []
    stacking: list[bool] = []
    for node in candidates:
        part_out, part_in = _single_output(node), _first_input(node)
        if part_out is None or part_in is None or not part_out.shape or part_out.dtype != out.dtype:
            usable.append(None)
        elif node.leaf != fused.leaf:  # a projection's parts are projections, not an attention around them
            usable.append(None)
        elif squeezed(part_in.shape) != squeezed(given.shape):
            usable.append(None)
        elif squeezed(part_out.shape[:-1]) != lead and not _stacked_like(out.shape, part_out.shape):
            usable.append(None)
        elif squeezed(part_out.shape[:-1]) == lead and part_out.shape[-1] >= width:  # side by side, each narrower
            usable.append(None)  # (checked before the inputs: it costs nothing)
        elif not _same_input(given, part_in, tolerance) and not fed_alike(
            *((fused, node) if fused_in_a else (node, fused))
        ):
            usable.append(None)
        else:
            usable.append(part_out.shape[-1])
        stacking.append(part_out is not None and usable[-1] is not None and squeezed(part_out.shape[:-1]) != lead)
    parts = [(node, size, on) for node, size, on in zip(candidates, usable, stacking, strict=True) if size is not None]
    stack = squeezed(out.shape)[0] if out.shape and squeezed(out.shape) else 0
    for start in range(len(parts)):
        if parts[start][2]:  # stacked: as many parts of one shape as the leading axis holds
            run = parts[start : start + stack]
            if len(run) == stack and all(on and size == parts[start][1] for _, size, on in run):
                yield tuple(node for node, _, _ in run), True
            continue
        total = 0
        for end in range(start, len(parts)):
            if parts[end][2]:
                break
            total += parts[end][1]
            if total == width and end > start:
                yield tuple(node for node, _, _ in parts[start : end + 1]), False
                break
            if total > width:
                break


def find_fused(
    root_a: CallNode,
    root_b: CallNode,
    pairs: Sequence[tuple[CallNode, CallNode]],
    only_a: Sequence[CallNode],
    only_b: Sequence[CallNode],
    tolerance: Tolerance | None = None,
    flow: Callable[[], Sequence[tuple[CallNode, CallNode]]] | None = None,
) -> list[FusedMatch]:
    """Fused calls among the unmatched ones, in either direction (see the module docstring); ``pairs`` are the
    calls matched so far, (A, B); ``flow`` gives pairs (provisional, leaves included) to follow data flow through,
    asked for only when a part's input statistics disagree with the fused call's."""
    counterpart_of_b = {id(b): a for a, b in pairs}
    counterpart_of_a = {id(a): b for a, b in pairs}
    fed_alike = _fed_alike(flow or (lambda: pairs))
    parents_a, parents_b = _parents(root_a), _parents(root_b)
    found: list[FusedMatch] = []
    used: set[int] = set()
    for fused_in_a, lone, others, parents_lone, parents_other, counterpart in (
        (False, only_b, only_a, parents_b, parents_a, counterpart_of_b),
        (True, only_a, only_b, parents_a, parents_b, counterpart_of_a),
    ):
        matched_other = counterpart_of_a if fused_in_a is False else counterpart_of_b
        by_caller: dict[int, list[CallNode]] = {}  # the other trace's unmatched calls by their nearest matched caller
        for node in others:
            if node.kind == "module":
                caller_of_node = _matched_ancestor(node, parents_other, matched_other)
                if caller_of_node is not None:
                    by_caller.setdefault(id(caller_of_node), []).append(node)
        for fused in lone:
            if fused.kind != "module" or id(fused) in used:
                continue
            ancestor = _matched_ancestor(fused, parents_lone, counterpart)
            caller = counterpart.get(id(ancestor)) if ancestor is not None else None
            if caller is None:
                continue
            candidates = [node for node in by_caller.get(id(caller), ()) if id(node) not in used]
            if any(_same_output(fused, node) for node in candidates):
                continue  # a call of the fused one's own shape is there: a one-to-one pair, left to alignment
            found_run = next(_runs(fused, candidates, tolerance or Tolerance(), fed_alike, fused_in_a), None)
            if found_run is None:
                continue
            run, stacked = found_run
            offsets, at = [], 0
            for part in run:
                offsets.append(at)
                record = _single_output(part)
                assert record is not None
                at += record.shape[-1]
            used.update(id(node) for node in (fused, *run))
            whole = _single_output(fused)
            assert whole is not None and whole.shape
            split = not stacked and at != whole.shape[-1]  # the parts' widths fill a last dim split into several
            found.append(FusedMatch(fused, run, tuple(offsets), fused_in_a, stacked, split))
    return found


def concatenated_record(parts: Sequence[TensorRecord]) -> TensorRecord | None:
    """The record (shape, dtype, exact statistics) of the parts' concatenation along the last dimension, or None
    when a part has no statistics."""
    if any(part.stats is None for part in parts):
        return None
    counts = [part.numel for part in parts]
    total = sum(counts)
    if total == 0:
        return None
    mean = sum(n * part.stats.mean for n, part in zip(counts, parts) if part.stats) / total
    squares = 0.0
    for n, part in zip(counts, parts):
        assert part.stats is not None
        spread = part.stats.std if n > 1 and math.isfinite(part.stats.std) else 0.0
        deviation = part.stats.mean - mean  # squared by a product: inf beyond float64, where ** raises
        squares += (n - 1) * spread * spread + n * deviation * deviation
    std = math.sqrt(squares / (total - 1)) if total > 1 else math.nan
    lowest = min(part.stats.min for part in parts if part.stats)
    highest = max(part.stats.max for part in parts if part.stats)
    shape = (*parts[0].shape[:-1], sum(part.shape[-1] for part in parts))
    return TensorRecord(
        shape=shape,
        dtype=parts[0].dtype,
        device=parts[0].device,
        stats=Stats(mean, std, lowest, highest),
        nan_count=sum(part.nan_count for part in parts),
        inf_count=sum(part.inf_count for part in parts),
    )
