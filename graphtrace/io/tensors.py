"""Full tensor values: repr lines for FULL_TENSORS.json, or safetensors files streamed to disk during the forward.

Capture hands every tensor whose value is wanted to a *sink* (``graphtrace.engine.recorder.ValueSink``); the sink
returns what the trace keeps: the repr lines, or the relative path of the file it wrote (``./name.safetensors``, or
``./X_tensors.safetensors#key`` inside a bundle). Files are written by a background thread while the forward runs
(:mod:`graphtrace.io.file_writer`), so a tensor stays in memory no longer than the writer's bounded queue needs it.
Sinks can also take a snapshot now and store it later, for the layer blocks that pruning may drop
(``graphtrace.engine.layer_pruning``).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from graphtrace.errors import OutputPathError, TraceFormatError, UnsupportedTensorError
from graphtrace.io.file_writer import BackgroundWriter
from graphtrace.io.host_copy import HostTensor, to_host
from graphtrace.io.repr_batch import PrintedValues, ReprBatch
from graphtrace.io.safe_paths import check_regular_file, create_new, inside, write_atomic
from graphtrace.io.safetensors_format import DTYPE_NAMES, bundle_header, single_tensor_header, split_reference
from graphtrace.io.tensor_repr import printed_values, repr_lines
from graphtrace.reprs import SPEC_LINEWIDTH

__all__ = ["BUNDLE_SUFFIX", "BundleSink", "ReprSink", "SafetensorsSink", "TensorFiles", "load_tensor", "repr_lines"]


class ReprSink:
    """Keeps the repr lines of each tensor (``use_repr=True``).

    During the forward only the printed elements are taken (a copy of at most ``threshold`` of them); the lines are
    formatted for all tensors at once when the first of them is read, or when the step finishes
    (:class:`graphtrace.io.repr_batch.ReprBatch`)."""

    per_name = False
    linewidth: int | None = SPEC_LINEWIDTH

    def __init__(self) -> None:
        self._batch = ReprBatch()

    def store(self, tensor: torch.Tensor, name: str) -> tuple[Sequence[str], None]:
        return self.store_snapshot(printed_values(tensor), name)

    def snapshot(self, tensor: torch.Tensor, name: str) -> PrintedValues | tuple[str, ...]:
        """The printed elements now, formatted after :meth:`store_snapshot` if the value is wanted after all."""
        return printed_values(tensor)

    def store_snapshot(self, snapshot: PrintedValues | tuple[str, ...], name: str) -> tuple[Sequence[str], None]:
        if isinstance(snapshot, PrintedValues):
            return self._batch.add(snapshot), None
        return snapshot, None  # lines torch's printer gave

    def finish(self) -> None:
        """Format the step's lines (nothing is written)."""
        self._batch.format()

    def close(self) -> None:
        """No writer to stop."""


def _host_tensor(tensor: torch.Tensor, name: str) -> HostTensor:
    """``tensor``'s values, dense, on their way to the host (see host_copy: nothing waits for a device here)."""
    try:
        return to_host(tensor.detach().resolve_conj().resolve_neg().contiguous())
    except (RuntimeError, NotImplementedError) as exc:
        raise UnsupportedTensorError(
            f"cannot store tensor {name!r} ({tensor.dtype}, layout {tensor.layout}) as safetensors: {exc}. "
            "Capture with values='repr' (use_repr=True), or convert the tensor to a dense strided one."
        ) from exc


