"""Layouts: exactly which physical tuples ``(key, site)`` an IA node holds.

Computed from keys alone, vectorised, when a physical node is made: this is how a
hand-built plan whose local join would miss pairs is rejected at once, and it is the
ground the cost model stands on (``optimizer.cost`` counts floats from layouts).

A layout is a list of physical tuples, as two aligned arrays ``rows`` (index into
the node's ``type.keys``) and ``sites``.  It is *complete* when every copy of a key
holds the same array (a tuple on one site, or replicas); it is *partial* after a
local aggregation whose groups were spread over several sites (each copy holds a
partial fold, to be finished by Shuffle + LocalAggregate — the paper's R2-5).
``lineage`` records, for each physical tuple, the input physical tuple(s) it came
from; ``moved`` marks the tuples a Broadcast or Shuffle had to transfer; ``origin``
names the array object each tuple holds — tuples that share one (the copies a pure
rekey or ``insert_dim`` makes, the outputs of one kernel call) hold the same data, so
moving two of them to one site moves the bytes once, which is what Dask does.  Where
the origins follow from the input's (a pure rekey's copies, their moves) they are held
as a recipe over the lineage (:class:`Gathered`) and made when read.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import numpy as np

from ..types import (RelationType, first_of_each, first_positions, group_rows, join_codes, join_pairs, key_codes,
                     sorting_permutation, unique, unique_inverse)

__all__ = ["Gathered", "Layout", "PlacementError"]


class PlacementError(ValueError):
    """A physical plan that cannot run where its tuples are: a local join whose
    inputs never meet, a fold over a group spread across sites without an
    associative kernel, partial aggregates fed to an operator that needs whole ones.
    The only error a rewrite rule may treat as "this rewrite does not apply here";
    every other error inside a rule is a bug and surfaces."""


@dataclass(frozen=True, eq=False)
class Layout:
    nsites: int
    rows: np.ndarray
    sites: np.ndarray
    partial: bool = False
    lineage: tuple = ()
    moved: np.ndarray | None = None
    origin: np.ndarray | None = None

    def __post_init__(self):
        # positions (rows, sites, lineage) of a large layout are held as int32 while
        # they fit (origins are ids from a process-wide counter: int64)
        # (and rows or lineage 0 .. n-1 are the shared iota)
        object.__setattr__(self, "rows", _shared_iota(_narrow(self.rows)))
        object.__setattr__(self, "sites", _narrow(self.sites))
        given = self.lineage
        if self.lineage:
            object.__setattr__(self, "lineage", tuple(_shared_iota(_narrow(a)) for a in self.lineage))
        if self.origin is None:  # fresh ids, reserved now and made when first read (_Origins)
            del self.__dict__["origin"]
            object.__setattr__(self, "_origin_start", _reserve(len(self.rows)))
            object.__setattr__(self, "_origins_distinct", True)  # fresh ids are distinct: nothing to check
        elif isinstance(self.origin, Gathered):  # made when read and not held (_Origins)
            g = self.origin
            del self.__dict__["origin"]
            narrowed = {id(a): n for a, n in zip(given, self.lineage)}  # (the lineage's arrays, not copies)
            chain = tuple(narrowed.get(id(ix)) if id(ix) in narrowed else _narrow(ix) for ix in g.chain)
            object.__setattr__(self, "_origin_of", Gathered(g.base, chain, g.moved_from))

    @property
    def ntuples(self) -> int:
        """Physical tuples (a key on k sites counts k times)."""
        return len(self.rows)

    def tuples_per_site(self) -> np.ndarray:
        return np.bincount(self.sites, minlength=self.nsites)

    def elements_per_site(self, t: RelationType) -> np.ndarray:
        return np.bincount(self.sites, weights=t.chunk_sizes[self.rows], minlength=self.nsites).astype(np.int64)

    def site_keys(self, t: RelationType) -> list[list[tuple]]:
        """The keys each site holds."""
        out: list[list[tuple]] = [[] for _ in range(self.nsites)]
        keys = t.keys[self.rows].tolist()
        for k, s in zip(keys, self.sites.tolist()):
            out[s].append(tuple(k))
        return out

    def is_all(self, t: RelationType) -> bool:
        return not self.partial and self.ntuples == t.ntuples * self.nsites and len(
            unique(_codes(self.rows, self.sites, self.nsites))
        ) == self.ntuples

    def origins_distinct(self) -> bool:
        """Whether every tuple holds its own array (no two share an origin): then
        deduplicating moves or held bytes by array is a no-op.  Computed once."""
        v = self.__dict__.get("_origins_distinct")
        if v is None:
            n = self.ntuples
            if n <= 1:
                v = True
            elif "_origin_of" in self.__dict__:  # from the first of each: one pass over compact codes
                v = len(self.first_positions()) == n
            else:
                origin = self.origin  # (one read: a gathered origin is made on each)
                lo, hi = int(origin.min()), int(origin.max())
                v = hi - lo + 1 >= n and len(unique(origin - lo, bound=hi - lo + 1)) == n
            object.__setattr__(self, "_origins_distinct", v)
        return v

    def first_positions(self) -> np.ndarray:
        """Positions of the first tuple holding each distinct origin, ascending (every
        position when the origins are distinct).  Computed once."""
        v = self.__dict__.get("_first_positions")
        if v is None:
            got = self.__dict__.get("_origin_of")
            if got is not None:  # (a recipe's classes, coded compactly)
                v = first_positions(got.codes(self))
                v = iota(self.ntuples) if len(v) == self.ntuples else v
            elif self.origins_distinct():
                v = iota(self.ntuples)
            else:
                v = first_positions(self.origin)
            object.__setattr__(self, "_first_positions", v)
        return v

    def single_copy(self) -> bool:
        return len(unique(self.rows)) == len(self.rows)

    def origin_at(self, idx) -> np.ndarray:
        """``origin[idx]``, without making the whole array when the origins are held
        as fresh ids or as a gather (:class:`Gathered`)."""
        d = self.__dict__
        if "origin" not in d:
            got = d.get("_origin_of")
            if got is not None:
                return got.at(self, idx)
            idx = np.asarray(idx)
            if idx.dtype.kind in "iu":  # fresh ids: the position plus the first id
                return idx.astype(np.int64) + d["_origin_start"]
            return self.origin[idx]
        return d["origin"][idx]


@dataclass(frozen=True, eq=False)
class Gathered:
    """A layout's origins held as a recipe, made when read (:class:`_Origins`):
    ``base[chain[0][chain[1][...]]]`` — a pure rekey or insert_dim's copies hold
    their input tuples' arrays, so their origins are the input's at the lineage —
    and, with ``moved_from = (start, lo)``, each tuple the layout moved holds
    ``start + (o - lo) * nsites + site`` instead of the origin ``o`` it carried: an
    id per (object, destination site), as :func:`fresh_per_class` makes, from a
    block of ids reserved for the layout.  The chain's arrays are lineages the
    layouts hold anyway: a 3-D multiply's two replicas and their two shuffles hold
    no origin array (8 bytes per join tuple each)."""

    base: np.ndarray
    chain: tuple
    moved_from: "tuple | None" = None

    def at(self, lay: "Layout", idx=None) -> np.ndarray:
        """The origins of ``lay``'s tuples ``idx`` (positions; None: every tuple)."""
        o = self._carried(idx)
        if self.moved_from is None:
            return o
        start, lo = self.moved_from
        return self._patched(lay, idx, o, lo, start)

    def codes(self, lay: "Layout") -> np.ndarray:
        """Ints equal exactly where ``lay``'s origins are, in a compact range (for
        :func:`~tra_dask.types.first_of_each`'s table): the carried objects from 0,
        the moved copies' ids after them."""
        lo = int(self.base.min())
        o = self._carried(None) - lo
        if self.moved_from is None:
            return o
        return self._patched(lay, None, o, 0, int(self.base.max()) - lo + 1)

    def _carried(self, idx) -> np.ndarray:
        j = idx
        for ix in reversed(self.chain):
            j = ix if j is None else ix[j]
        return self.base[j]

    @staticmethod
    def _patched(lay: "Layout", idx, o: np.ndarray, lo: int, start: int) -> np.ndarray:
        """``o``, with each moved tuple's ``start + (o - lo) * nsites + site``."""
        mv, site = (lay.moved, lay.sites) if idx is None else (lay.moved[idx], lay.sites[idx])
        out = o.astype(np.int64)
        out -= lo
        out *= lay.nsites
        out += site
        out += start
        np.copyto(out, o, where=~mv)
        return out


