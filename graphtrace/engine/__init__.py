"""Capture engines: they report the module calls of a forward pass to one :class:`Recorder`.

``attach`` installs the engine a strategy asks for and returns, per module path, why torch.fx could not serve it.
"""

from __future__ import annotations

from torch import nn

from graphtrace.engine.eager import PatchLedger, attach_eager
from graphtrace.engine.frame import ValueSink
from graphtrace.engine.recorder import Recorder

__all__ = ["PatchLedger", "Recorder", "ValueSink", "attach"]


def attach(
    model: nn.Module,
    recorder: Recorder,
    ledger: PatchLedger,
    *,
    strategy: str,
    ops: bool,
    root_no_grad: bool,
    after_hooks: bool = True,
) -> dict[str, str]:
    """Make ``model``'s calls reach ``recorder``; every patch goes through ``ledger``. Returns the fallbacks (module
    path -> why torch.fx did not serve it), filled as the model runs. With ``ops``, the op tier (engine/ops.py)
    records the ops of every module call during the real forward, whichever engine serves the module. With
    ``after_hooks``, a module's call is recorded as its caller sees it, around its forward hooks (engine/eager.py);
    without, around its forward alone, as transformers records it."""
    if strategy == "eager":
        attach_eager(model, recorder, ledger, root_no_grad=root_no_grad, after_hooks=after_hooks)
        fallbacks: dict[str, str] = {}
        tracing = None
    else:
        from graphtrace.engine.fx import attach_fx  # torch.fx loads only when asked for

        engine = attach_fx(model, recorder, ledger, root_no_grad=root_no_grad, after_hooks=after_hooks)
        fallbacks, tracing = engine.fallbacks, engine.tracing
    if ops:
        from graphtrace.engine.ops import OpTier

        ledger.enter(OpTier(recorder, paused=tracing))
    return fallbacks
