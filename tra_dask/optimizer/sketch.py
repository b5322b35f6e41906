"""Planning a large problem on a sketch of it.

The search derives the exact layout of every candidate it ranks: for a join of
10⁶-10⁷ tuples that is seconds per candidate and gigabytes in all.  But which
strategy wins (broadcast, co-partition, a 2x2x2 grid, pre-aggregation) depends on
the *proportions* of the problem — chunk sizes, which dims are large, the number
of sites — not on every block.  So above :data:`SKETCH_TUPLES` tuples the search
runs on a **sketch**: the same expression over sources with fewer blocks along
their long dims (the same chunk shapes, the ragged edge chunk kept, so every
kernel sees the chunk shapes and shape pairs it would see at full size), and the
best few sketch plans are **replayed** at full size: each node rebuilt over the
full sources with the same operators and placements (placements are symbolic: key
dims and grids, not site lists), then derived and costed exactly.  The cheapest
replayed plan wins.

Soundness does not rest on the sketch.  Replaying re-derives every layout at full
size, and a layout derivation raises :class:`~tra_dask.physical.PlacementError`
when a local join's inputs are not co-located or a partial aggregate is read too
early; a replayed plan must also produce exactly the expression's output relation
(keys and chunk shapes); and the one kind of rule side condition that depends on
chunk shapes — a distributive law proved only for equal shapes (R1-4, R1-7's
premap form) — is proved again at full size wherever the plan has the form such a
rewrite makes (:func:`_laws_hold`: conservative, a form the user wrote is checked
too).  A candidate that fails any check is dropped; if all fail, the search runs at
full size.  (The soundness test found the need: a sketch cut to one block per dim
has only equal shapes, so R1-7 fired where the full relation pairs unequal ones.)

A sketch is made only when every parameter is free of block counts: grid sources
(``from_numpy``, ``from_function``, or any source whose keys form a full block
grid), no filters (a predicate may name block indices), no concat (its chunk is a
whole dim), key maps that only pick dims, and ``insert_dim`` (whose count is a
block count, mapped both ways).  A sketch plan that deals a dim's values to sites by
a table (:func:`~tra_dask.optimizer.rules.affinity_mm`) is not replayed: the table
is of the sketch's values.  Reduced block counts keep their order and their
gaps of two or more, and every dim keeps at least two blocks (an interior and an
edge chunk).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field


from ..keys import InsertDim, KeyMap, insert_dim
from ..logical import Concat, Filter, Rekey, Source
from ..logical.sources import FromFunction
from ..node import toposort
from ..physical import (Assign, KeyArrayMap, KeySites, LocalAggregate, LocalJoin, LocalMap, PlacementError, PSource,
                        Shuffle)
from ..types import RelationType, grid_type
from ..kernels import Premapped
from .rules._util import folds_equal_shapes, is_identity_map, join_pairs_equal_shapes

__all__ = ["SKETCH_TUPLES", "Sketch", "make_sketch", "replay"]

SKETCH_TUPLES = 40_000   # the largest relation the search derives exactly; above it, a sketch
_MIN_BLOCKS = 4          # a reduced dim keeps at least this many blocks, and at least one per site:
                         # fewer, and partitioning on it would leave sites idle that the full problem uses


class NotReplayable(Exception):
    """A sketch plan that has no full-size counterpart (a block count it cannot map back)."""


@dataclass(frozen=True)
class _NoData:
    """The loader of a sketch source: a sketch is planned, never run."""

    name: str

    def __call__(self, key):
        raise RuntimeError(f"{self.name} is a planning sketch; it has no data")


@dataclass
class Sketch:
    """The sketched expression and how to map it back."""

    outputs: list                       # sketch relations, one per output
    placements: dict | None             # sketch source -> placement (the caller's fixed ones)
    full_source: dict                   # sketch source -> full source
    full_extents: dict                  # sketch block count -> {full block counts}
    factor: float                       # blocks divided by about this along long dims
    tuples: int                         # largest relation of the sketch
    full_tuples: int                    # largest relation of the expression
    report: dict = field(default_factory=dict)

    def unsketch(self, count: int) -> int:
        full = self.full_extents.get(count)
        if full is None or len(full) != 1:
            raise NotReplayable(f"block count {count} maps back to {sorted(full or ())}")
        return next(iter(full))


def largest_relation(outputs) -> int:
    return max(n.type.ntuples for n in toposort(outputs))


def _grid_of(t: RelationType):
    """``(shape, chunks)`` when ``t`` is a full block grid of a tensor (one key dim
    per array dim, interior chunks alike, a smaller edge chunk per dim), else None."""
    if t.arity == 0 or t.rank != t.arity or t.ntuples == 0:
        return None
    f = t.frontier
    if t.ntuples != math.prod(f):
        return None
    chunks = t.bound
    last = t.chunk_type(tuple(x - 1 for x in f)).shape
    shape = tuple((n - 1) * c + e for n, c, e in zip(f, chunks, last))
    if any(e > c for e, c in zip(last, chunks)) or grid_type(shape, chunks, t.dtype) != t:
        return None
    return shape, chunks


def _floor(sites: int) -> int:
    """Fewest blocks a reduced dim keeps (see :data:`_MIN_BLOCKS`)."""
    return max(_MIN_BLOCKS, sites)


def _reductions(counts, factor: float, floor: int) -> dict:
    """Block count -> sketch block count: divided by ``factor``, at least ``floor``
    (a count at or below it is kept), increasing and one-to-one, so that every
    sketch count maps back to one full count (an ``insert_dim`` count is one)."""
    out, last, prev = {}, 0, 0
    for n in sorted(set(counts)):
        small = n if n <= max(floor, 2) else max(floor, 2, math.ceil(n / factor))
        out[n] = last = max(small, last + min(n - prev, 2))  # a gap of two keeps a value strictly between
        prev = n
    return out


def make_sketch(outputs, sites: int, placements: dict | None, *, target: int | None = None) -> Sketch | None:
    """A sketch of ``outputs`` whose largest relation has about ``target`` tuples, or
    None when the expression is small already or cannot be sketched (module doc).
    ``placements``: the caller's fixed placements, ``{source: Placement}``."""
    target = SKETCH_TUPLES if target is None else target
    full_tuples = largest_relation(outputs)
    if full_tuples <= target:
        return None
    order = toposort(outputs)
    grids = {}
    for n in order:
        if isinstance(n, (Filter, Concat)):
            return None
        if isinstance(n, Rekey) and not (isinstance(n.key_fn, InsertDim)
                                         or (isinstance(n.key_fn, KeyMap) and n.key_fn.projection is not None)):
            return None
        if isinstance(n, Source):
            g = _grid_of(n.type)
            if g is None:
                return None
            grids[n] = g
    if placements and any(isinstance(p, (KeySites, Assign)) for p in placements.values()):
        return None
    counts = [b for g in grids.values() for b in _blocks(*g)]
    counts += [n.key_fn.count for n in order if isinstance(n, Rekey) and isinstance(n.key_fn, InsertDim)]
    arity = max(n.type.arity for n in order if n.type.ntuples == full_tuples)
    factor = (full_tuples / target) ** (1 / max(arity, 1))
    sk = None
    for _ in range(6):  # the floors may keep it above the target: then the smallest reached
        prev, sk = sk, _build(order, outputs, grids, placements, _reductions(counts, factor, _floor(sites)))
        sk.factor, sk.full_tuples = factor, full_tuples
        if sk.tuples <= target * 1.5 or (prev is not None and sk.tuples == prev.tuples):
            break
        factor *= (sk.tuples / target) ** (1 / max(arity, 1)) * 1.05
    return sk if sk.tuples < full_tuples else None


