"""Work: THE derivation of what a physical plan does — which tasks run on which
site, with which inputs, and which arrays travel between sites.

The cost model counts it (``optimizer.cost``: tasks) and the lowering emits it
(``tra_dask.lowering``: one Dask task per task here, nothing else), so the tasks a
plan is predicted to run are the tasks it runs, by construction.

Each physical tuple ``i`` of a node (an entry of ``node.layout``) the plan needs
(:func:`~tra_dask.physical.demand`) is either

* made by a **task** of the node (``made_by[i]``: its index in the node's task
  list), or
* an **alias**: it *is* a tuple of the node's input (``alias[i]``, an index into
  ``node.children[0].layout``) — a filter, a pure rekey, a tuple a Broadcast or
  Shuffle leaves where it is, the one member of an aggregation group (a fold or a
  concatenation of one chunk is that chunk), or
* **resident**: a chunk already on the cluster (a ``ClusterSource``).

A task is ``(kind, site, tuple, inputs)``: ``kind`` is the same for every task of a
node — ``"load"`` (a ``from_function`` chunk made on its site), ``"scatter"`` (a chunk
the client places on its site: data, not a graph task), ``"transfer"`` (an array
arriving at a site), ``"kernel"`` (a join's binary kernel, or a map's unary kernel,
run once per input tuple and shared by the map's output keys), ``"fold"`` (an
aggregation group of two or more, folded left in key order), ``"concat"`` (a concat
group of two or more, in ``key_dim`` order) or ``"tile"`` (one slice of a chunk);
``tuple`` is the first physical tuple the task makes (its Dask key is
``(name, tuple)``); ``inputs`` are ``(child position, child tuple)`` pairs in call order.

Tuples that share an array share its task: copies a map's kernel makes for its m
output keys, and within one Broadcast/Shuffle, tuples holding one array (layout
``origin``) bound for one site travel as one transfer.  Across the whole plan an
array travels to a site once (:class:`PlanWork`): the first Broadcast/Shuffle in plan
order that sends it makes the transfer, a later one that sends the same array to the
same site makes a local copy task reading the first's copy (``via``) — so each
node's task count is its own (the cost model costs a node alone) and the bytes a
plan moves are counted once, where the exact cost model counts them.

No dask here: this module is pure numpy over layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..logical.sources import ClusterSource, FromFunction
from ..node import toposort
from .demand import demand, result_copies
from .nodes import (Broadcast, ConcatAgg, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode, PSource, Shuffle,
                    TileMap)

__all__ = ["Task", "Transfer", "NodeWork", "PlanWork", "node_work", "plan_work", "TASK_KINDS", "FUSABLE_KINDS"]

TASK_KINDS = ("load", "transfer", "kernel", "fold", "concat", "tile")  # the kinds that are graph tasks
FUSABLE_KINDS = ("kernel", "fold", "concat", "tile")  # local computations: fused into their one reader
_EMPTY = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Task:
    """One task, for reading: ``inputs`` are ``(child position, child tuple)``."""

    kind: str
    site: int
    tuple: int
    inputs: tuple


@dataclass(frozen=True)
class Transfer:
    """One array arriving at a site: the ``tuple``-th input tuple of ``node``'s
    child (the array ``array``, a layout origin) goes from ``src`` to ``dest``."""

    node: PNode
    task: int
    array: int
    src: int
    dest: int
    floats: int
    bytes: int


class NodeWork:
    """The work of one node given which of its tuples are needed (see the module doc).

    Arrays (numpy, aligned with ``node.layout``'s tuples): ``made_by``, ``alias``.
    Aligned with the task list: ``task_tuple``, ``task_site``; the inputs of task
    ``t`` are ``in_child[in_ptr[t]:in_ptr[t+1]]`` / ``in_tuple[...]`` (computed on
    first use: counting needs only the task list)."""

    def __init__(self, node: PNode, need: np.ndarray | None = None):
        lay = node.layout
        self.node = node
        self.need = np.ones(lay.ntuples, bool) if need is None else np.asarray(need, dtype=bool)
        self.made_by = np.full(lay.ntuples, -1, dtype=np.int64)
        self.alias = np.full(lay.ntuples, -1, dtype=np.int64)
        self.resident = False
        self.kind = ""
        self.task_tuple = _EMPTY
        _DERIVE[type(node)](self, node)
        self.task_site = lay.sites[self.task_tuple]

    # -- the task list ---------------------------------------------------------------------------------
    def _one_task_per_needed(self, kind: str):
        self._one_task_each(kind, np.flatnonzero(self.need))

    def _one_task_each(self, kind: str, idx: np.ndarray):
        """Each of the tuples ``idx`` (ascending) is made by a task of its own."""
        self.kind = kind
        self.task_tuple = idx
        self.made_by[idx] = np.arange(len(idx))

    def _one_task_per_group(self, kind: str, code: np.ndarray, idx: np.ndarray):
        """Tuples ``idx`` with equal ``code`` share one task, named by the first."""
        self.kind = kind
        if not len(idx):
            return
        n = len(code)
        lo = int(code.min())
        span = int(code.max()) - lo + 1
        if span <= 4 * n + 1024:  # codes in a dense range (fresh ids are): a table, no sort
            c = code - lo
            at = np.empty(span, dtype=np.int64)
            at[c[::-1]] = np.arange(n - 1, -1, -1, dtype=np.int64)  # a repeated index keeps the last write
            first_of = at[c]  # each tuple's group, named by its first tuple's position
            del at, c
            is_first = first_of == np.arange(n)
            self.task_tuple = idx[is_first]  # tasks in tuple order
            self.made_by[idx] = (np.cumsum(is_first) - 1)[first_of]
            return
        order = np.argsort(code, kind="stable")  # sort-based: np.unique is slow on many ints
        v = code[order]
        new = np.r_[True, v[1:] != v[:-1]]
        inv = np.empty(len(idx), dtype=np.int64)
        inv[order] = np.cumsum(new) - 1    # group of each tuple
        first = order[new]                 # the group's first tuple (the sort is stable)
        by_pos = np.argsort(first)         # tasks in tuple order
        rank = np.empty(len(first), dtype=np.int64)
        rank[by_pos] = np.arange(len(first))
        self.task_tuple = idx[first[by_pos]]
        self.made_by[idx] = rank[inv]

    @property
    def ntasks(self) -> int:
        """Graph tasks (scattered chunks are data, not tasks)."""
        return len(self.task_tuple) if self.kind in TASK_KINDS else 0

    @cached_property
    def _inputs(self):
        return _INPUTS[type(self.node)](self)

    @property
    def in_ptr(self) -> np.ndarray:
        return self._inputs[0]

    @property
    def in_child(self) -> np.ndarray:
        return self._inputs[1]

    @property
    def in_tuple(self) -> np.ndarray:
        return self._inputs[2]

    def task_inputs(self, t: int) -> list:
        a, b = int(self.in_ptr[t]), int(self.in_ptr[t + 1])
        return list(zip(self.in_child[a:b].tolist(), self.in_tuple[a:b].tolist()))

    def tasks(self) -> list[Task]:
        return [Task(self.kind, int(s), int(i), tuple(self.task_inputs(t)))
                for t, (s, i) in enumerate(zip(self.task_site.tolist(), self.task_tuple.tolist()))]

    # -- transfers (Broadcast / Shuffle) ---------------------------------------------------------------
    @cached_property
    def task_array(self) -> np.ndarray:
        """For a move: the array (input layout origin) each task carries."""
        ilay = self.node.children[0].layout
        return ilay.origin[self.node.layout.lineage[0][self.task_tuple]]

    @cached_property
    def task_src(self) -> np.ndarray:
        """For a move: the site each task's array comes from."""
        ilay = self.node.children[0].layout
        return ilay.sites[self.node.layout.lineage[0][self.task_tuple]]

    @cached_property
    def task_floats(self) -> np.ndarray:
        """For a move: the elements each task carries."""
        t = self.node.type
        return t.chunk_sizes[self.node.layout.rows[self.task_tuple]].astype(np.int64)

    def __repr__(self):
        return (f"<NodeWork {self.node._op}: {len(self.task_tuple)} {self.kind or 'no'} task(s), "
                f"{int((self.alias >= 0).sum())} alias(es)>")


def node_work(node: PNode, need: np.ndarray | None = None) -> NodeWork:
    """The work of ``node`` alone, for the needed tuples ``need`` (default all)."""
    return NodeWork(node, need)


# -- per node type: which tuples are tasks, which are aliases ---------------------------------------------


def _derive_source(w: NodeWork, node: PSource):
    if isinstance(node.source, ClusterSource):
        w.resident = True  # already on the cluster under its own keys
        return
    w._one_task_per_needed("load" if isinstance(node.source, FromFunction) else "scatter")


def _derive_move(w: NodeWork, node):
    lay = node.layout
    (src,) = lay.lineage
    stay = np.flatnonzero(~lay.moved & w.need)
    w.alias[stay] = src[stay]  # already on its destination: the input's tuple itself
    idx = np.flatnonzero(lay.moved & w.need)
    if lay.origins_distinct():
        # a moved tuple's object is new per (source object, destination site)
        # (layout.fresh_per_class): distinct objects are distinct groups, a task each
        # — what grouping finds, without sorting the codes of 10^7 broadcast tuples
        w._one_task_each("transfer", idx)
        return
    origin = node.input.layout.origin[src[idx]]
    w._one_task_per_group("transfer", origin * lay.nsites + lay.sites[idx], idx)


def _derive_join(w: NodeWork, node: LocalJoin):
    w._one_task_per_needed("kernel")


def _derive_aggregate(w: NodeWork, node: LocalAggregate):
    lay = node.layout
    (out_index,) = lay.lineage
    members = np.bincount(out_index, minlength=lay.ntuples)
    one = np.flatnonzero(w.need & (members == 1))
    if len(one):  # a group of one is its member: nothing to fold or concatenate
        member = np.full(lay.ntuples, -1, dtype=np.int64)
        member[out_index] = np.arange(len(out_index))
        w.alias[one] = member[one]
    w.kind = "concat" if isinstance(node.kernel, ConcatAgg) else "fold"
    w.task_tuple = np.flatnonzero(w.need & (members > 1))
    w.made_by[w.task_tuple] = np.arange(len(w.task_tuple))


def _derive_filter(w: NodeWork, node: LocalFilter):
    w.alias[w.need] = node.layout.lineage[0][w.need]


def _derive_map(w: NodeWork, node: LocalMap):
    (src,) = node.layout.lineage
    op = node.op
    if isinstance(op, TileMap):
        w._one_task_per_needed("tile")
    elif op.kernel is None:  # a pure rekey: the input's arrays under new keys
        w.alias[w.need] = src[w.need]
    else:  # the kernel runs once per input array on its site; its output keys share the result
        idx = np.flatnonzero(w.need)
        inp = node.input.layout
        if inp.origins_distinct():
            w._one_task_per_group("kernel", src[idx], idx)
        else:  # copies of one array (an insert_dim's) make one call (layout: expand_layout)
            w._one_task_per_group("kernel", inp.origin[src[idx]].astype(np.int64) * inp.nsites + inp.sites[src[idx]],
                                  idx)


_DERIVE = {
    PSource: _derive_source, Broadcast: _derive_move, Shuffle: _derive_move, LocalJoin: _derive_join,
    LocalAggregate: _derive_aggregate, LocalFilter: _derive_filter, LocalMap: _derive_map,
}


# -- per node type: the inputs of each task ----------------------------------------------------------------


def _csr(per_task: list) -> tuple:
    """``[[(child, tuple), ...] per task]`` -> (in_ptr, in_child, in_tuple)."""
    ptr = np.zeros(len(per_task) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in per_task])
    flat = [p for x in per_task for p in x]
    child = np.array([c for c, _ in flat], dtype=np.int64)
    tup = np.array([i for _, i in flat], dtype=np.int64)
    return ptr, child, tup


