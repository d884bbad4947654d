"""``python -m benchmarks``: capture speed and memory against a plain forward and against transformers' tracer.

For each model, every mode runs ``--repeats`` times, the modes alternating within one process (one thread, as
the goals were set), after one untimed warm-up run each. Printed per model and mode:

- ``median s``: the median wall time of a run, writing its files included;
- ``x plain``: the median over rounds of the run's time divided by the plain forward's time in the same round;
- ``x transformers``: the same ratio to the transformers mode it corresponds to;
- ``spread``: the ratio's interquartile range over rounds, a measure of how noisy the machine was;
- ``peak RSS``: the peak resident set of a fresh process running the mode once after building the model (the
  plain forward's peak is the baseline); ``x plain`` beside it is the ratio of the two peaks;
- ``written``: bytes the run left in its output directory.

``--quick`` runs the two small models and the main modes; ``make benchmark`` runs everything and takes about 45 minutes
on two cores. ``--markdown FILE`` also writes the table as Markdown. ``--device cuda`` times capture on an
accelerator instead (``benchmarks/device.py``; a machine without one prints a line saying so and exits 0).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.models import MODELS, QUICK_MODELS
from benchmarks.modes import MODES, QUICK_MODES


@dataclass
class Row:
    model: str
    mode: str
    times: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    reference_ratios: list[float] = field(default_factory=list)
    written: int = 0
    peak: int | None = None
    peak_ratio: float | None = None


def _size(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def _timed_run(mode_name: str, model, inputs) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    directory = Path(tempfile.mkdtemp(prefix="graphtrace-bench-"))
    try:
        gc.collect()
        started = time.perf_counter()
        MODES[mode_name].run(model, inputs, directory)
        elapsed = time.perf_counter() - started
        return elapsed, _size(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _quartile_spread(values: list[float]) -> float:
    if len(values) < 4:
        return max(values) - min(values)
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def bench_speed(model_name: str, modes: list[str], repeats: int) -> dict[str, Row]:
    import torch

    from benchmarks.models import build

    torch.set_num_threads(1)
    model, inputs = build(model_name)
    rows = {mode: Row(model_name, mode) for mode in modes}
    for mode in modes:  # warm-up: lazy imports, first-call allocations
        _timed_run(mode, model, inputs)
    for round_ in range(repeats):
        times: dict[str, float] = {}
        for i in range(len(modes)):  # rotate the order so that drift spreads over all modes
            mode = modes[(i + round_) % len(modes)]
            times[mode], rows[mode].written = _timed_run(mode, model, inputs)
            rows[mode].times.append(times[mode])
        for mode in modes:
            rows[mode].ratios.append(times[mode] / times["plain"])
            reference = MODES[mode].reference
            if reference in times:
                rows[mode].reference_ratios.append(times[mode] / times[reference])
        print(f"  {model_name}: round {round_ + 1}/{repeats} done", file=sys.stderr, flush=True)
    del model
    gc.collect()
    return rows


def bench_memory(model_name: str, modes: list[str], rows: dict[str, Row]) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent), *sys.path]))
    for mode in modes:
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.peak_memory", model_name, mode],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if result.returncode != 0:
            print(f"  peak memory of {model_name} / {mode} failed:\n{result.stderr[-2000:]}", file=sys.stderr)
            continue
        rows[mode].peak = json.loads(result.stdout.strip().splitlines()[-1])["peak"]
    plain = rows["plain"].peak
    for row in rows.values():
        if row.peak is not None and plain:
            row.peak_ratio = row.peak / plain


def _format_rows(rows: list[Row], markdown: bool) -> str:
    header = [
        "model",
        "mode",
        "median s",
        "x plain",
        "spread",
        "x transformers",
        "peak RSS MB",
        "x plain RSS",
        "written MB",
    ]
    lines = []
    for row in rows:
        lines.append(
            [
                row.model,
                row.mode,
                f"{statistics.median(row.times):.4f}",
                f"{statistics.median(row.ratios):.2f}",
                f"{_quartile_spread(row.ratios):.2f}",
                f"{statistics.median(row.reference_ratios):.2f}" if row.reference_ratios else "",
                f"{row.peak / 2**20:.0f}" if row.peak else "",
                f"{row.peak_ratio:.3f}" if row.peak_ratio else "",
                f"{row.written / 2**20:.1f}" if row.written else "0",
            ]
        )
    if markdown:
        out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(line) + " |" for line in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the two small models, the main modes, 3 rounds")
    parser.add_argument("--models", help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--modes", help=f"comma-separated, from: {', '.join(MODES)} (plain is always run)")
    parser.add_argument("--repeats", type=int, help="timed rounds per model (default 7, quick 3)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory processes")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    parser.add_argument(
        "--device",
        help="time on this accelerator (cuda, cuda:1, ...) instead: plain vs capture vs transformers' tool on "
        "GPT-2 small and a 1.1B Llama, the device synchronized around each run; skipped where there is none",
    )
    parser.add_argument("--dtype", default="bfloat16", help="the models' dtype with --device (default bfloat16)")
    args = parser.parse_args(argv)
    if args.device is not None:
        from benchmarks.device import main as device_main

        models = args.models.split(",") if args.models else None
        unknown = [m for m in models or () if m not in MODELS]
        if unknown:
            parser.error(f"unknown model: {', '.join(unknown)}")
        try:
            return device_main(args.device, models, args.repeats or 7, args.dtype)
        except ValueError as exc:
            parser.error(str(exc))

    models = args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else MODELS)
    modes = args.modes.split(",") if args.modes else list(QUICK_MODES if args.quick else MODES)
    unknown = [m for m in models if m not in MODELS] + [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown model or mode: {', '.join(unknown)}")
    modes = ["plain", *[m for m in modes if m != "plain"]]
    for mode in list(modes):  # a compared mode needs its transformers mode in the same rounds
        reference = MODES[mode].reference
        if reference is not None and reference not in modes:
            modes.append(reference)
    repeats = args.repeats or (3 if args.quick else 7)

    import torch

    print(f"torch {torch.__version__}, 1 thread, {repeats} rounds, {os.cpu_count()} cores", file=sys.stderr)
    all_rows: list[Row] = []
    for model in models:
        print(f"{model}: {MODELS[model].description}", file=sys.stderr, flush=True)
        rows = bench_speed(model, modes, repeats)
        if not args.no_memory:
            bench_memory(model, modes, rows)
        all_rows += rows.values()
        print(_format_rows(list(rows.values()), markdown=False), flush=True)
        print(flush=True)
    if args.markdown:
        Path(args.markdown).write_text(_format_rows(all_rows, markdown=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
