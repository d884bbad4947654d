"""examples/generate.py runs as its docstring says and prints each step's phase."""

from __future__ import annotations

from pathlib import Path

import graphtrace
from tests.conftest import ROOT, run_python


def test_generate_example_runs(tmp_path: Path) -> None:
    result = run_python(str(ROOT / "examples" / "generate.py"), str(tmp_path / "out"), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "step 0: prefill, 6 tokens" in result.stdout and "step 4: decode, 1 token after 9 cached" in result.stdout
    assert graphtrace.load(str(tmp_path / "out")).step_info[-1].phase == "decode"
