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

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..kernels import flop_factor
from ..logical.sources import ClusterSource, FromFunction
from ..node import toposort
from ..types import first_of_each, sorting_permutation, unique
from .demand import child_demand, demand, mask_digest, result_copies
from .layout import _is_iota, iota
from .nodes import (Broadcast, ConcatAgg, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PNode, PSource, Shuffle,
                    TileMap)

__all__ = ["Fusion", "Task", "Transfer", "NodeWork", "PlanWork", "FusedCounts", "node_work", "plan_work", "first_moves",
           "TASK_KINDS", "FUSABLE_KINDS"]

TASK_KINDS = ("load", "transfer", "kernel", "fold", "concat", "tile")  # the kinds that are graph tasks
FUSABLE_KINDS = ("kernel", "fold", "concat", "tile")  # local computations: fused into their one reader
# A task takes in chains of fused calls at most this deep: a Dask task is pickled (and
# run) by recursion, and a chain of 1000 elementwise steps fused into one task did not
# pickle; at this depth a chain is one task per this many steps.
MAX_FUSED_DEPTH = 64
_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY_CHILD = np.zeros(0, dtype=np.int8)


def index_dtype(n: int) -> np.dtype:
    """The integer type of an array of positions below ``n`` (tuples, tasks, slots):
    int32 while they fit.  A plan of 10^7-10^8 tuples holds a dozen such arrays per
    tuple, and halving them halves the planner's memory and the time it spends
    touching it.  Arithmetic that can exceed ``n`` (codes, sums of ids) widens first."""
    return np.dtype(np.int32) if n < 2**31 - 1 else np.dtype(np.int64)


