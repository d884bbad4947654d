"""A CLIP written the way mlfoundations' open_clip writes it (``open_clip/model.py`` and ``transformer.py``), not the
way transformers does: test material for diff, above all for two towers of the same make-up and an attention that is
one library module.

transformers' ``CLIPModel`` holds a ``vision_model`` and a ``text_model`` whose encoder layers are the same class,
looks positions up in ``nn.Embedding`` modules, gives each attention ``q_proj``/``k_proj``/``v_proj``/``out_proj``,
pools the text at the argmax of the ids inside ``text_model`` and projects both towers with ``nn.Linear`` modules
outside them. This port's ``CLIP`` holds a ``visual`` ``VisionTransformer`` (a bias-free ``conv1``, the class token
and positions as Parameters added in its own code, ``ln_pre``, ``ln_post`` over every token, then the class token
pooled and projected with ``@ proj``) and the text tower's modules directly (``token_embedding``, a
``positional_embedding`` Parameter, ``transformer``, ``ln_final``, a ``text_projection`` Parameter, the causal
``attn_mask`` buffer), pools the text at ``text.argmax(dim=-1)`` and applies ``logit_scale`` in its own code. Each
``ResidualAttentionBlock`` calls ``nn.MultiheadAttention(batch_first=True)``: q, k and v in one ``in_proj_weight``,
no module per projection, the output projection applied inside torch's functional code (no call of it). ``port_of``
copies the weights of the original. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from tests.port_traces import randomized

BUGS = (
    "exact_gelu",  # vision block 1's MLP uses exact GELU where CLIP uses QuickGELU
    "no_causal_mask",  # text block 0 does not hand its attention the causal mask it is given
    "last_token_pool",  # the text pooled at the last position instead of the EOS (argmax of the ids) position
    "cls_pos_swapped",  # the class token's and the first patch's position embeddings swapped on load
    "no_ln_pre",  # the vision tower skips ln_pre
    "qk_swapped",  # text block 1's in_proj_weight loaded with the q and k rows swapped
    "raw_logit_scale",  # logit_scale used as it is stored (a log) instead of exponentiated
)

# transformers' vision_model returns the sequence before post_layernorm and pools before its norm, the port's visual
# norms every token and projects: the two towers and the final norms compute other quantities and are not mapped
RULES = (
    "vision_model.embeddings.patch_embedding=visual.conv1",
    "vision_model.pre_layrnorm=visual.ln_pre",
    "vision_model.encoder.layers.{i}=visual.transformer.resblocks.{i}",
    "vision_model.encoder=visual.transformer",
    "text_model.embeddings.token_embedding=token_embedding",
    "text_model.encoder.layers.{i}=transformer.resblocks.{i}",
    "text_model.encoder=transformer",
    "text_model.final_layer_norm=ln_final",
    "layer_norm1=ln_1",
    "self_attn=attn",
    "layer_norm2=ln_2",
    "fc1=c_fc",
    "activation_fn=gelu",
    "fc2=c_proj",
)


class LayerNorm(nn.LayerNorm):
    """Subclass torch's LayerNorm (with cast back to input dtype)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        orig_type = x.dtype
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.to(orig_type)


