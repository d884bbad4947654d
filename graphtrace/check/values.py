"""The original's full values, read from its trace directory one tensor at a time.

A container's output computed in its own code (a block's residual sum) is not kept as a file of its own: the same
tensor is kept where a later call is given it (the next block's input). Data flow says which calls were given a
call's output (``inputs_from``), and among their input records the one with the same shape, dtype and statistics is
the same tensor.
"""

from __future__ import annotations

import torch

from graphtrace.compare.pairs import ValueFiles
from graphtrace.errors import TraceFormatError
from graphtrace.model import CallNode, TensorRecord

__all__ = ["OriginalValues"]


class OriginalValues:
    """The full values of the original's step ``root``, read through ``files``."""

    def __init__(self, root: CallNode, files: ValueFiles) -> None:
        self._files = files
        self._consumers: dict[str, list[CallNode]] = {}
        for node in root.walk():
            for source in node.inputs_from:
                self._consumers.setdefault(source, []).append(node)

    def kept(self, node: CallNode, record: TensorRecord, output: bool) -> TensorRecord | None:
        """``record`` (an input or, with ``output``, an output of ``node``) or the record of the same tensor that
        has a file; None when the trace keeps no value of it."""
        if record.file:
            return record
        if not output or record.stats is None:
            return None
        for consumer in self._consumers.get(node.id, ()):
            for _, given in consumer.input_tensors():
                if given.file and (given.shape, given.dtype, given.stats) == (record.shape, record.dtype, record.stats):
                    return given
        return None

    def load(self, record: TensorRecord) -> torch.Tensor:
        """The value of ``record`` (which has a file), checked to have the recorded shape."""
        assert record.file is not None
        try:
            value: torch.Tensor = self._files.load(record.file, record.shape)
        except TraceFormatError:
            raise
        except Exception as exc:  # a file that cannot be opened or parsed, named with the remedy
            raise TraceFormatError(
                f"the original's trace refers to {record.file}, which cannot be read from {self._files.directory} "
                f"({type(exc).__name__}: {exc}). Copy the trace directory with all its .safetensors files."
            ) from exc
        if tuple(value.shape) != record.shape:
            raise TraceFormatError(
                f"the original's trace refers to {record.file}, which holds a tensor of shape {list(value.shape)} "
                f"where the trace records {list(record.shape)}; the file does not belong to this trace."
            )
        return value
