"""The cost model (paper §5.3), computed bottom-up from exact layouts.

For every plan node: its exact key set, frontier and chunk shapes (the node's type),
which sites hold which keys (its layout), the floats it moves, the bytes held per
site while it runs (inputs + output), and the flops each site spends on it.

Two transfer formulas:

* ``"paper"`` — §5.3 as printed: broadcasting a relation of f floats costs f·s,
  shuffling it costs f (whatever already sits where it is going).
* ``"exact"`` (default) — only tuples that arrive at a site that does not already
  hold them, and only those the plan needs (:func:`~tra_dask.physical.demand`: a
  broadcast copy no local operator reads is never made): what the lowered graph moves
  on a real cluster, and what the simulator counts.

Held bytes and flops count the needed tuples too: they are the tasks that run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels import Kernel
from ..node import toposort
from ..types import unique
from ..physical import Broadcast, KeyArrayMap, LocalAggregate, LocalJoin, LocalMap, PNode, Shuffle, demand

__all__ = ["COST_MODELS", "NodeCost", "Cost", "node_cost", "plan_cost", "brute_force_frontier"]

COST_MODELS = ("exact", "paper")


@dataclass(frozen=True, eq=False)
class NodeCost:
    node: PNode
    floats_moved: int
    bytes_moved: int
    bytes_per_site: np.ndarray       # held by the node's output
    peak_bytes_per_site: np.ndarray  # inputs + output, while the node runs
    flops_per_site: np.ndarray
    tasks: int = 0                   # Dask tasks the lowering makes for this node

    @property
    def keys(self) -> int:
        return self.node.type.ntuples

    @property
    def tuples(self) -> int:
        """Physical tuples (a key on k sites counts k times)."""
        return self.node.layout.ntuples

    @property
    def frontier(self) -> tuple:
        return self.node.type.frontier

    def site_keys(self) -> list:
        """The keys each site holds after this node."""
        return self.node.layout.site_keys(self.node.type)


@dataclass(frozen=True, eq=False)
class Cost:
    model: str
    sites: int
    floats_moved: int
    bytes_moved: int
    peak_bytes_per_site: np.ndarray
    flops_per_site: np.ndarray
    nodes: dict = field(repr=False)  # PNode -> NodeCost

    @property
    def tasks(self) -> int:
        """Dask tasks the lowered plan runs (a tie-breaker: fewer is simpler)."""
        return sum(c.tasks for c in self.nodes.values())

    @property
    def tuples(self) -> int:
        """Physical tuples over all nodes (a tie-breaker: filters early, fewer copies)."""
        return sum(c.tuples for c in self.nodes.values())

    @property
    def flops_balance(self) -> float:
        """Busiest site's flops over the mean (1.0 = perfectly balanced)."""
        mean = float(self.flops_per_site.mean())
        return float(self.flops_per_site.max()) / mean if mean else 1.0

    def __repr__(self):
        return (f"Cost(model={self.model!r}, floats_moved={self.floats_moved:,}, bytes_moved={self.bytes_moved:,}, "
                f"peak_bytes_per_site={int(self.peak_bytes_per_site.max()):,}, "
                f"flops_per_site={self.flops_per_site.tolist()})")


def _floats_moved(node: PNode, model: str, need: np.ndarray) -> int:
    if not isinstance(node, (Broadcast, Shuffle)):
        return 0
    if model == "paper":
        # f: the floats of the relation; partial aggregates count once per copy
        inp = node.input
        f = int(inp.type.chunk_sizes[inp.layout.rows].sum()) if inp.layout.partial else inp.type.nelements
        return f * node.nsites if isinstance(node, Broadcast) else f
    lay = node.layout
    idx = np.flatnonzero(lay.moved & need)
    # one transfer per distinct (source object, destination): copies that share an
    # array (insert_dim, a pure rekey) travel once
    _, first = np.unique(lay.origin[idx], return_index=True)
    return int(node.type.chunk_sizes[lay.rows[idx[first]]].sum())


