"""The repr lines of one forward's tensors: formatted one by one, or all together as the repr sink does.

    python -m benchmarks.repr_lines                 # the tiny Llama's module inputs and outputs
    python -m benchmarks.repr_lines --rounds 40

The tensors are every module's tensor inputs and outputs of one forward of the tiny Llama (as the unpruned shim
prints them). Timed in alternating rounds (one thread, ``time.process_time()``, medians): taking the printed elements
during the forward (``printed_values``, once per tensor), then formatting them one tensor at a time (``tolist()`` and
:func:`graphtrace.io.tensor_text.tensor_text`, the per-tensor path) or in one batch
(:func:`graphtrace.io.repr_batch.lines_of_all`). Both give the same lines, which is checked first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.models import build
from graphtrace.io.repr_batch import PrintedValues, lines_of_all
from graphtrace.io.tensor_repr import printed_values
from graphtrace.io.tensor_text import tensor_text


def forward_tensors(model: torch.nn.Module, inputs: dict[str, Any]) -> list[torch.Tensor]:
    """Every distinct tensor a module of ``model`` is called with or returns, in call order (a copy of each): what
    the shim prints (a tensor passed on unchanged is printed once)."""
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # by identity: the tensor (kept alive) and its copy

    def keep(values: Any) -> None:
        if isinstance(values, torch.Tensor):
            if id(values) not in seen:
                seen[id(values)] = (values, values.detach().clone())
        elif isinstance(values, (tuple, list)):
            for value in values:
                keep(value)
        elif isinstance(values, dict):
            for value in values.values():
                keep(value)

    def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        keep((args, kwargs, output))

    handles = [module.register_forward_hook(hook, with_kwargs=True) for module in model.modules()]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return [copy for _, copy in seen.values()]


def one_by_one(batch: list[PrintedValues | tuple[str, ...]]) -> list[tuple[str, ...]]:
    lines = []
    for printed in batch:
        if isinstance(printed, PrintedValues):
            values = printed.values.tolist() if isinstance(printed.values, torch.Tensor) else printed.values
            text = tensor_text(values, printed.shape, printed.floating, printed.suffixes, printed.options)
            lines.append(tuple(text.splitlines()))
        else:
            lines.append(printed)
    return lines


def _process_time_of(run: Callable[[], object]) -> float:
    started = time.process_time()
    run()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = build("tiny-llama")
    tensors = forward_tensors(model, inputs)
    batch = [printed_values(tensor) for tensor in tensors]
    assert lines_of_all(batch) == one_by_one(batch)
    values = sum(len(printed.values) for printed in batch if isinstance(printed, PrintedValues))
    runs: dict[str, Callable[[], object]] = {
        "taking the printed elements": lambda: [printed_values(tensor) for tensor in tensors],
        "formatting one tensor at a time": lambda: one_by_one(batch),
        "formatting all in one batch": lambda: lines_of_all(batch),
    }
    for run in runs.values():  # warm-up: caches of layouts and frames
        run()
    rounds = [{name: _process_time_of(run) for name, run in runs.items()} for _ in range(args.rounds)]
    print(f"tiny-llama: {len(tensors)} tensors, {values} printed values; torch {torch.__version__}, 1 thread, ", end="")
    print(f"median of {args.rounds} rounds")
    print(f"{'stage':<34} {'ms':>7} {'µs/tensor':>10} {'ns/value':>9}")
    for name in runs:
        median = statistics.median(spent[name] for spent in rounds)
        print(f"{name:<34} {median * 1e3:7.2f} {median * 1e6 / len(tensors):10.2f} {median * 1e9 / values:9.1f}")


if __name__ == "__main__":
    main()