class QuickGELU(nn.Module):
    # NOTE This is slower than nn.GELU or nn.SiLU and uses more GPU memory
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class ResidualAttentionBlock(nn.Module):
    def __init__(self, d_model: int, n_head: int, mlp_width: int, bug: str | None = None) -> None:
        super().__init__()
        self.ln_1 = LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_head, batch_first=True)
        self.ls_1 = nn.Identity()
        self.ln_2 = LayerNorm(d_model)
        act_layer: type[nn.Module] = nn.GELU if bug == "exact_gelu" else QuickGELU
        self.mlp = nn.Sequential(
            OrderedDict(
                [
                    ("c_fc", nn.Linear(d_model, mlp_width)),
                    ("gelu", act_layer()),
                    ("c_proj", nn.Linear(mlp_width, d_model)),
                ]
            )
        )
        self.ls_2 = nn.Identity()
        self.drop_mask = bug == "no_causal_mask"

    def attention(self, q_x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        attn_mask = attn_mask.to(q_x.dtype) if attn_mask is not None and not self.drop_mask else None
        return self.attn(q_x, q_x, q_x, need_weights=False, attn_mask=attn_mask)[0]

    def forward(self, q_x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = q_x + self.ls_1(self.attention(self.ln_1(q_x), attn_mask=attn_mask))
        return x + self.ls_2(self.mlp(self.ln_2(x)))


class Transformer(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, mlp_width: int, bugs: dict[int, str]) -> None:
        super().__init__()
        self.width, self.layers = width, layers
        self.resblocks = nn.ModuleList(
            [ResidualAttentionBlock(width, heads, mlp_width, bugs.get(i)) for i in range(layers)]
        )

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        for r in self.resblocks:
            x = r(x, attn_mask=attn_mask)
        return x


class VisionTransformer(nn.Module):
    def __init__(self, vision, output_dim: int, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        width, patch_size = vision.hidden_size, vision.patch_size
        self.grid_size = vision.image_size // patch_size
        self.conv1 = nn.Conv2d(vision.num_channels, width, kernel_size=patch_size, stride=patch_size, bias=False)
        scale = width**-0.5
        self.class_embedding = nn.Parameter(scale * torch.randn(width))
        self.positional_embedding = nn.Parameter(scale * torch.randn(self.grid_size**2 + 1, width))
        self.patch_dropout = nn.Identity()
        self.ln_pre = LayerNorm(width)
        bugs = {1: "exact_gelu"} if bug == "exact_gelu" else {}
        self.transformer = Transformer(
            width, vision.num_hidden_layers, vision.num_attention_heads, vision.intermediate_size, bugs
        )
        self.ln_post = LayerNorm(width)
        self.proj = nn.Parameter(scale * torch.randn(width, output_dim))
        self.skip_ln_pre = bug == "no_ln_pre"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)  # shape = [*, width, grid, grid]
        x = x.reshape(x.shape[0], x.shape[1], -1)  # shape = [*, width, grid ** 2]
        x = x.permute(0, 2, 1)  # shape = [*, grid ** 2, width]
        cls = self.class_embedding.view(1, 1, -1).expand(x.shape[0], -1, -1).to(x.dtype)
        x = torch.cat([cls, x], dim=1)  # shape = [*, grid ** 2 + 1, width]
        x = x + self.positional_embedding.to(x.dtype)
        x = self.patch_dropout(x)
        if not self.skip_ln_pre:
            x = self.ln_pre(x)
        x = self.transformer(x)
        x = self.ln_post(x)
        pooled = x[:, 0]
        return pooled @ self.proj


class CLIP(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        text = config.text_config
        self.visual = VisionTransformer(config.vision_config, config.projection_dim, bug)
        self.context_length, self.vocab_size = text.max_position_embeddings, text.vocab_size
        bugs = {"no_causal_mask": {0: bug}, "qk_swapped": {1: bug}}.get(bug or "", {})
        self.transformer = Transformer(
            text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.intermediate_size, bugs
        )
        self.token_embedding = nn.Embedding(text.vocab_size, text.hidden_size)
        self.positional_embedding = nn.Parameter(torch.empty(self.context_length, text.hidden_size))
        self.ln_final = LayerNorm(text.hidden_size)
        self.text_projection = nn.Parameter(torch.empty(text.hidden_size, config.projection_dim))
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))
        self.register_buffer("attn_mask", self.build_attention_mask(), persistent=False)
        self.bug = bug

    def build_attention_mask(self) -> torch.Tensor:
        # lazily create causal attention mask, with full attention between the tokens
        # pytorch uses additive attention mask; fill with -inf
        mask = torch.empty(self.context_length, self.context_length)
        mask.fill_(float("-inf"))
        mask.triu_(1)  # zero out the lower diagonal
        return mask

    def encode_image(self, image: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        features = self.visual(image)
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, text: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        seq_len = text.shape[1]
        x = self.token_embedding(text)  # [batch_size, n_ctx, d_model]
        x = x + self.positional_embedding[:seq_len]
        x = self.transformer(x, attn_mask=self.attn_mask[:seq_len, :seq_len])
        x = self.ln_final(x)  # [batch_size, n_ctx, transformer.width]
        # take features from the eot embedding (eot_token is the highest number in each sequence)
        eot = torch.full_like(text[:, 0], seq_len - 1) if self.bug == "last_token_pool" else text.argmax(dim=-1)
        x = x[torch.arange(x.shape[0]), eot] @ self.text_projection
        return F.normalize(x, dim=-1) if normalize else x

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        image_features = self.encode_image(image, normalize=True)
        text_features = self.encode_text(text, normalize=True)
        logit_scale = self.logit_scale if self.bug == "raw_logit_scale" else self.logit_scale.exp()
        logits_per_image = logit_scale * image_features @ text_features.T
        return logits_per_image, logits_per_image.T


def hf_clip(seed: int = 0):  # type: ignore[no-untyped-def]
    """transformers' CLIPModel, tiny, with random weights (its logit scale back at CLIP's log(1 / 0.07))."""
    from transformers import CLIPConfig, CLIPModel, CLIPTextConfig, CLIPVisionConfig

    torch.manual_seed(seed)
    common = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_act": "quick_gelu",
        "projection_dim": 16,
    }
    text = CLIPTextConfig(
        vocab_size=128, max_position_embeddings=16, pad_token_id=0, bos_token_id=126, eos_token_id=127, **common
    )
    vision = CLIPVisionConfig(image_size=32, patch_size=8, num_channels=3, **common)
    config = CLIPConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), projection_dim=16, attn_implementation="eager"
    )
    model = randomized(CLIPModel(config).eval(), 0.3)
    with torch.no_grad():
        model.logit_scale.fill_(math.log(1 / 0.07))
    return model


