"""The quick benchmark's graphtrace modes before and after a change, interleaved in one process.

    python -m benchmarks.before_after_modes --base c8dffcf                   # the tiny Llama
    python -m benchmarks.before_after_modes --base c8dffcf --model t5-small --rounds 9

What ``python -m benchmarks --quick`` times of graphtrace (``capture(path=...)`` in its modes, the pruned shim), for
the working tree and for ``--base`` imported beside it (``benchmarks.before_after``), every mode of both and a plain
forward in every round in a rotating order: on a shared machine whose speed drifts, two separate runs of the quick
benchmark cannot be compared, this can. Printed in wall time (as the quick benchmark; ``dot`` is another process)
and in CPU time: medians, and ratios to the plain forward of the same round with their interquartile range.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.before_after import print_table, run_comparison

_CAPTURES = (
    ("repr", "auto"),
    ("repr", "eager"),
    ("none", "eager"),
    ("safetensors", "eager"),
    ("bundle", "eager"),
)


def modes(package: Any, model: torch.nn.Module, inputs: dict[str, Any], out: Path) -> dict[str, Callable[[], object]]:
    """The quick benchmark's graphtrace modes, run by ``package`` (the working tree's graphtrace or the base's)."""

    def capture(values: str, strategy: str) -> Callable[[], object]:
        return lambda: package.capture(
            model, inputs, path=out / f"{values}-{strategy}", values=values, strategy=strategy
        )

    def shim() -> None:
        with (
            torch.no_grad(),
            package.model_addition_debugger_context(model, debug_path=str(out / "shim"), do_prune_layers=True),
        ):
            model(**inputs)

    runs: dict[str, Callable[[], object]] = {
        f"capture {values} {strategy}": capture(values, strategy) for values, strategy in _CAPTURES
    }
    runs["shim repr pruned"] = shim
    return runs


def main() -> None:
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    args, names, times = run_comparison(__doc__ or "", modes, 9, clocks)
    for clock in clocks:
        plain = statistics.median(times["plain forward", "", clock]) * 1000
        print(
            f"{args.model}, torch {torch.__version__}, 1 thread, {args.rounds} rounds, {clock} time medians; "
            f"plain {plain:.2f} ms; base {args.base}"
        )
        print_table(names, times, clock)
        print()


if __name__ == "__main__":
    main()
