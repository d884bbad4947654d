"""Find where a changed model departs from the original: trace both, compare, name the first divergent call.

    python examples/compare_traces.py [output-directory]

A small Llama is built from its config with random weights (nothing is downloaded). The "port" is the same model
with one weight of layer 1's attention changed, as a porting bug would; the comparison names the module.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import graphtrace


def main(directory: Path) -> int:
    config = LlamaConfig(
        vocab_size=99,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 99, (1, 7), generator=torch.Generator().manual_seed(1))}

    graphtrace.capture(model, inputs, path=directory / "original", values="safetensors")
    with torch.no_grad():
        model.model.layers[1].self_attn.v_proj.weight[0, 0] += 0.5  # the "porting bug"
    graphtrace.capture(model, inputs, path=directory / "port", values="safetensors")

    result = graphtrace.compare(directory / "original", directory / "port")
    print(result.table())
    first = result.first_divergence
    if first is not None:
        print(f"\nthe culprit: {first.b.path} ({first.b.type_name})")
    return 0 if result.equal else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("compare-example")))
