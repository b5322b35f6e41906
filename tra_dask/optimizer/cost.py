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

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..node import toposort
from ..physical import Broadcast, KeyArrayMap, LocalFilter, LocalMap, PNode, PSource, Shuffle, demand
from ..physical.demand import child_demand, mask_digest
from ..types import first_positions
from ..physical.work import first_moves, node_work

__all__ = ["COST_MODELS", "NodeCost", "Cost", "node_cost", "plan_cost", "DeliveredCosts", "brute_force_frontier"]

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
    tasks_per_site: np.ndarray | None = None  # ... on each site
    recv_per_site: np.ndarray | None = None   # floats arriving at each site (a move)
    send_per_site: np.ndarray | None = None   # floats leaving each site (a move)
    made_per_site: np.ndarray | None = None   # bytes of the arrays its tasks make on each site
    # the time model's seconds of this node per ClusterSpec (optimizer.time): a cache the
    # cost owns, not a field of it (never copied by dataclasses.replace, never compared)
    seconds_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

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
    seconds: float | None = None     # predicted makespan, when costed for a cluster (optimizer/time.py)
    node_seconds: dict | None = field(default=None, repr=False)  # PNode -> seconds of its busiest site
    fused: int = 0                   # of the nodes' tasks, those that run inside their reader (physical.work)
    results: tuple = ()              # (bytes, chunks) of each result of a whole plan (a subplan's: none)
    named: int = 0                   # bytes of in-process inputs a whole plan's submission hashes (a subplan's: 0)
    # the costs of the root's children's subplans, when this is a subplan's cost made of
    # them and its root's own, sharing no node (DeliveredCosts): the time model's
    # critical path is then theirs and the root's (optimizer.time.makespan)
    parts: tuple = field(default=(), repr=False, compare=False)
    # the time model's path terms per ClusterSpec (optimizer.time): a cache, never copied
    seconds_memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    # sums over the nodes, each made once (the objective reads them for every candidate)
    _sums: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def _sum(self, name: str) -> int:
        got = self._sums.get(name)
        if got is None:
            got = self._sums[name] = sum(getattr(c, name) for c in self.nodes.values())
        return got

    @property
    def tasks(self) -> int:
        """Dask tasks the lowered plan runs (a tie-breaker: fewer is simpler): the
        nodes' tasks less those fused into their readers after placement."""
        return self._sum("tasks") - self.fused

    def with_fused(self, fused: int) -> "Cost":
        """This cost for the plan with ``fused`` of its tasks run inside their readers
        (its predicted seconds, which count tasks, are dropped: annotate again)."""
        return dataclasses.replace(self, fused=int(fused), seconds=None, node_seconds=None)

    @property
    def tuples(self) -> int:
        """Physical tuples over all nodes (a tie-breaker: filters early, fewer copies)."""
        return self._sum("tuples")

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
    if not lay.origins_distinct():
        idx = idx[first_positions(lay.origin_at(idx))]
    return int(node.type.chunk_sizes[lay.rows[idx]].sum())


def _bincount(sites: np.ndarray, weights: np.ndarray, minlength: int) -> np.ndarray:
    """``np.bincount(sites, weights=weights, minlength=minlength)``; a count times the
    value where ``weights`` is one whole number for all (a read-only view of it: tasks
    alike), which the sum of its copies is exactly."""
    if len(weights) and weights.ndim == 1 and weights.strides[0] == 0:
        v = float(weights[0])
        if v.is_integer() and abs(v) * len(weights) < 2**53:
            return np.bincount(sites, minlength=minlength) * v
    return np.bincount(sites, weights=weights, minlength=minlength)


