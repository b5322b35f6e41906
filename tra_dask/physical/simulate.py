"""A strict in-process simulator of IA plans: the second oracle.

Each of the s sites is a list of ``(key, chunk)`` tuples.  A local operator sees only
its own site's tuples; only :class:`Broadcast` and :class:`Shuffle` move tuples, and
they count the floats they move as they move them — independently of the cost
model, so the two can be checked against each other.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..kernels import array_module
from ..logical.evaluate import flatten_outputs as _flatten_logical
from ..node import toposort
from .nodes import Broadcast, ConcatAgg, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode, PSource, Shuffle, TileMap
from .placement import site_function

__all__ = ["simulate", "SimResult"]

Sites = list  # list (one per site) of lists of (key, chunk)


@dataclass
class SimResult:
    result: object                 # {key: chunk}, or a tuple/dict of them for several outputs
    floats_moved: int              # counted by the moves themselves
    floats_moved_by_node: dict     # PNode -> floats
    site_keys: dict                # PNode -> [[keys on site 0], [keys on site 1], ...]


def simulate(plan) -> SimResult:
    """Run ``plan`` (a Plan, a physical node, or a tuple/dict of them) on in-process sites."""
    outputs, rebuild = _outputs(plan)
    state: dict[PNode, Sites] = {}
    moved: dict[PNode, int] = {}
    for node in toposort(outputs):
        ins = [state[c] for c in node.children]
        state[node], moved[node] = _STEP[type(node)](node, *ins)
    results = [_gather(o, state[o]) for o in outputs]
    return SimResult(
        rebuild(results), int(sum(moved.values())), moved,
        {n: [[k for k, _ in site] for site in tuples] for n, tuples in state.items()},
    )


def _outputs(plan):
    if hasattr(plan, "outputs") and hasattr(plan, "rebuild"):
        return list(plan.outputs), plan.rebuild
    if isinstance(plan, PNode):
        return [plan], lambda rs: rs[0]
    if isinstance(plan, (tuple, list)):
        return list(plan), lambda rs: tuple(rs) if isinstance(plan, tuple) else list(rs)
    if isinstance(plan, dict):
        names = list(plan)
        return [plan[n] for n in names], lambda rs: dict(zip(names, rs))
    _flatten_logical(plan)  # raises a clear TypeError for anything else
    raise TypeError("simulate() takes a Plan or physical nodes; compile a TRA expression first (td.compile)")


def _gather(node: PNode, sites: Sites) -> dict:
    out: dict = {}
    for tuples in sites:
        for key, chunk in tuples:
            if key in out:
                if not np.array_equal(np.asarray(out[key]), np.asarray(chunk)):
                    raise RuntimeError(f"{node.label}: copies of key {key} differ between sites (partial result?)")
            else:
                out[key] = chunk
    return out


def _size(chunk) -> int:
    return int(np.prod(chunk.shape))


def _source(node: PSource):
    s = node.nsites
    sites: Sites = [[] for _ in range(s)]
    lay, keys = node.layout, node.type.key_list()
    chunks = {k: node.source.load(k) for k in keys}
    for r, site in zip(lay.rows.tolist(), lay.sites.tolist()):
        sites[site].append((keys[r], chunks[keys[r]]))
    return sites, 0


def _broadcast(node: Broadcast, inp: Sites):
    s = len(inp)
    held = [{k: a for k, a in site} for site in inp]
    out: Sites = [[] for _ in range(s)]
    moved = 0
    for key in sorted({k for site in held for k in site}):
        copy = next(h[key] for h in held if key in h)
        for dest in range(s):
            if key in held[dest]:
                out[dest].append((key, held[dest][key]))
            else:
                out[dest].append((key, copy))
                moved += _size(copy)
    return out, moved


def _shuffle(node: Shuffle, inp: Sites):
    s = len(inp)
    t = node.type
    dest_of = dict(zip(t.key_list(), site_function(t.keys[:, list(node.dims)], s).tolist()))
    out: Sites = [[] for _ in range(s)]
    moved = 0
    if node.input.layout.partial:  # every partial copy goes to its destination
        for here, tuples in enumerate(inp):
            for key, a in tuples:
                out[dest_of[key]].append((key, a))
                moved += _size(a) if dest_of[key] != here else 0
        return out, moved
    held = [dict(tuples) for tuples in inp]  # complete: at most one copy of a key per site
    placed = set()
    for key, d in dest_of.items():  # use a copy already at the destination if there is one
        if key in held[d]:
            out[d].append((key, held[d][key]))
            placed.add(key)
    for here, tuples in enumerate(inp):
        for key, a in tuples:
            if key not in placed:
                out[dest_of[key]].append((key, a))
                moved += _size(a)
                placed.add(key)
    return out, moved


def _local_join(node: LocalJoin, left: Sites, right: Sites):
    rest = [d for d in range(node.right.type.arity) if d not in node.right_on]
    out: Sites = []
    for ltuples, rtuples in zip(left, right):
        index = defaultdict(list)
        for rk, ra in rtuples:
            index[tuple(rk[d] for d in node.right_on)].append((rk, ra))
        site = []
        for lk, la in ltuples:
            for rk, ra in index.get(tuple(lk[d] for d in node.left_on), ()):
                site.append((lk + tuple(rk[d] for d in rest), node.kernel(la, ra)))
        out.append(site)
    return out, 0


def _local_aggregate(node: LocalAggregate, inp: Sites):
    out: Sites = []
    for tuples in inp:
        groups = defaultdict(list)
        for key, a in sorted(tuples, key=lambda kv: kv[0]):
            groups[tuple(key[d] for d in node.group_by)].append((key, a))
        site = []
        for g, members in groups.items():
            if isinstance(node.kernel, ConcatAgg):
                kd = node.kernel.key_dim
                chunks = [a for _, a in sorted(members, key=lambda kv: kv[0][kd])]
                site.append((g, array_module(chunks[0]).concatenate(chunks, axis=node.kernel.array_dim)))
            else:
                site.append((g, functools.reduce(node.kernel, [a for _, a in members])))
        out.append(site)
    return out, 0


def _local_filter(node: LocalFilter, inp: Sites):
    return [[(k, a) for k, a in tuples if node.pred(k)] for tuples in inp], 0


def _local_map(node: LocalMap, inp: Sites):
    op = node.op
    out: Sites = []
    for tuples in inp:
        site = []
        for key, a in tuples:
            if isinstance(op, TileMap):
                d, size = op.tile_dim, op.tile_size
                for t, start in enumerate(range(0, a.shape[d], size)):
                    idx = [slice(None)] * a.ndim
                    idx[d] = slice(start, start + size)
                    site.append((key + (t,), a[tuple(idx)]))
            else:
                new = op.key_fn(key)
                chunk = a if op.kernel is None else op.kernel(a)
                for nk in new if op.key_fn.multiplicity > 1 else [new]:
                    site.append((nk, chunk))
        out.append(site)
    return out, 0


_STEP = {
    PSource: _source, Broadcast: _broadcast, Shuffle: _shuffle, LocalJoin: _local_join,
    LocalAggregate: _local_aggregate, LocalFilter: _local_filter, LocalMap: _local_map,
}
