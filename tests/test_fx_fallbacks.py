"""Every documented way a module's trace or replay fails (docs/fx.md), end to end: under strategy="auto" the module
falls back with its reason, and the output, the module tree and the random state are exactly strategy="eager"'s;
under strategy="fx" the same capture raises FxCaptureError naming the module, with the trace kept on the error.
Then the replay's and the structural check's own ways of catching a graph that the real call does not follow."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import FxCaptureError
from graphtrace.model import Trace
from tests.fx_equivalence import assert_same_output, module_tree
from tests.test_fx_engine import ListCache, UsesCache, Wrapper


class BranchesOnData(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x * 3


class TwoChildren(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)


class TagsChildOutput(TwoChildren):
    """Sets an attribute on a child's output tensor, which torch.fx would keep on the proxy and drop from the graph."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        y.scale = 3.0
        return y * y.scale


class PicksByType(TwoChildren):
    """``isinstance(x, torch.Tensor)`` is False for a traced value: the graph calls ``b``, the real call ``a``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        child = self.a if isinstance(x, torch.Tensor) else self.b
        return child(x)


class AddsIntoChildOutput(TwoChildren):
    """A residual added in place into a child's output, which the parent's replay must not write again."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.a(x)
        out += x
        return out


def _dropout_in_training() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 4)).train()


X = (2, 4)

# (model, extra arguments after x, the module that falls back, the start of its reason)
DOCUMENTED: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[Any, ...]], str, str]] = {
    "control-flow-on-data": (
        lambda: Wrapper(BranchesOnData()),
        tuple,
        "Wrapper.inner",
        "TraceError: symbolically traced variables cannot be used as inputs to control flow",
    ),
    "attribute-on-traced-value": (
        TagsChildOutput,
        tuple,
        "TagsChildOutput",
        "TraceError: assigns attribute 'scale' on a traced value",
    ),
    "graph-and-call-differ": (
        PicksByType,
        tuple,
        "PicksByType",
        "Mismatch: the forward calls Linear where the graph calls b",
    ),
    "in-place-write": (
        AddsIntoChildOutput,
        tuple,
        "AddsIntoChildOutput",
        "Refused: writes in place into a tensor it did not create (aten::add_",
    ),
    "random-draw": (_dropout_in_training, tuple, "Sequential.1", "Refused: draws random numbers (aten::bernoulli_"),
    "cache-method": (
        lambda: Wrapper(UsesCache()),
        lambda: (ListCache(),),
        "Wrapper.inner",
        "Refused: calls ListCache.update, which a replay would repeat",
    ),
}


def _capture(
    strategy: str, build: Callable[[], nn.Module], extra: Callable[[], tuple[Any, ...]]
) -> tuple[Trace, Any, torch.Tensor, FxCaptureError | None]:
    """A fresh model and inputs from one seed, captured with ``strategy``: the trace, the output with the arguments
    as the call left them (a cache it updated), the random state afterwards and, under strategy="fx", the error
    raised when the block ends."""
    torch.manual_seed(0)
    model = build()
    args = (torch.randn(X), *extra())
    error = None
    try:
        with graphtrace.tracing(model, strategy=strategy) as session:  # type: ignore[arg-type]
            with torch.no_grad():
                output = model(*args)
    except FxCaptureError as raised:
        error = raised
    trace = session.trace if error is None else error.trace
    assert isinstance(trace, Trace)
    return trace, (output, args), torch.random.get_rng_state(), error


@pytest.mark.parametrize("case", list(DOCUMENTED))
def test_a_documented_failure_falls_back_under_auto_and_raises_under_fx(case: str) -> None:
    build, extra, path, reason = DOCUMENTED[case]
    eager, eager_output, eager_rng, _ = _capture("eager", build, extra)
    for strategy in ("auto", "fx"):
        trace, output, rng, error = _capture(strategy, build, extra)
        assert_same_output(output, eager_output, strategy)
        assert torch.equal(rng, eager_rng), strategy
        assert module_tree(trace.root) == module_tree(eager.root), strategy
        assert list(trace.fallbacks) == [path], strategy
        assert trace.fallbacks[path].startswith(reason), trace.fallbacks[path]
        assert trace.find(path).strategy == "eager"
        if strategy == "auto":
            assert error is None
            continue
        assert error is not None and error.fallbacks == trace.fallbacks
        message = str(error)
        assert message.startswith("strategy='fx': torch.fx could not serve 1 module:")
        assert f"  {trace.fallbacks[path]} (1 module: {path})" in message
        assert "kept on this error's .trace" in message


# -- the replay's checks, one call each -------------------------------------------------------------------------------


class CallsAChildOnlyForReal(TwoChildren):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, torch.Tensor):
            x = self.a(x)
        return x * 2


class CallsAChildOnlyWhenTraced(TwoChildren):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            x = self.a(x)
        return x * 2


class ScalesAChildsInputWhenTraced(TwoChildren):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x * (1.0 if isinstance(x, torch.Tensor) else 2.0))