def _bytes_per_site(node: PNode, need: np.ndarray) -> np.ndarray:
    lay, t = node.layout, node.type
    if len(t.shapes) == 1 and lay.origins_distinct() and need.all():  # every tuple, each its own array
        return np.bincount(lay.sites, minlength=lay.nsites) * (int(t.shape_sizes[0]) * t.dtype.itemsize)
    if need.all():  # a shared array is held once: its first copy counts
        idx = lay.first_positions()
    else:
        idx = np.flatnonzero(need)
        if not lay.origins_distinct():
            idx = idx[first_positions(lay.origin_at(idx))]
    if len(t.shapes) == 1:  # one chunk size: count arrays per site
        return np.bincount(lay.sites[idx], minlength=lay.nsites) * (int(t.shape_sizes[0]) * t.dtype.itemsize)
    return _bincount(lay.sites[idx], chunk_bytes(node, idx), lay.nsites).astype(np.int64)


def _largest_chunk(node: PNode) -> int:
    t = node.type
    return int(t.shape_sizes.max()) * t.dtype.itemsize if len(t.shapes) else 0


def node_cost(node: PNode, model: str = "exact", need: dict | None = None, *, works: dict | None = None,
              digest: bytes | None = None) -> NodeCost:
    """Cost of one node; ``need`` is the plan's demand (default: every tuple).
    ``works``: a dict of node works by ``(node, digest of its demand)`` to take the
    node's from, or put it in (a caller that derives the plan's work next shares them)."""
    if model not in COST_MODELS:
        raise ValueError(f"unknown cost_model {model!r}; valid: {', '.join(COST_MODELS)}")
    if need is None:
        need = {n: np.ones(n.layout.ntuples, dtype=bool) for n in (node, *node.children)}
    held = _bytes_per_site(node, need[node])
    # (every input tuple counts as held while the node runs, also a fold's inputs fused
    # into it, which the lowering makes one at a time: conservative there)
    peak = held + sum((_bytes_per_site(c, need[c]) for c in node.children), np.zeros(node.nsites, dtype=np.int64))
    floats = _floats_moved(node, model, need[node])
    ntasks, per_site, recv, send, made, flops = _tasks(node_work(node, need[node], works=works, digest=digest))
    if per_site is not None and ntasks:
        # a running task also holds copies in flight: a chunk arriving is a buffer before
        # it is an array, a kernel's result is a temporary before it is stored (measured:
        # 2000² float64 chunks, CMM on 2 workers, 290 MB of growth against 256 MB held)
        largest = max(_largest_chunk(n) for n in (node, *node.children))
        peak = peak + (np.asarray(per_site) > 0) * (2 * largest)
    return NodeCost(node, floats, floats * node.type.dtype.itemsize, held, peak,
                    flops, ntasks, per_site, recv, send, made)


def _tasks(w) -> tuple:
    """Tasks the lowering makes for this node — :mod:`tra_dask.physical.work`'s
    derivation, which the lowering emits as is (one task per array the node creates;
    aliases, copies of one kernel call and one transfer share one) — in all and per
    site, for a move the floats each site receives and sends, the bytes of the
    arrays the tasks make on each site (one per task: its first tuple's chunk) and
    the flops its kernels run on each site — the time model's inputs (of the node's
    work ``w``)."""
    node = w.node
    s = node.nsites
    per_site = np.bincount(w.task_site, minlength=s) if w.ntasks else np.zeros(s, np.int64)
    recv = send = None
    if w.kind == "transfer" and len(w.task_tuple):
        f = w.task_floats.astype(np.float64)
        recv = _bincount(w.task_site, f, s)
        send = _bincount(w.task_src, f, s)
    made = _bincount(w.task_site, chunk_bytes(node, w.task_tuple), s)
    flops = _bincount(w.task_site, w.task_flops, s).astype(np.float64)
    return w.ntasks, per_site, recv, send, made, flops


def chunk_bytes(node: PNode, tuples: np.ndarray) -> np.ndarray:
    """Bytes of the chunk of each of the node's physical ``tuples``."""
    t = node.type
    if len(t.shapes) == 1:  # one chunk size: a read-only view of one value
        return np.broadcast_to(float(t.shape_sizes[0]) * t.dtype.itemsize, (len(tuples),))
    return t.chunk_sizes[node.layout.rows[tuples]] * float(t.dtype.itemsize)


_MEMO_PER_NODE = 64  # demand patterns remembered per node


