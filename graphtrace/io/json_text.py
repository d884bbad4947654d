"""JSON text pieces as ``json.dumps`` writes them, for writers that assemble indented text themselves.

With ``indent`` set, CPython's ``json`` module leaves its C encoder aside and walks the document with Python
generators, one ``yield`` per token: writing the spec files of a small model that way costs more than its forward
pass. graphtrace's writers therefore emit their (fixed) structure directly and use these helpers for the leaves.
"""

from __future__ import annotations

import json.encoder
from collections.abc import Callable
from typing import Any

__all__ = ["dumps_key", "escape"]

escape: Callable[[str], str] = json.encoder.encode_basestring_ascii
"""A quoted, escaped JSON string (``ensure_ascii=True``, json's C implementation where available)."""


def dumps_key(key: Any) -> str:
    """A dict key as ``json.dumps`` writes it: strings escaped, numbers, booleans and None as quoted literals."""
    if isinstance(key, str):
        return escape(key)
    if isinstance(key, float):
        return '"' + json.dumps(key) + '"'
    if key is True:
        return '"true"'
    if key is False:
        return '"false"'
    if key is None:
        return '"null"'
    if isinstance(key, int):
        return '"' + int.__repr__(key) + '"'
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")
