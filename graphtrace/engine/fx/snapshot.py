"""The state of a module tree, taken before its forward is traced and put back after.

Tracing runs the module's Python code. Whatever that code sets on the modules (an attribute, a cached value) or adds
to their containers (a hook registered on first use, a buffer) is undone, and reported, so that the trace can be
refused: a graph cannot replay a change of Python state.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.fx.immutable_collections import immutable_dict, immutable_list

__all__ = ["Snapshot", "restore", "snapshot"]

Snapshot = list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]


def snapshot(module: nn.Module) -> Snapshot:
    """The attributes of every module in the tree, and the contents of those that are containers (parameters,
    buffers, submodules, hooks: registering a hook changes a dict in place)."""
    states = []
    for sub in module.modules():
        state = sub.__dict__
        contents = {name: _copy_container(value) for name, value in state.items() if _is_container(value)}
        states.append((state, dict(state), contents))
    return states


def _is_container(value: Any) -> bool:
    return isinstance(value, (dict, list, set)) and not isinstance(value, (immutable_dict, immutable_list))


def _copy_container(value: Any) -> Any:
    return list(value.items()) if isinstance(value, dict) else list(value) if isinstance(value, list) else set(value)


def _same_contents(value: Any, saved: Any) -> bool:
    if isinstance(value, set):
        return bool(value == saved)
    current = list(value.items()) if isinstance(value, dict) else list(value)
    return len(current) == len(saved) and all(
        (a[0] == b[0] and a[1] is b[1]) if isinstance(value, dict) else a is b for a, b in zip(current, saved)
    )


def restore(states: Snapshot) -> str | None:
    """Put back every attribute the trace changed on the module tree, container contents included; the name of the
    first one changed, if any."""
    changed = None
    for state, saved, contents in states:
        for name in set(state) | set(saved):
            if name not in saved or name not in state or state[name] is not saved[name]:
                changed = changed or name
                if name in saved:
                    state[name] = saved[name]
                else:
                    del state[name]
        for name, items in contents.items():
            container = state[name]
            if not _same_contents(container, items):
                changed = changed or name
                container.clear()
                if isinstance(container, dict):
                    container.update(items)
                elif isinstance(container, list):
                    container.extend(items)
                else:
                    container.update(items)
    return changed
