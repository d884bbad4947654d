"""How long `graphtrace diff` takes on full values: two safetensors traces of a 32-layer Llama.

    python benchmarks/compare_values.py

The model is built from its config (hidden size 256, 32 layers, 64 tokens; random weights, nothing downloaded):
422 calls, 1,038 pairs of tensors (the script prints both counts). The second trace has one weight
of layer 20 changed. Prints the time of the comparison (torch already imported) and of the same comparison on
statistics only.
Goal: under 5 s on full values, under 0.5 s on statistics, on one busy core.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import graphtrace  # noqa: E402


def main() -> None:
    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=32,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    inputs = {"input_ids": torch.randint(0, 1000, (1, 64), generator=torch.Generator().manual_seed(1))}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for values in ("safetensors", "none"):
            graphtrace.capture(model, inputs, path=root / f"a-{values}", values=values)
        with torch.no_grad():
            model.model.layers[20].mlp.up_proj.weight[0, 0] += 1.0
        for values in ("safetensors", "none"):
            graphtrace.capture(model, inputs, path=root / f"b-{values}", values=values)
        for values in ("safetensors", "none"):
            started = time.perf_counter()
            result = graphtrace.compare(root / f"a-{values}", root / f"b-{values}")
            elapsed = time.perf_counter() - started
            first = result.first_divergence
            assert first is not None and first.a.path.endswith("layers.20.mlp.up_proj")
            pairs = sum(len(call.inputs) + len(call.outputs) for call in result.calls)
            print(f"{values:<12} {len(result.calls)} calls, {pairs} tensor pairs: {elapsed:.2f} s")


if __name__ == "__main__":
    main()
