"""Capture reads tensors back to the host a constant number of times per step, never once per recorded tensor.

On an accelerator every ``.item()``, ``.tolist()``, ``float(t)``, ``.cpu()`` or blocking copy to the host waits for
all queued kernels. Capture computes statistics, NaN/Inf counts and value fingerprints on the tensor's own device and
reads them back once when the step ends; repr text and full values are copied to the host without waiting. The CPU,
where a read waits for nothing, reads each tensor's numbers at once (it costs less there); emptying
``step_numbers.READ_AT_ONCE`` runs it through the device path, so counting the host reads of such a CPU capture
shows what a device capture would wait for (only the copies to the host are skipped: the values are there). The
count is taken for the same architecture at two depths: what capture adds to the model's own reads must be the same
for both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

import graphtrace
from graphtrace.engine import step_numbers
from tests import zoo

_METHODS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "numpy", "cpu")


class HostReads:
    """Counts the host reads made on the thread that counts (the forward's), by kind; a read made inside another
    (a patched method called again through a torch function mode) counts once."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.thread = threading.get_ident()
        self.depth = 0

    def add(self, kind: str) -> None:
        if threading.get_ident() == self.thread and self.depth == 0:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _counted(reads: HostReads, kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.add(kind)
        reads.depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            reads.depth -= 1

    return counted


def _counted_to(reads: HostReads, original: Callable[..., Any]) -> Callable[..., Any]:
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        targets = [a for a in (*args, kwargs.get("device")) if isinstance(a, (str, torch.device))]
        waits = not kwargs.get("non_blocking", False) and not (len(args) > 1 and args[1] is True)
        if targets and waits and torch.device(targets[0]).type == "cpu":  # a dtype change alone reads nothing
            reads.add("to(cpu)")
        reads.depth += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            reads.depth -= 1

    return to


@contextmanager
def counting_host_reads() -> Iterator[HostReads]:
    """Every way a tensor's values reach Python, and every wait for a device, counted while the block runs."""
    reads = HostReads()
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, replacement: Any) -> None:
        saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, replacement)

    for name in _METHODS:
        patch(torch.Tensor, name, _counted(reads, name, getattr(torch.Tensor, name)))
    patch(torch.Tensor, "to", _counted_to(reads, torch.Tensor.to))
    patch(torch, "equal", _counted(reads, "equal", torch.equal))
    patch(torch.cuda, "synchronize", _counted(reads, "cuda.synchronize", torch.cuda.synchronize))
    try:
        yield reads
    finally:
        for owner, name, value in reversed(saved):
            if value is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


_MISSING = object()


class Model(NamedTuple):
    module: torch.nn.Module
    inputs: dict[str, Any]
    own_reads: int
    """The host reads of a plain forward: the model's own."""
    tensors: int
    """The tensors one step records."""


