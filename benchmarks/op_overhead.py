"""What recording ops costs: ``capture(ops=True)`` against ``capture(ops=False)`` and a plain forward, on GPT-2 small.

    python -m benchmarks.op_overhead [--repeats N] [--tokens T]

GPT-2 small (124M parameters, random weights from ``GPT2Config()``, transformers' default attention and cache) runs
on one batch of ``T`` tokens; each mode runs ``N`` times after one warm-up, modes alternating, in one thread, with
statistics only (``values="none"``) and with repr values (the default). Goal (issue 13): ``ops=True`` at most 2x the
time of ``ops=False``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import graphtrace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    options = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).eval()
    inputs = {"input_ids": torch.randint(0, 50257, (1, options.tokens), generator=torch.Generator().manual_seed(1))}

    def plain() -> None:
        with torch.no_grad():
            model(**inputs)

    modes = {"plain forward": plain}
    for values in ("none", "repr"):
        for ops in (False, True):
            modes[f"values={values} ops={ops}"] = lambda v=values, o=ops: graphtrace.capture(
                model, inputs, values=v, ops=o
            )
    times: dict[str, list[float]] = {name: [] for name in modes}
    for run in modes.values():
        run()  # warm-up: fx plans, caches
    for _ in range(options.repeats):
        for name, run in modes.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["plain forward"])
    print(f"GPT-2 small, {options.tokens} tokens, {options.repeats} runs each, 1 thread")
    print(f"{'mode':28} {'median s':>9} {'x plain':>8} {'x ops=False':>12}")
    for name, samples in times.items():
        median = statistics.median(samples)
        without = name.replace("ops=True", "ops=False")
        ratio = f"{median / statistics.median(times[without]):.2f}" if "ops=True" in name else ""
        print(f"{name:28} {median:9.3f} {median / base:8.2f} {ratio:>12}")


if __name__ == "__main__":
    main()
