"""Where a capture's time goes on one model, stage by stage: each row adds one piece of work to the row above.

    python -m benchmarks.stages                  # the tiny Llama of the main benchmark (423 module calls)
    python -m benchmarks.stages --model t5-small --rounds 9

Medians of ``--rounds`` rounds in which the stages alternate (one thread). The saving rows time the writers alone on
a trace captured once. This is the profile behind the "where the tiny Llama's time goes" table of
docs/performance.md.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import graphtrace
from benchmarks.before_after import stages as capture_stages
from benchmarks.models import MODELS, build
from graphtrace.io.spec_json import write_spec_files
from graphtrace.io.trace_json import trace_text
from graphtrace.render import call_graph, to_dot, write_call_graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama", choices=list(MODELS))
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, inputs = build(args.model)
    out = Path(tempfile.mkdtemp())

    def plain() -> None:
        with torch.no_grad():
            model(**inputs)

    trace = graphtrace.capture(model, inputs, strategy="eager")
    step = trace.steps[-1]
    recording = capture_stages(graphtrace, model, inputs, out)  # the stages benchmarks.before_after compares
    del recording["  writing SUMMARY + FULL_TENSORS"]  # timed below, under the model's own class name
    stages: dict[str, Callable[[], object]] = {
        "plain forward": plain,
        **recording,
        "capture(path=...), values='repr', eager": lambda: graphtrace.capture(
            model, inputs, path=out / "capture", strategy="eager"
        ),
        "  writing SUMMARY + FULL_TENSORS text": lambda: write_spec_files(step, out, trace.meta.model_class),
        "  graphtrace's own trace file": lambda: trace_text(trace),
        "  call graph: networkx graph + DOT": lambda: to_dot(call_graph(trace)),
        "  call graph: all, `dot` included": lambda: write_call_graph(trace, out / "graph.svg"),
    }
    for run in stages.values():  # warm-up: imports, plans, the page cache
        run()
    times: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(args.rounds):
        for name, run in stages.items():
            started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - started)
    plain_time = statistics.median(times["plain forward"])
    calls = sum(1 for _ in trace.walk())
    print(f"{args.model}: {calls} module calls; torch {torch.__version__}, 1 thread, median of {args.rounds} rounds")
    print(f"{'stage':<56} {'ms':>8} {'x plain':>8} {'µs/call':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<56} {median * 1000:8.1f} {median / plain_time:8.2f} {median / calls * 1e6:8.1f}")


if __name__ == "__main__":
    main()