class _Origins:
    """``Layout.origin`` where none is held: fresh ids (a layout made without
    origins: ``np.arange(start, start + ntuples)``, made on first read and then held
    — a join's 10^7 ids that nothing may read: a local aggregation of it reads none),
    or what a :class:`Gathered` recipe makes, made on every read."""

    def __get__(self, lay, owner=None):
        if lay is None:
            return None
        got = lay.__dict__.get("_origin_of")
        if got is not None:
            return got.at(lay)
        start = lay.__dict__["_origin_start"]
        ids = np.arange(start, start + len(lay.rows), dtype=np.int64)
        object.__setattr__(lay, "origin", ids)
        return ids


Layout.origin = _Origins()  # (read only where no origin array was given: the others are in the instance)


NARROW_FROM = 1 << 16  # arrays of positions this long or longer are narrowed (small ones: not worth a pass)


def _positions(n: int):
    """The dtype :func:`_narrow` gives an array of ``n`` positions (made so at once)."""
    return np.int32 if NARROW_FROM <= n < 2**31 - 1 else np.int64


def _narrow(a):
    """``a`` as int32 when it is a long int64 array of positions (or -1) that fit; else ``a``."""
    if isinstance(a, np.ndarray) and a.dtype == np.int64 and len(a) >= NARROW_FROM and a.ndim == 1:
        if int(a.max()) < 2**31 - 1 and int(a.min()) >= -1:
            return a.astype(np.int32)
    return a


