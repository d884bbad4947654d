"""A drop-in for transformers' ``model_addition_debugger_context``, built on graphtrace's capture and writers.

Same signature, same files: after every top-level forward call inside the block,
``{debug_path}/{Class}_debug_tree_FULL_TENSORS.json`` and ``..._SUMMARY.json`` are (re)written exactly as
transformers writes them, and with ``use_repr=False`` one ``.safetensors`` file per tensor. As in transformers,
each submodule call runs under ``torch.no_grad()`` while the root's own body keeps the caller's grad mode, and only
rank 0 records.

Where transformers is at fault, this one is not: a module called twice keeps each call's tensors (later calls'
files are named ``{module_path}@{n}_...``); a keyword argument named ``value`` stays in SUMMARY; a forward that
raises still writes the calls recorded so far, with the failing call marked; and on exit every module's
``forward``, the model's attributes and torch's print options are exactly as they were.

Where transformers' files cannot say more, this one does not either: a module's output is recorded as its
``forward`` returned it, before its forward hooks run (``capture()`` records what the caller received, and marks
the modules with hooks in graphtrace's own file, which the shim does not write).

What transformers writes, this writes too, even where ``capture()`` is cheaper: with ``do_prune_layers`` and
``use_repr=False``, the layer blocks pruned from the JSON still get their ``.safetensors`` files (scripts load
them). The options take what transformers' take: ``do_prune_layers`` and ``use_repr`` are read for their truth
(``None`` means no pruning), and a falsy ``debug_path`` writes into the current directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import nn

from graphtrace.api import check_model, recording
from graphtrace.engine import Recorder
from graphtrace.engine.distributed import current_rank
from graphtrace.errors import InvalidOptionError, OutputPathError
from graphtrace.io.spec_json import write_spec_files
from graphtrace.io.tensors import ReprSink, SafetensorsSink
from graphtrace.io.trace_files import prepare_directory
from graphtrace.model import CallNode, prune_layer_blocks

__all__ = ["model_addition_debugger_context"]


@contextmanager
def model_addition_debugger_context(
    model: nn.Module,
    debug_path: str | None = None,
    do_prune_layers: bool | None = True,
    use_repr: bool | None = True,
) -> Iterator[nn.Module]:
    """Trace every forward call of ``model`` inside the block into transformers' debug files; yields the model.

    Args:
        model: the model to trace.
        debug_path: directory for the files (created if missing; the current directory when None or empty).
        do_prune_layers: keep only the first and last of repeated layer blocks in the JSON (read for its truth, as
            transformers reads it: None means no pruning).
        use_repr: write tensors as repr lines into FULL_TENSORS (truthy) or as safetensors files (falsy).
    """
    check_model(model)
    prune, use_repr = bool(do_prune_layers), bool(use_repr)
    directory = _debug_directory(debug_path)
    if current_rank() != 0:  # only rank 0 records; other ranks run the model untouched
        yield model
        return

    model_class = type(model).__name__
    sink = ReprSink() if use_repr else SafetensorsSink(directory)

    def write_step(step: CallNode) -> None:
        sink.finish()  # the step's files are on disk when its forward returns, as transformers'
        write_spec_files(prune_layer_blocks(step) if prune else step, directory, model_class)

    # Each call's files replace the last's. Repr lines of blocks that pruning drops are never formatted; safetensors
    # files are written for every block, as transformers writes them.
    recorder = Recorder(sink, on_step=write_step, keep_steps=False, prune_layers=prune and use_repr)
    try:
        # transformers' context leaves grad mode alone, and records outputs before forward hooks run
        with recording(model, recorder, root_no_grad=False, after_hooks=False):
            yield model
    finally:
        sink.close()


def _debug_directory(debug_path: Any) -> Path:
    if not debug_path:  # transformers: `if debug_path:` guards makedirs, and the files go to the current directory
        return Path.cwd()
    if not isinstance(debug_path, (str, os.PathLike)):
        raise InvalidOptionError(f"debug_path must be a directory path or None, got {type(debug_path).__name__}.")
    try:
        return prepare_directory(debug_path, what="debug_path")
    except OutputPathError as exc:
        # transformers raises ValueError("Unexpected or existing debug_path=..."); ours is a ValueError too.
        raise OutputPathError(f"Unexpected or existing debug_path={debug_path}: {exc}") from exc.__cause__