def _node_cost_memo(node: PNode, model: str, need: dict, digests: dict | None = None,
                    works: dict | None = None) -> NodeCost:
    """``node_cost`` remembered on the node itself, per (model, demand on the node and
    its children): the search re-costs shared subtrees.  Kept on the node so that it
    lives exactly as long as the node does.  ``digests``: ``_digest`` of each node's
    demand, when the caller has them (a plan digests each mask once, not once per
    node that reads it); ``works``: as :func:`node_cost`'s."""
    memo = node.__dict__.get("_cost_memo")
    if memo is None:
        memo = {}
        object.__setattr__(node, "_cost_memo", memo)
    if digests is None:
        key = (model, mask_digest(need[node]), tuple(mask_digest(need[c]) for c in node.children))
    else:
        key = (model, digests[node], tuple(digests[c] for c in node.children))
    hit = memo.get(key)
    if hit is None:
        hit = node_cost(node, model, need, works=works, digest=key[1])
        if len(memo) >= _MEMO_PER_NODE:
            memo.pop(next(iter(memo)))
        memo[key] = hit
    return hit


def plan_cost(outputs, model: str = "exact", *, whole: bool = False, masks: dict | None = None,
              works: dict | None = None) -> Cost:
    """Cost of the plan whose results are ``outputs`` (shared nodes counted once).
    ``whole``: the cost of delivering every tuple of the outputs (the search's cost
    of a subplan), not one copy of each key (a result); ``masks``: ``{output: the
    tuples of it needed}`` instead (a subplan under its reader's demand); ``works``:
    a dict that keeps the node works derived, by ``(node, demand digest)``, for
    :func:`~tra_dask.physical.plan_work` to reuse."""
    return _plan_cost(outputs, model, whole, masks, works)[0]


def _plan_cost(outputs, model: str, whole: bool, masks: dict | None, works: dict | None = None) -> tuple:
    """``(plan_cost(...), spans)``; ``spans``: ``{Broadcast/Shuffle node: (lo, hi,
    digest)}``, the code range (``array * sites + destination``) of the moves each
    counts, and the digest of its demand (its moves are remembered under it)."""
    nodes = toposort(outputs)
    need = demand(outputs, whole=whole or masks is not None, order=nodes, masks=masks)
    digests = {n: mask_digest(need[n]) for n in nodes}  # each mask once (a node's is read by its parents too)
    per = {n: _node_cost_memo(n, model, need, digests, works) for n in nodes}
    spans = {}
    if model == "exact":
        per, spans = _one_transfer_per_array_and_site(nodes, need, per, digests)
    s = nodes[0].nsites if nodes else 1
    part = whole or masks is not None
    results = () if part else tuple(_result(o) for o in dict.fromkeys(outputs))
    return _summed(model, s, per, results, named=0 if part else named_bytes(nodes)), spans


def named_bytes(nodes) -> int:
    """Bytes of the in-process numpy arrays the plan's sources cut chunks from: each
    submission hashes each once (the lowering names in-process chunks by content)."""
    arrays = {id(a): a.nbytes for n in nodes
              if isinstance(n, PSource) and isinstance(a := getattr(n.source, "array", None), np.ndarray)}
    return sum(arrays.values())


def _summed(model: str, sites: int, per: dict, results: tuple = (), parts: tuple = (), named: int = 0) -> Cost:
    """The Cost of a plan whose nodes cost ``per`` (plan order)."""
    return Cost(
        model, sites,
        sum(c.floats_moved for c in per.values()),
        sum(c.bytes_moved for c in per.values()),
        np.max([c.peak_bytes_per_site for c in per.values()], axis=0) if per else np.zeros(sites, np.int64),
        np.sum([c.flops_per_site for c in per.values()], axis=0) if per else np.zeros(sites),
        per, results=results, parts=parts, named=named)


_KEEP_MASK = 1 << 16  # a move's demand kept to count its moves again (larger: only from its node's memo)


