"""A BERT encoder written as a minimal from-scratch implementation would write it, not the way transformers does:
test material for diff, above all for module boundaries that differ.

transformers puts each residual and post-norm inside an output module (``BertSelfOutput``: dense, dropout,
``LayerNorm(hidden + input)``); this port keeps them in the block (``x = ln1(x + attn(x))``), so its attention and
MLP return what transformers' return *before* the residual and the norm. It fuses ``Wqkv``, uses
``F.scaled_dot_product_attention``, sums the three embeddings in one module and names everything differently. The
original is transformers' ``BertModel`` (with its pooler); ``port_of`` copies its weights. Each ``bug`` injects one
porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tests.port_traces import randomized

BUGS = (
    "no_token_types",  # the token type embedding left out of the sum (the embeddings' own code)
    "norm_before_residual",  # block 1 normalises the attention's output before adding the residual
    "tanh_gelu",  # the tanh approximation of GELU in block 0's MLP, where BERT uses the exact one
    "pooler_relu",  # the pooler's activation a ReLU where BERT uses tanh
    "scale_1_over_d",  # block 2's attention scores scaled by 1/d instead of 1/sqrt(d)
)

RULES = (
    "embeddings=embed",
    "embeddings.LayerNorm=embed.norm",
    "encoder.layer.{i}=layers.{i}",
    "attention.output.LayerNorm=ln1",
    "output.LayerNorm=ln2",
    "attention.output.dense=attn.out",
    "intermediate.dense=mlp.up",
    "output.dense=mlp.down",
    "pooler=pool",
)


class Embed(nn.Module):
    def __init__(self, config, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.bug = bug
        self.tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.types = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.tokens(ids) + self.positions(positions)[None]
        if self.bug != "no_token_types":
            x = x + self.types(torch.zeros_like(ids))
        return self.norm(x)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, bug: str | None) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -1.0 if bug == "scale_1_over_d" else None
        self.Wqkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.Wqkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, scale=self.scale)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, bug: str | None) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)
        self.approximate = "tanh" if bug == "tanh_gelu" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x), approximate=self.approximate))


class EncoderBlock(nn.Module):
    def __init__(self, config, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim, eps = config.hidden_size, config.layer_norm_eps
        self.bug = bug
        self.attn = SelfAttention(dim, config.num_attention_heads, bug)
        self.ln1 = nn.LayerNorm(dim, eps=eps)
        self.mlp = FeedForward(dim, config.intermediate_size, bug)
        self.ln2 = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bug == "norm_before_residual":
            x = x + self.ln1(self.attn(x))
        else:
            x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class Pool(nn.Module):
    def __init__(self, dim: int, bug: str | None) -> None:
        super().__init__()
        self.proj = nn.Linear(dim, dim)
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x[:, 0])
        return torch.relu(y) if self.bug == "pooler_relu" else torch.tanh(y)


class Encoder(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        buggy = {"norm_before_residual": 1, "tanh_gelu": 0, "scale_1_over_d": 2}
        self.embed = Embed(config, bug)
        self.layers = nn.ModuleList(
            EncoderBlock(config, bug if buggy.get(bug or "") == i else None) for i in range(config.num_hidden_layers)
        )
        self.pool = Pool(config.hidden_size, bug)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return x, self.pool(x)


def hf_bert(layers: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    return randomized(BertModel(config).eval(), 0.3)


def port_of(hf, bug: str | None = None) -> Encoder:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' BertModel), its weights copied."""
    port = Encoder(hf.config, bug).eval()
    with torch.no_grad():
        embeddings = hf.embeddings
        port.embed.tokens.load_state_dict(embeddings.word_embeddings.state_dict())
        port.embed.positions.load_state_dict(embeddings.position_embeddings.state_dict())
        port.embed.types.load_state_dict(embeddings.token_type_embeddings.state_dict())
        port.embed.norm.load_state_dict(embeddings.LayerNorm.state_dict())
        for block, layer in zip(port.layers, hf.encoder.layer):
            attention = layer.attention.self
            block.attn.Wqkv.weight.copy_(
                torch.cat([attention.query.weight, attention.key.weight, attention.value.weight])
            )
            block.attn.Wqkv.bias.copy_(torch.cat([attention.query.bias, attention.key.bias, attention.value.bias]))
            block.attn.out.load_state_dict(layer.attention.output.dense.state_dict())
            block.ln1.load_state_dict(layer.attention.output.LayerNorm.state_dict())
            block.mlp.up.load_state_dict(layer.intermediate.dense.state_dict())
            block.mlp.down.load_state_dict(layer.output.dense.state_dict())
            block.ln2.load_state_dict(layer.output.LayerNorm.state_dict())
        port.pool.proj.load_state_dict(hf.pooler.dense.state_dict())
    return port


def token_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(seed))


__all__ = ["BUGS", "RULES", "Encoder", "hf_bert", "port_of", "token_ids"]
