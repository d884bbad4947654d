"""examples/generate.py runs as its docstring says and prints each step's phase."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import graphtrace

ROOT = Path(__file__).resolve().parent.parent


def test_generate_example_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "generate.py"), str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "step 0: prefill, 6 tokens" in result.stdout and "step 4: decode, 1 token after 9 cached" in result.stdout
    assert graphtrace.load(str(tmp_path / "out")).step_info[-1].phase == "decode"
