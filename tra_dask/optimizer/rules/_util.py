"""Small helpers shared by the rules."""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from ...keys import Dim, KeyMap
from ...physical import Broadcast, KeyArrayMap, PlacementError, PNode, Shuffle


def attempt(build: Callable[[], PNode]) -> Iterator[PNode]:
    """Yield ``build()`` unless the rewritten plan cannot run where its tuples are
    (the node constructors check co-location and partial inputs and raise
    :class:`~tra_dask.physical.PlacementError`).  Any other error is a bug in the
    rule's side condition and surfaces: a rule proves its conditions, it does not
    try and see."""
    try:
        yield build()
    except PlacementError:
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


def _canonical_shape_ids(t) -> np.ndarray:
    """Shape ids of a type's chunks, equal iff the shapes are equal."""
    first: dict = {}
    canon = np.array([first.setdefault(tuple(sh), i) for i, sh in enumerate(t.shapes)], dtype=np.int64)
    return canon[t.shape_ids] if len(t.shape_ids) else np.zeros(0, np.int64)


def folds_equal_shapes(in_t, group_by, out_t) -> bool:
    """Every group of an aggregation of ``in_t`` by ``group_by`` folds chunks of one
    shape (so a law stated for equal shapes holds at every fold step)."""
    if in_t.ntuples == 0:
        return True
    g = out_t.locate(in_t.keys[:, list(group_by)]).astype(np.int64)
    sid = _canonical_shape_ids(in_t)
    lo = np.full(out_t.ntuples, np.iinfo(np.int64).max)
    hi = np.full(out_t.ntuples, -1)
    np.minimum.at(lo, g, sid)
    np.maximum.at(hi, g, sid)
    used = hi >= 0
    return bool(np.all(lo[used] == hi[used]))


def join_pairs_equal_shapes(join) -> bool:
    """Every pair a LocalJoin's kernel runs on has chunks of equal shape."""
    lp, rp = join.layout.lineage
    lt, rt = join.left.type, join.right.type
    l_ids = lt.shape_ids[join.left.layout.rows[lp]]
    r_ids = rt.shape_ids[join.right.layout.rows[rp]]
    n = max(len(rt.shapes), 1)
    pairs = np.unique(l_ids.astype(np.int64) * n + r_ids)
    return all(tuple(lt.shapes[int(c) // n]) == tuple(rt.shapes[int(c) % n]) for c in pairs)


def _below_moves(x: PNode) -> PNode:
    while isinstance(x, (Broadcast, Shuffle)):
        x = x.input
    return x


MAX_BROADCAST_TUPLES = 4_000_000


class TooLargeToPlan(PlacementError):
    """A rewrite whose layout would be too large to derive: it does not apply."""


def broadcast(x: PNode) -> PNode:
    """``Broadcast(x)`` as the rules build it: R2-1 applied at once (of a chain of
    moves only the last counts, so a move over a move is never made) and no move of
    a relation already whole on every site (it would move nothing).  This keeps the
    plan space finite.  A broadcast whose layout would hold more than
    :data:`MAX_BROADCAST_TUPLES` physical tuples (tuples × sites: 1024 chunks to
    4096 sites) is not offered: deriving it would cost gigabytes of planner memory,
    and such a broadcast moves the relation ~s times, which a grid or a shuffle
    beats at that scale."""
    x = _below_moves(x)
    if not x.layout.partial and x.layout.is_all(x.type):
        return x
    if x.type.ntuples * x.nsites > MAX_BROADCAST_TUPLES:
        raise TooLargeToPlan(f"broadcasting {x.type.ntuples} tuples to {x.nsites} sites")
    return Broadcast(x)


def shuffle(x: PNode, dims, grid: tuple = (), table: tuple = ()) -> PNode:
    """``Shuffle(x, dims, grid, table)`` with R2-1 applied at once (see :func:`broadcast`)."""
    return Shuffle(_below_moves(x), dims, grid, table)


def move_like(move: PNode, x: PNode) -> PNode:
    """The move ``move`` (a Broadcast, or a Shuffle with its dims and grid) applied
    to ``x`` instead of its input."""
    if isinstance(move, Broadcast):
        return broadcast(x)
    return shuffle(x, move.dims, move.grid, move.table)
