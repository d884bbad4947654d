"""Tensor differences: tolerances per dtype, statistics read from 5-digit strings, non-finite elements."""

from __future__ import annotations

import math

import pytest
import torch

from graphtrace.compare.measure import (
    MAX_DIMS_ORDERS,
    Tolerance,
    _may_be_reordered,
    dims_orders,
    measure,
    stats_close,
)
from graphtrace.model import Stats, TensorRecord


def _record(
    stats: Stats | None,
    spec: tuple[str, str, str, str] | None = None,
    dtype: str = "torch.float32",
    shape: tuple[int, ...] = (4,),
) -> TensorRecord:
    return TensorRecord(shape=shape, dtype=dtype, stats=stats, spec_stats=spec)


def test_default_tolerances_follow_torch_testing_per_dtype() -> None:
    default = Tolerance()
    assert default.for_dtypes("torch.float32", "torch.float32") == (1.3e-6, 1e-5)
    assert default.for_dtypes("torch.float32", "torch.bfloat16") == (1.6e-2, 1e-5)  # the looser of the two
    assert default.for_dtypes("torch.int64", "torch.int64") == (0.0, 0.0)
    assert Tolerance(rtol=0.0).for_dtypes("torch.float16", "torch.float16") == (0.0, 1e-5)
    for dtype, (rtol, atol) in [
        (torch.float16, (1e-3, 1e-5)),
        (torch.bfloat16, (1.6e-2, 1e-5)),
        (torch.float64, (1e-7, 1e-7)),
    ]:
        assert default.for_dtypes(str(dtype), str(dtype)) == (rtol, atol)
        x = torch.ones(3, dtype=dtype)  # torch agrees: just inside passes, just outside fails
        torch.testing.assert_close(x + (atol + rtol) * 0.5, x)
        with pytest.raises(AssertionError):
            torch.testing.assert_close(x + (atol + rtol) * 4, x)


def test_five_digit_statistics_count_their_rounding_and_exact_ones_do_not() -> None:
    exact = _record(Stats(-8.149512e-04, 1.0000004, -2.0, 2.0))
    printed = _record(
        Stats(-8.1495e-04, 1.0, -2.0, 2.0),
        ("tensor(-8.1495e-04)", "tensor(1.0000e+00)", "tensor(-2.0000e+00)", "tensor(2.0000e+00)"),
    )
    assert stats_close(exact, printed, 0.0, 0.0)  # within half a unit of the 5th digit
    other_exact = _record(Stats(-8.1495e-04, 1.0, -2.0, 2.0))
    assert not stats_close(exact, other_exact, 0.0, 0.0)
    zero = _record(Stats(0.0, 0.0, 0.0, 0.0), ("tensor(0.)", "tensor(0.)", "tensor(0.)", "tensor(0.)"))
    assert not stats_close(zero, _record(Stats(1e-9, 0.0, 0.0, 0.0)), 0.0, 0.0)  # "0." is exact
    assert stats_close(_record(Stats(math.nan, math.nan, 1, 1)), _record(Stats(math.nan, math.nan, 1, 1)), 0, 0)
    assert stats_close(_record(None), exact, 0, 0) is None


def test_values_nan_and_inf_agree_only_with_themselves() -> None:
    a = torch.tensor([1.0, math.nan, math.inf, -math.inf, 0.0, 2.0])
    b = torch.tensor([1.0, math.nan, math.inf, math.inf, 1e-6, 2.5])
    record = _record(None, shape=(6,))
    diff = measure("outputs", record, "outputs", record, Tolerance(rtol=0.1, atol=0.0), values=(a, b))
    assert diff.basis == "values" and diff.status == "diverged"
    assert diff.outside == 3  # -inf vs inf, 0 vs 1e-6 (atol 0), 2 vs 2.5 (more than 10 %)
    assert diff.max_abs == math.inf and diff.max_rel == math.inf
    assert diff.cosine == pytest.approx(
        float(
            torch.nn.functional.cosine_similarity(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1.0, 1e-6, 2.5]), dim=0)
        ),
        abs=1e-7,
    )
    assert "3 of 6 elements outside tolerance" in diff.reason
    same = measure("outputs", record, "outputs", record, Tolerance(), values=(a, a.clone()))
    assert same.status == "equal" and same.max_abs == 0 and same.cosine == 1.0 and same.outside == 0


