"""How long structural alignment takes on large models, and whether it still pairs every call correctly.

    python benchmarks/compare_alignment.py

Two synthetic call trees stand for an original and its port with every module renamed, so that nothing matches by
path and everything goes through structure: Llama-like decoder layers (13 calls each) at 32 to 320 layers, and flat
sequences of thousands of leaves where the original has an extra no-op after every third module (the case that
needs the banded and the windowed alignment). Goal: under 2 s for 4,000 calls on one core, no call mispaired.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from graphtrace.compare.align import align_calls  # noqa: E402
from graphtrace.model import CallNode, Stats, TensorRecord  # noqa: E402

HIDDEN = 32


def _tensor(shape: tuple[int, ...], seed: int) -> TensorRecord:
    return TensorRecord(shape=shape, dtype="torch.float32", stats=Stats(seed * 1e-3, 1.0, -2.0, 2.0))


def _leaf(path: str, kind: str, inputs: tuple[int, ...], outputs: tuple[int, ...], seed: int) -> CallNode:
    return CallNode(path=path, type_name=kind, args=(_tensor(inputs, seed),), outputs=_tensor(outputs, seed + 1))


def _container(path: str, kind: str, seed: int, children: tuple[CallNode, ...]) -> CallNode:
    hidden = (1, 7, HIDDEN)
    return CallNode(
        path=path,
        type_name=kind,
        leaf=False,
        args=(_tensor(hidden, seed),),
        outputs=_tensor(hidden, seed + 50),
        children=children,
    )


def layered(root: str, names: tuple[str, str, str, str], layers: int) -> CallNode:
    """A decoder: each layer has two norms, an attention block of four projections and an MLP of four calls."""
    layer_name, attn, mlp, prefix = names
    hidden, wide = (1, 7, HIDDEN), (1, 7, 2 * HIDDEN)
    blocks = []
    for n in range(layers):
        path, seed = f"{root}.{layer_name}.{n}", n * 100
        attention = _container(
            f"{path}.{attn}",
            "Attention",
            seed + 2,
            tuple(
                _leaf(f"{path}.{attn}.{prefix}{q}", "Linear", hidden, hidden, seed + 3 + k)
                for k, q in enumerate("qkvo")
            ),
        )
        feed_forward = _container(
            f"{path}.{mlp}",
            "MLP",
            seed + 20,
            (
                _leaf(f"{path}.{mlp}.{prefix}gate", "Linear", hidden, wide, seed + 21),
                _leaf(f"{path}.{mlp}.{prefix}act", "SiLU", wide, wide, seed + 22),
                _leaf(f"{path}.{mlp}.{prefix}up", "Linear", hidden, wide, seed + 23),
                _leaf(f"{path}.{mlp}.{prefix}down", "Linear", wide, hidden, seed + 24),
            ),
        )
        blocks.append(
            _container(
                path,
                "DecoderLayer",
                seed,
                (
                    _leaf(f"{path}.{prefix}norm1", "RMSNorm", hidden, hidden, seed + 1),
                    attention,
                    _leaf(f"{path}.{prefix}norm2", "RMSNorm", hidden, hidden, seed + 19),
                    feed_forward,
                ),
            )
        )
    return CallNode(
        path=root, leaf=False, args=(_tensor((1, 7), 0),), outputs=_tensor((1, 7, 99), 5), children=tuple(blocks)
    )


def flat(root: str, prefix: str, leaves: int, extra_every: int) -> CallNode:
    """A sequence of linear layers; with ``extra_every``, a dropout after every n-th one."""
    children = []
    for i in range(leaves):
        children.append(_leaf(f"{root}.{prefix}lin{i}", "Linear", (1, 8), (1, 8), i))
        if extra_every and i % extra_every == 0:
            children.append(
                CallNode(
                    path=f"{root}.drop{i}",
                    type_name="Dropout",
                    args=(_tensor((1, 8), i + 1),),
                    outputs=_tensor((1, 8), i + 1),
                )
            )
    return CallNode(
        path=root, leaf=False, args=(_tensor((1, 8), 0),), outputs=_tensor((1, 8), leaves), children=tuple(children)
    )


def _mispaired(a: CallNode, b: CallNode, rename: dict[str, str]) -> int:
    alignment = align_calls(a, b)
    wrong = 0
    for match in alignment.matches[1:]:
        expected = match.a.path[len(a.path) :]
        for old, new in rename.items():
            expected = expected.replace(old, new)
        wrong += expected != match.b.path[len(b.path) :]
    return wrong


def main() -> None:
    print(f"{'case':<44} {'calls':>6} {'seconds':>8} {'mispaired':>10}")
    for layers in (32, 80, 160, 320):
        a = layered("Original", ("layers", "self_attn", "mlp", "a_"), layers)
        b = layered("Port", ("blocks", "attention", "ffn", "b_"), layers)
        rename = {"layers": "blocks", "self_attn": "attention", "mlp": "ffn", "a_": "b_"}
        started = time.perf_counter()
        wrong = _mispaired(a, b, rename)
        elapsed = time.perf_counter() - started
        calls = sum(1 for _ in a.walk())
        print(f"{f'decoder, {layers} layers, all renamed':<44} {calls:>6} {elapsed:>8.2f} {wrong:>10}")
    for leaves, every in ((600, 3), (2000, 3), (5000, 0)):
        a, b = flat("Original", "a_", leaves, every), flat("Port", "b_", leaves, 0)
        started = time.perf_counter()
        wrong = _mispaired(a, b, {"a_": "b_"})
        elapsed = time.perf_counter() - started
        extra = f", a no-op after every {every}rd" if every else ""
        calls = sum(1 for _ in a.walk())
        print(f"{f'flat, {leaves} leaves{extra}':<44} {calls:>6} {elapsed:>8.2f} {wrong:>10}")


if __name__ == "__main__":
    main()
