"""The result of comparing two traces: matched calls in the order they returned, unmatched calls, the first
divergence, and a JSON form of it all.

The first divergence is the culprit rule of porting work: the earliest call, in the order calls *returned*, whose
output diverges while its inputs still agree. Calls return before the calls that contain them, so the innermost
module at fault is named rather than the layer around it; later calls diverge because their inputs already do.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from graphtrace.compare.align import passes_through, returned_order, without_block_number
from graphtrace.compare.measure import STAT_NAMES, TensorDiff, Tolerance
from graphtrace.compare.pairs import CallDiff
from graphtrace.model import CallNode, TensorRecord, Trace, services

__all__ = ["REPORT_FORMAT", "Comparison", "Divergence", "Unmatched", "first_divergence", "locate_divergence"]

REPORT_FORMAT = "graphtrace-diff"
REPORT_VERSION = 2


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A call of one trace with no counterpart in the other."""

    step: int
    call: CallNode


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where trace B first departs from trace A: the call to blame and why.

    ``call`` is the module to look at. ``inside`` is True when the departure lies in that module's own code
    (between the calls it makes, or after its last one): ``before`` is then the first call inside it whose inputs
    already differ, if any. ``explanation`` says it in words; ``op_locus`` is for a finer location inside the
    module (an op of the port), when one was found. ``parts`` are the pairs of a fused call of A with B's separate
    projections when statistics cannot tell which of them departs (``call`` is then B's module that calls them).
    """

    call: CallDiff
    inside: bool
    explanation: str
    before: CallDiff | None = None
    op_locus: object | None = None
    parts: tuple[CallDiff, ...] = ()
    unchecked: tuple[CallNode, ...] = ()
    """For a departure in a module's own code: the modules of B it called before the departure that have no
    counterpart in A (a rotary module where the original computes its table inline), so their outputs were compared
    with nothing: the departure may lie in them as well."""


def locate_divergence(calls: tuple[CallDiff, ...], steps: Sequence[CallNode]) -> Divergence | None:
    """The culprit rule, walked over A's call tree in execution order. The first of these events names it:

    - a matched call returns an output that diverges while its inputs agree: that call (its own code, when every
      call inside it agreed);
    - a matched call is entered with inputs that already diverge while its nearest matched ancestor's inputs
      agreed and every call before it agreed: the divergence arose in the ancestor's own code, before this call
      ("inside layers.0.attention, before wo");
    - a structure-matched call of B is a module B also called where A called another one (a port calling the
      wrong norm): the caller that picked it.

    Op records are not evidence here (they are aligned inside a named module, by the op-level locator). When the
    outermost calls already disagree on their inputs (the traces were given different inputs), the first
    diverging call is named, as before.
    """
    module_calls: dict[int, CallDiff] = {}
    fused_parts: dict[int, list[CallDiff]] = {}  # A's fused calls -> their pairs with B's parts
    for call in calls:
        if call.how == "fused":
            fused_parts.setdefault(id(call.a), []).append(call)
    for call in calls:  # a fused call of A is paired once per part of B: the first part that diverges speaks for it
        if call.a.kind != "op":
            kept = module_calls.setdefault(id(call.a), call)
            if kept.status != "diverged" and call.status == "diverged":
                module_calls[id(call.a)] = call
    b_tree = _BTree(calls, steps)
    b_counterparts: dict[str, set[str]] = {}
    for call in module_calls.values():
        b_counterparts.setdefault(call.b.path, set()).add(call.a.path)

    b_calls = {id(call.b): call for call in module_calls.values()}
    fed_well = _fed_by_agreeing_calls(calls)

    def visit(node: CallNode, outer: CallDiff | None) -> Divergence | None:
        here = module_calls.get(id(node))
        if here is not None and _inputs_depart(here, fed_well):
            if outer is None:
                return None  # different inputs to the whole model: not a porting question
            outer = _b_caller(outer, here, b_tree, b_calls)
            before = _short_name(here)
            changed = next((d for d in here.inputs if d.status == "diverged"), None)
            detail = f"{changed.name_b}: {changed.reason}" if changed is not None else here.reason
            detail = (_given_another_shape(here) or detail) if changed is None else detail
            holder = b_tree.holder(outer, here) or b_tree.entered_well(outer, here)
            if holder is not None:  # a module of B without counterpart in A holds the departure: name it
                culprit = dataclasses.replace(outer, b=holder, inputs=(), outputs=(), only_in_a=(), only_in_b=())
                where = f"{holder.path} (B's own module, within {_short_name(outer)})"
                return Divergence(
                    culprit,
                    True,
                    f"inside {where}, before {before}: {before}'s inputs already differ ({detail})",
                    before=here,
                    unchecked=b_tree.unchecked(holder, here.b),
                )
            return Divergence(
                outer,
                True,
                f"inside {_short_name(outer)}, before {before}: {before}'s inputs already differ ({detail})",
                before=here,
                unchecked=b_tree.unchecked(outer.b, here.b),
            )
        inner = here if here is not None else outer
        for child in node.children:
            found = visit(child, inner)
            if found is not None:
                return found
        if here is None or here.status != "diverged":
            return None
        if outer is not None and here.how == "structure" and len(b_counterparts.get(here.b.path, ())) > 1:
            return Divergence(
                outer,
                True,
                f"inside {_short_name(outer)}: B calls {here.b.path} where A calls {here.a.path} "
                f"(B's module also stands for {', '.join(sorted(b_counterparts[here.b.path] - {here.a.path}))})",
                before=here,
            )
        withheld = _withheld(here, steps, b_tree) if outer is not None else ()
        if withheld and outer is not None:
            caller = _b_caller(outer, here, b_tree, b_calls)
            given = ", ".join(name.removeprefix("inputs") for name in withheld)
            return Divergence(
                caller,
                True,
                f"inside {_short_name(caller)}: {_short_name(here)} is not given {given}, which the same module of "
                f"B's other blocks is given, while A's is given the same inputs in every block ({here.reason})",
                before=here,
            )
        parts = fused_parts.get(id(node), ())
        if len(parts) > 1 and not any(d.basis == "values" for d in here.outputs):
            return _fused_by_statistics(here, parts, b_tree)
        own = any(id(child) in module_calls for child in node.children)
        if own:
            why = "its inputs and every call inside it agree, its output does not: the departure is in its own code"
        else:
            why = "its inputs agree, its output does not"
        unchecked = b_tree.unchecked(here.b, None) if own else ()
        return Divergence(here, own, f"{_short_name(here)}: {why} ({here.reason})", unchecked=unchecked)

    for root in steps:
        found = visit(root, None)
        if found is not None:
            return found
    legacy = _first_diverging(calls)
    if legacy is None:
        return None
    why = "its inputs agree, its output does not" if legacy.inputs_agree else "its inputs already differ"
    return Divergence(legacy, False, f"{_short_name(legacy)}: {why} ({legacy.reason})")


def _inputs_depart(call: CallDiff, fed_well: Callable[[CallDiff], bool] = lambda call: False) -> bool:
    """Whether ``call`` was given what its counterpart was not. When one call takes tensors the other lacks (vLLM's
    norm is given the attention output and the residual to add, transformers' their sum), differing inputs are other
    quantities, not a departure, if its output agrees or if every call that produced B's inputs agrees
    (``fed_well``): the call is then judged by its output. So are integer inputs that differ under an equal output
    (transformers gives OPT's position embedding the attention mask, a port the positions). Otherwise differing
    inputs are a departure, which a call's output may hide within tolerance (a projection). So is a tensor of
    another shape given at the same place, when the output's shape differs too (see :func:`_given_another_shape`)."""
    if call.inputs_agree:
        return _given_another_shape(call) is not None
    if any(name.startswith("inputs") for name in (*call.only_in_a, *call.only_in_b)):
        if call.status == "equal" or fed_well(call):
            return False  # given other arguments too (a norm that adds the residual it is given)
    if call.status != "equal":
        return True
    return any(d.status == "diverged" and _floating(d.dtype_a) and _floating(d.dtype_b) for d in call.inputs)


def _withheld(call: CallDiff, steps: Sequence[CallNode], b_tree: _BTree) -> tuple[str, ...]:
    """The tensors B's ``call`` is not given that the same module of B's other blocks (its path with the block number
    left out, its type) is given in every one of them, while A's call is given whatever its own other blocks are: a
    caller that withheld an argument (a block that does not hand its attention the causal mask), whose callee then
    computes faithfully from what it got. Empty when there is no other block, or when A's blocks differ too (a stack
    that hands its first block no position bias)."""

    def missing(node: CallNode, roots: Iterable[CallNode]) -> set[str]:
        code = (without_block_number(node.path), node.type_name)
        if code[0] == node.path:
            return set()
        others = [
            {name for name, _ in other.input_tensors()}
            for root in roots
            for other in root.walk()
            if other is not node
            and other.kind == "module"
            and (without_block_number(other.path), other.type_name) == code
        ]
        if not others:
            return set()
        return set.intersection(*others) - {name for name, _ in node.input_tensors()}

    if missing(call.a, steps):
        return ()
    return tuple(f"inputs{name}" for name in sorted(missing(call.b, b_tree.roots)))


def _given_another_shape(call: CallDiff) -> str | None:
    """The input ``call`` was given at the same place as its counterpart but of another shape, when its output has
    another shape too (a cross-attention's key projection given the decoder's state where the original's is given
    the encoder's output): the call computed from another quantity, so the departure lies where it was handed
    that, not in the call. Inputs of other shapes under outputs of the same shape are extra arguments (a position
    bias where the original passes a mask), and an output of another shape from inputs that agree is the call's own
    (a convolution's padding)."""
    if not any(d.status == "diverged" and d.basis == "none" and d.shape_a != d.shape_b for d in call.outputs):
        return None
    apart = [name for name in call.only_in_a if name.startswith("inputs") and name in call.only_in_b]
    if not apart:
        return None
    shapes = {side: dict(node.input_tensors()) for side, node in (("a", call.a), ("b", call.b))}
    name = apart[0].removeprefix("inputs")
    shape_a, shape_b = shapes["a"][name].shape, shapes["b"][name].shape
    return f"{apart[0]}: given shape {list(shape_a)} vs {list(shape_b)}"


def _fed_by_agreeing_calls(calls: Sequence[CallDiff]) -> Callable[[CallDiff], bool]:
    """Whether each tensor a call of B was given is, unchanged, the output of a call that is paired and agrees (False
    when one was made in a caller's own code: a norm computed there, however it agreed before)."""
    by_id = {(call.step, call.b.id): call for call in calls if call.a.kind != "op"}

    def fed_well(call: CallDiff) -> bool:
        producers = [by_id.get((call.step, source)) for source in call.b.inputs_from]
        if not producers or any(found is None or found.status != "equal" for found in producers):
            return False
        made = {_fingerprint(record) for found in producers if found for _, record in found.b.output_tensors()}
        return all(_fingerprint(record) in made for _, record in call.b.input_tensors())

    return fed_well


def _fingerprint(record: TensorRecord) -> tuple[object, ...]:
    return (record.shape, record.dtype, record.stats, record.sketch)


def _floating(dtype: str) -> bool:
    return "float" in dtype


def _b_caller(outer: CallDiff, here: CallDiff, b_tree: _BTree, b_calls: dict[int, CallDiff]) -> CallDiff:
    """Whose own code handed ``here`` its differing inputs: ``outer`` (A's nearest matched caller) when B calls
    ``here`` from inside ``outer``'s counterpart too, else B's nearest matched caller of it, whose inputs agree (the
    two implementations call the module from different places: T5 computes its relative position bias in the first
    block's attention, a port in the stack)."""
    above = b_tree.ancestors(here.b)
    if not above or any(node is outer.b for node in above):
        return outer
    caller = next((b_calls[id(node)] for node in above if id(node) in b_calls), None)
    return caller if caller is not None and caller.inputs_agree else outer


def _fused_by_statistics(here: CallDiff, parts: Sequence[CallDiff], b_tree: _BTree) -> Divergence:
    """A fused call of A whose output, by statistics, is not B's parts side by side: statistics of the whole cannot
    tell which part departs, so B's module that calls them all is named (the first part when there is none)."""
    callers = {id(b_tree.parent.get(id(part.b))) for part in parts}
    caller = b_tree.parent.get(id(here.b))
    names = ", ".join(part.b.path.rpartition(".")[2] for part in parts)
    why = (
        f"the outputs of {names} side by side do not match A's fused {here.a.path.rpartition('.')[2]} "
        f"({here.reason}); statistics cannot tell which of them departs: capture both traces with values='bundle' "
        f"or 'safetensors' to find it"
    )
    if caller is None or len(callers) != 1:
        return Divergence(here, False, why, before=here, parts=tuple(parts))
    return Divergence(dataclasses.replace(here, b=caller), False, why, before=here, parts=tuple(parts))


class _BTree:
    """Trace B's call tree as the culprit rule needs it: callers, execution order, and which calls are matched."""

    def __init__(self, calls: Sequence[CallDiff], steps: Sequence[CallNode]) -> None:
        roots = {id(step) for step in steps}
        self.roots = [call.b for call in calls if id(call.a) in roots]
        self.parent: dict[int, CallNode] = {}
        self.order: dict[int, int] = {}  # id -> position in B's returned order
        for root in (call.b for call in calls if id(call.a) in roots):
            for node in root.walk():
                for child in node.children:
                    self.parent[id(child)] = node
            for position, node in enumerate(returned_order(root), start=len(self.order)):
                self.order[id(node)] = position
        self.pairs = [call for call in calls if call.a.kind != "op"]
        self.matched_b = {id(call.b) for call in self.pairs}

    def ancestors(self, node: CallNode) -> list[CallNode]:
        found, parent = [], self.parent.get(id(node))
        while parent is not None:
            found.append(parent)
            parent = self.parent.get(id(parent))
        return found

    def unchecked(self, container: CallNode, before: CallNode | None) -> tuple[CallNode, ...]:
        """The module calls of B inside ``container`` without a counterpart in A that returned before ``before``
        (all of them when None), leaving out those that return what they were given (a dropout) and those holding
        ``before``."""
        end = self.order.get(id(before)) if before is not None else None
        holding = {id(node) for node in self.ancestors(before)} if before is not None else set()
        return tuple(
            node
            for node in returned_order(container)
            if node is not container
            and node.kind == "module"
            and id(node) not in self.matched_b
            and id(node) not in holding
            and (end is None or self.order.get(id(node), end) < end)
            and not passes_through(node)
        )

    def holder(self, outer: CallDiff, first: CallDiff) -> CallNode | None:
        """The module of B, inside ``outer``'s and without a counterpart, whose own code lies between the last call
        that agreed and ``first`` (whose inputs differ): the innermost caller of both. None when that is ``outer``."""
        above_first = self.ancestors(first.b)
        depth = next((k for k, node in enumerate(above_first) if node is outer.b), None)
        if depth is None:
            return None
        inner = {id(node) for node in above_first[:depth]}
        if not inner:
            return None
        start = self.order.get(id(first.b))
        agreed = [
            call
            for call in self.pairs
            if id(call.b) in self.order
            and start is not None
            and self.order[id(call.b)] < start
            and id(call.b) not in {id(node) for node in above_first}
            and call.status != "diverged"
            and call.inputs_agree
            and any(id(node) in inner for node in self.ancestors(call.b))
        ]
        if not agreed:
            return None
        last = max(agreed, key=lambda call: self.order[id(call.b)])
        above_last = {id(node) for node in self.ancestors(last.b)}
        common = next((node for node in above_first if id(node) in above_last), None)
        if common is None or id(common) not in inner or id(common) in self.matched_b:
            return None
        return common

    def entered_well(self, outer: CallDiff, first: CallDiff) -> CallNode | None:
        """The innermost module of B, inside ``outer``'s and without a counterpart, that calls ``first`` (whose inputs
        differ) and was itself given what agrees: each of its tensors is one ``outer`` was given (its inputs
        agreeing) or the output of a call that agrees. Its own code handed ``first`` what differs (a port's
        ``downsample`` list missing its norm). None when there is none."""
        above_first = self.ancestors(first.b)
        depth = next((k for k, node in enumerate(above_first) if node is outer.b), None)
        start = self.order.get(id(first.b))
        if not depth or start is None:
            return None
        agreeing = {_fingerprint(record) for _, record in outer.b.input_tensors()} if outer.inputs_agree else set()
        for call in self.pairs:
            if call.status == "equal" and self.order.get(id(call.b), start) < start:
                agreeing.update(_fingerprint(record) for _, record in call.b.output_tensors())
        for node in above_first[:depth]:  # innermost first
            given = [_fingerprint(record) for _, record in node.input_tensors()]
            if id(node) not in self.matched_b and given and all(found in agreeing for found in given):
                return node
        return None


def _short_name(call: CallDiff) -> str:
    """``a_path`` (relative to the model), with ``↔ b_path`` when B names the call otherwise."""
    names = []
    for node in (call.a, call.b):
        path = node.path.partition(".")[2] or node.path
        names.append(path if node.index == 0 else f"{path}#{node.index + 1}")
    return names[0] if names[0] == names[1] else f"{names[0]} ↔ {names[1]}"


def _first_diverging(calls: tuple[CallDiff, ...]) -> CallDiff | None:
    """The first call to return whose output diverges while its inputs agree; when every diverging call already
    had diverging inputs (the traces were given different inputs), the first diverging call; when only inputs
    diverge, the first such call."""
    modules = [call for call in calls if call.a.kind != "op"]
    diverged = [call for call in modules if call.status == "diverged"]
    for call in diverged:
        if call.inputs_agree:
            return call
    if diverged:
        return diverged[0]
    fed_well = _fed_by_agreeing_calls(calls)
    return next((call for call in modules if _inputs_depart(call, fed_well)), None)


def first_divergence(calls: tuple[CallDiff, ...], steps: Sequence[CallNode] = ()) -> CallDiff | None:
    """The call :func:`locate_divergence` blames."""
    found = locate_divergence(calls, steps)
    return None if found is None else found.call


@dataclass(frozen=True)
class Comparison:
    """Two traces compared: ``a`` is the reference, ``b`` the candidate (a port, a changed model)."""

    a: Trace
    b: Trace
    a_label: str
    b_label: str
    tolerance: Tolerance
    align: str
    rules: tuple[str, ...]
    calls: tuple[CallDiff, ...]
    only_in_a: tuple[Unmatched, ...]
    only_in_b: tuple[Unmatched, ...]
    unused_rules: tuple[str, ...] = ()
    strict: bool = False
    op_locator: Callable[[CallDiff], object | None] | None = dataclasses.field(default=None, repr=False, compare=False)

    @functools.cached_property
    def divergence(self) -> Divergence | None:
        """Where B first departs from A, with the explanation (see :func:`locate_divergence`), and when both traces
        hold op records, the port's op where it departs (compare/ops.py)."""
        found = locate_divergence(self.calls, self.a.steps)
        if found is None or self.op_locator is None:
            return found
        return dataclasses.replace(found, op_locus=self.op_locator(found.call))

    @property
    def first_divergence(self) -> CallDiff | None:
        """The matched call to blame (``divergence.call``)."""
        found = self.divergence
        return None if found is None else found.call

    @property
    def diverged(self) -> tuple[CallDiff, ...]:
        """The matched module calls whose outputs or inputs diverge (see :func:`_inputs_depart`). Op records are not
        counted: an op's divergence shows in its module's output."""
        fed_well = _fed_by_agreeing_calls(self.calls)
        return tuple(
            call
            for call in self.calls
            if call.a.kind != "op" and (call.status == "diverged" or _inputs_depart(call, fed_well))
        )

    @property
    def equal(self) -> bool:
        """True when every matched call agrees within tolerance (and, when ``strict``, every call matched)."""
        if self.strict and any(item.call.kind != "op" for item in (*self.only_in_a, *self.only_in_b)):
            return False  # op records are not matched one to one across implementations: modules only
        return not self.diverged

    def matched_by(self) -> dict[str, int]:
        """How many calls were matched each way: ``{"path": 40, "rule": 0, "structure": 3, "fused": 0}``."""
        counts = Counter(call.how for call in self.calls)
        return {how: counts.get(how, 0) for how in ("path", "rule", "structure", "fused")}

    def table(self, *, color: bool = False, show_all: bool = False) -> str:
        """The report as text for a terminal (see :mod:`graphtrace.compare.text`)."""
        from graphtrace.compare.text import render_table

        return render_table(self, color=color, show_all=show_all)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        """One line (``str()`` and :meth:`table` give the report): ``Comparison(A='ref', B='port', 45 matched
        calls, DIVERGED at model.layers.1.mlp.up_proj)``."""
        first = self.first_divergence
        if first is not None:
            verdict = f"DIVERGED at {_short_name(first)}"
        else:
            verdict = "EQUAL" if self.equal else "DIVERGED (calls without a counterpart, strict)"
        return f"Comparison(A={self.a_label!r}, B={self.b_label!r}, {len(self.calls)} matched calls, {verdict})"

    def _repr_html_(self) -> str:
        """Jupyter's view: the verdict, the first divergence and the diverging calls, drawn by
        :mod:`graphtrace.render.html` (offered through the data model's services; the full page is
        ``graphtrace.to_html(comparison)``)."""
        return services().html(self)

    def to_json(self) -> dict[str, Any]:
        """The whole report as a JSON-ready dict (non-finite numbers as ``"NaN"``, ``"Infinity"``)."""
        first = self.divergence
        return {
            "format": REPORT_FORMAT,
            "version": REPORT_VERSION,
            "a": _trace_json(self.a, self.a_label),
            "b": _trace_json(self.b, self.b_label),
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "align": self.align,
            "rules": list(self.rules),
            "unused_rules": list(self.unused_rules),
            "strict": self.strict,
            "equal": self.equal,
            "first_divergence": None if first is None else _divergence_json(first),
            "matched": self.matched_by(),
            "calls": [_call_json(call) for call in self.calls],
            "only_in_a": [_unmatched_json(item) for item in self.only_in_a],
            "only_in_b": [_unmatched_json(item) for item in self.only_in_b],
        }


def _number(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _trace_json(trace: Trace, label: str) -> dict[str, Any]:
    return {
        "trace": label,
        "model_class": trace.meta.model_class,
        "steps": len(trace.steps),
        "calls": sum(1 for _ in trace.walk()),
    }


def _tensor_json(diff: TensorDiff) -> dict[str, Any]:
    out = {field.name: getattr(diff, field.name) for field in dataclasses.fields(diff)}
    out["shape_a"], out["shape_b"] = list(diff.shape_a), list(diff.shape_b)
    for key in ("max_abs", "max_rel", "cosine"):
        out[key] = _number(out[key])
    if diff.stat_deltas is not None:
        out["stat_deltas"] = {name: _number(x) for name, x in zip(STAT_NAMES, diff.stat_deltas)}
    out["numel"] = diff.numel
    return out


def _pair_json(call: CallDiff) -> dict[str, Any]:
    return {
        "step": call.step,
        "a": call.a.id,
        "b": call.b.id,
        "how": call.how,
        "inputs_agree": call.inputs_agree,
        "reason": call.reason,
    }


def _divergence_json(found: Divergence) -> dict[str, Any]:
    return {
        **_pair_json(found.call),
        "inside": found.inside,
        "before": None if found.before is None else {"a": found.before.a.id, "b": found.before.b.id},
        "explanation": found.explanation,
        "op_locus": None if found.op_locus is None else str(found.op_locus),
        "unchecked": [node.id for node in found.unchecked],
    }


def _call_json(call: CallDiff) -> dict[str, Any]:
    return {
        **_pair_json(call),
        "a_type": call.a.type_name,
        "b_type": call.b.type_name,
        "status": call.status,
        "error": call.error,
        "inputs": [_tensor_json(diff) for diff in call.inputs],
        "outputs": [_tensor_json(diff) for diff in call.outputs],
        "only_in_a": list(call.only_in_a),
        "only_in_b": list(call.only_in_b),
    }


def _unmatched_json(item: Unmatched) -> dict[str, Any]:
    return {"step": item.step, "call": item.call.id, "type": item.call.type_name}
