"""Trace a Hugging Face generate() call: one step per forward, prefill and decoding steps told apart.

    python examples/generate.py [OUTPUT_DIR]        # default: ./generate-trace
    graphtrace show generate-trace --depth 1        # then look at it

The model is a tiny Llama built from its config with random weights (no download).
"""

from __future__ import annotations

import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import graphtrace


def main(output: str) -> None:
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.tensor([[1, 17, 42, 99, 7, 3]])

    expected = model.generate(prompt, max_new_tokens=5, do_sample=False)
    with graphtrace.tracing(model, path=output) as session:  # everything that calls the model inside is traced
        generated = model.generate(prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(generated, expected), "tracing must not change what generate() produces"

    trace = session.trace
    assert trace is not None
    new_tokens = generated[0, prompt.shape[1] :].tolist()
    print(f"generated {new_tokens}; traced {len(trace.steps)} forward calls into {output}/")
    for number, info in enumerate(trace.step_info):
        if info.phase == "prefill":
            print(f"step {number}: prefill, {info.new_tokens} tokens into an empty cache")
        else:
            print(f"step {number}: {info.phase}, {info.new_tokens} token after {info.cached_tokens} cached")
    keys = trace.step_info[0].cache["layers"][0]["keys"]  # type: ignore[index]
    print(f"layer 0's cached keys after the prefill: shape {list(keys.shape)}, mean {keys.stats.mean:.4f}")
    print(f"next: graphtrace show {output} --depth 1")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "generate-trace")