class CallsAChildsForward(TwoChildren):
    """``self.a.forward(x)`` skips the child's hooks: the trace goes through it, the real call records it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a.forward(x) + 1


class Doubles(nn.Module):
    """Returns float64 for real, float32 when traced."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double() if isinstance(x, torch.Tensor) else x * 1


class Flags(nn.Module):
    """Returns a flag that is 1 for real, 2 when traced."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x * 2, (1 if isinstance(x, torch.Tensor) else 2)


class Parent(nn.Module):
    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.child = child

    def forward(self, x: torch.Tensor) -> Any:
        return self.child(x)


@pytest.mark.parametrize(
    ("build", "fallbacks"),
    [
        (CallsAChildOnlyForReal, {"": "Mismatch: the forward calls Linear after the graph's last child call"}),
        (CallsAChildOnlyWhenTraced, {"": "Mismatch: the graph calls a, the forward does not"}),
        (ScalesAChildsInputWhenTraced, {"": "Mismatch: the input of a: tensor[0][0] differs"}),
        (CallsAChildsForward, {"": "Mismatch: the forward calls Linear after the graph's last child call"}),
        (
            lambda: Parent(Doubles()),
            {
                ".child": "Mismatch: the output: tensor differs",
                "": "Mismatch: child returned another tensor than the graph was traced with",
            },
        ),
        (
            lambda: Parent(Flags()),
            {
                ".child": "Mismatch: the output: [1] is 2 in the graph, 1 in the forward",
                "": "Mismatch: child returned another constant (1, traced with 2) than the graph was traced with",
            },
        ),
    ],
    ids=["extra-child", "missing-child", "child-input", "child-forward", "child-output-tensor", "child-output-flag"],
)
def test_a_replay_that_the_real_call_does_not_follow_falls_back(
    build: Callable[[], nn.Module], fallbacks: dict[str, str]
) -> None:
    eager, eager_output, _, _ = _capture("eager", build, tuple)
    auto, auto_output, _, _ = _capture("auto", build, tuple)
    root = auto.root.path
    assert auto.fallbacks == {root + suffix: reason for suffix, reason in fallbacks.items()}
    assert_same_output(auto_output, eager_output)
    assert module_tree(auto.root) == module_tree(eager.root)


# -- the structural check of later calls ------------------------------------------------------------------------------


class Switch(TwoChildren):
    """Its children depend on ``mode``, an attribute changed between two calls of one capture: the module key was
    taken when the capture began, so the second call is checked against the plan the first one verified."""

    def __init__(self) -> None:
        super().__init__()
        self.mode = "a"

    def forward(self, x: torch.Tensor) -> Any:
        if self.mode == "a":
            return self.a(x)
        if self.mode == "b":
            return self.b(x)
        if self.mode == "none":
            return x * 1
        if self.mode == "both":
            return self.b(self.a(x))
        if self.mode == "tuple":
            return (self.a(x),)
        return self.a(x).double()


@pytest.mark.parametrize(
    ("mode", "fallbacks", "second"),
    [
        ("b", {"Parent.child": "Mismatch: the forward calls Linear where the graph calls a"}, ["fx", "eager", "fx"]),
        ("none", {"Parent.child": "Mismatch: the graph calls a, the forward does not"}, ["fx", "eager"]),
        (
            "both",
            {"Parent.child": "Mismatch: the forward calls Linear after the graph's last child call"},
            ["fx", "eager", "fx", "fx"],
        ),
        (
            "tuple",
            {
                "Parent.child": "Mismatch: the output: another structure than the graph was traced with",
                "Parent": "Mismatch: child returned another structure than the graph was traced with",
            },
            ["eager", "eager", "fx"],
        ),
        (
            "double",
            {
                "Parent.child": "Mismatch: the output: another tensor than the graph was traced with",
                "Parent": "Mismatch: child returned another tensor than the graph was traced with",
            },
            ["eager", "eager", "fx"],
        ),
    ],
    ids=["other-child", "missing-child", "extra-child", "output-structure", "output-tensor"],
)
def test_a_later_call_that_leaves_the_verified_graph_falls_back(
    mode: str, fallbacks: dict[str, str], second: list[str]
) -> None:
    outputs: dict[str, list[Any]] = {}
    traces: dict[str, Trace] = {}
    for strategy in ("eager", "auto"):
        torch.manual_seed(0)
        model = Parent(Switch())
        x = torch.randn(X)
        with graphtrace.tracing(model, strategy=strategy) as session:  # type: ignore[arg-type]
            with torch.no_grad():
                first = model(x)
                model.child.mode = mode
                outputs[strategy] = [first, model(x)]
        assert session.trace is not None
        traces[strategy] = session.trace
    auto = traces["auto"]
    assert auto.fallbacks == fallbacks
    first_step, second_step = auto.steps
    assert [node.strategy for node in first_step.walk()] == ["fx", "fx", "fx"]  # verified bit for bit
    assert [node.strategy for node in second_step.walk()] == second
    assert_same_output(outputs["auto"], outputs["eager"])
    assert [module_tree(step) for step in auto.steps] == [module_tree(step) for step in traces["eager"].steps]
