"""A nanoGPT-style port pads its vocabulary (GPT-2's 50257 to 50304): its head returns more logits than the original's
lm_head and the forward cuts them. That is the port's own layout, undone where the head is called: the port is
faithful and must compare equal."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import graphtrace
from tests import independent_gpt2


class PaddedGPT(independent_gpt2.GPT):
    def __init__(self, vocab: int, context: int, dim: int, heads: int, layers: int, eps: float, name: str) -> None:
        super().__init__(vocab + 64, context, dim, heads, layers, eps, None, -1)
        self.vocab = vocab
        self.head_name = name
        if name != "lm_head":  # another name than the original's: no path pairs it
            setattr(self, name, self.lm_head)
            del self.lm_head

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1))))
        for block in self.h:
            x = block(x)
        return getattr(self, self.head_name)(self.ln_f(x))[..., : self.vocab]


def _padded_port(hf: torch.nn.Module, name: str, bug: bool = False) -> PaddedGPT:
    c = hf.config
    port = PaddedGPT(c.vocab_size, c.n_positions, c.n_embd, c.n_head, c.n_layer, c.layer_norm_epsilon, name)
    weights = independent_gpt2.port_of(hf).state_dict()
    with torch.no_grad():
        for own, parameter in port.state_dict().items():
            source = weights["lm_head." + own.removeprefix(f"{name}.")] if own.startswith(f"{name}.") else weights[own]
            parameter.zero_()
            parameter[: source.shape[0]].copy_(source)
        if bug:  # the head's rows the model keeps, scaled (a checkpoint stored with a factor the port forgets)
            getattr(port, name).weight[: c.vocab_size].mul_(1.5)
    return port.eval()


@pytest.mark.parametrize("values", ["repr", "safetensors", "none"])
@pytest.mark.parametrize("name", ["head", "lm_head"])  # paired by structure, or by path (nanoGPT's own name)
def test_a_padded_vocabulary_cut_by_the_caller_is_no_departure(tmp_path: Path, values: str, name: str) -> None:
    hf = independent_gpt2.hf_gpt2(layers=2)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    for bug in (False, True):
        port = _padded_port(hf, name, bug)
        with torch.no_grad():
            assert torch.allclose(hf(ids).logits, port(ids), atol=1e-5) != bug
        graphtrace.capture(hf, {"input_ids": ids}, path=tmp_path / f"a{bug}", values=values)
        graphtrace.capture(port, ids, path=tmp_path / f"b{bug}", values=values)
        result = graphtrace.compare(tmp_path / f"a{bug}", tmp_path / f"b{bug}")
        if not bug:
            assert result.equal, result.table()
            # paired by name: with full values, the logits the two share are compared; by statistics, the padding
            # is left unread (under another name, structure does not pair calls returning other shapes)
            head = next((call for call in result.calls if call.b.path == f"PaddedGPT.{name}"), None)
            if name == "lm_head":
                assert head is not None, result.table()
                assert head.status == ("equal" if values == "safetensors" else "unchecked"), result.table()
            continue
        first = result.first_divergence  # the rows are wrong in the part the model keeps: the head departs
        assert first is not None and first.b.path == f"PaddedGPT.{name}", result.table()


class _Head(torch.nn.Module):
    def __init__(self, dim: int, vocab: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.proj = torch.nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


class _Model(torch.nn.Module):
    def __init__(self, dim: int, vocab: int, padded: int) -> None:
        super().__init__()
        self.emb = torch.nn.Linear(dim, dim)
        self.head = _Head(dim, padded)
        self.vocab = vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(x))[..., : self.vocab]


@pytest.mark.parametrize("values", ["repr", "none"])
def test_a_padding_nested_in_a_head_module_is_unread_too(tmp_path: Path, values: str) -> None:
    # the port's head module and its projection both return the padded logits: the projection's caller (the head)
    # departs only by its own unread padding, so it agrees for the projection too
    torch.manual_seed(0)
    a = _Model(16, 40, 40).eval()
    x = torch.randn(2, 5, 16)
    for bug in (False, True):
        b = _Model(16, 40, 64).eval()
        with torch.no_grad():
            for own, parameter in b.state_dict().items():
                source = a.state_dict()[own]
                parameter.zero_()
                parameter[: source.shape[0]].copy_(source)
            if bug:
                b.head.proj.weight[:40].mul_(1.5)
            assert torch.allclose(a(x), b(x), atol=1e-6) != bug
        graphtrace.capture(a, x, path=tmp_path / f"a{bug}", values=values)
        graphtrace.capture(b, x, path=tmp_path / f"b{bug}", values=values)
        result = graphtrace.compare(tmp_path / f"a{bug}", tmp_path / f"b{bug}")
        if not bug:
            assert result.equal, result.table()
            continue
        first = result.first_divergence
        assert first is not None and first.b.path == "_Model.head.proj", result.table()


@pytest.mark.parametrize("values", ["safetensors", "none"])
def test_a_padded_vocabulary_the_model_returns_uncut_is_a_departure(tmp_path: Path, values: str) -> None:
    # the padded logits are the model's own output, read as they are: equal on the entries both hold is not enough
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 40)).eval()
    b = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 64)).eval()
    with torch.no_grad():
        for own, parameter in b.state_dict().items():
            source = a.state_dict()[own]
            parameter.zero_()
            parameter[: source.shape[0]].copy_(source)
    x = torch.randn(2, 5, 16)
    graphtrace.capture(a, x, path=tmp_path / "a", values=values)
    graphtrace.capture(b, x, path=tmp_path / "b", values=values)
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    assert not result.equal, result.table()
