"""The identity machinery shared by logical (TRA) and physical (IA) nodes.

Nodes are frozen dataclasses: children and parameters are typed fields, equality is
structural (same class, equal parameter tokens, equal children), the hash is computed
once, and the node's type is derived once, when it is made.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

from .types import RelationType


def token(value):
    """A hashable, structural stand-in for a parameter (kernels, key functions and
    predicates carry a ``token``; ints and tuples are their own)."""
    return value.token if hasattr(value, "token") else value


_PARAM_NAMES: dict = {}  # class -> names of its non-child dataclass fields


class Node(ABC):
    _children: tuple = ()  # names of the dataclass fields that hold child nodes

    @property
    def children(self) -> tuple["Node", ...]:
        """The child nodes (computed once: a node is immutable, and the planner reads
        them hundreds of thousands of times)."""
        kids = self.__dict__.get("_kids")
        if kids is None:
            kids = tuple(getattr(self, f) for f in self._children)
            object.__setattr__(self, "_kids", kids)
        return kids

    def _param_names(self) -> list[str]:
        names = _PARAM_NAMES.get(type(self))
        if names is None:
            names = _PARAM_NAMES[type(self)] = [f.name for f in dataclasses.fields(self) if f.name not in self._children]
        return names

    def _params(self) -> tuple:
        """Hashable tokens of the node's non-child parameters (computed once, when the
        hash is: the type rule may normalise a parameter first, never after)."""
        p = self.__dict__.get("_params_memo")
        if p is None:
            p = self._params_uncached()
            if "_hash" in self.__dict__:  # made: the parameters are final
                object.__setattr__(self, "_params_memo", p)
        return p

    def _params_uncached(self) -> tuple:
        return tuple(token(getattr(self, n)) for n in self._param_names())

    def _fmt_params(self) -> str:
        return ", ".join(f"{n}={getattr(self, n)!r}" for n in self._param_names())

    _op: str = "node"

    @property
    def label(self) -> str:
        """Short name used in error messages and plans (computed once)."""
        s = self.__dict__.get("_label")
        if s is None:
            s = f"{self._op}({', '.join(c.label for c in self.children)})"
            s = s if len(s) <= 60 else s[:57] + "..."
            object.__setattr__(self, "_label", s)
        return s

    def __repr__(self) -> str:
        """Reads like the call that builds the node."""
        extra = self._fmt_params()
        parts = [repr(c) for c in self.children] + ([extra] if extra else [])
        return f"{self._op}({', '.join(parts)})"

    def __hash__(self) -> int:
        try:  # the planner hashes nodes millions of times (dict keys): the cached path is a lookup
            return self.__dict__["_hash"]
        except KeyError:
            p = self._params()
            h = hash((type(self).__name__, p, tuple(hash(c) for c in self.children)))
            object.__setattr__(self, "_hash", h)
            object.__setattr__(self, "_params_memo", p)  # (hashed: the parameters are final)
            return h

    def __eq__(self, other) -> bool:
        # iterative, each pair of nodes compared once: deep chains do not recurse and
        # shared subexpressions do not make it exponential
        stack, seen = [(self, other)], set()
        while stack:
            a, b = stack.pop()
            if a is b or (id(a), id(b)) in seen:
                continue
            ca = a.__dict__.get("_canon", a)
            if ca is b.__dict__.get("_canon", b):  # one was made as the other's equal (physical.nodes.interned)
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


def canonical(outputs) -> list:
    """``outputs`` with every set of structurally equal nodes made one object
    (hash-consing), children before parents.  Two equal nodes built apart are
    equal but not identical: a physical node's layout names the array objects its
    tuples hold, so without this a shared source reached along two paths would be
    two sets of arrays, and a transfer of the same chunk along both would be counted
    twice while a cluster makes it once.  A node is rebuilt only when a child had
    to be replaced."""
    import dataclasses

    memo: dict = {}
    for node in toposort(outputs):
        if node in memo:
            continue
        kids = [memo[c] for c in node.children]
        same = all(a is b for a, b in zip(kids, node.children))
        memo[node] = node if same else dataclasses.replace(node, **dict(zip(node._children, kids)))
    return [memo[o] for o in outputs]
