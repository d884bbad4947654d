"""diff on a GPT-J written the way lucidrains' PaLM-pytorch writes a parallel block, not the way transformers does.

The whole model is an ``nn.Sequential`` (embedding, ``Residual`` wrappers, final norm, head); each block is wrapped in
a ``Residual`` module that adds its input, and computes attention and MLP in parallel from ONE projection
``fused_attn_ff_proj`` that yields q, k, v and the MLP's input at once (transformers' ``q_proj``, ``k_proj``,
``v_proj`` of the attention and ``fc_in`` of the MLP: parts of two modules in one call). Rotary embeddings rotate the
half-split layout (GPT-J rotates interleaved pairs), so the rows of q and k are permuted per head on load; attention
is ``F.scaled_dot_product_attention``; the block returns ``attn_out + ff_out`` and the wrapper adds the residual.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import graphtrace

HEADS, HEAD_DIM, ROTARY, FF = 4, 8, 4, 64
DIM = HEADS * HEAD_DIM


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, bug: str | None) -> None:
        super().__init__()
        base = 1000.0 if bug == "theta" else 10000.0
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), persistent=False)

    def forward(self, length: int) -> torch.Tensor:
        freqs = torch.outer(torch.arange(length).float(), self.inv_freq)
        return torch.cat((freqs, freqs), dim=-1)  # [T, rotary]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _apply_rotary(pos: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    rot, rest = t[..., :ROTARY], t[..., ROTARY:]
    rot = rot * pos.cos() + _rotate_half(rot) * pos.sin()
    return torch.cat((rot, rest), dim=-1)


class ParallelTransformerBlock(nn.Module):
    def __init__(self, bug: str | None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fused_dims = (DIM, DIM, DIM, FF)
        self.fused_attn_ff_proj = nn.Linear(DIM, sum(self.fused_dims))
        self.rotary_emb = RotaryEmbedding(ROTARY, bug)
        self.attn_out = nn.Linear(DIM, DIM, bias=False)
        self.ff_out = nn.Sequential(nn.GELU(approximate="none" if bug == "exact_gelu" else "tanh"), nn.Linear(FF, DIM))
        self.bug = bug

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        x = self.norm(x)
        q, k, v, ff = self.fused_attn_ff_proj(x).split(self.fused_dims, dim=-1)
        q, k, v = (t.view(b, n, HEADS, HEAD_DIM).transpose(1, 2) for t in (q, k, v))
        pos = self.rotary_emb(n)
        q, k = _apply_rotary(pos, q), _apply_rotary(pos, k)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=self.bug != "no_causal")
        attn = self.attn_out(out.transpose(1, 2).reshape(b, n, DIM))
        if self.bug == "attn_only":
            return attn
        return attn + self.ff_out(ff)


class Residual(nn.Module):
    def __init__(self, fn: nn.Module, bug: str | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.scale = 0.5 if bug == "half_residual" else 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) + self.scale * x


def palm(layers: int, vocab: int, bug: str | None) -> nn.Sequential:
    return nn.Sequential(
        nn.Embedding(vocab, DIM),
        *[Residual(ParallelTransformerBlock(bug if i == 1 else None), bug if i == 1 else None) for i in range(layers)],
        nn.LayerNorm(DIM),
        nn.Linear(DIM, vocab),
    )


def _half_split_rows(weight: torch.Tensor) -> torch.Tensor:
    """GPT-J rotates interleaved pairs of each head's first ROTARY channels; the port rotates halves: rows permuted."""
    order = list(range(0, ROTARY, 2)) + list(range(1, ROTARY, 2)) + list(range(ROTARY, HEAD_DIM))
    heads = weight.view(HEADS, HEAD_DIM, -1)
    return heads[:, order].reshape(weight.shape)


def port_of(hf: nn.Module, bug: str | None) -> nn.Sequential:
    layers = hf.config.n_layer
    model = palm(layers, hf.config.vocab_size, bug)
    t = hf.transformer
    with torch.no_grad():
        model[0].weight.copy_(t.wte.weight)
        for i, theirs in enumerate(t.h):
            block = model[1 + i].fn
            a, m = theirs.attn, theirs.mlp
            q, k = _half_split_rows(a.q_proj.weight), _half_split_rows(a.k_proj.weight)
            if bug == "qk_swapped":
                q, k = k, q
            block.fused_attn_ff_proj.weight.copy_(torch.cat((q, k, a.v_proj.weight, m.fc_in.weight)))
            fc_bias = torch.zeros_like(m.fc_in.bias) if bug == "no_fc_bias" and i == 1 else m.fc_in.bias
            block.fused_attn_ff_proj.bias.copy_(torch.cat((torch.zeros(3 * DIM), fc_bias)))
            block.attn_out.weight.copy_(a.out_proj.weight)
            block.ff_out[1].load_state_dict(m.fc_out.state_dict())
            block.norm.load_state_dict(theirs.ln_1.state_dict())
        model[1 + layers].load_state_dict(t.ln_f.state_dict())
        model[2 + layers].load_state_dict(hf.lm_head.state_dict())
    return model.eval()


