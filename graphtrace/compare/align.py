"""Which call of trace B corresponds to which call of trace A.

Three ways, tried in this order (``mode="auto"``):

1. **path**: the same module path relative to the model (``model.layers.1.mlp`` in both) and the same call index;
2. **rule**: A's path renamed by the user's rules (:mod:`graphtrace.compare.rules`) names a call of B;
3. **structure**: the calls still unmatched are aligned by execution order, in the gaps between the calls matched
   so far: containers first, then the rest between the containers matched. Two calls can pair when they are of
   the same kind, both leaves or both containers, and take and return tensors of the same shapes (module types
   may differ: ``Conv1D`` and ``nn.Linear``). The order-preserving pairing of the highest score wins; a pair
   scores more when its module types are the same and when its statistics agree. Ties go to the earliest call,
   so that a module followed by a no-op (a dropout in eval mode) pairs with the module; a call that returns what it
   was given pairs only with one that does too.

``mode="path"`` stops after rules; ``mode="structure"`` aligns everything but the two roots by structure.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

from graphtrace.compare.fused import FusedMatch, find_fused
from graphtrace.compare.measure import ShapeKey, StatPoint, Tolerance, shape_key
from graphtrace.compare.rules import RenameRule, apply_rules
from graphtrace.model import CallNode, TensorRecord, numbered

__all__ = [
    "AlignMode",
    "Alignment",
    "Match",
    "MatchKind",
    "align_calls",
    "passes_through",
    "relative_path",
    "returned_order",
]

_T = TypeVar("_T")

AlignMode = Literal["auto", "path", "structure"]
MatchKind = Literal["path", "rule", "structure", "fused"]
"""How a pair was matched; ``"fused"`` pairs a slice of a fused projection with a separate one (compare/fused.py)."""

DEFAULT_TOLERANCE = Tolerance()

FULL_DP_CELLS = 250_000
"""Gaps of up to this many candidate pairs are aligned exactly; larger ones within a band around the diagonal."""

BAND_MARGIN = 64

DP_CELL_LIMIT = 1_000_000
"""Above this many pairs in a gap's band, structural alignment goes window by window instead of in one piece."""

_WINDOW = 128

EVIDENCE_CELLS = 4096
"""Children of two paired containers are set against each other by what they compute when there are at most this
many candidate pairs (a block's sublayers, an attention's projections; not a flat model of thousands of leaves)."""


@dataclass(frozen=True, slots=True)
class Match:
    """Call ``a`` of trace A corresponds to call ``b`` of trace B; ``how`` says why."""

    a: CallNode
    b: CallNode
    how: MatchKind


@dataclass(frozen=True, slots=True)
class Alignment:
    """The matches of one step, in A's execution order, and the calls left unmatched on each side."""

    matches: tuple[Match, ...]
    only_a: tuple[CallNode, ...]
    only_b: tuple[CallNode, ...]
    fused: tuple[FusedMatch, ...] = ()


def relative_path(node: CallNode, root: CallNode) -> str:
    """``node``'s path without the model's class name: ``model.layers.0`` (the root itself is ``""``)."""
    if node.path == root.path:
        return ""
    prefix = root.path + "."
    return node.path[len(prefix) :] if node.path.startswith(prefix) else node.path


def returned_order(node: CallNode) -> Iterator[CallNode]:
    """``node`` and the calls below it in the order they returned: children before their parent."""
    for child in node.children:
        yield from returned_order(child)
    yield node


# -- by path and by rule -------------------------------------------------------------------------------------------


def _by_path(
    a_calls: Sequence[CallNode],
    b_root: CallNode,
    b_calls: Sequence[CallNode],
    a_root: CallNode,
    rules: Sequence[RenameRule],
    used: set[RenameRule],
) -> dict[int, tuple[int, MatchKind]]:
    """A's position -> (B's position, how) for every call whose (renamed) path and index exist in B."""
    b_index = {(relative_path(node, b_root), node.index): j for j, node in enumerate(b_calls)}
    found: dict[int, tuple[int, MatchKind]] = {}
    taken: set[int] = set()
    for i, node in enumerate(a_calls):
        path = relative_path(node, a_root)
        renamed = apply_rules(rules, path, used)
        j = b_index.get((renamed, node.index))
        if j is None or j in taken:
            continue
        parent, _, own = path.rpartition(".")
        carried = node.leaf and bool(parent) and renamed == f"{apply_rules(rules, parent, set())}.{own}"
        if (renamed == path or carried) and not _same_interface(node, b_calls[j]):
            continue  # the same name for another computation (transformers' SiLU act_fn, a port's SiluAndMul)
        found[i] = (j, "path" if renamed == path else "rule")
        taken.add(j)
    return found


def _same_interface(a: CallNode, b: CallNode) -> bool:
    """Whether two calls of the same name may be the same computation. A rename rule is the user's word; a name alone
    may be shared by modules that compute other things (vLLM keeps transformers' names on its own code):

    - a leaf given no tensor of a shape the other is given (up to size-1 dims and dim order: transformers' SiLU
      ``act_fn`` given the gate, vLLM's ``SiluAndMul`` given gate and up; a rotary module given the positions alone
      still pairs with transformers', given the hidden states and the positions);
    - a container that returns another number of tensors of its first output's shape (a vLLM layer returns its
      output and the residual apart, transformers' their sum; attention weights beside an attention's output have
      another shape and do not count);
    - a leaf of another type that returns tensors of other shapes (up to size-1 dims and dim order): a norm and a
      convolution both named ``downsample.0`` once a port's list lacks the norm.

    A rule is the user's word for the names it rewrites, not for a name it carries over unchanged (a list's index
    under a renamed list): a leaf whose own name is carried over pairs by name alone. A container's name is its role
    otherwise (an encoder given ids or their embeddings)."""
    if a.leaf and b.leaf:
        given_a = {shape_key(record.shape) for _, record in a.input_tensors()}
        given_b = {shape_key(record.shape) for _, record in b.input_tensors()}
        if given_a and given_b and not given_a & given_b:
            return False
        returned = ({shape_key(record.shape) for _, record in node.output_tensors()} for node in (a, b))
        return a.type_name == b.type_name or _overlap(*returned)
    counts = _outputs_like_first(a), _outputs_like_first(b)
    return 0 in counts or counts[0] == counts[1]  # no outputs (transformers' format, a call that raised): its role


