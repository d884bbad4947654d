"""A module's Python side effects run once under strategy="auto" (issue 14, item 3): tracing stops before the
first one it sees, and the module falls back to eager capture, whose real call makes it once."""

from __future__ import annotations

import io
import logging
import random
import sys
from collections.abc import Callable
from contextlib import redirect_stdout
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.errors import InvalidOptionError

# the watch stands aside when another tracer is installed (coverage.py, a debugger), as documented: nothing to test
pytestmark = pytest.mark.skipif(sys.gettrace() is not None, reason="a tracer (coverage, a debugger) is installed")

EVENTS: list[int] = []
REGISTRY: dict[str, int] = {}
COUNTER = 0
LOG = logging.getLogger("graphtrace-test-port")


class _Step(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)


class AppendsToAGlobal(_Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        EVENTS.append(1)
        return self.proj(x)


class Prints(_Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("shape", tuple(x.shape))
        return self.proj(x)


class AssignsAGlobal(_Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global COUNTER
        COUNTER += 1
        return self.proj(x)


class StoresIntoAGlobal(_Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        REGISTRY["calls"] = REGISTRY.get("calls", 0) + 1
        return self.proj(x)


class Logs(_Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        LOG.warning("forward of %s", type(self).__name__)
        return self.proj(x)


class DrawsFromPythonsRandom(_Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * (1.0 + 0.0 * random.random())


class WritesToAStream(_Step):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        STREAM.write("called\n")
        return self.proj(x)


STREAM = io.StringIO()


class KeepsAHistory(_Step):
    """A plain list attribute on a helper object the module holds (not a module attribute)."""

    def __init__(self) -> None:
        super().__init__()
        self.memory = _Memory()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.memory.seen.append(1)
        return self.proj(x)


class _Memory:
    def __init__(self) -> None:
        self.seen: list[int] = []


class Pure(_Step):
    """Builds and mutates lists of its own: no side effect, so fx serves it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = []
        parts.append(self.proj(x))
        parts.extend([x])
        scale = {"a": 1.0}
        scale.update(b=2.0)
        return parts[0] * scale["b"] + parts[1]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    global COUNTER
    EVENTS.clear()
    REGISTRY.clear()
    COUNTER = 0
    yield


@pytest.mark.parametrize(
    ("step", "reason", "made"),
    [
        (AppendsToAGlobal, "calls list.append on a list held outside the call", lambda m: len(EVENTS)),
        (AssignsAGlobal, "assigns the global 'COUNTER'", lambda m: COUNTER),
        (StoresIntoAGlobal, "assigns an item of the global 'REGISTRY'", lambda m: REGISTRY.get("calls", 0)),
        (KeepsAHistory, "calls list.append on a list held outside the call", lambda m: len(m[0].memory.seen)),
    ],
)
def test_a_python_side_effect_runs_once_and_the_module_falls_back(
    step: type[_Step], reason: str, made: Callable[[nn.Sequential], int]
) -> None:
    model = nn.Sequential(step(), nn.ReLU())
    trace = graphtrace.capture(model, torch.ones(2, 4))
    assert made(model) == 1
    fallback = trace.fallbacks.get("Sequential.0", "")
    assert fallback.startswith("SideEffect: ") and reason in fallback, trace.fallbacks
    assert trace.find("Sequential.0").strategy == "eager"
    assert trace.find("Sequential.1").strategy == "fx"


def test_a_random_draw_and_a_stream_write_happen_once() -> None:
    random.seed(7)
    expected = [random.random() for _ in range(2)]
    random.seed(7)
    STREAM.seek(0)
    STREAM.truncate()
    trace = graphtrace.capture(nn.Sequential(DrawsFromPythonsRandom(), WritesToAStream()), torch.ones(2, 4))
    assert random.random() == expected[1]  # one draw by the forward, not two
    assert STREAM.getvalue() == "called\n"
    assert "a random stream" in trace.fallbacks["Sequential.0"]
    assert "writes to StringIO.write" in trace.fallbacks["Sequential.1"]


def test_the_watch_leaves_garbage_collection_as_it_was() -> None:
    import gc

    assert gc.isenabled()
    graphtrace.capture(nn.Sequential(AppendsToAGlobal(), Pure()), torch.ones(2, 4))
    assert gc.isenabled()
    gc.disable()
    try:
        graphtrace.capture(nn.Sequential(AppendsToAGlobal(), Pure()), torch.ones(2, 4))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_print_in_a_forward_is_printed_once() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        trace = graphtrace.capture(nn.Sequential(Prints()), torch.ones(2, 4))
    assert out.getvalue() == "shape (2, 4)\n"
    assert "calls print()" in trace.fallbacks["Sequential.0"]


def test_a_log_record_is_emitted_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        trace = graphtrace.capture(nn.Sequential(Logs()), torch.ones(2, 4))
    assert [record.getMessage() for record in caplog.records] == ["forward of Logs"]
    assert "logs through" in trace.fallbacks["Sequential.0"]


def test_code_without_side_effects_is_still_served_by_fx() -> None:
    model = nn.Sequential(Pure(), nn.ReLU())
    trace = graphtrace.capture(model, torch.ones(2, 4))
    assert trace.fallbacks == {}
    assert {node.strategy for node in trace.walk()} == {"fx"}
    eager = graphtrace.capture(model, torch.ones(2, 4), strategy="eager")
    assert trace.root.outputs == eager.root.outputs


class CapturesItsChild(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.errors: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        try:
            graphtrace.capture(self.proj, x)
        except InvalidOptionError as error:
            self.errors.append(str(error))
        return self.proj(x)


def test_a_capture_nested_in_a_forward_is_refused_once_and_the_outer_trace_is_intact() -> None:
    inner = CapturesItsChild()
    model = nn.Sequential(inner, nn.ReLU())
    trace = graphtrace.capture(model, torch.ones(2, 4))
    assert len(inner.errors) == 1 and "shares modules with Sequential" in inner.errors[0]
    assert [node.id for node in trace.walk()] == [
        "Sequential@0",
        "Sequential.0@0",
        "Sequential.0.proj@0",
        "Sequential.1@0",
    ]
    assert "starts a nested graphtrace capture()" in trace.fallbacks["Sequential.0"]


def test_a_profiler_already_installed_is_left_alone() -> None:
    seen: list[str] = []

    def profiler(frame: Any, event: str, arg: Any) -> None:
        seen.append(event)

    sys.setprofile(profiler)
    try:
        graphtrace.capture(nn.Sequential(nn.Linear(4, 4)), torch.ones(2, 4))
        assert sys.getprofile() is profiler
    finally:
        sys.setprofile(None)
    assert seen
    assert sys.gettrace() is None or "coverage" in type(sys.gettrace()).__module__


def test_the_watch_leaves_no_hooks_behind() -> None:
    tracer = sys.gettrace()
    graphtrace.capture(nn.Sequential(AppendsToAGlobal(), Pure()), torch.ones(2, 4))
    assert sys.getprofile() is None
    assert sys.gettrace() is tracer
