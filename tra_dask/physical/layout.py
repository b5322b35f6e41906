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
moving two of them to one site moves the bytes once, which is what Dask does.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..types import RelationType, join_pairs, unique
from .placement import site_function

__all__ = ["Layout"]


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
        if self.origin is None:
            object.__setattr__(self, "origin", fresh(len(self.rows)))

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
            unique(self.rows * self.nsites + self.sites)
        ) == self.ntuples

    def single_copy(self) -> bool:
        return len(unique(self.rows)) == len(self.rows)


_IDS = itertools.count()


def fresh(n: int) -> np.ndarray:
    """``n`` new array-object ids."""
    start = next(_IDS)
    for _ in range(max(n - 1, 0)):
        next(_IDS)
    return np.arange(start, start + n, dtype=np.int64)


def _moved_origin(src_origin: np.ndarray, dest: np.ndarray, moved: np.ndarray, nsites: int) -> np.ndarray:
    """Origins after a move: unmoved tuples keep theirs; a moved tuple holds a new
    object, one per distinct (source object, destination site)."""
    out = src_origin.copy()
    if moved.any():
        code = src_origin[moved] * nsites + dest[moved]
        _, inv = np.unique(code, return_inverse=True)
        out[moved] = fresh(int(inv.max()) + 1)[inv.reshape(-1)]
    return out


def _codes(rows, sites, nsites):
    return rows.astype(np.int64) * nsites + sites


def source_layout(t: RelationType, sites: np.ndarray | None, nsites: int) -> Layout:
    """A source on given sites per key, or on all sites (``sites=None``)."""
    if sites is None:
        return broadcast_layout(Layout(nsites, np.arange(t.ntuples), np.zeros(t.ntuples, np.int64)), t, moved=False)
    return Layout(nsites, np.arange(t.ntuples), np.asarray(sites, dtype=np.int64))


def broadcast_layout(inp: Layout, t: RelationType, moved: bool = True) -> Layout:
    s = inp.nsites
    rows = np.repeat(np.arange(t.ntuples), s)
    sites = np.tile(np.arange(s, dtype=np.int64), t.ntuples)
    want = _codes(rows, sites, s)
    have = _codes(inp.rows, inp.sites, s)
    order = np.argsort(have, kind="stable")
    pos = np.minimum(np.searchsorted(have[order], want), max(len(have) - 1, 0))
    held = have[order][pos] == want if len(have) else np.zeros(len(want), bool)
    src = np.where(held, order[pos], _first_copy(inp, t.ntuples)[rows])  # a copy on the site is used in place
    mv = ~held if moved else np.zeros(len(rows), bool)
    return Layout(s, rows, sites, False, (src,), mv, _moved_origin(inp.origin[src], sites, mv, s))


def _first_copy(inp: Layout, n: int) -> np.ndarray:
    """Index of one physical tuple per row (the copy on the lowest site)."""
    order = np.lexsort((inp.sites, inp.rows))
    first = np.full(n, -1, dtype=np.int64)
    r = inp.rows[order]
    keep = np.r_[True, r[1:] != r[:-1]] if len(r) else np.zeros(0, bool)
    first[r[keep]] = order[keep]
    return first


def shuffle_layout(inp: Layout, t: RelationType, dims: tuple) -> Layout:
    s = inp.nsites
    dest = site_function(t.keys[:, list(dims)], s)
    if inp.partial:  # every partial copy travels to its group's site
        moved = inp.sites != dest[inp.rows]
        d = dest[inp.rows]
        return Layout(s, inp.rows.copy(), d, True, (np.arange(inp.ntuples),), moved,
                      _moved_origin(inp.origin, d, moved, s))
    rows = np.arange(t.ntuples)
    at_dest = inp.sites == dest[inp.rows]
    src = _first_copy(inp, t.ntuples)
    src[inp.rows[at_dest]] = np.flatnonzero(at_dest)  # a copy already there is used in place
    moved = np.ones(t.ntuples, bool)
    moved[inp.rows[at_dest]] = False
    return Layout(s, rows, dest, False, (src,), moved, _moved_origin(inp.origin[src], dest, moved, s))


