"""torch.fx capture: each module traced on its own (the modules it calls as leaves), specialised on the call's
actual non-tensor arguments, cached per module and signature, and verified against the real call by a replay that
never repeats a side effect. See ``dispatch`` for the whole, ``tracer``, ``replay`` and ``guard`` for the parts,
and docs/fx.md for the design and its measured coverage."""

from graphtrace.engine.fx.dispatch import FxEngine, attach_fx

__all__ = ["FxEngine", "attach_fx"]
