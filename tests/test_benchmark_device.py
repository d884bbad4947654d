"""The device benchmark: skipped with one line where there is no device, a clear error for a name that is none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_ROOT = Path(__file__).resolve().parent.parent


def _benchmark(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(_ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], capture_output=True, text=True, env=env, cwd=_ROOT, timeout=120
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the benchmark would run for real")
def test_without_a_device_it_is_skipped_not_failed() -> None:
    result = _benchmark("--device", "cuda")
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip()
        == f"device benchmark skipped: no cuda device on this machine (torch {torch.__version__})."
    )


def test_a_name_that_is_no_accelerator_is_an_error_naming_the_remedy() -> None:
    result = _benchmark("--device", "cpu")
    assert result.returncode == 2
    assert "is no accelerator: run python -m benchmarks without --device" in result.stderr
    result = _benchmark("--device", "cuda", "--dtype", "int8")
    assert result.returncode == 2 and "no floating dtype" in result.stderr
