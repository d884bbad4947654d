"""A grouped-query Llama written the way Lightning-AI's litgpt writes ``litgpt/model.py``, not the way transformers
does: test material for diff, above all for a fused projection laid out per query group and for state computed once
at the top and handed down.

transformers' ``LlamaForCausalLM`` wraps its layers in ``model``, computes cos and sin in a ``rotary_emb`` module on
every forward, and gives each attention ``q_proj``, ``k_proj``, ``v_proj`` and ``o_proj``. This port is a ``GPT`` with
``lm_head`` and ``transformer = nn.ModuleDict(wte, h, ln_f)`` (the dict is never called: GPT's own code runs its
members); GPT builds its rope cache (``cos``, ``sin``) and a boolean mask cache once, as buffers, and passes slices of
them to every ``Block``. Each block's ``CausalSelfAttention`` holds ONE fused ``attn`` Linear whose rows are laid out
per query group, as litgpt's checkpoint converter lays them out: for each key/value group, that group's query heads,
then its key head, then its value head. Rotary is applied by a function, ``apply_rope``, on the half-split layout; the
key/value heads are expanded per group; attention is ``scaled_dot_product_attention`` with the mask it is given. The
MLP is litgpt's ``LLaMAMLP`` (``fc_1`` the gate, ``fc_2`` the up projection, ``proj``, no activation module) and the
RMS norm computes in float32 and applies its weight after casting back. ``port_of`` converts the weights of the
original. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tests.port_traces import randomized

BUGS = (
    "contiguous_qkv",  # the fused attn rows converted as [q k v] while the forward reads them per query group
    "fc_swapped",  # block 1's fc_1 (gate) and fc_2 (up) swapped on load
    "no_ln_f",  # GPT's forward skips transformer.ln_f
    "mask_diagonal",  # GPT's mask cache built with tril(diagonal=1): each token also sees the next one
    "kv_tiled",  # the key/value heads shared with repeat (0, 1, 0, 1) where each group's heads are (0, 0, 1, 1)
    "rope_base",  # GPT's rope cache computed with base 10000 where the original uses 500000
)

# (arch, bug, fused, the port's module that must be named); "" is GPT's own code
CASES = [
    # every block's fused output holds q, k and v intact, side by side: a layout a port may use; the code that reads
    # them per group is the attention's, and nothing in a trace of module calls tells which of the two is wrong
    ("litgpt", "contiguous_qkv", False, "transformer.h.0.attn"),
    ("litgpt", "fc_swapped", False, "transformer.h.1.mlp.fc_1"),
    ("litgpt", "no_ln_f", False, ""),
    ("litgpt", "mask_diagonal", False, ""),  # the mask cache is GPT's: block 0 is already given a wrong mask
    ("litgpt", "kv_tiled", False, "transformer.h.0.attn"),
    ("litgpt", "rope_base", False, ""),  # the rope cache is GPT's: block 0 is already given wrong cos and sin
]
# by statistics a mask's pattern cannot be seen (transformers' additive mask keeps no fingerprint): block 0's
# attention, given what agrees as far as statistics tell, is the first call whose output departs
STATS_EXPECTED = {("litgpt", "mask_diagonal"): "transformer.h.0.attn"}

RULES = (
    "model.embed_tokens=transformer.wte",
    "model.layers.{i}=transformer.h.{i}",
    "model.norm=transformer.ln_f",
    "input_layernorm=norm_1",
    "post_attention_layernorm=norm_2",
    "self_attn=attn",
    "o_proj=proj",
    "gate_proj=fc_1",
    "up_proj=fc_2",
    "down_proj=proj",
)

THETA = 500000.0


def build_rope_cache(seq_len: int, n_elem: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2).float() / n_elem))
    idx_theta = torch.outer(torch.arange(seq_len).float(), theta).repeat(1, 2)
    return torch.cos(idx_theta), torch.sin(idx_theta)


def build_mask_cache(max_seq_length: int, diagonal: int = 0) -> torch.Tensor:
    ones = torch.ones((max_seq_length, max_seq_length), dtype=torch.bool)
    return torch.tril(ones, diagonal=diagonal).unsqueeze(0).unsqueeze(0)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    head_size = x.size(-1)
    x1 = x[..., : head_size // 2]
    x2 = x[..., head_size // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    roped = (x * cos) + (rotated * sin)
    return roped.to(dtype=x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        x_normed = x * torch.rsqrt(norm_x + self.eps)
        return self.weight * x_normed.to(dtype=dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_query_groups: int, head_size: int, tiled: bool) -> None:
        super().__init__()
        shape = (n_head + 2 * n_query_groups) * head_size
        self.attn = nn.Linear(n_embd, shape, bias=False)  # q, k, v of every query group, one group after the other
        self.proj = nn.Linear(n_head * head_size, n_embd, bias=False)
        self.n_head, self.n_query_groups, self.head_size = n_head, n_query_groups, head_size
        self.tiled = tiled

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        qkv = self.attn(x)
        q_per_kv = self.n_head // self.n_query_groups
        total_qkv = q_per_kv + 2  # each group has 1+ queries, 1 key, and 1 value
        qkv = qkv.view(B, T, self.n_query_groups, total_qkv, self.head_size)
        qkv = qkv.permute(0, 2, 3, 1, 4)  # (B, n_query_groups, total_qkv, T, hs)
        q, k, v = qkv.split((q_per_kv, 1, 1), dim=2)
        if self.tiled:  # every key/value head once per query head, but in the order (0, 1, 0, 1)
            k = k.reshape(B, self.n_query_groups, T, self.head_size).repeat(1, q_per_kv, 1, 1)
            v = v.reshape(B, self.n_query_groups, T, self.head_size).repeat(1, q_per_kv, 1, 1)
        elif self.n_query_groups != self.n_head:
            k = k.expand(B, self.n_query_groups, q_per_kv, T, self.head_size)
            v = v.expand(B, self.n_query_groups, q_per_kv, T, self.head_size)
        q = q.reshape(B, -1, T, self.head_size)  # (B, nh_q, T, hs)
        k = k.reshape(B, -1, T, self.head_size)
        v = v.reshape(B, -1, T, self.head_size)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        scale = 1.0 / math.sqrt(self.head_size)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=scale)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_size)
        return self.proj(y)


class LLaMAMLP(nn.Module):
    def __init__(self, n_embd: int, intermediate_size: int) -> None:
        super().__init__()
        self.fc_1 = nn.Linear(n_embd, intermediate_size, bias=False)
        self.fc_2 = nn.Linear(n_embd, intermediate_size, bias=False)
        self.proj = nn.Linear(intermediate_size, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_fc_1 = self.fc_1(x)
        x_fc_2 = self.fc_2(x)
        x = F.silu(x_fc_1) * x_fc_2
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, config, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        n_embd, eps = config.hidden_size, config.rms_norm_eps
        self.norm_1 = RMSNorm(n_embd, eps=eps)
        self.attn = CausalSelfAttention(
            n_embd, config.num_attention_heads, config.num_key_value_heads, config.head_dim, bug == "kv_tiled"
        )
        self.norm_2 = RMSNorm(n_embd, eps=eps)
        self.mlp = LLaMAMLP(n_embd, config.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attn(self.norm_1(x), cos, sin, mask) + x
        return self.mlp(self.norm_2(x)) + x


class GPT(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.hidden_size),
                h=nn.ModuleList(Block(config, bug) for _ in range(config.num_hidden_layers)),
                ln_f=RMSNorm(config.hidden_size, eps=config.rms_norm_eps),
            )
        )
        block_size = config.max_position_embeddings
        base = 10000.0 if bug == "rope_base" else config.rope_parameters["rope_theta"]
        cos, sin = build_rope_cache(block_size, config.head_dim, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        diagonal = 1 if bug == "mask_diagonal" else 0
        self.register_buffer("mask_cache", build_mask_cache(block_size, diagonal), persistent=False)
        self.skip_ln_f = bug == "no_ln_f"

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        cos = self.cos[:T].unsqueeze(0)  # (1, T, rope_n_elem)
        sin = self.sin[:T].unsqueeze(0)
        mask = self.mask_cache[:, :, :T, :T]
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x, cos, sin, mask)
        if not self.skip_ln_f:
            x = self.transformer.ln_f(x)
        return self.lm_head(x)


def hf_llama_gqa(layers: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    """A tiny transformers Llama with grouped-query attention (4 query heads, 2 key/value heads) and random weights,
    norms included."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
        attn_implementation="eager",
    )
    return randomized(LlamaForCausalLM(config).eval(), 0.2)