def _one_input(w: NodeWork, of: np.ndarray) -> tuple:
    n = len(w.task_tuple)
    return np.arange(n + 1, dtype=np.int64), np.zeros(n, np.int64), of[w.task_tuple].astype(np.int64)


def _inputs_none(w: NodeWork):
    n = len(w.task_tuple)
    return np.zeros(n + 1, np.int64), _EMPTY, _EMPTY


def _inputs_lineage(w: NodeWork):
    return _one_input(w, w.node.layout.lineage[0])


def _inputs_join(w: NodeWork):
    lp, rp = w.node.layout.lineage
    n = len(w.task_tuple)
    child = np.tile(np.array([0, 1], dtype=np.int64), n)
    tup = np.stack([lp[w.task_tuple], rp[w.task_tuple]], axis=1).reshape(-1).astype(np.int64)
    return np.arange(0, 2 * n + 1, 2, dtype=np.int64), child, tup


def _inputs_aggregate(w: NodeWork):
    node = w.node
    (out_index,) = node.layout.lineage
    ilay, it = node.input.layout, node.input.type
    # fold in key order, so a non-commutative kernel folds as the reference evaluator does
    order = np.lexsort(tuple(it.keys[ilay.rows].T[::-1])) if it.arity else np.arange(ilay.ntuples)
    if isinstance(node.kernel, ConcatAgg):  # concatenate in key_dim order (stable: key order within)
        kd = it.keys[ilay.rows[order], node.kernel.key_dim]
        order = order[np.argsort(kd, kind="stable")]
    members: dict = {}
    for p in order.tolist():
        members.setdefault(int(out_index[p]), []).append(p)
    return _csr([[(0, p) for p in members[i]] for i in w.task_tuple.tolist()])


