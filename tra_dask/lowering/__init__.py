"""Lowering: one topological pass from a physical plan to a Dask task graph in which
every task is pinned to one worker.

Every physical tuple ``(key, site)`` the results need (:func:`~tra_dask.physical.demand`)
becomes one Dask key, unique to the submission
(``(f"{op}-{node}-{token}", i)``, ``i`` the tuple's index in the node's layout).  A
Broadcast or Shuffle becomes, for each tuple it moves, an identity task on the
destination worker that depends on the source tuple — Dask's own transfer moves the
bytes; a tuple already at its destination costs neither a task nor a byte (the new
key is an alias of the old).  Local operators become kernel tasks on their site;
LocalFilter and pure rekeys are aliases.  A local aggregation is one task per group
and site, folding the group's chunks in key order.

No Dask graph optimisation or fusion runs on the result: tasks are grouped into one
``MaterializedLayer`` per worker carrying ``{"workers": [addr],
"allow_other_workers": False}``, wrapped in a ``HighLevelGraph``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Task, TaskRef

from ..logical.sources import ClusterSource, FromFunction
from ..node import toposort
from ..physical import (Broadcast, ConcatAgg, KeyArrayMap, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PSource,
                        Shuffle, TileMap, demand, result_copies)
from . import tasks

__all__ = ["lower", "Lowered"]


@dataclass
class Lowered:
    """A lowered plan: what to scatter where, the pinned graph, and where results are."""

    token: str
    workers: list
    layers: dict = field(default_factory=lambda: defaultdict(dict))   # worker -> {key: Task}
    scatter: dict = field(default_factory=lambda: defaultdict(dict))  # worker -> {key: chunk}
    node_keys: dict = field(default_factory=dict)  # PNode -> [dask key per physical tuple]
    planned: dict = field(default_factory=dict)    # dask key -> worker, for every task
    outputs: list = field(default_factory=list)    # per output: {TRA key: dask key}
    moves: dict = field(default_factory=dict)      # (source key, site) -> the key of that transfer

    @property
    def ntasks(self) -> int:
        return sum(len(v) for v in self.layers.values())

    def graph(self) -> HighLevelGraph:
        layers = {
            f"{self.token}-w{self.workers.index(w)}": MaterializedLayer(
                tasks_, annotations={"workers": [w], "allow_other_workers": False})
            for w, tasks_ in self.layers.items() if tasks_
        }
        return HighLevelGraph(layers, {name: set() for name in layers})

    def graph_keys(self) -> set:
        return {k for d in self.layers.values() for k in d}


def lower(plan, workers: list, token: str) -> Lowered:
    """Lower ``plan`` (its sites are ``workers[0..s-1]``) under the unique ``token``."""
    if len(workers) != plan.sites:
        raise ValueError(f"the plan is for {plan.sites} sites but {len(workers)} workers were given")
    out = Lowered(token, list(workers))
    need = demand(plan.outputs)
    for i, node in enumerate(toposort(plan.outputs)):
        name = f"{node._op}-{i}-{token}"
        out.node_keys[node] = _VISIT[type(node)](node, name, out, need[node])
    for o in plan.outputs:
        keys, tra_keys = out.node_keys[o], o.type.key_list()
        copies = result_copies(o.layout, o.type.ntuples)  # one copy of each key: the lowest site's
        out.outputs.append({tra_keys[r]: keys[c] for r, c in enumerate(copies.tolist())})
    return out


def _task(out: Lowered, site: int, key, fn, *args):
    w = out.workers[site]
    out.layers[w][key] = Task(key, fn, *args)
    out.planned[key] = w
    return key


def _visit_source(node: PSource, name: str, out: Lowered, need):
    src, lay, t = node.source, node.layout, node.type
    tra_keys = t.key_list()
    keys = []
    if isinstance(src, ClusterSource):
        existing = dict(src.dask_keys)
        return [existing[tra_keys[r]] for r in lay.rows.tolist()]
    shapes = t.chunk_shapes()
    for i, (row, site, needed) in enumerate(zip(lay.rows.tolist(), lay.sites.tolist(), need.tolist())):
        if not needed:
            keys.append(None)
            continue
        key = (name, i)
        tk = tra_keys[row]
        if isinstance(src, FromFunction):
            _task(out, site, key, tasks.load, src.fn, tk, shapes[tk], str(t.dtype), src.name)
        else:  # data in this process: scatter it straight to its site
            chunk = src.load(tk)
            out.scatter[out.workers[site]][key] = np.ascontiguousarray(chunk) if isinstance(chunk, np.ndarray) else chunk
            out.planned[key] = out.workers[site]
        keys.append(key)
    return keys


def _visit_move(node, name: str, out: Lowered, need):
    """Broadcast and Shuffle: a task on the destination for each tuple that moves."""
    lay = node.layout
    (src,) = lay.lineage
    in_keys = out.node_keys[node.input]
    keys = []
    made = out.moves  # one transfer per (source key, destination), across all moves of the plan:
    for i, (s_idx, site, moved, needed) in enumerate(  # a second move of one array to one site reuses
            zip(src.tolist(), lay.sites.tolist(), lay.moved.tolist(), need.tolist())):  # the first's key
        if not needed:
            keys.append(None)
        elif moved:
            k = (in_keys[s_idx], site)
            if k not in made:
                made[k] = _task(out, site, (name, i), tasks.identity, TaskRef(in_keys[s_idx]))
            keys.append(made[k])
        else:
            keys.append(in_keys[s_idx])
    return keys


def _visit_join(node: LocalJoin, name: str, out: Lowered, need):
    lp, rp = node.layout.lineage
    lk, rk = out.node_keys[node.left], out.node_keys[node.right]
    fn, params = node.kernel.fn, node.kernel.params
    return [
        _task(out, site, (name, i), tasks.apply, fn, params, TaskRef(lk[a]), TaskRef(rk[b])) if needed else None
        for i, (a, b, site, needed) in enumerate(zip(lp.tolist(), rp.tolist(), node.layout.sites.tolist(), need.tolist()))
    ]


def _visit_aggregate(node: LocalAggregate, name: str, out: Lowered, need):
    (out_index,) = node.layout.lineage
    ilay, it = node.input.layout, node.input.type
    in_keys = out.node_keys[node.input]
    members = defaultdict(list)
    # fold in key order, so a non-commutative kernel folds as the reference evaluator does
    order = np.lexsort(tuple(it.keys[ilay.rows].T[::-1])) if it.arity else np.arange(ilay.ntuples)
    for p in order.tolist():
        members[int(out_index[p])].append(p)
    keys = []
    k = node.kernel
    for i, (site, needed) in enumerate(zip(node.layout.sites.tolist(), need.tolist())):
        if not needed:
            keys.append(None)
            continue
        refs = [TaskRef(in_keys[p]) for p in members[i]]
        if isinstance(k, ConcatAgg):
            kd = k.key_dim
            refs = [TaskRef(in_keys[p]) for p in sorted(members[i], key=lambda p: it.keys[ilay.rows[p], kd])]
            keys.append(_task(out, site, (name, i), tasks.concat, k.array_dim, *refs))
        elif len(refs) == 1:
            keys.append(in_keys[members[i][0]])  # a group of one: nothing to fold
        else:
            keys.append(_task(out, site, (name, i), tasks.fold, k.fn, k.params, *refs))
    return keys


def _visit_filter(node: LocalFilter, name: str, out: Lowered, need):
    (src,) = node.layout.lineage
    in_keys = out.node_keys[node.input]
    return [in_keys[p] if needed else None for p, needed in zip(src.tolist(), need.tolist())]


def _visit_map(node: LocalMap, name: str, out: Lowered, need):
    (src,) = node.layout.lineage
    in_keys = out.node_keys[node.input]
    op = node.op
    if isinstance(op, KeyArrayMap) and op.kernel is None:  # a pure rekey moves nothing
        return [in_keys[p] if needed else None for p, needed in zip(src.tolist(), need.tolist())]
    sites = node.layout.sites.tolist()
    if isinstance(op, TileMap):
        tix = node.type.keys[node.layout.rows, -1].tolist()
        return [
            _task(out, site, (name, i), tasks.tile_slice, TaskRef(in_keys[p]), op.tile_dim,
                  t * op.tile_size, (t + 1) * op.tile_size) if needed else None
            for i, (p, site, t, needed) in enumerate(zip(src.tolist(), sites, tix, need.tolist()))
        ]
    done: dict = {}  # the kernel runs once per input tuple; its m output keys share it
    keys = []
    for i, (p, site, needed) in enumerate(zip(src.tolist(), sites, need.tolist())):
        if not needed:
            keys.append(None)
            continue
        if p not in done:
            done[p] = _task(out, site, (name, i), tasks.apply, op.kernel.fn, op.kernel.params, TaskRef(in_keys[p]))
        keys.append(done[p])
    return keys


_VISIT = {
    PSource: _visit_source, Broadcast: _visit_move, Shuffle: _visit_move, LocalJoin: _visit_join,
    LocalAggregate: _visit_aggregate, LocalFilter: _visit_filter, LocalMap: _visit_map,
}