BUGS = {
    # bug: the port's module that must be named (block 1 is model[2], block 0 model[1])
    # q and k rows swapped on load in every block: the same as the block's own code splitting them in the wrong order
    "qk_swapped": "1.fn",
    "no_fc_bias": "2.fn.fused_attn_ff_proj",  # fc_in's bias not copied, in block 1
    "exact_gelu": "2.fn.ff_out.0",  # GPT-J's gelu_new is the tanh approximation
    "no_causal": "2.fn",  # attention computed in the block's own code
    "attn_only": "2.fn",  # the MLP branch dropped in the block's own code
    # a wrong rotary base: the rotary module has no counterpart in GPT-J (whose attention gathers its own table), so
    # the block whose code applies it is the nearest the diff can name
    "theta": "2.fn",
    "half_residual": "2",  # the wrapper's own code scales the residual
}


def _randomized(hf: nn.Module) -> nn.Module:
    """Random norms and biases, so that a swapped or skipped one shows, and queries and keys large enough for
    attention to be far from uniform (at init it is nearly uniform, and position embeddings barely matter)."""
    with torch.no_grad():
        generator = torch.Generator().manual_seed(3)
        for name, parameter in hf.named_parameters():
            if name.endswith("bias") or "ln_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5 + ("ln_" in name))
            elif name.endswith(("q_proj.weight", "k_proj.weight")):
                parameter.mul_(15)
    return hf


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str | None, str], tuple[Path, Path]]:
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.manual_seed(0)
    config = GPTJConfig(
        vocab_size=128, n_positions=64, n_embd=DIM, n_layer=2, n_head=HEADS, rotary_dim=ROTARY, n_inner=FF
    )
    hf = _randomized(GPTJForCausalLM(config).eval())
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(port_of(hf, None)(ids), hf(input_ids=ids).logits, atol=1e-5)
    root = tmp_path_factory.mktemp("palm-gptj")
    found = {}
    for values in ("safetensors", "repr"):
        original = root / f"original-{values}"
        graphtrace.capture(hf, {"input_ids": ids}, path=original, values=values)
        for bug in (None, *BUGS):
            port = root / f"{bug}-{values}"
            graphtrace.capture(port_of(hf, bug), (ids,), path=port, values=values)
            found[(bug, values)] = (original, port)
    return found


@pytest.mark.parametrize("values", ["safetensors", "repr"])
def test_the_faithful_port_compares_equal(traces: dict[tuple[str | None, str], tuple[Path, Path]], values: str) -> None:
    result = graphtrace.compare(*traces[(None, values)])
    assert result.equal, result.table()


@pytest.mark.parametrize("values", ["safetensors", "repr"])
@pytest.mark.parametrize(("bug", "expected"), list(BUGS.items()))
def test_each_bug_is_named_where_it_lives(
    traces: dict[tuple[str | None, str], tuple[Path, Path]], values: str, bug: str, expected: str
) -> None:
    result = graphtrace.compare(*traces[(bug, values)])
    first = result.first_divergence
    assert first is not None, result.table()
    assert first.b.path.partition(".")[2] == expected, result.table()


@pytest.mark.parametrize("values", ["safetensors", "repr"])
def test_a_module_without_counterpart_is_named_as_a_suspect(
    traces: dict[tuple[str | None, str], tuple[Path, Path]], values: str
) -> None:
    """The rotary module has no counterpart in GPT-J: the block is blamed, and the report says that the module it
    called before the departure was compared with nothing (the dropout-free passes-through are left out)."""
    result = graphtrace.compare(*traces[("theta", values)])
    found = result.divergence
    assert found is not None and found.inside
    assert [node.path.partition(".")[2] for node in found.unchecked] == ["2.fn.rotary_emb"]
    assert "not compared): 2.fn.rotary_emb" in result.table()
    assert result.to_json()["first_divergence"]["unchecked"] == ["Sequential.2.fn.rotary_emb@0"]
