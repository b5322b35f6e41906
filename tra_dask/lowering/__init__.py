"""Lowering: one topological pass from a physical plan to a Dask task graph in which
every task is pinned to one worker.

What runs is :mod:`tra_dask.physical.work`'s derivation of the plan, emitted as is:
one Dask task per task there, one visitor per physical node type, so the tasks the
cost model counts are the tasks the graph holds.  Every physical tuple ``(key, site)``
the results need (:func:`~tra_dask.physical.demand`) has one Dask key, unique to the
submission: ``(f"{op}-{node}-{token}", i)`` for the tuple ``i`` a task of the node
makes (``i`` the first tuple of the node's layout that task makes), or the key of the
input tuple it aliases.  A Broadcast or Shuffle becomes, for each array it moves to a
site, an identity task on the destination worker that depends on the source tuple —
Dask's own transfer moves the bytes; a tuple already at its destination costs neither
a task nor a byte (an alias), and an array another move of the plan already brought
to that site is read from that copy there.  Local operators become kernel tasks on
their site; LocalFilter, pure rekeys and aggregation groups of one are aliases.  An
aggregation group of several is one task, folding (or concatenating) its chunks in
key order; inputs fused into it (a site's partial products) are each made just
before they are folded in (``tasks.fold_deferred``), not all before the fold
(``dask.config.set({"tra-dask.fold-one-at-a-time": False})``: all before, as
``tasks.fold`` — for comparison).

A task the work fuses into its one reader (``PlanWork.into``: local computations on
one site, chosen after placement) is emitted as a nested call inside that reader's
task instead of as a task of its own — a ``dask.task_spec.Task`` argument, which
Dask runs in place — so the reader's key stands for the chain and the fused task has
no key in the graph.  No Dask graph optimisation runs on the result: tasks are
grouped into one ``MaterializedLayer`` per worker carrying ``{"workers": [addr],
"allow_other_workers": False}``, wrapped in a ``HighLevelGraph``.
"""

from __future__ import annotations

import uuid
import weakref
from collections import defaultdict
from dataclasses import dataclass, field

import dask
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import List, Task, TaskRef

from ..kernels import content_digest, data_address, is_device
from ..physical import (Broadcast, LocalAggregate, LocalFilter, LocalJoin, LocalMap, PSource, Shuffle, result_copies)
from ..physical.work import NodeWork, PlanWork, plan_work
from . import tasks
from .keys import data_key, task_name

__all__ = ["lower", "Lowered", "content_token"]


@dataclass
class Lowered:
    """A lowered plan: what to scatter where, the pinned graph, and where results are."""

    token: str
    workers: list
    layers: dict = field(default_factory=lambda: defaultdict(dict))   # worker -> {key: Task}
    scatter: dict = field(default_factory=lambda: defaultdict(dict))  # worker -> {key: chunk}
    scatter_owner: dict = field(default_factory=dict)  # scattered key -> the array it came from
    scatter_region: dict = field(default_factory=dict)  # scattered key -> (address, shape) of its chunk in it
    node_keys: dict = field(default_factory=dict)  # PNode -> [dask key per physical tuple]
    planned: dict = field(default_factory=dict)    # dask key -> worker, for every task
    outputs: list = field(default_factory=list)    # per output: {TRA key: dask key}
    moves: dict = field(default_factory=dict)      # (source key, site) -> the key of that transfer
    work: PlanWork | None = None                   # what the graph runs: physical.work's derivation
    fused: dict = field(default_factory=dict)      # key of a fused task -> its Task, until its reader takes it
    defer: bool = True                             # folds make their fused inputs one at a time

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
    out = Lowered(token, list(workers), defer=bool(dask.config.get("tra-dask.fold-one-at-a-time", True)))
    out.work = work = plan.work if hasattr(plan, "work") else plan_work(plan.outputs)
    inner: dict = {}
    for n, t in work.into:
        inner.setdefault(n, set()).add(t)
    for i, node in enumerate(work.order):
        name = task_name(node._op, i, token)
        w = work[node]
        task_keys = [(name, int(j)) for j in w.task_tuple.tolist()]
        for t in inner.get(node, ()):
            out.fused[task_keys[t]] = None  # made below, taken by its reader
        _VISIT[type(node)](node, w, task_keys, out)
        out.node_keys[node] = _keys(node, w, task_keys, out)
    if out.fused:  # a fused task nobody took: a bug in the work's fusion
        raise AssertionError(f"fused tasks with no reader: {list(out.fused)[:3]}")
    for o in plan.outputs:
        keys, tra_keys = out.node_keys[o], o.type.key_list()
        copies = result_copies(o.layout, o.type.ntuples)  # one copy of each key: the lowest site's
        out.outputs.append({tra_keys[r]: keys[c] for r, c in enumerate(copies.tolist())})
    return out


