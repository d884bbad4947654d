"""Real architectures from transformers config classes, at small sizes with random weights (never from a hub).

Each builder returns ``(model, inputs)``: the model in eval mode with weights from a fixed seed, and a dict of
keyword arguments for its forward. Three layers everywhere, so that layer pruning has something to drop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Example = tuple[torch.nn.Module, dict[str, Any]]

VOCAB = 99
LAYERS = 3


def _ids(batch: int = 1, length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _pixels(size: int = 32, channels: int = 3, seed: int = 2) -> torch.Tensor:
    return torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(seed))


def _build(model_class: Any, config: Any, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return model_class(config).eval()


def llama(layers: int = LAYERS) -> Example:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )
    return _build(LlamaForCausalLM, config), {"input_ids": _ids()}


def bert() -> Example:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, max_position_embeddings=64,
    )
    ids = _ids()
    return _build(BertModel, config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def gpt2() -> Example:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=LAYERS, n_head=4, n_positions=64)
    return _build(GPT2LMHeadModel, config), {"input_ids": _ids()}


def t5() -> Example:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=LAYERS, num_decoder_layers=LAYERS,
        num_heads=4, decoder_start_token_id=0,
    )
    return _build(T5ForConditionalGeneration, config), {"input_ids": _ids(), "decoder_input_ids": _ids(length=4)}


def vit() -> Example:
    from transformers import ViTConfig, ViTModel

    config = ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4,
    )
    return _build(ViTModel, config), {"pixel_values": _pixels()}


ORACLE_MODELS: dict[str, Callable[[], Example]] = {
    "llama": llama,
    "bert": bert,
    "gpt2": gpt2,
    "t5": t5,
    "vit": vit,
}
