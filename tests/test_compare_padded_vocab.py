"""A nanoGPT-style port pads its vocabulary (GPT-2's 50257 to 50304): its head returns more logits than the original's
lm_head and the forward cuts them. That is the port's own layout, undone where the head is called: the port is
faithful and must compare equal."""

from __future__ import annotations

from pathlib import Path

import torch

import graphtrace
from tests import independent_gpt2


class PaddedGPT(independent_gpt2.GPT):
    def __init__(self, vocab: int, context: int, dim: int, heads: int, layers: int, eps: float) -> None:
        super().__init__(vocab + 64, context, dim, heads, layers, eps, None, -1)
        self.vocab = vocab
        self.head = self.lm_head  # another name than the original's: no path pairs it
        del self.lm_head

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1))))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))[..., : self.vocab]


def _padded_port(hf: torch.nn.Module) -> PaddedGPT:
    c = hf.config
    port = PaddedGPT(c.vocab_size, c.n_positions, c.n_embd, c.n_head, c.n_layer, c.layer_norm_epsilon)
    weights = independent_gpt2.port_of(hf).state_dict()
    with torch.no_grad():
        for name, parameter in port.state_dict().items():
            source = weights["lm_head." + name.removeprefix("head.")] if name.startswith("head.") else weights[name]
            parameter.zero_()
            parameter[: source.shape[0]].copy_(source)
    return port.eval()


def test_a_padded_vocabulary_cut_by_the_caller_is_no_departure(tmp_path: Path) -> None:
    hf = independent_gpt2.hf_gpt2(layers=2)
    port = _padded_port(hf)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, port(ids), atol=1e-5)
    graphtrace.capture(hf, {"input_ids": ids}, path=tmp_path / "a", values="repr")
    graphtrace.capture(port, ids, path=tmp_path / "b", values="repr")
    result = graphtrace.compare(tmp_path / "a", tmp_path / "b")
    assert result.equal, result.table()
