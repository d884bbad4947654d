"""The fx coverage table of docs/fx.md: for every model of the test zoo, how many module calls torch.fx served, why
the others were captured by forward wrapping, and the capture time of strategy="auto" against strategy="eager".

    python -m benchmarks.fx_coverage                 # the zoo as built (decoders with their default use_cache=True)
    python -m benchmarks.fx_coverage --no-cache      # models that take use_cache get use_cache=False
    python -m benchmarks.fx_coverage llama t5        # some models only

Times are the best of ``--repeat`` captures (values="repr", one thread), after one warm-up capture of each strategy,
so the one-time import of torch.fx's fake tensors (a few seconds, once per process) is not in them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import graphtrace
from tests.zoo import FX_ZOO


def _best_time(run: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def _reasons(eager: dict[str, int], width: int = 70) -> str:
    """The reasons of the eager calls, most calls first, shortened for a table cell."""
    parts = []
    for reason, calls in sorted(eager.items(), key=lambda item: (-item[1], item[0])):
        text = reason if len(reason) <= width else reason[: width - 1] + "…"
        parts.append(f"{calls} × {text}".replace("|", "\\|"))
    return "<br>".join(parts) or "—"


def row(name: str, *, no_cache: bool, repeat: int) -> str:
    model, inputs = FX_ZOO[name]()
    config = getattr(model, "config", None)
    if no_cache and config is not None and hasattr(config.get_text_config(), "use_cache"):
        inputs = {**inputs, "use_cache": False}
    for strategy in ("eager", "auto"):  # warm-up: first forwards, lazy imports
        graphtrace.capture(model, inputs, strategy=strategy)  # type: ignore[arg-type]
    eager = _best_time(lambda: graphtrace.capture(model, inputs, strategy="eager"), repeat)
    auto = _best_time(lambda: graphtrace.capture(model, inputs, strategy="auto"), repeat)
    coverage = graphtrace.capture(model, inputs).coverage()
    return (
        f"| {name} | {coverage.module_calls} | {coverage.fx} ({coverage.fraction:.0%}) "
        f"| {_reasons(dict(coverage.eager))} | {eager * 1000:.1f} | {auto * 1000:.1f} | {auto / eager:.1f}× |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(FX_ZOO), help="zoo models (default: all)")
    parser.add_argument("--no-cache", action="store_true", help="pass use_cache=False where the model takes it")
    parser.add_argument("--repeat", type=int, default=3, help="captures per strategy; the best time counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | module calls | served by fx | eager: calls × reason | eager (ms) | auto (ms) | auto / eager |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for name in args.models:
        print(row(name, no_cache=args.no_cache, repeat=args.repeat), flush=True)


if __name__ == "__main__":
    main()
