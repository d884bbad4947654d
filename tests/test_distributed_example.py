"""examples/distributed_tp.py runs as its docstring says: under torchrun, 2 processes, one trace per rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_distributed_example_runs_under_torchrun(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(ROOT / "examples" / "distributed_tp.py"), str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: up -> local [4, 32] of [4, 64] (Shard(dim=1),), down -> (Partial(sum),)" in result.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "graphtrace", "show", str(tmp_path / "out" / "rank_1")],
        capture_output=True, text=True, env=env, check=True,
    ).stdout
    assert shown.startswith("TinyMLP: rank 1 of 2, 1 forward call(s)")
    assert "up (Linear) -> [4, 32] float32 (local shard of [4, 64]: Shard(dim=1))" in shown
    assert "down (Linear) -> [4, 16] float32 (local shard of [4, 16]: Partial(sum))" in shown
