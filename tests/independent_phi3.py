"""A Phi-3 written the way a llama.c / tinygrad style codebase writes it, not the way transformers does: test
material for diff, above all for projections that the original fuses and the port splits.

transformers' ``Phi3ForCausalLM`` computes q, k and v with one ``qkv_proj`` (rows ``[q k v]``, grouped-query: k and v
are half as wide as q) and the gate and up projections with one ``gate_up_proj`` (rows ``[gate up]``). This port
cuts both on load into ``wq``, ``wk``, ``wv`` and ``w1`` (gate), ``w3`` (up), with ``w2`` for ``down_proj``; it
normalises with a hand-written ``RootMeanSquare``, rotates *interleaved* pairs of the first three quarters of each
head's channels as complex numbers (so those rows of ``wq`` and ``wk`` are permuted per head on load), repeats the
key/value heads and computes attention by hand (``softmax(q k^T / sqrt(d) + mask) v``), holds dropout modules in other
places than the original, and adds the residuals in its block's own code. ``port_of`` copies the original's weights;
each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from tests.port_traces import randomized

BUGS = (
    "rope_theta",  # rotary base 500000 where the original uses 10000 (every block)
    "kv_swapped",  # block 1's fused rows cut as [q v k]: wk holds the value rows, wv the key rows
    "gate_up_swapped",  # block 2's gate_up rows cut as [up gate]: w1 holds the up rows, w3 the gate rows
    "gelu",  # block 1's feed-forward gates with GELU where Phi-3 uses SiLU
    "tiled_kv_heads",  # key/value heads repeated by tiling (k0 k1 k0 k1) instead of in place (k0 k0 k1 k1)
    "eps",  # block 0's feed-forward norm with eps 1e-6 where the original uses 1e-5
    "no_final_norm",  # the model's forward feeds the last block's output to the logits without the final norm
)

VARIANTS = ("up_first",)  # faithful, not a bug: every feed-forward computes w3 (up) before w1 (gate)
# a variant and a bug together: ``"up_first+gate_up_swapped"``

# --map: the port's names for the original's modules; the fused qkv_proj and gate_up_proj have no single counterpart
RULES = (
    "model.embed_tokens=tok_emb",
    "model.layers.{i}=blocks.{i}",
    "input_layernorm=pre_attn",
    "post_attention_layernorm=pre_ffn",
    "self_attn.o_proj=attn.wo",
    "self_attn=attn",
    "mlp.down_proj=ffn.w2",
    "mlp=ffn",
    "model.norm=out_norm",
    "lm_head=logits",
)

BUGGY_BLOCK = {"kv_swapped": 1, "gelu": 1, "gate_up_swapped": 2, "eps": 0}


class RootMeanSquare(nn.Module):
    """x / rms(x) * g, in float32."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.g = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.g * (x32 / torch.sqrt((x32 * x32).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype)


def rotate(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """Multiply interleaved channel pairs (0, 1), (2, 3), ... of x's first ``2 * turns.shape[-1]`` channels by the
    unit complex numbers ``turns`` ([T, pairs]); x is [B, T, heads, head]."""
    n = 2 * turns.shape[-1]
    pairs = torch.view_as_complex(x[..., :n].float().reshape(*x.shape[:-1], -1, 2))
    turned = torch.view_as_real(pairs * turns[None, :, None, :]).flatten(-2)
    return torch.cat([turned.to(x.dtype), x[..., n:]], dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, tiled: bool) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.tiled = tiled
        self.wq = nn.Linear(dim, heads * self.hd, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, dim, bias=False)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, turns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        q = rotate(self.wq(x).view(B, T, self.heads, self.hd), turns)
        k = rotate(self.wk(x).view(B, T, self.kv_heads, self.hd), turns)
        v = self.wv(x).view(B, T, self.kv_heads, self.hd)
        n_rep = self.heads // self.kv_heads
        if self.tiled:
            k, v = k.repeat(1, 1, n_rep, 1), v.repeat(1, 1, n_rep, 1)
        else:
            k, v = k.repeat_interleave(n_rep, dim=2), v.repeat_interleave(n_rep, dim=2)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd)) + mask
        att = self.drop(F.softmax(att.float(), dim=-1).to(q.dtype))
        y = (att @ v).permute(0, 2, 1, 3).reshape(B, T, self.heads * self.hd)
        return self.wo(y)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int, gelu: bool, up_first: bool) -> None:
        super().__init__()
        self.gelu, self.up_first = gelu, up_first
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = self.w3(x) if self.up_first else None  # the two projections are independent: either may run first
        gate = self.w1(x)
        gate = F.gelu(gate) if self.gelu else gate * torch.sigmoid(gate)
        return self.w2(gate * (self.w3(x) if up is None else up))