def _memory(data: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy (valid while ``data`` lives)."""
    nbytes = data.numel() * data.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(data.data_ptr())).cast("B")


def _write_at(fd: int, data: memoryview, offset: int) -> None:
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _output_error(target: Path, exc: OSError) -> OutputPathError:
    return OutputPathError(
        f"cannot write {target}: {exc.strerror or exc}. Free some space or choose another directory."
    )


class _FileSink:
    """Streams tensors into files in ``directory`` through a :class:`BackgroundWriter`.

    The writer may still be writing when :meth:`store` returns, so a tensor that shares memory with the model's is
    copied first (the model may change it in place). A device tensor's copy to the host is waited for by the
    writer's thread, before it writes. :meth:`finish` waits for the files of a step; :meth:`close` also stops the
    writer's thread."""

    linewidth: int | None = None  # transformers leaves the line width alone in this mode

    def __init__(self, directory: str | os.PathLike[str], writer: BackgroundWriter | None = None) -> None:
        self.directory = Path(directory)
        self.writer = writer if writer is not None else BackgroundWriter()
        self.lost: dict[Path, set[str]] = {}
        """The references :meth:`store` handed out whose file could not be written (and was removed), by the
        directory they are relative to: the records holding them drop them (``graphtrace.model.without_files``)."""

    def _lose(self, directory: Path, reference: str) -> None:
        self.lost.setdefault(directory, set()).add(reference)

    def _owned(self, host: HostTensor, tensor: torch.Tensor, *, later: bool = False) -> HostTensor:
        """``host`` (the host copy of ``tensor``), copied if it shares memory with ``tensor`` and is written after
        the caller returns."""
        data = host.data
        if host.ready is not None:
            return host  # a copy from a device: its own memory
        queued = later or data.numel() * data.element_size() < self.writer.queue_bytes
        if queued and data.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr():
            return HostTensor(data.clone())
        return host

    def store(self, tensor: torch.Tensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        return self.store_snapshot(self._owned(_host_tensor(tensor, name), tensor), name)

    def snapshot(self, tensor: torch.Tensor, name: str) -> HostTensor:
        """A copy of ``tensor`` on the host, written by :meth:`store_snapshot` if the value is wanted after all."""
        return self._owned(_host_tensor(tensor, name), tensor, later=True)

    def store_snapshot(self, host: HostTensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        raise NotImplementedError

    def finish(self) -> None:
        """Wait until every stored tensor is on disk."""
        self.writer.drain()

    def close(self) -> None:
        try:
            self.finish()
        finally:
            self.writer.close()


class SafetensorsSink(_FileSink):
    """Writes each tensor to ``{directory}/{name}.safetensors`` under the key ``data`` (``use_repr=False``), byte
    for byte as ``safetensors.torch.save_file`` (and so transformers) writes it.

    A tensor stored again unchanged under another name (the hidden states that q, k and v projections all read) is
    not written again: the new name is a hard link to the first file, with the same bytes. Every file is unlinked
    before it is written, so that writing one name never changes another."""

    per_name = True

    def __init__(self, directory: str | os.PathLike[str], writer: BackgroundWriter | None = None) -> None:
        super().__init__(directory, writer)
        self._written: dict[int, tuple[weakref.ref[torch.Tensor], int, Path]] = {}

    def store(self, tensor: torch.Tensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        target = self.directory / _file_name(name)
        earlier = self._written.get(id(tensor))
        if earlier is not None and earlier[0]() is tensor and earlier[1] == tensor._version:
            source = earlier[2]

            reference, directory = f"./{target.name}", self.directory

            def link() -> None:
                try:
                    _unlink(target)
                    try:
                        os.link(source, target)
                    except OSError:
                        _copy_whole(source, target)  # a file system without hard links
                except OSError as exc:
                    self._lose(directory, reference)
                    raise _output_error(target, exc) from exc

            self.writer.submit(link, 0, abandon=lambda: self._abandon(target, directory, reference))
            return None, reference
        result = super().store(tensor, name)
        try:
            self._written[id(tensor)] = (weakref.ref(tensor), tensor._version, target)
        except RuntimeError:  # an inference tensor has no version counter: no reuse
            pass
        return result

    def store_snapshot(self, host: HostTensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        target = self.directory / _file_name(name)
        data = host.data
        dtype = str(data.dtype)
        if dtype not in DTYPE_NAMES:
            self.writer.drain()
            try:
                _save_file(host.wait(), target, name)
            except OutputPathError:
                self._lose(self.directory, f"./{target.name}")
                raise
            return None, f"./{target.name}"
        header = single_tensor_header(dtype, tuple(data.shape), data.numel() * data.element_size())
        reference, directory = f"./{target.name}", self.directory

        def write() -> None:
            try:
                fd = create_new(target)
                try:
                    _write_at(fd, memoryview(header), 0)
                    _write_at(fd, _memory(host.wait()), len(header))
                finally:
                    os.close(fd)
            except OSError as exc:
                _remove_partial(target)
                self._lose(directory, reference)
                raise _output_error(target, exc) from exc

        nbytes = len(header) + data.numel() * data.element_size()
        self.writer.submit(write, nbytes, abandon=lambda: self._abandon(target, directory, reference))
        return None, reference

    def _abandon(self, target: Path, directory: Path, reference: str) -> None:
        """A write dropped after an earlier failure: no older file may stay under its name."""
        self._lose(directory, reference)
        _unlink(target)

    def finish(self) -> None:
        self._written = {}
        super().finish()


_MAX_NAME_BYTES = 200  # file systems allow 255 bytes per name; leave room for a temporary suffix


def _file_name(name: str) -> str:
    """The file name of a tensor named ``name`` (transformers' naming). A name too long for a file system is cut
    and given a hash of the whole name, so it stays unique and the same from run to run; the record keeps the
    module path in full."""
    filename = name.replace("/", "_")
    if not filename.endswith(".safetensors"):
        filename += ".safetensors"
    if len(filename.encode("utf-8")) <= _MAX_NAME_BYTES:
        return filename
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
    stem = filename.encode("utf-8")[: _MAX_NAME_BYTES - 40].decode("utf-8", "ignore")
    return f"{stem}-{digest}.safetensors"


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _remove_partial(path: Path) -> None:
    """Remove what a failed write left, so that the name never holds a truncated file (best effort: the write's
    own error is the one to report)."""
    try:
        _unlink(path)
    except OSError:
        pass


def _copy_whole(source: Path, target: Path) -> None:
    try:
        shutil.copyfile(source, target)
    except OSError:
        _remove_partial(target)
        raise


def _save_file(data: torch.Tensor, target: Path, name: str) -> None:
    """safetensors' own writer, for the dtypes graphtrace does not write itself (float8, unsigned ints, ...)."""
    try:
        _unlink(target)  # safetensors opens the name as it is: a link planted there would be written through
        save_file({"data": data}, str(target))
    except OSError as exc:
        _remove_partial(target)
        raise _output_error(target, exc) from exc
    except Exception as exc:  # safetensors raises its own error types for dtypes it cannot store
        raise UnsupportedTensorError(
            f"cannot store tensor {name!r} ({data.dtype}) as safetensors: {exc}. "
            "Capture with values='repr' (use_repr=True) for this model."
        ) from exc


BUNDLE_SUFFIX = "_tensors.safetensors"
"""A bundle's first file is ``{model class}_tensors.safetensors``; further shards add ``-00002`` and so on."""


class BundleSink(_FileSink):
    """Streams every tensor of a step into one safetensors file (``values="bundle"``), with an index beside it.

    The file starts with room for its header, filled in when the step ends; tensors are appended while the forward
    runs. A tensor seen again unchanged is stored once (the recorder reuses its key). When the header room is used
    up, the file is completed and a new shard begins. Each record's ``file`` is ``./{shard}#{key}``."""

    per_name = False
    header_bytes = 1 << 20

    def __init__(self, directory: str | os.PathLike[str], stem: str, writer: BackgroundWriter | None = None) -> None:
        super().__init__(directory, writer)
        self.stem = stem
        self._fd: int | None = None
        self._shards: list[str] = []
        self._entries: list[tuple[str, str, tuple[int, ...], int, int]] = []
        self._offset = 0
        self._header_length = 0
        self._weight_map: dict[str, str] = {}
        self._failed = False  # a write of this step's shards failed or was dropped: they are removed, not indexed

    def _submit(self, job: Callable[[], None], nbytes: int) -> None:
        def guarded() -> None:
            try:
                job()
            except BaseException:
                self._failed = True
                raise

        self.writer.submit(guarded, nbytes, abandon=self._abandon)

    def _abandon(self) -> None:
        self._failed = True

    def _shard_name(self, number: int) -> str:
        return f"{self.stem}{BUNDLE_SUFFIX}" if number == 1 else f"{self.stem}_tensors-{number:05d}.safetensors"

    def _append(self, key: str, dtype: str, shape: tuple[int, ...], nbytes: int) -> tuple[int, int]:
        """Reserve ``nbytes`` for ``key`` in the current shard, opening a shard when needed; returns (fd, offset)."""
        entry = len(json.dumps({key: [dtype, list(shape), [self._offset, self._offset]]})) + 64
        if self._fd is None or self._header_length + entry > self.header_bytes - 8:
            self._complete_shard()
            self._open_shard()
        assert self._fd is not None
        start = self._offset
        self._offset += nbytes
        self._entries.append((key, dtype, shape, start, self._offset))
        self._header_length += entry
        return self._fd, self.header_bytes + start

    def _open_shard(self) -> None:
        name = self._shard_name(len(self._shards) + 1)
        target = self.directory / name
        try:
            self._fd = create_new(target)  # never through a link planted under the name
        except OSError as exc:
            raise _output_error(target, exc) from exc
        self._shards.append(name)
        self._entries, self._offset, self._header_length = [], 0, 256

    def _complete_shard(self) -> None:
        fd, entries = self._fd, self._entries
        if fd is None:
            return
        self._fd = None
        header = bundle_header(entries, self.header_bytes - 8)
        target = self.directory / self._shards[-1]

        def complete() -> None:
            try:
                try:
                    _write_at(fd, memoryview(header), 0)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise _output_error(target, exc) from exc

        self._submit(complete, 0)

    def store_snapshot(self, host: HostTensor, name: str) -> tuple[tuple[str, ...] | None, str | None]:
        data = host.data
        dtype = str(data.dtype)
        if dtype not in DTYPE_NAMES:
            raise UnsupportedTensorError(
                f"cannot store tensor {name!r} ({dtype}) in a bundle: it holds {', '.join(DTYPE_NAMES)} only. "
                "Capture with values='safetensors' (a file per tensor) or values='repr'."
            )
        pad = -self._offset % data.element_size()
        if pad:  # keep every tensor aligned to its element size; safetensors allows no holes, so pad with bytes
            pad_fd, pad_at = self._append(f"__padding__.{self._offset}", "torch.uint8", (pad,), pad)
            self._submit(lambda: _write_at(pad_fd, memoryview(bytes(pad)), pad_at), pad)
        nbytes = data.numel() * data.element_size()
        fd, at = self._append(name, dtype, tuple(data.shape), nbytes)
        target = self.directory / self._shards[-1]
        self._weight_map[name] = self._shards[-1]  # padding stays out of the index: it holds no tensor

        def write() -> None:
            try:
                _write_at(fd, _memory(host.wait()), at)
            except OSError as exc:
                raise _output_error(target, exc) from exc

        self._submit(write, nbytes)
        return None, f"./{self._shards[-1]}#{name}"

    def finish(self) -> None:
        """Complete the step's shards and write the index ``{stem}_tensors.safetensors.index.json``; shards whose
        writing failed are removed instead (a shard without its header is no safetensors file)."""
        self._complete_shard()
        try:
            self.writer.drain()
        finally:
            if self._failed:
                for shard in self._shards:
                    _remove_partial(self.directory / shard)
                for name, shard in self._weight_map.items():
                    self._lose(self.directory, f"./{shard}#{name}")
                self._shards, self._weight_map, self._failed = [], {}, False
        if self._shards:
            index = {"metadata": {"writer": "graphtrace"}, "weight_map": self._weight_map}
            path = self.directory / f"{self.stem}{BUNDLE_SUFFIX}.index.json"
            write_atomic(path, json.dumps(index, indent=1) + "\n")
        self._shards, self._weight_map = [], {}


class TensorFiles:
    """Reads the tensors records name in one trace directory, keeping each bundle shard open: a bundle's header is
    parsed once, not once per tensor (the handles close when the reader is released)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self._shards: dict[str, Any] = {}

    def load(self, file: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The tensor ``file`` names, as :func:`load_tensor` reads it (``shape`` too)."""

        path, key = split_reference(file)
        if key is None:
            return load_tensor(self.directory, file, shape)
        handle = self._shards.get(path)
        if handle is None:
            handle = self._shards[path] = _open_value_file(self.directory, path)
        return _tensor(handle, key, shape, f"{file} in {self.directory}")


def load_tensor(directory: str | os.PathLike[str], file: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """The tensor a record's ``file`` names, relative to ``directory``: ``./name.safetensors`` (the tensor under
    ``data``) or, in a bundle, ``./shard.safetensors#key``. With ``shape`` (the record's), a file whose header
    says another shape is a TraceFormatError before any of its data is read."""

    path, key = split_reference(file)
    with _open_value_file(directory, path) as handle:
        return _tensor(handle, "data" if key is None else key, shape, f"{file} in {directory}")


def _tensor(handle: Any, key: str, shape: tuple[int, ...] | None, where: str) -> torch.Tensor:
    """The tensor ``key`` of an open safetensors file, its shape checked in the header first: a crafted header may
    describe gigabytes (of a sparse file) where the trace records a few numbers."""
    if shape is not None:
        found = tuple(handle.get_slice(key).get_shape())
        if found != shape:
            raise TraceFormatError(
                f"{where} holds a tensor of shape {list(found)} where the trace records {list(shape)}; the file does "
                "not belong to this trace (copy the trace directory whole, or capture it again)."
            )
    tensor: torch.Tensor = handle.get_tensor(key)
    return tensor


def _open_value_file(directory: str | os.PathLike[str], path: str) -> Any:
    """safetensors' reader of the value file ``path`` names in ``directory``: never one outside it, and a regular
    file. The file is opened non-blocking and checked on its descriptor, then read through that descriptor
    (``/proc/self/fd``, where there is one), so that a FIFO put in its place after the check, on which safetensors
    would wait forever, is never opened."""
    from safetensors import safe_open

    target = inside(directory, path)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return safe_open(str(target), framework="pt")  # its error names the missing file; the caller adds the remedy
    except OSError as exc:
        raise TraceFormatError(f"cannot read trace file {target}: {exc.strerror or exc}.") from exc
    try:
        check_regular_file(target, fd)
        opened = f"/proc/self/fd/{fd}"
        return safe_open(opened if os.path.exists(opened) else str(target), framework="pt")
    finally:
        os.close(fd)
