"""A GPT-2 written the way nanoGPT writes it, not the way transformers does: test material for diff.

One fused ``c_qkv`` ``nn.Linear`` per block (transformers' ``Conv1D`` weights transposed), attention computed by hand
with a causal-mask buffer, the position embedding called on positions of shape ``[T]`` (it returns ``[T, D]`` where
transformers' returns ``[1, T, D]``), dropout modules where GPT-2 has none, other module names. Each ``bug``
injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

BUGS = (
    "exact_gelu",  # erf GELU where GPT-2 uses the tanh approximation
    "scale_1_over_d",  # attention scores scaled by 1/d instead of 1/sqrt(d)
    "post_norm",  # one block normalises after the residual instead of before the attention
    "bf16_activation",  # the MLP's activation rounded through bfloat16 in one block
    "eps",  # one block's second LayerNorm with eps 1e-6 where GPT-2 uses 1e-5
    "bf16_attention",  # attention computed in bfloat16
)

RULES = (
    "transformer.wte=wte",
    "transformer.wpe=wpe",
    "transformer.h.{i}=h.{i}",
    "transformer.ln_f=ln_f",
    "lm_head=lm_head",
    "ln_1=ln1",
    "ln_2=ln2",
    "attn.c_proj=attn.out",
    "mlp.c_fc=mlp.fc",
    "mlp.c_proj=mlp.proj",
    "mlp.act=mlp.gelu",
)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, context: int, bug: str | None) -> None:
        super().__init__()
        self.heads, self.bug = heads, bug
        self.c_qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(0.1)
        self.resid_drop = nn.Dropout(0.1)
        self.register_buffer("bias", torch.tril(torch.ones(context, context)).view(1, 1, context, context))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        if self.bug == "bf16_attention":
            q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()
        d = k.size(-1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / d if self.bug == "scale_1_over_d" else 1.0 / math.sqrt(d))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att.float(), dim=-1).to(q.dtype))
        y = (att @ v).to(x.dtype).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_drop(self.out(y))


class TanhGELU(nn.Module):
    def __init__(self, exact: bool) -> None:
        super().__init__()
        self.exact = exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.exact:
            return F.gelu(x)
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(nn.Module):
    def __init__(self, dim: int, bug: str | None) -> None:
        super().__init__()
        self.bug = bug
        self.fc = nn.Linear(dim, 4 * dim)
        self.gelu = TanhGELU(exact=bug == "exact_gelu")
        self.proj = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gelu(self.fc(x))
        if self.bug == "bf16_activation":
            h = h.to(torch.bfloat16).to(x.dtype)
        return self.drop(self.proj(h))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, context: int, eps: float, bug: str | None) -> None:
        super().__init__()
        self.bug = bug
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.attn = CausalSelfAttention(dim, heads, context, bug)
        self.ln2 = nn.LayerNorm(dim, eps=1e-6 if bug == "eps" else eps)
        self.mlp = MLP(dim, bug)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bug == "post_norm":
            x = self.ln1(x + self.attn(x))
        else:
            x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self, vocab: int, context: int, dim: int, heads: int, layers: int, eps: float, bug: str | None, bug_layer: int
    ) -> None:
        super().__init__()
        bug_layer %= layers
        everywhere = bug in ("scale_1_over_d", "bf16_attention", "exact_gelu")
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.drop = nn.Dropout(0.1)
        self.h = nn.ModuleList(
            Block(dim, heads, context, eps, bug if everywhere or i == bug_layer else None) for i in range(layers)
        )
        self.ln_f = nn.LayerNorm(dim, eps=eps)
        self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def port_of(hf, bug: str | None = None, bug_layer: int = -1) -> GPT:
    """A ``GPT`` with the weights of a transformers ``GPT2LMHeadModel`` (eval mode)."""
    c = hf.config
    port = GPT(c.vocab_size, c.n_positions, c.n_embd, c.n_head, c.n_layer, c.layer_norm_epsilon, bug, bug_layer)
    t = hf.transformer
    with torch.no_grad():
        port.wte.weight.copy_(t.wte.weight)
        port.wpe.weight.copy_(t.wpe.weight)
        port.lm_head.weight.copy_(hf.lm_head.weight)
        port.ln_f.load_state_dict(t.ln_f.state_dict())
        for mine, theirs in zip(port.h, t.h):
            mine.ln1.load_state_dict(theirs.ln_1.state_dict())
            mine.ln2.load_state_dict(theirs.ln_2.state_dict())
            for linear, conv in (
                (mine.attn.c_qkv, theirs.attn.c_attn),
                (mine.attn.out, theirs.attn.c_proj),
                (mine.mlp.fc, theirs.mlp.c_fc),
                (mine.mlp.proj, theirs.mlp.c_proj),
            ):
                linear.weight.copy_(conv.weight.t())
                linear.bias.copy_(conv.bias)
    return port.eval()


def hf_gpt2(layers: int = 3, seed: int = 0):
    """A small transformers GPT-2 with random weights (LayerNorm weights randomised too)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=128,
        n_positions=64,
        n_embd=64,
        n_layer=layers,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                p.copy_(p + 0.3 * torch.randn_like(p))
    return model