def _flops_per_site(node: PNode, need: np.ndarray) -> np.ndarray:
    s, lay = node.nsites, node.layout
    out = np.zeros(s, dtype=np.float64)
    if isinstance(node, LocalJoin):
        lp, rp = (a[need] for a in lay.lineage)
        lt, rt = node.left.type, node.right.type
        lsid = lt.shape_ids[node.left.layout.rows[lp]]
        rsid = rt.shape_ids[node.right.layout.rows[rp]]
        pair = lsid * len(rt.shapes) + rsid
        table = {int(c): node.kernel.flops(lt.shapes[c // len(rt.shapes)], rt.shapes[c % len(rt.shapes)])
                 for c in unique(pair)}
        w = np.array([table[int(c)] for c in pair], dtype=np.float64) if len(pair) else np.zeros(0)
        out += np.bincount(lay.sites[need], weights=w, minlength=s)
    elif isinstance(node, LocalAggregate) and isinstance(node.kernel, Kernel):
        (out_index,) = lay.lineage
        folds = np.bincount(out_index, minlength=lay.ntuples) - 1  # k inputs fold with k-1 calls
        t = node.type
        per_shape = np.array([node.kernel.flops(sh, sh) for sh in t.shapes], dtype=np.float64)
        w = (folds * per_shape[t.shape_ids[lay.rows]])[need]
        out += np.bincount(lay.sites[need], weights=w, minlength=s)
    elif isinstance(node, LocalMap) and isinstance(node.op, KeyArrayMap) and node.op.kernel is not None:
        it, ilay = node.input.type, node.input.layout
        runs = np.zeros(ilay.ntuples, dtype=bool)  # the kernel runs once per input tuple in use
        runs[lay.lineage[0][need]] = True
        per_shape = np.array([node.op.kernel.flops(sh) for sh in it.shapes], dtype=np.float64)
        out += np.bincount(ilay.sites[runs], weights=per_shape[it.shape_ids[ilay.rows[runs]]], minlength=s)
    return out


def _bytes_per_site(node: PNode, need: np.ndarray) -> np.ndarray:
    lay, t = node.layout, node.type
    idx = np.flatnonzero(need)
    _, first = np.unique(lay.origin[idx], return_index=True)  # a shared array is held once
    idx = idx[first]
    w = t.chunk_sizes[lay.rows[idx]] * t.dtype.itemsize
    return np.bincount(lay.sites[idx], weights=w, minlength=lay.nsites).astype(np.int64)


def node_cost(node: PNode, model: str = "exact", need: dict | None = None) -> NodeCost:
    """Cost of one node; ``need`` is the plan's demand (default: every tuple)."""
    if model not in COST_MODELS:
        raise ValueError(f"unknown cost_model {model!r}; valid: {', '.join(COST_MODELS)}")
    if need is None:
        need = {n: np.ones(n.layout.ntuples, dtype=bool) for n in (node, *node.children)}
    held = _bytes_per_site(node, need[node])
    peak = held + sum((_bytes_per_site(c, need[c]) for c in node.children), np.zeros(node.nsites, dtype=np.int64))
    floats = _floats_moved(node, model, need[node])
    return NodeCost(node, floats, floats * node.type.dtype.itemsize, held, peak,
                    _flops_per_site(node, need[node]), _tasks(node, need[node]))


def _tasks(node: PNode, need: np.ndarray) -> int:
    """Tasks the lowering makes: one per needed array it creates (tuples that share
    an array — aliases, copies of one kernel call, one transfer — are one task)."""
    from ..logical.sources import ClusterSource, FromFunction
    from ..physical import LocalFilter, PSource

    lay = node.layout
    if isinstance(node, LocalFilter) or (isinstance(node, LocalMap) and isinstance(node.op, KeyArrayMap)
                                         and node.op.kernel is None):
        return 0
    if isinstance(node, PSource):
        return int(need.sum()) if isinstance(node.source, FromFunction) else 0
    if isinstance(node, (Broadcast, Shuffle)):
        return len(unique(lay.origin[lay.moved & need]))
    if isinstance(node, LocalAggregate):
        members = np.bincount(lay.lineage[0], minlength=lay.ntuples)
        return int((need & (members > 1)).sum())
    _ = ClusterSource
    return len(unique(lay.origin[need]))


_MEMO: "OrderedDict" = None  # (node, model, demand masks) -> NodeCost; the search re-costs shared subtrees


def _node_cost_memo(node: PNode, model: str, need: dict) -> NodeCost:
    global _MEMO
    if _MEMO is None:
        from collections import OrderedDict

        _MEMO = OrderedDict()
    key = (node, model, need[node].tobytes(), tuple(need[c].tobytes() for c in node.children))
    hit = _MEMO.get(key)
    if hit is not None and hit.node is node:
        _MEMO.move_to_end(key)
        return hit
    out = node_cost(node, model, need)
    _MEMO[key] = out
    if len(_MEMO) > 50_000:
        _MEMO.popitem(last=False)
    return out


def plan_cost(outputs, model: str = "exact") -> Cost:
    """Cost of the plan whose results are ``outputs`` (shared nodes counted once)."""
    nodes = toposort(outputs)
    need = demand(outputs)
    per = {n: _node_cost_memo(n, model, need) for n in nodes}
    if model == "exact":
        per = _one_transfer_per_array_and_site(nodes, need, per)
    s = nodes[0].nsites if nodes else 1
    return Cost(
        model, s,
        sum(c.floats_moved for c in per.values()),
        sum(c.bytes_moved for c in per.values()),
        np.max([c.peak_bytes_per_site for c in per.values()], axis=0) if per else np.zeros(s, np.int64),
        np.sum([c.flops_per_site for c in per.values()], axis=0) if per else np.zeros(s),
        per,
    )


def _one_transfer_per_array_and_site(nodes, need, per):
    """Two moves of one array to one site (from different Broadcast/Shuffle nodes)
    are one transfer on a cluster: the worker already holds it.  Count it for the
    first node (in plan order) that moves it."""
    import dataclasses

    seen: set = set()
    out = dict(per)
    for n in nodes:
        if not isinstance(n, (Broadcast, Shuffle)):
            continue
        lay = n.layout
        idx = np.flatnonzero(lay.moved & need[n])
        src_origin = n.input.layout.origin[lay.lineage[0][idx]]
        floats = 0
        for o, d, i in zip(src_origin.tolist(), lay.sites[idx].tolist(), idx.tolist()):
            if (o, d) not in seen:
                seen.add((o, d))
                floats += int(n.type.chunk_sizes[lay.rows[i]])
        if floats != per[n].floats_moved:
            out[n] = dataclasses.replace(per[n], floats_moved=floats, bytes_moved=floats * n.type.dtype.itemsize)
    return out


def brute_force_frontier(node: PNode) -> tuple:
    """The paper's frontier inference for a LocalFilter or LocalMap (§5.3): feed every
    key below the *input's frontier* to the predicate or key function and take one
    past the largest value per dim.  It assumes a continuous input, as the paper does;
    the exact key sets (``node.type``) need no such assumption — tests check the two
    agree."""
    from ..physical import LocalFilter

    f_in = node.input.type.frontier
    grid = np.indices(f_in).reshape(len(f_in), -1).T if f_in else np.zeros((1, 0), np.int64)
    if isinstance(node, LocalFilter):
        keys = grid[np.asarray(node.pred.evaluate(grid), dtype=bool)]
    elif isinstance(node, LocalMap) and isinstance(node.op, KeyArrayMap):
        keys, _ = node.op.key_fn.apply(grid)
    else:
        raise TypeError(f"brute-force frontier inference is for LocalFilter and LocalMap, not {node._op}")
    if len(keys) == 0:
        return (0,) * node.type.arity
    return tuple(int(v) + 1 for v in keys.max(axis=0))
