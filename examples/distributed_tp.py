"""Trace a tensor-parallel model on every rank of a torch.distributed job (CPU, gloo).

    torchrun --standalone --nproc-per-node 2 examples/distributed_tp.py [OUTPUT_DIR]   # default: ./tp-trace
    graphtrace show tp-trace/rank_1                                                    # then look at one rank

The model's two Linear layers are sharded with torch.distributed.tensor.parallel: ``up`` column-wise (each rank
computes half of the hidden features) and ``down`` row-wise (each rank computes a partial sum, then they are added
up). graphtrace records each DTensor by its local shard, as transformers does, and keeps its placements, mesh shape
and global shape in its own trace file.
"""

from __future__ import annotations

import datetime
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import graphtrace


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.act = nn.GELU()
        self.down = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


def main(output: str) -> None:
    # A timeout on the process group: if one rank fails, the others stop waiting for it.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same weights and inputs on every rank
    model = TinyMLP().eval()
    x = torch.randn(4, 16)
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

    # Every rank must run the same forward calls (they meet in collectives); ranks="all" makes each one record and
    # write into OUTPUT_DIR/rank_{r}/. The default, ranks=0, records on rank 0 only, as transformers does.
    trace = graphtrace.capture(model, x, path=output, ranks="all")

    up = trace.find("TinyMLP.up").outputs
    down = trace.find("TinyMLP.down").outputs
    assert isinstance(up, graphtrace.TensorRecord) and isinstance(down, graphtrace.TensorRecord)
    assert up.dtensor is not None and down.dtensor is not None
    print(
        f"rank {rank}: up -> local {list(up.shape)} of {list(up.dtensor.global_shape)} {up.dtensor.placements}, "
        f"down -> {down.dtensor.placements} with mean {down.stats.mean:+.4f}; wrote {output}/rank_{rank}/"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tp-trace")
