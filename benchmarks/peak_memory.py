"""Peak memory of one mode in a fresh process: ``python -m benchmarks.peak_memory MODEL MODE``.

The child imports everything, builds the model, then resets the kernel's high-water mark of its resident set
(``/proc/self/clear_refs``) and runs the mode once; it prints one JSON line: the resident set before the run and its
peak during the run, in bytes. Where the reset is not permitted the peak is the process's lifetime maximum.
"""

from __future__ import annotations

import gc
import json
import resource
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["measure"]


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(model_name: str, mode_name: str) -> dict[str, int]:
    import torch
    import transformers.model_debugging_utils  # noqa: F401

    import graphtrace  # noqa: F401  - imported before the measurement, as the model and transformers are
    import graphtrace.api  # noqa: F401
    import graphtrace.compat  # noqa: F401
    from benchmarks.models import build
    from benchmarks.modes import MODES

    torch.set_num_threads(1)
    model, inputs = build(model_name)
    directory = Path(tempfile.mkdtemp(prefix="graphtrace-bench-"))
    try:
        gc.collect()
        before = _status("VmRSS")
        reset = _reset_peak()
        MODES[mode_name].run(model, inputs, directory)
        peak = _status("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"before": before, "peak": peak, "reset": int(reset)}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], sys.argv[2])))
