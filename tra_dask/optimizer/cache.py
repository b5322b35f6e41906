"""Plans reused across submissions of the same *structure* (a training loop's next step).

A plan depends on an expression's operators, kernels and key functions, on its
sources' *types* (keys, chunk shapes, dtype), classes and placements, and on the
sites and the search's options — never on the numbers inside the chunks.
:func:`signature` is that dependency as a hashable value, each source replaced by a
numbered slot (a source used twice is one slot, two equal-typed sources are two), so
the next step's expression over new arrays has the signature of this step's.
:func:`rebind` puts the new sources into the cached physical plan: the same
operators, placements and predicted cost, over the new data.

:class:`PlanCache` is a small LRU of such plans; the runtime keeps one per client.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..logical import Source, flatten_outputs
from ..node import toposort
from ..types import RelationType
from .optimize import Alternatives
from .plan import Plan, Stage

__all__ = ["signature", "rebind", "PlanCache"]


def type_token(t: RelationType) -> tuple:
    """A hashable value equal for equal types (keys, chunk shapes, dtype), memoised
    on the type object."""
    tok = t._memo.get("token")
    if tok is None:
        tok = (str(t.dtype), t.keys.shape, hash(t.keys.tobytes()), hash(t.shape_ids.tobytes()), tuple(t.shapes))
        t._memo["token"] = tok
    return tok


def signature(expr, placement_of=None) -> tuple[tuple, list]:
    """``(signature, sources)``: the expression's structure with its sources as slots,
    and the distinct sources in slot order.  ``placement_of(source)`` gives the token
    of a source's fixed placement (None when free); it is part of the slot.

    >>> import numpy as np, tra_dask as td
    >>> a = td.from_numpy(np.ones((4, 4)), (2, 2), name="a")
    >>> b = td.from_numpy(np.zeros((4, 4)), (2, 2), name="b")
    >>> signature(td.transform(a, "neg"))[0] == signature(td.transform(b, "neg"))[0]
    True
    >>> signature(td.transform(a, "neg"))[0] == signature(td.transform(a, "exp"))[0]
    False
    """
    outputs, _ = flatten_outputs(expr)
    ids: dict = {}
    parts: list = []
    sources: list = []
    for node in toposort(outputs):
        if isinstance(node, Source):
            place = placement_of(node) if placement_of is not None else None
            parts.append(("slot", len(sources), type(node).__name__, type_token(node.type), place))
            sources.append(node)
        else:
            parts.append((type(node).__name__, node._params(), tuple(ids[c] for c in node.children)))
        ids[node] = len(parts) - 1
    shape = type(expr).__name__ if not isinstance(expr, dict) else ("dict", tuple(expr))
    return (shape, tuple(ids[o] for o in outputs), tuple(parts)), sources


@dataclass(frozen=True, eq=False, repr=False)
class Slot(Source):
    """A stand-in for a source in a cached plan: its type and slot number, no data (a
    cache must not keep a user's arrays or cluster data alive)."""

    rtype: RelationType
    slot: int
    name: str

    def _params(self):
        return (self.slot, type_token(self.rtype))

    def _infer_type(self) -> RelationType:
        return self.rtype

    def load(self, key):
        raise RuntimeError(f"{self.name} is a cached plan's stand-in for a source; rebind the plan first")


def rebind(plan: Plan, old_sources: list, new_expr, new_sources: list, *, keep_search: bool = True) -> Plan:
    """``plan`` (made for an expression over ``old_sources``) over ``new_sources``
    instead: every physical node above a replaced source is made again, with the
    type and layout it had (the caller matched the sources by :func:`signature`, so
    they have the old ones' types and placements), the cost is kept
    with the new nodes (it depends on types and placements only), and so are the
    alternatives and the compiled plan, rebound when first read.  ``new_expr`` None:
    the plan's ``expr`` and ``search`` are dropped (a data-free copy for a cache)."""
    swap = {old: new for old, new in zip(old_sources, new_sources)}
    rebuild = flatten_outputs(new_expr)[1] if new_expr is not None else None  # (its closure holds the expr)

    memo: dict = {}  # one for the plan, its alternatives and its compiled plan: shared nodes remade once

    def remake(p: Plan):
        return remake_pair(p.outputs, p._cost)

    def remake_pair(outputs, cost):
        for node in toposort(outputs):
            if node in memo:
                continue
            if node._op == "source" and node.source in swap:
                memo[node] = _remade(node, {"source": swap[node.source]})
            elif any(memo[c] is not c for c in node.children):
                memo[node] = _remade(node, dict(zip(node._children, (memo[c] for c in node.children))))
            else:
                memo[node] = node
        if cost is not None:  # the same numbers, by the new nodes
            cost = dataclasses.replace(
                cost, nodes={memo.get(n, n): _renamed(c, memo) for n, c in cost.nodes.items()},
                node_seconds=None if cost.node_seconds is None else {memo.get(n, n): t for n, t in
                                                                     cost.node_seconds.items()})
        return tuple(memo[o] for o in outputs), cost

    def again(p: Plan, **kw) -> Plan:
        outputs, cost = remake(p)
        return Plan(outputs, rebuild, p.sites, p.cost_model, new_expr, cost=cost, fusion=p.fusion, **kw)

    if new_expr is None:  # everything now, nothing that holds the old sources
        c = plan._compiled
        pending = plan._alternatives
        return again(plan, alternatives=(pending.rebound(remake_pair) if isinstance(pending, Alternatives)
                                         else tuple(again(a) for a in plan.alternatives)),
                     compiled=again(c) if isinstance(c, Plan) else None,
                     search=_summary(plan.search),
                     stages=tuple(dataclasses.replace(st, plan=None) for st in plan.stages))  # theirs hold sources

    alternatives = _Pending(lambda: tuple(again(a) for a in plan.alternatives), plan._alternatives_count)

    def compiled():
        c = plan.compiled
        return None if c is None else again(c)

    t0 = time.perf_counter()
    out = again(plan, alternatives=alternatives, compiled=compiled, search=plan.search,
                stages=tuple(st for st in plan.stages if st.name != "cache"))
    stage = Stage("cache", None, time.perf_counter() - t0,
                  "reused the plan of an earlier submission of the same structure, over this expression's sources")
    return out.with_stage(stage)


class _Pending:
    """Alternatives made when first read, that can be counted without making them."""

    def __init__(self, make, count):
        self.make, self.count = make, count

    def __call__(self):
        return self.make()

    def __len__(self) -> int:
        return self.count()


_DERIVED = ("_type", "_layout", "_join_type")  # what a physical node derives from its inputs' types and placements


def _remade(node, changes: dict):
    """``node`` with the fields in ``changes`` (sources, or children remade over other
    sources) and the same derived type and layout: the new sources have the old
    ones' types (and fixed placements), which is all a type or layout rule reads, so
    deriving them again would give the same.  Memos that name nodes are not copied."""
    new = object.__new__(type(node))
    d = new.__dict__
    for f in dataclasses.fields(node):
        d[f.name] = changes.get(f.name, getattr(node, f.name))
    for name in _DERIVED:
        if name in node.__dict__:
            d[name] = node.__dict__[name]
    hash(new)
    return new


def _renamed(node_cost, memo):
    n = getattr(node_cost, "node", None)
    return node_cost if n is None or memo.get(n, n) is n else dataclasses.replace(node_cost, node=memo[n])


def _summary(search):
    """A search report without the plans it holds (they hold the sources)."""
    if search is None:
        return None
    return dataclasses.replace(search, best=[], best_cost=None, alternatives=[], first_pass_cost=None)


class PlanCache:
    """An LRU of plans by key (``maxsize`` entries; ``hits``/``misses`` counted).
    Each is kept over :class:`Slot` stand-ins, so it keeps no data alive.
    Thread-safe: submissions from several threads share one cache, and a key missed
    by several at once is planned by one of them (:meth:`planning`) while the others
    wait for its plan."""

    def __init__(self, maxsize: int = 64):
        self.maxsize = maxsize
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._planning: dict = {}  # key -> Event set when the thread planning it is done
        self.hits = self.misses = 0

    @contextlib.contextmanager
    def planning(self, key):
        """Held while this thread plans ``key`` after a miss: yields True when it is the
        one to plan it, False when another thread was (the caller then looks again
        once it is done, and plans it itself if it still misses)."""
        with self._lock:
            busy = self._planning.get(key)
            if busy is None:
                mine = self._planning[key] = threading.Event()
        if busy is not None:
            busy.wait()
            yield False
            return
        try:
            yield True
        finally:
            with self._lock:
                del self._planning[key]
            mine.set()

    def get(self, key, new_expr, new_sources, accept=None) -> Plan | None:
        """The cached plan for ``key`` over ``new_sources`` (None on a miss, or when
        ``accept(plan, extra)`` says no)."""
        with self._lock:
            entry = self._items.get(key)
            if entry is not None:
                self._items.move_to_end(key)
        if entry is None or (accept is not None and not accept(entry[0], entry[2])):
            with self._lock:
                self.misses += 1
            return None
        plan, slots, _ = entry
        out = rebind(plan, slots, new_expr, new_sources)
        with self._lock:
            self.hits += 1
        return out

    def put(self, key, plan: Plan, sources: list, extra=None) -> None:
        """Keep ``plan`` (over ``sources``, in slot order) for ``key``; ``extra`` is
        handed to ``get``'s ``accept``."""
        slots = [Slot(s.type, i, s.name) for i, s in enumerate(sources)]
        stored = rebind(plan, sources, None, slots)
        with self._lock:
            self._items[key] = (stored, slots, extra)
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._items)