def test_shapes_and_missing_statistics() -> None:
    a, b = _record(None, shape=(2, 3)), _record(None, shape=(3, 3))
    shape = measure("outputs", a, "outputs_0", b, Tolerance())
    assert shape.status == "diverged" and shape.reason == "shape [2, 3] vs [3, 3]" and shape.basis == "none"
    a, b = _record(None, shape=(2, 2, 3)), _record(None, shape=(2, 3, 2))  # which 2 is which: told by values only
    shape = measure("outputs", a, "outputs_0", b, Tolerance())
    assert shape.status == "unchecked" and "the same dims in another order" in shape.equivalence
    a, b = _record(None, shape=(2, 2, 3)), _record(None, shape=(3, 2, 3))
    shape = measure("outputs", a, "outputs_0", b, Tolerance())
    assert shape.status == "diverged" and shape.reason == "shape [2, 2, 3] vs [3, 2, 3]"
    ints = measure(
        "inputs_args_0",
        _record(None, dtype="torch.int64"),
        "inputs_args_0",
        _record(None, dtype="torch.int64"),
        Tolerance(),
    )
    assert ints.status == "unchecked" and ints.reason == ""
    half = measure("outputs", _record(None), "outputs", _record(Stats(0, 1, -1, 1)), Tolerance())
    assert half.status == "unchecked" and half.reason == "no statistics in A"


def _by_values(a: torch.Tensor, b: torch.Tensor) -> str:
    record = TensorRecord(shape=tuple(a.shape), dtype="torch.float32", stats=Stats(0.0, 1.0, -1.0, 1.0))
    return measure("outputs", record, "outputs", record, Tolerance(), (a, b)).status


