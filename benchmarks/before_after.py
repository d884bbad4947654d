"""A model's capture stages (the tiny Llama's by default) before and after a change, interleaved in one process.

    python -m benchmarks.before_after --base 17d3dfc               # the working tree against commit 17d3dfc
    python -m benchmarks.before_after --base main --rounds 60
    python -m benchmarks.before_after --base main --model gpt2-small --rounds 9

The graphtrace of ``--base`` is exported with ``git archive`` into a temporary directory and imported under another
package name beside the working tree's, so that both run in the same process, on the same model and inputs, every
stage of both in every round in a rotating order. Times are ``time.process_time()`` (other work on the machine
counts less than in wall time), and each ratio is taken against the plain forward of the same round; printed are
the medians and the interquartile range of the ratios. This is the comparison behind the before/after table of
docs/performance.md.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import graphtrace
from benchmarks.models import MODELS, build

_BASE_NAME = "graphtrace_base"


def import_base(revision: str, directory: Path) -> ModuleType:
    """graphtrace as of ``revision``, importable as ``graphtrace_base`` (its own imports renamed)."""
    archive = subprocess.run(["git", "archive", revision, "graphtrace"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(directory, filter="data")
    package = directory / _BASE_NAME
    (directory / "graphtrace").rename(package)
    word = re.compile(r"\bgraphtrace\b(?=[.\s,\"]|$)", re.MULTILINE)
    for source in package.rglob("*.py"):
        source.write_text(word.sub(_BASE_NAME, source.read_text()))
    sys.path.insert(0, str(directory))
    return importlib.import_module(_BASE_NAME)


def stages(package: Any, model: torch.nn.Module, inputs: dict[str, Any], out: Path) -> dict[str, Callable[[], object]]:
    spec = importlib.import_module(f"{package.__name__}.io.spec_json")
    step = package.capture(model, inputs, strategy="eager").steps[-1]

    def shim(prune: bool) -> Callable[[], object]:
        def run() -> None:
            debug_path = str(out / f"shim{prune}")
            with package.model_addition_debugger_context(model, debug_path=debug_path, do_prune_layers=prune):
                model(**inputs)

        return run

    return {
        "record, values='none', eager, no files": lambda: package.capture(
            model, inputs, values="none", strategy="eager"
        ),
        "record, values='repr', eager, no files": lambda: package.capture(model, inputs, strategy="eager"),
        "record, values='none', auto, no files": lambda: package.capture(model, inputs, values="none"),
        "shim, do_prune_layers=True": shim(True),
        "shim, do_prune_layers=False": shim(False),
        "  writing SUMMARY + FULL_TENSORS": lambda: spec.write_spec_files(step, out, "Spec"),
    }


StagesOf = Callable[[Any, torch.nn.Module, dict[str, Any], Path], dict[str, Callable[[], object]]]
"""What to time of a graphtrace package (the working tree's or the base's), given the model, inputs and a folder."""


def interleaved(
    revision: str,
    stages_of: StagesOf,
    rounds: int,
    clocks: dict[str, Callable[[], float]],
    model_name: str = "tiny-llama",
) -> tuple[list[str], dict[tuple[str, str, str], list[float]]]:
    """The stages of the working tree and of ``revision`` on a model, every stage of both and a plain forward
    (side ``""``) in every round in a rotating order; returns the stages' names and the times by (name, side, clock)."""
    model, inputs = build(model_name)
    with tempfile.TemporaryDirectory() as temporary:
        root = Path(temporary)
        base = import_base(revision, root / "base")
        (root / "before").mkdir()
        (root / "after").mkdir()
        before = stages_of(base, model, inputs, root / "before")
        after = stages_of(graphtrace, model, inputs, root / "after")

        def plain() -> None:
            with torch.no_grad():
                model(**inputs)

        runs: dict[tuple[str, str], Callable[[], object]] = {("plain forward", ""): plain}
        for name in before:
            runs[name, "before"] = before[name]
            runs[name, "after"] = after[name]
        for run in runs.values():  # warm-up: imports, plans, the page cache
            run()
            run()
        keys = list(runs)
        times: dict[tuple[str, str, str], list[float]] = {}
        for index in range(rounds):
            shift = index % len(keys)
            for key in keys[shift:] + keys[:shift]:
                started = {clock: read() for clock, read in clocks.items()}
                runs[key]()
                for clock, read in clocks.items():
                    times.setdefault((*key, clock), []).append(read() - started[clock])
    return list(before), times


def print_table(names: list[str], times: dict[tuple[str, str, str], list[float]], clock: str) -> None:
    """Before and after of each stage: medians, and ratios to the plain forward of the same round with their IQR."""
    plain_times = times["plain forward", "", clock]
    print(f"{'stage':<46} {'before ms':>9}  {'x plain (IQR)':<18} {'after ms':>8}  x plain (IQR)")
    for name in names:
        cells = []
        for side in ("before", "after"):
            values = times[name, side, clock]
            ratios = [value / plain for value, plain in zip(values, plain_times)]
            low, _, high = statistics.quantiles(ratios, n=4)
            ratio = f"{statistics.median(ratios):.2f} ({low:.2f}-{high:.2f})"
            cells.append(f"{statistics.median(values) * 1000:9.2f}  {ratio:<18}")
        print(f"{name:<46} {cells[0]} {cells[1]}".rstrip())


def run_comparison(
    description: str, stages_of: StagesOf, rounds: int, clocks: dict[str, Callable[[], float]]
) -> tuple[argparse.Namespace, list[str], dict[tuple[str, str, str], list[float]]]:
    """The command line (``--base``, ``--rounds``, ``--model``) of a before/after benchmark, and :func:`interleaved`
    run on it."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the git revision to compare the working tree with")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--model", default="tiny-llama", choices=list(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    return args, *interleaved(args.base, stages_of, args.rounds, clocks, args.model)


def main() -> None:
    args, names, times = run_comparison(__doc__ or "", stages, 40, {"cpu": time.process_time})
    plain_times = times["plain forward", "", "cpu"]
    print(
        f"{args.model}, torch {torch.__version__}, 1 thread, {args.rounds} rounds, process_time medians; "
        f"plain {statistics.median(plain_times) * 1000:.2f} ms; base {args.base}"
    )
    print_table(names, times, "cpu")


if __name__ == "__main__":
    main()
