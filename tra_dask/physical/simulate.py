"""A strict in-process simulator of IA plans: the second oracle.

Each of the s sites is a list of tuples.  A local operator sees only its own site's
tuples; only :class:`Broadcast` and :class:`Shuffle` move tuples.  Every tuple
remembers the tuples it was made from, so at the end the simulator walks back from
the results (one copy of each key, the one on the lowest site) and counts the floats
of the moves that the results actually depend on — the moves a runtime that skips
unneeded work makes.  This is computed from the simulator's own bookkeeping,
independently of the layouts and the cost model, so the two check each other.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..kernels import array_module
from ..logical.sources import FromFunction
from ..node import toposort
from .nodes import Broadcast, ConcatAgg, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode, PSource, Shuffle, TileMap
from .placement import All

__all__ = ["simulate", "SimResult"]


class T:
    """One physical tuple: key, chunk, the floats moved to make it (0 unless a move
    made it), and the tuples it was made from."""

    __slots__ = ("key", "chunk", "node", "moved", "parents", "transfer", "copy")

    def __init__(self, key, chunk, node, parents=(), moved=0, dest=None, made=False):
        self.key, self.chunk, self.node, self.parents, self.moved = key, chunk, node, tuple(parents), moved
        # ``copy`` names the copy of an array a site holds: a tuple that passes its
        # parent's array on (a filter, a pure rekey, a tuple that stays put) holds the
        # parent's copy; a new array is a new copy; a moved array is a new copy per
        # (copy it came from, destination) — as on a cluster, where a copy that has
        # travelled is another key, and sending it on is another transfer.  A transfer
        # is one copy arriving at one site: tuples that share it travel once.
        # ``made``: a kernel call's result is a new array on the cluster even when the
        # kernel hands back its input object (``identity``, ``lambda x: x``); True, or
        # what tells the calls apart beyond their inputs (a join runs one task per
        # output tuple: two tuples joined from the same two arrays are two arrays,
        # physical/work.py — while a map's m output keys share its one call)
        inherit = not made and self.parents and self.parents[0].chunk is chunk
        if made:
            source = ("made", id(node), None if made is True else made, tuple(p.copy for p in self.parents))
        else:
            source = self.parents[0].copy if inherit else ("new", id(chunk))
        self.transfer = (source, dest) if moved else None
        self.copy = self.transfer if moved else source


Sites = list  # one list of T per site


@dataclass
class SimResult:
    result: object                 # {key: chunk}, or a tuple/dict of them for several outputs
    floats_moved: int              # moves the results depend on, counted from provenance
    floats_moved_by_node: dict     # PNode -> floats
    floats_moved_strict: int       # every move the IA semantics makes (all broadcast copies)
    site_keys: dict                # PNode -> [[keys on site 0], [keys on site 1], ...]


def simulate(plan) -> SimResult:
    """Run ``plan`` (a Plan, a physical node, or a tuple/dict of them) on in-process sites."""
    outputs, rebuild = _outputs(plan)
    state: dict[PNode, Sites] = {}
    for node in toposort(outputs):
        state[node] = _STEP[type(node)](node, *(state[c] for c in node.children))
    chosen = [_choose(o, state[o]) for o in outputs]
    moved = {n: 0 for n in state}
    seen: set = set()
    transfers: set = set()
    stack = [t for c in chosen for t in c.values()]
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t.moved and t.transfer not in transfers:
            transfers.add(t.transfer)
            moved[t.node] += t.moved
        stack.extend(t.parents)
    strict = sum(t.moved for sites in state.values() for site in sites for t in site)
    return SimResult(
        rebuild([{k: t.chunk for k, t in c.items()} for c in chosen]), int(sum(moved.values())), moved, int(strict),
        {n: [[t.key for t in site] for site in sites] for n, sites in state.items()},
    )


def _outputs(plan):
    if hasattr(plan, "outputs") and hasattr(plan, "rebuild"):
        return list(plan.outputs), plan.rebuild
    if isinstance(plan, PNode):
        return [plan], lambda rs: rs[0]
    if isinstance(plan, (tuple, list)) and all(isinstance(p, PNode) for p in plan):
        return list(plan), lambda rs: tuple(rs) if isinstance(plan, tuple) else list(rs)
    if isinstance(plan, dict) and all(isinstance(p, PNode) for p in plan.values()):
        names = list(plan)
        return [plan[n] for n in names], lambda rs: dict(zip(names, rs))
    raise TypeError("simulate() takes a Plan or physical nodes; compile a TRA expression first (td.compile)")


def _choose(node: PNode, sites: Sites) -> dict:
    """One copy per key, from the lowest site; all copies must agree."""
    out: dict = {}
    for tuples in sites:
        for t in tuples:
            if t.key in out:
                a, b = np.asarray(out[t.key].chunk), np.asarray(t.chunk)
                # replicas computed on different sites may differ in the last bit (BLAS
                # takes other paths for other memory layouts); partial folds differ a lot
                if not _same_copy(a, b):
                    raise RuntimeError(f"{node.label}: copies of key {t.key} differ between sites (partial result?)")
            else:
                out[t.key] = t
    return out


def _same_copy(a: np.ndarray, b: np.ndarray) -> bool:
    """Two sites' copies of one key agree: equal shapes, the same infinities and NaNs,
    and finite values within 1e-9 relative and 1e-12 of the largest finite magnitude
    (an inf or a NaN in the chunk must not make the tolerance infinite)."""
    if a.shape != b.shape:
        return False
    if a.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    finite = np.isfinite(a)
    scale = float(np.abs(a[finite]).max(initial=0))
    return bool(np.allclose(a, b, rtol=1e-9, atol=1e-12 * max(1.0, scale), equal_nan=True))


def _size(chunk) -> int:
    return int(np.prod(chunk.shape))


def _source(node: PSource):
    sites: Sites = [[] for _ in range(node.nsites)]
    lay, keys = node.layout, node.type.key_list()
    chunks = {k: node.source.load(k) for k in keys}
    placed: set = set()
    # a chunk of data (not a function's) under a key on a site is one array whichever
    # node places it there, as the lowering names it (its content, key and worker)
    owned = not isinstance(node.source, FromFunction) and not isinstance(node.placement_, All)
    for r, site in zip(lay.rows.tolist(), lay.sites.tolist()):
        chunk = chunks[keys[r]]
        if r in placed:  # a replicated source: each site makes its own array
            chunk = chunk.copy()
        placed.add(r)
        t = T(keys[r], chunk, node)
        if owned:
            t.copy = ("source", id(node.source), keys[r], site)
        sites[site].append(t)
    return sites


def _broadcast(node: Broadcast, inp: Sites):
    s = len(inp)
    held = [{t.key: t for t in site} for site in inp]
    out: Sites = [[] for _ in range(s)]
    for key in sorted({k for site in held for k in site}):
        copy = next(h[key] for h in held if key in h)
        for dest in range(s):
            if key in held[dest]:
                out[dest].append(T(key, held[dest][key].chunk, node, [held[dest][key]]))
            else:
                out[dest].append(T(key, copy.chunk, node, [copy], _size(copy.chunk), dest))
    return out


def _shuffle(node: Shuffle, inp: Sites):
    s = len(inp)
    t = node.type
    dest_of = dict(zip(t.key_list(), node.target.sites(t).tolist()))
    out: Sites = [[] for _ in range(s)]
    if node.input.layout.partial:  # every partial copy goes to its destination
        for here, tuples in enumerate(inp):
            for x in tuples:
                d = dest_of[x.key]
                out[d].append(T(x.key, x.chunk, node, [x], _size(x.chunk) if d != here else 0, d))
        return out
    held = [{x.key: x for x in tuples} for tuples in inp]  # complete: one copy of a key per site
    placed = set()
    for key, d in dest_of.items():  # use a copy already at the destination if there is one
        if key in held[d]:
            out[d].append(T(key, held[d][key].chunk, node, [held[d][key]]))
            placed.add(key)
    for tuples in inp:
        for x in tuples:
            if x.key not in placed:
                out[dest_of[x.key]].append(T(x.key, x.chunk, node, [x], _size(x.chunk), dest_of[x.key]))
                placed.add(x.key)
    return out


def _local_join(node: LocalJoin, left: Sites, right: Sites):
    rest = [d for d in range(node.right.type.arity) if d not in node.right_on]
    out: Sites = []
    for ltuples, rtuples in zip(left, right):
        index = defaultdict(list)
        for r in rtuples:
            index[tuple(r.key[d] for d in node.right_on)].append(r)
        site = []
        for lt in ltuples:
            for r in index.get(tuple(lt.key[d] for d in node.left_on), ()):
                key = lt.key + tuple(r.key[d] for d in rest)
                key = key if node.key_fn is None else node.key_fn(key)
                site.append(T(key, node.kernel(lt.chunk, r.chunk), node, [lt, r], made=("join", key)))
        out.append(site)
    return out


def _local_aggregate(node: LocalAggregate, inp: Sites):
    out: Sites = []
    for at, tuples in enumerate(inp):
        groups = defaultdict(list)
        for x in sorted(tuples, key=lambda x: x.key):
            groups[tuple(x.key[d] for d in node.group_by)].append(x)
        site = []
        for g, members in groups.items():
            if isinstance(node.kernel, ConcatAgg):
                kd = node.kernel.key_dim
                chunks = [x.chunk for x in sorted(members, key=lambda x: x.key[kd])]
                # a group of one is its member (no concatenation runs: the lowering aliases it too)
                chunk = chunks[0] if len(chunks) == 1 else array_module(chunks[0]).concatenate(
                    chunks, axis=node.kernel.array_dim)
            else:
                chunk = functools.reduce(node.kernel, [x.chunk for x in members])
            # (a fold is a task per group and site: two groups folding the same arrays,
            # an insert_dim's copies, make two arrays)
            site.append(T(g, chunk, node, members, made=("fold", g, at) if len(members) > 1 else False))
        out.append(site)
    return out


def _local_filter(node: LocalFilter, inp: Sites):
    return [[T(x.key, x.chunk, node, [x]) for x in tuples if node.pred(x.key)] for tuples in inp]


def _local_map(node: LocalMap, inp: Sites):
    op = node.op
    out: Sites = []
    for tuples in inp:
        site = []
        for x in tuples:
            a = x.chunk
            if isinstance(op, TileMap):
                d, size = op.tile_dim, op.tile_size
                for t, start in enumerate(range(0, a.shape[d], size)):
                    idx = [slice(None)] * a.ndim
                    idx[d] = slice(start, start + size)
                    site.append(T(x.key + (t,), a[tuple(idx)], node, [x]))
            else:
                new = op.key_fn(x.key)
                chunk = a if op.kernel is None else op.kernel(a)
                for nk in new if op.key_fn.multiplicity > 1 else [new]:
                    site.append(T(nk, chunk, node, [x], made=op.kernel is not None))
        out.append(site)
    return out


_STEP = {
    PSource: _source, Broadcast: _broadcast, Shuffle: _shuffle, LocalJoin: _local_join,
    LocalAggregate: _local_aggregate, LocalFilter: _local_filter, LocalMap: _local_map,
}