def qkv_reassemble(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """transformers' q, k and v weights as litgpt's fused rows: per query group, its query heads, its key head, its
    value head."""
    head_size, groups = config.head_dim, config.num_key_value_heads
    qs = q.split(config.num_attention_heads // groups * head_size)
    ks = k.split(head_size)
    vs = v.split(head_size)
    return torch.cat([t for group in zip(qs, ks, vs, strict=True) for t in group])


def port_of(hf, bug: str | None = None) -> GPT:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' LlamaForCausalLM), its weights converted (eval mode)."""
    config = hf.config
    port = GPT(config, bug)
    with torch.no_grad():
        port.transformer.wte.weight.copy_(hf.model.embed_tokens.weight)
        port.transformer.ln_f.weight.copy_(hf.model.norm.weight)
        port.lm_head.weight.copy_(hf.lm_head.weight)
        for i, (block, layer) in enumerate(zip(port.transformer.h, hf.model.layers, strict=True)):
            a = layer.self_attn
            q, k, v = a.q_proj.weight, a.k_proj.weight, a.v_proj.weight
            fused = torch.cat([q, k, v]) if bug == "contiguous_qkv" else qkv_reassemble(q, k, v, config)
            block.attn.attn.weight.copy_(fused)
            block.attn.proj.weight.copy_(a.o_proj.weight)
            gate, up = layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight
            if bug == "fc_swapped" and i == 1:
                gate, up = up, gate
            block.mlp.fc_1.weight.copy_(gate)
            block.mlp.fc_2.weight.copy_(up)
            block.mlp.proj.weight.copy_(layer.mlp.down_proj.weight)
            block.norm_1.weight.copy_(layer.input_layernorm.weight)
            block.norm_2.weight.copy_(layer.post_attention_layernorm.weight)
    return port.eval()


def token_ids(seed: int = 1) -> torch.Tensor:
    """A batch of two sequences of 8 tokens."""
    return torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(seed))


__all__ = ["BUGS", "CASES", "GPT", "RULES", "STATS_EXPECTED", "hf_llama_gqa", "port_of", "token_ids"]
