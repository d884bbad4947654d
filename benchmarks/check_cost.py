"""What `graphtrace check` costs against a capture of the port: GPT-2 small, 128 tokens (issue 26).

    python benchmarks/check_cost.py [--rounds 5]

The original is transformers' GPT2LMHeadModel with GPT-2 small's shapes (random weights, nothing downloaded), its
trace saved once with values="bundle". The port is the nanoGPT-style GPT-2 of tests/independent_gpt2.py with the
original's weights: faithful, and with two bugs (a LayerNorm's eps in the last block, block 0's attention output
scaled by 1.0001). Each round times, in a rotating order, a capture of the port (``graphtrace.capture(port, inputs)``,
the defaults) and the check of each port against the saved trace; printed are the median times and the median of
the per-round ratios to the capture.
Goal: the check at most 3x a capture of the port.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import graphtrace  # noqa: E402
from benchmarks.models import gpt2_small  # noqa: E402
from tests import independent_gpt2  # noqa: E402
from tests.check_ports import SMALL, scaled  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    original, inputs = gpt2_small()
    ids = inputs["input_ids"]
    faithful = independent_gpt2.port_of(original)
    buggy = independent_gpt2.port_of(original, bug="eps")
    scaled(buggy.h[0].attn.out, SMALL)
    with tempfile.TemporaryDirectory() as tmp:
        reference = Path(tmp) / "original"
        graphtrace.capture(original, inputs, path=reference, values="bundle")
        saved = Path(tmp) / "port"
        modes: dict[str, Callable[[], object]] = {
            "capture of the port": lambda: graphtrace.capture(faithful, (ids,)),
            "capture, bundle, saved": lambda: graphtrace.capture(faithful, (ids,), path=saved, values="bundle"),
            "check, faithful port": lambda: graphtrace.check(faithful, (ids,), reference),
            "check, two bugs": lambda: graphtrace.check(buggy, (ids,), reference),
        }
        report = graphtrace.check(buggy, (ids,), reference)  # warm-up, and what the check finds
        print(f"two bugs: {[report.port_path(check.port) for check in report.departures]}, {report.counts()}")
        for run in modes.values():
            run()
        times: dict[str, list[float]] = {name: [] for name in modes}
        cpu: dict[str, list[float]] = {name: [] for name in modes}
        names = list(modes)
        for round_number in range(args.rounds):
            for name in names[round_number % len(names) :] + names[: round_number % len(names)]:
                started, used = time.perf_counter(), time.process_time()
                modes[name]()
                times[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - used)
        base, base_cpu = times["capture of the port"], cpu["capture of the port"]
        print(f"{'':<24} {'median s':>9} {'x capture':>10} {'CPU s':>7} {'x capture':>10}")
        for name in names:
            ratio = statistics.median(t / b for t, b in zip(times[name], base))
            cpu_ratio = statistics.median(t / b for t, b in zip(cpu[name], base_cpu))
            print(
                f"{name:<24} {statistics.median(times[name]):9.3f} {ratio:9.2f}x "
                f"{statistics.median(cpu[name]):7.3f} {cpu_ratio:9.2f}x"
            )


if __name__ == "__main__":
    main()
