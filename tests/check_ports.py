"""Test material for the check: bugs composed on the independent ports, and small models whose modules cannot be run
alone.

``scaled(module, factor)`` makes one module of a port return its output times ``factor`` (its own code departs):
with 1.0001 every element of the output stays within float32's tolerance, and only the lean of the differences
shows it. Composed with a port's own ``bug=`` switch in another layer, it makes a port with two bugs: the diff names
the first one only (everything after it already differs), the check must name both.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tests import independent_gpt2, independent_llama

SMALL = 1.0001
"""A departure under the tolerance: each element moves by 1e-4 of itself."""


def scaled(module: nn.Module, factor: float) -> nn.Module:
    """``module``, its class changed in place to one that returns the output times ``factor`` (same name, same
    path: only its own code changes)."""
    kind = type(module)

    def forward(self: nn.Module, *args: object, **kwargs: object) -> torch.Tensor:
        return kind.forward(self, *args, **kwargs) * factor

    module.__class__ = type(kind.__name__, (kind,), {"forward": forward, "__module__": kind.__module__})
    return module


# (arch, the port's bug, its module, the module scaled by SMALL): the small departure upstream, the bug downstream
TWO_BUGS = [
    ("gpt2", "eps", "h.2.ln2", "h.0.attn.out"),
    ("gpt2", "bf16_activation", "h.2.mlp", "h.0.mlp.proj"),
    ("llama", "unpermuted_qk", "layers.2.attention", "layers.0.attention.wo"),
    ("llama", "eps", "layers.2.attention_norm", "layers.1.attention"),
]


def two_bug_port(original: nn.Module, arch: str, bug: str, small: str) -> nn.Module:
    port = (
        independent_llama.port_of(original, bug=bug) if arch == "llama" else independent_gpt2.port_of(original, bug=bug)
    )
    scaled(port.get_submodule(small), SMALL)
    return port


# -- modules that cannot be run alone ------------------------------------------------------------------------------


class Block(nn.Module):
    """A residual block: norm, projection, an activation; ``state`` chooses what the port's block also does that
    keeps it from being run alone: ``"cache"`` writes its input into a buffer, ``"counter"`` counts its calls in an
    attribute, ``"dropout"`` drops out (in training mode: random draws)."""

    def __init__(self, dim: int, state: str | None = None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.proj = nn.Linear(dim, dim)
        self.state = state
        self.calls = 0
        self.register_buffer("cache", torch.zeros(4, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x))
        if self.state == "cache":
            self.cache[: x.shape[1]] = x[0, : self.cache.shape[0]]
        elif self.state == "counter":
            self.calls += 1
        elif self.state == "dropout":
            h = F.dropout(h, 0.5, training=True)
        return x + F.gelu(h)


class Tiny(nn.Module):
    """Three blocks and a head; ``states`` gives each block's ``state``."""

    def __init__(self, dim: int = 16, states: tuple[str | None, ...] = (None, None, None)) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, state) for state in states)
        self.head = nn.Linear(dim, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def tiny_pair(states: tuple[str | None, ...], seed: int = 0) -> tuple[Tiny, Tiny, torch.Tensor]:
    """An original ``Tiny`` with random weights, a port with the same weights whose blocks keep ``states``, and an
    input."""
    torch.manual_seed(seed)
    original = Tiny(states=(None,) * len(states)).eval()
    port = Tiny(states=states).eval()
    port.load_state_dict(original.state_dict())
    return original, port, torch.randn(1, 3, 16, generator=torch.Generator().manual_seed(seed))
