"""Running a function on every rank of a real torch.distributed job (gloo, CPU), in bounded time.

:func:`run_ranks` starts one spawned process per rank, each joining a gloo process group through a file store, and
returns what each rank did: its result (a JSON-able value) or the exception it raised, with its notes. The process
group has a timeout and the processes are joined against a deadline, after which they are killed: a rank that
raises, or one that waits for it, can never hold up the test suite.

The worker below runs the scenarios of tests/test_distributed.py in one job (starting processes and importing
transformers in them is most of the time such a job takes).
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

GROUP_TIMEOUT = datetime.timedelta(seconds=30)


@dataclass
class RankResult:
    rank: int
    exitcode: int | None  # None: still running at the deadline, then killed
    result: Any = None
    error: str | None = None  # "Type: message" of what the rank raised
    notes: tuple[str, ...] = ()


def _child(worker: Callable[[int, int, Path], Any], rank: int, world: int, directory: Path) -> None:
    import torch.distributed as dist

    outcome: dict[str, Any]
    dist.init_process_group(
        "gloo", init_method=f"file://{directory / 'store'}", rank=rank, world_size=world, timeout=GROUP_TIMEOUT
    )
    try:
        outcome = {"result": worker(rank, world, directory)}
    except BaseException as exc:  # reported to the parent, which decides what was expected
        outcome = {
            "error": f"{type(exc).__name__}: {exc}",
            "notes": getattr(exc, "__notes__", []),
            "traceback": traceback.format_exc(),
        }
    finally:
        dist.destroy_process_group()
    (directory / f"outcome_{rank}.json").write_text(json.dumps(outcome))


def run_ranks(
    worker: Callable[[int, int, Path], Any], directory: Path, *, world: int = 2, deadline: float = 90.0
) -> list[RankResult]:
    """Run ``worker(rank, world, directory)`` on ``world`` gloo ranks; every process has ended when this returns."""
    directory.mkdir(parents=True, exist_ok=True)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_child, args=(worker, rank, world, directory)) for rank in range(world)]
    for process in processes:
        process.start()
    end = time.monotonic() + deadline
    for process in processes:
        process.join(max(0.0, end - time.monotonic()))
    results = []
    for rank, process in enumerate(processes):
        if process.is_alive():
            process.kill()
            process.join()
            results.append(RankResult(rank, None))
            continue
        outcome_file = directory / f"outcome_{rank}.json"
        outcome = json.loads(outcome_file.read_text()) if outcome_file.is_file() else {}
        notes = tuple(outcome.get("notes", ()))
        results.append(RankResult(rank, process.exitcode, outcome.get("result"), outcome.get("error"), notes))
    return results


# -- scenarios (run in the child processes) --------------------------------------------------------------------------


def tensor_parallel_llama(world: int) -> tuple[torch.nn.Module, dict[str, Any], torch.Tensor]:
    """tests.zoo's Llama with every projection sharded over a CPU device mesh (q/k/v, gate/up column-wise, o/down
    row-wise, as transformers' own tensor-parallel plan), its inputs, and the unsharded model's logits."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from tests import zoo

    model, inputs = zoo.llama()
    with torch.no_grad():
        unsharded = model(**inputs).logits
    mesh = init_device_mesh("cpu", (world,))
    styles = {
        "self_attn.q_proj": ColwiseParallel,
        "self_attn.k_proj": ColwiseParallel,
        "self_attn.v_proj": ColwiseParallel,
        "self_attn.o_proj": RowwiseParallel,
        "mlp.gate_proj": ColwiseParallel,
        "mlp.up_proj": ColwiseParallel,
        "mlp.down_proj": RowwiseParallel,
    }
    plan = {f"model.layers.{i}.{name}": style() for i in range(zoo.LAYERS) for name, style in styles.items()}
    parallelize_module(model, mesh, plan)
    return model, inputs, unsharded


def _patched(model: torch.nn.Module) -> list[str]:
    return [name for name, module in model.named_modules() if "forward" in module.__dict__]


def sharded_capture(rank: int, world: int, directory: Path) -> dict[str, Any]:
    """Capture the sharded Llama with the default ranks, with ranks="all", and trace a short generate() on all."""
    import graphtrace

    model, inputs, unsharded = tensor_parallel_llama(world)
    before = _patched(model)
    with graphtrace.tracing(model, path=directory / "default", values="none") as session:
        patched_inside = _patched(model)
        with torch.no_grad():
            logits = model(**inputs).logits
    trace = graphtrace.capture(model, inputs, path=directory / "all", values="safetensors", ranks="all")
    with graphtrace.tracing(model, path=directory / "generate", values="none", ranks="all") as generating:
        model.generate(inputs["input_ids"], max_new_tokens=2, do_sample=False)
    assert session.trace is not None and generating.trace is not None
    return {
        "default_steps": len(session.trace.steps),
        "patched_before": before,
        "patched_inside": len(patched_inside) - len(before),
        "patched_after": _patched(model),
        "logits_match": bool(torch.allclose(logits, unsharded, atol=1e-5)),
        "all_rank": trace.meta.rank,
        "all_world_size": trace.meta.world_size,
        "generate_phases": [info.phase for info in generating.trace.step_info],
    }


def rank_one_fails(rank: int, world: int, directory: Path) -> None:
    """Rank 1's layers.1 MLP activation raises in the middle of the sharded forward; every rank records."""
    import graphtrace

    model, inputs, _ = tensor_parallel_llama(world)
    if rank == 1:

        class Fails(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                raise RuntimeError("rank 1 fails on purpose")

        model.model.layers[1].mlp.act_fn = Fails()
    graphtrace.capture(model, inputs, path=directory / "trace", values="none", ranks="all")


def sharded_job(rank: int, world: int, directory: Path) -> dict[str, Any]:
    """:func:`sharded_capture`, its result kept in ``captured_{rank}.json``, then :func:`rank_one_fails` (which raises
    on every rank: the job's error is the failure's)."""
    captured = sharded_capture(rank, world, directory)
    (directory / f"captured_{rank}.json").write_text(json.dumps(captured))
    rank_one_fails(rank, world, directory)
    return captured
