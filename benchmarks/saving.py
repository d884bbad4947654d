"""What ``capture(path=...)`` costs beyond recording, before and after a change, interleaved in one process.

    python -m benchmarks.saving --base 2d510ed               # the working tree against commit 2d510ed
    python -m benchmarks.saving --base main --rounds 30

The tiny Llama's trace is captured once by each side; then, in every round and in a rotating order, each side saves
it (the spec files, graphtrace's own file, the call graph drawn by Graphviz) and runs ``capture(path=...)`` whole,
beside a plain forward. Graphviz's ``dot`` is another process, so its time shows only in wall time: both wall time
(``time.perf_counter``) and the Python process's own CPU time (``time.process_time``) are printed, as medians and
ratios to the plain forward of the same round. The base is imported as :mod:`benchmarks.before_after` does.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.before_after import print_table, run_comparison

_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def stages(package: Any, model: torch.nn.Module, inputs: dict[str, Any], out: Path) -> dict[str, Callable[[], object]]:
    trace = package.capture(model, inputs, strategy="eager")
    saving = importlib.import_module(f"{package.__name__}.saving")
    trace_json = importlib.import_module(f"{package.__name__}.io.trace_json")
    spec_json = importlib.import_module(f"{package.__name__}.io.spec_json")
    return {
        "capture(path=...), eager": lambda: package.capture(model, inputs, path=out / "eager", strategy="eager"),
        "capture(path=...), auto": lambda: package.capture(model, inputs, path=out / "auto"),
        "  save(trace): all files and the picture": lambda: saving.save(trace, out / "saved"),
        "  save(trace, graph=False): no call graph": lambda: saving.save(trace, out / "saved", graph=False),
        "    graphtrace's own file (text)": lambda: trace_json.trace_text(trace),
        "    SUMMARY + FULL_TENSORS (written)": lambda: spec_json.write_spec_files(trace.steps[-1], out, "Spec"),
        "    the call graph alone (`dot` waited for)": lambda: saving.save_call_graph(trace, out),
    }


def main() -> None:
    args, names, times = run_comparison(__doc__ or "", stages, 20, _CLOCKS)
    print(f"{args.model}, torch {torch.__version__}, 1 thread, {args.rounds} rounds, medians; base {args.base}")
    for clock in _CLOCKS:
        print(f"\n{clock} time; plain forward {statistics.median(times['plain forward', '', clock]) * 1000:.2f} ms")
        print_table(names, times, clock)


if __name__ == "__main__":
    main()