class TransformerBlock(nn.Module):
    def __init__(self, c: dict, bug: str | None, up_first: bool) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.pre_attn = RootMeanSquare(c["dim"], c["eps"])
        self.attn = SelfAttention(c["dim"], c["heads"], c["kv_heads"], bug == "tiled_kv_heads")
        self.pre_ffn = RootMeanSquare(c["dim"], 1e-6 if bug == "eps" else c["eps"])
        self.ffn = SwiGLU(c["dim"], c["hidden"], bug == "gelu", up_first)
        self.resid_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, turns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = x + self.resid_drop(self.attn(self.pre_attn(x), turns, mask))
        return h + self.resid_drop(self.ffn(self.pre_ffn(h)))


class Phi3(nn.Module):
    def __init__(self, c: dict, bug: str | None = None, up_first: bool = False) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.tok_emb = nn.Embedding(c["vocab"], c["dim"])
        self.emb_drop = nn.Dropout(0.0)
        self.blocks = nn.ModuleList(
            TransformerBlock(c, bug if BUGGY_BLOCK.get(bug or "", i) == i else None, up_first)
            for i in range(c["layers"])
        )
        self.out_norm = RootMeanSquare(c["dim"], c["eps"])
        self.final_norm = bug != "no_final_norm"
        self.logits = nn.Linear(c["dim"], c["vocab"], bias=False)
        rot = c["rotary"]
        theta = 500000.0 if bug == "rope_theta" else c["theta"]
        freqs = 1.0 / theta ** (torch.arange(0, rot, 2).float() / rot)
        angles = torch.outer(torch.arange(c["max_len"]).float(), freqs)
        self.register_buffer("turns", torch.polar(torch.ones_like(angles), angles), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.emb_drop(self.tok_emb(tokens))
        for block in self.blocks:
            x = block(x, self.turns[:T], mask)
        return self.logits(self.out_norm(x) if self.final_norm else x)


def hf_phi3(layers: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    """A small transformers Phi-3 (grouped-query, partial rotary) with random weights, norms included."""
    from transformers import Phi3Config, Phi3ForCausalLM

    torch.manual_seed(seed)
    config = Phi3Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        original_max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    return randomized(Phi3ForCausalLM(config).eval(), 0.2)


def _interleaved(rows: torch.Tensor, heads: int, rotary: int) -> torch.Tensor:
    """Each head's first ``rotary`` rows moved from transformers' half-split pairs (i, i + rotary/2) to adjacent
    pairs (2i, 2i + 1); the rest unchanged."""
    out, dim = rows.shape
    head = out // heads
    half = rotary // 2
    turned = torch.stack([torch.arange(half), torch.arange(half) + half], 1).flatten()
    order = torch.cat([turned, torch.arange(rotary, head)])
    return rows.view(heads, head, dim)[:, order].reshape(out, dim)


def port_of(hf, bug: str | None = None) -> Phi3:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' Phi3ForCausalLM) with its weights cut and copied; ``bug`` may name a
    variant, or a variant and a bug together (``"up_first+gate_up_swapped"``)."""
    variant, _, bug = (bug or "").rpartition("+")
    if bug in VARIANTS:
        variant, bug = bug, ""
    bug = bug or None
    cfg = hf.config
    head = cfg.hidden_size // cfg.num_attention_heads
    rotary = int(head * cfg.rope_parameters.get("partial_rotary_factor", 1.0))
    c = {
        "dim": cfg.hidden_size,
        "heads": cfg.num_attention_heads,
        "kv_heads": cfg.num_key_value_heads,
        "hidden": cfg.intermediate_size,
        "layers": cfg.num_hidden_layers,
        "vocab": cfg.vocab_size,
        "eps": cfg.rms_norm_eps,
        "theta": cfg.rope_parameters["rope_theta"],
        "rotary": rotary,
        "max_len": cfg.max_position_embeddings,
    }
    port = Phi3(c, bug, up_first=variant == "up_first")
    q_rows, kv_rows = c["heads"] * head, c["kv_heads"] * head
    with torch.no_grad():
        port.tok_emb.weight.copy_(hf.model.embed_tokens.weight)
        port.out_norm.g.copy_(hf.model.norm.weight)
        port.logits.weight.copy_(hf.lm_head.weight)
        for i, (mine, theirs) in enumerate(zip(port.blocks, hf.model.layers)):
            wq, wk, wv = theirs.self_attn.qkv_proj.weight.split([q_rows, kv_rows, kv_rows])
            if bug == "kv_swapped" and i == BUGGY_BLOCK[bug]:
                wk, wv = wv, wk
            mine.attn.wq.weight.copy_(_interleaved(wq, c["heads"], rotary))
            mine.attn.wk.weight.copy_(_interleaved(wk, c["kv_heads"], rotary))
            mine.attn.wv.weight.copy_(wv)
            mine.attn.wo.weight.copy_(theirs.self_attn.o_proj.weight)
            gate, up = theirs.mlp.gate_up_proj.weight.chunk(2)
            if bug == "gate_up_swapped" and i == BUGGY_BLOCK[bug]:
                gate, up = up, gate
            mine.ffn.w1.weight.copy_(gate)
            mine.ffn.w3.weight.copy_(up)
            mine.ffn.w2.weight.copy_(theirs.mlp.down_proj.weight)
            mine.pre_attn.g.copy_(theirs.input_layernorm.weight)
            mine.pre_ffn.g.copy_(theirs.post_attention_layernorm.weight)
    return port.eval()


def token_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(seed))


# (arch, bug, fused, the port's module that must be named): for a wrong weight, that projection; for a mistake in a
# module's own code (the rotary base, the head repeat, an inlined activation), that module
CASES = [
    ("phi3", "rope_theta", False, "blocks.0.attn"),
    ("phi3", "kv_swapped", False, "blocks.1.attn.wk"),
    ("phi3", "gate_up_swapped", False, "blocks.2.ffn.w1"),
    ("phi3", "gelu", False, "blocks.1.ffn"),
    ("phi3", "tiled_kv_heads", False, "blocks.0.attn"),
    ("phi3", "eps", False, "blocks.0.pre_ffn"),
    ("phi3", "no_final_norm", False, ""),  # "": the model's own code
]

# a faithful re-ordering and a bug in the same port: the order of gate and up the agreeing blocks show decides; w3
# (holding the gate's rows) runs first
COMPOUND_CASES = [("phi3", "up_first+gate_up_swapped", False, "blocks.2.ffn.w3")]

# what only statistics can tell: the parts of a fused call are compared as a whole, so the port's module that calls
# them is the most precise answer there is
STATS_EXPECTED = {
    ("phi3", "kv_swapped"): "blocks.1.attn",
    ("phi3", "gate_up_swapped"): "blocks.2.ffn",
    ("phi3", "up_first+gate_up_swapped"): "blocks.2.ffn",
}

__all__ = [
    "BUGS",
    "CASES",
    "COMPOUND_CASES",
    "RULES",
    "STATS_EXPECTED",
    "VARIANTS",
    "Phi3",
    "hf_phi3",
    "port_of",
    "token_ids",
]
