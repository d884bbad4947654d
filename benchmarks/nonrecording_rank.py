"""What tracing costs a rank that does not record: 2 gloo processes on CPU, each timing the demo model's forward
plainly and inside ``graphtrace.tracing(model)`` (rank 0 records, rank 1 does not), and the cost of entering and
leaving the block itself.

    python benchmarks/nonrecording_rank.py [--forwards 50]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import graphtrace
from graphtrace.demo import demo_inputs, demo_model


def _timed(run) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def _open_and_close(model: torch.nn.Module) -> None:
    with graphtrace.tracing(model, values="none"):
        pass


def _rank(rank: int, world: int, store: str, forwards: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    torch.set_num_threads(1)
    model, inputs = demo_model(), demo_inputs()
    plain, traced, blocks = [], [], []
    with torch.no_grad():
        for _ in range(forwards + 1):  # interleaved, so that load from elsewhere hits both alike; the first warms up
            plain.append(_timed(lambda: model(**inputs)))
            with graphtrace.tracing(model, values="none"):
                traced.append(_timed(lambda: model(**inputs)))
            blocks.append(_timed(lambda: _open_and_close(model)))
    plain_ms, traced_ms = statistics.median(plain[1:]) * 1e3, statistics.median(traced[1:]) * 1e3
    role = "records" if rank == 0 else "does not record"
    print(
        f"rank {rank} ({role}): forward {plain_ms:.3f} ms plain, {traced_ms:.3f} ms inside tracing() "
        f"(x{traced_ms / plain_ms:.2f}); entering and leaving tracing() {statistics.median(blocks[1:]) * 1e6:.0f} us",
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store = os.path.join(directory, "store")
        mp.spawn(_rank, args=(2, store, args.forwards), nprocs=2)


if __name__ == "__main__":
    main()