_NEXT_ID = 0
_IDS_LOCK = threading.Lock()


def fresh(n: int) -> np.ndarray:
    """``n`` new array-object ids (a block of consecutive ints, O(1) to reserve)."""
    start = _reserve(n)
    return np.arange(start, start + n, dtype=np.int64)


def _reserve(n: int) -> int:
    """The first of ``n`` new consecutive ids (what :func:`fresh` returns, as a number)."""
    global _NEXT_ID
    with _IDS_LOCK:
        start = _NEXT_ID
        _NEXT_ID += max(n, 1)
    return start


def _moved_origin(src_origin: np.ndarray, dest: np.ndarray, moved: np.ndarray, nsites: int, *,
                  copy: bool = True) -> np.ndarray:
    """Origins after a move: unmoved tuples keep theirs; a moved tuple holds a new
    object, one per distinct (source object, destination site).  ``copy=False``:
    ``src_origin`` is a temporary of the caller's, written in place."""
    out = src_origin.copy() if copy else src_origin
    if moved.any():
        out[moved] = fresh_per_class(src_origin[moved], dest[moved], nsites)
    return out


def fresh_per_class(origin: np.ndarray, dest: np.ndarray, nsites: int) -> np.ndarray:
    """New ids, one per distinct ``(origin, dest)`` pair.  Only which pairs share an id
    matters, not the numbers: when the origins span a dense range (fresh ids usually
    do) this counts instead of sorting, and distinct origins make every pair new."""
    m = len(origin)
    lo = int(origin.min())
    span = int(origin.max()) - lo + 1
    if span <= 4 * m + 1024:
        values, rank = unique_inverse(origin - lo, span)
        if len(values) == m:  # each origin once: every pair is its own class
            return fresh(m)
        _, inv = unique_inverse(rank * nsites + dest, len(values) * nsites)
    else:
        _, inv = np.unique(origin * nsites + dest, return_inverse=True)
    inv = inv.reshape(-1)
    return fresh(int(inv.max()) + 1)[inv]


def _codes(rows, sites, nsites):
    return rows.astype(np.int64) * nsites + sites


def source_layout(t: RelationType, sites: np.ndarray | None, nsites: int, owner=None) -> Layout:
    """A source on given sites per key, or on all sites (``sites=None``).  ``owner``:
    the source whose chunk under a key, on a site, is one array whichever node places
    it there (data of this process, or a cluster's: the lowering names such a chunk
    by its content, key and worker) — its tuples' origins are ids of (key, site)
    kept for ``owner`` (:func:`owned_ids`), so two placements of it that put a chunk on
    one site hold one array, and moving it from there to a site is one transfer."""
    if sites is None:
        return broadcast_layout(Layout(nsites, np.arange(t.ntuples), np.zeros(t.ntuples, np.int64)), t, moved=False)
    sites = np.asarray(sites, dtype=np.int64)
    if owner is None:
        return Layout(nsites, iota(t.ntuples), sites)
    origin = np.arange(t.ntuples, dtype=np.int64)
    origin *= nsites
    origin += sites
    origin += owned_ids(owner, nsites, t.ntuples * nsites)
    lay = Layout(nsites, iota(t.ntuples), sites, False, (), None, origin)
    object.__setattr__(lay, "_origins_distinct", True)  # a key on one site each: (key, site) ids distinct
    return lay


