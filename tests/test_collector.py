"""Garbage collection and capture: while a step records, the collector promotes nothing to its oldest generation
(whose collection walks the whole process) but still collects the youngest, and its thresholds are back as found
afterwards; a finished capture leaves no reference cycle, so a trace the user drops is freed at once (not at the next
collection, which on a large process costs hundreds of milliseconds and meanwhile keeps every record alive)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import graphtrace
from graphtrace.demo import demo_inputs, demo_model


def _held() -> bool:
    """Whether promotions are held off: collection on, the middle generation's threshold out of reach."""
    return gc.isenabled() and gc.get_threshold()[1] >= 1 << 30


class SeesTheCollector(nn.Module):
    """Notes whether promotions are held off each time it runs."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.fail = fail
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(_held())
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
def test_promotions_wait_during_the_forward_and_thresholds_come_back(strategy: str) -> None:
    model = SeesTheCollector()
    thresholds = gc.get_threshold()
    graphtrace.capture(model, torch.ones(2, 4), strategy=strategy)
    assert model.seen and all(model.seen)
    assert gc.isenabled() and gc.get_threshold() == thresholds


def test_the_youngest_generation_is_still_collected_during_a_step() -> None:
    """A forward's reference cycles (an exception kept with its traceback, holding an activation) that are garbage
    by the next collection of the youngest generation are freed while the step runs, as without graphtrace: memory
    stays bounded on a model of many layers. (A cycle that outlives a collection waits for the step's end.)"""
    freed: list[int] = []
    kept: list[object] = []

    class LeavesACycle(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            kept.extend([] for _ in range(1000))  # objects that live on: the youngest generation fills and is collected
            holder: list[object] = [x.repeat(1, 4)]
            holder.append(holder)  # a cycle, garbage once the call returns
            weakref.finalize(holder[0], freed.append, 1)
            return x + 1

    gc.set_threshold(700, 10, 10)  # Python's defaults, whatever an earlier test left
    model = nn.Sequential(*[LeavesACycle() for _ in range(40)])
    freed_during: list[int] = []
    model[-1].register_forward_pre_hook(lambda module, args: freed_during.append(len(freed)))
    graphtrace.capture(model, torch.ones(2, 4), values="none", strategy="eager")
    assert freed_during[0] > 20, freed_during


def test_a_user_who_turned_collection_off_keeps_it_off() -> None:
    gc.disable()
    thresholds = gc.get_threshold()
    graphtrace.capture(SeesTheCollector(), torch.ones(2, 4))
    assert not gc.isenabled() and gc.get_threshold() == thresholds


def test_collection_comes_back_when_the_forward_raises() -> None:
    model = SeesTheCollector(fail=True)
    with pytest.raises(ValueError, match="the port's bug"):
        graphtrace.capture(model, torch.ones(2, 4))
    assert model.seen == [True] and not _held()


def test_collection_runs_between_the_steps_of_a_session() -> None:
    model = SeesTheCollector()
    with graphtrace.tracing(model) as session:
        model(torch.ones(2, 4))
        between = _held()
        model(torch.ones(2, 4))
    assert model.seen == [True, True] and not between and not _held()
    assert session.trace is not None and len(session.trace.steps) == 2


def test_collection_comes_back_when_a_step_fails_to_begin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that raises as it begins (its previous step's files not finished, its arguments not recorded) never
    ends: collection must not wait for it for the rest of the session."""
    from graphtrace.engine import recorder

    def failing(values: Any) -> None:
        raise OSError("the previous step's files could not be finished")

    model = SeesTheCollector()
    with graphtrace.tracing(model):
        with monkeypatch.context() as patch:
            patch.setattr(recorder, "find_cache", failing)
            with pytest.raises(OSError, match="could not be finished"):
                model(torch.ones(2, 4))
        after_failure = _held()
        model(torch.ones(2, 4))
        after_a_step = _held()
    assert not after_failure and not after_a_step and model.seen == [True]


def test_the_shim_holds_collection_off_only_during_a_forward(tmp_path: Path) -> None:
    model = SeesTheCollector()
    with graphtrace.model_addition_debugger_context(model, debug_path=str(tmp_path)):
        model(torch.ones(2, 4))
        assert not _held()
    assert model.seen == [True] and not _held()


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


def test_thresholds_come_back_when_stopping_the_progress_line_is_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second Ctrl-C while the progress line's thread is joined still puts the thresholds back."""
    from graphtrace.progress import Progress

    def interrupted(self: Progress) -> None:
        raise KeyboardInterrupt

    thresholds = gc.get_threshold()
    monkeypatch.setattr(Progress, "stop", interrupted)
    with pytest.raises(KeyboardInterrupt):
        graphtrace.capture(SeesTheCollector(), torch.ones(2, 4))
    assert gc.get_threshold() == thresholds and not _held()
