"""Garbage collection and capture: the collector waits while a step records and is back as found afterwards, and a
finished capture leaves no reference cycle, so a trace the user drops is freed at once (not at the next collection,
which on a large process costs hundreds of milliseconds and meanwhile keeps every record and value alive)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.demo import demo_inputs, demo_model


class SeesTheCollector(nn.Module):
    """Notes whether automatic collection is on each time it runs."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.fail = fail
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(gc.isenabled())
        if self.fail:
            raise ValueError("the port's bug")
        return self.proj(x)


@pytest.fixture(autouse=True)
def _collector_as_found() -> Iterator[None]:
    enabled, thresholds = gc.isenabled(), gc.get_threshold()
    yield
    gc.set_debug(0)
    (gc.enable if enabled else gc.disable)()
    gc.set_threshold(*thresholds)


@pytest.mark.parametrize("strategy", ["eager", "auto"])
def test_collection_waits_during_the_forward_and_comes_back(strategy: str) -> None:
    model = SeesTheCollector()
    thresholds = gc.get_threshold()
    graphtrace.capture(model, torch.ones(2, 4), strategy=strategy)
    assert model.seen and not any(model.seen)
    assert gc.isenabled() and gc.get_threshold() == thresholds


def test_a_user_who_turned_collection_off_keeps_it_off() -> None:
    gc.disable()
    graphtrace.capture(SeesTheCollector(), torch.ones(2, 4))
    assert not gc.isenabled()


def test_collection_comes_back_when_the_forward_raises() -> None:
    model = SeesTheCollector(fail=True)
    with pytest.raises(ValueError, match="the port's bug"):
        graphtrace.capture(model, torch.ones(2, 4))
    assert model.seen == [False] and gc.isenabled()


def test_collection_runs_between_the_steps_of_a_session() -> None:
    model = SeesTheCollector()
    with graphtrace.tracing(model) as session:
        model(torch.ones(2, 4))
        between = gc.isenabled()
        model(torch.ones(2, 4))
    assert model.seen == [False, False] and between and gc.isenabled()
    assert session.trace is not None and len(session.trace.steps) == 2


def test_the_shim_holds_collection_off_only_during_a_forward(tmp_path: Path) -> None:
    model = SeesTheCollector()
    with graphtrace.model_addition_debugger_context(model, debug_path=str(tmp_path)):
        model(torch.ones(2, 4))
        assert gc.isenabled()
    assert model.seen == [False] and gc.isenabled()


def _graphtrace_garbage(run: Callable[[], Any]) -> list[str]:
    """The graphtrace objects that only the cycle collector would free after ``run`` and dropping its result."""
    run()  # warm-up: caches and plans made once are not garbage
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        return sorted({type(o).__qualname__ for o in gc.garbage if type(o).__module__.startswith("graphtrace")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize(
    "options",
    [
        {"values": "none", "strategy": "eager"},
        {"values": "none", "strategy": "auto"},  # the fx engine referred back to itself
        {"values": "repr"},  # unread repr lines referred to their batch and back
    ],
    ids=["eager", "auto", "repr"],
)
def test_a_dropped_trace_is_freed_without_the_collector(options: dict[str, Any]) -> None:
    model, inputs = demo_model(), demo_inputs()
    assert _graphtrace_garbage(lambda: graphtrace.capture(model, inputs, **options)) == []


def test_a_tracing_session_and_the_shim_leave_no_cycle(tmp_path: Path) -> None:
    model, inputs = demo_model(), demo_inputs()

    def session() -> Any:
        with graphtrace.tracing(model, values="none") as running, torch.no_grad():
            model(**inputs)
        return running.trace

    def shim() -> None:
        with graphtrace.model_addition_debugger_context(model, debug_path=str(tmp_path)), torch.no_grad():
            model(**inputs)

    assert _graphtrace_garbage(session) == []
    assert _graphtrace_garbage(shim) == []
