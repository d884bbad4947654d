"""Tensor reprs rebuilt from the printed values: identical to torch's printer for every case it serves."""

from __future__ import annotations

import math
import random

import pytest
import torch

from graphtrace.io.repr_batch import BATCH_MIN_VALUES, lines_of_all
from graphtrace.io.tensor_repr import _printable_from_values, printed_values, repr_lines
from graphtrace.io.tensors import ReprSink
from graphtrace.reprs import SPEC_LINEWIDTH, spec_printoptions

SHAPES = [
    (),
    (1,),
    (6,),
    (7,),
    (1, 16, 64),
    (2, 3, 4, 5),
    (1000,),
    (1001,),
    (3, 400),
    (6, 6, 6, 6),
    (7, 7, 7),
    (1, 4, 16, 16),
    (2, 1, 3),
    (1, 1, 1, 1, 1200),
    (33, 31),
    (1, 16, 32),
]
DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def _torchs(t: torch.Tensor) -> tuple[str, ...]:
    with spec_printoptions(SPEC_LINEWIDTH):
        return tuple(repr(t).splitlines())


def _values(shape: tuple[int, ...], kind: str, scale: float, rng: random.Random) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    if kind == "normal":
        return torch.randn(shape, generator=generator, dtype=torch.float64) * scale
    if kind == "positive":
        return torch.rand(shape, generator=generator, dtype=torch.float64) * scale
    if kind == "integers":
        return torch.randint(-50, 50, shape, generator=generator).double()
    if kind == "zeros":
        return torch.zeros(shape, dtype=torch.float64)
    t = torch.randn(shape, generator=generator, dtype=torch.float64) * scale  # with special values
    flat = t.view(-1)
    for _ in range(min(4, flat.numel())):
        flat[rng.randrange(flat.numel())] = rng.choice([math.nan, math.inf, -math.inf, -0.0, 0.0])
    return t


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return t > 0
    if dtype.is_floating_point:
        return t.to(dtype)
    info = torch.iinfo(dtype)
    return torch.nan_to_num(t, posinf=0, neginf=0).clamp(info.min, info.max).to(dtype)


def _cases(dtype: torch.dtype) -> list[torch.Tensor]:
    rng = random.Random(str(dtype))
    cases = []
    for shape in SHAPES:
        for kind in ("normal", "positive", "integers", "zeros", "special"):
            for scale in (1e-30, 1e-5, 1.0, 7.0, 3e4, 1e200):
                t = _cast(_values(shape, kind, scale, rng), dtype)
                views = [t]
                if t.dim() >= 2:
                    views += [t.transpose(0, -1), t[..., ::2]]
                if t.numel() < 500:
                    views.append(t.expand(2, *t.shape))
                cases += [view for view in views if view.numel()]
    return cases


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_equal_to_torchs_printer(dtype: torch.dtype) -> None:
    for view in _cases(dtype):
        assert repr_lines(view) == _torchs(view), (view.shape, dtype)


@pytest.mark.parametrize("options", [{}, {"precision": 2}, {"precision": 7, "linewidth": 80}], ids=str)
def test_a_batch_of_mixed_tensors_equals_torchs_printer(options: dict[str, int]) -> None:
    """Formatted together (each tensor's fields filled into its own frame), as one by one."""
    torch.set_printoptions(**options)  # conftest puts the print options back after each test
    cases = [view for dtype in DTYPES for view in _cases(dtype)[:: 3 if not options else 17]]
    cases.append(torch.tensor([-0.0, 1.0, 2.0]))  # a negative zero in a tensor without a negative value
    batch = [printed_values(view) for view in cases]
    assert sum(p.values.numel() for p in batch if isinstance(p.values, torch.Tensor)) >= BATCH_MIN_VALUES
    for view, lines in zip(cases, lines_of_all(batch)):
        assert lines == _torchs(view), (view.shape, view.dtype)


