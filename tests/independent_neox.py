"""A GPT-NeoX (Pythia) written the way a lit-gpt style codebase writes it, not the way transformers does: test
material for diff, above all for a fused projection whose layout is per head.

transformers' ``GPTNeoXAttention`` computes q, k and v with one ``query_key_value`` whose output is laid out *per
head*: ``[q_h0 k_h0 v_h0 q_h1 k_h1 v_h1 ...]``, not ``[q k v]``. This port has separate ``q``, ``k`` and ``v``
projections (the fused weight cut per head on load), rotates *interleaved* pairs of the first ``rotary_ndims``
channels of each head as complex numbers (so those rows of q and k are permuted per head on load), keeps the
parallel residual in its block, computes attention with an explicit softmax, holds extra dropout modules and names
everything differently. The original is transformers' ``GPTNeoXForCausalLM``; ``port_of`` copies its weights. Each
``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tests.port_traces import randomized

BUGS = (
    "sequential_residual",  # block 1 adds attention and MLP one after the other instead of in parallel
    "full_rotary",  # block 0 rotates every channel of a head instead of the first quarter
    "contiguous_qkv",  # block 2's fused weight cut into thirds, as if it were laid out [q k v]
    "q_without_bias",  # block 1's query projection loaded without its bias
    "tanh_gelu",  # block 2's MLP uses the tanh approximation of GELU where NeoX uses the exact one
    "final_eps",  # the final norm's eps 1e-6 where the original uses 1e-5
)

VARIANTS = ("mlp_first",)  # faithful, not bugs: every block runs its MLP branch before its attention

RULES = (
    "gpt_neox.embed_in=transformer.wte",
    "gpt_neox.layers.{i}=transformer.h.{i}",
    "input_layernorm=norm_1",
    "post_attention_layernorm=norm_2",
    "attention=attn",
    "attention.dense=attn.proj",
    "mlp.dense_h_to_4h=mlp.fc",
    "mlp.dense_4h_to_h=mlp.proj",
    "gpt_neox.final_layer_norm=transformer.ln_f",
    "lm_head=lm_head",
)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, rotary: int, bug: str | None) -> None:
        super().__init__()
        self.heads, self.head_size = heads, dim // heads
        self.rotary = self.head_size if bug == "full_rotary" else rotary
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(0.0)

    def _rotate(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Rotate interleaved channel pairs (0, 1), (2, 3), ... of the first ``rotary`` channels by ``angles``."""
        turned, kept = x[..., : self.rotary], x[..., self.rotary :]
        pairs = torch.view_as_complex(turned.float().reshape(*turned.shape[:-1], -1, 2).contiguous())
        rotated = torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)
        return torch.cat([rotated.type_as(x), kept], dim=-1)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        batch, steps, dim = x.shape
        split = (batch, steps, self.heads, self.head_size)
        q, k, v = (projection(x).view(split).transpose(1, 2) for projection in (self.q, self.k, self.v))
        angles = angles[:steps, : self.rotary // 2]
        q, k = self._rotate(q, angles), self._rotate(k, angles)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_size)
        future = torch.ones(steps, steps, dtype=torch.bool).triu(1)
        weights = self.attn_drop(scores.masked_fill(future, float("-inf")).softmax(-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(batch, steps, dim))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, bug: str | None) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh" if bug == "tanh_gelu" else "none")
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, config, bug: str | None, mlp_first: bool = False) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.mlp_first = mlp_first
        dim, heads = config.hidden_size, config.num_attention_heads
        rotary = int(dim // heads * config.rope_parameters["partial_rotary_factor"])
        self.parallel = bug != "sequential_residual"
        self.norm_1 = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.attn = Attention(dim, heads, rotary, bug)
        self.norm_2 = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.mlp = FeedForward(dim, config.intermediate_size, bug)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        if self.parallel and self.mlp_first:  # the two branches are independent: either may run first
            fed = self.drop(self.mlp(self.norm_2(x)))
            return x + self.drop(self.attn(self.norm_1(x), angles)) + fed
        attended = self.drop(self.attn(self.norm_1(x), angles))
        if self.parallel:
            return x + attended + self.drop(self.mlp(self.norm_2(x)))
        x = x + attended
        return x + self.drop(self.mlp(self.norm_2(x)))


class Transformer(nn.Module):
    def __init__(self, config, bug: str | None, mlp_first: bool) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        buggy = {"full_rotary": 0, "sequential_residual": 1, "contiguous_qkv": 2, "tanh_gelu": 2}
        self.wte = nn.Embedding(config.vocab_size, config.hidden_size)
        self.h = nn.ModuleList(
            Block(config, bug if buggy.get(bug or "") == i else None, mlp_first)
            for i in range(config.num_hidden_layers)
        )
        self.ln_f = nn.LayerNorm(config.hidden_size, eps=1e-6 if bug == "final_eps" else config.layer_norm_eps)


class PythiaPort(nn.Module):
    def __init__(self, config, bug: str | None = None, mlp_first: bool = False) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.transformer = Transformer(config, bug, mlp_first)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        head = config.hidden_size // config.num_attention_heads
        rotary = head if bug == "full_rotary" else int(head * config.rope_parameters["partial_rotary_factor"])
        base = config.rope_parameters["rope_theta"]
        frequencies = base ** -(torch.arange(0, rotary, 2).float() / rotary)
        positions = torch.arange(config.max_position_embeddings).float()
        self.register_buffer("angles", torch.outer(positions, frequencies), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.transformer.wte(ids)
        for block in self.transformer.h:
            x = block(x, self.angles)
        return self.lm_head(self.transformer.ln_f(x))


def hf_neox(layers: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(seed)
    config = GPTNeoXConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        attn_implementation="eager",
    )
    return randomized(GPTNeoXForCausalLM(config).eval(), 0.2)


def _interleaving(head: int, rotary: int) -> torch.Tensor:
    """The order of one head's channels in the port: the first ``rotary`` channels moved from transformers'
    half-split pairs (i, i + rotary/2) to adjacent pairs (2i, 2i + 1), the rest unchanged."""
    half = rotary // 2
    turned = torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).flatten()
    return torch.cat([turned, torch.arange(rotary, head)])


def port_of(hf, bug: str | None = None, mlp_first: bool = False) -> PythiaPort:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' GPTNeoXForCausalLM), its weights copied; ``mlp_first`` runs each block's
    MLP branch before its attention (the parallel residual allows either order), also as a variant of a bug
    (``"mlp_first+tanh_gelu"``)."""
    config = hf.config
    variant, _, bug = (bug or "").rpartition("+")  # a variant and a bug together: "mlp_first+tanh_gelu"
    if bug == "mlp_first" or variant == "mlp_first":
        bug, mlp_first = (None if bug == "mlp_first" else bug), True
    bug = bug or None
    port = PythiaPort(config, bug, mlp_first).eval()
    heads, dim = config.num_attention_heads, config.hidden_size
    head = dim // heads
    rotary = int(head * config.rope_parameters["partial_rotary_factor"])
    order = _interleaving(head, rotary)
    with torch.no_grad():
        port.transformer.wte.load_state_dict(hf.gpt_neox.embed_in.state_dict())
        for index, (block, layer) in enumerate(zip(port.transformer.h, hf.gpt_neox.layers)):
            fused = layer.attention.query_key_value
            weight, bias = fused.weight, fused.bias
            if bug == "contiguous_qkv" and index == 2:
                parts = zip(weight.chunk(3), bias.chunk(3))
            else:  # [heads, (q k v), head] rows
                per_head_w = weight.view(heads, 3, head, dim)
                per_head_b = bias.view(heads, 3, head)
                parts = ((per_head_w[:, j].reshape(dim, dim), per_head_b[:, j].reshape(dim)) for j in range(3))
            for j, (projection, (w, b)) in enumerate(zip((block.attn.q, block.attn.k, block.attn.v), parts)):
                if j < 2:  # q and k: their rotary channels in the port's interleaved order
                    w, b = w.view(heads, head, dim)[:, order].reshape(dim, dim), b.view(heads, head)[:, order].flatten()
                projection.weight.copy_(w)
                projection.bias.copy_(b if bug != "q_without_bias" or index != 1 or j != 0 else b.new_zeros(dim))
            block.attn.proj.load_state_dict(layer.attention.dense.state_dict())
            block.norm_1.load_state_dict(layer.input_layernorm.state_dict())
            block.norm_2.load_state_dict(layer.post_attention_layernorm.state_dict())
            block.mlp.fc.load_state_dict(layer.mlp.dense_h_to_4h.state_dict())
            block.mlp.proj.load_state_dict(layer.mlp.dense_4h_to_h.state_dict())
        port.transformer.ln_f.load_state_dict(hf.gpt_neox.final_layer_norm.state_dict())
        port.lm_head.load_state_dict(hf.lm_head.state_dict())
    return port


def token_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(seed))


__all__ = ["BUGS", "RULES", "VARIANTS", "PythiaPort", "hf_neox", "port_of", "token_ids"]