def test_a_lean_far_below_the_element_tolerance_is_a_departure_and_rounding_is_not() -> None:
    """A norm's eps scales every element by a relative 1e-6 or less: every element is well within torch.testing's
    tolerance (atol 1e-5), but the differences lean one way far beyond their own scatter and beyond a few units of
    rounding. Two honest implementations differ by rounding that leans no way, or by less than those few units."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(22, 64, generator=generator) * 0.2 + torch.randn(64, generator=generator) * 0.2
    assert _by_values(a, a * (1 + 1e-6)) == "diverged"  # about 8 units of float32 rounding, every element within
    assert _by_values(a, a * (1 + 2e-7)) == "equal"  # under 2 units: as systematic as rounding may be
    rounded = ((a.double() * 3.0).float() / 3.0).float()  # rounded twice: differences of an ulp, both ways
    assert bool((rounded != a).any())
    assert _by_values(a, rounded) == "equal"
    noise = (torch.rand(a.shape, generator=generator) - 0.5) * 4e-7 * a.abs()  # up to 2 ulps either way, no lean
    assert _by_values(a, a + noise) == "equal"
    # scatter of up to 8e-6 (within atol): its mean lies beyond the few units of rounding by chance alone, but
    # within what that scatter allows
    scatter = (torch.rand(a.shape, generator=torch.Generator().manual_seed(2)) - 0.5) * 1.6e-5
    assert _by_values(a, a + scatter) == "equal"


def test_a_partial_rotary_layout_is_an_equivalence_even_in_one_row() -> None:
    """GPT-NeoX rotates the first quarter of each head's channels: a port's interleaved pairs there are the same
    values in another order, which one row (a decode step) proves by the candidate layouts alone."""
    a = torch.randn(1, 1, 64, generator=torch.Generator().manual_seed(3))
    heads = a.reshape(4, 16)
    turned = heads[:, :4].reshape(4, 2, 2).transpose(-1, -2).reshape(4, 4)  # half-split pairs -> adjacent pairs
    b = torch.cat([turned, heads[:, 4:]], dim=-1).reshape(1, 1, 64)
    record = TensorRecord(shape=(1, 1, 64), dtype="torch.float32", stats=Stats(0.0, 1.0, -1.0, 1.0))
    found = measure("outputs", record, "outputs", record, Tolerance(), (a, b))
    assert found.status == "equal"
    assert "the first 4 of each head of 16" in found.equivalence


def test_re_orderings_are_refused_at_once_only_when_no_re_ordering_could_agree() -> None:
    """Before any candidate layout is tried, the first rows must hold the same values within the row's largest
    tolerance (sorted, the closest matching): a row with elements of very different sizes, each moved within its
    own tolerance and re-ordered, passes; one element moved beyond every tolerance refuses them all."""
    generator = torch.Generator().manual_seed(5)
    a = torch.randn(4, 32, generator=generator, dtype=torch.float64) * torch.logspace(-3, 3, 32, dtype=torch.float64)
    rtol, atol = 1e-3, 1e-9
    sign = torch.where(torch.rand(a.shape, generator=generator) < 0.5, -1.0, 1.0)
    b = (a + 0.9 * (atol + rtol * a.abs()) * sign)[:, torch.randperm(32, generator=generator)]
    assert _may_be_reordered(a, b, rtol, atol)
    b[0, 0] += 1.0
    assert not _may_be_reordered(a, b, rtol, atol)
    record = TensorRecord(shape=(4, 32), dtype="torch.float64")
    shuffled = a[:, torch.randperm(32, generator=generator)]
    found = measure("outputs", record, "outputs", record, Tolerance(), (a, shuffled))
    assert found.status == "equal" and "permutation of the last dim" in found.equivalence
    assert measure("outputs", record, "outputs", record, Tolerance(), (a, shuffled), layout="").status == "diverged"


def test_an_element_near_zero_may_differ_by_rounding_of_the_tensors_large_elements() -> None:
    """By default atol is at least rtol times the largest magnitude among the elements that differ; explicit
    tolerances are isclose's."""
    a = torch.tensor([1.5, -1.25, 0.01, 0.5], dtype=torch.bfloat16)
    b = a.clone()
    b[0] += 2**-7  # one unit of bfloat16 rounding at magnitude 1-2, here and, almost twice the element, near zero
    b[2] += 2**-7
    record = TensorRecord(shape=(4,), dtype="torch.bfloat16", stats=Stats(0.0, 1.0, -1.0, 1.0))
    assert measure("outputs", record, "outputs", record, Tolerance(), (a, b)).status == "equal"
    explicit = Tolerance(rtol=1.6e-2, atol=1e-5)
    assert measure("outputs", record, "outputs", record, explicit, (a, b)).status == "diverged"
    b[2] += 2**-4  # beyond 1.6e-2 of the largest magnitude
    assert measure("outputs", record, "outputs", record, Tolerance(), (a, b)).status == "diverged"


