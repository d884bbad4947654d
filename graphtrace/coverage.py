"""How much of a trace torch.fx served, and why the rest was captured by forward wrapping (torch-free)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from graphtrace.model import Trace

__all__ = ["Coverage", "coverage_of", "describe_fallbacks"]

EAGER_STRATEGY = "strategy='eager'"
RAISED = "the call raised"


@dataclass(frozen=True, slots=True)
class Coverage:
    """Module calls of a trace by capture strategy. ``eager`` counts the calls fx did not serve by reason: the
    module's fallback reason, ``"strategy='eager'"`` for a trace captured without fx, ``"the call raised"``."""

    module_calls: int
    fx: int
    eager: Mapping[str, int] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        """The share of module calls fx served (0 for a trace without calls)."""
        return self.fx / self.module_calls if self.module_calls else 0.0

    def summary(self) -> str:
        """One line: ``fx served 41 of 45 module calls (91%); eager: 3 × Refused: ..., 1 × ...``."""
        text = f"fx served {self.fx} of {self.module_calls} module calls ({self.fraction:.0%})"
        if self.eager:
            reasons = sorted(self.eager.items(), key=lambda item: (-item[1], item[0]))
            text += "; eager: " + ", ".join(f"{count} × {reason}" for reason, count in reasons)
        return text

    def __str__(self) -> str:
        return self.summary()


def coverage_of(trace: Trace) -> Coverage:
    """The :class:`Coverage` of every step of ``trace``."""
    fx = 0
    eager: Counter[str] = Counter()
    calls = 0
    for node in trace.walk():
        if node.kind != "module":
            continue
        calls += 1
        if node.strategy == "fx":
            fx += 1
        elif trace.meta.strategy == "eager":
            eager[EAGER_STRATEGY] += 1
        elif node.path in trace.fallbacks:
            eager[trace.fallbacks[node.path]] += 1
        else:
            eager[RAISED if node.error is not None else "not verified"] += 1
    return Coverage(module_calls=calls, fx=fx, eager=dict(eager))


def describe_fallbacks(fallbacks: Mapping[str, str], limit: int = 3) -> list[str]:
    """One line per reason, most modules first: ``reason (N modules: a, b, c, ...)``."""
    by_reason: dict[str, list[str]] = {}
    for path, reason in fallbacks.items():
        by_reason.setdefault(reason, []).append(path)
    lines = []
    for reason, paths in sorted(by_reason.items(), key=lambda item: (-len(item[1]), item[0])):
        shown = ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")
        count = f"{len(paths)} module{'s' if len(paths) != 1 else ''}"
        lines.append(f"{reason} ({count}: {shown})")
    return lines
