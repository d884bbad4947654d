"""diff on a ViT built from torch's own parts, the way torchvision writes it: ``nn.MultiheadAttention`` (sequence-first,
q, k and v in one ``in_proj_weight`` parameter, no module for them), a ``Conv2d`` patch projection, the class token
and positions added in the model's own code, the final norm applied to the class token only. With a batch of two,
every activation inside the blocks is ``[N, B, D]`` where transformers' is ``[B, N, D]``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphtrace
from tests import independent_vit


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, eps: float, bug: str | None) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=eps)
        self.self_attn = nn.MultiheadAttention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-3 if bug == "eps" else eps)
        self.linear1, self.linear2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.tanh = bug == "tanh_gelu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, B, D]
        y = self.ln_1(x)
        x = x + self.self_attn(y, y, y, need_weights=False)[0]
        return x + self.linear2(F.gelu(self.linear1(self.ln_2(x)), approximate="tanh" if self.tanh else "none"))


class _TorchViT(nn.Module):
    def __init__(self, config, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim, patches = config.hidden_size, (config.image_size // config.patch_size) ** 2
        self.conv_proj = nn.Conv2d(config.num_channels, dim, config.patch_size, config.patch_size)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, patches + 1, dim))
        self.layers = nn.ModuleList(
            _Block(
                dim,
                config.num_attention_heads,
                config.intermediate_size,
                config.layer_norm_eps,
                bug if i == 1 else None,
            )
            for i in range(config.num_hidden_layers)
        )
        self.ln = nn.LayerNorm(dim, eps=config.layer_norm_eps)
        self.heads = nn.Linear(dim, config.num_labels)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embedding
        x = x.transpose(0, 1)
        for layer in self.layers:
            x = layer(x)
        return self.heads(self.ln(x[0]))


def _port(hf, bug: str | None) -> _TorchViT:  # type: ignore[no-untyped-def]
    port, vit = _TorchViT(hf.config, bug).eval(), hf.vit
    with torch.no_grad():
        port.conv_proj.load_state_dict(vit.embeddings.patch_embeddings.projection.state_dict())
        port.class_token.copy_(vit.embeddings.cls_token)
        port.pos_embedding.copy_(vit.embeddings.position_embeddings)
        for mine, theirs in zip(port.layers, vit.layers, strict=True):
            a = theirs.attention
            mine.ln_1.load_state_dict(theirs.layernorm_before.state_dict())
            mine.ln_2.load_state_dict(theirs.layernorm_after.state_dict())
            mine.self_attn.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
            mine.self_attn.in_proj_bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
            mine.self_attn.out_proj.load_state_dict(a.o_proj.state_dict())
            mine.linear1.load_state_dict(theirs.mlp.fc1.state_dict())
            mine.linear2.load_state_dict(theirs.mlp.fc2.state_dict())
        port.ln.load_state_dict(vit.layernorm.state_dict())
        port.heads.load_state_dict(hf.classifier.state_dict())
    return port


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str | None, str], tuple[Path, Path]]:
    hf, pixels = independent_vit.hf_vit(), independent_vit.pixels()
    with torch.no_grad():
        assert torch.allclose(_port(hf, None)(pixels), hf(pixel_values=pixels).logits, atol=1e-5)
    root = tmp_path_factory.mktemp("torch_vit")
    found = {}
    for values in ("bundle", "repr"):
        original = root / f"original-{values}"
        graphtrace.capture(hf, {"pixel_values": pixels}, path=original, values=values)
        for bug in (None, "eps", "tanh_gelu"):
            graphtrace.capture(_port(hf, bug), (pixels,), path=root / f"{bug}-{values}", values=values)
            found[(bug, values)] = (original, root / f"{bug}-{values}")
    return found


@pytest.mark.parametrize("values", ["bundle", "repr"])
def test_a_faithful_port_of_torch_parts_compares_equal_block_by_block(
    traces: dict[tuple[str | None, str], tuple[Path, Path]], values: str
) -> None:
    result = graphtrace.compare(*traces[(None, values)])
    assert result.equal, result.table()
    pairs = {call.a.path.partition(".")[2]: call.b.path.partition(".")[2] for call in result.calls}
    assert pairs["vit.layers.1.attention"] == "layers.1.self_attn", result.table()
    assert pairs["vit.layers.2.mlp.fc2"] == "layers.2.linear2", result.table()


@pytest.mark.parametrize("values", ["bundle", "repr"])
@pytest.mark.parametrize(("bug", "expected"), [("eps", "layers.1.ln_2"), ("tanh_gelu", "layers.1")])
def test_bugs_are_named_in_the_ports_terms(
    traces: dict[tuple[str | None, str], tuple[Path, Path]], values: str, bug: str, expected: str
) -> None:
    """The GELU is called in the block's own code: the block is named."""
    result = graphtrace.compare(*traces[(bug, values)])
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()