def test_the_same_dims_in_another_order_compare_as_one_layout() -> None:
    """A Megatron style port keeps activations [T, B, D] where the original keeps [B, T, D]: its values, laid out as
    the original's, are compared, and a difference is still found; statistics do not depend on the order."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 4)
    a, b = _record(_stats(x), shape=(2, 5, 4)), _record(_stats(x), shape=(5, 2, 4))
    same = measure("outputs", a, "outputs", b, Tolerance(), (x, x.transpose(0, 1).contiguous()))
    assert same.status == "equal" and same.basis == "values", same
    assert same.equivalence == "shapes [2, 5, 4] and [5, 2, 4]: the same dims in another order"
    moved = x.transpose(0, 1).contiguous()
    moved[3, 1, 2] += 1.0
    assert measure("outputs", a, "outputs", b, Tolerance(), (x, moved)).outside == 1
    # a transpose is not the identity: the same values in the order they lie in memory differ
    assert measure("outputs", a, "outputs", b, Tolerance(), (x, x.reshape(5, 2, 4))).status == "diverged"
    assert measure("outputs", a, "outputs", b, Tolerance()).status == "equal"  # by statistics
    channels_first = _record(_stats(x), shape=(2, 4, 5))
    assert measure("outputs", a, "outputs", channels_first, Tolerance(), (x, x.transpose(1, 2))).status == "equal"


def _stats(x: torch.Tensor) -> Stats:
    return Stats(x.mean().item(), x.std().item(), x.min().item(), x.max().item())


def test_the_orders_of_dims_of_one_size_are_generated_lazily_and_capped() -> None:
    """Twelve dims of one size allow 479,001,600 orders: a hostile shape must not hang the diff."""
    orders = dims_orders((2,) * 12 + (3,), (3,) + (2,) * 12)
    assert len(orders) == MAX_DIMS_ORDERS
    assert orders[0] == (*range(1, 13), 0)  # dims of one size first keep their order
    assert dims_orders((2, 3, 3, 4), (2, 4, 3, 3)) == [(0, 2, 3, 1), (0, 3, 2, 1)]
    assert dims_orders((5, 3, 4), (4, 5, 3)) == [(1, 2, 0)] and dims_orders((2, 3), (2, 3)) == []


def test_padding_up_to_size_one_dims_in_front_and_never_of_an_empty_tensor() -> None:
    def record(shape: tuple[int, ...]) -> TensorRecord:
        return TensorRecord(shape=shape, dtype="torch.float32", stats=Stats(0.0, 1.0, -1.0, 1.0))

    logits = torch.randn(1, 5, 40)
    # a vLLM style head over the tokens flattened, its vocabulary padded: [5, 64] for [1, 5, 40]
    flat = torch.cat([logits[0], torch.zeros(5, 24)], dim=-1)
    by_stats = measure("o", record((1, 5, 40)), "o", record((5, 64)), Tolerance())
    assert by_stats.status == "diverged" and by_stats.padded, by_stats
    by_values = measure("o", record((1, 5, 40)), "o", record((5, 64)), Tolerance(), (logits, flat))
    assert by_values.status == "equal" and "padded from 40 to 64" in by_values.equivalence, by_values
    # padded in front (reserved ids first): the last entries are A's
    front = torch.cat([torch.zeros(1, 5, 24), logits], dim=-1)
    by_values = measure("o", record((1, 5, 40)), "o", record((1, 5, 64)), Tolerance(), (logits, front))
    assert by_values.status == "equal" and "its last 40 compared" in by_values.equivalence, by_values
    wrong = front.clone()
    wrong[0, 0, -1] += 1.0
    by_values = measure("o", record((1, 5, 40)), "o", record((1, 5, 64)), Tolerance(), (logits, wrong))
    assert by_values.status == "diverged" and by_values.outside == 1, by_values
    # an empty tensor shares nothing with B's: no padding, a departure
    for shape in ((0,), (2, 0)):
        full = (*shape[:-1], 5)
        empty = measure("o", record(shape), "o", record(full), Tolerance(), (torch.zeros(shape), torch.randn(full)))
        assert empty.status == "diverged" and not empty.padded, empty


def _outside_by_definition(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, masked: torch.Tensor) -> int:
    """Elements outside ``atol + rtol * |a|`` (normwise: atol at least rtol times the largest |a| among the finite
    elements that differ and are masked in neither), counted one by one in float64: what measure must find."""
    a, b = a.double(), b.double()
    finite = a.isfinite() & b.isfinite()
    same = (a == b) | (a.isnan() & b.isnan()) | masked
    differing = finite & ~same
    largest = float(a[differing].abs().max()) if bool(differing.any()) else 0.0
    atol = max(atol, rtol * largest)
    outside = ~same & (~finite | ~((b - a).abs() <= atol + rtol * a.abs()))
    return int(outside.sum())


@pytest.mark.parametrize("dtype_b", [torch.float32, torch.bfloat16])
def test_normwise_counts_over_several_slices_with_a_nan_and_masks_in_one_of_them(dtype_b: torch.dtype) -> None:
    """The tolerance grows with the largest differing magnitude, known only at the end; slices without NaN, infinity
    or mask take a shorter path than those with: the count must be the same as element by element."""
    from graphtrace.compare.measure import SLICE

    n = 3 * SLICE + 17
    a = torch.randn(n, generator=torch.Generator().manual_seed(0))
    a[SLICE + 5 : SLICE + 9] = torch.finfo(torch.float32).min  # an additive mask's stand-ins, in one slice only
    b = a.to(dtype_b, copy=True)
    b[SLICE + 5 : SLICE + 9] = 0.9 * torch.finfo(dtype_b).min  # another mask value, in B's dtype: alike
    b[40] = math.nan  # a NaN in B only, in another slice than the masks
    b[2 * SLICE + 3 : 2 * SLICE + 300] += 0.5  # a departure in another slice
    a[-1], b[-1] = 60.0, 61.0  # the largest differing magnitude, in the last (short) slice
    a[10:20], b[10:20] = 1e-3, 1e-3 + 5e-5  # outside atol 1e-5, inside the normwise atol (rtol times 60)
    record_a = _record(None, shape=(n,))
    record_b = _record(None, dtype=str(dtype_b), shape=(n,))
    diff = measure("outputs", record_a, "outputs", record_b, Tolerance(), values=(a, b))
    rtol, atol = Tolerance().for_dtypes("torch.float32", str(dtype_b))
    masked = torch.zeros(n, dtype=torch.bool)
    masked[SLICE + 5 : SLICE + 9] = True
    expected = _outside_by_definition(a, b.float(), rtol, atol, masked)
    assert expected < _outside_by_definition(a, b.float(), 0.0, atol, masked)  # the normwise atol counts here
    assert diff.status == "diverged" and diff.outside == expected and diff.max_abs == math.inf


def test_normwise_read_once_it_matters_counts_the_slices_before_it_again() -> None:
    """Every element ordinary: the normwise atol is read over the whole tensor the first time a slice holds an
    element beyond the given atol (here slice 1), and the largest differing magnitude lies in a later slice."""
    from graphtrace.compare.measure import SLICE

    n = 4 * SLICE
    a = torch.randn(n, generator=torch.Generator().manual_seed(0))
    b = a.clone()
    b[SLICE + 3 : SLICE + 13] += 4e-5  # beyond atol 1e-5, within the final atol (rtol times 50)
    b[SLICE + 20] += 1.0  # beyond both
    a[3 * SLICE + 1], b[3 * SLICE + 1] = 50.0, 50.5  # the largest differing magnitude, two slices later
    record = _record(None, shape=(n,))
    diff = measure("outputs", record, "outputs", record, Tolerance(), values=(a, b))
    rtol, atol = Tolerance().for_dtypes("torch.float32", "torch.float32")
    none = torch.zeros(n, dtype=torch.bool)
    expected = _outside_by_definition(a, b, rtol, atol, none)
    assert expected == 2 < _outside_by_definition(a, b, 0.0, atol, none)
    assert diff.outside == expected


def test_float64_values_whose_squares_overflow_are_measured_with_their_cosine() -> None:
    """Elements near 1e300 square beyond float64: the spread over several slices and the cosine are still read
    (each tensor scaled by its largest magnitude for the cosine), never an OverflowError."""
    n = 70_000  # three slices
    a = torch.full((n,), 1e300, dtype=torch.float64)
    a[40_000:] = -1e300
    b = a.clone()
    b[5], b[50_000] = -1e300, 1e300
    record = TensorRecord(shape=(n,), dtype="torch.float64")
    found = measure("outputs", record, "outputs", record, Tolerance(), (a, b))
    assert found.status == "diverged" and found.outside == 2 and found.max_abs == 2e300
    assert found.cosine == pytest.approx(1 - 4 / n, rel=1e-12)