def _block(port: ResidualAttentionBlock, layer: nn.Module, bug: str | None) -> None:
    attention = layer.self_attn
    q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
    if bug == "qk_swapped":
        q, k = k, q
    port.attn.in_proj_weight.copy_(torch.cat([q.weight, k.weight, v.weight]))
    port.attn.in_proj_bias.copy_(torch.cat([attention.q_proj.bias, attention.k_proj.bias, v.bias]))
    port.attn.out_proj.load_state_dict(attention.out_proj.state_dict())
    port.ln_1.load_state_dict(layer.layer_norm1.state_dict())
    port.ln_2.load_state_dict(layer.layer_norm2.state_dict())
    port.mlp.c_fc.load_state_dict(layer.mlp.fc1.state_dict())
    port.mlp.c_proj.load_state_dict(layer.mlp.fc2.state_dict())


def port_of(hf, bug: str | None = None) -> CLIP:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' CLIPModel), its weights copied."""
    port = CLIP(hf.config, bug).eval()
    vision, text = hf.vision_model, hf.text_model
    with torch.no_grad():
        port.visual.conv1.weight.copy_(vision.embeddings.patch_embedding.weight)
        port.visual.class_embedding.copy_(vision.embeddings.class_embedding)
        positions = vision.embeddings.position_embedding.weight
        if bug == "cls_pos_swapped":
            positions = positions[[1, 0, *range(2, positions.shape[0])]]
        port.visual.positional_embedding.copy_(positions)
        port.visual.ln_pre.load_state_dict(vision.pre_layrnorm.state_dict())
        for block, layer in zip(port.visual.transformer.resblocks, vision.encoder.layers):
            _block(block, layer, None)
        port.visual.ln_post.load_state_dict(vision.post_layernorm.state_dict())
        port.visual.proj.copy_(hf.visual_projection.weight.T)
        port.token_embedding.weight.copy_(text.embeddings.token_embedding.weight)
        port.positional_embedding.copy_(text.embeddings.position_embedding.weight)
        for i, (block, layer) in enumerate(zip(port.transformer.resblocks, text.encoder.layers)):
            _block(block, layer, bug if bug == "qk_swapped" and i == 1 else None)
        port.ln_final.load_state_dict(text.final_layer_norm.state_dict())
        port.text_projection.copy_(hf.text_projection.weight.T)
        port.logit_scale.copy_(hf.logit_scale)
    return port


def inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(pixel_values [2, 3, 32, 32], input_ids [2, 7]): each row a start token, words, the EOS token (127, the
    highest id, where CLIP pools) at another position, then padding."""
    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randn(2, 3, 32, 32, generator=generator)
    ids = torch.randint(2, 126, (2, 7), generator=generator)
    ids[:, 0] = 126
    ids[0, 4], ids[0, 5:] = 127, 0
    ids[1, 6] = 127
    return pixels, ids


def hf_inputs(pixels: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"input_ids": ids, "pixel_values": pixels}


# (arch, bug, fused, the port's module that must be named); "" is the model's own code
CASES = [
    ("clip", "exact_gelu", False, "visual.transformer.resblocks.1.mlp.gelu"),
    ("clip", "no_causal_mask", False, "transformer.resblocks.0"),
    ("clip", "last_token_pool", False, ""),
    ("clip", "cls_pos_swapped", False, "visual"),
    ("clip", "no_ln_pre", False, "visual"),
    ("clip", "qk_swapped", False, "transformer.resblocks.1.attn"),
    ("clip", "raw_logit_scale", False, ""),
]

STATS_EXPECTED: dict[tuple[str, str], str] = {}

__all__ = ["BUGS", "CASES", "CLIP", "RULES", "STATS_EXPECTED", "hf_clip", "hf_inputs", "inputs", "port_of"]
