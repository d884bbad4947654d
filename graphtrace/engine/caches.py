"""transformers' key/value caches (``DynamicCache``, ``EncoderDecoderCache``, ...) as a step sees them.

``generate()`` passes one cache object to every forward call and the model fills it in place. A step's cache tells
what the step was: a prefill when the cache was empty, a decoding step when it already held tokens. The cache's
``repr`` (``DynamicCache(layers=[DynamicLayer, ...])``) says little, so a step also records what the cache holds
afterwards: each layer's tensors, by shape and dtype. Their statistics are computed when the step filled an empty
cache (a prefill: everything in it is the step's own); a decoding step adds a token to a cache it would otherwise
read whole again, so statistics there would cost O(cache) per token for numbers dominated by earlier steps.

Caches are recognised by their classes, without importing transformers: a cache is an instance of a class named
``Cache`` defined in transformers, and its parts (layers, sub-caches) are instances of classes from
``transformers.cache_utils`` (or subclasses of them defined in modeling files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from graphtrace.model import StepInfo, TensorRecord, Value

__all__ = ["StepCache", "find_cache", "is_cache"]

_CACHE_MODULE = "transformers.cache_utils"
_MAX_DEPTH = 4  # a cache holds layers, an encoder-decoder cache holds caches: nothing deeper is a cache's state

_is_cache: dict[type, bool] = {}
_is_cache_part: dict[type, bool] = {}


def is_cache(value: Any) -> bool:
    """True for a transformers ``Cache`` (any subclass)."""
    kind = type(value)
    known = _is_cache.get(kind)
    if known is None:
        known = _is_cache[kind] = any(
            cls.__name__ == "Cache" and cls.__module__.startswith("transformers.") for cls in kind.__mro__
        )
    return known


def _cache_part(value: Any) -> bool:
    kind = type(value)
    known = _is_cache_part.get(kind)
    if known is None:
        known = _is_cache_part[kind] = any(cls.__module__ == _CACHE_MODULE for cls in kind.__mro__)
    return known


def find_cache(values: Iterable[Any]) -> Any | None:
    """The first cache among ``values`` (a call's positional and keyword arguments), or None."""
    return next((value for value in values if is_cache(value)), None)


def _seq_length(cache: Any) -> int | None:
    try:
        return int(cache.get_seq_length())
    # a cache class whose length is not defined without arguments (TypeError, also int(None) of an abstract one),
    # not implemented, not initialised yet (a layer without keys), or refused for a layer (ValueError)
    except (TypeError, NotImplementedError, AttributeError, IndexError, ValueError):
        return None


class StepCache:
    """The cache of one top-level call: its length when the call began, and what it became."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.before = _seq_length(cache)

    def step_info(self, record: Callable[[torch.Tensor, bool], TensorRecord]) -> StepInfo:
        """The step's :class:`StepInfo`; ``record(tensor, statistics)`` turns the cache's tensors into records."""
        after = _seq_length(self.cache)
        new = after - self.before if after is not None and self.before is not None else None
        filled = self.before == 0
        state = _state(self.cache, lambda tensor: record(tensor, filled), 0)
        return StepInfo(cached_tokens=self.before, new_tokens=new, cache=state)


def _state(part: Any, record: Callable[[torch.Tensor], TensorRecord], depth: int) -> Value:
    """``{"type": class name, attribute: tensors...}`` for a cache or one of its parts (public attributes that hold
    tensors or further parts; flags and sizes are left out)."""
    state: dict[str, Value] = {"type": type(part).__name__}
    for name, value in getattr(part, "__dict__", {}).items():
        if name.startswith("_"):
            continue
        held = _held(value, record, depth)
        if held is not None:
            state[name] = held
    return state


def _held(value: Any, record: Callable[[torch.Tensor], TensorRecord], depth: int) -> Value | None:
    """The record of what ``value`` holds when it is (or contains) a tensor or a cache part, else None."""
    if isinstance(value, torch.Tensor):
        return record(value)
    if depth < _MAX_DEPTH and _cache_part(value):
        return _state(value, record, depth + 1)
    if isinstance(value, (list, tuple)):
        items = [_held(item, record, depth) for item in value]
        if any(item is not None for item in items):
            return tuple("None" if item is None else item for item in items)
    elif isinstance(value, dict):
        entries = {str(key): _held(item, record, depth) for key, item in value.items()}
        if any(item is not None for item in entries.values()):
            return {key: "None" if item is None else item for key, item in entries.items()}
    return None
