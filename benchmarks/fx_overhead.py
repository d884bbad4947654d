"""What strategy="auto" costs against strategy="eager" and a plain forward, cold and warm.

    python -m benchmarks.fx_overhead                 # demo model and Llama (hidden 256, 8 layers, 128 tokens)
    python -m benchmarks.fx_overhead --runs 9

Cold: the first capture of a freshly built model (its build is not timed). Warm: a further capture of a model
already captured once with the same strategy. Each figure is the median of ``--runs`` rounds; within a round the
modes alternate (plain, eager, auto, auto+ops), so that load from other work on the machine hits them alike. One
thread, ``values="none"`` (statistics only), under ``torch.no_grad()``. A warm-up capture of another instance first
takes the one-time import of torch.fx's fake tensors out of the cold figures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import graphtrace
from graphtrace.demo import demo_inputs, demo_model

Example = tuple[nn.Module, dict[str, Any]]
MODES = ("plain", "eager", "auto", "auto+ops")


def llama() -> Example:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return model, {"input_ids": torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(0))}


def demo() -> Example:
    return demo_model().eval(), demo_inputs()


MODELS: dict[str, Callable[[], Example]] = {"demo": demo, "llama": llama}


def _run(mode: str, model: nn.Module, inputs: dict[str, Any]) -> float:
    started = time.perf_counter()
    with torch.no_grad():
        if mode == "plain":
            model(**inputs)
        else:
            graphtrace.capture(
                model, inputs, values="none", strategy="eager" if mode == "eager" else "auto", ops=mode == "auto+ops"
            )
    return time.perf_counter() - started


def measure(build: Callable[[], Example], runs: int) -> dict[str, tuple[float, float]]:
    """mode -> (cold median, warm median) in seconds."""
    cold: dict[str, list[float]] = {mode: [] for mode in MODES}
    warm: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(runs):
        for mode in MODES:
            model, inputs = build()
            cold[mode].append(_run(mode, model, inputs))
            warm[mode].append(_run(mode, model, inputs))
    return {mode: (statistics.median(cold[mode]), statistics.median(warm[mode])) for mode in MODES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS), help="models (default: all)")
    parser.add_argument("--runs", type=int, default=7, help="rounds; the median counts")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.models:  # warm-up: lazy imports, fake tensors
        model, inputs = MODELS[name]()
        for mode in MODES:
            _run(mode, model, inputs)
    print("| model | mode | cold (s) | warm (s) | cold / eager | warm / eager |")
    print("|---|---|---:|---:|---:|---:|")
    for name in args.models:
        times = measure(MODELS[name], args.runs)
        eager_cold, eager_warm = times["eager"]
        for mode in MODES:
            cold, warm = times[mode]
            print(
                f"| {name} | {mode} | {cold:.4f} | {warm:.4f} | {cold / eager_cold:.2f}× | {warm / eager_warm:.2f}× |",
                flush=True,
            )


if __name__ == "__main__":
    main()
