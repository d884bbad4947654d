"""A re-implementation of GPT-2 with other module names, as someone porting a model would write it.

``port_of(gpt2)`` builds it with the weights of a transformers ``GPT2LMHeadModel`` (``nn.Linear`` where GPT-2 has
``Conv1D``, so the weights are transposed; no dropout modules; the attention computed inline). ``GPT2_RULES`` are
the rename rules from GPT-2's module names to the port's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

GPT2_RULES = (
    "transformer.wte=tok_emb",
    "transformer.wpe=pos_emb",
    "transformer.h.{i}=blocks.{i}",
    "transformer.ln_f=norm",
    "lm_head=head",
    "ln_1=norm1",
    "ln_2=norm2",
    "attn.c_attn=attention.qkv",
    "attn.c_proj=attention.out",
    "attn=attention",
    "mlp.c_fc=ffn.up",
    "mlp.c_proj=ffn.down",
    "mlp=ffn",
)

GPT2_ONLY = ("transformer", "transformer.drop", "resid_dropout", "mlp.dropout")
"""Modules of GPT-2 the port does without (path suffixes)."""


class PortAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in self.qkv(x).split(dim, dim=2)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, length, dim))


class PortMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, approximate: str) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate=approximate)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class PortBlock(nn.Module):
    def __init__(self, dim: int, heads: int, eps: float, approximate: str, mlp_residual: bool = True) -> None:
        super().__init__()
        self.mlp_residual = mlp_residual
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attention = PortAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.ffn = PortMLP(dim, 4 * dim, approximate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.ffn(self.norm2(x)) if self.mlp_residual else self.ffn(self.norm2(x))


class PortGPT(nn.Module):
    def __init__(
        self,
        vocab: int,
        positions: int,
        dim: int,
        layers: int,
        heads: int,
        eps: float,
        approximate: str,
        mlp_residual: bool = True,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.pos_emb = nn.Embedding(positions, dim)
        self.blocks = nn.ModuleList(PortBlock(dim, heads, eps, approximate, mlp_residual) for _ in range(layers))
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok_emb.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.tok_emb(input_ids) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _copy_conv1d(linear: nn.Linear, conv: nn.Module) -> None:
    linear.weight.copy_(conv.weight.t())
    linear.bias.copy_(conv.bias)


def port_of(gpt2: nn.Module, approximate: str = "tanh", mlp_residual: bool = True) -> PortGPT:
    """The port with ``gpt2``'s weights. Two classic porting bugs on request: ``approximate="none"`` (the exact GELU
    where GPT-2 uses the tanh approximation) and ``mlp_residual=False`` (the residual connection around the MLP
    forgotten: every module agrees, the block's own code does not)."""
    config = gpt2.config
    port = PortGPT(
        config.vocab_size,
        config.n_positions,
        config.n_embd,
        config.n_layer,
        config.n_head,
        config.layer_norm_epsilon,
        approximate,
        mlp_residual,
    )
    source = gpt2.transformer
    with torch.no_grad():
        port.tok_emb.weight.copy_(source.wte.weight)
        port.pos_emb.weight.copy_(source.wpe.weight)
        for block, original in zip(port.blocks, source.h):
            block.norm1.load_state_dict(original.ln_1.state_dict())
            block.norm2.load_state_dict(original.ln_2.state_dict())
            _copy_conv1d(block.attention.qkv, original.attn.c_attn)
            _copy_conv1d(block.attention.out, original.attn.c_proj)
            _copy_conv1d(block.ffn.up, original.mlp.c_fc)
            _copy_conv1d(block.ffn.down, original.mlp.c_proj)
        port.norm.load_state_dict(source.ln_f.state_dict())
    return port.eval()
