"""A Llama written the way Meta's reference code writes it, not the way transformers does: test material for diff.

Module names follow Meta's checkpoints (``tok_embeddings``, ``layers.{i}.attention.wq``, ``feed_forward.w1``,
``attention_norm``), rotary embeddings rotate *interleaved* pairs of a head's channels as complex numbers (a
``freqs_cis`` buffer applied inside attention's forward), so q/k weights taken from transformers' half-split layout
are permuted per head on load. ``fused=True`` gives one ``wqkv`` projection. Each ``bug`` injects one porting
mistake (see ``BUGS``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

BUGS = (
    "rope_base",  # rotary base 10000 where the original uses 500000
    "scale_1_over_d",  # attention scores scaled by 1/d instead of 1/sqrt(d)
    "unpermuted_qk",  # q/k weights copied without undoing the half-split layout
    "eps",  # one norm's eps 1e-6 where the original uses 1e-5
    "gate_up_swapped",  # w1 and w3 swapped in the last layer
    "wrong_norm",  # the last layer's feed-forward fed through attention_norm
    "bf16_attention",  # attention computed in bfloat16
)

VARIANTS = ("vkq_order",)  # faithful, not bugs: every attention computes v, then k, then q
# a variant and a bug together: ``"vkq_order+rope_base"``

RULES = (
    "model.embed_tokens=tok_embeddings",
    "model.layers.{i}=layers.{i}",
    "model.norm=norm",
    "lm_head=output",
    "self_attn.q_proj=attention.wq",
    "self_attn.k_proj=attention.wk",
    "self_attn.v_proj=attention.wv",
    "self_attn.o_proj=attention.wo",
    "self_attn=attention",
    "input_layernorm=attention_norm",
    "post_attention_layernorm=ffn_norm",
    "mlp.gate_proj=feed_forward.w1",
    "mlp.up_proj=feed_forward.w3",
    "mlp.down_proj=feed_forward.w2",
    "mlp=feed_forward",
)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.type_as(x)


def precompute_freqs_cis(head_dim: int, length: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    angles = torch.outer(torch.arange(length).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cq = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    ck = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, cq.shape[1], 1, cq.shape[-1])
    return torch.view_as_real(cq * f).flatten(3).type_as(xq), torch.view_as_real(ck * f).flatten(3).type_as(xk)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, fused: bool, bug: str | None) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.fused, self.bug = fused, bug
        self.vkq_order = bug == "vkq_order"
        kv = n_kv_heads * self.head_dim
        if fused:
            self.wqkv = nn.Linear(dim, dim + 2 * kv, bias=False)
        else:
            self.wq = nn.Linear(dim, dim, bias=False)
            self.wk = nn.Linear(dim, kv, bias=False)
            self.wv = nn.Linear(dim, kv, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        bsz, seqlen, dim = x.shape
        kv = self.n_kv_heads * self.head_dim
        if self.fused:
            xq, xk, xv = self.wqkv(x).split([dim, kv, kv], dim=-1)
        elif self.vkq_order:  # faithful: the three projections are independent, any order will do
            xv = self.wv(x)
            xk = self.wk(x)
            xq = self.wq(x)
        else:
            xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        xq = xq.view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = xk.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = xv.view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary(xq, xk, freqs_cis[:seqlen])
        repeat = self.n_heads // self.n_kv_heads
        keys = xk.repeat_interleave(repeat, dim=2).transpose(1, 2)
        values = xv.repeat_interleave(repeat, dim=2).transpose(1, 2)
        xq = xq.transpose(1, 2)
        dtype = x.dtype
        if self.bug == "bf16_attention":
            xq, keys, values = xq.bfloat16(), keys.bfloat16(), values.bfloat16()
        scale = 1.0 / self.head_dim if self.bug == "scale_1_over_d" else 1.0 / math.sqrt(self.head_dim)
        scores = torch.matmul(xq, keys.transpose(2, 3)) * scale + mask.to(xq.dtype)
        probs = F.softmax(scores.float(), dim=-1).type_as(xq)
        out = torch.matmul(probs, values).to(dtype)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: dict, fused: bool, bug: str | None, eps: float) -> None:
        super().__init__()
        dim = cfg["dim"]
        self.bug = bug
        self.attention = Attention(dim, cfg["n_heads"], cfg["n_kv_heads"], fused, bug)
        self.feed_forward = FeedForward(dim, cfg["hidden"])
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, cfg["eps"])

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask)
        norm = self.attention_norm if self.bug == "wrong_norm" else self.ffn_norm
        return h + self.feed_forward(norm(h))


class Transformer(nn.Module):
    def __init__(self, cfg: dict, fused: bool = False, bug: str | None = None, bug_layer: int = -1) -> None:
        super().__init__()
        n_layers = cfg["n_layers"]
        bug_layer %= n_layers
        self.tok_embeddings = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.layers = nn.ModuleList(
            TransformerBlock(
                cfg,
                fused,
                bug if i == bug_layer or bug in ("scale_1_over_d", "bf16_attention", "vkq_order") else None,
                1e-6 if bug == "eps" and i == bug_layer else cfg["eps"],
            )
            for i in range(n_layers)
        )
        self.norm = RMSNorm(cfg["dim"], cfg["eps"])
        self.output = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        theta = 10000.0 if bug == "rope_base" else cfg["theta"]
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(cfg["dim"] // cfg["n_heads"], cfg["max_len"], theta), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seqlen = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=tokens.device).triu(1)
        for layer in self.layers:
            h = layer(h, self.freqs_cis, mask)
        return self.output(self.norm(h)).float()


def _to_interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' half-split rows of each head -> Meta's interleaved rows (undoes convert_llama_weights_to_hf)."""
    out, dim = w.shape
    return w.view(heads, 2, out // heads // 2, dim).transpose(1, 2).reshape(out, dim)


def port_of(hf, fused: bool = False, bug: str | None = None, bug_layer: int = -1) -> Transformer:
    """A ``Transformer`` with the weights of a transformers ``LlamaForCausalLM`` (eval mode); ``bug`` may name a
    variant and a bug together (``"vkq_order+rope_base"``)."""
    variant, _, bug = (bug or "").rpartition("+")
    bug = bug or None
    c = hf.config
    cfg = {
        "dim": c.hidden_size,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "hidden": c.intermediate_size,
        "n_layers": c.num_hidden_layers,
        "vocab": c.vocab_size,
        "eps": c.rms_norm_eps,
        "theta": c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta,
        "max_len": c.max_position_embeddings,
    }
    port = Transformer(cfg, fused, bug, bug_layer)
    n_layers = cfg["n_layers"]
    with torch.no_grad():
        port.tok_embeddings.weight.copy_(hf.model.embed_tokens.weight)
        port.norm.weight.copy_(hf.model.norm.weight)
        port.output.weight.copy_(hf.lm_head.weight)
        for i, (mine, theirs) in enumerate(zip(port.layers, hf.model.layers)):
            a = theirs.self_attn
            permute = bug != "unpermuted_qk" or i != bug_layer % n_layers
            wq = _to_interleaved(a.q_proj.weight, cfg["n_heads"]) if permute else a.q_proj.weight
            wk = _to_interleaved(a.k_proj.weight, cfg["n_kv_heads"]) if permute else a.k_proj.weight
            if fused:
                mine.attention.wqkv.weight.copy_(torch.cat([wq, wk, a.v_proj.weight]))
            else:
                mine.attention.wq.weight.copy_(wq)
                mine.attention.wk.weight.copy_(wk)
                mine.attention.wv.weight.copy_(a.v_proj.weight)
            mine.attention.wo.weight.copy_(a.o_proj.weight)
            gate, up = theirs.mlp.gate_proj.weight, theirs.mlp.up_proj.weight
            if bug == "gate_up_swapped" and i == bug_layer % n_layers:
                gate, up = up, gate
            mine.feed_forward.w1.weight.copy_(gate)
            mine.feed_forward.w3.weight.copy_(up)
            mine.feed_forward.w2.weight.copy_(theirs.mlp.down_proj.weight)
            mine.attention_norm.weight.copy_(theirs.input_layernorm.weight)
            mine.ffn_norm.weight.copy_(theirs.post_attention_layernorm.weight)
            mine.attention.vkq_order = mine.attention.vkq_order or variant == "vkq_order"
    return port.eval()


def hf_llama(theta: float = 500000.0, layers: int = 3, seed: int = 0):
    """A small transformers Llama with random weights (norm weights randomised too, so a swapped norm shows)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=theta,
        attn_implementation="eager",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    return model
