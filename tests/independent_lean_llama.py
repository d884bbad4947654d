"""A Llama written with as few modules as it can: test material for diff.

Where transformers has a module for everything, this port keeps parameters on its blocks and calls functions:
the token embedding is a parameter indexed in the model's own code, every RMS norm is ``F.rms_norm`` on a block's
parameter (no norm module anywhere), the output projection is ``F.linear`` on a parameter, q, k and v come from one
fused ``c_attn`` and gate and up from one fused ``gate_up`` (split with ``split`` / ``chunk``), each attention calls
a ``rotary`` module of its own that builds cos and sin (transformers computes them once per model), and attention
is ``F.scaled_dot_product_attention``. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

BUGS = (
    "rope_base",  # rotary base 10000 where the original uses 500000
    "scale_1_over_d",  # attention scores scaled by 1/d instead of 1/sqrt(d)
    "eps",  # block 1's norms with eps 1e-3 where the original uses 1e-5
    "gate_up_swapped",  # block 2's fused gate_up loaded as [up, gate]
    "gelu",  # block 2's MLP activation GELU instead of SiLU
    "kv_repeat",  # grouped-query heads shared with repeat (0, 1, 0, 1) instead of repeat_interleave (0, 0, 1, 1)
    "no_final_norm",  # the final norm left out, in the model's own code
)

# where each bug lives: the module whose own code (or weights) holds it; "" is the model's own code
CASES = [
    ("llama-lean", "rope_base", False, "blocks.0.attn"),
    ("llama-lean", "scale_1_over_d", False, "blocks.0.attn"),
    ("llama-lean", "eps", False, "blocks.1"),  # the norms are the block's own code
    # layers 0 and 1 show how gate_up lays out gate and up; by statistics the fused parts are compared as a whole
    ("llama-lean", "gate_up_swapped", False, "blocks.2.mlp.gate_up"),
    ("llama-lean", "gelu", False, "blocks.2.mlp"),
    ("llama-lean", "kv_repeat", False, "blocks.0.attn"),
    ("llama-lean", "no_final_norm", False, ""),
]
STATS_EXPECTED = {("llama-lean", "gate_up_swapped"): "blocks.2.mlp"}

RULES = (
    "model.layers.{i}=blocks.{i}",
    "self_attn=attn",
    "o_proj=c_proj",
    "mlp.down_proj=mlp.down",
)


class Rotary(nn.Module):
    def __init__(self, head: int, theta: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, head, 2).float() / head)), persistent=False)

    def forward(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        angles = torch.outer(torch.arange(length).float(), self.inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, theta: float, bug: str | None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, dim // heads
        self.c_attn = nn.Linear(dim, dim + 2 * kv_heads * self.head, bias=False)
        self.c_proj = nn.Linear(dim, dim, bias=False)
        self.rotary = Rotary(self.head, theta)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        kv = self.kv_heads * self.head
        q, k, v = self.c_attn(x).split([d, kv, kv], dim=-1)
        q = q.view(b, t, self.heads, self.head).transpose(1, 2)
        k = k.view(b, t, self.kv_heads, self.head).transpose(1, 2)
        v = v.view(b, t, self.kv_heads, self.head).transpose(1, 2)
        cos, sin = self.rotary(t)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        share = self.heads // self.kv_heads
        if self.bug == "kv_repeat":
            k, v = k.repeat(1, share, 1, 1), v.repeat(1, share, 1, 1)
        else:
            k, v = k.repeat_interleave(share, dim=1), v.repeat_interleave(share, dim=1)
        scale = 1.0 / self.head if self.bug == "scale_1_over_d" else None
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, bug: str | None) -> None:
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down((F.gelu(gate) if self.bug == "gelu" else F.silu(gate)) * up)


class Block(nn.Module):
    def __init__(self, config, theta: float, eps: float, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim = config.hidden_size
        self.norm_1 = nn.Parameter(torch.ones(dim))
        self.norm_2 = nn.Parameter(torch.ones(dim))
        self.attn = Attention(dim, config.num_attention_heads, config.num_key_value_heads, theta, bug)
        self.mlp = MLP(dim, config.intermediate_size, bug)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[-1],)
        x = x + self.attn(F.rms_norm(x, shape, self.norm_1, self.eps))
        return x + self.mlp(F.rms_norm(x, shape, self.norm_2, self.eps))


class LeanLlama(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim, layers = config.hidden_size, config.num_hidden_layers
        theta = 1e4 if bug == "rope_base" else config.rope_parameters["rope_theta"]
        bugged = {"scale_1_over_d": range(layers), "kv_repeat": range(layers), "gelu": [2]}.get(bug or "", ())
        eps = config.rms_norm_eps
        self.wte = nn.Parameter(torch.zeros(config.vocab_size, dim))
        self.blocks = nn.ModuleList(
            Block(config, theta, 1e-3 if bug == "eps" and i == 1 else eps, bug if i in bugged else None)
            for i in range(layers)
        )
        self.norm_f = nn.Parameter(torch.ones(dim))
        self.head = nn.Parameter(torch.zeros(config.vocab_size, dim))
        self.eps, self.bug = eps, bug

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte[ids]
        for block in self.blocks:
            x = block(x)
        if self.bug != "no_final_norm":
            x = F.rms_norm(x, (x.shape[-1],), self.norm_f, self.eps)
        return F.linear(x, self.head)


def port_of(hf, bug: str | None = None) -> LeanLlama:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' LlamaForCausalLM), its weights copied (eval mode)."""
    port = LeanLlama(hf.config, bug)
    with torch.no_grad():
        port.wte.copy_(hf.model.embed_tokens.weight)
        port.norm_f.copy_(hf.model.norm.weight)
        port.head.copy_(hf.lm_head.weight)
        for i, (mine, theirs) in enumerate(zip(port.blocks, hf.model.layers, strict=True)):
            a = theirs.self_attn
            mine.attn.c_attn.weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            mine.attn.c_proj.weight.copy_(a.o_proj.weight)
            gate, up = theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight
            if bug == "gate_up_swapped" and i == 2:
                gate, up = up, gate
            mine.mlp.gate_up.weight.copy_(torch.cat([gate, up]))
            mine.mlp.down.weight.copy_(theirs.mlp.down_proj.weight)
            mine.norm_1.copy_(theirs.input_layernorm.weight)
            mine.norm_2.copy_(theirs.post_attention_layernorm.weight)
    return port.eval()


__all__ = ["BUGS", "CASES", "RULES", "STATS_EXPECTED", "LeanLlama", "port_of"]