class DeliveredCosts:
    """Costs of subplans that deliver every tuple of their layout (the search's ranking
    cost: ``plan_cost([root], whole=True)``), computed incrementally: the cost of a
    node's subplan under a demand on its tuples is its own node cost and its
    children's subplans' under the demand it puts on them, each remembered per
    (node, demand) — the search meets one subplan under many candidates.  Adding
    subplans is exact when they share no node under different demands and no array
    moves to one site in two of them (their moves' code ranges are disjoint, or
    :func:`_moved_once` proves it: :func:`_one_transfer_per_array_and_site` would count
    it once); where one may, the moves are counted again over the subplan's movers in
    plan order from their remembered moves (:func:`_counted_once`, as ``plan_cost``
    counts them); otherwise, and for a node that reads one child twice, it is
    ``plan_cost`` of the subplan."""

    _DEPTH = 200  # deeper than this, a subplan is costed whole (no deep recursion)

    def __init__(self, model: str = "exact"):
        if model not in COST_MODELS:
            raise ValueError(f"unknown cost_model {model!r}; valid: {', '.join(COST_MODELS)}")
        self.model = model
        self.subs: dict = {}  # (node, digest of its demand) -> (Cost of its subplan, its moves' spans)
        self.delivered: dict = {}  # root -> Cost of its subplan delivering all its tuples
        self.masks: dict = {}  # (Broadcast/Shuffle, digest) -> the demand on it

    def __call__(self, root: PNode) -> Cost:
        hit = self.delivered.get(root)
        if hit is None:
            every = np.ones(root.layout.ntuples, dtype=bool)
            hit = self.delivered[root] = self._sub(root, every, mask_digest(every), 0)[0]
        return hit

    def _sub(self, node: PNode, mask: np.ndarray, digest: bytes, depth: int) -> tuple:
        key = (node, digest)
        hit = self.subs.get(key)
        if hit is None:
            if isinstance(node, (Broadcast, Shuffle)) and len(mask) <= _KEEP_MASK:
                self.masks[key] = mask
            hit = self.subs[key] = (self._added(node, mask, digest, depth)
                                    or _plan_cost([node], self.model, True, {node: mask}))
        return hit

    def _added(self, node: PNode, mask: np.ndarray, digest: bytes, depth: int) -> tuple | None:
        kids = node.children
        if depth > self._DEPTH or len(set(map(id, kids))) < len(kids):
            return None
        masks = child_demand(node, mask)
        kid_digests = [mask_digest(m) for m in masks]
        below = [self._sub(c, m, d, depth + 1) for c, m, d in zip(kids, masks, kid_digests)]
        per: dict = {}
        spans: dict = {}
        for c, sp in below:
            per.update(c.nodes)
            spans.update(sp)
        disjoint = len(per) == sum(len(c.nodes) for c, _ in below)
        if not disjoint and not all(per[n] is nc for c, _ in below for n, nc in c.nodes.items()):
            return None  # a node in two children's subplans under different demands
        need = {node: mask, **dict(zip(kids, masks))}
        per[node] = own = _node_cost_memo(node, self.model, need, {node: digest, **dict(zip(kids, kid_digests))})
        if self.model == "exact" and isinstance(node, (Broadcast, Shuffle)):
            _, lo, hi, _ = _needed_moves(node, mask, digest)
            if lo <= hi:
                spans[node] = (lo, hi, digest, own)
        parts = tuple(c for c, _ in below) if disjoint else ()
        ranges = sorted(v[:2] for v in spans.values())
        if any(a[1] >= b[0] for a, b in zip(ranges, ranges[1:])) and not _moved_once(node, below, spans):
            # an array may move to one site in two of them: count each move once, for the
            # first mover in plan order, from the movers' own costs (the plan's own node
            # objects: a copy's id is its object's, and an equal node made apart numbers
            # its copies otherwise)
            movers = [n for n in toposort([node]) if n in spans]
            arrays = [_remembered_moves(n, spans[n][2], self.masks.get((n, spans[n][2]))) for n in movers]
            if any(a is None for a in arrays):
                return None  # its moves not at hand, or too many to remember: the whole subplan's cost
            recount = _counted_once(movers, arrays, [spans[n][3] for n in movers])
            changed = {n: c for n, c in recount.items() if c.floats_moved != per[n].floats_moved}
            if changed:  # (else each mover counts what its subplan counted: their path terms hold)
                per.update(changed)
                parts = ()
        return _summed(self.model, node.nsites, per, (), parts), spans