_OWNED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # owner -> {tag: (first id, count)}


def owned_ids(owner, tag, n: int) -> int:
    """The first of ``n`` consecutive ids kept for ``owner`` under ``tag``: reserved on
    the first call, the same on every later one (while ``owner`` lives)."""
    global _NEXT_ID
    with _IDS_LOCK:
        held = _OWNED.setdefault(owner, {})
        got = held.get(tag)
        if got is None or got[1] < n:
            got = held[tag] = (_NEXT_ID, n)
            _NEXT_ID += max(n, 1)
    return got[0]


def broadcast_layout(inp: Layout, t: RelationType, moved: bool = True) -> Layout:
    """Every row on every site: tuple ``r·s + d`` is row ``r`` on site ``d``.  A
    broadcast to thousands of sites has 10^6–10^7 tuples, and where fresh memory is
    slow to touch the planner's time is the arrays it makes: the rows and sites are
    shared by every broadcast of ``n`` rows to ``s`` sites (:func:`_broadcast_grid`),
    and no (rows × sites) temporaries are made."""
    s = inp.nsites
    n = t.ntuples
    rows, sites = _broadcast_grid(n, s)
    # the wanted tuples (row r on site d) are code r*s + d = their own index: a copy
    # already on the site is found by one table lookup (the first such copy)
    codes = _codes(inp.rows, inp.sites, s)
    src = _first_index(codes, n * s)
    missing = src < 0
    first = _first_copy(inp, n)
    # a copy on the site is used in place, the others come from the row's first copy
    np.copyto(src.reshape(n, s), first[:, None], where=missing.reshape(n, s))
    mv = missing if moved else np.zeros(n * s, bool)
    if not mv.any():
        return Layout(s, rows, sites, False, (src,), mv, inp.origin_at(src))
    row_origin = inp.origin_at(first)
    if n > 1 and not bool(np.all(row_origin[1:] > row_origin[:-1])):
        origin = inp.origin_at(src)
        origin[mv] = fresh_per_class(origin[mv], sites[mv], s)
        return Layout(s, rows, sites, False, (src,), mv, origin)
    # the moved tuples, in layout order, are (row, site) pairs in row-major order whose
    # source objects increase with the row: their (object, destination) classes are all
    # distinct and in order, so fresh_per_class numbers them start, start + 1, ...:
    # the k-th moved tuple (from 1) gets start + k - 1, a running count
    origin = np.cumsum(mv, dtype=np.int64)
    origin += _reserve(int(origin[-1])) - 1
    held = unique(codes)  # the copies used in place (the tuples not moved) keep their objects
    origin[held] = inp.origin_at(src[held])
    lay = Layout(s, rows, sites, False, (src,), mv, origin)
    if inp.origins_distinct():  # new ids are new: distinct iff the input's (a small layout) are
        object.__setattr__(lay, "_origins_distinct", True)
    return lay


_GRIDS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()


def iota(n: int) -> np.ndarray:
    """``np.arange(n)`` as a Layout holds it (int32 when long), read-only and shared by
    every layout of ``n`` tuples one per row (kept while one of them lives)."""
    if n < NARROW_FROM:
        return np.arange(n)
    got = _GRIDS.get((n, "iota"))
    if got is None:
        got = np.arange(n, dtype=np.int32 if n < 2**31 - 1 else np.int64)
        got.setflags(write=False)
        _GRIDS[(n, "iota")] = got
    return got