_INPUTS = {
    PSource: _inputs_none, Broadcast: _inputs_lineage, Shuffle: _inputs_lineage, LocalJoin: _inputs_join,
    LocalAggregate: _inputs_aggregate, LocalFilter: _inputs_none, LocalMap: _inputs_lineage,
}


# -- the whole plan ----------------------------------------------------------------------------------------


class PlanWork:
    """The work of a plan whose results are ``outputs``: every node's
    :class:`NodeWork` under the plan's demand, in plan (topological) order, and the
    arrays that travel between sites, once per (array, destination site).

    ``via[(node, t)] = (first node, its task)`` for a transfer task that another
    Broadcast/Shuffle earlier in plan order already made: it reads that copy on its
    own site and moves no bytes.  ``transfers`` lists the real ones.

    **Fusion** (after placement: it changes no site, no transfer and no byte).
    ``into[(node, t)] = (consumer node, its task)`` for a task that runs *inside*
    its reader, as a nested call, instead of as a Dask task of its own.  A task is
    fused into its reader when

    * both are local computations (:data:`FUSABLE_KINDS`) on the same site;
    * the reader is its only reader in the plan (one input slot of one task), and
      it is not a result (results are futures the user holds);
    * fusing delays no transfer's consumer: every *other* input of the reader
      depends on no transfer (else the fused task, which could have run while the
      bytes travelled, would wait for them inside the reader);
    * ``threads > 1`` (workers that run several tasks at once): a reader takes in
      at most one task, so that no two tasks that could run side by side run one
      after the other inside it.

    Chains fuse transitively (a reader fused into its own reader takes its fused
    inputs along).  ``ntasks`` counts the Dask tasks that remain; ``fused=False``
    turns the pass off."""

    def __init__(self, outputs, *, fuse: bool = True, threads: int = 1):
        self.outputs = tuple(outputs)
        self.order = toposort(self.outputs)
        self.need = demand(self.outputs)
        self.nodes = {n: NodeWork(n, self.need[n]) for n in self.order}
        self.via: dict = {}
        self.first: dict = {}  # (array, destination site) -> (node, task) that moves it
        self.transfers: list[Transfer] = []
        for n in self.order:
            w = self.nodes[n]
            if w.kind != "transfer":
                continue
            itemsize = n.type.dtype.itemsize
            for t, (a, s, d, f) in enumerate(zip(w.task_array.tolist(), w.task_src.tolist(),
                                                 w.task_site.tolist(), w.task_floats.tolist())):
                k = (a, d)
                if k in self.first:
                    self.via[(n, t)] = self.first[k]
                else:
                    self.first[k] = (n, t)
                    self.transfers.append(Transfer(n, t, a, s, d, f, f * itemsize))
        self.into: dict = _fusion(self, threads) if fuse else {}

    def __getitem__(self, node: PNode) -> NodeWork:
        return self.nodes[node]

    @property
    def ntasks(self) -> int:
        """Dask tasks the plan runs (a task fused into its reader is not one)."""
        return sum(w.ntasks for w in self.nodes.values()) - len(self.into)

    def fused_in(self, node: PNode) -> int:
        """How many of ``node``'s tasks run inside their readers."""
        return sum(1 for n, _ in self.into if n is node)

    def producer(self, node: PNode, i: int):
        """``(node, task)`` that makes ``node``'s tuple ``i`` (through aliases), or
        None for data: a scattered or cluster-resident chunk."""
        while True:
            w = self.nodes[node]
            t = int(w.made_by[i])
            if t >= 0:
                return (node, t) if w.kind in TASK_KINDS else None
            a = int(w.alias[i])
            if a < 0:
                return None  # resident
            node, i = node.children[0], a

    @property
    def floats_moved(self) -> int:
        return sum(x.floats for x in self.transfers)

    @property
    def bytes_moved(self) -> int:
        return sum(x.bytes for x in self.transfers)

    def tasks(self, node: PNode) -> list[Task]:
        """``node``'s tasks; a transfer another node already made reads as a ``"copy"``."""
        out = self.nodes[node].tasks()
        if self.nodes[node].kind == "transfer":
            out = [Task("copy", x.site, x.tuple, x.inputs) if (node, t) in self.via else x
                   for t, x in enumerate(out)]
        return out

    def __repr__(self):
        return (f"<PlanWork: {len(self.order)} nodes, {self.ntasks} tasks, {len(self.transfers)} transfers "
                f"({self.bytes_moved:,} bytes)>")


