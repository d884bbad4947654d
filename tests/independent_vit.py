"""A Vision Transformer written the way timm writes it, not the way transformers does: test material for diff.

One fused ``qkv`` ``nn.Linear`` per block, split by a reshape and ``unbind``; the query scaled before the product;
the patch embedding flattened and transposed inside ``patch_embed``; the class token and the position embedding as
the model's own parameters, added in its own code; the residuals in the block (transformers' blocks add them too, but
around differently named modules); ``Identity`` layer-scale and drop-path modules and dropouts where transformers
has none; other names throughout. The original is transformers' ``ViTForImageClassification``; ``port_of`` copies
its weights. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import torch
from torch import nn

from tests.port_traces import randomized

BUGS = (
    "scale_1_over_d",  # attention scores scaled by 1/d instead of 1/sqrt(d) (block 0)
    "qkv_order",  # the fused projection unbound as k, q, v while its weight holds q, k, v (block 1)
    "tanh_gelu",  # the tanh approximation of GELU where ViT uses the exact one (block 2's MLP)
    "cls_without_position",  # the class token gets no position embedding (the model's own code)
    "qkv_without_bias",  # the fused projection built without its bias (timm's qkv_bias=False), block 1
)

RULES = (
    "vit.embeddings.patch_embeddings=patch_embed",
    "vit.embeddings.patch_embeddings.projection=patch_embed.proj",
    "vit.layers.{i}=blocks.{i}",
    "layernorm_before=norm1",
    "layernorm_after=norm2",
    "attention=attn",
    "attention.o_proj=attn.proj",
    "mlp.activation_fn=mlp.act",
    "vit.layernorm=norm",
    "classifier=head",
)


class PatchEmbed(nn.Module):
    def __init__(self, channels: int, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, bug: str | None) -> None:
        super().__init__()
        self.heads, self.bug = heads, bug
        self.head_dim = dim // heads
        self.scale = self.head_dim**-1.0 if bug == "scale_1_over_d" else self.head_dim**-0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=bug != "qkv_without_bias")
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.bug == "qkv_order":
            k, q, v = qkv.unbind(0)
        else:
            q, k, v = qkv.unbind(0)
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        x = self.attn_drop(attn) @ v
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, C)))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, bug: str | None) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU(approximate="tanh" if bug == "tanh_gelu" else "none")
        self.drop1 = nn.Dropout(0.0)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop2 = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop2(self.fc2(self.drop1(self.act(self.fc1(x)))))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, eps: float, bug: str | None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, heads, bug)
        self.ls1 = nn.Identity()
        self.drop_path1 = nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, hidden, bug)
        self.ls2 = nn.Identity()
        self.drop_path2 = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class VisionTransformer(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim, eps = config.hidden_size, config.layer_norm_eps
        patches = (config.image_size // config.patch_size) ** 2
        self.bug = bug
        self.patch_embed = PatchEmbed(config.num_channels, dim, config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, patches + 1, dim))
        self.pos_drop = nn.Dropout(0.0)
        buggy = {"scale_1_over_d": 0, "qkv_order": 1, "tanh_gelu": 2, "qkv_without_bias": 1}
        self.blocks = nn.Sequential(
            *(
                Block(
                    dim,
                    config.num_attention_heads,
                    config.intermediate_size,
                    eps,
                    bug if buggy.get(bug or "") == i else None,
                )
                for i in range(config.num_hidden_layers)
            )
        )
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.head_drop = nn.Dropout(0.0)
        self.head = nn.Linear(dim, config.num_labels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        if self.bug == "cls_without_position":
            x = torch.cat([cls, x + self.pos_embed[:, 1:]], dim=1)
        else:
            x = torch.cat([cls, x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(self.pos_drop(x)))
        return self.head(self.head_drop(x[:, 0]))


def hf_vit(layers: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        num_channels=3,
        num_labels=5,
    )
    return randomized(ViTForImageClassification(config).eval(), 0.3)


def port_of(hf, bug: str | None = None) -> VisionTransformer:  # type: ignore[no-untyped-def]
    """The timm-style port of ``hf`` (transformers' ViTForImageClassification), its weights copied."""
    port = VisionTransformer(hf.config, bug).eval()
    vit = hf.vit
    with torch.no_grad():
        port.patch_embed.proj.load_state_dict(vit.embeddings.patch_embeddings.projection.state_dict())
        port.cls_token.copy_(vit.embeddings.cls_token)
        port.pos_embed.copy_(vit.embeddings.position_embeddings)
        for block, layer in zip(port.blocks, vit.layers):
            block.norm1.load_state_dict(layer.layernorm_before.state_dict())
            block.norm2.load_state_dict(layer.layernorm_after.state_dict())
            attention = layer.attention
            block.attn.qkv.weight.copy_(
                torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
            )
            if block.attn.qkv.bias is not None:
                biases = (attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias)
                block.attn.qkv.bias.copy_(torch.cat(biases))
            block.attn.proj.load_state_dict(attention.o_proj.state_dict())
            block.mlp.fc1.load_state_dict(layer.mlp.fc1.state_dict())
            block.mlp.fc2.load_state_dict(layer.mlp.fc2.state_dict())
        port.norm.load_state_dict(vit.layernorm.state_dict())
        port.head.load_state_dict(hf.classifier.state_dict())
    return port


def pixels(seed: int = 1) -> torch.Tensor:
    return torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(seed))


__all__ = ["BUGS", "RULES", "VisionTransformer", "hf_vit", "pixels", "port_of"]
