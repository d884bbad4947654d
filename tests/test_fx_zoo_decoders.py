"""Decoder language models through fx capture: auto equals eager, and fx serves what it can verify."""

from __future__ import annotations

import pytest

from tests.fx_equivalence import check_zoo_model

# The fewest module calls fx serves per model today (a regression guard; more is welcome). With the default
# use_cache=True the attention modules call the cache's update() and the model body builds the cache: those stay eager.
FX_SERVED_AT_LEAST = {
    "gpt2": 39,
    "llama": 41,
    "mistral": 41,
    "qwen2": 41,
    "gemma2": 47,
    "phi": 42,
    "mixtral": 35,  # 38 mostly; its 3 MoE blocks' index_put_ is sometimes refused by the replay guard (which keys
    # storages by address, so allocator reuse decides): those calls then fall back, exact as ever
    "mamba": 19,
}


@pytest.mark.parametrize("name", list(FX_SERVED_AT_LEAST))
def test_auto_equals_eager(name: str) -> None:
    check_zoo_model(name, FX_SERVED_AT_LEAST[name])
