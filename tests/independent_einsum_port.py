"""A Gemma written the way a JAX/Flax model converted to PyTorch writes it (gemma's JAX reference, MaxText, EasyDeL),
not the way transformers does: test material for diff, above all for projections whose outputs keep their heads on
an axis of their own.

transformers' ``GemmaForCausalLM`` projects with ``nn.Linear``: ``q_proj`` returns ``[B, T, H*Dh]``, ``k_proj`` and
``v_proj`` ``[B, T, K*Dh]``, ``gate_proj`` and ``up_proj`` ``[B, T, F]``. This port holds no ``nn.Linear``: every
projection is an ``Einsum`` module whose weight keeps the einsum shape, ``q_einsum`` ``[D, H, Dh]`` returning
``[B, T, H, Dh]``, one ``kv_einsum`` ``[2, D, K, Dh]`` returning k and v stacked on a new leading axis
(``[2, B, T, K, Dh]``), ``attn_vec_einsum`` ``[H, Dh, D]`` taking ``[B, T, H, Dh]``, the MLP's ``gating_einsum``
``[2, D, F]`` (gate and up stacked, ``[2, B, T, F]``) and ``linear`` ``[F, D]``. The embedder is a module whose
``encode`` (scaled by sqrt(D)) and ``decode`` (logits as an einsum with the embedding table) are called as methods,
so neither is a call of its own; rotary embeddings are a plain function on the split halves, the norms use Gemma's
``(1 + scale)``. ``port_of`` copies the original's weights; each ``bug`` injects one porting mistake (``BUGS``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from tests.port_traces import randomized

BUGS = (
    "kv_swapped",  # block 1's kv_einsum loaded as [v, k]: the keys hold the value weights and back
    "rotary_on_v",  # block 0's attention rotates the values too
    "unscaled_embedding",  # the embedder's encode forgets the sqrt(D) scale
    "scale_not_one_plus",  # block 1's pre-feed-forward norm multiplies by scale instead of (1 + scale)
    "exact_gelu",  # block 2's feed-forward gates with exact GELU where Gemma uses the tanh approximation
    "gate_up_swapped",  # block 2's gating_einsum loaded as [up, gate]
    "unscaled_query",  # block 1's attention forgets the 1/sqrt(Dh) query scaling
)

# faithful, not a bug: kv_einsum and gating_einsum put their parts on an axis after the tokens ([B, T, 2, K, Dh],
# [B, T, 2, F]: MaxText's fused projections), so their outputs are the parts side by side in a split last dim; a
# variant and a bug together: ``"parts_inside+kv_swapped"``
VARIANTS = ("parts_inside",)

BUGGY_BLOCK = {"kv_swapped": 1, "rotary_on_v": 0, "scale_not_one_plus": 1, "exact_gelu": 2, "gate_up_swapped": 2}
BUGGY_BLOCK["unscaled_query"] = 1

# (arch, bug, fused, the port's module that must be named); "" is the model's own code (the embedder is called as a
# method, so the scale it forgets lies in no call of its own)
CASES = [
    ("einsum", "kv_swapped", False, "blocks.1.attn.kv_einsum"),
    ("einsum", "rotary_on_v", False, "blocks.0.attn"),
    ("einsum", "unscaled_embedding", False, ""),
    ("einsum", "scale_not_one_plus", False, "blocks.1.pre_ffw_norm"),
    ("einsum", "exact_gelu", False, "blocks.2.mlp"),
    ("einsum", "gate_up_swapped", False, "blocks.2.mlp.gating_einsum"),
    ("einsum", "unscaled_query", False, "blocks.1.attn"),
]

# what only statistics can tell: the parts of a fused call are compared as a whole, so the port's module that calls
# it is the most precise answer there is
COMPOUND_CASES = [
    ("einsum", "parts_inside+kv_swapped", False, "blocks.1.attn.kv_einsum"),
    ("einsum", "parts_inside+gate_up_swapped", False, "blocks.2.mlp.gating_einsum"),
]

STATS_EXPECTED = {
    ("einsum", "kv_swapped"): "blocks.1.attn",
    ("einsum", "gate_up_swapped"): "blocks.2.mlp",
    ("einsum", "parts_inside+kv_swapped"): "blocks.1.attn",
    ("einsum", "parts_inside+gate_up_swapped"): "blocks.2.mlp",
}

# --map: the port's names for the original's modules; k_proj and v_proj share one kv_einsum, gate_proj and up_proj
# one gating_einsum, and the embedding and lm_head are the model's own code
RULES = (
    "model.layers.{i}=blocks.{i}",
    "input_layernorm=pre_attention_norm",
    "post_attention_layernorm=pre_ffw_norm",
    "self_attn.q_proj=attn.q_einsum",
    "self_attn.o_proj=attn.attn_vec_einsum",
    "self_attn=attn",
    "mlp.down_proj=mlp.linear",
    "model.norm=final_norm",
)


class Einsum(nn.Module):
    """A weight in einsum shape, applied by ``torch.einsum(equation, x, w)`` (Flax's ``layers.Einsum``)."""

    def __init__(self, *shape: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(shape))

    def forward(self, equation: str, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum(equation, x, self.w)


class RMSNorm(nn.Module):
    """Gemma's norm: x / rms(x) * (1 + scale), in float32."""

    def __init__(self, size: int, eps: float, one_plus: bool = True) -> None:
        super().__init__()
        self.eps, self.one_plus = eps, one_plus
        self.scale = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = torch.mean(torch.square(x.float()), dim=-1, keepdim=True)
        normed = x.float() * torch.rsqrt(var + self.eps)
        scale = 1 + self.scale if self.one_plus else self.scale
        return (normed * scale.float()).to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate ``x`` ([B, T, N, Dh]) by ``positions`` ([B, T]): the first half of each head's channels against the
    second half, as gemma's reference does."""
    half = x.shape[-1] // 2
    fraction = 2 * torch.arange(half, dtype=torch.float32) / x.shape[-1]
    timescale = base**fraction
    angles = positions[..., None, None].float() / timescale  # [B, T, 1, half]
    sin, cos = torch.sin(angles), torch.cos(angles)
    first, second = torch.split(x, half, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: dict, bug: str | None) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.base = c["heads"], c["kv_heads"], c["head_dim"], c["base"]
        self.bug, self.parts_inside = bug, c["parts_inside"]
        self.q_einsum = Einsum(c["dim"], c["heads"], c["head_dim"])
        self.kv_einsum = Einsum(2, c["dim"], c["kv_heads"], c["head_dim"])
        self.attn_vec_einsum = Einsum(c["heads"], c["head_dim"], c["dim"])

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        query = self.q_einsum("btd,dnh->btnh", x)
        if self.parts_inside:
            key, value = self.kv_einsum("btd,sdkh->btskh", x).unbind(2)
        else:
            key, value = self.kv_einsum("btd,sdkh->sbtkh", x)
        query = apply_rope(query, positions, self.base)
        key = apply_rope(key, positions, self.base)
        if self.bug == "rotary_on_v":
            value = apply_rope(value, positions, self.base)
        if self.bug != "unscaled_query":
            query = query * self.head_dim**-0.5
        b, t, _, h = query.shape
        grouped = query.reshape(b, t, self.kv_heads, self.heads // self.kv_heads, h)
        logits = torch.einsum("btkgh,bskh->bkgts", grouped, key)
        logits = torch.where(mask, logits, torch.finfo(logits.dtype).min)
        probs = F.softmax(logits.float(), dim=-1).to(value.dtype)
        encoded = torch.einsum("bkgts,bskh->btkgh", probs, value).reshape(b, t, self.heads, h)
        return self.attn_vec_einsum("btnh,nhd->btd", encoded)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, exact_gelu: bool, parts_inside: bool) -> None:
        super().__init__()
        self.approximate, self.parts_inside = "none" if exact_gelu else "tanh", parts_inside
        self.gating_einsum = Einsum(2, dim, hidden)
        self.linear = Einsum(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parts_inside:
            gate, up = self.gating_einsum("btd,sdf->btsf", x).unbind(2)
        else:
            gate, up = self.gating_einsum("btd,sdf->sbtf", x)
        return self.linear("btf,fd->btd", F.gelu(gate, approximate=self.approximate) * up)


class Block(nn.Module):
    def __init__(self, c: dict, bug: str | None) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.pre_attention_norm = RMSNorm(c["dim"], c["eps"])
        self.attn = Attention(c, bug)
        self.pre_ffw_norm = RMSNorm(c["dim"], c["eps"], one_plus=bug != "scale_not_one_plus")
        self.mlp = FeedForward(c["dim"], c["hidden"], bug == "exact_gelu", c["parts_inside"])

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.pre_attention_norm(x), positions, mask)
        return x + self.mlp(self.pre_ffw_norm(x))


class Embedder(nn.Module):
    def __init__(self, vocab: int, dim: int, scaled: bool) -> None:
        super().__init__()
        self.scaled = scaled
        self.input_embedding_table = nn.Parameter(torch.zeros(vocab, dim))

    def encode(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.input_embedding_table[tokens]
        return x * math.sqrt(x.shape[-1]) if self.scaled else x

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("btd,vd->btv", x, self.input_embedding_table)


class Transformer(nn.Module):
    def __init__(self, c: dict, bug: str | None = None) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.embedder = Embedder(c["vocab"], c["dim"], scaled=bug != "unscaled_embedding")
        self.blocks = nn.ModuleList(
            Block(c, bug if BUGGY_BLOCK.get(bug or "", i) == i else None) for i in range(c["layers"])
        )
        self.final_norm = RMSNorm(c["dim"], c["eps"])

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, t = tokens.shape
        positions = torch.arange(t)[None].expand(b, t)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        x = self.embedder.encode(tokens)
        for block in self.blocks:
            x = block(x, positions, mask)
        return self.embedder.decode(self.final_norm(x))


def hf_gemma(layers: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    """A small transformers Gemma (grouped-query, head_dim 16) with random weights, norms included."""
    from transformers import GemmaConfig, GemmaForCausalLM

    torch.manual_seed(seed)
    config = GemmaConfig(
        vocab_size=128,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        hidden_activation="gelu_pytorch_tanh",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    return randomized(GemmaForCausalLM(config).eval(), 0.2)


def port_of(hf, bug: str | None = None) -> Transformer:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' GemmaForCausalLM), its weights copied into einsum shape; ``bug`` may name a
    variant, or a variant and a bug together (``"parts_inside+kv_swapped"``)."""
    variant, _, bug = (bug or "").rpartition("+")
    if bug in VARIANTS:
        variant, bug = bug, ""
    bug = bug or None
    config = hf.config
    heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    dim = config.hidden_size
    c = {
        "vocab": config.vocab_size,
        "dim": dim,
        "hidden": config.intermediate_size,
        "layers": config.num_hidden_layers,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "eps": config.rms_norm_eps,
        "base": config.rope_parameters["rope_theta"],
        "parts_inside": variant == "parts_inside",
    }
    port = Transformer(c, bug).eval()
    with torch.no_grad():
        port.embedder.input_embedding_table.copy_(hf.model.embed_tokens.weight)
        for index, (block, layer) in enumerate(zip(port.blocks, hf.model.layers)):
            here = BUGGY_BLOCK.get(bug or "") == index
            attn, mlp = layer.self_attn, layer.mlp
            # nn.Linear's weight is [out, in]; the einsum weights put the input dim first
            block.attn.q_einsum.w.copy_(attn.q_proj.weight.T.reshape(dim, heads, head_dim))
            k, v = (p.weight.T.reshape(dim, kv_heads, head_dim) for p in (attn.k_proj, attn.v_proj))
            block.attn.kv_einsum.w.copy_(torch.stack([v, k] if here and bug == "kv_swapped" else [k, v]))
            block.attn.attn_vec_einsum.w.copy_(attn.o_proj.weight.T.reshape(heads, head_dim, dim))
            gate, up = mlp.gate_proj.weight.T, mlp.up_proj.weight.T
            block.mlp.gating_einsum.w.copy_(
                torch.stack([up, gate] if here and bug == "gate_up_swapped" else [gate, up])
            )
            block.mlp.linear.w.copy_(mlp.down_proj.weight.T)
            block.pre_attention_norm.scale.copy_(layer.input_layernorm.weight)
            block.pre_ffw_norm.scale.copy_(layer.post_attention_layernorm.weight)
        port.final_norm.scale.copy_(hf.model.norm.weight)
    return port


def token_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(seed))


__all__ = [
    "BUGS",
    "CASES",
    "COMPOUND_CASES",
    "RULES",
    "STATS_EXPECTED",
    "VARIANTS",
    "Transformer",
    "hf_gemma",
    "port_of",
    "token_ids",
]
