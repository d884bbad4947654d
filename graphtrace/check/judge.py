"""Each aligned module call of the port judged alone: run on the original's inputs, its output measured against the
original's output.

For one call, each tensor argument the diff pairs with a tensor of the original is given the original's value,
laid out as the port holds it (:mod:`graphtrace.check.views`); the other arguments stay the port's own (copies of
them). The module runs alone (:mod:`graphtrace.check.alone`), unless every argument given the original's value was
the port's own, bit for bit or up to rounding (:func:`~graphtrace.check.memo.likeness`): its own output is then the
answer, and nothing runs again. A departure found through values equal only up to rounding is judged again on
identical values alone, so that rounding never makes a departure. Each output is read back in
the original's layout and measured with the diff's :func:`~graphtrace.compare.measure.measure` and tolerance.

Then the verdicts are settled against each other: a module that departs departs on its own when every module inside
it that was judged agrees; else the departing ones inside explain it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from graphtrace.check.alone import Guard, run_alone
from graphtrace.check.live import LiveCall, live_tensors, replaced, version
from graphtrace.check.memo import ALIKE, SAME, Known, likeness, same_bits
from graphtrace.check.report import ModuleCheck
from graphtrace.check.values import OriginalValues
from graphtrace.check.views import View, view_between
from graphtrace.compare import CallDiff, TensorDiff, Tolerance
from graphtrace.compare.align import passes_through
from graphtrace.compare.measure import measure
from graphtrace.engine.caches import find_cache
from graphtrace.model import CallNode, TensorRecord

__all__ = ["Judge", "settle"]


@dataclass(frozen=True, slots=True)
class _Target:
    """An output of the original to compare with: ``diff`` is the diff's pair of outputs (their names), ``record``
    the original's record that holds the value, ``view`` how the port's output is read in its layout."""

    diff: TensorDiff
    record: TensorRecord
    port_name: str
    view: View
    layout: str | None = None
    """The re-orderings of the last dim allowed for (None: any; "": none, for the model's own output, which its
    caller reads as it is laid out)."""


_MeasureKey = tuple[int, str | None, str, str | None]
"""A measurement's: the port's output (by ``id``), the original's value file, the view, the layouts allowed."""


class _Skip(Exception):
    """A module that cannot be judged: ``why`` in a few words, ``reason`` in full."""

    def __init__(self, why: str, reason: str) -> None:
        super().__init__(reason)
        self.why, self.reason = why, reason


def _kind(dtype: str) -> str:
    """What a dtype holds: a value may be given in another dtype of the same kind (ids as int32 for int64)."""
    if dtype == "torch.bool":
        return "bool"
    if "complex" in dtype:
        return "complex"
    return "float" if "float" in dtype else "integer"


def _floating(tensor: torch.Tensor) -> bool:
    return tensor.is_floating_point() or tensor.is_complex()


def _where(original: torch.Tensor, port: torch.Tensor) -> tuple[int, ...]:
    """The index of the largest difference (a NaN or an infinity on one side only counts as infinite), found in the
    tensors' own floating dtype: where the largest difference lies needs no float64."""
    floating = _floating(original) and _floating(port)
    dtype = torch.promote_types(original.dtype, port.dtype) if floating else torch.float64
    if dtype.itemsize == 1:  # float8: torch does no arithmetic in it
        dtype = torch.float32
    a, b = original.detach().to(dtype), port.detach().to(dtype)
    if a.numel() == 0:
        return ()
    delta = (b - a).abs()
    largest, flat = delta.reshape(-1).max(0)  # the first largest; NaN propagates
    if not math.isfinite(float(largest.item())):  # a NaN or an infinity somewhere: masks needed
        alike = (a == b) | (torch.isnan(a) & torch.isnan(b))
        flat = torch.nan_to_num(delta, nan=math.inf).masked_fill(alike, 0.0).reshape(-1).argmax()
    return tuple(int(k) for k in torch.unravel_index(flat, tuple(delta.shape)))