def join_layout(L: Layout, Lt: RelationType, R: Layout, Rt: RelationType, lo, ro, out_t: RelationType,
                where: str, llabel: str, rlabel: str) -> Layout:
    """Pairs meet only on a site both tuples are on (paper §4, local join)."""
    if L.partial or R.partial:
        side = llabel if L.partial else rlabel
        raise ValueError(
            f"{where}: {side} holds partial aggregates; finish them (Shuffle + LocalAggregate) "
            f"before a local join"
        )
    lcols = np.concatenate([Lt.keys[L.rows][:, list(lo)], L.sites[:, None]], axis=1)
    rcols = np.concatenate([Rt.keys[R.rows][:, list(ro)], R.sites[:, None]], axis=1)
    lp, rp = join_pairs(lcols, rcols)
    rest = [d for d in range(Rt.arity) if d not in ro]
    keys = np.concatenate([Lt.keys[L.rows[lp]], Rt.keys[R.rows[rp]][:, rest]], axis=1)
    rows = out_t.locate(keys) if len(keys) else np.zeros(0, np.int64)
    met = np.zeros(out_t.ntuples, bool)
    met[rows] = True
    if not met.all():
        miss = tuple(out_t.keys[np.flatnonzero(~met)[0]].tolist())
        lkey, rkey = miss[: Lt.arity], _right_key(miss, Lt.arity, lo, ro, Rt.arity)
        lsites = sorted(set(L.sites[L.rows == Lt.locate(np.array([lkey]))[0]].tolist()))
        rsites = sorted(set(R.sites[R.rows == Rt.locate(np.array([rkey]))[0]].tolist()))
        raise ValueError(
            f"{where}: the inputs are not co-located: {llabel} tuple {lkey} is on sites {lsites} "
            f"and {rlabel} tuple {rkey} on sites {rsites}, so they never meet and output key "
            f"{miss} would be lost ({int((~met).sum())} of {out_t.ntuples} output tuples in all). "
            f"Broadcast one side, or shuffle both on the join dims"
        )
    return Layout(L.nsites, rows, L.sites[lp], False, (lp, rp))


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
    g_of_row = out_t.locate(in_t.keys[:, list(group_by)])
    g = g_of_row[inp.rows]
    code = g.astype(np.int64) * s + inp.sites
    uniq, out_index = np.unique(code, return_inverse=True)
    out_index = out_index.reshape(-1)
    if inp.partial:  # a group is whole on a site iff all its physical tuples are there
        need = np.bincount(g, minlength=out_t.ntuples)
        have = np.bincount(out_index, minlength=len(uniq))
    else:  # ... iff all its keys are there
        need = np.bincount(g_of_row, minlength=out_t.ntuples)
        distinct = unique(_codes(inp.rows, inp.sites, s))
        d_rows, d_sites = distinct // s, distinct % s
        have = np.bincount(np.searchsorted(uniq, g_of_row[d_rows] * s + d_sites), minlength=len(uniq))
    out_rows, out_sites = uniq // s, uniq % s
    partial = bool(np.any(have != need[out_rows]))
    members = np.bincount(out_index, minlength=len(uniq))
    origin = fresh(len(uniq))
    single = members == 1  # a group of one is its input tuple: no fold runs
    if single.any():
        first = np.full(len(uniq), -1, dtype=np.int64)
        first[out_index[::-1]] = np.arange(len(out_index))[::-1]
        origin[single] = inp.origin[first[single]]
    if partial and not can_be_partial:
        bad = int(np.flatnonzero(have != need[out_rows])[0])
        raise ValueError(
            f"{where}: group {tuple(out_t.keys[out_rows[bad]].tolist())} is spread over several "
            f"sites, so site {int(out_sites[bad])} would fold only part of it; that needs an "
            f"associative, commutative kernel (and a Shuffle + LocalAggregate after). Shuffle on "
            f"the group-by dims first"
        )
    return Layout(s, out_rows, out_sites, partial, (out_index,), None, origin)


def expand_layout(inp: Layout, n_in: int, out_rows: np.ndarray, src_rows: np.ndarray, data: str = "same") -> Layout:
    """A multi-map: input row ``src_rows[i]`` becomes output row ``out_rows[i]``; every
    physical copy is mapped on its own site.  ``data``: ``"same"`` (filter, pure
    rekey: the input's arrays), ``"per_input"`` (one kernel call per input tuple,
    shared by its outputs) or ``"new"`` (a new array per output, e.g. tiles)."""
    order = np.argsort(src_rows, kind="stable")
    out_sorted = out_rows[order]
    counts = np.bincount(src_rows, minlength=n_in)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    c = counts[inp.rows]
    phys = np.repeat(np.arange(inp.ntuples), c)
    offset = np.arange(len(phys)) - np.repeat(np.cumsum(c) - c, c)
    rows = out_sorted[np.repeat(starts[inp.rows], c) + offset]
    if data == "same":
        origin = inp.origin[phys]
    elif data == "per_input":
        origin = fresh(inp.ntuples)[phys]
    else:
        origin = None
    return Layout(inp.nsites, rows, inp.sites[phys], inp.partial, (phys,), None, origin)