def _broadcast_grid(n: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, sites)`` of a broadcast of ``n`` rows to ``s`` sites —
    ``np.repeat(np.arange(n), s)`` and ``np.tile(np.arange(s), n)`` — read-only and
    shared by every layout that uses them (the search makes dozens of broadcasts of
    one relation from differently placed inputs; kept while one of them lives)."""
    rows, sites = _GRIDS.get((n, s, "rows")), _GRIDS.get((n, s, "sites"))
    if rows is None or sites is None:
        ix = np.int32 if n * s >= NARROW_FROM and n < 2**31 - 1 else np.int64  # (as Layout narrows them)
        rows = np.empty(n * s, dtype=ix)
        rows.reshape(n, s)[:] = np.arange(n)[:, None]
        sites = np.empty(n * s, dtype=ix)
        sites.reshape(n, s)[:] = np.arange(s)
        rows.setflags(write=False)
        sites.setflags(write=False)
        _GRIDS[(n, s, "rows")], _GRIDS[(n, s, "sites")] = rows, sites
    return rows, sites


def _first_index(codes: np.ndarray, bound: int) -> np.ndarray:
    """``out[c]``: the position of the first occurrence of code ``c`` (codes in
    ``[0, bound)``), -1 where ``c`` does not occur."""
    out = np.full(bound, -1, dtype=np.int64)
    # a repeated index keeps the last value written: write back to front
    out[codes[::-1]] = np.arange(len(codes) - 1, -1, -1, dtype=np.int64)
    return out


def _first_copy(inp: Layout, n: int) -> np.ndarray:
    """Index of one physical tuple per row (the copy on the lowest site; the first
    such tuple if a site holds two)."""
    s = inp.nsites
    if inp.ntuples == 0:
        return np.full(n, -1, dtype=np.int64)
    if inp.ntuples == n and _is_iota(inp.rows):  # one copy per row, in order: tuple r is row r
        return np.arange(n, dtype=_positions(n))
    if inp.ntuples == n and len(unique(inp.rows, bound=n)) == n:  # one copy per row
        first = np.full(n, -1, dtype=np.int64)
        first[inp.rows] = np.arange(n)
        return first
    at = _first_index(_codes(inp.rows, inp.sites, s), n * s).reshape(n, s)
    lowest = np.argmax(at >= 0, axis=1)  # the lowest site holding the row
    return at[np.arange(n), lowest]


def shuffle_layout(inp: Layout, t: RelationType, dest: np.ndarray) -> Layout:
    """Every key to its site ``dest[row]`` (the shuffle's target placement)."""
    s = inp.nsites
    if inp.partial:  # every partial copy travels to its group's site
        moved = inp.sites != dest[inp.rows]
        d = dest[inp.rows]
        return Layout(s, inp.rows.copy(), d, True, (iota(inp.ntuples),), moved,
                      _moved_origin(inp.origin, d, moved, s))
    rows = iota(t.ntuples)
    if inp.ntuples == t.ntuples and _is_iota(inp.rows):  # tuple r is row r, once: each is where it is or moves
        moved = inp.sites != dest
        return Layout(s, rows, dest, False, (iota(t.ntuples),), moved, _moved_origins(inp, iota(t.ntuples), dest,
                                                                                     moved, s))
    at_dest = inp.sites == dest[inp.rows]
    src = _first_copy(inp, t.ntuples)
    src[inp.rows[at_dest]] = np.flatnonzero(at_dest)  # a copy already there is used in place
    moved = np.ones(t.ntuples, bool)
    moved[inp.rows[at_dest]] = False
    return Layout(s, rows, dest, False, (src,), moved, _moved_origins(inp, src, dest, moved, s))


def _carried_origins(inp: Layout, phys: np.ndarray) -> Gathered:
    """The origins of copies of ``inp``'s tuples ``phys`` that hold their arrays (a
    pure rekey, an insert_dim): the input's, gathered when read."""
    got = inp.__dict__.get("_origin_of")
    if got is None or got.moved_from is not None:
        return Gathered(inp.origin, (phys,))
    return Gathered(got.base, got.chain + (phys,))


def _moved_origins(inp: Layout, src: np.ndarray, dest: np.ndarray, moved: np.ndarray, s: int):
    """The origins of a move of ``inp``'s tuples ``src`` to ``dest`` (:func:`_moved_origin`);
    a recipe (:class:`Gathered`) when ``inp``'s are one with no moves (a pure rekey's,
    an insert_dim's) and the objects they carry span few enough ids."""
    got = inp.__dict__.get("_origin_of")
    if got is not None and got.moved_from is None and len(got.base):
        lo, hi = int(got.base.min()), int(got.base.max())
        span = (hi - lo + 1) * s
        if span <= 4 * max(len(src), 1) * s + 1024 and span < 1 << 40:
            return Gathered(got.base, got.chain + (src,), (_reserve(span), lo))
    return _moved_origin(inp.origin_at(src), dest, moved, s, copy=False)


def join_layout(L: Layout, Lt: RelationType, R: Layout, Rt: RelationType, lo, ro, out_t: RelationType,
                where: str, llabel: str, rlabel: str) -> Layout:
    """Pairs meet only on a site both tuples are on (paper §4, local join)."""
    if L.partial or R.partial:
        side = llabel if L.partial else rlabel
        raise PlacementError(
            f"{where}: {side} holds partial aggregates; finish them (Shuffle + LocalAggregate) "
            f"before a local join"
        )
    lp, rp = _local_pairs(L, Lt, R, Rt, lo, ro)
    rest = [d for d in range(Rt.arity) if d not in ro]
    each = lp is rp and len(lp) >= NARROW_FROM and lp is iota(len(lp))  # pair i is tuple i of both sides
    if each and not rest and out_t.same_keys(Lt):  # the output's keys are the left's: so are its rows
        rows = L.rows
    else:
        rows = _join_rows(L.rows, lp, Lt, R.rows, rp, Rt, rest, out_t)
    met = np.zeros(out_t.ntuples, bool)
    met[rows] = True
    if not met.all():
        miss = tuple(out_t.keys[np.flatnonzero(~met)[0]].tolist())
        lkey, rkey = miss[: Lt.arity], _right_key(miss, Lt.arity, lo, ro, Rt.arity)
        lsites = sorted(set(L.sites[L.rows == Lt.locate(np.array([lkey]))[0]].tolist()))
        rsites = sorted(set(R.sites[R.rows == Rt.locate(np.array([rkey]))[0]].tolist()))
        raise PlacementError(
            f"{where}: the inputs are not co-located: {llabel} tuple {lkey} is on sites {lsites} "
            f"and {rlabel} tuple {rkey} on sites {rsites}, so they never meet and output key "
            f"{miss} would be lost ({int((~met).sum())} of {out_t.ntuples} output tuples in all). "
            f"Broadcast one side, or shuffle both on the join dims"
        )
    return Layout(L.nsites, rows, L.sites if each else L.sites[lp], False, (lp, rp))


def _local_pairs(L: Layout, Lt: RelationType, R: Layout, Rt: RelationType, lo, ro):
    """Pairs of physical tuples that agree on the join dims and sit on one site.  The
    join dims are coded once per key (the types are small), then per physical tuple
    ``key code * sites + site``: no (tuples x dims) matrices."""
    s = L.nsites
    if _alike(L, Lt, R, Rt, lo, ro):  # every left tuple meets the right tuple in its position, and no other
        pos = iota(L.ntuples)
        return pos, pos
    lcode, rcode = key_codes(Lt.keys, lo, Rt.keys, ro)
    bound = max(int(lcode.max()) if len(lcode) else -1, int(rcode.max()) if len(rcode) else -1) + 1
    if bound * s >= 2**62:  # too wide to pack with the site
        lcols = np.concatenate([Lt.keys[:, list(lo)][L.rows], L.sites[:, None]], axis=1)
        rcols = np.concatenate([Rt.keys[:, list(ro)][R.rows], R.sites[:, None]], axis=1)
        return join_pairs(lcols, rcols)
    lc = lcode[L.rows]  # in place: a broadcast side has 10^7 physical tuples
    lc *= s
    lc += L.sites
    rc = rcode[R.rows]
    rc *= s
    rc += R.sites
    return join_codes(lc, rc)


def _alike(L: Layout, Lt: RelationType, R: Layout, Rt: RelationType, lo, ro) -> bool:
    """Whether two layouts joined on every key dim (in order) hold the same keys on the
    same sites position by position, each key once (rows ``0 .. n-1``): a 3-D
    multiply's replicas, shuffled onto one grid, found without coding 10^7 tuples."""
    a = Lt.arity
    if (not Lt.same_keys(Rt) or tuple(lo) != tuple(range(a)) or tuple(ro) != tuple(range(a))
            or L.ntuples != Lt.ntuples or R.ntuples != Rt.ntuples or L.ntuples < NARROW_FROM):
        return False
    rows_alike = (L.rows is R.rows or np.array_equal(L.rows, R.rows))
    return rows_alike and _is_iota(L.rows) and (L.sites is R.sites or np.array_equal(L.sites, R.sites))


def _shared_iota(a):
    """``a``, or the shared :func:`iota` when ``a`` is a long array of positions 0 .. n-1."""
    if not isinstance(a, np.ndarray) or a.ndim != 1 or len(a) < NARROW_FROM or a.dtype.kind not in "iu":
        return a
    n = len(a)
    held = _GRIDS.get((n, "iota"))
    if a is held or int(a[0]) != 0 or int(a[-1]) != n - 1 or not bool(np.all(a[1:] > a[:-1])):
        return a
    return iota(n)


def _is_iota(rows: np.ndarray) -> bool:
    n = len(rows)
    return rows is _GRIDS.get((n, "iota")) or (n > 0 and int(rows[0]) == 0 and int(rows[-1]) == n - 1
                                                and bool(np.all(rows[1:] > rows[:-1])))


def _join_rows(lrows, lp, Lt: RelationType, rrows, rp, Rt: RelationType, rest, out_t: RelationType) -> np.ndarray:
    """Row in ``out_t`` of each joined pair ``(lp[i], rp[i])`` of physical tuples (left
    key, then the right key's ``rest`` dims).  The output key's code is a left part
    plus a right part, each computed once per physical input tuple: no (pairs x
    arity) key matrix is built."""
    if len(lp) == 0:
        return np.zeros(0, np.int64)
    index = out_t._index()
    if index is None or out_t.arity != Lt.arity + len(rest):
        keys = np.concatenate([Lt.keys[lrows[lp]], Rt.keys[rrows[rp]][:, rest]], axis=1)
        return out_t.locate(keys)
    bases = index.bases
    strides = [1] * len(bases)
    for d in range(len(bases) - 2, -1, -1):
        strides[d] = strides[d + 1] * bases[d + 1]
    kl = Lt.arity

    def part(keys, dims, first):  # code part and "below the frontier" per key
        code = np.zeros(len(keys), dtype=np.int64)
        ok = np.ones(len(keys), dtype=bool)
        for j, d in enumerate(dims):
            col = keys[:, d]
            below = col < bases[first + j]
            ok &= below
            code += np.where(below, col, 0) * strides[first + j]
        return code, ok

    (lcode, lok), (rcode, rok) = part(Lt.keys, range(kl), 0), part(Rt.keys, rest, kl)
    lk, rk = lrows[lp], rrows[rp]  # the key of each pair's tuples (read per pair, not per physical
    # tuple: a broadcast side has 10^7 physical tuples and a join meets few of them)
    # every pair is a key of out_t (the join of the inputs' key sets): check it
    in_range = (lok.all() or lok[lk].all()) and (rok.all() or rok[rk].all())
    code = lcode[lk]
    code += rcode[rk]
    rows = index.rows_of(code) if in_range else None
    if rows is None:
        keys = np.concatenate([Lt.keys[lk], Rt.keys[rk][:, rest]], axis=1)
        return out_t.locate(keys)
    return rows


def _right_key(out_key, kl, lo, ro, kr):
    key = [0] * kr
    for a, b in zip(lo, ro):
        key[b] = out_key[a]
    rest = [d for d in range(kr) if d not in ro]
    for i, d in enumerate(rest):
        key[d] = out_key[kl + i]
    return tuple(key)


def aggregate_layout(inp: Layout, in_t: RelationType, group_by, out_t: RelationType, *,
                     can_be_partial: bool, where: str) -> Layout:
    """One output tuple per (group, site) holding any of the group's tuples."""
    s = inp.nsites
    g_of_row = group_rows(in_t, group_by, out_t)
    g = g_of_row[inp.rows]
    code = g.astype(np.int64, copy=False) * s
    code += inp.sites
    uniq, out_index = unique_inverse(code, out_t.ntuples * s)
    if inp.partial:  # a group is whole on a site iff all its physical tuples are there
        need = np.bincount(g, minlength=out_t.ntuples)
        have = np.bincount(out_index, minlength=len(uniq))
    elif inp.ntuples == in_t.ntuples and _is_iota(inp.rows):  # each key once: all its keys are its tuples
        need = np.bincount(g_of_row, minlength=out_t.ntuples)
        have = np.bincount(out_index, minlength=len(uniq))
    else:  # ... iff all its keys are there
        need = np.bincount(g_of_row, minlength=out_t.ntuples)
        distinct = unique(_codes(inp.rows, inp.sites, s), bound=in_t.ntuples * s)
        d_rows, d_sites = distinct // s, distinct % s
        d_code = g_of_row[d_rows] * s + d_sites
        if len(uniq) and int(uniq[-1]) < 4 * len(code) + 1024:  # position of each code in uniq by lookup
            at = np.zeros(int(uniq[-1]) + 1, dtype=np.intp)
            at[uniq] = np.arange(len(uniq))
            d_index = at[d_code]
        else:
            d_index = np.searchsorted(uniq, d_code)
        have = np.bincount(d_index, minlength=len(uniq))
    out_rows, out_sites = uniq // s, uniq % s
    partial = bool(np.any(have != need[out_rows]))
    members = np.bincount(out_index, minlength=len(uniq))
    origin = fresh(len(uniq))
    single = members == 1  # a group of one is its input tuple: no fold runs
    if single.any():
        first = np.full(len(uniq), -1, dtype=np.int64)
        first[out_index[::-1]] = np.arange(len(out_index))[::-1]
        origin[single] = inp.origin_at(first[single])
    if partial and not can_be_partial:
        bad = int(np.flatnonzero(have != need[out_rows])[0])
        raise PlacementError(
            f"{where}: group {tuple(out_t.keys[out_rows[bad]].tolist())} is spread over several "
            f"sites, so site {int(out_sites[bad])} would fold only part of it; that needs an "
            f"associative, commutative kernel (and a Shuffle + LocalAggregate after). Shuffle on "
            f"the group-by dims first"
        )
    return Layout(s, out_rows, out_sites, partial, (out_index,), None, origin)


def _per_array(inp: Layout) -> np.ndarray:
    """A fresh id per distinct (input origin, site) of ``inp``'s tuples."""
    code = inp.origin.astype(np.int64) * inp.nsites + inp.sites
    lo = int(code.min()) if len(code) else 0
    _, inv = unique_inverse(code - lo, int(code.max()) - lo + 1 if len(code) else 0)
    return fresh(int(inv.max()) + 1 if len(inv) else 0)[inv]


def expand_layout(inp: Layout, n_in: int, out_rows: np.ndarray, src_rows: np.ndarray, data: str = "same") -> Layout:
    """A multi-map: input row ``src_rows[i]`` becomes output row ``out_rows[i]``; every
    physical copy is mapped on its own site.  ``data``: ``"same"`` (filter, pure
    rekey: the input's arrays), ``"per_input"`` (one kernel call per input tuple,
    shared by its outputs) or ``"new"`` (a new array per output, e.g. tiles)."""
    order = sorting_permutation(np.asarray(src_rows))  # None: already in order (a filter, most rekeys)
    out_sorted = out_rows if order is None else out_rows[order]
    counts = np.bincount(src_rows, minlength=n_in)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    m = inp.ntuples
    if n_in and int(counts.min()) == int(counts.max()):
        # every input row has k outputs (insert_dim, a pure rekey): copy j of physical
        # tuple i is output row starts[row] + j, laid out as an (m, k) grid; no
        # per-tuple repeat counts and offsets
        k = k_each = int(counts[0])
        ix = _positions(m * k)  # (the dtype the layout holds them in: no narrowing copy)
        phys = np.repeat(np.arange(m, dtype=ix), k)
        at = (starts[inp.rows].astype(ix)[:, None] + np.arange(k, dtype=ix)).reshape(-1)
        rows = at if len(out_sorted) == len(at) and _is_iota(out_sorted) else out_sorted[at]
        sites = np.repeat(inp.sites.astype(ix, copy=False), k)
    else:
        k_each = 0
        c = counts[inp.rows]
        phys = np.repeat(np.arange(m), c)
        offset = np.arange(len(phys)) - np.repeat(np.cumsum(c) - c, c)
        rows = out_sorted[np.repeat(starts[inp.rows], c) + offset]
        sites = inp.sites[phys]
    first = None
    if data == "same":  # the input's arrays
        origin = _carried_origins(inp, phys)
        if k_each and m and inp.origins_distinct():  # copy 0 of each input tuple is the first of its array
            first = np.arange(0, m * k_each, k_each)
    elif data == "per_input":
        # one kernel call per input *array* on its site: copies of one array (an
        # insert_dim's) share the call and its result (physical.work groups alike)
        origin = fresh(m)[phys] if inp.origins_distinct() else _per_array(inp)[phys]
    else:
        origin = None
    out = Layout(inp.nsites, rows, sites, inp.partial, (phys,), None, origin)
    if first is not None:
        object.__setattr__(out, "_origins_distinct", k_each == 1)
        object.__setattr__(out, "_first_positions", _narrow(first))
    return out
