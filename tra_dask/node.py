"""The identity machinery shared by logical (TRA) and physical (IA) nodes.

Nodes are frozen dataclasses: children and parameters are typed fields, equality is
structural (same class, equal parameter tokens, equal children), the hash is computed
once, and the node's type is derived once, when it is made.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from .types import RelationType


class Node(ABC):
    @property
    def children(self) -> tuple["Node", ...]:
        return ()

    @abstractmethod
    def _params(self) -> tuple:
        """Hashable tokens of the node's non-child parameters."""

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((type(self).__name__, self._params(), tuple(hash(c) for c in self.children)))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other) -> bool:
        # iterative, each pair of nodes compared once: deep chains do not recurse and
        # shared subexpressions do not make it exponential
        stack, seen = [(self, other)], set()
        while stack:
            a, b = stack.pop()
            if a is b or (id(a), id(b)) in seen:
                continue
            if type(a) is not type(b) or hash(a) != hash(b) or a._params() != b._params():
                return False
            if not a._same_extra(b):
                return False
            seen.add((id(a), id(b)))
            stack.extend(zip(a.children, b.children))
        return True

    def _same_extra(self, other) -> bool:
        """Equality of parameters that cannot be tokens (subclasses may override)."""
        return True

    def __post_init__(self):
        object.__setattr__(self, "_type", self._infer_type())
        hash(self)  # computed once, bottom-up, while the children's hashes are cached

    @abstractmethod
    def _infer_type(self) -> RelationType:
        """Derive (and so validate) this node's type from its children's."""

    @property
    def type(self) -> RelationType:
        """Exact key set, chunk shapes and dtype (derived when the node was made)."""
        return self.__dict__["_type"]


def toposort(outputs) -> list:
    """Every node reachable from ``outputs``, children before parents, each once
    (structurally equal nodes are one node)."""
    order: list = []
    seen: set = set()
    stack: list = [(o, False) for o in reversed(list(outputs))]
    while stack:
        node, done = stack.pop()
        if done:
            if node not in seen:
                seen.add(node)
                order.append(node)
            continue
        if node in seen:
            continue
        stack.append((node, True))
        for c in reversed(node.children):
            if c not in seen:
                stack.append((c, False))
    return order
