"""A Mamba written the way johnma2006's ``mamba-minimal`` writes it, not the way transformers does: test material for
diff on a state-space model.

transformers' ``MambaForCausalLM`` calls ``MambaBlock`` (a norm and a ``MambaMixer``) per layer; its mixer runs the
depthwise convolution and the time-step projection as functions of its modules' weights (``conv1d`` and ``dt_proj``
are never called) and the selective scan as a function. This port's ``ResidualBlock`` holds a hand-written
``RMSNorm`` and a ``MambaBlock`` mixer (the same class name as transformers' layer, on other code) that calls its
``conv1d`` module (padded by k - 1, sliced to the length) and ``dt_proj``, splits delta, B and C from ``x_proj`` in
its own code and scans in a method of its own, a Python loop over time with einsum; ``lm_head`` is tied to the
embedding. The original is transformers' ``MambaForCausalLM`` (on CPU its pure-PyTorch path); ``port_of`` copies
its weights. Each ``bug`` injects one porting mistake (see ``CASES``).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tests.port_traces import randomized

BUGS = (
    "zx_swapped",  # layer 1's in_proj loaded with its x and z halves swapped
    "conv_tail",  # layer 0 keeps the last L positions of the padded convolution instead of the first L
    "no_softplus",  # layer 2's delta is dt_proj's output without the softplus
    "a_log",  # layer 1 scans with A = A_log instead of -exp(A_log)
    "no_skip",  # layer 2's scan leaves out the D skip term
    "no_gate_silu",  # layer 0 gates with z instead of silu(z)
    "eps_after_sqrt",  # RMSNorm divides by sqrt(mean square) + eps instead of sqrt(mean square + eps)
)

# where each bug lives: the module whose own code (or weights) holds it
CASES = [
    ("mamba", "zx_swapped", False, "layers.1.mixer.in_proj"),
    ("mamba", "conv_tail", False, "layers.0.mixer"),
    ("mamba", "no_softplus", False, "layers.2.mixer"),
    ("mamba", "a_log", False, "layers.1.mixer"),
    ("mamba", "no_skip", False, "layers.2.mixer"),
    ("mamba", "no_gate_silu", False, "layers.0.mixer"),
    ("mamba", "eps_after_sqrt", False, "layers.0.norm"),  # the class is wrong: its first instance departs first
]
# by statistics (the value fingerprint too) a re-ordering of the last dimension cannot be seen: the mixer that
# reads the swapped halves is the first call whose output departs
STATS_EXPECTED = {("mamba", "zx_swapped"): "layers.1.mixer"}

RULES = (
    "backbone.embeddings=embedding",
    "backbone.layers.{i}=layers.{i}",
    "backbone.norm_f=norm_f",
)

_LAYER = {"zx_swapped": 1, "conv_tail": 0, "no_softplus": 2, "a_log": 1, "no_skip": 2, "no_gate_silu": 0}


class RMSNorm(nn.Module):
    def __init__(self, d_model: int, eps: float, bug: str | None) -> None:
        super().__init__()
        self.eps, self.eps_outside = eps, bug == "eps_after_sqrt"
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.eps_outside:
            return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class MambaBlock(nn.Module):
    def __init__(self, d_model: int, d_inner: int, d_state: int, dt_rank: int, d_conv: int, bug: str | None) -> None:
        super().__init__()
        self.d_inner, self.dt_rank, self.bug = d_inner, dt_rank, bug
        self.in_proj = nn.Linear(d_model, d_inner * 2, bias=False)
        self.conv1d = nn.Conv1d(d_inner, d_inner, kernel_size=d_conv, groups=d_inner, padding=d_conv - 1, bias=True)
        self.x_proj = nn.Linear(d_inner, dt_rank + d_state * 2, bias=False)
        self.dt_proj = nn.Linear(dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.zeros(d_inner, d_state))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[1]
        x, res = self.in_proj(x).split([self.d_inner, self.d_inner], dim=-1)
        x = self.conv1d(x.transpose(1, 2))
        x = x[:, :, -length:] if self.bug == "conv_tail" else x[:, :, :length]
        x = F.silu(x.transpose(1, 2))
        y = self.ssm(x)
        y = y * (res if self.bug == "no_gate_silu" else F.silu(res))
        return self.out_proj(y)

    def ssm(self, x: torch.Tensor) -> torch.Tensor:
        n = self.A_log.shape[1]
        A = self.A_log.float() if self.bug == "a_log" else -torch.exp(self.A_log.float())
        delta, B, C = self.x_proj(x).split([self.dt_rank, n, n], dim=-1)
        delta = self.dt_proj(delta)
        if self.bug != "no_softplus":
            delta = F.softplus(delta)
        return self.selective_scan(x, delta, A, B, C, self.D.float())

    def selective_scan(
        self, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: torch.Tensor
    ) -> torch.Tensor:
        batch, length, d_in = u.shape
        delta_a = torch.exp(torch.einsum("bld,dn->bldn", delta, A))
        delta_b_u = torch.einsum("bld,bln,bld->bldn", delta, B, u)
        state = torch.zeros(batch, d_in, A.shape[1], dtype=u.dtype)
        ys = []
        for i in range(length):
            state = delta_a[:, i] * state + delta_b_u[:, i]
            ys.append(torch.einsum("bdn,bn->bd", state, C[:, i]))
        y = torch.stack(ys, dim=1)
        return y if self.bug == "no_skip" else y + u * D


class ResidualBlock(nn.Module):
    def __init__(self, config, bug: str | None, norm_bug: str | None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        self.mixer = MambaBlock(
            config.hidden_size,
            config.intermediate_size,
            config.state_size,
            int(config.time_step_rank),
            config.conv_kernel,
            bug,
        )
        self.norm = RMSNorm(config.hidden_size, config.layer_norm_epsilon, norm_bug)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mixer(self.norm(x)) + x


class Mamba(nn.Module):
    def __init__(self, config, bug: str | None = None) -> None:  # type: ignore[no-untyped-def]
        super().__init__()
        norm_bug = bug if bug == "eps_after_sqrt" else None
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            ResidualBlock(config, bug if _LAYER.get(bug or "") == i else None, norm_bug)
            for i in range(config.num_hidden_layers)
        )
        self.norm_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon, norm_bug)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head.weight = self.embedding.weight

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm_f(x))


def hf_mamba(seed: int = 0):  # type: ignore[no-untyped-def]
    """transformers' MambaForCausalLM, tiny, with random weights (norms around one) and no cache."""
    from transformers import MambaConfig, MambaForCausalLM

    torch.manual_seed(seed)
    config = MambaConfig(
        vocab_size=128,
        hidden_size=32,
        state_size=8,
        expand=2,
        conv_kernel=4,
        num_hidden_layers=3,
        time_step_rank=4,
        layer_norm_epsilon=1e-3,
        use_cache=False,
        use_mambapy=False,
        use_associative_scan=False,
    )
    model = randomized(MambaForCausalLM(config).eval(), 0.3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(1.0, 0.3)
    return model


def port_of(hf, bug: str | None = None) -> Mamba:  # type: ignore[no-untyped-def]
    """The port of ``hf`` (transformers' MambaForCausalLM), its weights copied."""
    port = Mamba(hf.config, bug).eval()
    with torch.no_grad():
        port.embedding.weight.copy_(hf.backbone.embeddings.weight)
        for index, (mine, theirs) in enumerate(zip(port.layers, hf.backbone.layers)):
            mixer = theirs.mixer
            in_proj = mixer.in_proj.weight
            if bug == "zx_swapped" and index == _LAYER[bug]:
                x_half, z_half = in_proj.chunk(2)
                in_proj = torch.cat([z_half, x_half])
            mine.mixer.in_proj.weight.copy_(in_proj)
            for name in ("conv1d", "x_proj", "dt_proj", "out_proj"):
                getattr(mine.mixer, name).load_state_dict(getattr(mixer, name).state_dict())
            mine.mixer.A_log.copy_(mixer.A_log)
            mine.mixer.D.copy_(mixer.D)
            mine.norm.weight.copy_(theirs.norm.weight)
        port.norm_f.weight.copy_(hf.backbone.norm_f.weight)
    return port


def token_ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(seed))


__all__ = ["BUGS", "CASES", "RULES", "STATS_EXPECTED", "Mamba", "hf_mamba", "port_of", "token_ids"]