def _moved_once(node: PNode, below: list, spans: dict) -> bool:
    """Whether adding the subplans ``below`` (each ``(Cost, spans)``) and ``node``
    counts each move of an array to a site where ``plan_cost`` of the whole counts it.
    A non-moving ``node``: every (array, site) code moved by two movers is moved by two
    of one child's subplan alone, or by two that are each in several children's
    subplans with one cost (the caller checked that those children's costs agree on
    them).  Those subplans' costs counted it once, for the first; the whole plan's
    order keeps each subplan's order.  A moving ``node``: no code is moved twice at
    all (a repeated move's copy is the first one's, so a later move of it may repeat
    a move its codes do not show: ``first_moves`` renames, this check does not).
    False when a mover's moves are not remembered (evicted, or too many to keep):
    not proved."""
    owner: dict = {}
    for i, (_, sp) in enumerate(below):
        for m in sp:
            owner[m] = i if owner.get(m, i) == i else -1  # -1: in two children's subplans
    codes, labels = [], []
    for m, (lo, hi, digest, _) in spans.items():
        a = _remembered_moves(m, digest)
        if a is None:
            return False
        codes.append(a[0] * np.int64(m.nsites) + a[1])
        labels.append(np.full(len(a[0]), owner.get(m, -2), np.int64))  # (-2: node)
    code, label = np.concatenate(codes), np.concatenate(labels)
    order = np.argsort(code, kind="stable")
    code, label = code[order], label[order]
    dup = code[1:] == code[:-1]  # a code moved by two movers (a mover's own moves are distinct)
    if node in spans:
        return not np.any(dup)
    return not np.any(dup & (label[1:] != label[:-1]))


def _result(node: PNode) -> tuple:
    """``(bytes, chunks)`` of a plan's result ``node``: one copy of each of its keys."""
    t = node.type
    return float(t.chunk_sizes.sum()) * t.dtype.itemsize, int(t.ntuples)


def _one_transfer_per_array_and_site(nodes, need, per, digests: dict):
    """Two moves of one array to one site (from different Broadcast/Shuffle nodes)
    are one transfer on a cluster: the worker already holds it.  Count it for the
    first node (in plan order) that moves it (:func:`~tra_dask.physical.work.first_moves`,
    which the work's transfers use too: a copy two nodes made is one copy, also to
    a later move).

    What each node moves is summarised once per (node, demand) and remembered on the
    node (:func:`_needed_moves`: the search re-costs one big broadcast under many
    plans); when no two nodes' code ranges (``array * sites + destination``) meet
    (the usual case: moves of unrelated arrays) no move is in two nodes and each
    node's count is its own."""
    movers = [n for n in nodes if isinstance(n, (Broadcast, Shuffle))]
    if not movers:
        return dict(per), {}
    parts = [_needed_moves(n, need[n], digests[n]) for n in movers]
    counted = {n: (p[1], p[2], digests[n], per[n]) for n, p in zip(movers, parts) if p[1] <= p[2]}
    spans = sorted(v[:2] for v in counted.values())
    if all(a[1] < b[0] for a, b in zip(spans, spans[1:])):  # disjoint ranges: no code in two nodes
        return dict(per), counted
    arrays = [p[3] if p[3] is not None else _needed_move_arrays(n, need[n]) for n, p in zip(movers, parts)]
    out = dict(per)
    out.update(_counted_once(movers, arrays, [per[n] for n in movers]))
    return out, counted