def _overlap(x: set[ShapeKey], y: set[ShapeKey]) -> bool:
    return not x or not y or bool(x & y)


def _outputs_like_first(node: CallNode) -> int:
    """How many output tensors have the shape of the first (up to size-1 dims and dim order)."""
    shapes = [shape_key(record.shape) for _, record in node.output_tensors()]
    return sum(shape == shapes[0] for shape in shapes) if shapes else 0


# -- by structure --------------------------------------------------------------------------------------------------


class _Signature:
    """What structural alignment looks at in one call."""

    __slots__ = (
        "node",
        "key",
        "first_out",
        "out_shapes",
        "n_inputs",
        "probe",
        "in_probe",
        "child_types",
        "size",
        "number",
        "passes",
    )

    def __init__(self, node: CallNode) -> None:
        self.node = node
        inputs = [record for _, record in node.input_tensors()]
        # shapes up to size-1 dims: a port that drops the batch dimension ([T, D] for [1, T, D]) holds the same values
        first_in = shape_key(inputs[0].shape) if inputs else None
        self.key = (node.kind, node.leaf, first_in)
        self.n_inputs = len(inputs)
        # a container's make-up: the kinds of module it calls (a block calls two norms, an attention, an MLP), which
        # tells a block from the attention inside it, or from the list that runs the blocks, when values cannot
        self.child_types = Counter(
            child.type_name for child in node.children if child.kind == "module" and child.type_name
        )  # traces written by transformers name no types: no make-up to compare then
        self.number = numbered(node.path)
        self.in_probe = StatPoint.of(inputs[0]) if inputs else None
        self.size = sum(1 for _ in node.walk()) if not node.leaf else 1
        self.passes = passes_through(node)
        if node.outputs is None:  # a container in transformers' format, or a call that raised: outputs unknown
            self.first_out: TensorRecord | None = None
            self.out_shapes: tuple[ShapeKey, ...] | None = None
        else:
            outputs = [record for _, record in node.output_tensors()]
            self.first_out = outputs[0] if outputs else None
            self.out_shapes = tuple(shape_key(record.shape) for record in outputs)
        # the statistics that tell two candidate pairings apart
        probe = self.first_out if self.first_out is not None else (inputs[0] if inputs else None)
        self.probe = StatPoint.of(probe) if probe is not None else None


class _SamePlace:
    """Whether two calls are called by callers matched to each other (a block's MLP and the port's, once the blocks
    are paired) that departed from each other.

    Where matched callers agree, what their children return agrees too, child for child, when they are the same
    computation: children that share a kind of module but neither their input nor their output are then other
    parts of the code (a parallel block's ``attn + ff`` is not the original's MLP), and only values may pair them.
    Once the callers depart, values tell nothing and the make-up is what is left."""

    def __init__(
        self,
        a_root: CallNode,
        b_root: CallNode,
        pairs: Iterable[tuple[CallNode, CallNode]],
        close: Callable[[StatPoint | None, StatPoint | None], bool],
    ) -> None:
        self.parent_a = {id(child): node for node in a_root.walk() for child in node.children}
        self.parent_b = {id(child): node for node in b_root.walk() for child in node.children}
        self.pairs = {(id(a), id(b)) for a, b in pairs}
        self.close = close

    def __call__(self, a: CallNode, b: CallNode) -> bool:
        parent_a, parent_b = self.parent_a.get(id(a)), self.parent_b.get(id(b))
        if parent_a is None or parent_b is None or (id(parent_a), id(parent_b)) not in self.pairs:
            return False
        return not self.close(_output_probe(parent_a), _output_probe(parent_b))


class _Scorer:
    """How well two calls of the same key pair (0: they cannot), with the tolerance of each pair of dtypes cached."""

    def __init__(self, tolerance: Tolerance, same_place: _SamePlace | None = None) -> None:
        self.tolerance = tolerance
        self.tolerances: dict[tuple[str, str], tuple[float, float]] = {}
        self.same_place = same_place

    def __call__(self, x: _Signature, y: _Signature) -> int:
        if x.out_shapes is not None and y.out_shapes is not None:
            first_x = shape_key(x.first_out.shape) if x.first_out is not None else None
            first_y = shape_key(y.first_out.shape) if y.first_out is not None else None
            if first_x != first_y:
                return 0
        if x.passes != y.passes:
            return 0  # a call that returns what it was given (a dropout, an identity) computes nothing another does
        score = 4
        same_type = _same_type(x, y)
        if same_type:
            score += 4
        if x.out_shapes is not None and x.out_shapes == y.out_shapes:
            score += 1
        if x.n_inputs == y.n_inputs:
            score += 1

        same_output = self.close(x.probe, y.probe)
        if same_output:
            score += 4
        if x.node.leaf and not same_output and self.close(x.in_probe, y.in_probe):
            score += 2  # a norm given the residual sum, not the dropout given the projection, when outputs differ
        if not x.node.leaf and not y.node.leaf:
            # after a divergence no statistic agrees: what the containers are made of, and what they were given
            # (a block and its first sublayer's input differ by a norm), still tell them apart
            shared = sum((x.child_types & y.child_types).values())
            same_input = self.close(x.in_probe, y.in_probe)
            score += min(2, shared) + (2 if same_input else 0)
            if max(x.size, y.size) <= 2 * min(x.size, y.size):
                score += 1  # a block is more like a block than like the stack of all blocks
            unmeasured = x.in_probe is None or y.in_probe is None  # token ids: no statistics to test the input by
            evidence = same_output or same_input or same_type or _same_block(x, y)
            if not evidence and shared and self.same_place is not None:
                evidence = self.same_place(x.node, y.node)  # made of the same kinds, where matched callers call
            if not (evidence or (unmeasured and shared >= 2)):
                return 0  # fitting shapes alone do not make two containers one: models are cut in many ways
        return score

    def close(self, x: StatPoint | None, y: StatPoint | None) -> bool:
        if x is None or y is None:
            return False
        dtypes = (x.dtype, y.dtype)
        if dtypes not in self.tolerances:
            self.tolerances[dtypes] = self.tolerance.for_dtypes(*dtypes)
        return x.close_to(y, *self.tolerances[dtypes])


