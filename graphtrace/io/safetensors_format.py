"""The safetensors file layout, written directly: an 8-byte little-endian header length, a JSON header, the bytes.

Writing it here rather than through ``safetensors.torch.save_file`` lets graphtrace stream tensors from a
background thread and append many tensors to one file while the forward runs. A single-tensor file is byte for byte
what ``save_file({"data": t}, path)`` writes (transformers' files); a bundle reserves room for its header at the
start of the file and fills it in when the step ends (safetensors allows the header to be padded with spaces).
"""

from __future__ import annotations

import json
import struct

__all__ = ["DTYPE_NAMES", "HEADER_ALIGNMENT", "bundle_header", "single_tensor_header", "split_reference"]

DTYPE_NAMES = {
    "torch.float64": "F64",
    "torch.float32": "F32",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.bool": "BOOL",
    "torch.complex64": "C64",
}
"""safetensors' names of the dtypes written here; other dtypes go through ``save_file``."""

HEADER_ALIGNMENT = 8


def _entry(dtype: str, shape: tuple[int, ...], start: int, end: int) -> dict[str, object]:
    return {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [start, end]}


def _framed(header: dict[str, object], size: int | None) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    if size is None:
        size = -(-len(text) // HEADER_ALIGNMENT) * HEADER_ALIGNMENT
    elif len(text) > size:
        raise ValueError(f"a safetensors header of {len(text)} bytes does not fit the {size} bytes reserved")
    return struct.pack("<Q", size) + text + b" " * (size - len(text))


def single_tensor_header(dtype: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    """The bytes before the data of a file holding one tensor under the key ``data``, as ``save_file`` writes."""
    return _framed({"data": _entry(dtype, shape, 0, nbytes)}, None)


def bundle_header(entries: list[tuple[str, str, tuple[int, ...], int, int]], size: int) -> bytes:
    """The ``8 + size`` bytes before the data of a bundle; ``entries`` are ``(key, dtype, shape, start, end)``."""
    header: dict[str, object] = {"__metadata__": {"format": "pt", "writer": "graphtrace"}}
    for key, dtype, shape, start, end in entries:
        header[key] = _entry(dtype, shape, start, end)
    return _framed(header, size)


def split_reference(file: str) -> tuple[str, str | None]:
    """A record's ``file`` as (path, key): ``./x.safetensors`` holds its tensor under ``data`` (key None), a bundle
    reference ``./X_tensors.safetensors#key`` names the key (which may itself hold ``#``, as fx op paths do)."""
    path, separator, key = file.partition(".safetensors#")
    return (path + ".safetensors", key) if separator else (file, None)
