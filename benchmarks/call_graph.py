"""How long drawing the call graph takes: building the graph, writing DOT, and Graphviz's dot drawing the SVG.

Goal (issue 4): the default graph of a 16-layer Llama is well under 150 boxes and renders in seconds; the graph that
capture() draws beside every saved trace adds little to saving it.

    python benchmarks/call_graph.py            # prints one row per case; numbers are the best of 3 runs
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import graphtrace  # noqa: E402
from graphtrace.render import boxes, call_graph, to_dot, write_graph  # noqa: E402
from tests.zoo import llama, t5  # noqa: E402


def best_of(runs: int, work: Callable[[], Any]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    torch.set_num_threads(1)
    traces = {}
    builders = {"llama-16": lambda: llama(layers=16), "llama-64": lambda: llama(layers=64), "t5-3": t5}
    for name, build in builders.items():
        model, inputs = build()
        traces[name] = graphtrace.capture(model, inputs)
    cases = [
        ("llama-16", {}),
        ("llama-16", {"unfold": True}),
        ("llama-16", {"unfold": True, "max_boxes": None}),
        ("llama-64", {}),
        ("llama-64", {"unfold": True, "max_boxes": None}),
        ("t5-3", {}),
    ]
    print(f"{'trace':<10} {'options':<36} {'calls':>6} {'boxes':>6} {'graph':>8} {'dot text':>9} {'dot -Tsvg':>10}")
    with tempfile.TemporaryDirectory() as scratch:
        for name, options in cases:
            trace = traces[name]
            graph = call_graph(trace, **options)
            build = best_of(3, lambda trace=trace, options=options: call_graph(trace, **options))
            text = best_of(3, lambda graph=graph: to_dot(graph))
            svg = best_of(3, lambda graph=graph: write_graph(graph, Path(scratch) / "graph.svg")) - text
            calls = graph.graph["calls"]
            print(
                f"{name:<10} {str(options):<36} {calls:>6} {len(boxes(graph)):>6} {build:>7.3f}s {text:>8.3f}s "
                f"{svg:>9.3f}s"
            )
        trace = traces["llama-16"]
        plain = best_of(3, lambda: trace.save(Path(scratch) / "plain", graph=False))
        drawn = best_of(3, lambda: trace.save(Path(scratch) / "drawn"))
        print(f"\nsaving the llama-16 trace: {plain:.3f}s without the call graph, {drawn:.3f}s with it")


if __name__ == "__main__":
    main()
