"""Encoders and encoder-decoders through fx capture: auto equals eager, and fx serves what it can verify."""

from __future__ import annotations

import pytest

import graphtrace
from tests.fx_equivalence import check_zoo_model
from tests.zoo import FX_ZOO

# The fewest module calls fx serves per model today (a regression guard; more is welcome). The BERT family's model
# body builds its attention mask another way while traced (transformers skips a data-dependent shortcut for traced
# values), which the replay catches; encoder-decoders keep their cache-using decoder attention eager.
FX_SERVED_AT_LEAST = {"bert": 61, "roberta": 61, "distilbert": 45, "t5": 130, "bart": 88, "whisper": 63}


@pytest.mark.parametrize("name", list(FX_SERVED_AT_LEAST))
def test_auto_equals_eager(name: str) -> None:
    check_zoo_model(name, FX_SERVED_AT_LEAST[name])


def test_a_mask_built_another_way_while_traced_is_caught() -> None:
    model, inputs = FX_ZOO["bert"]()
    trace = graphtrace.capture(model, inputs)
    assert trace.find("BertModel").strategy == "eager"
    assert trace.fallbacks["BertModel"].startswith("Mismatch: the input of encoder")
    assert trace.find("BertModel.encoder").strategy == "fx"  # its children are verified on their own