class Layer(torch.nn.Module):
    """Passes integer, boolean, half and double tensors between layers as well as the hidden states."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(
        self, hidden: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.linear(hidden).masked_fill(mask, 0.0)
        return out, ids + 1, mask, out.to(torch.bfloat16).double()


class Stack(torch.nn.Module):
    def __init__(self, layers: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(layers))

    def forward(self, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        mask = ids % 3 == 0
        for layer in self.layers:
            hidden, ids, mask, _ = layer(hidden, ids, mask)
        return hidden


def _stack(layers: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    torch.manual_seed(0)
    return Stack(layers).eval(), {"hidden": torch.randn(2, 5, 8), "ids": torch.arange(10).view(2, 5, 1)}


@pytest.fixture(scope="module", params=["llama", "stack"])
def models(request: pytest.FixtureRequest) -> dict[int, Model]:
    """The same model at two depths: a Llama, and a stack of layers that pass tensors of every dtype along."""
    build = zoo.llama if request.param == "llama" else _stack
    models = {}
    for layers in (2, 6):
        module, inputs = build(layers)
        with torch.no_grad():
            module(**inputs)  # lazy imports and first-call work are not the model's reads per step
            with counting_host_reads() as reads:
                module(**inputs)
        trace = graphtrace.capture(module, inputs, values="none", strategy="eager")
        tensors = sum(1 for node in trace.walk() for _ in (*node.input_tensors(), *node.output_tensors()))
        models[layers] = Model(module, inputs, reads.total, tensors)
    return models


def _capture(options: dict[str, Any]) -> Callable[[torch.nn.Module, dict[str, Any], Path], Any]:
    def run(model: torch.nn.Module, inputs: dict[str, Any], directory: Path) -> Any:
        files = options.get("values") in ("safetensors", "bundle")
        return graphtrace.capture(model, inputs, path=directory if files else None, **options)

    return run


def _shim(use_repr: bool, prune: bool) -> Callable[[torch.nn.Module, dict[str, Any], Path], Any]:
    def run(model: torch.nn.Module, inputs: dict[str, Any], directory: Path) -> Any:
        with (
            torch.no_grad(),
            graphtrace.model_addition_debugger_context(
                model, debug_path=str(directory), do_prune_layers=prune, use_repr=use_repr
            ),
        ):
            model(**inputs)

    return run


RUNS = {
    "values=repr auto": _capture({"values": "repr"}),
    "values=repr eager": _capture({"values": "repr", "strategy": "eager"}),
    "values=none eager": _capture({"values": "none", "strategy": "eager"}),
    "values=none auto": _capture({"values": "none"}),
    "values=safetensors eager": _capture({"values": "safetensors", "strategy": "eager"}),
    "values=bundle eager": _capture({"values": "bundle", "strategy": "eager"}),
    "values=repr eager prune_layers": _capture({"values": "repr", "strategy": "eager", "prune_layers": True}),
    "ops=True eager": _capture({"values": "repr", "strategy": "eager", "ops": True}),
    "ops=True auto": _capture({"values": "repr", "ops": True}),
    "shim repr": _shim(True, False),
    "shim repr pruned": _shim(True, True),
    "shim safetensors": _shim(False, False),
}


def capture_reads(run: Callable[..., Any], model: Model, directory: Path) -> tuple[int, dict[str, int]]:
    """The host reads of one capture beyond the model's own, and all reads by kind, on the device path."""
    saved = step_numbers.READ_AT_ONCE
    step_numbers.READ_AT_ONCE = frozenset()
    try:
        run(model.module, model.inputs, directory / "warm")  # first-capture work (fx plans) is not a step's
        with counting_host_reads() as reads:
            run(model.module, model.inputs, directory / "counted")
    finally:
        step_numbers.READ_AT_ONCE = saved
    return reads.total - model.own_reads, reads.counts


@pytest.mark.parametrize("name", list(RUNS))
def test_host_reads_do_not_grow_with_recorded_tensors(name: str, models: dict[int, Model], tmp_path: Path) -> None:
    shallow, _ = capture_reads(RUNS[name], models[2], tmp_path / "2")
    deep, kinds = capture_reads(RUNS[name], models[6], tmp_path / "6")
    assert models[6].tensors > models[2].tensors + 30
    assert deep == shallow, f"{name}: {shallow} reads at 2 layers, {deep} at 6 ({kinds})"
    assert deep <= 8, f"{name}: {deep} host reads in one step ({kinds})"


def test_the_count_sees_the_cpu_path_read_each_tensor(models: dict[int, Model], tmp_path: Path) -> None:
    """The CPU path (READ_AT_ONCE as shipped) reads as it records: the counting catches reads that grow."""
    counts = []
    for layers in (2, 6):
        model = models[layers]
        run = RUNS["values=none eager"]
        run(model.module, model.inputs, tmp_path / "warm")
        with counting_host_reads() as reads:
            run(model.module, model.inputs, tmp_path / str(layers))
        counts.append(reads.total - model.own_reads)
    assert counts[1] > counts[0] + 30
