"""A step's numbers read back together: the records end up exactly as if each tensor had been read at once.

No device here: the CPU is run through the device path by emptying ``step_numbers.READ_AT_ONCE``, the same code a
device capture takes (only the copies to the host are skipped: the values are there already)."""

from __future__ import annotations

import math
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import graphtrace
from graphtrace.engine import step_numbers
from graphtrace.engine.stats import row_sketch, summarize
from graphtrace.io.host_copy import HostTensor, to_host
from graphtrace.io.repr_batch import lines_of_all
from graphtrace.io.tensor_repr import printed_values
from graphtrace.io.tensors import SafetensorsSink, load_tensor
from graphtrace.model import CallNode, TensorRecord


class Mixed(torch.nn.Module):
    """Returns tensors of every kind a record holds numbers for, one of them changed in place after it was
    returned by a child (its record must keep the values it had then)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        special = x.clone()
        special[0, 1] = math.nan
        special[1, 2] = math.inf
        special[2, 0] = -math.inf
        changed = self.inner(special.clone())  # recorded now with NaN and Inf in it
        changed.zero_()  # and no longer holds them
        return (
            self.inner(x * 3),
            self.inner(special),
            x.to(torch.float16),
            x.to(torch.bfloat16),
            x.double(),
            (x > 0).int(),
            x > 0,
            x.sum(),
            x[:1, :1].clone(),
            changed,
        )


def _tensors(module: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The tensors each call returned, copied as they were when returned, in the order capture records them."""
    seen: list[torch.Tensor] = []

    def keep(_: Any, __: Any, output: Any) -> None:
        outputs = output if isinstance(output, tuple) else (output,)
        seen.extend(t.detach().clone() for t in outputs)

    handles = [m.register_forward_hook(keep) for m in module.modules()]
    try:
        with torch.no_grad():
            module(x)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _outputs(trace: graphtrace.Trace) -> list[TensorRecord]:
    """The output records of every call in the order the calls returned (children before their callers)."""
    records: list[TensorRecord] = []

    def visit(node: CallNode) -> None:
        for child in node.children:
            visit(child)
        records.extend(record for _, record in node.output_tensors())

    visit(trace.steps[0])
    return records


def _expected(tensor: torch.Tensor) -> tuple[Any, ...]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = summarize(tensor)
    return (*summary, row_sketch(tensor))


def _numbers(record: TensorRecord) -> tuple[Any, ...]:
    return record.stats, record.spec_stats, record.nan_count, record.inf_count, record.sketch


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return repr(a) == repr(b)  # NaN equal to NaN


@pytest.fixture
def device_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step_numbers, "READ_AT_ONCE", frozenset())


def _check(module: torch.nn.Module) -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    expected = [_expected(t) for t in _tensors(module, x)]
    trace = graphtrace.capture(module, (x,), values="none", strategy="eager")
    got = [_numbers(record) for record in _outputs(trace)]
    assert len(got) == len(expected)
    for index, (have, want) in enumerate(zip(got, expected)):
        assert _same(have, want), (index, have, want)


@pytest.mark.parametrize("path", ["device", "cpu"])
def test_records_hold_what_reading_each_tensor_at_once_gives(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "device":
        monkeypatch.setattr(step_numbers, "READ_AT_ONCE", frozenset())
    _check(Mixed())
    trace = graphtrace.capture(Mixed(), (torch.randn(4, 5),), values="none", strategy="eager")
    changed, _, special = _outputs(trace)[:3]
    assert (special.nan_count, special.inf_count) == (1, 2)
    assert (changed.nan_count, changed.inf_count) == (1, 2)  # as it was when its call returned it


@pytest.mark.usefixtures("device_path")
def test_a_full_queue_is_read_early_with_the_same_results(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []
    original = step_numbers.StepNumbers.read

    def counted(self: step_numbers.StepNumbers) -> None:
        reads.append(len(self._fills))
        original(self)

    monkeypatch.setattr(step_numbers.StepNumbers, "read", counted)
    monkeypatch.setattr(step_numbers, "MAX_QUEUED", 8)
    _check(Mixed())
    assert len([n for n in reads if n]) > 2


@pytest.mark.usefixtures("device_path")
def test_copies_of_pending_records_are_completed_too(tmp_path: Path) -> None:
    """Values, layer pruning's placeholders and fingerprints added later make copies of records still waiting."""
    from tests import zoo

    model, inputs = zoo.llama()
    for values, prune in (("repr", True), ("bundle", False), ("safetensors", True)):
        trace = graphtrace.capture(model, inputs, path=tmp_path / values, values=values, prune_layers=prune)
        for node in trace.walk():
            for _, record in (*node.input_tensors(), *node.output_tensors()):
                if record.dtype.startswith("torch.float"):
                    assert record.stats is not None and record.spec_stats is not None, (node.id, values)
    with torch.no_grad():
        logits = model(**inputs).logits
    last = trace.steps[0].outputs
    assert isinstance(last, dict)
    assert last["logits"].stats.mean == logits.mean().item()  # type: ignore[union-attr]


def test_spec_strings_carry_the_device_suffix_torch_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the default device is another (a CUDA default tensor type), torch prints ``device='cpu'`` after a CPU
    tensor's values, in the 0-d results and in full reprs alike; the strings made without torch's printer carry it
    the same way, wrapped as torch wraps it."""
    t = torch.randn(3, 300, generator=torch.Generator().manual_seed(1))
    small = torch.tensor([[1.5, -2.25], [3.0, 4.0]], dtype=torch.float16)
    monkeypatch.setattr(torch._C, "_get_default_device", lambda: "cuda")
    for tensor in (t, small, t.to(torch.bfloat16), torch.tensor([2, 3])):
        for linewidth in (80, 60) if tensor.dtype.is_floating_point else ():
            with (
                warnings.catch_warnings(),
                torch._tensor_str.printoptions(sci_mode=True, linewidth=linewidth),
            ):
                warnings.simplefilter("ignore")
                want = tuple(repr(r) for r in (tensor.mean(), tensor.std(), tensor.min(), tensor.max()))
                assert summarize(tensor).spec_stats == want
                assert "device='cpu'" in want[0]
        with torch._tensor_str.printoptions(sci_mode=True, linewidth=120):
            text = repr(tensor)
        assert "device='cpu'" in text
        assert lines_of_all([printed_values(tensor)])[0] == tuple(text.splitlines())


class _Event:
    """Stands in for a device event: records who waited for it, and on which thread."""

    def __init__(self) -> None:
        self.waits: list[int] = []

    def synchronize(self) -> None:
        self.waits.append(threading.get_ident())


def test_copies_from_a_device_are_waited_for_once_before_they_are_read(tmp_path: Path) -> None:
    event = _Event()
    x = torch.randn(5, 7)
    printed = printed_values(x)._replace(ready=event)
    lines = lines_of_all([printed, printed_values(x)._replace(ready=event)])
    assert lines[0] == lines[1] and event.waits == [threading.get_ident()]

    writing = _Event()
    sink = SafetensorsSink(tmp_path)
    try:
        sink.store_snapshot(HostTensor(x.clone(), writing), "x")
        sink.finish()
    finally:
        sink.close()
    assert writing.waits and writing.waits[0] != threading.get_ident()  # by the writer's thread
    assert torch.equal(load_tensor(tmp_path, "./x.safetensors"), x)


def test_a_cpu_tensor_is_its_own_host_copy() -> None:
    x = torch.randn(3)
    host = to_host(x)
    assert host.data is x and host.ready is None and host.wait() is x