def test_a_sink_prints_what_a_tensor_held_when_stored() -> None:
    sink = ReprSink()
    t = torch.linspace(-1.0, 1.0, 600).reshape(2, 300)
    whole, summarised = torch.linspace(-1.0, 1.0, 12), torch.linspace(0.5, 1.0, 2000)
    expected = [_torchs(t), _torchs(whole), _torchs(summarised)]
    stored = [sink.store(t, "t")[0], sink.store(whole, "whole")[0], sink.store(summarised, "summarised")[0]]
    for changed in (t, whole, summarised):
        changed.mul_(-3.0)  # the model changes them in place after the call
    sink.finish()
    assert stored == expected
    assert [tuple(lines) for lines in stored] == expected


def test_other_print_options_are_followed() -> None:
    t = torch.randn(5, 300, generator=torch.Generator().manual_seed(0))
    for options in ({"precision": 2}, {"threshold": 50}, {"edgeitems": 1}, {"precision": 7, "threshold": 10**9}):
        torch.set_printoptions(**options)  # conftest puts the print options back after each test
        assert repr_lines(t) == _torchs(t), options


def test_unusual_tensors_go_to_torchs_printer() -> None:
    options = (4, 1000, 3, 120)
    plain = torch.ones(3)
    assert _printable_from_values(plain, options)
    unusual = [
        torch.ones(3, requires_grad=True),
        torch.nn.Parameter(torch.ones(3)),
        torch.ones(3, dtype=torch.complex64),
        torch.ones(3).to_sparse(),
        torch.ones(3, device="meta"),
        torch.ones(3, dtype=torch.float8_e4m3fn),
        torch.empty(0),
    ]
    for t in unusual:
        assert not _printable_from_values(t, options), t.dtype
    for t in unusual[:4]:
        assert repr_lines(t) == _torchs(t)


def test_lines_read_under_another_default_device_are_torchs() -> None:
    """Lines are formatted when first read, perhaps where factories make tensors elsewhere: the batch stays on CPU."""
    sink = ReprSink()
    tensors = [torch.randn(16, 32, generator=torch.Generator().manual_seed(seed)) for seed in range(10)]
    stored = [sink.store(t, "t")[0] for t in tensors]
    with torch.device("meta"):
        lines = [tuple(value) for value in stored]
    assert lines == [_torchs(t) for t in tensors]


def test_lines_whose_formatting_failed_are_formatted_when_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphtrace.io import repr_batch

    sink = ReprSink()
    t = torch.linspace(-1.0, 1.0, 12)
    stored = sink.store(t, "t")[0]

    def interrupted(batch: object) -> list[tuple[str, ...]]:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(repr_batch, "lines_of_all", interrupted)
        with pytest.raises(KeyboardInterrupt):
            sink.finish()
    assert tuple(stored) == _torchs(t)


def test_lines_left_unfilled_by_an_interrupt_or_added_meanwhile_are_formatted_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An interrupt between two lines being filled, or a value stored while a read formats the batch (another thread),
    must never leave a value that reads as no lines."""
    from graphtrace.io import repr_batch

    batch = repr_batch.ReprBatch()
    tensors = [torch.linspace(-1.0, 1.0, 5) + i for i in range(3)]
    pending = [batch.add(printed_values(t)) for t in tensors]
    fill = repr_batch.PendingLines._fill
    filled: list[object] = []

    def interrupted_after_one(self: repr_batch.PendingLines, lines: tuple[str, ...]) -> None:
        if filled:
            raise KeyboardInterrupt
        filled.append(self)
        fill(self, lines)

    with monkeypatch.context() as patch:
        patch.setattr(repr_batch.PendingLines, "_fill", interrupted_after_one)
        with pytest.raises(KeyboardInterrupt):
            batch.format()
    assert [tuple(lines) for lines in pending] == [_torchs(t) for t in tensors]

    late: list[repr_batch.PendingLines] = []
    formatted = repr_batch.lines_of_all

    def while_formatting(items: list[object]) -> list[tuple[str, ...]]:
        late.append(batch.add(printed_values(tensors[0])))
        return formatted(items)  # type: ignore[arg-type]

    first = batch.add(printed_values(tensors[1]))
    with monkeypatch.context() as patch:
        patch.setattr(repr_batch, "lines_of_all", while_formatting)
        assert tuple(first) == _torchs(tensors[1])
    assert tuple(late[0]) == _torchs(tensors[0])