def plan_work(outputs, *, fuse: bool = True, threads: int = 1) -> PlanWork:
    """The work of the plan whose results are ``outputs`` (PNodes, or a Plan)."""
    if hasattr(outputs, "outputs"):
        outputs = outputs.outputs
    return PlanWork(outputs, fuse=fuse, threads=threads)


def _fusion(work: PlanWork, threads: int) -> dict:
    """``{(node, task): (reader node, its task)}``: the tasks that run inside their
    one reader (the rules are in :class:`PlanWork`'s doc)."""
    inputs: dict = {}   # graph task -> its inputs' producers (None: data), in call order
    readers: dict = {}  # graph task -> how many input slots read it
    late: dict = {}     # graph task -> depends on a transfer
    for n in work.order:
        w = work.nodes[n]
        if not w.ntasks:
            continue
        kids = n.children
        for t in range(len(w.task_tuple)):
            first = work.via.get((n, t))
            if first is not None:
                ins = [first]
            else:
                a, b = int(w.in_ptr[t]), int(w.in_ptr[t + 1])
                ins = [work.producer(kids[c], i) for c, i in zip(w.in_child[a:b].tolist(), w.in_tuple[a:b].tolist())]
            inputs[(n, t)] = ins
            for p in ins:
                if p is not None:
                    readers[p] = readers.get(p, 0) + 1
            late[(n, t)] = w.kind == "transfer" or any(late[p] for p in ins if p is not None)
    results = set()
    for o in work.outputs:
        for i in result_copies(o.layout, o.type.ntuples).tolist():
            results.add(work.producer(o, i))
    into: dict = {}
    for c, ins in inputs.items():
        wc = work.nodes[c[0]]
        if wc.kind not in FUSABLE_KINDS:
            continue
        site = int(wc.task_site[c[1]])
        for j, p in enumerate(ins):
            if p is None or readers[p] != 1 or p in results:
                continue
            wp = work.nodes[p[0]]
            if wp.kind not in FUSABLE_KINDS or int(wp.task_site[p[1]]) != site:
                continue
            if any(late[q] for k, q in enumerate(ins) if k != j and q is not None):
                continue
            into[p] = c
            if threads > 1:
                break
    return into
