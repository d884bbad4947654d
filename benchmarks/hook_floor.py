"""How close a capture is to what any forward hook must pay: bare hooks doing a given amount of tensor work beside
graphtrace itself, on one model, in rotating rounds, also the mean over captures (garbage collection included).

    python -m benchmarks.hook_floor                      # the tiny Llama of the main benchmark
    python -m benchmarks.hook_floor --model gpt2-small --rounds 9

The hooks are registered on every module (``register_forward_hook(with_kwargs=True)``) and walk the tensors of the
call's arguments and output, each tensor once per forward while it is unchanged (as graphtrace measures it):

* ``hook, nothing``: the hook is called and finds the tensors: what any recording costs before it computes;
* ``hook, sum+norm+aminmax``: the floor issue 17 measured, three reductions per tensor, values left on the device;
* ``hook, exact statistics``: what the transformers format needs of every floating tensor, mean, std, min and max,
  each computed as torch computes it and read as a Python float (graphtrace's statistics, without caching by
  identity, repr strings or records);
* ``hook, exact statistics + sketch``: the same, and graphtrace's value fingerprint (row-group sums and sums of
  squares) of each output.

Times are ``time.process_time()``; ratios are to the plain forward of the same round.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

import graphtrace
from benchmarks.models import MODELS, build
from graphtrace.engine.stats import row_sketch


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _nothing(tensor: torch.Tensor, output: bool) -> object:
    return None


def _issue_floor(tensor: torch.Tensor, output: bool) -> object:
    if not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    return tensor.sum(), tensor.norm(), torch.aminmax(tensor)


def _exact_statistics(tensor: torch.Tensor, output: bool) -> object:
    if not tensor.is_floating_point() or tensor.numel() < 2:
        return None
    low, high = torch.aminmax(tensor)
    return tensor.mean().item(), tensor.std().item(), low.item(), high.item()


def _with_sketch(tensor: torch.Tensor, output: bool) -> object:
    statistics_ = _exact_statistics(tensor, output)
    return statistics_, row_sketch(tensor) if output else None


def _hooked(
    model: nn.Module, inputs: dict[str, Any], work: Callable[[torch.Tensor, bool], object]
) -> Callable[[], list[object]]:
    def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        for value, is_output in ((args, False), (kwargs, False), (output, True)):
            for tensor in _tensors(value):
                key = (id(tensor), tensor._version)
                if key not in seen:  # as graphtrace: a tensor met again unchanged (the next call's input) once
                    seen[key] = tensor  # (kept alive, so that its id is not reused within the forward)
                    kept.append(work(tensor, is_output))

    kept: list[object] = []
    seen: dict[tuple[int, int], torch.Tensor] = {}

    def run() -> list[object]:
        kept.clear()
        seen.clear()
        handles = [module.register_forward_hook(hook, with_kwargs=True) for module in model.modules()]
        try:
            with torch.no_grad():
                model(**inputs)
        finally:
            for handle in handles:
                handle.remove()
        return kept

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama", choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = build(args.model)

    def plain() -> None:
        with torch.no_grad():
            model(**inputs)

    runs: dict[str, Callable[[], object]] = {
        "plain forward": plain,
        "hook, nothing": _hooked(model, inputs, _nothing),
        "hook, sum+norm+aminmax (issue 17's floor)": _hooked(model, inputs, _issue_floor),
        "hook, exact statistics": _hooked(model, inputs, _exact_statistics),
        "hook, exact statistics + sketch": _hooked(model, inputs, _with_sketch),
        "graphtrace values='none', eager": lambda: graphtrace.capture(model, inputs, values="none", strategy="eager"),
        "graphtrace values='none', auto": lambda: graphtrace.capture(model, inputs, values="none"),
        "graphtrace values='repr', eager": lambda: graphtrace.capture(model, inputs, strategy="eager"),
    }
    for run in runs.values():  # warm-up: imports, plans
        run()
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    collections = [0.0]

    def on_collection(phase: str, info: dict[str, int]) -> None:
        collections[0] += time.process_time() * (-1 if phase == "start" else 1)

    gc.callbacks.append(on_collection)
    try:
        for index in range(args.rounds):
            shift = index % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.process_time()
                runs[name]()
                times[name].append(time.process_time() - started)
    finally:
        gc.callbacks.remove(on_collection)
    plain_times = times["plain forward"]
    print(
        f"{args.model}, torch {torch.__version__}, 1 thread, {args.rounds} rounds, process_time; plain "
        f"{statistics.median(plain_times) * 1000:.2f} ms; garbage collection {collections[0] * 1000:.0f} ms in all"
    )
    print(f"{'run':<46} {'median ms':>9} {'x plain':>8} {'mean ms':>8} {'x plain':>8}")
    for name in names:
        values = times[name]
        ratios = [value / plain for value, plain in zip(values, plain_times)]
        mean = statistics.mean(values)
        print(
            f"{name:<46} {statistics.median(values) * 1000:9.2f} {statistics.median(ratios):8.2f} "
            f"{mean * 1000:8.2f} {mean / statistics.mean(plain_times):8.2f}"
        )


if __name__ == "__main__":
    main()