def _blocks(shape, chunks) -> list:
    return [math.ceil(s / c) for s, c in zip(shape, chunks)]


def _build(order, outputs, grids, placements, forward: dict) -> Sketch:
    memo, full_source = {}, {}
    for n in order:
        if isinstance(n, Source):
            shape, chunks = grids[n]
            blocks = _blocks(shape, chunks)
            last = [s - (b - 1) * c for s, b, c in zip(shape, blocks, chunks)]
            small = tuple((forward[b] - 1) * c + e for b, c, e in zip(blocks, chunks, last))
            s = FromFunction(_NoData(n.label), small, chunks, n.type.dtype, n.label)
            memo[n] = s
            full_source[s] = n
            continue
        kids = {f: memo[getattr(n, f)] for f in n._children}
        if isinstance(n, Rekey) and isinstance(n.key_fn, InsertDim):
            kids["key_fn"] = insert_dim(n.key_fn.pos, forward[n.key_fn.count])
        memo[n] = dataclasses.replace(n, **kids)
    inverse: dict = {}
    for full, small in forward.items():
        inverse.setdefault(small, set()).add(full)
    outs = [memo[o] for o in outputs]
    pl = None if placements is None else {memo[s]: p for s, p in placements.items() if s in memo}
    return Sketch(outs, pl, full_source, inverse, 0.0, largest_relation(outs), 0)