def _same_type(x: _Signature, y: _Signature) -> bool:
    """Both calls are of the same module type, and not merely by name: two containers that both call modules but
    none of the same kind are other code under one class name (mamba-minimal's ``MambaBlock`` is the mixer inside
    the layer that transformers calls ``MambaBlock``)."""
    if not x.node.type_name or x.node.type_name != y.node.type_name:
        return False
    return not (x.child_types and y.child_types and not x.child_types & y.child_types)


def _same_block(x: _Signature, y: _Signature) -> bool:
    """Both are the same numbered block of a stack (``vit.layers.1`` and ``blocks.1``): after a divergence, when no
    statistic agrees any more, the number is what still pairs them."""
    return x.number is not None and y.number is not None and x.number[1] == y.number[1]


def _bands(n: int, m: int) -> list[tuple[int, int]]:
    """For each x, the ys ``[lo, hi)`` it may pair with: all of them in a small gap; in a large one, a band around
    the diagonal as wide as the difference in length plus a margin (the pairing of a port that adds or drops calls
    stays inside it)."""
    if n * m <= FULL_DP_CELLS:
        return [(0, m)] * n
    width = abs(n - m) + BAND_MARGIN
    return [(max(0, i * m // n - width), min(m, i * m // n + width + 1)) for i in range(n)]


def _candidates(ys: Sequence[_Signature]) -> dict[tuple[object, ...], list[int]]:
    by_key: dict[tuple[object, ...], list[int]] = defaultdict(list)
    for j, y in enumerate(ys):
        by_key[y.key].append(j)
    return by_key


def _scores(
    xs: Sequence[_Signature], ys: Sequence[_Signature], bands: Sequence[tuple[int, int]], score: _Scorer
) -> list[dict[int, int]]:
    """For each x, the ys in its band it can pair with and how well (sparse: most pairs cannot)."""
    by_key = _candidates(ys)
    table = []
    for x, (lo, hi) in zip(xs, bands):
        row = {}
        candidates = by_key.get(x.key, [])
        for j in candidates[bisect.bisect_left(candidates, lo) : bisect.bisect_left(candidates, hi)]:
            value = score(x, ys[j])
            if value:
                row[j] = value
        table.append(row)
    return table


_UNREACHABLE = -(1 << 60)


def _optimal_pairs(table: list[dict[int, int]], m: int, bands: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The order-preserving pairing of the highest total score within the bands; ties pair the earliest calls.

    ``best(i, j)`` is the best score of pairing ``xs[i:]`` with ``ys[j:]``, kept for ``j`` in row i's band."""
    n = len(table)
    rows: list[list[int]] = [[]] * n
    starts = [lo for lo, _ in bands]

    def best(i: int, j: int) -> int:
        if i == n or j == m:
            return 0
        k = j - starts[i]
        return rows[i][k] if 0 <= k < len(rows[i]) else _UNREACHABLE

    for i in range(n - 1, -1, -1):
        lo, hi = bands[i]
        row = [0] * (hi - lo + 1)
        rows[i] = row
        scores = table[i]
        for j in range(min(hi, m - 1), lo - 1, -1):
            value = max(row[j + 1 - lo] if j + 1 <= hi else best(i, j + 1), best(i + 1, j))
            score = scores.get(j)
            if score is not None:
                value = max(value, score + best(i + 1, j + 1))
            row[j - lo] = value
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        score = table[i].get(j)
        if score is not None and best(i, j) == score + best(i + 1, j + 1):
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif best(i, j) == best(i + 1, j):
            i += 1
        else:
            j += 1
    return pairs


def _windowed_pairs(xs: Sequence[_Signature], ys: Sequence[_Signature], score: _Scorer) -> list[tuple[int, int]]:
    """For gaps too large to align in one piece: align a window of xs with the ys in proportion (plus a margin),
    keep the pairs of the window's first half, and slide on from the last pair kept."""
    n, m = len(xs), len(ys)
    pairs: list[tuple[int, int]] = []
    i0 = j0 = 0
    while i0 < n and j0 < m:
        i1 = min(n, i0 + _WINDOW)
        j1 = min(m, j0 + -(-(i1 - i0) * m // n) + BAND_MARGIN)
        block_x, block_y = xs[i0:i1], ys[j0:j1]
        bands = [(0, len(block_y))] * len(block_x)
        found = _optimal_pairs(_scores(block_x, block_y, bands, score), len(block_y), bands)
        if i1 < n:
            found = [(i, j) for i, j in found if i < _WINDOW // 2]
        pairs += [(i0 + i, j0 + j) for i, j in found]
        if i1 == n:
            break
        i0, j0 = (pairs[-1][0] + 1, pairs[-1][1] + 1) if found else (i0 + _WINDOW // 2, j0)
    return pairs


def _by_structure(
    xs: Sequence[_Signature], ys: Sequence[_Signature], tolerance: Tolerance, same_place: _SamePlace | None = None
) -> list[tuple[int, int]]:
    if not xs or not ys:
        return []
    score = _Scorer(tolerance, same_place)
    bands = _bands(len(xs), len(ys))
    if sum(hi - lo for lo, hi in bands) > DP_CELL_LIMIT:
        return _windowed_pairs(xs, ys, score)
    return _optimal_pairs(_scores(xs, ys, bands, score), len(ys), bands)


def _monotone_chain(anchors: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of anchors (sorted by A position) whose B positions increase too."""
    tails: list[int] = []
    tail_at: list[int] = []
    parent = [-1] * len(anchors)
    for k, (_, j) in enumerate(anchors):
        pos = bisect.bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_at.append(k)
        else:
            tails[pos] = j
            tail_at[pos] = k
        parent[k] = tail_at[pos - 1] if pos else -1
    chain, k = [], tail_at[-1] if tail_at else -1
    while k >= 0:
        chain.append(anchors[k])
        k = parent[k]
    return chain[::-1]


def _aligns(node: CallNode, containers_only: bool) -> bool:
    """Whether structure may pair ``node``: module calls only (op records pair by path or not at all: two
    implementations' ops do not correspond one to one, and their order would pull the modules' pairing along)."""
    return node.kind == "module" and not (containers_only and node.leaf)


def _structure_pass(
    found: dict[int, tuple[int, MatchKind]],
    a_calls: Sequence[CallNode],
    b_calls: Sequence[CallNode],
    tolerance: Tolerance,
    containers_only: bool,
    reserved: tuple[set[int], set[int]] = (set(), set()),
    same_place: _SamePlace | None = None,
) -> None:
    """Align the unmatched calls (or only the unmatched containers) in each gap between matched calls; ``reserved``
    calls (parts of fused projections) take no part."""
    anchors = sorted((i, j) for i, (j, _) in found.items())
    chain = _monotone_chain(anchors) + [(len(a_calls), len(b_calls))]
    matched_b = {j for j, _ in found.values()} | reserved[1]
    skip_a = reserved[0]
    for (i0, j0), (i1, j1) in zip(chain, chain[1:]):
        gap_a = [
            i for i in range(i0 + 1, i1) if i not in found and i not in skip_a and _aligns(a_calls[i], containers_only)
        ]
        gap_b = [j for j in range(j0 + 1, j1) if j not in matched_b and _aligns(b_calls[j], containers_only)]
        xs = [_Signature(a_calls[i]) for i in gap_a]
        ys = [_Signature(b_calls[j]) for j in gap_b]
        for x, y in _by_structure(xs, ys, tolerance, same_place):
            found[gap_a[x]] = (gap_b[y], "structure")


def _same_computation(x: _Signature, y: _Signature, score: _Scorer) -> bool:
    """Two calls that take tensors of the same shapes, were given the same input (when both inputs are measured) and
    returned the same first output, by its statistics (an attention may return its weights too, a port's not)."""
    return (
        x.key == y.key
        and x.first_out is not None
        and y.first_out is not None
        and shape_key(x.first_out.shape) == shape_key(y.first_out.shape)
        and score.close(x.probe, y.probe)
        and (x.in_probe is None or y.in_probe is None or score.close(x.in_probe, y.in_probe))
    )


def _evidence_pass(
    found: dict[int, tuple[int, MatchKind]],
    a_calls: Sequence[CallNode],
    b_calls: Sequence[CallNode],
    positions: tuple[dict[int, int], dict[int, int]],
    tolerance: Tolerance,
    orders: dict[tuple[object, ...], frozenset[tuple[int, int]]],
) -> None:
    """Pair the children of two paired containers by what they compute, in whatever order they run. A port may run
    independent calls in another order (v, k, q; a parallel residual's MLP before its attention), which no
    order-preserving alignment pairs.

    Inside containers that agree, a child pairs with the only child of the other that was given the same input and
    returned the same output. Inside a container that departs, values cannot tell a port that runs its calls in
    another order from one that swapped two projections' weights (each computes what the other's counterpart
    computes), so the order decides, unless:

    - a container of the same code (the same module of another block) agreed: its children's pairing, position by
      position, is the port's order, learned where nothing departed (a swap in one block is still blamed at the
      projection);
    - or what the children compute pairs more of them than any order-preserving pairing can: weights are swapped
      only between projections of the same shape, so a pairing the shapes force is a re-ordering (grouped-query
      attention's v, k, q against q, k, v). The order so proven then holds in the later blocks, where nothing
      agrees any more;
    - and a child given what no sibling was given pairs with the only child of the other given it too
      (:func:`_same_input_pairs`).

    ``orders`` keeps the port's order of each container's calls, by :func:`_same_code`, from one call to the next."""
    score = _Scorer(tolerance)
    position_a, position_b = positions
    matched_b = {j for j, _ in found.values()}
    departing: list[tuple[CallNode, CallNode, list[int], list[int]]] = []
    for i, (j, _) in list(found.items()):
        parent_a, parent_b = a_calls[i], b_calls[j]
        if parent_a.leaf or parent_b.leaf or parent_a.outputs is None or parent_b.outputs is None:
            continue
        children_a = [position_a[id(child)] for child in parent_a.children if _aligns(child, containers_only=False)]
        children_b = [position_b[id(child)] for child in parent_b.children if _aligns(child, containers_only=False)]
        xs = [k for k in children_a if k not in found]
        ys = [k for k in children_b if k not in matched_b]
        if len(xs) * len(ys) > EVIDENCE_CELLS:
            continue
        if not score.close(_output_probe(parent_a), _output_probe(parent_b)):
            departing.append((parent_a, parent_b, children_a, children_b))
            continue
        for k, other in _evidence_pairs(xs, ys, a_calls, b_calls, score):
            found[k] = (other, "structure")
            matched_b.add(other)
        order = frozenset(_child_order(children_a, children_b, found))
        key = _same_code(parent_a, parent_b, [a_calls[k] for k in children_a], [b_calls[k] for k in children_b])
        orders[key] = orders[key] & order if key in orders else order
    departing.sort(key=lambda group: position_a[id(group[0])])
    for parent_a, parent_b, children_a, children_b in departing:
        xs = [k for k in children_a if k not in found]
        ys = [k for k in children_b if k not in matched_b]
        key = _same_code(parent_a, parent_b, [a_calls[k] for k in children_a], [b_calls[k] for k in children_b])
        learned = orders.get(key)
        if learned is not None:
            pairs = [
                (children_a[p], children_b[q])
                for p, q in sorted(learned)
                if children_a[p] in xs
                and children_b[q] in ys
                and _fit(_Signature(a_calls[children_a[p]]), _Signature(b_calls[children_b[q]]))
            ]
        else:
            pairs = _evidence_pairs(xs, ys, a_calls, b_calls, score)
            if not _order_cannot_pair(pairs, a_calls, b_calls, tolerance):
                pairs = []
        for k, other in pairs:
            found[k] = (other, "structure")
            matched_b.add(other)
        xs = [k for k in xs if k not in found]
        ys = [k for k in ys if k not in matched_b]
        for k, other in _same_input_pairs(xs, ys, a_calls, b_calls, score):
            found[k] = (other, "structure")
            matched_b.add(other)
        if pairs and learned is None:  # the port's order, proven here, holds in its later blocks, whose inputs differ
            orders[key] = frozenset(_child_order(children_a, children_b, found))


def _pair_as_agreeing_blocks(
    found: dict[int, tuple[int, MatchKind]],
    a_calls: Sequence[CallNode],
    b_calls: Sequence[CallNode],
    b_root: CallNode,
    tolerance: Tolerance,
) -> None:
    """Re-pair a container of a numbered block that departs with the port's container of the code it pairs with in
    the blocks that agree, when that container is its partner's caller or callee and still unpaired.

    Where a port wraps its block (``Residual(fn)`` adds the input to what ``fn`` returns), the original's layer
    matches the wrapper by values in every block that agrees; once values depart, the wrapper and what it wraps are
    equally plausible by shape and input, and make-up may pick the wrapped block, whose output lacks the residual:
    a fault in the wrapper's own code was then blamed on the block. Each block is the same code on both sides, so
    it pairs the same way in all of them."""
    score = _Scorer(tolerance)
    learned: dict[str, set[tuple[str, str]]] = {}
    departing: list[tuple[int, int, str, tuple[str, str]]] = []
    for i, (j, _) in found.items():
        a, b = a_calls[i], b_calls[j]
        code_a = without_block_number(a.path)
        if a.leaf or b.leaf or a.kind != "module" or code_a == a.path:
            continue  # a leaf, or a call outside numbered blocks: nothing to learn from other blocks
        code_b = (without_block_number(b.path), b.type_name)
        if score.close(_output_probe(a), _output_probe(b)):
            learned.setdefault(code_a, set()).add(code_b)
        else:
            departing.append((i, j, code_a, code_b))
    if not departing or not learned:
        return
    parent = {id(child): node for node in b_root.walk() for child in node.children}
    position_b = {id(node): j for j, node in enumerate(b_calls)}
    matched_b = {j for j, _ in found.values()}
    for i, j, code_a, code_b in departing:
        codes = learned.get(code_a, set())
        if len(codes) != 1 or code_b in codes:
            continue
        (wanted,) = codes
        nearest = [*_ancestors(b_calls[j], parent), *_descendants(b_calls[j])]
        for node in nearest:
            k = position_b[id(node)]
            if k not in matched_b and (without_block_number(node.path), node.type_name) == wanted:
                found[i] = (k, "structure")
                matched_b.discard(j)
                matched_b.add(k)
                break


def _ancestors(node: CallNode, parent: dict[int, CallNode]) -> list[CallNode]:
    found, above = [], parent.get(id(node))
    while above is not None:
        found.append(above)
        above = parent.get(id(above))
    return found


def _descendants(node: CallNode) -> list[CallNode]:
    """The calls inside ``node``, nearest first (breadth first)."""
    found, level = [], list(node.children)
    while level:
        found += level
        level = [child for call in level for child in call.children]
    return found


def _same_input_pairs(
    xs: Sequence[int], ys: Sequence[int], a_calls: Sequence[CallNode], b_calls: Sequence[CallNode], score: _Scorer
) -> list[tuple[int, int]]:
    """Pairs of calls of the same kind and shapes, each the only one of its side given what the other was given:
    inside a container that departs, the call that departs (a parallel branch's attention run after the MLP) is
    still the one given the original's input. Calls given the same input as a sibling (q, k and v) pair by order."""
    signatures_a = [_Signature(a_calls[k]) for k in xs]
    signatures_b = [_Signature(b_calls[k]) for k in ys]

    def alike(x: _Signature, y: _Signature) -> bool:
        return (
            x.key == y.key and x.in_probe is not None and y.in_probe is not None and score.close(x.in_probe, y.in_probe)
        )

    pairs = []
    for i, x in enumerate(signatures_a):
        fits = [j for j, y in enumerate(signatures_b) if alike(x, y)]
        if len(fits) != 1:
            continue
        y = signatures_b[fits[0]]
        if sum(alike(other, y) for other in signatures_a) == 1 and _fit(x, y):
            pairs.append((xs[i], ys[fits[0]]))
    return pairs


def _order_cannot_pair(
    pairs: Sequence[tuple[int, int]], a_calls: Sequence[CallNode], b_calls: Sequence[CallNode], tolerance: Tolerance
) -> bool:
    """Whether no order-preserving pairing of the calls in ``pairs`` pairs them all: the shapes force another order."""
    if len(pairs) < 2:
        return False
    xs = sorted(k for k, _ in pairs)
    ys = sorted(other for _, other in pairs)
    ordered = _by_structure([_Signature(a_calls[k]) for k in xs], [_Signature(b_calls[k]) for k in ys], tolerance)
    return len(ordered) < len(pairs)


def _evidence_pairs(
    xs: Sequence[int], ys: Sequence[int], a_calls: Sequence[CallNode], b_calls: Sequence[CallNode], score: _Scorer
) -> list[tuple[int, int]]:
    """Pairs of ``xs`` and ``ys`` that were given the same input and returned the same output, where neither fits
    any other."""
    if not xs or not ys:
        return []
    signatures_b = {k: _Signature(b_calls[k]) for k in ys}
    fits = {}
    for k in xs:
        x = _Signature(a_calls[k])
        fits[k] = [other for other in ys if _same_computation(x, signatures_b[other], score)]
    takers = Counter(other for fitting in fits.values() for other in fitting)
    return [(k, fitting[0]) for k, fitting in fits.items() if len(fitting) == 1 and takers[fitting[0]] == 1]


def _child_order(
    children_a: Sequence[int], children_b: Sequence[int], found: dict[int, tuple[int, MatchKind]]
) -> Iterator[tuple[int, int]]:
    """(position among A's children, position among B's) of every pair of children of two paired containers."""
    place_b = {k: q for q, k in enumerate(children_b)}
    for p, k in enumerate(children_a):
        pair = found.get(k)
        if pair is not None and pair[0] in place_b:
            yield p, place_b[pair[0]]


def _same_code(
    a: CallNode, b: CallNode, children_a: Sequence[CallNode], children_b: Sequence[CallNode]
) -> tuple[object, ...]:
    """What two paired containers share with the same pair of modules in another block: their paths with block
    numbers left out, and the kinds of module they call, in order (a hybrid stack's attention layers and its
    state-space layers share a path but not their code)."""
    return (
        without_block_number(a.path),
        without_block_number(b.path),
        tuple(child.type_name for child in children_a),
        tuple(child.type_name for child in children_b),
    )


_BLOCK_NUMBER = re.compile(r"\.\d+(?=\.|$)")


def without_block_number(path: str) -> str:
    """``path`` with every numeric segment left out (``model.layers.#.mlp``, ``experts.#``): the same code in every
    block."""
    return _BLOCK_NUMBER.sub(".#", path)


def _fit(x: _Signature, y: _Signature) -> bool:
    """Two calls that could be one: the same kind and the same input and output shapes."""
    shapes_x = shape_key(x.first_out.shape) if x.first_out is not None else None
    shapes_y = shape_key(y.first_out.shape) if y.first_out is not None else None
    return x.key == y.key and shapes_x == shapes_y


def _output_probe(node: CallNode) -> StatPoint | None:
    first = next((record for _, record in node.output_tensors()), None)
    return StatPoint.of(first) if first is not None else None


def passes_through(node: CallNode) -> bool:
    """A call that returns what it was given (a dropout in eval mode, an identity): where it sits says nothing."""
    if not node.leaf:
        return False
    given = next((record for _, record in node.input_tensors()), None)
    returned = next((record for _, record in node.output_tensors()), None)
    return (
        given is not None
        and returned is not None
        and given.shape == returned.shape
        and given.stats is not None
        and given.stats == returned.stats
    )


def _drop_crossed_boundaries(
    found: dict[int, tuple[int, MatchKind]],
    a_calls: Sequence[CallNode],
    b_calls: Sequence[CallNode],
    fused: Sequence[FusedMatch],
    moved: Iterable[int] = (),
) -> bool:
    """Unpair containers that structure paired but that cut the model elsewhere (True when any was): a call
    inside one whose counterpart lies outside the other (transformers' ``BertSelfAttention`` ends before the output
    projection that a port's attention holds). Their outputs are different quantities, so neither agreement nor
    departure between them means anything; their contents stay paired. The leaves of A in ``moved`` were paired
    because they are called elsewhere (:func:`_moved_leaves`: a lookup whose result the containers are given), and
    cross nothing. ``a_calls`` and ``b_calls`` are in pre-order (``walk``)."""
    moved = set(moved)
    end_a, end_b = _subtree_ends(a_calls), _subtree_ends(b_calls)
    position_a = {id(node): i for i, node in enumerate(a_calls)}
    position_b = {id(node): j for j, node in enumerate(b_calls)}
    counterpart_b: dict[int, list[int]] = defaultdict(list)  # position in A -> positions of its counterparts in B
    counterpart_a: dict[int, list[int]] = defaultdict(list)
    for i, (j, _) in found.items():
        if i in moved:
            continue
        if not (passes_through(a_calls[i]) or passes_through(b_calls[j])):  # a no-op may sit on either side
            counterpart_b[i].append(j)
            counterpart_a[j].append(i)
    for group in fused:
        for part in group.parts:
            a_node, b_node = (group.fused, part) if group.fused_in_a else (part, group.fused)
            i, j = position_a[id(a_node)], position_b[id(b_node)]
            counterpart_b[i].append(j)
            counterpart_a[j].append(i)
    dropped = False
    for i, (j, how) in list(found.items()):
        if how != "structure" or a_calls[i].leaf or b_calls[j].leaf:
            continue
        crossed = any(
            not j < other <= end_b[j] for inner in range(i + 1, end_a[i] + 1) for other in counterpart_b.get(inner, ())
        ) or any(
            not i < other <= end_a[i] for inner in range(j + 1, end_b[j] + 1) for other in counterpart_a.get(inner, ())
        )
        if crossed:
            del found[i]
            dropped = True
            counterpart_b[i] = [other for other in counterpart_b[i] if other != j]
            counterpart_a[j] = [other for other in counterpart_a[j] if other != i]
    return dropped


def _moved_leaves(
    found: dict[int, tuple[int, MatchKind]],
    a_calls: Sequence[CallNode],
    b_calls: Sequence[CallNode],
    reserved: tuple[set[int], set[int]],
) -> set[int]:
    """Pair leaves that one implementation calls in another container than the other (T5's relative position bias,
    computed in the first block's attention, and a port's, computed once in the stack): no order-preserving pass
    reaches them, since each lies in a gap the other's does not. Inside the innermost pair of matched containers
    that holds both, a leaf of A pairs with a leaf of B of the same module type, input and output shapes when each
    is the only unmatched one of its kind there. Calls that return what they were given (dropouts) never pair so:
    where they sit says nothing. Returns the positions in A of the leaves paired. ``a_calls`` and ``b_calls`` are in
    pre-order (``walk``)."""
    end_a, end_b = _subtree_ends(a_calls), _subtree_ends(b_calls)
    matched_b = {j for j, _ in found.values()}

    def loose(calls: Sequence[CallNode], taken: Iterable[int], skip: set[int]) -> dict[tuple[object, ...], list[int]]:
        """The unmatched leaves of one side by kind (module type, input and output shapes), in pre-order."""
        by_kind: dict[tuple[object, ...], list[int]] = defaultdict(list)
        taken = set(taken) | skip
        for k, node in enumerate(calls):
            if node.kind == "module" and node.leaf and node.type_name and k not in taken and not passes_through(node):
                signature = _Signature(node)
                by_kind[(node.type_name, signature.key, signature.out_shapes)].append(k)
        return by_kind

    loose_a, loose_b = loose(a_calls, found, reserved[0]), loose(b_calls, matched_b, reserved[1])
    paired: set[int] = set()
    if not loose_a.keys() & loose_b.keys():
        return paired
    kind_a = {k: key for key, positions in loose_a.items() for k in positions}
    stack: list[int] = []  # A's containers open at each position of the pre-order walk
    for i, node in enumerate(a_calls):
        while stack and end_a[stack[-1]] < i:
            stack.pop()
        if not node.leaf:
            stack.append(i)
            continue
        want = kind_a.get(i)
        if want is None or want not in loose_b:
            continue
        for scope in reversed(stack):  # the innermost pair of matched containers that holds a candidate in B
            if scope not in found or b_calls[found[scope][0]].leaf:
                continue
            lo_b = found[scope][0]
            same_b = [k for k in loose_b[want] if lo_b < k <= end_b[lo_b] and k not in matched_b]
            if not same_b:
                continue
            same_a = [k for k in loose_a[want] if scope < k <= end_a[scope] and k not in found]
            if same_a == [i] and len(same_b) == 1:
                found[i] = (same_b[0], "structure")
                matched_b.add(same_b[0])
                paired.add(i)
            break
    return paired


def _reshaping_leaves(
    found: dict[int, tuple[int, MatchKind]],
    a_calls: Sequence[CallNode],
    b_calls: Sequence[CallNode],
    reserved: tuple[set[int], set[int]],
    tolerance: Tolerance,
) -> set[int]:
    """Pair leaves that return another shape than their counterpart (a convolution given another padding): no other
    pass pairs calls whose outputs differ in shape, and the calls after it then differ in shape too, so the departure
    would be blamed far downstream. Inside the innermost pair of matched containers that holds it, an unmatched leaf
    of A pairs with an unmatched leaf of B of the same module type given the same input (its shape and statistics)
    whose output has another shape, when each is the only such leaf there and the scope's outputs depart (where they
    agree, the other shape is undone inside it: nanoGPT's lm_head over a padded vocabulary, its logits cut). Returns
    the positions in A paired.
    ``a_calls`` and ``b_calls`` are in pre-order (``walk``)."""
    end_a, end_b = _subtree_ends(a_calls), _subtree_ends(b_calls)
    matched_b = {j for j, _ in found.values()}
    score = _Scorer(tolerance)

    def loose(calls: Sequence[CallNode], taken: Iterable[int], skip: set[int]) -> list[tuple[int, _Signature]]:
        taken = set(taken) | skip
        return [
            (k, _Signature(node))
            for k, node in enumerate(calls)
            if node.kind == "module" and node.leaf and node.type_name and k not in taken and node.outputs is not None
            if not passes_through(node)
        ]

    loose_a, loose_b = loose(a_calls, found, reserved[0]), loose(b_calls, matched_b, reserved[1])
    paired: set[int] = set()
    if not loose_a or not loose_b:
        return paired

    def alike(x: _Signature, y: _Signature) -> bool:
        shapes_x = shape_key(x.first_out.shape) if x.first_out is not None else None
        shapes_y = shape_key(y.first_out.shape) if y.first_out is not None else None
        return (
            x.node.type_name == y.node.type_name
            and x.key == y.key
            and shapes_x != shapes_y
            and score.close(x.in_probe, y.in_probe)
        )

    opened: list[int] = []  # A's containers open at each position of the pre-order walk
    candidates = dict(loose_a)
    for i, node in enumerate(a_calls):
        while opened and end_a[opened[-1]] < i:
            opened.pop()
        if not node.leaf:
            opened.append(i)
            continue
        mine = candidates.get(i)
        if mine is None:
            continue
        for scope in reversed(opened):  # the innermost pair of matched containers
            if scope not in found or b_calls[found[scope][0]].leaf:
                continue
            lo_b = found[scope][0]
            if score.close(_output_probe(a_calls[scope]), _output_probe(b_calls[lo_b])):
                break  # the scope agrees: the other shape is the port's own layout (a vocabulary padded, then cut)
            theirs = _two(
                k_y for k_y in _within(loose_b, lo_b, end_b[lo_b]) if k_y[0] not in matched_b and alike(mine, k_y[1])
            )
            if len(theirs) == 1:
                rivals = _two(
                    k for k, x in _within(loose_a, scope, end_a[scope]) if k not in found and alike(x, theirs[0][1])
                )
                if rivals == [i]:
                    found[i] = (theirs[0][0], "structure")
                    matched_b.add(theirs[0][0])
                    paired.add(i)
            break
    return paired


def _within(loose: Sequence[tuple[int, _Signature]], lo: int, hi: int) -> Sequence[tuple[int, _Signature]]:
    """The entries of ``loose`` (by position, ascending) inside the container at ``lo`` that ends at ``hi``."""
    return loose[bisect.bisect_right(loose, lo, key=_position) : bisect.bisect_right(loose, hi, key=_position)]


def _position(entry: tuple[int, _Signature]) -> int:
    return entry[0]


def _two(found: Iterable[_T]) -> list[_T]:
    """The first two of ``found``: whether there is exactly one needs no more (a scan stops there)."""
    return list(itertools.islice(found, 2))


def _subtree_ends(calls: Sequence[CallNode]) -> list[int]:
    """For each call of a pre-order walk, the position of the last call inside it (itself for a leaf)."""
    ends = list(range(len(calls)))
    stack: list[tuple[int, int]] = []  # (position, children left)
    for position, node in enumerate(calls):
        while stack and stack[-1][1] == 0:
            start, _ = stack.pop()
            ends[start] = position - 1
        if stack:
            stack[-1] = (stack[-1][0], stack[-1][1] - 1)
        if node.children:
            stack.append((position, len(node.children)))
    while stack:
        start, _ = stack.pop()
        ends[start] = len(calls) - 1
    return ends


def align_calls(
    a_root: CallNode,
    b_root: CallNode,
    *,
    rules: Sequence[RenameRule] = (),
    mode: AlignMode = "auto",
    tolerance: Tolerance = DEFAULT_TOLERANCE,
    used_rules: set[RenameRule] | None = None,
) -> Alignment:
    """Match the calls of two steps (see the module docstring); the roots always match each other.

    Structure aligns containers first and then, between the containers matched, everything else: the gaps stay
    small, so a model of thousands of calls aligns in about a second (benchmarks/compare_alignment.py)."""
    a_calls, b_calls = list(a_root.walk()), list(b_root.walk())
    used = used_rules if used_rules is not None else set()
    if mode == "structure":
        found: dict[int, tuple[int, MatchKind]] = {0: (0, "path")}
    else:
        found = _by_path(a_calls, b_root, b_calls, a_root, rules, used)
        found[0] = (0, "path")
    if mode != "path":
        positions = ({id(node): i for i, node in enumerate(a_calls)}, {id(node): j for j, node in enumerate(b_calls)})
        _structure_pass(found, a_calls, b_calls, tolerance, containers_only=True)
        orders: dict[tuple[object, ...], frozenset[tuple[int, int]]] = {}
        _evidence_pass(found, a_calls, b_calls, positions, tolerance, orders)
        # again, now that the outer containers are paired: the ones inside them pair by what they are made of
        pairs = [(a_calls[i], b_calls[j]) for i, (j, _) in found.items()]
        same_place = _SamePlace(a_root, b_root, pairs, _Scorer(tolerance).close)
        _structure_pass(found, a_calls, b_calls, tolerance, containers_only=True, same_place=same_place)
        _evidence_pass(found, a_calls, b_calls, positions, tolerance, orders)
        _pair_as_agreeing_blocks(found, a_calls, b_calls, b_root, tolerance)
    # fused projections before the leaves are aligned by structure: a wqkv's parts would otherwise pair with
    # whatever leaf has their shapes (GPT-2's c_proj with a port's k_proj)
    # (the data flow between them is read through a provisional pairing of the leaves: after a divergence, the
    # parts' inputs no longer agree with the fused call's, but they still come from calls paired with each other)
    taken_b = {j for j, _ in found.values()}

    def provisional() -> list[tuple[CallNode, CallNode]]:
        paired = dict(found)
        if mode != "path":
            _structure_pass(paired, a_calls, b_calls, tolerance, containers_only=False)
        return [(a_calls[i], b_calls[j]) for i, (j, _) in paired.items()]

    fused = find_fused(
        a_root,
        b_root,
        [(a_calls[i], b_calls[j]) for i, (j, _) in found.items()],
        [node for i, node in enumerate(a_calls) if i not in found],
        [node for j, node in enumerate(b_calls) if j not in taken_b],
        tolerance,
        flow=provisional,
    )
    in_fused = {id(node) for group in fused for node in (group.fused, *group.parts)}
    reserved = (
        {i for i, node in enumerate(a_calls) if id(node) in in_fused},
        {j for j, node in enumerate(b_calls) if id(node) in in_fused},
    )
    if mode != "path":
        _structure_pass(found, a_calls, b_calls, tolerance, containers_only=False, reserved=reserved)
    moved = _moved_leaves(found, a_calls, b_calls, reserved) if mode != "path" else set()
    if mode != "path":
        moved |= _reshaping_leaves(found, a_calls, b_calls, reserved, tolerance)
    if _drop_crossed_boundaries(found, a_calls, b_calls, fused, moved) and mode != "path":
        # the unpaired containers no longer cut the gaps: what they kept apart may pair now (then check again)
        _structure_pass(found, a_calls, b_calls, tolerance, containers_only=False, reserved=reserved)
        _drop_crossed_boundaries(found, a_calls, b_calls, fused, moved)
    matches = tuple(Match(a_calls[i], b_calls[j], how) for i, (j, how) in sorted(found.items()))
    taken_b = {j for j, _ in found.values()}
    return Alignment(
        matches=matches,
        only_a=tuple(node for i, node in enumerate(a_calls) if i not in found and i not in reserved[0]),
        only_b=tuple(node for j, node in enumerate(b_calls) if j not in taken_b and j not in reserved[1]),
        fused=tuple(fused),
    )