@dataclass(frozen=True)
class Fusion:
    """What the fusion pass (:class:`PlanWork`) needs to know of the cluster:
    ``threads`` per worker, and which tasks are cheap — ``task_seconds(node_work)``
    gives the seconds each of a node's tasks runs (None: no task is cheap and no
    late task fuses), and a
    task fused with its fused inputs of at most ``cheap_below`` seconds is cheap;
    ``granules``: a reader whose work, with all it could take in, is at most
    ``1/granules`` of its site's work on its node takes in late tasks too (0: never;
    see :class:`PlanWork`)."""

    threads: int = 1
    task_seconds: object = None
    cheap_below: float = 0.0
    granules: int = 0


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
        ix = index_dtype(max(lay.ntuples, max((c.layout.ntuples for c in node.children), default=0)))
        # (task positions, input tuple positions: below the tuples; -1 everywhere is a
        # read-only view of one -1, made writable by the first write: _own)
        self.made_by = np.broadcast_to(np.array(-1, dtype=ix), (lay.ntuples,))
        self.alias = self.made_by
        self.resident = False
        self.kind = ""
        self.task_tuple = _EMPTY
        _DERIVE[type(node)](self, node)
        self.task_tuple = self.task_tuple.astype(ix, copy=False)  # (ascending: tasks in tuple order)
        # a task per tuple: the sites are the layout's (no gather of 10^7 of them)
        sites = lay.sites if len(self.task_tuple) == lay.ntuples else lay.sites[self.task_tuple]
        self.task_site = sites.astype(index_dtype(lay.nsites), copy=False)
        self._seconds: tuple = (None, None)

    def seconds(self, task_seconds) -> np.ndarray:
        """``task_seconds(self)`` (the seconds of each task), remembered for the last
        function asked (a cluster's: :attr:`Fusion.task_seconds`)."""
        f, got = self._seconds
        if f is not task_seconds:
            got = task_seconds(self)
            self._seconds = (task_seconds, got)
        return got

    # -- the task list ---------------------------------------------------------------------------------
    def _own(self, name: str) -> np.ndarray:
        """``made_by`` or ``alias``, writable (a copy, on first write, of a shared
        read-only array: the -1s, or a layout's positions)."""
        a = getattr(self, name)
        if not a.flags.writeable:
            a = np.array(a)
            setattr(self, name, a)
        return a

    def _aliases(self, of: np.ndarray):
        """The needed tuples are the input's tuples ``of`` (the others: none)."""
        if self.need.all():
            self.alias = of.astype(self.alias.dtype, copy=False)
        else:
            self._own("alias")[self.need] = of[self.need]

    def _one_task_per_needed(self, kind: str):
        self._one_task_each(kind, iota(len(self.need)) if self.need.all() else np.flatnonzero(self.need))

    def _one_task_each(self, kind: str, idx: np.ndarray):
        """Each of the tuples ``idx`` (ascending) is made by a task of its own."""
        self.kind = kind
        self.task_tuple = idx
        if len(idx) == len(self.made_by):  # every tuple: tuple i is task i (idx is 0 .. n-1)
            self.made_by = idx.astype(self.made_by.dtype, copy=False)
        else:
            self._own("made_by")[idx] = np.arange(len(idx))

    def _one_task_per_group(self, kind: str, code: np.ndarray, idx: np.ndarray):
        """Tuples ``idx`` with equal ``code`` share one task, named by the first."""
        self.kind = kind
        if not len(idx):
            return
        ix = index_dtype(len(code))
        first_of = first_of_each(code, ix)  # each tuple's group, named by its first tuple's position
        is_first = first_of == np.arange(len(code), dtype=ix)
        self.task_tuple = idx[is_first]  # tasks in tuple order
        rank = np.cumsum(is_first, dtype=ix)
        rank -= 1
        self._own("made_by")[idx] = rank[first_of]

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
    def slots_per_task(self) -> "int | None":
        """How many inputs each task reads when every task reads as many, child by
        child (a join's 2, a move's or a map's 1, 0 for none); None when they vary
        (an aggregation's members)."""
        return _SLOTS_PER_TASK.get(type(self.node))

    @property
    def nslots(self) -> int:
        """Input slots of all the tasks (counted without listing them where each task has as many)."""
        k = self.slots_per_task
        return k * len(self.task_tuple) if k is not None else len(self.in_tuple)

    def fixed_slots(self, t0: int, t1: int) -> list:
        """``[(child, its tuples), ...]``: for each input slot of a task (where
        :attr:`slots_per_task` is not None), the tuple tasks ``t0 .. t1-1`` read
        there — ``in_child``/``in_tuple`` of those tasks without listing them (a 3-D
        multiply's join: two slots for each of 10^7 tasks)."""
        if self.slots_per_task == 0:
            return []
        lay = self.node.layout
        whole = len(self.task_tuple) == lay.ntuples  # a task per tuple: task t makes tuple t
        tt = None if whole else self.task_tuple[t0:t1]
        return [(c, lin[t0:t1] if whole else lin[tt]) for c, lin in enumerate(lay.lineage[:self.slots_per_task])]

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
        return ilay.origin_at(self.node.layout.lineage[0][self.task_tuple])

    @cached_property
    def task_src(self) -> np.ndarray:
        """For a move: the site each task's array comes from."""
        ilay = self.node.children[0].layout
        return ilay.sites[self.node.layout.lineage[0][self.task_tuple]]

    @cached_property
    def task_floats(self) -> np.ndarray:
        """For a move: the elements each task carries."""
        t = self.node.type
        if len(t.shapes) == 1:  # one chunk size: no gather
            return np.full(len(self.task_tuple), int(t.shape_sizes[0]), dtype=np.int64)
        return t.chunk_sizes[self.node.layout.rows[self.task_tuple]].astype(np.int64)

    @cached_property
    def task_flops(self) -> np.ndarray:
        """Kernel flops of each task (its kernel's ``flops`` of its inputs' chunk
        shapes; a fold of k chunks is k-1 calls); 0 for loads, transfers,
        concatenations and tiles (copies: their cost is the array they make)."""
        node, n = self.node, len(self.task_tuple)
        if not n or self.kind not in ("kernel", "fold"):
            return np.zeros(n)
        lay = node.layout
        # (real flops: a complex multiply-add counts 4, kernels.flop_factor)
        if isinstance(node, LocalJoin):
            lt, rt = node.left.type, node.right.type
            f = flop_factor(node.kernel, (lt.dtype, rt.dtype, node.type.dtype))
            ns = len(rt.shapes)
            if len(lt.shapes) * ns == 1:  # one shape pair: every task runs the same kernel call (a view of one)
                return np.broadcast_to(f * float(node.kernel.flops(lt.shapes[0], rt.shapes[0])), (n,))
            lp, rp = (a[self.task_tuple] for a in lay.lineage)
            pair = lt.shape_ids[node.left.layout.rows[lp]] * ns + rt.shape_ids[node.right.layout.rows[rp]]
            return f * _per_code(pair, lambda c: node.kernel.flops(lt.shapes[c // ns], rt.shapes[c % ns]))
        if isinstance(node, LocalAggregate):  # a fold: k members, k - 1 calls on the output's shape
            t = node.type
            calls = np.bincount(lay.lineage[0], minlength=lay.ntuples)[self.task_tuple] - 1
            sid = t.shape_ids[lay.rows[self.task_tuple]]
            f = flop_factor(node.kernel, (t.dtype,))
            return f * calls * _per_code(sid, lambda c: node.kernel.flops(t.shapes[c], t.shapes[c]))
        it, ilay = node.input.type, node.input.layout  # a map's kernel: once per input array
        f = flop_factor(node.op.kernel, (it.dtype, node.type.dtype))
        if len(it.shapes) == 1:
            return np.broadcast_to(f * float(node.op.kernel.flops(it.shapes[0])), (n,))
        sid = it.shape_ids[ilay.rows[lay.lineage[0][self.task_tuple]]]
        return f * _per_code(sid, lambda c: node.op.kernel.flops(it.shapes[c]))

    def __repr__(self):
        return (f"<NodeWork {self.node._op}: {len(self.task_tuple)} {self.kind or 'no'} task(s), "
                f"{int((self.alias >= 0).sum())} alias(es)>")


def _per_code(code: np.ndarray, value) -> np.ndarray:
    """``value(c)`` for each entry of ``code`` (small non-negative ints: shape ids),
    called once per distinct code."""
    if not len(code):
        return np.zeros(0)
    table = np.zeros(int(code.max()) + 1)
    for c in unique(code).tolist():
        table[c] = value(c)
    return table[code]


def node_work(node: PNode, need: np.ndarray | None = None, *, works: dict | None = None,
              digest: bytes | None = None) -> NodeWork:
    """The work of ``node`` alone, for the needed tuples ``need`` (default all);
    ``works``: a caller's cache of node works by ``(node, digest of need)`` to take it
    from or put it in (``digest``: ``mask_digest(need)``, when the caller has it) — a
    NodeWork is never changed once made."""
    if works is None:
        return NodeWork(node, need)
    key = (node, mask_digest(need) if digest is None else digest)
    w = works.get(key)
    if w is None:
        w = works[key] = NodeWork(node, need)
    return w


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
    if len(stay):
        w._own("alias")[stay] = src[stay]  # already on its destination: the input's tuple itself
    idx = np.flatnonzero(lay.moved & w.need)
    if lay.origins_distinct():
        # a moved tuple's object is new per (source object, destination site)
        # (layout.fresh_per_class): distinct objects are distinct groups, a task each
        # — what grouping finds, without sorting the codes of 10^7 broadcast tuples
        w._one_task_each("transfer", idx)
        return
    origin = node.input.layout.origin_at(src[idx])
    w._one_task_per_group("transfer", origin * lay.nsites + lay.sites[idx], idx)


def _derive_join(w: NodeWork, node: LocalJoin):
    w._one_task_per_needed("kernel")


def _derive_aggregate(w: NodeWork, node: LocalAggregate):
    lay = node.layout
    (out_index,) = lay.lineage
    members = np.bincount(out_index, minlength=lay.ntuples)
    one = np.flatnonzero(w.need & (members == 1))
    if len(one):  # a group of one is its member: nothing to fold or concatenate
        member = np.full(lay.ntuples, -1, dtype=w.alias.dtype)
        member[out_index] = np.arange(len(out_index))
        w._own("alias")[one] = member[one]
    w.kind = "concat" if isinstance(node.kernel, ConcatAgg) else "fold"
    w.task_tuple = np.flatnonzero(w.need & (members > 1))
    if len(w.task_tuple):
        w._own("made_by")[w.task_tuple] = np.arange(len(w.task_tuple))


def _derive_filter(w: NodeWork, node: LocalFilter):
    w._aliases(node.layout.lineage[0])


def _derive_map(w: NodeWork, node: LocalMap):
    (src,) = node.layout.lineage
    op = node.op
    if isinstance(op, TileMap):
        w._one_task_per_needed("tile")
    elif op.kernel is None:  # a pure rekey: the input's arrays under new keys
        w._aliases(src)
    else:  # the kernel runs once per input array on its site; its output keys share the result
        idx = np.flatnonzero(w.need)
        inp = node.input.layout
        if inp.origins_distinct():
            w._one_task_per_group("kernel", src[idx], idx)
        else:  # copies of one array (an insert_dim's) make one call (layout: expand_layout)
            w._one_task_per_group("kernel", inp.origin_at(src[idx]).astype(np.int64) * inp.nsites + inp.sites[src[idx]],
                                  idx)


_DERIVE = {
    PSource: _derive_source, Broadcast: _derive_move, Shuffle: _derive_move, LocalJoin: _derive_join,
    LocalAggregate: _derive_aggregate, LocalFilter: _derive_filter, LocalMap: _derive_map,
}


# -- per node type: the inputs of each task ----------------------------------------------------------------


# a task's inputs: ``in_ptr`` (index_dtype of the slots), ``in_child`` (int8: a child position) and
# ``in_tuple`` (the child's tuple: index_dtype of its tuples)
def _one_input(w: NodeWork, of: np.ndarray) -> tuple:
    n = len(w.task_tuple)
    ix = index_dtype(w.node.children[0].layout.ntuples)
    return np.arange(n + 1, dtype=index_dtype(n + 1)), np.zeros(n, np.int8), of[w.task_tuple].astype(ix, copy=False)


def _inputs_none(w: NodeWork):
    n = len(w.task_tuple)
    return np.zeros(n + 1, np.int64), _EMPTY_CHILD, _EMPTY


def _inputs_lineage(w: NodeWork):
    return _one_input(w, w.node.layout.lineage[0])


def _inputs_join(w: NodeWork):
    lp, rp = w.node.layout.lineage
    n = len(w.task_tuple)
    child = np.tile(np.array([0, 1], dtype=np.int8), n)
    tup = np.empty(2 * n, dtype=index_dtype(max(w.node.left.layout.ntuples, w.node.right.layout.ntuples)))
    tup[0::2] = lp[w.task_tuple]
    tup[1::2] = rp[w.task_tuple]
    return np.arange(0, 2 * n + 1, 2, dtype=index_dtype(2 * n + 1)), child, tup


def _inputs_aggregate(w: NodeWork):
    node = w.node
    (out_index,) = node.layout.lineage
    ilay, it = node.input.layout, node.input.type
    # fold in key order, so a non-commutative kernel folds as the reference evaluator does:
    # a type's keys are sorted, so where they are distinct a tuple's row is its key's rank
    if not it.arity:
        order = np.arange(ilay.ntuples)
    elif it._memo.get("distinct"):
        order = sorting_permutation(ilay.rows)
        order = np.arange(ilay.ntuples) if order is None else order
    else:
        order = np.lexsort(tuple(it.keys[ilay.rows].T[::-1]))
    if isinstance(node.kernel, ConcatAgg):  # concatenate in key_dim order (stable: key order within)
        kd = it.keys[ilay.rows[order], node.kernel.key_dim]
        order = order[np.argsort(kd, kind="stable")]
    # each output tuple's members, in that order: grouped by output (a stable sort keeps the order within)
    ix = index_dtype(ilay.ntuples)
    order = order.astype(ix, copy=False)
    grp = out_index[order]
    if not bool((grp >= 0).all()):
        order = order[grp >= 0]
        grp = grp[grp >= 0]
    members = None if isinstance(node.kernel, ConcatAgg) else _grid_groups(it, ilay, node.group_by, out_index, ix)
    if members is None:
        by_group = sorting_permutation(grp)
        members = order if by_group is None else order[by_group]
        del by_group
    del order
    count = np.bincount(grp, minlength=int(node.layout.ntuples))
    t = w.task_tuple
    if len(t) == len(count) and bool(count.all()):  # every output tuple a task, in order: members as they are
        ptr = np.zeros(len(t) + 1, dtype=np.int64)
        np.cumsum(count, out=ptr[1:])
        return ptr, np.zeros(int(ptr[-1]), np.int8), members
    start = np.cumsum(count) - count
    n_in = count[t]
    ptr = np.zeros(len(t) + 1, dtype=np.int64)
    np.cumsum(n_in, out=ptr[1:])
    at = np.repeat(start[t] - ptr[:-1], n_in) + np.arange(int(ptr[-1]), dtype=np.int64)
    return ptr, np.zeros(int(ptr[-1]), np.int8), members[at]


def _grid_groups(it, ilay, group_by, out_index: np.ndarray, ix) -> "np.ndarray | None":
    """The tuples of a grid held one per key in key order (a 3-D multiply's join),
    grouped by output in key order within — their group-by dims' values first, the
    others after: a transpose of the grid, no sort —, where that orders
    ``out_index`` (each group's sites follow its other dims; checked); else None."""
    n = ilay.ntuples
    if not it.is_grid or n != it.ntuples or n < 2 or not _is_iota(ilay.rows):
        return None
    f = it.frontier
    axes = list(group_by) + [d for d in range(len(f)) if d not in group_by]
    perm = np.arange(n, dtype=ix).reshape(f).transpose(axes).reshape(-1)
    g = out_index[perm]
    return perm if bool((g >= 0).all()) and bool(np.all(g[1:] >= g[:-1])) else None


_SLOTS_PER_TASK = {PSource: 0, Broadcast: 1, Shuffle: 1, LocalJoin: 2, LocalFilter: 0, LocalMap: 1}

_INPUTS = {
    PSource: _inputs_none, Broadcast: _inputs_lineage, Shuffle: _inputs_lineage, LocalJoin: _inputs_join,
    LocalAggregate: _inputs_aggregate, LocalFilter: _inputs_none, LocalMap: _inputs_lineage,
}


# -- the whole plan ----------------------------------------------------------------------------------------


class PlanWork:
    """The work of a plan whose results are ``outputs``: every node's
    :class:`NodeWork` under the plan's demand, in plan (topological) order, and the
    arrays that travel between sites, once per (array, destination site).

    ``via[(node, t)] = (first node, its task)`` for a transfer task that a move
    earlier in plan order already made (another Broadcast/Shuffle's, or an earlier task
    of the same node when two copies it carries are one: :func:`first_moves`): it
    reads that copy on its own site and moves no bytes.  ``transfers`` lists the real
    ones.

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
      — unless the task is *cheap*: its work, with the work of the tasks fused
      into it, takes at most ``fusion.cheap_below`` seconds (``fusion.task_seconds``
      says how long each task runs: the time model's), so that running it late
      costs at most what running it as a task of its own costs (each Dask task
      pays a per-task overhead: the products of a matmul on small blocks fused into
      their sum run 40% faster on the development VM); or unless the reader is a
      *small granule* of its site's work: the reader with everything it could take
      in runs at most ``1/(fusion.granules x threads)`` of what its site runs for
      the reader's node, so that while it waits for its transfers the site has
      other readers to run, and what fusion delays is at most the tail of one
      granule (:data:`tra_dask.optimizer.time.LATE_GRANULES` has the measurements;
      measured on one-thread workers only);
    * the calls fused into the reader nest at most :data:`MAX_FUSED_DEPTH` deep;
    * ``threads > 1`` (workers that run several tasks at once): a reader takes in
      at most one task, so that no two tasks that could run side by side run one
      after the other inside it.

    Chains fuse transitively (a reader fused into its own reader takes its fused
    inputs along).  ``ntasks`` counts the Dask tasks that remain; ``fused=False``
    turns the pass off; ``fusion`` (a :class:`Fusion`) holds the workers' threads
    and what makes a task cheap."""

    def __init__(self, outputs, *, fuse: bool = True, fusion: "Fusion | None" = None, works: dict | None = None,
                 masks: dict | None = None):
        fusion = Fusion() if fusion is None else fusion
        self.outputs = tuple(outputs)
        self.order = toposort(self.outputs)
        self.masks = masks
        self.need = demand(self.outputs, masks=masks)
        self.nodes = {n: node_work(n, self.need[n], works=works) for n in self.order}  # (works: a caller's cache)
        # a node work from the cache holds a mask equal to this one (same digest): one copy is kept
        self.need = {n: self.nodes[n].need for n in self.order}
        self.via: dict = {}
        self.transfers: list[Transfer] = []
        movers = [n for n in self.order if self.nodes[n].kind == "transfer"]
        if movers:  # the first task (plan order) that moves an (array, destination site) makes the transfer
            ws = [self.nodes[n] for n in movers]
            first = first_moves([(w.task_array, w.task_site, n.layout.origin_at(w.task_tuple))
                                 for n, w in zip(movers, ws)], max(n.nsites for n in movers))
            node_of = np.repeat(np.arange(len(ws)), [len(w.task_site) for w in ws])
            task_of = np.concatenate([np.arange(len(w.task_site), dtype=np.int64) for w in ws])
            base = 0
            for n, w, f in zip(movers, ws, first):
                own = f == np.arange(base, base + len(f))
                dup = np.flatnonzero(~own)
                self.via.update({(n, t): (movers[b], u) for t, b, u in zip(
                    dup.tolist(), node_of[f[dup]].tolist(), task_of[f[dup]].tolist())})
                own = np.flatnonzero(own)
                itemsize = n.type.dtype.itemsize
                self.transfers += [Transfer(n, t, a, src, d, fl, fl * itemsize) for t, a, src, d, fl in zip(
                    own.tolist(), w.task_array[own].tolist(), w.task_src[own].tolist(),
                    w.task_site[own].tolist(), w.task_floats[own].tolist())]
                base += len(f)
        self.into, self.producers = _fusion(self, fusion) if fuse else (Fused.none(), None)

    def __getitem__(self, node: PNode) -> NodeWork:
        return self.nodes[node]

    @property
    def ntasks(self) -> int:
        """Dask tasks the plan runs (a task fused into its reader is not one)."""
        return sum(w.ntasks for w in self.nodes.values()) - len(self.into)

    def fused_in(self, node: PNode) -> int:
        """How many of ``node``'s tasks run inside their readers."""
        return self.into.per_node().get(node, 0)

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


def plan_work(outputs, *, fuse: bool = True, fusion: "Fusion | None" = None, works: dict | None = None) -> PlanWork:
    """The work of the plan whose results are ``outputs`` (PNodes, or a Plan).
    ``works``: a dict the caller keeps to share node works between plans (the search
    derives the fusion of many subplans that share nodes)."""
    if hasattr(outputs, "outputs"):
        outputs = outputs.outputs
    return PlanWork(outputs, fuse=fuse, fusion=fusion, works=works)


def first_moves(moves: list, nsites: int) -> list:
    """Which move of a plan makes each transfer.  ``moves[i] = (array, site, copy)``
    for the ``i``-th Broadcast/Shuffle in plan order, one entry per distinct move it
    makes (int arrays): the array it carries (its input's layout origin), the
    destination site, and the id of the copy it makes there (its output's origin).
    Returns, for each mover, the position (in the concatenation of every mover's
    moves) of the move that makes its transfer: its own position when it is the
    first in plan order to move its array to its site, else the first's (which may
    be an earlier move of the same mover, when two copies it carries are one).

    Copies are the arrays a cluster holds: the copy a move makes is named by (the copy
    it carries, its destination), whichever node makes it (the simulator's rule).  A
    layout gives each node's copies fresh ids, so a duplicate move's copy is renamed
    to the first's, and the moves that carry it are compared again: two Shuffles that
    each bring array X to site 1 make one copy there, and a Broadcast of either to
    site 0 is one transfer.  One pass finds the first of each (array, site) in plan
    order; a pass is repeated only while a rename changes what a move carries (as
    many passes as the longest chain of renamed copies carried on, usually none)."""
    sizes = [len(a) for a, _, _ in moves]
    pos = np.cumsum([0] + sizes).tolist()
    codes = [np.asarray(a, dtype=np.int64) * nsites + d for a, d, _ in moves]
    spans = sorted((int(c.min()), int(c.max())) for c in codes if len(c))
    if all(x[1] < y[0] for x, y in zip(spans, spans[1:])):
        # no code in two movers, and within one each (array, site) makes its own copy:
        # every move is the first of its code, and no copy is renamed
        return [np.arange(lo, hi, dtype=np.int64) for lo, hi in zip(pos[:-1], pos[1:])]
    carried = np.concatenate([np.asarray(a, dtype=np.int64) for a, _, _ in moves])
    site = np.concatenate([np.asarray(d, dtype=np.int64) for _, d, _ in moves])
    copy = np.concatenate([np.asarray(c, dtype=np.int64) for _, _, c in moves])
    here = np.arange(len(carried), dtype=np.int64)
    array = carried
    while True:
        first = first_of_each(array * nsites + site)
        dup = first != here
        if not dup.any():
            break
        ren_from = copy[dup]
        maybe = np.flatnonzero((carried >= ren_from.min()) & (carried <= ren_from.max()))
        if not len(maybe):  # no move carries a renamed copy (the usual case: a cheap test)
            break
        ren_to = copy[first[dup]]  # a first's copy is never a duplicate: one step
        o = np.argsort(ren_from, kind="stable")
        ren_from, ren_to = ren_from[o], ren_to[o]
        k = np.minimum(np.searchsorted(ren_from, carried[maybe]), len(ren_from) - 1)
        renamed = carried.copy()
        renamed[maybe] = np.where(ren_from[k] == carried[maybe], ren_to[k], carried[maybe])
        if np.array_equal(renamed, array):
            break
        array = renamed
    return [first[lo:hi] for lo, hi in zip(pos[:-1], pos[1:])]


def _fusion(work: PlanWork, fusion: Fusion) -> tuple:
    """``({(node, task): (reader node, its task)}, state)``: the tasks that run inside
    their one reader (the rules are in :class:`PlanWork`'s doc), and what
    :class:`FusedCounts` keeps of the plan (:class:`_Producers` of the tuples the
    outputs need; None when the plan has no task).  Vectorised over every
    task of the plan at once: a task is a global id (``base[node] + task``), and a
    node's tuples map to the id of the task that makes them through aliases
    (:func:`_producer_ids`); the rules that read what was fused before (a cheap
    task's, and a small granule's, work includes its fused inputs') run node by
    node in plan order (:func:`_fuse_into`).  The outputs' needed tuples are results
    (``work.masks``, else one copy of each key): no task that makes one is fused."""
    order = [n for n in work.order if work.nodes[n].ntasks]
    base, total = {}, 0
    for n in order:
        base[n] = total
        total += work.nodes[n].ntasks
    if not total:
        return Fused.none(), _Producers.of(work, _producer_ids(work, base, index_dtype(total)), *([_EMPTY] * 6), 0)
    # each node's producer ids, made in plan order and let go once every reader has read
    # them in the first pass — kept for the outputs and for the nodes read in the second
    prod: dict = {}
    unread = dict.fromkeys(work.order, 0)  # each node's reads still to come (one per child slot)
    for n in work.order:
        for c in n.children:
            unread[c] += 1
    keep = set(work.outputs)
    copies: dict = {}  # {transfer node: (its copy tasks, the global id of the first transfer each reads)}
    for (n, t), first in work.via.items():
        copies.setdefault(n, []).append((t, base[first[0]] + first[1]))
    copies = {n: tuple(np.array(c, dtype=np.int64).reshape(-1, 2).T) for n, c in copies.items()}
    ix = index_dtype(total)  # task ids
    fusable = np.zeros(total, bool)
    site = np.empty(total, index_dtype(max(n.nsites for n in order)))
    late = np.zeros(total, bool)      # the task depends on a transfer
    seconds = np.zeros(total)         # what each fusable task runs, alone (fusion.task_seconds)
    readers = np.zeros(total, np.int32)  # the input slots that read each task
    readable = []                     # the nodes whose tasks may take an input in
    # a node's tuples may be made by a local computation (its own tasks, or through
    # aliases its first child's): a reader of none takes nothing in (a 3-D multiply's
    # join, of transfers: its 2 slots per join tuple are not derived again)
    computed: dict = {}
    for n in work.order:
        w = work.nodes[n]
        computed[n] = (w.kind in FUSABLE_KINDS and w.ntasks > 0) or (bool(n.children) and computed[n.children[0]])
    # two passes over the input slots, node by node (a plan's largest arrays: a 3-D
    # multiply's join has two per join tuple), so one node's are held at a time:
    # the first counts each task's readers and whether it waits on a transfer, the
    # second (in plan order: fused inputs decided first) fuses
    for n in work.order:
        w = work.nodes[n]
        prod[n] = _producer_ids_of(n, w, base, prod, ix)
        if w.ntasks:
            _first_pass(n, w, base[n], prod, copies, ix, site, late, fusable, seconds, readers, fusion)
            if w.kind != "transfer" and fusable[base[n]] and w.nslots and any(computed[c] for c in n.children):
                readable.append(n)
                keep.update(n.children)
        for c in n.children:
            unread[c] -= 1
            if not unread[c] and c not in keep:
                prod.pop(c, None)
    result = np.zeros(total, bool)
    for o in work.outputs:
        r = prod[o][work.need[o]] if work.masks is not None and o in work.masks else \
            prod[o][result_copies(o.layout, o.type.ntuples)]
        result[r[r >= 0]] = True
    work_in = seconds  # a task's seconds with those of the tasks fused into it
    depth = np.zeros(total, np.int16)  # how deep the calls fused into a task nest (at most MAX_FUSED_DEPTH)
    producers, into_readers = [], []
    for n in readable:
        w = work.nodes[n]
        b, m = base[n], w.ntasks
        ranges = _task_ranges(w)
        granule = None
        if len(ranges) > 1 and fusion.task_seconds is not None and fusion.granules > 0:
            # the small-granule rule weighs a reader against its site's work on the whole
            # node: summed over every range before any is decided
            whole = work_in[b:b + m].copy()  # a reader's seconds with every candidate's
            for t0, t1, sc, sp in _node_slots(n, w, b, prod, copies, ix, ranges):
                ok = sp >= 0
                spc = np.where(ok, sp, 0)
                cand = _may_fuse(sc, spc, ok, fusable, readers, result, site) & (depth[spc] < MAX_FUSED_DEPTH)
                whole[t0:t1] += np.bincount(sc[cand] - (b + t0), weights=work_in[spc[cand]], minlength=t1 - t0)
                del sc, sp, ok, spc, cand
            granule = (whole, np.bincount(site[b:b + m], weights=whole))
        for t0, t1, sc, sp in _node_slots(n, w, b, prod, copies, ix, ranges):
            bt, mt = b + t0, t1 - t0
            ok = sp >= 0
            spc = np.where(ok, sp, 0)
            late_in = np.bincount(sc[ok & late[spc]] - bt, minlength=mt).astype(np.int32)  # late slots per reader
            cand, on_time = _candidates(sc, spc, ok, fusable, readers, result, site, late, late_in[sc - bt])
            del ok, late_in
            here = _fuse_into(sc, spc, cand, on_time, bt, mt, site, work_in, depth, fusion,
                              None if granule is None else (granule[0][t0:t1], granule[1]))
            producers.append(spc[here])
            into_readers.append(sc[here])
            del sc, sp, spc, cand, on_time, here
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, ix))
    into = Fused(order, np.array([base[n] for n in order], np.int64), cat(producers), cat(into_readers))
    return into, _Producers.of(work, prod, site, fusable, late, work_in, depth, readers, len(into))


def _first_pass(n: PNode, w: NodeWork, b: int, prod: dict, copies: dict, ix, site, late, fusable, seconds,
                readers, fusion: Fusion):
    """The fusion pass's first pass over node ``n``'s tasks (ids from ``b``): their
    sites, whether each is a local computation (and its seconds) or waits on a
    transfer, and how many input slots read each task below."""
    m = w.ntasks
    site[b:b + m] = w.task_site
    if w.kind == "transfer":
        late[b:b + m] = True
    else:
        fusable[b:b + m] = w.kind in FUSABLE_KINDS
        if fusable[b] and fusion.task_seconds is not None:
            seconds[b:b + m] = w.seconds(fusion.task_seconds)
    for _, _, reader, p in _node_slots(n, w, b, prod, copies, ix):
        p = p[p >= 0] if w.kind == "transfer" else p
        if w.kind != "transfer":
            ok = p >= 0
            p = p[ok]
            late[reader[ok][late[p]]] = True  # (a task reading a late task is late)
        _count_into(readers, p)
        del reader, p


SLOT_BLOCK = 1 << 21  # input slots the fusion pass derives at once (a node with more: in ranges of its tasks)


def _task_ranges(w: NodeWork) -> list:
    """``[(t0, t1), ...]``: ``w``'s tasks in consecutive ranges of at most
    :data:`SLOT_BLOCK` input slots each (a task with more: a range of its own)."""
    m, k = w.ntasks, w.slots_per_task
    if k is not None:
        step = max(1, SLOT_BLOCK // max(k, 1))
        return [(t, min(t + step, m)) for t in range(0, m, step)] if m > step else [(0, m)]
    ptr = w.in_ptr
    if int(ptr[-1]) <= SLOT_BLOCK:
        return [(0, m)]
    out, t0 = [], 0
    while t0 < m:
        t1 = min(max(int(np.searchsorted(ptr, int(ptr[t0]) + SLOT_BLOCK, side="right")) - 1, t0 + 1), m)
        out.append((t0, t1))
        t0 = t1
    return out


def _node_slots(n: PNode, w: NodeWork, b: int, prod: dict, copies: dict, ix, ranges=None):
    """``(t0, t1, reader, producer)`` for each range of ``n``'s tasks (``ranges``,
    default :func:`_task_ranges`): the global ids (from ``b``) of the readers and
    producers of their input slots, in call order (producer -1: data); nothing for
    tasks with no input.  A transfer reads its child's tuple; a copy reads the first
    transfer of its array (``copies``).  A reader's slots are all in one range."""
    if w.kind != "transfer" and not w.nslots:
        return
    for t0, t1 in _task_ranges(w) if ranges is None else ranges:
        if w.kind != "transfer":
            yield (t0, t1) + _slots(w, b, [prod[kid] for kid in n.children], ix, t0, t1)
            continue
        ((_, tup),) = w.fixed_slots(t0, t1)
        p = prod[n.children[0]][tup]
        if n in copies:
            ct, first = copies[n]
            at = (ct >= t0) & (ct < t1)
            p[ct[at] - t0] = first[at]
        yield t0, t1, np.arange(b + t0, b + t1, dtype=ix), p


def _count_into(counts: np.ndarray, ids: np.ndarray):
    """``counts[i] += 1`` for each entry ``i`` of ``ids`` (repeats count each time)."""
    if not len(ids):
        return
    lo, hi = int(ids.min()), int(ids.max())
    if hi - lo < 4 * len(ids) + (1 << 16):  # a compact span: one bincount of it
        counts[lo:hi + 1] += np.bincount(ids - lo, minlength=hi - lo + 1).astype(counts.dtype)
    else:
        np.add.at(counts, ids, 1)


class Fused(Mapping):
    """``PlanWork.into``: ``{(node, task): (reader node, its task)}`` for the tasks
    fused into their readers, kept as the fusion pass found them (global task ids:
    node ``order[i]``'s tasks from ``starts[i]``; ``producer[j]`` runs inside
    ``reader[j]``).  Its length and its counts per node are read off the arrays; the
    pairs are named (node, task) only when a caller reads them (the lowering): the
    search and the cost count the fused tasks of whole plans with millions of tasks,
    where a dict of them held gigabytes."""

    def __init__(self, order: list, starts: np.ndarray, producer: np.ndarray, reader: np.ndarray):
        self._order, self._starts, self._producer, self._reader = order, starts, producer, reader
        self._dict = self._counts = None

    @classmethod
    def none(cls) -> "Fused":
        """No task fused (fusion off, or a plan with no task that reads another)."""
        return cls([], _EMPTY, _EMPTY, _EMPTY)

    def __repr__(self):
        return f"<Fused: {len(self)} tasks into their readers>"

    def _node_of(self, g: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._starts, g, side="right") - 1

    def _named(self, g: np.ndarray) -> list:
        k = self._node_of(g)
        return [(self._order[a], t) for a, t in zip(k.tolist(), (g - self._starts[k]).tolist())]

    def _pairs(self) -> dict:
        if self._dict is None:
            self._dict = dict(zip(self._named(self._producer), self._named(self._reader)))
        return self._dict

    def __len__(self) -> int:
        return len(self._producer)

    def __getitem__(self, key):
        return self._pairs()[key]

    def __iter__(self):
        return iter(self._pairs())

    def __contains__(self, key) -> bool:
        return key in self._pairs()

    def per_node(self) -> dict:
        """``{node: how many of its tasks are fused into their readers}`` (nodes with none
        left out; made once)."""
        if self._counts is None:
            counts = np.bincount(self._node_of(self._producer), minlength=len(self._order))
            self._counts = {self._order[i]: int(counts[i]) for i in np.flatnonzero(counts).tolist()}
        return self._counts


def _slots(w: NodeWork, b: int, child_prod: list, ix=np.int64, t0: int = 0, t1: int | None = None) -> tuple:
    """``(reader, producer)`` of every input slot of ``w``'s tasks ``t0 .. t1-1``
    (default all; global ids from ``b``, of type ``ix``), in call order:
    ``child_prod[c]`` maps child ``c``'s tuples to the ids of the tasks that make
    them (-1: data)."""
    t1 = w.ntasks if t1 is None else t1
    if w.slots_per_task is not None:
        fixed = w.fixed_slots(t0, t1)
        k = len(fixed)
        reader = np.arange(b + t0, b + t1, dtype=ix)
        if k == 1:
            return reader, child_prod[fixed[0][0]][fixed[0][1]].astype(ix, copy=False)
        p = np.empty(k * (t1 - t0), ix)
        for j, (c, tup) in enumerate(fixed):
            p[j::k] = child_prod[c][tup]
        return np.repeat(reader, k), p
    ptr = w.in_ptr[t0:t1 + 1]
    s0, s1 = int(ptr[0]), int(ptr[-1])
    reader = np.repeat(np.arange(b + t0, b + t1, dtype=ix), np.diff(ptr))
    tup = w.in_tuple[s0:s1]
    if len(child_prod) == 1:
        return reader, child_prod[0][tup]
    p = np.empty(s1 - s0, ix)
    child = w.in_child[s0:s1]
    for c, ids in enumerate(child_prod):
        at = child == c
        p[at] = ids[tup[at]]
    return reader, p


def _may_fuse(sc, spc, ok, fusable, readers, out, site) -> np.ndarray:
    """The input slots (readers ``sc``, producers ``spc``, ``ok`` those made by a
    task) whose producer may be fused into its reader at all: both local
    computations, on one site, the producer read once and not in ``out`` (a result,
    or a tuple read above)."""
    return ok & fusable[sc] & fusable[spc] & (readers[spc] == 1) & ~out[spc] & (site[spc] == site[sc])


def _candidates(sc, spc, ok, fusable, readers, out, site, late, late_in) -> tuple:
    """``(cand, on_time)``: :func:`_may_fuse`'s slots, and those whose reader waits for
    no transfer the producer could run under (``late_in``: its reader's late input slots)."""
    return _may_fuse(sc, spc, ok, fusable, readers, out, site), late_in - late[spc] == 0


def _fuse_into(sc, spc, cand, on_time, b: int, m: int, site, work_in, depth, fusion: Fusion,
               granule: "tuple | None" = None) -> np.ndarray:
    """Which input slots of one reader node's tasks (ids ``b .. b+m-1``) take their
    producer in: the slots' readers ``sc`` and producers ``spc``, ``cand`` those
    that may be fused at all (one reader, same site, both local computations, not a
    result), ``on_time`` those whose reader waits for no other transfer.  Updates
    ``depth`` and ``work_in`` (seconds with the fused inputs') of the readers.
    ``granule``: ``(whole, on_site)`` when the readers are a range of their node's
    tasks — each reader's seconds with all its candidates', and its node's sum of
    those per site (the small-granule rule's measure; else derived from these slots)."""
    cand = cand & (depth[spc] < MAX_FUSED_DEPTH)  # (before every rule that may take a candidate)
    if not cand.any():
        return cand
    timed = fusion.task_seconds is not None
    here = cand & (on_time | ((timed and fusion.cheap_below > 0) & (work_in[spc] <= fusion.cheap_below)))
    if timed and fusion.granules > 0 and (cand & ~here).any():  # late tasks into readers that are small granules
        r = sc - b
        if granule is None:
            whole = work_in[b:b + m] + np.bincount(r[cand], weights=work_in[spc[cand]], minlength=m)
            on_site = np.bincount(site[b:b + m], weights=whole)
        else:
            whole, on_site = granule
        here |= cand & (whole * (fusion.granules * fusion.threads) <= on_site[site[b:b + m]])[r]
    if fusion.threads > 1 and here.any():  # one per reader: its first candidate slot in call order
        at = np.flatnonzero(here)
        _, first = np.unique(sc[at], return_index=True)
        here[:] = False
        here[at[first]] = True
    np.maximum.at(depth, sc[here], depth[spc[here]] + 1)
    if timed:
        np.add.at(work_in, sc[here], work_in[spc[here]])
    return here


class _Producers:
    """What a subplan delivering its root's tuples ``mask`` (``FusedCounts``'s unit)
    tells the nodes above it: ``fused`` tasks fused inside it (final: a task's fusion
    is decided once its readers are known), and of the tasks that make its root's
    needed tuples (its *root producers*, local ids; ``prod``: each root tuple's, -1
    for data or a tuple not needed), each one's site, whether it is a local
    computation, whether it depends on a transfer, its seconds with its fused
    inputs', how deep those nest, and its readers inside.  ``nodes``: the nodes
    that make tasks; ``codes``: the moves made (array x sites + destination);
    ``closed``: a move in it is a copy of another (its moves depend on plan order:
    not combined with others)."""

    __slots__ = ("fused", "prod", "site", "fusable", "late", "work_in", "depth", "readers", "nodes", "codes",
                 "closed")

    def __init__(self, fused, prod, site, fusable, late, work_in, depth, readers, nodes, codes, closed):
        self.fused, self.prod, self.site, self.fusable, self.late = fused, prod, site, fusable, late
        self.work_in, self.depth, self.readers, self.nodes, self.codes, self.closed = \
            work_in, depth, readers, nodes, codes, closed

    @classmethod
    def of(cls, work: PlanWork, prod, site, fusable, late, work_in, depth, readers, fused) -> "_Producers | None":
        """The root producers of ``work``, a plan of one output under a given mask (None otherwise)."""
        if work.masks is None or len(work.outputs) != 1:
            return None
        (root,) = work.outputs
        return cls.restricted(prod[root], work.need[root], site, fusable, late, work_in, depth, readers, fused,
                              frozenset(n for n in work.order if work.nodes[n].ntasks), _codes(work), bool(work.via))

    @classmethod
    def restricted(cls, prod, need, site, fusable, late, work_in, depth, readers, fused, nodes, codes, closed):
        """The producers of the needed tuples of a root whose tuples' producers (global
        ids) are ``prod``, renumbered from 0."""
        ids = prod[need]
        keep = unique(ids[ids >= 0])
        local = np.full(len(prod), -1, np.int64)
        if len(keep):
            at = np.flatnonzero(need & (prod >= 0))
            local[at] = np.searchsorted(keep, prod[at])
        return cls(fused, local, site[keep], fusable[keep], late[keep], work_in[keep], depth[keep], readers[keep],
                   nodes, codes, closed)


def _codes(work: PlanWork) -> np.ndarray:
    """The moves of the plan's Broadcasts and Shuffles, ``array * sites + destination``, sorted."""
    parts = [w.task_array.astype(np.int64) * n.nsites + w.task_site for n, w in work.nodes.items()
             if w.kind == "transfer" and len(w.task_tuple)]
    return np.sort(np.concatenate(parts)) if parts else _EMPTY


class FusedCounts:
    """``len(plan_work([root], fusion=fusion).into)`` — how many tasks fusion removes
    from the subplan of ``root`` — for the many roots a search ranks, incrementally:
    a subplan's count is its children subplans' (each under the demand the root puts
    on it, remembered per (node, demand)) plus the fusions into the root's own
    tasks, decided from the children's root producers by :func:`_fuse_into`, the
    rule the whole-plan pass applies.  A task's fusion is decided at the node that
    reads it, once it is no longer a root producer (a root producer has a reader
    above, or is a result: it is fused nowhere below).  Adding subplans is exact
    when they share no node that makes tasks and no move (an array sent to one site
    in two of them is one transfer, the other a copy, which depends on plan order);
    otherwise, and for a node that reads one child twice, the subplan's count is
    the whole-plan pass's (:class:`PlanWork` under that demand)."""

    _DEPTH = 200  # deeper than this, a subplan is derived whole (no deep recursion)

    def __init__(self, fusion: Fusion, works: dict | None = None):
        self.fusion = fusion
        self.works = {} if works is None else works
        self.subs: dict = {}  # (node, digest of its demand) -> _Producers

    def __call__(self, root: PNode) -> int:
        need = np.zeros(root.layout.ntuples, bool)
        need[result_copies(root.layout, root.type.ntuples)] = True
        return self._sub(root, need, mask_digest(need), 0).fused

    def _work(self, node: PNode, mask: np.ndarray, digest: bytes) -> NodeWork:
        return node_work(node, mask, works=self.works, digest=digest)

    def _sub(self, node: PNode, mask: np.ndarray, digest: bytes, depth: int) -> _Producers:
        key = (node, digest)
        hit = self.subs.get(key)
        if hit is None:
            hit = self._added(node, mask, digest, depth)
            if hit is None:
                w = PlanWork([node], fusion=self.fusion, works=self.works, masks={node: mask})
                hit = w.producers
            self.subs[key] = hit
        return hit

    def _added(self, node: PNode, mask: np.ndarray, digest: bytes, depth: int) -> "_Producers | None":
        kids = node.children
        if depth > self._DEPTH or len(set(map(id, kids))) < len(kids):
            return None
        masks = child_demand(node, mask)
        below = [self._sub(c, m, mask_digest(m), depth + 1) for c, m in zip(kids, masks)]
        if any(s.closed for s in below):
            return None
        nodes = frozenset().union(*(s.nodes for s in below))
        if len(nodes) < sum(len(s.nodes) for s in below):
            return None  # a node in two children's subplans: its tasks have readers in both
        w = self._work(node, mask, digest)
        m = w.ntasks
        codes = [s.codes for s in below if len(s.codes)]
        if w.kind == "transfer" and len(w.task_tuple):
            codes.append(np.sort(w.task_array.astype(np.int64) * node.nsites + w.task_site))
        codes = np.sort(np.concatenate(codes)) if len(codes) > 1 else codes[0] if codes else _EMPTY
        if len(codes) > 1 and (codes[1:] == codes[:-1]).any():
            return None  # an array moved to one site twice: one move is a copy of the other
        sizes = [len(s.site) for s in below]
        b = sum(sizes)
        offs = np.cumsum([0] + sizes[:-1]).tolist()
        child_prod = [np.where(s.prod >= 0, s.prod + o, -1) for s, o in zip(below, offs)]
        cat = (lambda f, own: np.concatenate([getattr(s, f) for s in below] + [own]))
        site = cat("site", w.task_site if m else _EMPTY)
        fusable = cat("fusable", np.full(m, w.kind in FUSABLE_KINDS))
        late = cat("late", np.full(m, w.kind == "transfer"))
        seconds = w.seconds(self.fusion.task_seconds) if m and w.kind in FUSABLE_KINDS and \
            self.fusion.task_seconds is not None else np.zeros(m)
        work_in = cat("work_in", np.asarray(seconds, dtype=np.float64))
        depth_ = cat("depth", np.zeros(m, np.int64))
        readers = cat("readers", np.zeros(m, np.int64))
        prod = np.full(node.layout.ntuples, -1, np.int64)
        made = w.made_by >= 0
        if m:
            prod[made] = w.made_by[made].astype(np.int64) + b
        al = ~made & (w.alias >= 0)
        if al.any():
            prod[al] = child_prod[0][w.alias[al]]
        fused = sum(s.fused for s in below)
        if m and w.nslots:
            sc, sp = _slots(w, b, child_prod)
            ok = sp >= 0
            spc = np.where(ok, sp, 0)
            readers += np.bincount(sp[ok], minlength=len(readers))
            if w.kind != "transfer":
                late_in = np.bincount(sc[ok] - b, weights=late[spc[ok]], minlength=m)  # late input slots of each task
                late[b:] = late_in > 0
                stays = np.zeros(len(site), bool)  # root producers: a reader above, or a result
                ids = prod[mask]
                stays[ids[ids >= 0]] = True
                cand, on_time = _candidates(sc, spc, ok, fusable, readers, stays, site, late, late_in[sc - b])
                fused += int(_fuse_into(sc, spc, cand, on_time, b, m, site, work_in, depth_, self.fusion).sum())
        return _Producers.restricted(prod, mask, site, fusable, late, work_in, depth_, readers, fused,
                                     nodes | {node} if m else nodes, codes, False)


def _producer_ids(work: PlanWork, base: dict, ix=np.int64) -> dict:
    """``{node: ids}`` of every node of the plan (:func:`_producer_ids_of`)."""
    out: dict = {}
    for n in work.order:
        out[n] = _producer_ids_of(n, work.nodes[n], base, out, ix)
    return out


def _producer_ids_of(n: PNode, w: NodeWork, base: dict, prod: dict, ix=np.int64) -> np.ndarray:
    """For each physical tuple of ``n``, the global id (of type ``ix``: every id fits)
    of the task that makes it (its own task, or through an alias its input's: ``prod``
    holds its first child's), -1 for data (a scattered or resident chunk) or a tuple
    the plan does not need."""
    m = len(w.made_by)
    if m and w.kind in TASK_KINDS and w.ntasks and int(w.made_by.min()) >= 0:
        return np.add(w.made_by, base[n], dtype=ix)  # every tuple made by a task of its own node (a join's)
    if m and n.children and int(w.made_by.max()) < 0 and int(w.alias.min()) >= 0:
        return prod[n.children[0]][w.alias]  # every tuple its input's (a pure rekey's copies)
    ids = np.full(m, -1, ix)
    made = w.made_by >= 0
    if w.kind in TASK_KINDS and w.ntasks:
        ids[made] = np.add(w.made_by[made], base[n], dtype=ix)
    al = ~made & (w.alias >= 0)
    if al.any():
        ids[al] = prod[n.children[0]][w.alias[al]]
    return ids
