"""A Llama that keeps its activations sequence-first, ``[T, B, D]``, as Megatron-LM and fairseq do: test material
for diff.

transformers keeps ``[B, T, D]``; this port transposes the token ids once, runs every module on ``[T, B, D]`` and
transposes the logits back. Its modules have names of their own (``emb``, ``layers.{i}.ln1``, ``attn.q``,
``mlp.gate``, ``final``, ``out``), RMS norms are ``F.rms_norm``, rotary angles are built inside each attention and
attention is ``F.scaled_dot_product_attention``. With a batch of two, no activation has its original's shape: only
the same dimensions in another order. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

BUGS = (
    "rope_base",  # rotary base 10000 where the original uses 500000
    "scale_1_over_d",  # attention scores scaled by 1/d instead of 1/sqrt(d)
    "eps",  # layer 1's first norm with eps 1e-3 where the original uses 1e-5
    "gelu",  # layer 1's MLP activation GELU instead of SiLU
    "batch_mixed",  # layer 2's attention reshapes [T, B, D] heads as if it were [B, T, D]: tokens of the batch mix
)

# where each bug lives: the module whose own code holds it
CASES = [
    ("seq-first", "rope_base", False, "layers.0.attn"),
    ("seq-first", "scale_1_over_d", False, "layers.0.attn"),
    ("seq-first", "eps", False, "layers.1.ln1"),
    ("seq-first", "gelu", False, "layers.1.mlp"),
    ("seq-first", "batch_mixed", False, "layers.2.attn"),
]

RULES = ("model.embed_tokens=emb", "model.layers.{i}=layers.{i}", "self_attn=attn", "model.norm=final", "lm_head=out")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, theta: float, bug: str | None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * self.head, bias=False)
        self.v = nn.Linear(dim, kv_heads * self.head, bias=False)
        self.o = nn.Linear(dim, dim, bias=False)
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, self.head, 2).float() / self.head)))
        self.bug = bug

    def _heads(self, x: torch.Tensor, count: int) -> torch.Tensor:
        t, b, _ = x.shape
        if self.bug == "batch_mixed":  # read as [B, T, ...]: wrong whenever B > 1
            return x.reshape(b, t, count, self.head).transpose(1, 2)
        return x.view(t, b, count, self.head).permute(1, 2, 0, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, b, d = x.shape
        q, k, v = (
            self._heads(self.q(x), self.heads),
            self._heads(self.k(x), self.kv_heads),
            self._heads(self.v(x), self.kv_heads),
        )
        angles = torch.outer(torch.arange(t).float(), self.inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()

        def rotate(z: torch.Tensor) -> torch.Tensor:
            half = z.shape[-1] // 2
            return z * cos + torch.cat([-z[..., half:], z[..., :half]], dim=-1) * sin

        q, k = rotate(q), rotate(k)
        share = self.heads // self.kv_heads
        k, v = k.repeat_interleave(share, dim=1), v.repeat_interleave(share, dim=1)
        scale = 1.0 / self.head if self.bug == "scale_1_over_d" else None
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return self.o(y.permute(2, 0, 1, 3).reshape(t, b, d))


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, bug: str | None) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = F.gelu if self.bug == "gelu" else F.silu
        return self.down(act(self.gate(x)) * self.up(x))


class Layer(nn.Module):
    def __init__(self, config, theta: float, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim = config.hidden_size
        self.ln1 = RMSNorm(dim, 1e-3 if bug == "eps" else config.rms_norm_eps)
        self.ln2 = RMSNorm(dim, config.rms_norm_eps)
        self.attn = Attention(dim, config.num_attention_heads, config.num_key_value_heads, theta, bug)
        self.mlp = MLP(dim, config.intermediate_size, bug)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class SeqFirstLlama(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        theta = 1e4 if bug == "rope_base" else config.rope_parameters["rope_theta"]
        layers = config.num_hidden_layers
        where = {"eps": [1], "gelu": [1], "batch_mixed": [2]}.get(bug or "", range(layers))
        self.emb = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Layer(config, theta, bug if i in where else None) for i in range(layers))
        self.final = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.out = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids.t())  # [T, B, D] from here on
        for layer in self.layers:
            x = layer(x)
        return self.out(self.final(x)).transpose(0, 1)


def port_of(hf, bug: str | None = None) -> SeqFirstLlama:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' LlamaForCausalLM), its weights copied (eval mode)."""
    port = SeqFirstLlama(hf.config, bug)
    with torch.no_grad():
        port.emb.weight.copy_(hf.model.embed_tokens.weight)
        port.final.weight.copy_(hf.model.norm.weight)
        port.out.weight.copy_(hf.lm_head.weight)
        for mine, theirs in zip(port.layers, hf.model.layers, strict=True):
            a = theirs.self_attn
            for name, source in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj), ("o", a.o_proj)):
                getattr(mine.attn, name).weight.copy_(source.weight)
            mine.mlp.gate.weight.copy_(theirs.mlp.gate_proj.weight)
            mine.mlp.up.weight.copy_(theirs.mlp.up_proj.weight)
            mine.mlp.down.weight.copy_(theirs.mlp.down_proj.weight)
            mine.ln1.weight.copy_(theirs.input_layernorm.weight)
            mine.ln2.weight.copy_(theirs.post_attention_layernorm.weight)
    return port.eval()


def token_ids() -> torch.Tensor:
    """A batch of two sequences of eight tokens."""
    return torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(1))


__all__ = ["BUGS", "CASES", "RULES", "SeqFirstLlama", "port_of", "token_ids"]
