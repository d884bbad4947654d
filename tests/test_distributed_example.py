"""examples/distributed_tp.py runs as its docstring says: under torchrun, 2 processes, one trace per rank."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT, run_cli, run_python


def test_distributed_example_runs_under_torchrun(tmp_path: Path) -> None:
    result = run_python(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(ROOT / "examples" / "distributed_tp.py"),
        str(tmp_path / "out"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: up -> local [4, 32] of [4, 64] (Shard(dim=1),), down -> (Partial(sum),)" in result.stdout
    shown = run_cli("show", str(tmp_path / "out" / "rank_1"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("TinyMLP: rank 1 of 2, 1 forward call(s)")
