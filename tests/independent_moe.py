"""A Mixtral written the way Mistral's reference code (mistral-inference's ``moe.py``) writes it, not the way
transformers does: test material for diff, above all for a mixture of experts whose experts are fused on one side and
separate modules on the other.

transformers' ``MixtralSparseMoeBlock`` holds a router ``gate`` (softmax over all experts, top-k, renormalised) and
one fused ``MixtralExperts`` module whose 3D parameters ``gate_up_proj[E, 2I, H]`` and ``down_proj[E, H, I]`` serve
every expert in a loop inside one call. This port holds an ``nn.ModuleList`` of per-expert ``FeedForward`` modules
(``w1``, ``w2``, ``w3`` ``nn.Linear`` each, called once per expert with the tokens routed to it: a data-dependent
number of calls the original has no counterpart for), a ``gate`` linear, routing by ``torch.topk`` on the logits and a
softmax over the top k only (equal to transformers' softmax, top k, renormalise), Meta's attention names and
interleaved complex rotary embeddings (q/k rows permuted per head on load). The original is transformers'
``MixtralForCausalLM``; ``port_of`` copies its weights. Each ``bug`` injects one porting mistake (see ``BUGS``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from tests.port_traces import randomized

BUGS = (
    "softmax_all",  # layer 1 routes by a softmax over all experts, its top 2 not renormalised
    "top1",  # every layer sends each token to 1 expert where the original sends it to 2
    "w1_w3_swapped",  # expert 1 of layer 2 loaded with the original's up rows as w1 and its gate rows as w3
    "experts_shifted",  # layer 1's experts loaded off by one: expert e holds the original's expert e + 1
    "gate_scrambled",  # layer 2's router weight loaded transposed and reshaped back to [E, H]
    "rope_base",  # rotary base 10000 where the original uses 1e6
    "eps",  # layer 2's ffn norm eps 1e-4 (another model's config) where the original uses 1e-5
)

RULES = (
    "model.embed_tokens=tok_embeddings",
    "model.layers.{i}=layers.{i}",
    "model.norm=norm",
    "lm_head=output",
    "self_attn.q_proj=attention.wq",
    "self_attn.k_proj=attention.wk",
    "self_attn.v_proj=attention.wv",
    "self_attn.o_proj=attention.wo",
    "self_attn=attention",
    "input_layernorm=attention_norm",
    "post_attention_layernorm=ffn_norm",
    "mlp.gate=feed_forward.gate",
    "mlp=feed_forward",
)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


def rotation(head_dim: int, length: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(length).float(), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rotate(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs_cis[:, None, :]).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: dict) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args["n_heads"], args["n_kv_heads"], args["head_dim"]
        dim = args["dim"]
        self.wq = nn.Linear(dim, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        seqlen = x.shape[0]  # mistral-inference flattens the batch: x is [tokens, dim]
        xq = self.wq(x).view(seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(seqlen, self.n_kv_heads, self.head_dim)
        xq, xk = rotate(xq, freqs_cis), rotate(xk, freqs_cis)
        repeats = self.n_heads // self.n_kv_heads
        keys, values = xk.repeat_interleave(repeats, dim=1), xv.repeat_interleave(repeats, dim=1)
        scores = torch.einsum("qhd,khd->hqk", xq, keys) / math.sqrt(self.head_dim)
        causal = torch.ones(seqlen, seqlen, dtype=torch.bool).tril()
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        return self.wo(torch.einsum("hqk,khd->qhd", probs, values).reshape(seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoeLayer(nn.Module):
    def __init__(self, args: dict, bug: str | None) -> None:
        super().__init__()
        self.experts = nn.ModuleList(FeedForward(args["dim"], args["hidden"]) for _ in range(args["num_experts"]))
        self.gate = nn.Linear(args["dim"], args["num_experts"], bias=False)
        self.num_experts_per_tok = 1 if bug == "top1" else args["num_experts_per_tok"]
        self.softmax_all = bug == "softmax_all"

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        gate_logits = self.gate(inputs)
        if self.softmax_all:  # the probabilities of all experts, the top k of them not renormalised
            weights, selected = torch.topk(F.softmax(gate_logits, dim=1, dtype=torch.float), self.num_experts_per_tok)
        else:
            weights, selected = torch.topk(gate_logits, self.num_experts_per_tok)
            weights = F.softmax(weights, dim=1, dtype=torch.float)
        weights = weights.to(inputs.dtype)
        results = torch.zeros_like(inputs)
        for i, expert in enumerate(self.experts):
            batch_idx, nth_expert = torch.where(selected == i)
            if len(batch_idx):
                results.index_add_(0, batch_idx, weights[batch_idx, nth_expert, None] * expert(inputs[batch_idx]))
        return results


class TransformerBlock(nn.Module):
    def __init__(self, args: dict, bug: str | None, eps: float) -> None:
        super().__init__()
        self.attention = Attention(args)
        self.attention_norm = RMSNorm(args["dim"], args["eps"])
        self.ffn_norm = RMSNorm(args["dim"], eps)
        self.feed_forward = MoeLayer(args, bug)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


# the layer each bug is injected in (the rest apply to every layer or to the model)
BUG_LAYER = {"softmax_all": 1, "w1_w3_swapped": 2, "experts_shifted": 1, "gate_scrambled": 2, "eps": 2}


class Transformer(nn.Module):
    def __init__(self, args: dict, bug: str | None = None) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args["vocab"], args["dim"])
        self.layers = nn.ModuleList(
            TransformerBlock(
                args,
                bug if BUG_LAYER.get(bug or "", i) == i else None,
                1e-4 if bug == "eps" and i == BUG_LAYER["eps"] else args["eps"],
            )
            for i in range(args["n_layers"])
        )
        self.norm = RMSNorm(args["dim"], args["eps"])
        self.output = nn.Linear(args["dim"], args["vocab"], bias=False)
        theta = 10000.0 if bug == "rope_base" else args["theta"]
        self.register_buffer("freqs_cis", rotation(args["head_dim"], args["max_len"], theta), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(input_ids)  # one sequence of [tokens]
        freqs_cis = self.freqs_cis[: input_ids.shape[0]]
        for layer in self.layers:
            h = layer(h, freqs_cis)
        return self.output(self.norm(h)).float()


def _interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' half-split rows of each head -> Meta's interleaved rows."""
    out, dim = w.shape
    return w.view(heads, 2, out // heads // 2, dim).transpose(1, 2).reshape(out, dim)


def port_of(hf, bug: str | None = None) -> Transformer:  # type: ignore[no-untyped-def]
    """A ``Transformer`` with the weights of a transformers ``MixtralForCausalLM`` (eval mode)."""
    c = hf.config
    args = {
        "dim": c.hidden_size,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "head_dim": c.hidden_size // c.num_attention_heads,
        "hidden": c.intermediate_size,
        "n_layers": c.num_hidden_layers,
        "vocab": c.vocab_size,
        "eps": c.rms_norm_eps,
        "theta": c.rope_parameters["rope_theta"],
        "max_len": c.max_position_embeddings,
        "num_experts": c.num_local_experts,
        "num_experts_per_tok": c.num_experts_per_tok,
    }
    port = Transformer(args, bug)
    hidden, experts = args["hidden"], args["num_experts"]
    with torch.no_grad():
        port.tok_embeddings.weight.copy_(hf.model.embed_tokens.weight)
        port.norm.weight.copy_(hf.model.norm.weight)
        port.output.weight.copy_(hf.lm_head.weight)
        for i, (mine, theirs) in enumerate(zip(port.layers, hf.model.layers)):
            a = theirs.self_attn
            mine.attention.wq.weight.copy_(_interleaved(a.q_proj.weight, args["n_heads"]))
            mine.attention.wk.weight.copy_(_interleaved(a.k_proj.weight, args["n_kv_heads"]))
            mine.attention.wv.weight.copy_(a.v_proj.weight)
            mine.attention.wo.weight.copy_(a.o_proj.weight)
            mine.attention_norm.weight.copy_(theirs.input_layernorm.weight)
            mine.ffn_norm.weight.copy_(theirs.post_attention_layernorm.weight)
            moe = theirs.mlp
            router = moe.gate.weight
            if bug == "gate_scrambled" and i == BUG_LAYER[bug]:
                router = router.t().reshape(router.shape)
            mine.feed_forward.gate.weight.copy_(router)
            for e, expert in enumerate(mine.feed_forward.experts):
                source = (e + 1) % experts if bug == "experts_shifted" and i == BUG_LAYER[bug] else e
                gate_up, down = moe.experts.gate_up_proj[source], moe.experts.down_proj[source]
                w1, w3 = gate_up[:hidden], gate_up[hidden:]
                if bug == "w1_w3_swapped" and i == BUG_LAYER[bug] and e == 1:
                    w1, w3 = w3, w1
                expert.w1.weight.copy_(w1)
                expert.w3.weight.copy_(w3)
                expert.w2.weight.copy_(down)
    return port.eval()


# (arch, bug, fused, the port's module that must be named). The routing bugs live in the MoE layer's own code (its
# gate's logits agree; it picks, weighs and sums the experts' outputs). So do, as far as the traces can tell, the
# expert bugs: the original's experts are one fused call whose output is already the routed, weighted sum, which the
# port forms in its MoE layer's own code, so no call of the original holds one expert's output or one expert's
# projection to set a port's ``experts.1.w1`` against; the MoE layer, the innermost port module holding both the last
# call that agreed (its gate) and the departure, is the most precise answer there is. A router weight loaded wrong
# shows at the router itself, which both sides hold as a call.
CASES = [
    ("moe", "softmax_all", False, "layers.1.feed_forward"),
    ("moe", "top1", False, "layers.0.feed_forward"),
    ("moe", "w1_w3_swapped", False, "layers.2.feed_forward"),
    ("moe", "experts_shifted", False, "layers.1.feed_forward"),
    ("moe", "gate_scrambled", False, "layers.2.feed_forward.gate"),
    ("moe", "rope_base", False, "layers.0.attention"),
    ("moe", "eps", False, "layers.2.ffn_norm"),
]
STATS_EXPECTED: dict[tuple[str, str], str] = {}  # statistics name every case where values do


def hf_mixtral(layers: int = 3, seed: int = 0):  # type: ignore[no-untyped-def]
    """A small transformers Mixtral with random weights (norms too, so a swapped norm shows)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(seed)
    config = MixtralConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        attn_implementation="eager",
        experts_implementation="eager",
    )
    model = randomized(MixtralForCausalLM(config).eval(), 0.2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(1.0)
    return model


def token_ids(seed: int = 1) -> torch.Tensor:
    """Eight tokens: the original takes them as ``[1, 8]``, the port (mistral-inference style) as ``[8]``."""
    return torch.randint(0, 128, (8,), generator=torch.Generator().manual_seed(seed))


def inputs(ids: torch.Tensor) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor]]:
    """(the original's inputs, the port's)."""
    return {"input_ids": ids[None]}, (ids,)


__all__ = ["BUGS", "CASES", "RULES", "STATS_EXPECTED", "Transformer", "hf_mixtral", "inputs", "port_of", "token_ids"]