@dataclass
class Judge:
    """Judges the port's calls: ``calls`` are the live calls by id, ``values`` the original's values, ``guard``
    keeps the port's own tensors from the modules run alone."""

    calls: dict[str, LiveCall]
    values: OriginalValues
    tolerance: Tolerance
    guard: Guard
    root: CallNode
    paths: dict[int, str]
    """Each module of the port (by ``id``) named as its calls are (``Class.path``)."""
    _memo: dict[_MeasureKey, tuple[torch.Tensor, TensorDiff, tuple[int, ...] | None]] = field(default_factory=dict)
    _known: Known = field(default_factory=Known)

    def __post_init__(self) -> None:
        for name, call in self.calls.items():
            if call.finished:
                then = {id(t): (t, call.given[key]) for key, t in call.inputs.items()}
                then |= {id(t): (t, call.returned[key]) for key, t in call.outputs.items()}
                self._known.add(name, call.args, call.kwargs, call.output, then)

    def module(self, node: CallNode, pairs: Sequence[CallDiff]) -> ModuleCheck:
        """The local verdict of the port's call ``node``, paired with the original's calls in ``pairs`` (several
        for a fused projection)."""
        pair = pairs[0]
        check = ModuleCheck(port=node, original=pair.a, how=pair.how, verdict="skipped")
        try:
            return self._judge(node, pairs, check)
        except _Skip as skip:
            return dataclasses.replace(check, why=skip.why, reason=skip.reason)

    def _judge(self, node: CallNode, pairs: Sequence[CallDiff], check: ModuleCheck) -> ModuleCheck:
        call = self._live(node)
        targets = self._targets(node, pairs)
        given, kept = self._given(pairs[0], call)
        check = dataclasses.replace(check, given=tuple(given), kept=tuple(kept))
        before = self._known.approximations
        answer = self._own_output_answers(call, given)
        reused = answer is not None
        outputs = call.outputs if reused else self._run_alone(node, call, given, kept)
        diffs, where = self._measured(targets, outputs)
        approximate = answer == "alike" or self._known.approximations > before
        if approximate and any(diff.status == "diverged" for diff in diffs):  # confirmed on identical values only
            with self._known.exactly():  # ("same" took the port's own output: nothing approximated)
                reused = False
                diffs, where = self._measured(targets, self._run_alone(node, call, given, kept))
        statuses = {diff.status for diff in diffs}
        if "diverged" in statuses:
            return dataclasses.replace(check, verdict="departs", outputs=diffs, reused=reused, where=where)
        if "equal" in statuses:
            return dataclasses.replace(check, verdict="agrees", outputs=diffs, reused=reused)
        reasons = "; ".join(f"{diff.name_b}: {diff.reason}" for diff in diffs)
        raise _Skip("its outputs could not be compared", reasons)

    @staticmethod
    def _own_output_answers(call: LiveCall, given: dict[str, torch.Tensor]) -> Literal["same", "alike"] | None:
        """Whether the port's own output is the answer: every argument given the original's value was the port's
        own, bit for bit ("same") or up to rounding ("alike"), untouched since, and so is the output."""
        if not call.output_intact or not all(call.input_intact(name) for name in given):
            return None
        least = min((likeness(value, call.inputs[name]) for name, value in given.items()), default=SAME)
        return "same" if least == SAME else "alike" if least == ALIKE else None

    def _live(self, node: CallNode) -> LiveCall:
        if node.error is not None:
            raise _Skip("the port's own call raised", node.error)
        call = self.calls.get(node.id)
        if call is None or not call.finished:
            raise _Skip(
                "its call was not seen",
                "the port called its forward from outside the module call (module.forward(...)): its arguments "
                "were not kept",
            )
        cache = find_cache((*call.args, *call.kwargs.values()))
        if cache is not None:
            raise _Skip(
                "it is given a key/value cache",
                f"it is given a {type(cache).__name__}, which it updates in place; run the port without a cache "
                "(use_cache=False) to check it",
            )
        return call

    def _targets(self, node: CallNode, pairs: Sequence[CallDiff]) -> list[_Target]:
        """The original's outputs to compare with, each with a value and a view; none raises why."""
        inside = node is not self.root  # the model's own output is read as it is laid out: no re-ordering
        port_outputs = dict(node.output_tensors())
        targets, missing = [], []
        for pair in pairs:
            original_outputs = dict(pair.a.output_tensors())
            for diff in pair.outputs:
                record = original_outputs.get(diff.name_a.removeprefix("outputs"))
                port = port_outputs.get(diff.name_b.removeprefix("outputs"))
                if record is None or port is None:
                    missing.append(f"{diff.name_b} is compared with a part of the original's ({diff.equivalence})")
                    continue
                kept = self.values.kept(pair.a, record, output=True)
                view = view_between(record.shape, port.shape, reorder=inside)
                if kept is None:
                    missing.append(f"the original's trace keeps no value of {diff.name_a}")
                elif view is None:
                    missing.append(
                        f"{diff.name_b} {list(port.shape)} has no view onto the original's {list(record.shape)}"
                    )
                else:
                    name = diff.name_b.removeprefix("outputs")
                    targets.append(_Target(diff, kept, name, view, None if inside else ""))
        if not targets:
            raise _Skip("its outputs could not be compared", "; ".join(missing) or "no output is paired")
        return targets

    def _given(self, pair: CallDiff, call: LiveCall) -> tuple[dict[str, torch.Tensor], list[str]]:
        """The arguments given the original's value (by name, in the port's layout and dtype), and the names of
        those left the port's own."""
        original_inputs = dict(pair.a.input_tensors())
        given: dict[str, torch.Tensor] = {}
        for diff in pair.inputs:
            name = diff.name_b.removeprefix("inputs")
            port = call.inputs.get(name)
            record = original_inputs.get(diff.name_a.removeprefix("inputs"))
            if port is None or record is None or name in given or _kind(record.dtype) != _kind(str(port.dtype)):
                continue  # a mask in another convention is another quantity: the port's own is kept
            kept = self.values.kept(pair.a, record, output=False)
            view = view_between(record.shape, tuple(port.shape))
            if kept is not None and view is not None:
                value = view.to_port(self.values.load(kept))
                given[name] = value.to(device=port.device, dtype=port.dtype)
        kept_names = [name for name in call.inputs if name not in given]
        floating = [name for name, tensor in call.inputs.items() if _floating(tensor)]
        if floating and not any(name in given for name in floating):
            raise _Skip(
                "none of its floating inputs has a counterpart",
                f"none of {', '.join(floating)} could be given the original's value: run alone on the port's own "
                "inputs, it would tell nothing",
            )
        return given, kept_names

    def _run_alone(
        self, node: CallNode, call: LiveCall, given: dict[str, torch.Tensor], kept: list[str]
    ) -> dict[str, torch.Tensor]:
        changed = [name for name in kept if not call.input_intact(name)]
        if changed:
            raise _Skip(
                "the port changed its argument in place after the call",
                f"{', '.join(changed)} changed in place after the call: what the module was given is gone",
            )
        new = {**given, **{name: call.inputs[name].clone() for name in kept}}
        args, kwargs = replaced(call.args, "_args", new), replaced(call.kwargs, "_kwargs", new)
        then = {id(t): (t, version(t)) for t in new.values()}
        before = self._known.approximations
        with self._known.answering(node, call.module, self.paths):
            alone = run_alone(call.module, args, kwargs, self.guard)
        if alone.refused is not None:
            raise _Skip(alone.why, alone.refused)
        approximate = self._known.approximations > before
        self._known.add(node.id, args, kwargs, alone.output, then, approximate=approximate)
        return dict(live_tensors(alone.output))

    def _measured(
        self, targets: Iterable[_Target], outputs: dict[str, torch.Tensor]
    ) -> tuple[tuple[TensorDiff, ...], tuple[int, ...] | None]:
        """Each target measured against the port's output; the index of the worst departure."""
        diffs: list[TensorDiff] = []
        worst: tuple[float, tuple[int, ...]] | None = None
        for target in targets:
            found = outputs.get(target.port_name)
            if found is None or not isinstance(found, torch.Tensor):
                diffs.append(self._lost(target, "run alone, it returned no such output"))
                continue
            key = (id(found), target.record.file, target.view.description, target.layout)
            memo = self._remembered(key, found)
            if memo is not None:  # a container's output that is a call's inside it: measured
                diff, where = memo
            else:
                diff, where = self._measure(target, found)
                self._memo[key] = (found, diff, where)
            diff = dataclasses.replace(diff, name_a=target.diff.name_a, name_b=target.diff.name_b)
            diffs.append(diff)
            if where is not None and (worst is None or (diff.largest or 0.0) > worst[0]):
                worst = (diff.largest or 0.0, where)
        return tuple(diffs), None if worst is None else worst[1]

    def _remembered(self, key: _MeasureKey, found: torch.Tensor) -> tuple[TensorDiff, tuple[int, ...] | None] | None:
        """The measurement of ``found`` under ``key``. The model's own output (no re-ordering allowed) is often a
        call's inside it, measured already allowing any: when that found none, it found what allowing none finds."""
        for layout in (key[3], None) if key[3] == "" else (key[3],):
            memo = self._memo.get((*key[:3], layout))
            if memo is not None and memo[0] is found and (layout == key[3] or memo[1].layout == ""):
                return memo[1], memo[2]
        return None

    def _measure(self, target: _Target, found: torch.Tensor) -> tuple[TensorDiff, tuple[int, ...] | None]:
        """The port's output ``found`` against the original's value of ``target``, and where it departs most."""
        original = self.values.load(target.record)
        try:
            port = target.view.to_original(found.detach()).to(original.device)  # the original's values: on the host
        except RuntimeError:
            return self._lost(target, f"run alone, it returned shape {list(found.shape)}"), None
        record = TensorRecord(shape=target.record.shape, dtype=str(found.dtype))
        if same_bits(original, port):  # what measure finds for identical values, without its float64 passes
            rtol, atol = self.tolerance.for_dtypes(target.record.dtype, record.dtype)
            diff = TensorDiff(
                name_a=target.diff.name_a,
                name_b=target.diff.name_b,
                shape_a=target.record.shape,
                shape_b=record.shape,
                dtype_a=target.record.dtype,
                dtype_b=record.dtype,
                basis="values",
                status="equal",
                rtol=rtol,
                atol=atol,
                max_abs=0.0,
                max_rel=0.0,
                cosine=1.0,
                outside=0,
            )
        else:
            diff = measure(
                target.diff.name_a,
                target.record,
                target.diff.name_b,
                record,
                self.tolerance,
                (original, port),
                layout=target.layout,
            )
        notes = "; ".join(filter(None, (target.view.description, diff.equivalence)))
        diff = dataclasses.replace(diff, shape_b=tuple(found.shape), equivalence=notes)
        return diff, _where(original, port) if diff.status == "diverged" else None

    def _lost(self, target: _Target, reason: str) -> TensorDiff:
        return dataclasses.replace(target.diff, basis="none", status="diverged", reason=reason, max_abs=None)


