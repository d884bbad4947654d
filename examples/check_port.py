"""Name every module of a port that departs from the original, not only the first: trace the original once, then check
the live port against it.

    python examples/check_port.py [output-directory]
    graphtrace check examples/check_port.py:build OUTPUT/original     # the same from the shell

A small Llama is built from its config with random weights (nothing is downloaded). The "port" is a copy of it with
two porting bugs in different layers: layer 0's input norm with eps 1e-3 where the original has 1e-6, and one weight
of layer 2's MLP changed. The diff of the two traces names the first; after it every later module's inputs already
differ. The check runs each module of the port alone on the original's inputs and names both.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import graphtrace


def original() -> tuple[torch.nn.Module, dict[str, Any]]:
    """The original model and its inputs (without a key/value cache: the check runs each module alone)."""
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
    ids = torch.randint(0, 99, (1, 7), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "use_cache": False}


def build() -> tuple[torch.nn.Module, dict[str, Any]]:
    """The port with its two bugs, and the same inputs (what ``graphtrace check`` calls)."""
    model, inputs = original()
    port = copy.deepcopy(model)
    port.model.layers[0].input_layernorm.variance_epsilon = 1e-3  # a wrong eps
    with torch.no_grad():
        port.model.layers[2].mlp.down_proj.weight[0, 0] += 0.5  # a wrong weight
    return port, inputs


def main(directory: Path) -> int:
    model, inputs = original()
    graphtrace.capture(model, inputs, path=directory / "original", values="bundle")
    port, _ = build()

    graphtrace.capture(port, inputs, path=directory / "port", values="bundle")
    first = graphtrace.compare(directory / "original", directory / "port").first_divergence
    print(f"the diff names the first departure only: {first.b.path if first else None}\n")

    report = graphtrace.check(port, inputs, reference=directory / "original")
    print(report.table())
    return 0 if report.equal else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("check-example")))
