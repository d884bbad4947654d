"""diff on a from-scratch OPT port whose learned position embedding is given positions (``arange(T) + 2``) where
transformers' ``OPTLearnedPositionalEmbedding`` is given the attention mask and computes the positions itself: the
two calls are given different quantities and return the same output, which is no departure."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphtrace


class _Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (p(x).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int, gelu: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads)
        self.fc1, self.fc2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
        self.gelu = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.fc2((F.gelu if self.gelu else F.relu)(self.fc1(self.ln2(x))))


class _OPTPort(nn.Module):
    def __init__(self, config, bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        dim = config.hidden_size
        self.tok = nn.Embedding(config.vocab_size, dim)
        self.pos = nn.Embedding(config.max_position_embeddings + 2, dim)
        self.blocks = nn.ModuleList(
            _Block(dim, config.num_attention_heads, config.ffn_dim, bug == "gelu" and i == 1)
            for i in range(config.num_hidden_layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, config.vocab_size, bias=False)
        self.offset = 0 if bug == "no_offset" else 2

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1]) + self.offset)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _port(hf, bug: str | None) -> _OPTPort:  # type: ignore[no-untyped-def]
    port = _OPTPort(hf.config, bug)
    m = hf.model.decoder
    with torch.no_grad():
        port.tok.weight.copy_(m.embed_tokens.weight)
        port.pos.weight.copy_(m.embed_positions.weight)
        for mine, theirs in zip(port.blocks, m.layers, strict=True):
            a = theirs.self_attn
            for own, source in (
                (mine.attn.q, a.q_proj),
                (mine.attn.k, a.k_proj),
                (mine.attn.v, a.v_proj),
                (mine.attn.o, a.out_proj),
                (mine.ln1, theirs.self_attn_layer_norm),
                (mine.ln2, theirs.final_layer_norm),
                (mine.fc1, theirs.fc1),
                (mine.fc2, theirs.fc2),
            ):
                own.load_state_dict(source.state_dict())
        port.norm.load_state_dict(m.final_layer_norm.state_dict())
        port.head.weight.copy_(hf.lm_head.weight)
    return port.eval()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str | None, str], tuple[Path, Path]]:
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        max_position_embeddings=64,
        word_embed_proj_dim=32,
    )
    hf = OPTForCausalLM(config).eval()
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    root = tmp_path_factory.mktemp("opt")
    found = {}
    for values in ("safetensors", "repr"):
        original = root / f"original-{values}"
        graphtrace.capture(hf, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, path=original, values=values)
        for bug in (None, "no_offset", "gelu"):
            port = root / f"{bug}-{values}"
            graphtrace.capture(_port(hf, bug), (ids,), path=port, values=values)
            found[(bug, values)] = (original, port)
    with torch.no_grad():
        reference = hf(input_ids=ids).logits
        assert torch.allclose(_port(hf, None)(ids), reference, atol=1e-5)
    return found


@pytest.mark.parametrize("values", ["safetensors", "repr"])
def test_a_position_embedding_given_positions_where_the_original_is_given_the_mask_is_no_departure(
    traces: dict[tuple[str | None, str], tuple[Path, Path]], values: str
) -> None:
    result = graphtrace.compare(*traces[(None, values)])
    assert result.equal, result.table()
    pos = next(call for call in result.calls if call.b.path.endswith(".pos"))
    assert pos.status == "equal" and not pos.inputs_agree  # mask ones against positions: other quantities


@pytest.mark.parametrize("values", ["safetensors", "repr"])
@pytest.mark.parametrize(("bug", "expected"), [("no_offset", ""), ("gelu", "blocks.1")])
def test_bugs_are_still_named(
    traces: dict[tuple[str | None, str], tuple[Path, Path]], values: str, bug: str, expected: str
) -> None:
    """Positions without OPT's offset of 2 are computed in the model's own code; the GELU lives in block 1's."""
    result = graphtrace.compare(*traces[(bug, values)])
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()
