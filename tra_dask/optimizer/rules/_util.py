"""Small helpers shared by the rules."""

from __future__ import annotations

from typing import Callable, Iterator

from ...keys import Dim, KeyMap
from ...physical import KeyArrayMap, PNode


def attempt(build: Callable[[], PNode]) -> Iterator[PNode]:
    """Yield ``build()`` unless the rewritten plan is invalid here (its node
    constructors check co-location, partial inputs and types, and raise)."""
    try:
        yield build()
    except (ValueError, TypeError):
        return


def is_identity_map(node) -> bool:
    """A LocalMap whose key function is the identity on its input's keys (R1-3,
    R1-4, R2-3)."""
    op = node.op
    return isinstance(op, KeyArrayMap) and op.key_fn.is_identity(node.input.type.arity)


def is_symbolic_keymap(fn) -> bool:
    return isinstance(fn, KeyMap)


def dims_map(mapping: dict):
    """Substitution list for ``substitute``: key dim i -> Dim(mapping[i])."""
    size = max(mapping) + 1 if mapping else 0
    return [Dim(mapping[i]) if i in mapping else Dim(i) for i in range(size)]
