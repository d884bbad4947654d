"""Full tensor values: repr lines for FULL_TENSORS.json, or safetensors files streamed to disk during the forward.

Capture hands every tensor whose value is wanted to a *sink* (``graphtrace.engine.recorder.ValueSink``); the sink returns what the trace keeps: the repr lines,
or the relative path of the file it wrote. Writing while the forward runs keeps the tensor in memory no longer than
the call that produced it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from graphtrace.errors import OutputPathError, UnsupportedTensorError
from graphtrace.reprs import SPEC_LINEWIDTH, sanitize_repr, spec_printoptions

__all__ = ["ReprSink", "SafetensorsSink", "load_tensor", "repr_lines"]

def repr_lines(tensor: torch.Tensor) -> tuple[str, ...]:
    """The lines ``print(tensor)`` shows under ``sci_mode=True, linewidth=120``, sanitised, as transformers writes
    them. Torch's print options are set only for the duration of the ``repr`` and restored after."""
    with spec_printoptions(SPEC_LINEWIDTH):
        text = repr(tensor)
    return tuple(sanitize_repr(text).splitlines())


class ReprSink:
    """Keeps the repr lines of each tensor (``use_repr=True``)."""

    per_name = False
    linewidth: int | None = SPEC_LINEWIDTH

    def store(self, tensor: torch.Tensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        return repr_lines(tensor), None

    def discard(self, file: str) -> None:
        """Nothing to remove: repr lines live in the record itself."""


class SafetensorsSink:
    """Writes each tensor to ``{directory}/{name}.safetensors`` under the key ``data`` (``use_repr=False``)."""

    per_name = True
    linewidth: int | None = None  # transformers leaves the line width alone in this mode

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.written: list[Path] = []

    def store(self, tensor: torch.Tensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        filename = name.replace("/", "_")
        if not filename.endswith(".safetensors"):
            filename += ".safetensors"
        target = self.directory / filename
        try:
            data = tensor.detach().contiguous().cpu()
        except (RuntimeError, NotImplementedError) as exc:
            raise UnsupportedTensorError(
                f"cannot store tensor {name!r} ({tensor.dtype}, layout {tensor.layout}) as safetensors: {exc}. "
                "Capture with values='repr' (use_repr=True), or convert the tensor to a dense strided one."
            ) from exc
        try:
            save_file({"data": data}, str(target))
        except OSError as exc:
            raise OutputPathError(
                f"cannot write {target}: {exc.strerror or exc}. Free some space or choose another directory."
            ) from exc
        except Exception as exc:  # safetensors raises its own error types for dtypes it cannot store
            raise UnsupportedTensorError(
                f"cannot store tensor {name!r} ({tensor.dtype}) as safetensors: {exc}. "
                "Capture with values='repr' (use_repr=True) for this model."
            ) from exc
        self.written.append(target)
        return None, f"./{filename}"

    def discard(self, file: str) -> None:
        """Remove a file :meth:`store` wrote into the current directory (``file`` as :meth:`store` returned it)."""
        target = self.directory / file
        target.unlink(missing_ok=True)
        if target in self.written:
            self.written.remove(target)


def load_tensor(directory: str | os.PathLike[str], file: str) -> torch.Tensor:
    """The tensor stored under ``data`` in ``file`` (a ``./name.safetensors`` path relative to ``directory``)."""
    from safetensors.torch import load_file

    return load_file(str(Path(directory) / file))["data"]