def _keys(node, w: NodeWork, task_keys: list, out: Lowered) -> list:
    """The Dask key of every physical tuple: its task's, its input's (an alias), a
    resident chunk's, or None where the plan does not need it."""
    if w.resident:
        existing = dict(node.source.dask_keys)
        tra_keys = node.type.key_list()
        return [existing[tra_keys[r]] for r in node.layout.rows.tolist()]
    in_keys = out.node_keys[node.children[0]] if node.children else None
    return [task_keys[t] if t >= 0 else in_keys[a] if a >= 0 else None
            for t, a in zip(w.made_by.tolist(), w.alias.tolist())]


def _refs(node, w: NodeWork, t: int, out: Lowered) -> list:
    """Task ``t``'s inputs, in call order: a TaskRef to each, or the task itself
    where it is fused into this one."""
    a, b = int(w.in_ptr[t]), int(w.in_ptr[t + 1])
    kids = node.children
    return [_ref(out, out.node_keys[kids[c]][i]) for c, i in zip(w.in_child[a:b].tolist(), w.in_tuple[a:b].tolist())]


def _ref(out: Lowered, key):
    task = out.fused.pop(key, None)
    return TaskRef(key) if task is None else task


def _task(out: Lowered, site: int, key, fn, *args):
    if key in out.fused:  # runs inside its reader (physical.work's fusion)
        out.fused[key] = Task(key, fn, *args)
        return key
    w = out.workers[site]
    out.layers[w][key] = Task(key, fn, *args)
    out.planned[key] = w
    return key


def _visit_source(node: PSource, w: NodeWork, task_keys: list, out: Lowered):
    src, t = node.source, node.type
    if w.resident:
        return
    tra_keys, rows = t.key_list(), node.layout.rows
    shapes = t.chunk_shapes() if w.kind == "load" else None
    names = None  # the chunk names of the array they are cut from (see _ChunkNames)
    for j, (key, i, site) in enumerate(zip(task_keys, w.task_tuple.tolist(), w.task_site.tolist())):
        tk = tra_keys[int(rows[i])]
        if w.kind == "load":
            _task(out, site, key, tasks.load, src.fn, tk, shapes[tk], str(t.dtype), src.name)
        else:  # "scatter": data in this process goes straight to its site
            chunk = src.load(tk)
            worker = out.workers[site]
            if _is_array(chunk):
                # a view: copied (if not contiguous) only when sent, one worker's chunks at a time;
                # named by its content, position and worker, so a later submission of the same
                # data finds it there (runtime's scatter cache) and it is not sent again
                owner = getattr(src, "array", chunk)
                if _is_array(owner) and owner is not chunk:
                    names = _ChunkNames(owner) if names is None else names
                    token = names(chunk)
                else:
                    token = content_token(chunk)
                key = task_keys[j] = data_key(_tag(owner), token, worker, tk)
                out.scatter_owner[key] = owner
                out.scatter_region[key] = (data_address(chunk), tuple(chunk.shape))
            out.scatter[worker][key] = chunk
            out.planned[key] = worker
    if names is not None:
        names.close()


_TAGS: dict = {}  # id(array) -> a tag unique to that array object while it lives
_CHUNK_TOKENS: dict = {}  # id(array) -> (the array's token, {chunk's place in it: chunk's token})


def _is_array(x) -> bool:
    return isinstance(x, np.ndarray) or is_device(x)


def content_token(x) -> str:
    """A name for an array's content, shape and dtype (dask's token of a memory map
    covers its bytes only).  A cupy array is named on its device
    (:func:`tra_dask.kernels.content_digest`): dask would pickle it, a copy to the
    host of all its bytes."""
    if is_device(x):
        return "device-" + content_digest(x)
    return tokenize(x, x.shape, x.dtype.str)


class _ChunkNames:
    """Content names of the chunks cut from one array, for one lowering.  Hashing a
    strided chunk copies it, and every submission names its chunks again; so a
    contiguous array is hashed whole (no copy) and each chunk's name is remembered
    while the array's is the same (same content, so the same chunks) — found by hashing
    only when the array changed, and then only the chunks that changed get new names
    and are sent again.  A name found by hashing a chunk is kept only if the array was
    still the same after it (another thread may change the array meanwhile).  A
    non-contiguous array (hashing it whole would copy all of it at once) has its chunks
    hashed every time."""

    def __init__(self, owner):
        self.owner, self.memo, self.content, self.found = owner, None, None, False
        if not (owner.flags.c_contiguous or owner.flags.f_contiguous):
            return
        ident = id(owner)
        content = content_token(owner)
        seen = _CHUNK_TOKENS.get(ident)
        if seen is None or seen[0] != content:
            if seen is None:
                try:
                    weakref.finalize(owner, _CHUNK_TOKENS.pop, ident, None)
                except TypeError:  # not weak-referenceable: not remembered
                    return
            seen = _CHUNK_TOKENS[ident] = (content, {})
        self.memo, self.content = seen[1], content

    def __call__(self, chunk) -> str:
        if self.memo is None:
            return content_token(chunk)
        place = (data_address(chunk), chunk.shape, chunk.strides, chunk.dtype.str)
        token = self.memo.get(place)
        if token is None:
            token = self.memo[place] = content_token(chunk)
            self.found = True
        return token

    def close(self) -> None:
        """Forget the names this lowering found if the array changed while it hashed."""
        if self.found and content_token(self.owner) != self.content:
            _CHUNK_TOKENS.pop(id(self.owner), None)