def replay(outputs, sk: Sketch, want_types) -> list:
    """The sketch plan ``outputs`` rebuilt over the full sources (module doc); raises
    :class:`NotReplayable` or :class:`~tra_dask.physical.PlacementError` when it
    has no valid full-size counterpart."""
    memo: dict = {}
    for n in toposort(outputs):
        if isinstance(n, Shuffle) and n.table or isinstance(n, PSource) and isinstance(n.placement_, Assign):
            raise NotReplayable(f"{n.label}: a table of sites per value of the sketch's blocks (affinity_mm) "
                                f"has no full-size counterpart")
        if isinstance(n, PSource):
            memo[n] = PSource(sk.full_source[n.source], n.placement_, free=n.free)
            continue
        kids = {f: memo[getattr(n, f)] for f in n._children}
        if isinstance(n, LocalMap) and isinstance(n.op, KeyArrayMap) and isinstance(n.op.key_fn, InsertDim):
            k = n.op.key_fn
            kids["op"] = KeyArrayMap(insert_dim(k.pos, sk.unsketch(k.count)), n.op.kernel)
        memo[n] = dataclasses.replace(n, **kids)
    full = [memo[o] for o in outputs]
    for i, (o, want) in enumerate(zip(full, want_types)):
        if o.layout.partial or o.type != want:
            raise PlacementError(f"replayed output {i} is not the expression's relation")
    for n in toposort(full):
        if not _laws_hold(n):
            raise NotReplayable(f"{n.label}: a distributive law proved on the sketch's chunk shapes fails at full size")
    return full


def _laws_hold(n) -> bool:
    """The shape-dependent side conditions of R1-4 and R1-7 (premap form), proved
    for the full-size node ``n`` wherever it has the form those rewrites make."""
    if isinstance(n, LocalJoin) and isinstance(getattr(n.kernel, "fn", None), Premapped):
        f = n.kernel.fn
        return f.pre.distributes(f.binary, equal_shapes=join_pairs_equal_shapes(n),
                                 dtypes=(n.left.type.dtype, n.right.type.dtype))
    if (isinstance(n, LocalAggregate) and isinstance(n.input, LocalMap) and is_identity_map(n.input)
            and n.input.op.kernel is not None and getattr(n.kernel, "arity", 0) == 2):
        return n.input.op.kernel.distributes(
            n.kernel, equal_shapes=folds_equal_shapes(n.input.input.type, n.group_by, n.type),
            dtypes=(n.input.input.type.dtype,))
    if (isinstance(n, LocalMap) and is_identity_map(n) and n.op.kernel is not None
            and isinstance(n.input, LocalAggregate) and getattr(n.input.kernel, "arity", 0) == 2):
        agg = n.input
        return n.op.kernel.distributes(
            agg.kernel, equal_shapes=folds_equal_shapes(agg.input.type, agg.group_by, agg.type),
            dtypes=(agg.input.type.dtype,))
    return True
