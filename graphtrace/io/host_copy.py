"""Copies of tensors to the host that the forward does not wait for.

A blocking copy of a device tensor to the host (``.cpu()``, ``.to("cpu")``) waits until every kernel queued before
it has run. Here the copy goes into pinned host memory with ``non_blocking=True`` and an event is recorded behind it
on the device's current stream; whoever reads the host tensor (the repr batch when it formats a step's lines, the
file writer's thread before it writes) waits for that event, off the forward's path. A CPU tensor is its own copy:
nothing is copied and nothing waited for.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = ["HostTensor", "to_host"]


class HostTensor(NamedTuple):
    """A tensor on the host whose values may still be arriving: read them after :meth:`wait`."""

    data: torch.Tensor
    ready: Any = None
    """The event recorded after the copy (None: the values are there)."""

    def wait(self) -> torch.Tensor:
        """The host tensor, once its values have arrived."""
        if self.ready is not None:
            self.ready.synchronize()
        return self.data


def to_host(tensor: torch.Tensor) -> HostTensor:
    """``tensor``'s values on the host: the tensor itself on the CPU, otherwise an asynchronous copy into pinned
    memory (a device without events or pinned memory gets a plain copy, which waits)."""
    if tensor.is_cpu:
        return HostTensor(tensor)
    try:
        event = torch.Event(device=tensor.device)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    except (RuntimeError, ValueError, TypeError):
        return HostTensor(tensor.to("cpu"))
    host.copy_(tensor, non_blocking=True)
    event.record()
    return HostTensor(host, event)
