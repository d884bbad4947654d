"""The vectorised ``%.{p}e`` against Python's own, over millions of random and adversarial values of every dtype."""

from __future__ import annotations

import pytest
import torch

from graphtrace.io.sci_digits import MAX_PRECISION, sci_chars


def _expected(values: torch.Tensor, precision: int) -> list[str]:
    texts = ((f"%.{precision}e\n" * values.numel()) % tuple(values.tolist())).split("\n")[:-1]
    return [text if text.startswith("-") else " " + text for text in texts]


def _assert_as_python(values: torch.Tensor, precision: int = 4) -> None:
    doubles = values.to(torch.float64).flatten()
    chars, irregular = sci_chars(doubles, precision)
    width = precision + 7
    got = bytes(chars.flatten().tolist()).decode("ascii")
    flagged = irregular.tolist()
    for index, want in enumerate(_expected(doubles, precision)):
        if flagged[index]:
            assert len(want) != width, want  # only values of another form are left to the caller
        elif got[index * width : (index + 1) * width] != want:
            pytest.fail(f"{doubles[index].item()!r}: {got[index * width : (index + 1) * width]!r} != {want!r}")


def _adversarial(generator: torch.Generator, count: int, precision: int) -> torch.Tensor:
    """Decimal ties ``d.ddd5 * 10**e``, their neighbours, powers of ten and their neighbours."""
    mantissas = torch.randint(10**precision, 10 ** (precision + 1), (count,), generator=generator).double() + 0.5
    exponents = torch.randint(-30, 30, (count,), generator=generator).double()
    ties = mantissas * torch.pow(10.0, exponents - precision)
    powers = torch.pow(10.0, torch.arange(-40, 40, dtype=torch.float64))
    nines = powers * (1 - 0.5 * 10.0**-precision)  # 9.99995e-05 and its kind round up into the next exponent
    candidates = torch.cat([ties, powers, nines])
    up, down = torch.full_like(candidates, torch.inf), torch.full_like(candidates, -torch.inf)
    return torch.cat([candidates, candidates.nextafter(up), candidates.nextafter(down), -candidates])


SPECIAL = [0.0, -0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e300, 1.7976931348623157e308, 1e22, 1e23, 9.99995e-05]
SPECIAL += [99999.5, 999995.0, 0.5, 1.5, 2.5, 1e-45, 3.4028234663852886e38, 65504.0, 6e-8, 1e-40]
SPECIAL += [float("nan"), float("inf"), -float("inf")]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_random_and_adversarial_values_print_as_pythons(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(17)
    count = 400_000
    spread = torch.randn(count, generator=generator, dtype=torch.float64)
    spread *= torch.exp(torch.randn(count, generator=generator, dtype=torch.float64) * 12)
    values = torch.cat([spread, _adversarial(generator, 100_000, 4), torch.tensor(SPECIAL, dtype=torch.float64)])
    _assert_as_python(values.to(dtype))


def test_every_bfloat16_and_float16_value_prints_as_pythons() -> None:
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    _assert_as_python(every.view(torch.float16))
    _assert_as_python(every.view(torch.bfloat16))


@pytest.mark.parametrize("precision", range(1, MAX_PRECISION + 1))
def test_other_precisions_print_as_pythons(precision: int) -> None:
    generator = torch.Generator().manual_seed(precision)
    values = torch.randn(20_000, generator=generator, dtype=torch.float64) * 10 ** torch.randint(-8, 8, (20_000,))
    _assert_as_python(torch.cat([values, _adversarial(generator, 5_000, precision)]), precision)