# -- a second style: separate q, k, v projections (GPT-2 fuses them in c_attn), scaled_dot_product_attention, a
# hand-written LayerNorm, the MLP inline in the block, a position table as a parameter -------------------------------


class HandNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.g, self.b, self.eps = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.zeros(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + self.eps) * self.g + self.b


SPLIT_BUGS = (
    "exact_gelu",  # block 1's inlined MLP uses the erf GELU (the block's own code: it has no MLP module)
    "eps",  # block 1's second norm with eps 1e-2
    "attention_scale",  # block 1's attention scores scaled by 0.1
)


class SplitAttention(nn.Module):
    def __init__(self, dim: int, heads: int, bug: str | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.scale = 0.1 if bug == "attention_scale" else None
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, self.heads, C // self.heads).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.o(y.transpose(1, 2).reshape(B, T, C))


class SplitBlock(nn.Module):
    def __init__(self, dim: int, heads: int, eps: float, bug: str | None = None) -> None:
        super().__init__()
        self.n1, self.a = HandNorm(dim, eps), SplitAttention(dim, heads, bug)
        self.n2 = HandNorm(dim, 1e-2 if bug == "eps" else eps)
        self.fc, self.pr = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
        self.approximate = "none" if bug == "exact_gelu" else "tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.a(self.n1(x))
        return x + self.pr(F.gelu(self.fc(self.n2(x)), approximate=self.approximate))


class SplitGPT(nn.Module):
    def __init__(
        self, vocab: int, context: int, dim: int, heads: int, layers: int, eps: float, bug: str | None = None
    ) -> None:
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.ModuleList(SplitBlock(dim, heads, eps, bug if i == 1 else None) for i in range(layers))
        self.nf, self.head = HandNorm(dim, eps), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.nf(x))


def split_port_of(hf, bug: str | None = None) -> SplitGPT:  # type: ignore[no-untyped-def]
    """A ``SplitGPT`` with the weights of a transformers ``GPT2LMHeadModel``: c_attn cut into q, k and v, the MLP
    inlined into the block (no module of its own); ``bug`` one of ``SPLIT_BUGS``, in block 1."""
    c, t = hf.config, hf.transformer
    port = SplitGPT(c.vocab_size, c.n_positions, c.n_embd, c.n_head, c.n_layer, c.layer_norm_epsilon, bug)
    d = c.n_embd
    with torch.no_grad():
        port.emb.weight.copy_(t.wte.weight)
        port.pos.copy_(t.wpe.weight)
        port.head.weight.copy_(hf.lm_head.weight)
        for norm, theirs in ((port.nf, t.ln_f),):
            norm.g.copy_(theirs.weight), norm.b.copy_(theirs.bias)
        for mine, theirs in zip(port.blocks, t.h):
            for norm, ln in ((mine.n1, theirs.ln_1), (mine.n2, theirs.ln_2)):
                norm.g.copy_(ln.weight), norm.b.copy_(ln.bias)
            weight, bias = theirs.attn.c_attn.weight, theirs.attn.c_attn.bias
            for i, linear in enumerate((mine.a.q, mine.a.k, mine.a.v)):
                linear.weight.copy_(weight[:, i * d : (i + 1) * d].t())
                linear.bias.copy_(bias[i * d : (i + 1) * d])
            for linear, conv in (
                (mine.a.o, theirs.attn.c_proj),
                (mine.fc, theirs.mlp.c_fc),
                (mine.pr, theirs.mlp.c_proj),
            ):
                linear.weight.copy_(conv.weight.t())
                linear.bias.copy_(conv.bias)
    return port.eval()
