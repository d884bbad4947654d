"""``python -m benchmarks --device cuda``: capture on an accelerator against a plain forward and transformers' tool.

On a device every read of a value back to the host waits for all queued kernels, so what capture costs there is
mostly how often it waits (docs/performance.md, "On a device"). Each model (GPT-2 small and a 1.1B Llama by default,
built from their config classes with random weights, moved to the device in ``--dtype``) runs every mode once to
warm up, then ``--repeats`` rounds in a rotating order; each run is timed between two synchronizations of the device,
so that the time includes every kernel the run queued. Printed per model and mode: the median time, its ratio to
the plain forward of the same round (median over rounds, and the interquartile range), and the ratio to the
transformers mode it corresponds to.

Where the device is missing it prints one line saying so and exits 0: the benchmark is skipped, not failed.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.modes import MODES

__all__ = ["DEVICE_MODELS", "DEVICE_MODES", "available", "main"]

DEVICE_MODELS = ("gpt2-small", "llama-1.1b")

DEVICE_MODES = (
    "plain",
    "transformers repr",
    "transformers repr pruned",
    "capture none eager",
    "capture none auto",
    "capture repr eager",
    "capture repr auto",
    "shim repr",
    "shim repr pruned",
)


def available(device: str) -> str | None:
    """None when ``device`` can run the benchmark, else why not (in words for the skip line). A name that is no
    accelerator is a ValueError naming the remedy."""
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"--device {device!r} is not a device torch knows: {exc}") from exc
    if kind in ("cpu", "meta"):
        raise ValueError(f"--device {device!r} is no accelerator: run python -m benchmarks without --device")
    module = getattr(torch, kind, None)
    is_available = getattr(module, "is_available", None)
    if is_available is None or not is_available():
        return f"no {kind} device on this machine (torch {torch.__version__})"
    return None


def _synchronize(device: torch.device) -> None:
    if device.type == "cpu":
        return  # nothing queued (a smoke run of this benchmark's code on the CPU)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    else:
        torch.accelerator.synchronize(device)


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def _timed(run: Callable[..., None], model: torch.nn.Module, inputs: dict[str, Any], device: torch.device) -> float:
    directory = Path(tempfile.mkdtemp(prefix="graphtrace-device-bench-"))
    try:
        gc.collect()
        _synchronize(device)
        started = time.perf_counter()
        run(model, inputs, directory)
        _synchronize(device)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _quartiles(values: list[float]) -> str:
    if len(values) < 4:
        return f"{min(values):.2f}-{max(values):.2f}"
    q = statistics.quantiles(values, n=4)
    return f"{q[0]:.2f}-{q[2]:.2f}"


def bench(model_name: str, device: torch.device, dtype: torch.dtype, repeats: int) -> list[str]:
    """The table lines of one model."""
    from benchmarks.models import build

    model, inputs = build(model_name)
    model = model.to(device=device, dtype=dtype)
    inputs = {key: _moved(value, device) for key, value in inputs.items()}
    times: dict[str, list[float]] = {mode: [] for mode in DEVICE_MODES}
    ratios: dict[str, list[float]] = {mode: [] for mode in DEVICE_MODES}
    references: dict[str, list[float]] = {mode: [] for mode in DEVICE_MODES}
    for mode in DEVICE_MODES:  # warm-up: kernels chosen and compiled, lazy imports, fx plans
        _timed(MODES[mode].run, model, inputs, device)
    for round_ in range(repeats):
        this_round: dict[str, float] = {}
        for i in range(len(DEVICE_MODES)):
            mode = DEVICE_MODES[(i + round_) % len(DEVICE_MODES)]
            this_round[mode] = _timed(MODES[mode].run, model, inputs, device)
            times[mode].append(this_round[mode])
        for mode in DEVICE_MODES:
            ratios[mode].append(this_round[mode] / this_round["plain"])
            reference = MODES[mode].reference
            if reference in this_round:
                references[mode].append(this_round[mode] / this_round[reference])
        print(f"  {model_name}: round {round_ + 1}/{repeats} done", file=sys.stderr, flush=True)
    lines = []
    for mode in DEVICE_MODES:
        reference = f"{statistics.median(references[mode]):.2f}" if references[mode] else ""
        lines.append(
            f"{model_name:<12} {mode:<26} {statistics.median(times[mode]):>9.4f} "
            f"{statistics.median(ratios[mode]):>8.2f} {_quartiles(ratios[mode]):>11} {reference:>14}"
        )
    del model
    gc.collect()
    return lines


def main(device_name: str, models: list[str] | None, repeats: int, dtype_name: str) -> int:
    """Run the benchmark (ValueError for a device or dtype that cannot be one; a missing device is a skip)."""
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"--dtype {dtype_name!r} is no floating dtype of torch: use float32, bfloat16 or float16")
    reason = available(device_name)
    if reason is not None:
        print(f"device benchmark skipped: {reason}.")
        return 0
    device = torch.device(device_name)
    names = models or list(DEVICE_MODELS)
    print(f"torch {torch.__version__}, {device} ({_device_name(device)}), {dtype}, {repeats} rounds", file=sys.stderr)
    print(f"{'model':<12} {'mode':<26} {'median s':>9} {'x plain':>8} {'IQR':>11} {'x transformers':>14}")
    for name in names:
        for line in bench(name, device, dtype, repeats):
            print(line, flush=True)
    return 0


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type
