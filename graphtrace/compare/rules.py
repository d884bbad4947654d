"""Rename rules: how a module path of trace A is spelled in trace B (an original implementation and its port).

A rule is ``LEFT=RIGHT``, two dotted module names relative to the model (``transformer.h.{i}=model.layers.{i}``).
``{name}`` placeholders match one path component or part of one (never a dot) and carry what they matched to the
right side. The left side matches whole components anywhere in a path, so ``ln_1=norm1`` renames every ``ln_1``;
rules apply in the order given, each to the result of the one before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from graphtrace.errors import InvalidOptionError

__all__ = ["RenameRule", "apply_rules", "check_rules", "parse_rules"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_COMPONENT_CHARS = re.compile(r"^[^=\s{}]+$")


@dataclass(frozen=True, slots=True)
class RenameRule:
    """One ``LEFT=RIGHT`` rule, compiled."""

    text: str
    pattern: re.Pattern[str]
    right: str

    def apply(self, path: str) -> str:
        """``path`` with every occurrence of the left side replaced by the right side."""
        return self.pattern.sub(lambda match: self.right.format_map(match.groupdict()), path)


def _check_side(rule: str, side: str, what: str) -> None:
    literal = _PLACEHOLDER.sub("x", side)
    if not side or not _COMPONENT_CHARS.match(literal) or "" in literal.split("."):
        raise InvalidOptionError(
            f"rename rule {rule!r}: the {what} side {side!r} is not a dotted module name. "
            "Write rules as LEFT=RIGHT, e.g. 'transformer.h.{i}=model.layers.{i}' (names relative to the model)."
        )


def parse_rule(text: str) -> RenameRule:
    """Compile ``LEFT=RIGHT``; raises :class:`InvalidOptionError` naming the rule and what is wrong with it."""
    left, sep, right = text.partition("=")
    left, right = left.strip(), right.strip()
    if not sep:
        raise InvalidOptionError(
            f"rename rule {text!r} has no '='. Write rules as LEFT=RIGHT, "
            "e.g. 'transformer.h.{i}=model.layers.{i}'."
        )
    _check_side(text, left, "left")
    _check_side(text, right, "right")
    names = _PLACEHOLDER.findall(left)
    if len(names) != len(set(names)):
        raise InvalidOptionError(f"rename rule {text!r} uses a placeholder twice on its left side; name each once.")
    unknown = sorted(set(_PLACEHOLDER.findall(right)) - set(names))
    if unknown:
        raise InvalidOptionError(
            f"rename rule {text!r}: the right side uses {{{unknown[0]}}}, which its left side does not define."
        )
    regex, position = [], 0
    for match in _PLACEHOLDER.finditer(left):
        regex.append(re.escape(left[position : match.start()]))
        regex.append(f"(?P<{match.group(1)}>[^.]+?)")
        position = match.end()
    regex.append(re.escape(left[position:]))
    # whole components only: at the start or after a dot, and followed by a dot or the end
    pattern = re.compile(rf"(?:^|(?<=\.)){''.join(regex)}(?=\.|$)")
    return RenameRule(text=text, pattern=pattern, right=right)


def parse_rules(texts: Iterable[str]) -> tuple[RenameRule, ...]:
    return tuple(parse_rule(text) for text in texts)


def check_rules(rules: Sequence[RenameRule], paths: Iterable[str]) -> None:
    """Refuse rules that give two module paths of trace A (relative to the model) one name: ``h.{i}=layers`` renames
    every ``h.N`` to ``layers``, and which of them B's ``layers`` stands for is anyone's guess. A placeholder the right
    side leaves out is fine where it matches one path at each place (T5's ``layer.{j}.DenseReluDense=mlp``)."""
    if not rules:
        return
    named: dict[str, str] = {}
    for path in dict.fromkeys(paths):
        renamed = apply_rules(rules, path)
        first = named.setdefault(renamed, path)
        if first != path:
            rule = _merging(rules, first, path)
            raise InvalidOptionError(
                f"rename rule {rule.text!r} gives {first} and {path} of trace A one name, {renamed}. {_remedy(rule)}"
            )


def _merging(rules: Sequence[RenameRule], a: str, b: str) -> RenameRule:
    """The rule after which ``a`` and ``b`` have the same name."""
    for count, rule in enumerate(rules, start=1):
        if apply_rules(rules[:count], a) == apply_rules(rules[:count], b):
            return rule
    return rules[-1]


def _remedy(rule: RenameRule) -> str:
    left, _, right = (side.strip() for side in rule.text.partition("="))
    dropped = [name for name in _PLACEHOLDER.findall(left) if f"{{{name}}}" not in right]
    if dropped:
        carried = f"{left}={right}.{{{dropped[0]}}}"
        return f"Its {{{dropped[0]}}} is not used on the right side: carry it over, e.g. '{carried}'."
    return "Give each of them its own name in B's terms."


def apply_rules(rules: Iterable[RenameRule], path: str, used: set[RenameRule] | None = None) -> str:
    """``path`` renamed by every rule in turn; the rules that changed it are added to ``used``."""
    for rule in rules:
        renamed = rule.apply(path)
        if renamed != path and used is not None:
            used.add(rule)
        path = renamed
    return path