def _tag(owner) -> str:
    """A name unique to ``owner`` (the array chunks are cut from) for its lifetime: keys
    of two arrays never coincide, even with equal content (Dask must not see a key
    made again while its release is still on the way)."""
    ident = id(owner)
    tag = _TAGS.get(ident)
    if tag is None:
        tag = uuid.uuid4().hex[:8]
        try:
            weakref.finalize(owner, _TAGS.pop, ident, None)
        except TypeError:  # not weak-referenceable: a new name each time (sent each time)
            return tag
        _TAGS[ident] = tag
    return tag


def _visit_move(node, w: NodeWork, task_keys: list, out: Lowered):
    """Broadcast and Shuffle: a task on the destination for each array that arrives
    there; one the plan already moved there is read from that copy (no bytes)."""
    in_keys = out.node_keys[node.input]
    via = out.work.via
    for t, (key, site, p) in enumerate(zip(task_keys, w.task_site.tolist(), w.in_tuple.tolist())):
        first = via.get((node, t))
        if first is None:
            out.moves[(in_keys[p], site)] = _task(out, site, key, tasks.identity, TaskRef(in_keys[p]))
        else:
            fnode, ft = first  # (an earlier task of this node when two copies it carries are one)
            fkey = task_keys[ft] if fnode is node else out.node_keys[fnode][int(out.work[fnode].task_tuple[ft])]
            _task(out, site, key, tasks.identity, TaskRef(fkey))


def _checks(node, w: NodeWork, kernel) -> list:
    """Per task, what its output must be: ``(shape, dtype, node, kernel, TRA key)``."""
    t = node.type
    rows = node.layout.rows[w.task_tuple]
    dtype, label, name = str(t.dtype), node.label, getattr(kernel, "name", kernel)
    return [(t.shapes[s], dtype, label, name, tuple(k))
            for s, k in zip(t.shape_ids[rows].tolist(), t.keys[rows].tolist())]


def _visit_join(node: LocalJoin, w: NodeWork, task_keys: list, out: Lowered):
    fn, params = node.kernel.fn, node.kernel.params
    checks = _checks(node, w, node.kernel)
    for t, (key, site) in enumerate(zip(task_keys, w.task_site.tolist())):
        _task(out, site, key, tasks.apply, fn, params, checks[t], *_refs(node, w, t, out))


def _visit_aggregate(node: LocalAggregate, w: NodeWork, task_keys: list, out: Lowered):
    k = node.kernel
    checks = _checks(node, w, k) if w.kind != "concat" else None
    for t, (key, site) in enumerate(zip(task_keys, w.task_site.tolist())):
        refs = _refs(node, w, t, out)
        if w.kind == "concat":
            _task(out, site, key, tasks.concat, k.array_dim, *refs)
        elif out.defer and len(refs) > 1 and any(_deferrable(r) for r in refs):  # made as they are folded in
            _task(out, site, key, tasks.fold_deferred, k.fn, k.params, checks[t], *map(_deferred, refs))
        else:
            _task(out, site, key, tasks.fold, k.fn, k.params, checks[t], *refs)


def _deferrable(r) -> bool:
    return type(r) is Task and not r.kwargs  # a fused task (not a container, not a reference)


def _deferred(r):
    """A fused task as data Dask does not run — ``[DEFERRED, key, func, *args]``, its
    references resolved, its own fused tasks deferred the same way — for
    :func:`tasks.fold_deferred` to run when it folds it in; anything else as it is."""
    if not _deferrable(r):
        return r
    return List(tasks.DEFERRED, r.key, r.func, *map(_deferred, r.args))


def _visit_filter(node: LocalFilter, w: NodeWork, task_keys: list, out: Lowered):
    pass  # aliases only


def _visit_map(node: LocalMap, w: NodeWork, task_keys: list, out: Lowered):
    op = node.op
    if w.kind == "tile":
        tix = node.type.keys[node.layout.rows[w.task_tuple], -1].tolist()
        for t, (key, site, ti) in enumerate(zip(task_keys, w.task_site.tolist(), tix)):
            (ref,) = _refs(node, w, t, out)
            _task(out, site, key, tasks.tile_slice, ref, op.tile_dim, ti * op.tile_size, (ti + 1) * op.tile_size)
    elif w.kind == "kernel":
        checks = _checks(node, w, op.kernel)
        for t, (key, site) in enumerate(zip(task_keys, w.task_site.tolist())):
            _task(out, site, key, tasks.apply, op.kernel.fn, op.kernel.params, checks[t], *_refs(node, w, t, out))
    # a pure rekey: aliases only


_VISIT = {
    PSource: _visit_source, Broadcast: _visit_move, Shuffle: _visit_move, LocalJoin: _visit_join,
    LocalAggregate: _visit_aggregate, LocalFilter: _visit_filter, LocalMap: _visit_map,
}

