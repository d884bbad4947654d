"""A Qwen2 written the way vLLM writes its models: test material for diff.

vLLM keeps transformers' module names but not their code: q, k and v come from one ``qkv_proj`` (with biases) and
gate and up from one ``gate_up_proj``, whose ``act_fn`` is a ``SiluAndMul`` module given both (transformers' is a SiLU
given the gate), each RMS norm after the first adds the residual it is given and returns the sum apart
(``norm(x, residual) -> (normed, residual)``), a decoder layer returns its MLP's output and the residual apart, one
rotary module is called by every attention with positions, and tokens are flattened (``[T, D]``). Each ``bug``
injects one porting mistake (see ``CASES``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def hf_qwen():  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    c = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        attn_implementation="eager",
        tie_word_embeddings=False,
    )
    m = Qwen2ForCausalLM(c).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n or n.endswith("bias"):
                p.normal_(1.0 if "norm" in n else 0.0, 0.3)
    return m


class RMSNorm(nn.Module):
    def __init__(s, d, eps):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(d))
        s.eps = eps

    def forward(s, x, residual=None):
        if residual is not None:
            x = x + residual
            residual = x
        out = F.rms_norm(x, (x.shape[-1],), s.weight, s.eps)
        return out if residual is None else (out, residual)


class Rotary(nn.Module):
    def __init__(s, hd, theta):
        super().__init__()
        s.hd = hd
        s.register_buffer("inv", 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd)), persistent=False)

    def forward(s, positions, q, k):
        f = torch.outer(positions.float(), s.inv)
        e = torch.cat([f, f], -1)
        cos, sin = e.cos()[:, None, :], e.sin()[:, None, :]

        def rot(t):
            h = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., h:], t[..., :h]], -1) * sin

        T = q.shape[0]
        return rot(q.view(T, -1, s.hd)).reshape(T, -1), rot(k.view(T, -1, s.hd)).reshape(T, -1)


class SiluAndMul(nn.Module):
    def forward(s, x):
        g, u = x.chunk(2, -1)
        return F.silu(g) * u


class Attn(nn.Module):
    def __init__(s, d, nh, nkv, rotary, bug):
        super().__init__()
        s.nh, s.nkv, s.hd = nh, nkv, d // nh
        s.qkv_proj = nn.Linear(d, d + 2 * nkv * s.hd, bias=True)
        s.o_proj = nn.Linear(d, d, bias=False)
        s.rotary = rotary
        s.bug = bug

    def forward(s, positions, x):  # x: [T, D] (tokens flattened, vLLM style)
        T, D = x.shape
        kv = s.nkv * s.hd
        q, k, v = s.qkv_proj(x).split([D, kv, kv], -1)
        q, k = s.rotary(positions, q, k)
        q = q.view(T, s.nh, s.hd).transpose(0, 1)
        k = k.view(T, s.nkv, s.hd).transpose(0, 1)
        v = v.view(T, s.nkv, s.hd).transpose(0, 1)
        k = k.repeat_interleave(s.nh // s.nkv, 0)
        v = v.repeat_interleave(s.nh // s.nkv, 0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=s.bug != "no_causal")
        return s.o_proj(y.transpose(0, 1).reshape(T, D))


class MLP(nn.Module):
    def __init__(s, d, h):
        super().__init__()
        s.gate_up_proj = nn.Linear(d, 2 * h, bias=False)
        s.act_fn = SiluAndMul()
        s.down_proj = nn.Linear(h, d, bias=False)

    def forward(s, x):
        return s.down_proj(s.act_fn(s.gate_up_proj(x)))


class Layer(nn.Module):
    def __init__(s, c, rotary, bug):
        super().__init__()
        d = c.hidden_size
        s.input_layernorm = RMSNorm(d, c.rms_norm_eps)
        s.post_attention_layernorm = RMSNorm(d, 1e-3 if bug == "eps" else c.rms_norm_eps)
        s.self_attn = Attn(d, c.num_attention_heads, c.num_key_value_heads, rotary, bug)
        s.mlp = MLP(d, c.intermediate_size)

    def forward(s, positions, x, residual):
        if residual is None:
            residual = x
            x = s.input_layernorm(x)
        else:
            x, residual = s.input_layernorm(x, residual)
        x = s.self_attn(positions, x)
        x, residual = s.post_attention_layernorm(x, residual)
        return s.mlp(x), residual


class Model(nn.Module):
    def __init__(s, c, bug):
        super().__init__()
        hd = c.hidden_size // c.num_attention_heads
        s.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        s.rotary = Rotary(hd, 5e5 if bug == "rope_base" else c.rope_parameters["rope_theta"])
        s.layers = nn.ModuleList(Layer(c, s.rotary, bug if i == 1 else None) for i in range(c.num_hidden_layers))
        s.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(s, ids, positions):
        x = s.embed_tokens(ids)
        residual = None
        for layer in s.layers:
            x, residual = layer(positions, x, residual)
        x, _ = s.norm(x, residual)
        return x


class ForCausalLM(nn.Module):
    def __init__(s, c, bug):
        super().__init__()
        s.model = Model(c, bug)
        s.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(s, ids):
        ids = ids.reshape(-1)
        return s.lm_head(s.model(ids, torch.arange(ids.shape[0])))[None]


def port_of(hf, bug=None):
    m = ForCausalLM(hf.config, bug)
    with torch.no_grad():
        m.model.embed_tokens.weight.copy_(hf.model.embed_tokens.weight)
        m.lm_head.weight.copy_(hf.lm_head.weight)
        m.model.norm.weight.copy_(hf.model.norm.weight)
        for i, (a, t) in enumerate(zip(m.model.layers, hf.model.layers)):
            sa = t.self_attn
            a.self_attn.qkv_proj.weight.copy_(torch.cat([sa.q_proj.weight, sa.k_proj.weight, sa.v_proj.weight]))
            kb, vb = sa.k_proj.bias, sa.v_proj.bias
            if bug == "kv_bias_swapped" and i == 2:
                kb, vb = vb, kb
            a.self_attn.qkv_proj.bias.copy_(torch.cat([sa.q_proj.bias, kb, vb]))
            a.self_attn.o_proj.weight.copy_(sa.o_proj.weight)
            a.mlp.gate_up_proj.weight.copy_(torch.cat([t.mlp.gate_proj.weight, t.mlp.up_proj.weight]))
            a.mlp.down_proj.weight.copy_(t.mlp.down_proj.weight)
            a.input_layernorm.weight.copy_(t.input_layernorm.weight)
            a.post_attention_layernorm.weight.copy_(t.post_attention_layernorm.weight)
    return m.eval()


# (arch, bug, fused, where it lives)
CASES = [
    ("vllm", "rope_base", False, "model.layers.0.self_attn"),
    ("vllm", "eps", False, "model.layers.1.post_attention_layernorm"),
    ("vllm", "no_causal", False, "model.layers.1.self_attn"),
    # k's and v's biases swapped on load in the fused qkv_proj (by statistics too: the fused call is the port's own)
    ("vllm", "kv_bias_swapped", False, "model.layers.2.self_attn.qkv_proj"),
]