def settle(checks: Sequence[ModuleCheck], root: CallNode, unmatched: Iterable[CallNode]) -> list[ModuleCheck]:
    """``checks`` (in the port's returned order) with ``own``, ``explained_by``, ``picked`` and ``unchecked_inside``
    set. A module that departs departs on its own when no module inside it departs, at any depth: a departure under
    the tolerance of the modules around it (a projection's, diluted by a residual) still grows through the rest of
    a forward the port runs itself. Modules that were not judged are listed as unchecked inside the nearest judged
    module around them.

    A module of the port called in two places, paired with one module of the original in one place where it agrees
    and with another in the other where it departs (a block feeding its MLP through ``attention_norm`` where the
    original uses ``post_attention_layernorm``), computes faithfully: the caller picked it, and the departure is
    the caller's own."""
    parent = {id(child): node for node in root.walk() for child in node.children}
    verdicts = {id(check.port): check.verdict for check in checks}
    agreeing: dict[str, set[str]] = {}
    for check in checks:
        if check.verdict == "agrees":
            agreeing.setdefault(check.port.path, set()).add(check.original.path)
    picked = {
        id(check.port)
        for check in checks
        if check.verdict == "departs" and agreeing.get(check.port.path, set()) - {check.original.path}
    }

    def above(node: CallNode, verdicts_wanted: tuple[str, ...]) -> int | None:
        """The nearest call around ``node`` with one of these verdicts."""
        found = parent.get(id(node))
        while found is not None and verdicts.get(id(found)) not in verdicts_wanted:
            found = parent.get(id(found))
        return None if found is None else id(found)

    inside: dict[tuple[int | None, str], list[str]] = {}  # (holder, "departs" | "picked" | "unchecked") -> ids
    for check in checks:
        if check.verdict == "skipped":
            inside.setdefault((above(check.port, ("agrees", "departs")), "unchecked"), []).append(check.port.id)
        elif id(check.port) in picked:
            inside.setdefault((above(check.port, ("agrees", "departs")), "picked"), []).append(check.port.id)
        elif check.verdict == "departs":
            inside.setdefault((above(check.port, ("departs",)), "departs"), []).append(check.port.id)
    for node in unmatched:
        if not passes_through(node):
            inside.setdefault((above(node, ("agrees", "departs")), "unchecked"), []).append(node.id)
    settled = []
    for check in checks:
        key = id(check.port)
        departs = check.verdict == "departs"
        explained = tuple(inside.get((key, "departs"), ())) if departs else ()
        settled.append(
            dataclasses.replace(
                check,
                own=departs and key not in picked and not explained,
                explained_by=explained,
                picked=tuple(inside.get((key, "picked"), ())) if departs else (),
                misplaced=key in picked,
                unchecked_inside=tuple(inside.get((key, "unchecked"), ())),
            )
        )
    return settled
