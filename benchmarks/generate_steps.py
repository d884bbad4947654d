"""What tracing a generate() call costs: plain generate() against tracing() with and without the per-step cache.

    python benchmarks/generate_steps.py [--layers 4] [--hidden 256] [--prompt 32] [--new 32] [--repeat 3] [--threads 1]

Prints the best wall time of each variant over the repeats (the variants take turns, so that load from elsewhere
hits them alike; the minimum is the least disturbed run) and its ratio to plain generate(). The model is a Llama
built from its config with random weights. "no cache state" turns off the per-step cache record
(Recorder(step_caches=False)) to show what that record costs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from unittest import mock

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import graphtrace
from graphtrace.engine import recorder


def best_seconds(variants: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    best = dict.fromkeys(variants, float("inf"))
    for round_ in range(repeat + 1):  # round 0 warms up
        for label, run in variants.items():
            started = time.perf_counter()
            run()
            if round_:
                best[label] = min(best[label], time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 2,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=args.prompt + args.new + 8,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, config.vocab_size, (1, args.prompt))

    def plain() -> object:
        return model.generate(prompt, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)

    def traced(values: str) -> Callable[[], object]:
        def run() -> object:
            with graphtrace.tracing(model, values=values):  # type: ignore[arg-type]
                return plain()

        return run

    def without_cache_state() -> object:
        original = recorder.Recorder.__init__

        def no_caches(self, *a, **k):  # type: ignore[no-untyped-def]
            original(self, *a, **{**k, "step_caches": False})

        with mock.patch.object(recorder.Recorder, "__init__", no_caches):
            return traced("none")()

    print(
        f"Llama {args.layers} layers, hidden {args.hidden}; prompt {args.prompt} tokens, {args.new} new (greedy); "
        f"best of {args.repeat}; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    best = best_seconds(
        {
            "plain generate()": plain,
            "tracing, values='none'": traced("none"),
            "tracing, values='none', no cache state": without_cache_state,
            "tracing, values='repr'": traced("repr"),
        },
        args.repeat,
    )
    base = best["plain generate()"]
    for label, seconds in best.items():
        print(f"  {label:<40}{seconds * 1000:8.1f} ms  x{seconds / base:.2f}")


if __name__ == "__main__":
    main()
