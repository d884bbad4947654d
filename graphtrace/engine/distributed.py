"""Rank helpers: by default only rank 0 of a torch.distributed job records and writes."""

from __future__ import annotations

import torch

__all__ = ["current_rank", "world_size"]


def _initialized() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def current_rank() -> int:
    """This process's rank, 0 when not running distributed."""
    return torch.distributed.get_rank() if _initialized() else 0


def world_size() -> int:
    """The number of processes in the job, 1 when not running distributed."""
    return torch.distributed.get_world_size() if _initialized() else 1
