"""Capture engines: they report the module calls of a forward pass to one :class:`Recorder`.

``attach`` installs the engine a strategy asks for and returns, per module path, why torch.fx could not serve it.
"""

from __future__ import annotations

from torch import nn

from graphtrace.engine.eager import PatchLedger, attach_eager
from graphtrace.engine.recorder import Recorder, ValueSink

__all__ = ["PatchLedger", "Recorder", "ValueSink", "attach"]


def attach(
    model: nn.Module,
    recorder: Recorder,
    ledger: PatchLedger,
    *,
    strategy: str,
    ops: bool,
    root_no_grad: bool,
) -> dict[str, str]:
    """Make ``model``'s calls reach ``recorder``; every patch goes through ``ledger``. Returns the fallbacks (module
    path -> why torch.fx did not serve it), filled as the model runs."""
    if strategy == "eager":
        attach_eager(model, recorder, ledger, root_no_grad=root_no_grad)
        return {}
    from graphtrace.engine.fx import attach_fx  # torch.fx loads only when asked for

    return attach_fx(model, recorder, ledger, ops=ops, root_no_grad=root_no_grad)
