"""The bug cases of the independent ports, shared by tests/test_independent_ports.py and benchmarks/compare_ports.py.

Each case is (arch, bug, fused, the port's module that must be named): for a bug in a module's own code, that
module; for a wrong weight, that projection; for a block that calls the wrong module, the block.
"""

from __future__ import annotations

MODES = ("safetensors", "bundle", "repr")

# (arch, bug, fused, the port's module that must be named)
CASES = [
    ("llama", "rope_base", False, "layers.0.attention"),
    ("llama", "scale_1_over_d", True, "layers.0.attention"),
    ("llama", "unpermuted_qk", False, "layers.2.attention"),
    ("llama", "eps", True, "layers.2.attention_norm"),
    ("llama", "gate_up_swapped", False, "layers.2.feed_forward.w1"),
    ("llama", "wrong_norm", True, "layers.2"),
    ("llama", "bf16_attention", False, "layers.0.attention"),
    ("gpt2", "exact_gelu", False, "h.0.mlp.gelu"),
    ("gpt2", "scale_1_over_d", False, "h.0.attn"),
    ("gpt2", "post_norm", False, "h.2"),
    ("gpt2", "bf16_activation", False, "h.2.mlp"),
    ("gpt2", "eps", False, "h.2.ln2"),
    ("gpt2", "bf16_attention", False, "h.0.attn"),
]
FAITHFUL = [("llama", False), ("llama", True), ("gpt2", False)]

# faithful ports that run independent calls in another order than the original, by (arch, variant): the variant is
# passed as the port's ``bug`` though it is none (tests/independent_llama.py and independent_neox.py VARIANTS)
REORDERED = [("llama", "vkq_order"), ("neox", "mlp_first")]

# the timm-style ViT (tests/independent_vit.py) against transformers' ViTForImageClassification; "" is the model's
# own code (the class token's position embedding is added there)
VIT_CASES = [
    ("vit", "scale_1_over_d", False, "blocks.0.attn"),
    ("vit", "qkv_order", False, "blocks.1.attn"),
    ("vit", "tanh_gelu", False, "blocks.2.mlp.act"),
    ("vit", "cls_without_position", False, ""),
    ("vit", "qkv_without_bias", False, "blocks.1.attn.qkv"),
]

# a from-scratch BERT encoder (tests/independent_bert.py) against transformers' BertModel: its blocks keep the
# residuals and post-norms that transformers puts inside BertSelfOutput and BertOutput, so its attention and MLP have
# no counterpart of the same extent
BERT_CASES = [
    ("bert", "no_token_types", False, "embed"),
    ("bert", "norm_before_residual", False, "layers.1"),
    ("bert", "tanh_gelu", False, "layers.0.mlp"),
    ("bert", "pooler_relu", False, "pool"),
    ("bert", "scale_1_over_d", False, "layers.2.attn"),
]

# GPT-2 against a port that cuts c_attn into q, k, v and inlines the MLP into the block (no MLP module):
# tests/independent_gpt2.py's split_port_of
SPLIT_CASES = [
    ("gpt2-split", "exact_gelu", False, "blocks.1"),
    ("gpt2-split", "eps", False, "blocks.1.n2"),
    ("gpt2-split", "attention_scale", False, "blocks.1.a"),
]

# a Pythia written lit-gpt style (tests/independent_neox.py) against transformers' GPTNeoXForCausalLM, whose fused
# query_key_value is laid out per head; the port has separate q, k, v, interleaved partial rotary, a parallel
# residual in its block and extra dropouts
NEOX_CASES = [
    ("neox", "sequential_residual", False, "transformer.h.1"),
    ("neox", "full_rotary", False, "transformer.h.0.attn"),
    # the port's q, k and v hold the fused output's columns side by side: a legitimate layout, but not the one the
    # other blocks show, so q is compared with the columns it should hold (by statistics: its caller)
    ("neox", "contiguous_qkv", False, "transformer.h.2.attn.q"),
    ("neox", "q_without_bias", False, "transformer.h.1.attn.q"),
    ("neox", "tanh_gelu", False, "transformer.h.2.mlp.act"),
    ("neox", "final_eps", False, "transformer.ln_f"),
]

# What only statistics can tell: the parts of a fused call are compared as a whole, so the port's module that calls
# them is the most precise answer there is
STATS_EXPECTED = {
    ("neox", "q_without_bias"): "transformer.h.1.attn",
    ("neox", "contiguous_qkv"): "transformer.h.2.attn",
}

# a faithful re-ordering and a bug in the same port (REORDERED's variant, "+", the bug): inside the container that
# departs, values alone cannot tell calls run in another order from two projections' weights swapped, so what the
# port's agreeing blocks show of its order, the shapes, or a call given what no sibling was given must decide
COMPOUND_CASES = [
    # every attention departs; grouped-query shapes leave v, k, q against q, k, v no order-preserving pairing
    ("llama", "vkq_order+rope_base", False, "layers.0.attention"),
    # the order learned from layers 0 and 1, whose attentions agree
    ("llama", "vkq_order+unpermuted_qk", False, "layers.2.attention"),
    ("llama", "vkq_order+gate_up_swapped", False, "layers.2.feed_forward.w1"),
    # the block departs; its attention, run after the MLP, is the only call given the first norm's output
    ("neox", "mlp_first+full_rotary", False, "transformer.h.0.attn"),
    ("neox", "mlp_first+q_without_bias", False, "transformer.h.1.attn.q"),
    ("neox", "mlp_first+tanh_gelu", False, "transformer.h.2.mlp.act"),
]
STATS_EXPECTED[("neox", "mlp_first+q_without_bias")] = "transformer.h.1.attn"
