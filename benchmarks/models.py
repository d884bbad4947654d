"""The benchmarked models: real transformers architectures built from config classes, random weights, no download.

Sizes follow the issue that set the goals: a deep and narrow Llama (many cheap module calls: the per-call cost),
the published shapes of T5-small, BERT-base and GPT-2 small (where the statistics start to matter), and a 0.85B
Llama (where the forward itself dominates and full tensors weigh a gigabyte).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MODELS", "QUICK_MODELS", "BenchModel", "build"]


@dataclass(frozen=True)
class BenchModel:
    name: str
    description: str
    factory: Callable[[], tuple[torch.nn.Module, dict[str, Any]]]


def _ids(vocab: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def _eval(model: torch.nn.Module) -> torch.nn.Module:
    return model.eval()


def tiny_llama() -> tuple[torch.nn.Module, dict[str, Any]]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return _eval(LlamaForCausalLM(config)), {"input_ids": _ids(config.vocab_size, 16)}


def t5_small() -> tuple[torch.nn.Module, dict[str, Any]]:
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(decoder_start_token_id=0)  # the defaults are t5-small's shapes
    vocab = config.vocab_size
    inputs = {"input_ids": _ids(vocab, 64), "decoder_input_ids": _ids(vocab, 64, seed=2)}
    return _eval(T5ForConditionalGeneration(config)), inputs


def bert_base() -> tuple[torch.nn.Module, dict[str, Any]]:
    from transformers import BertConfig, BertModel

    config = BertConfig()  # bert-base-uncased's shapes
    ids = _ids(config.vocab_size, 128)
    return _eval(BertModel(config)), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def gpt2_small() -> tuple[torch.nn.Module, dict[str, Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config()  # gpt2's shapes
    return _eval(GPT2LMHeadModel(config)), {"input_ids": _ids(config.vocab_size, 128)}


def _tinyllama(layers: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """TinyLlama's shapes (hidden 2048, 32 heads, 4 key/value heads) with ``layers`` layers, on 256 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    return _eval(LlamaForCausalLM(config)), {"input_ids": _ids(config.vocab_size, 256)}


def llama_085b() -> tuple[torch.nn.Module, dict[str, Any]]:
    return _tinyllama(16)  # 0.84B parameters


def llama_11b() -> tuple[torch.nn.Module, dict[str, Any]]:
    return _tinyllama(22)  # TinyLlama-1.1B itself: the device benchmark's 1B Llama


MODELS: dict[str, BenchModel] = {
    model.name: model
    for model in (
        BenchModel("tiny-llama", "Llama, hidden 64, 32 layers, 16 tokens (423 modules)", tiny_llama),
        BenchModel("t5-small", "T5-small, 64 + 64 tokens", t5_small),
        BenchModel("bert-base", "BERT-base, 128 tokens", bert_base),
        BenchModel("gpt2-small", "GPT-2 small, 128 tokens", gpt2_small),
        BenchModel("llama-0.85b", "Llama, hidden 2048, 16 layers (0.84B), 256 tokens", llama_085b),
        BenchModel("llama-1.1b", "Llama, hidden 2048, 22 layers (1.1B), 256 tokens", llama_11b),
    )
}

QUICK_MODELS = ("tiny-llama", "t5-small")


def build(name: str) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model (eval mode, weights from a fixed seed) and its keyword inputs."""
    torch.manual_seed(0)
    return MODELS[name].factory()
