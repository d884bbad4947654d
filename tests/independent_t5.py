"""A T5 (v1.1, gated GELU) written flat and from scratch, not the way transformers does: test material for diff, above
all for an encoder-decoder whose two stacks have the same make-up.

transformers' ``T5ForConditionalGeneration`` wraps every sub-layer (``T5Block`` -> ``T5LayerSelfAttention`` ->
``T5Attention``; ``T5LayerCrossAttention``; ``T5LayerFF`` -> ``T5DenseGatedActDense``), holds dropout modules
everywhere and computes the relative position bias inside the first block's attention, which passes it on. This
port has an ``Encoder`` and a ``Decoder``, each with a list of blocks and its own ``rel_bias`` embedding called
once in the stack's own code; the token embedding is called in the model's own code; its blocks hold the residuals
and call the MLP straight; self-attention has one fused ``qkv``, cross-attention a separate ``q`` and a fused
``kv``; the RMS norm is written by hand, and so is the rescaling of the decoder's output before the tied
``lm_head``. ``port_of`` copies the weights of the original. Each ``bug`` injects one porting mistake (see
``BUGS``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tests.port_traces import randomized

BUGS = (
    "causal_bucket_encoder",  # the encoder's relative position buckets computed one-way, as a decoder's are
    "no_rescale",  # the decoder's output goes to the tied lm_head without the d_model ** -0.5 rescaling
    "kv_swapped",  # decoder block 1's fused cross-attention kv loaded as [v k] instead of [k v]
    "mean_norm",  # the decoder's final norm subtracts the mean (a LayerNorm without bias) instead of RMS
    "scaled_cross",  # cross-attention scores scaled by 1/sqrt(d_kv): T5 does not scale
    "no_causal_mask",  # decoder self-attention without its causal mask
)

RULES = (
    "encoder.block.{i}=encoder.blocks.{i}",
    "decoder.block.{i}=decoder.blocks.{i}",
    "layer.0.SelfAttention=attn",
    "layer.0.layer_norm=norm_attn",
    "layer.1.EncDecAttention=cross",
    "layer.1.layer_norm=norm_cross",
    "layer.{j}.DenseReluDense.wi_0=mlp.gate",
    "layer.{j}.DenseReluDense.wi_1=mlp.up",
    "layer.{j}.DenseReluDense.wo=mlp.down",
    "layer.{j}.DenseReluDense.act=mlp.act",
    "layer.{j}.DenseReluDense=mlp",
    "layer.{j}.layer_norm=norm_mlp",
    "attn.relative_attention_bias=rel_bias",
    "final_layer_norm=norm",
)


def _buckets(relative: torch.Tensor, two_way: bool, buckets: int, far: int) -> torch.Tensor:
    """Mesh TensorFlow's bucketing of ``relative`` (key position minus query position): exact buckets for small
    distances, logarithmic ones up to ``far``; ``two_way`` gives the keys after the query their own half."""
    offset = torch.zeros_like(relative)
    if two_way:
        buckets //= 2
        offset = (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = buckets // 2
    scaled = torch.log(distance.float().clamp(min=1) / exact) / math.log(far / exact) * (buckets - exact)
    log_bucket = (exact + scaled.long()).clamp(max=buckets - 1)
    return offset + torch.where(distance < exact, distance, log_bucket)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, center: bool = False) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.eps, self.center = eps, center

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.center:
            x = x - x.mean(-1, keepdim=True)
        return self.scale * (x / torch.sqrt(x.square().mean(-1, keepdim=True) + self.eps))


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if bias is not None:
        scores = scores + bias
    return torch.einsum("bhqk,bhkd->bqhd", scores.softmax(-1), v).flatten(-2)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, head: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * heads * head, bias=False)
        self.out = nn.Linear(heads * head, dim, bias=False)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = (_heads(part, self.heads) for part in self.qkv(x).chunk(3, dim=-1))
        if self.causal:
            steps = x.shape[1]
            future = torch.ones(steps, steps, dtype=torch.bool, device=x.device).triu(1)
            bias = bias.masked_fill(future, float("-inf"))
        return self.out(_attend(q, k, v, bias, 1.0))


class CrossAttention(nn.Module):
    def __init__(self, dim: int, heads: int, head: int, scaled: bool) -> None:
        super().__init__()
        self.heads = heads
        self.scale = head**-0.5 if scaled else 1.0
        self.q = nn.Linear(dim, heads * head, bias=False)
        self.kv = nn.Linear(dim, 2 * heads * head, bias=False)
        self.out = nn.Linear(heads * head, dim, bias=False)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        k, v = (_heads(part, self.heads) for part in self.kv(memory).chunk(2, dim=-1))
        return self.out(_attend(_heads(self.q(x), self.heads), k, v, None, self.scale))


class GatedMLP(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.act = nn.GELU(approximate="tanh")
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, config, decoder: bool, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim, heads, head, eps = config.d_model, config.num_heads, config.d_kv, config.layer_norm_epsilon
        self.norm_attn = RMSNorm(dim, eps)
        self.attn = SelfAttention(dim, heads, head, causal=decoder and bug != "no_causal_mask")
        if decoder:
            self.norm_cross = RMSNorm(dim, eps)
            self.cross = CrossAttention(dim, heads, head, scaled=bug == "scaled_cross")
        self.norm_mlp = RMSNorm(dim, eps)
        self.mlp = GatedMLP(dim, config.d_ff)

    def forward(self, x: torch.Tensor, bias: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x), bias)
        if memory is not None:
            x = x + self.cross(self.norm_cross(x), memory)
        return x + self.mlp(self.norm_mlp(x))


class Stack(nn.Module):
    """The blocks, the relative position bias they share (computed once, here) and the final norm."""

    def __init__(self, config, decoder: bool, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.two_way = not decoder and bug != "causal_bucket_encoder"
        self.buckets, self.far = config.relative_attention_num_buckets, config.relative_attention_max_distance
        self.rel_bias = nn.Embedding(self.buckets, config.num_heads)
        layers = config.num_decoder_layers if decoder else config.num_layers
        self.blocks = nn.ModuleList(Block(config, decoder, bug) for _ in range(layers))
        self.norm = RMSNorm(config.d_model, config.layer_norm_epsilon, center=decoder and bug == "mean_norm")

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device)
        relative = positions[None, :] - positions[:, None]
        bias = self.rel_bias(_buckets(relative, self.two_way, self.buckets, self.far)).permute(2, 0, 1)[None]
        for block in self.blocks:
            x = block(x, bias, memory)
        return self.norm(x)


class Encoder(Stack):
    def __init__(self, config, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, False, bug)


class Decoder(Stack):
    def __init__(self, config, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(config, True, bug)


class T5Port(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.encoder = Encoder(config, bug)
        self.decoder = Decoder(config, bug)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.rescale = config.d_model**-0.5 if config.scale_decoder_outputs and bug != "no_rescale" else 1.0

    def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        memory = self.encoder(self.embed(ids))
        return self.lm_head(self.decoder(self.embed(target), memory) * self.rescale)


def hf_t5(seed: int = 0):  # type: ignore[no-untyped-def]
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=128,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        feed_forward_proj="gated-gelu",
        dropout_rate=0.0,
        attn_implementation="eager",
    )
    return randomized(T5ForConditionalGeneration(config).eval(), 0.3)


def port_of(hf, bug: str | None = None) -> T5Port:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' T5ForConditionalGeneration), its weights copied."""
    port = T5Port(hf.config, bug).eval()
    with torch.no_grad():
        port.embed.weight.copy_(hf.shared.weight)
        port.lm_head.weight.copy_(hf.lm_head.weight)
        for stack, original in ((port.encoder, hf.encoder), (port.decoder, hf.decoder)):
            first = original.block[0].layer[0].SelfAttention
            stack.rel_bias.weight.copy_(first.relative_attention_bias.weight)
            stack.norm.scale.copy_(original.final_layer_norm.weight)
            for index, (block, layer) in enumerate(zip(stack.blocks, original.block)):
                attention = layer.layer[0].SelfAttention
                block.norm_attn.scale.copy_(layer.layer[0].layer_norm.weight)
                block.attn.qkv.weight.copy_(torch.cat([attention.q.weight, attention.k.weight, attention.v.weight]))
                block.attn.out.weight.copy_(attention.o.weight)
                if stack is port.decoder:
                    cross = layer.layer[1].EncDecAttention
                    kv = (cross.v, cross.k) if bug == "kv_swapped" and index == 1 else (cross.k, cross.v)
                    block.norm_cross.scale.copy_(layer.layer[1].layer_norm.weight)
                    block.cross.q.weight.copy_(cross.q.weight)
                    block.cross.kv.weight.copy_(torch.cat([kv[0].weight, kv[1].weight]))
                    block.cross.out.weight.copy_(cross.o.weight)
                mlp = layer.layer[-1].DenseReluDense
                block.norm_mlp.scale.copy_(layer.layer[-1].layer_norm.weight)
                block.mlp.gate.weight.copy_(mlp.wi_0.weight)
                block.mlp.up.weight.copy_(mlp.wi_1.weight)
                block.mlp.down.weight.copy_(mlp.wo.weight)
    return port


def inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [1, 8], decoder_input_ids [1, 5])."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 128, (1, 8), generator=generator), torch.randint(0, 128, (1, 5), generator=generator)


def hf_inputs(ids: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_ids": ids, "decoder_input_ids": target}


# (arch, bug, fused, the port's module that must be named); "" is the model's own code
CASES = [
    ("t5", "causal_bucket_encoder", False, "encoder"),
    ("t5", "no_rescale", False, ""),
    # [v k] would be a legitimate layout of a fused kv, but decoder block 0's agreeing cross-attention shows [k v],
    # so block 1's kv departs (statistics cannot tell the halves apart: its caller is named)
    ("t5", "kv_swapped", False, "decoder.blocks.1.cross.kv"),
    ("t5", "mean_norm", False, "decoder.norm"),
    ("t5", "scaled_cross", False, "decoder.blocks.0.cross"),
    ("t5", "no_causal_mask", False, "decoder.blocks.0.attn"),
]

STATS_EXPECTED = {("t5", "kv_swapped"): "decoder.blocks.1.cross"}

__all__ = ["BUGS", "CASES", "RULES", "STATS_EXPECTED", "T5Port", "hf_inputs", "hf_t5", "inputs", "port_of"]