def _counted_once(movers: list, arrays: list, own: list) -> dict:
    """``{mover: its NodeCost counting only the moves it makes first}`` for the
    Broadcast/Shuffle nodes ``movers`` of a plan, in plan order, given each one's
    :func:`_needed_move_arrays` and its own NodeCost (every needed move counted)."""
    first = first_moves([m[:3] for m in arrays], max(n.nsites for n in movers))
    out, lo = {}, 0
    for n, f, m, c in zip(movers, first, arrays, own):
        fl = int(m[3][f == np.arange(lo, lo + len(f))].sum())  # exact integer sums
        lo += len(f)
        if fl != c.floats_moved:
            scale = fl / c.floats_moved if c.floats_moved else 0.0  # per site: in proportion (time model)
            c = dataclasses.replace(
                c, floats_moved=fl, bytes_moved=fl * n.type.dtype.itemsize,
                recv_per_site=None if c.recv_per_site is None else c.recv_per_site * scale,
                send_per_site=None if c.send_per_site is None else c.send_per_site * scale)
        out[n] = c
    return out


_KEEP_MOVES = 1 << 20  # needed moves of a node whose arrays are remembered (more: recomputed if ever needed)


def _needed_moves(n: PNode, mask: np.ndarray, digest: bytes | None) -> tuple:
    """``(floats, lo, hi, arrays)`` for the needed moves of the Broadcast/Shuffle
    ``n``: the floats of its distinct moves, the range of their codes ``array *
    sites + destination`` (``lo > hi`` when none), and :func:`_needed_move_arrays`
    (``None`` when there are more than :data:`_KEEP_MOVES`).  Remembered on the node
    per demand digest: a broadcast's layout can hold 10^7 tuples, and the search
    costs it under many plans."""
    memo = n.__dict__.get("_moves_memo")
    if memo is None:
        memo = {}
        object.__setattr__(n, "_moves_memo", memo)
    key = mask_digest(mask) if digest is None else digest
    hit = memo.get(key)
    if hit is None:
        arrays = _needed_move_arrays(n, mask)
        codes = arrays[0] * np.int64(n.nsites) + arrays[1]
        lo, hi = (int(codes.min()), int(codes.max())) if len(codes) else (0, -1)
        hit = (int(arrays[3].sum()), lo, hi, arrays if len(codes) <= _KEEP_MOVES else None)
        if len(memo) >= _MEMO_PER_NODE:
            memo.pop(next(iter(memo)))
        memo[key] = hit
    return hit


def _remembered_moves(n: PNode, digest: bytes, mask: np.ndarray | None = None) -> tuple | None:
    """:func:`_needed_move_arrays` of ``n`` under the demand with ``digest``, as
    :func:`_needed_moves` remembered them (derived now from ``mask`` when given); None
    when they are not at hand or were too many to keep."""
    hit = n.__dict__.get("_moves_memo", {}).get(digest)
    if hit is None and mask is not None:
        hit = _needed_moves(n, mask, digest)
    return None if hit is None else hit[3]


def _needed_move_arrays(n: PNode, mask: np.ndarray) -> tuple:
    """``(array, site, copy, floats)``: the distinct needed moves of ``n`` (the array
    each carries, its destination, the copy it makes there, its floats), in layout
    order, each as its first occurrence.  A moved tuple's object is new per (source
    object, destination) (:func:`~tra_dask.physical.layout.fresh_per_class`), so
    when the layout's origins are distinct (computed once per layout) its moves
    already are."""
    lay = n.layout
    idx = np.flatnonzero(lay.moved & mask)
    if not lay.origins_distinct():
        idx = idx[first_positions(lay.origin_at(idx))]
    return (n.input.layout.origin_at(lay.lineage[0][idx]).astype(np.int64), lay.sites[idx].astype(np.int64),
            lay.origin_at(idx), n.type.chunk_sizes[lay.rows[idx]])


def brute_force_frontier(node: PNode) -> tuple:
    """The paper's frontier inference for a LocalFilter or LocalMap (§5.3): feed every
    key below the *input's frontier* to the predicate or key function and take one
    past the largest value per dim.  It assumes a continuous input, as the paper does;
    the exact key sets (``node.type``) need no such assumption — tests check the two
    agree."""
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
