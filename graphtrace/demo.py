"""A small decoder-only transformer shipped with graphtrace, for ``graphtrace demo`` and the docs: no download.

It has what real language models have (token embedding, rotary attention, gated MLP, RMSNorm, residual
connections, a tied output head) at a size that traces in a moment. Weights come from a fixed seed, so every run
gives the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["DemoConfig", "DemoTransformer", "demo_inputs", "demo_model"]


@dataclass(frozen=True)
class DemoConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 128
    max_positions: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-6


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class RotaryEmbedding(nn.Module):
    """Cosine and sine tables for rotary position embeddings."""

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.hidden_size // config.num_heads
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, width = hidden.shape
        q, k, v = self._heads(self.q_proj(hidden)), self._heads(self.k_proj(hidden)), self._heads(self.v_proj(hidden))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-1, -2) / self.head_dim**0.5
        causal = torch.ones(length, length, dtype=torch.bool, device=hidden.device).triu(1)
        probs = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(batch, length, width)
        return self.o_proj(context)


class MLP(nn.Module):
    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DemoConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.eps)
        self.attn = Attention(config)
        self.post_attention_norm = RMSNorm(config.hidden_size, config.eps)
        self.mlp = MLP(config)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        hidden = hidden + self.attn(self.input_norm(hidden), cos, sin)
        return hidden + self.mlp(self.post_attention_norm(hidden))


class DemoTransformer(nn.Module):
    """Token ids in, next-token logits out."""

    def __init__(self, config: DemoConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or DemoConfig()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = RotaryEmbedding(config.hidden_size // config.num_heads, config.rope_theta)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = self.rotary(positions)
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.lm_head(self.norm(hidden))


def demo_model(config: DemoConfig | None = None, seed: int = 0) -> DemoTransformer:
    """The demo transformer with weights drawn from ``seed``, in eval mode."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = DemoTransformer(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return model.eval()


def demo_inputs(length: int = 12, seed: int = 0, vocab_size: int = DemoConfig.vocab_size) -> dict[str, torch.Tensor]:
    """A batch of one sequence of random token ids."""
    generator = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab_size, (1, length), generator=generator)}
