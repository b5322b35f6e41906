"""Implementation-algebra nodes (paper §4): TRA with a site on every tuple.

``Broadcast`` and ``Shuffle`` move tuples between sites; ``LocalJoin``,
``LocalAggregate``, ``LocalFilter`` and ``LocalMap`` work within each site.  Every
node is immutable and structurally equal like the logical nodes, and knows when it
is made both its type (the same type rule as the TRA operator it implements) and its
:class:`~tra_dask.physical.layout.Layout` — exactly which site holds which key.  A
plan built by hand that cannot be right (a local join whose inputs never meet, a
partial aggregate fed to a join) is rejected there, with the keys and sites named.
"""

from __future__ import annotations

import threading

import weakref
from collections import OrderedDict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from ..kernels import Kernel
from ..keys import InsertDim, KeyFn
from ..logical.nodes import (check_dims, aggregate_type, concat_type, filter_type, join_type, rekey_type,
                             tile_type, transform_type)
from ..logical.sources import FromFunction, Source
from ..node import Node
from ..types import RelationType
from . import layout as L
from .placement import All, Assign, Grid, KeySites, Part, Placement

__all__ = [
    "PNode", "PSource", "Broadcast", "Shuffle", "LocalJoin", "LocalAggregate", "LocalFilter", "LocalMap",
    "KeyArrayMap", "TileMap", "ConcatAgg",
]


class PNode(Node):
    """A physical relation: an IA expression node."""

    _op = "pnode"

    def __post_init__(self):
        table = _INTERN.get()
        if table is not None:
            key = (type(self), self._params(), self.children)  # (params not memoised before the hash)
            same = table.get(key)
            # made before in this search over the same arrays (its children's layouts are
            # these children's: a layout names the arrays its tuples hold, and equal nodes
            # built apart hold different ones): what it derived, and its memos
            # (and equal to it: parameters as its type rule left them, what no token names)
            if (same is not None and all(a.layout is b.layout for a, b in zip(self.children, same.children))
                    and same._params() == key[1] and self._same_extra(same)):
                if "_cost_memo" not in same.__dict__:
                    object.__setattr__(same, "_cost_memo", {})
                for name, value in same.__dict__.items():
                    if name not in _OWN and name not in self.__dataclass_fields__:
                        object.__setattr__(self, name, value)
                # node equality stops here while the block lasts (Node.__eq__)
                object.__setattr__(self, "_canon", same.__dict__.get("_canon", same))
                table.made.append(weakref.ref(self))
                object.__setattr__(self, "_params_memo", key[1])  # (no type rule ran: as computed above)
                hash(self)
                return
        super().__post_init__()
        object.__setattr__(self, "_layout", self._infer_layout())
        if table is not None:
            table[key] = self

    def _infer_layout(self) -> L.Layout:
        raise TypeError(f"{type(self).__name__} has no layout rule")

    @property
    def layout(self) -> L.Layout:
        """Which site holds which key (derived when the node was made)."""
        return self.__dict__["_layout"]

    @property
    def nsites(self) -> int:
        return self.layout.nsites


    @property
    def placement(self):
        """A description of the layout: All, Part(dims), an explicit map, or
        ``"partial"``/``"mixed"`` when none applies (derived once per node; a node's
        reads its inputs', described first, bottom-up: no recursion down a long
        chain)."""
        got = self.__dict__.get("_placement")
        if got is None:
            todo, order, seen = [self], [], {id(self)}
            while todo:
                n = todo.pop()
                if "_placement" not in n.__dict__:
                    order.append(n)
                    for c in n.children:
                        if id(c) not in seen:  # a DAG: each node once, not once per path
                            seen.add(id(c))
                            todo.append(c)
            for n in reversed(order):  # inputs before their readers
                if "_placement" not in n.__dict__:
                    object.__setattr__(n, "_placement", _describe(n))
            got = self.__dict__["_placement"]
        return got


_INTERN: ContextVar = ContextVar("tra_dask_pnode_intern", default=None)


@contextmanager
def interned(seed=()):
    """Within this block (one search), a physical node equal to one made before in it,
    over children with the same layouts, takes that one's type and layout (derived
    once, not again) and shares its cost memos: the search rebuilds the same node
    under many combinations of children (about two in three nodes it makes).  Equal
    children with other layouts (built apart: their tuples name other array
    objects, see :func:`~tra_dask.node.canonical`) derive anew — a copied layout
    would name arrays of nodes not in the plan, and a transfer the plan makes twice
    would be counted once or a shared one twice.  ``seed``: nodes made before the block that it
    builds on (the search's input, made canonical first).  The table ends with the block,
    and so does each such node's link to the one it equals (``_canon``: it would keep
    that node, and what it holds, alive as long as the plans)."""
    table = _Table()
    for node in seed:
        table.setdefault((type(node), node._params(), node.children), node)
    token = _INTERN.set(table)
    try:
        yield
    finally:
        _INTERN.reset(token)
        for ref in table.made:
            node = ref()
            if node is not None:
                node.__dict__.pop("_canon", None)


class _Table(dict):
    """An :func:`interned` block's nodes by (type, parameters, children), and the
    nodes that took an earlier one's derivations (weakly)."""

    def __init__(self):
        super().__init__()
        self.made: list = []


_OWN = frozenset({"_hash", "_kids", "_params_memo", "_label"})  # of the node itself, not shared with an equal one

_TYPES: "OrderedDict" = OrderedDict()
_TYPES_LOCK = threading.Lock()


def _typed(key: tuple, derive):
    """A type rule's result memoised on its inputs' *type objects* (by identity) and
    parameters: the search builds one logical join or aggregation under many
    placements, and moves pass their input's type object through, so the same rule
    would be derived again for every placement.  (A failing rule is not memoised:
    it raises each time.)"""
    ident = tuple(id(k) if isinstance(k, RelationType) else k for k in key)
    with _TYPES_LOCK:  # planning from several threads: the LRU's get/move/evict must not interleave
        hit = _TYPES.get(ident)
        if hit is not None and all(a is b for a, b in zip(hit[0], key) if isinstance(a, RelationType)):
            _TYPES.move_to_end(ident)
            return hit[1]
    t = derive()  # (outside the lock: two threads may derive one type; both results are equal)
    with _TYPES_LOCK:
        _TYPES[ident] = (key, t)  # the key holds the input types alive, so their ids stay theirs
        while len(_TYPES) > 4096:
            _TYPES.popitem(last=False)
    return t


def _same_sites(where: str, *nodes: PNode) -> int:
    counts = {n.nsites for n in nodes}
    if len(counts) > 1:
        raise L.PlacementError(f"{where}: inputs are placed on different numbers of sites {sorted(counts)}")
    return counts.pop()


@dataclass(frozen=True, eq=False, repr=False)
class PSource(PNode):
    """A source relation with its initial placement.  ``free``: loading a chunk
    costs the same on any site (``from_function``, scattered ``from_numpy``), so an
    optimizer may choose the placement; a fixed placement is where data already is."""

    source: Source
    placement_: Placement
    free: bool = True
    _op = "source"

    def _params(self):
        p = self.__dict__.get("_params_memo")
        if p is None:
            p = (hash(self.source), self.placement_.token, self.free)
            object.__setattr__(self, "_params_memo", p)
        return p

    def _same_extra(self, other) -> bool:
        return self.source == other.source

    def _infer_type(self) -> RelationType:
        if not isinstance(self.source, Source):
            raise TypeError(f"PSource needs a source relation, got {type(self.source).__name__}")
        return self.source.type

    def _infer_layout(self):
        p, t = self.placement_, self.type
        if isinstance(p, All):
            return L.source_layout(t, None, p.nsites)
        # (chunks a function makes are made by each node's tasks: not one array)
        owner = None if isinstance(self.source, FromFunction) else self.source
        if isinstance(p, (Part, Grid, Assign)):
            return L.source_layout(t, p.sites(t), p.nsites, owner)
        if isinstance(p, KeySites):
            return L.source_layout(t, p.sites(t, self.source.label), p.nsites, owner)
        raise TypeError(f"source {self.source.label}: unknown placement {p!r}")

    @property
    def label(self):
        return self.source.label

    def _fmt_params(self) -> str:
        return ""

    def __repr__(self):
        return f"{self.source.label}@{self.placement_!r}"


@dataclass(frozen=True, eq=False, repr=False)
class Broadcast(PNode):
    """Every tuple to every site (output placement All)."""

    input: PNode
    _op = "Broadcast"
    _children = ("input",)

    def _infer_type(self):
        return self.input.type

    def _infer_layout(self):
        if self.input.layout.partial:
            raise L.PlacementError(f"Broadcast({self.input.label}): the input holds partial aggregates; finish them first")
        return L.broadcast_layout(self.input.layout, self.type)


@dataclass(frozen=True, eq=False, repr=False)
class Shuffle(PNode):
    """Repartition on the key dims ``dims``: output placement ``Part(dims)``, or, with
    a ``grid`` shape, ``Grid(dims, grid)`` (``dims`` then names the key dim driving
    each grid axis, None for a spread axis), or, with a ``table``, ``Assign(dims[0],
    table)`` (one dim; value v to site ``table[v]``)."""

    input: PNode
    dims: tuple
    grid: tuple = ()
    table: tuple = ()
    _op = "Shuffle"
    _children = ("input",)

    def _fmt_params(self) -> str:
        if self.table:
            return f"table={self.target!r}"
        return f"dims={self.dims}" if not self.grid else f"grid={self.target!r}"

    def _infer_type(self):
        where = f"Shuffle({self.input.label})"
        if self.grid and self.table:
            raise ValueError(f"{where}: a shuffle has a grid or a table, not both")
        if self.grid:
            driven = tuple(d for d in self.dims if d is not None)
            check_dims(where, self.input, driven, "dims", self.input.type.arity)
            object.__setattr__(self, "dims", tuple(None if d is None else int(d) for d in self.dims))
            object.__setattr__(self, "grid", tuple(int(g) for g in self.grid))
        else:
            dims = check_dims(where, self.input, self.dims, "dims", self.input.type.arity)
            object.__setattr__(self, "dims", dims)
            if self.table:
                if len(dims) != 1:
                    raise ValueError(f"{where}: a table assigns the values of one key dim, got dims {dims}")
                object.__setattr__(self, "table", tuple(int(x) for x in self.table))
        return self.input.type

    @property
    def target(self) -> Placement:
        """Where the shuffle sends each key: ``Part(dims)``, ``Grid(dims, grid)`` or
        ``Assign(dim, table)``."""
        s = self.input.nsites
        if self.table:
            return Assign(self.dims[0], self.table, s)
        return Grid(self.dims, self.grid, s) if self.grid else Part(self.dims, s)

    def _infer_layout(self):
        return L.shuffle_layout(self.input.layout, self.type, self.target.sites(self.type))


@dataclass(frozen=True, eq=False, repr=False)
class LocalJoin(PNode):
    """Join within each site: only tuples on the same site pair up (paper §4).

    ``key_fn`` (optional, multiplicity one) maps each output key, so a following
    LocalMap can be merged into the join (R1-7, as in the paper's diag(X+Y) plan)."""

    left: PNode
    right: PNode
    left_on: tuple
    right_on: tuple
    kernel: Kernel
    key_fn: KeyFn | None = None
    _op = "LocalJoin"
    _children = ("left", "right")

    def _fmt_params(self) -> str:
        s = f"left_on={self.left_on}, right_on={self.right_on}, kernel={self.kernel!r}"
        return s + (f", key_fn={self.key_fn!r}" if self.key_fn is not None else "")

    @property
    def join_type(self) -> RelationType:
        """The type before ``key_fn``."""
        return self.__dict__["_join_type"]

    def _infer_type(self):
        t = _typed(("join", self.left.type, self.right.type, tuple(self.left_on), tuple(self.right_on), self.kernel),
                   lambda: join_type(self, strict_ranges=False))
        object.__setattr__(self, "_join_type", t)
        if self.key_fn is None:
            return t
        if self.key_fn.multiplicity != 1:
            raise ValueError(f"LocalJoin({self.left.label}, {self.right.label}): key_fn must map one key to one key")
        return rekey_type(SimpleNamespace(input=SimpleNamespace(type=t, label=self.label), key_fn=self.key_fn))

    def _infer_layout(self):
        where = f"LocalJoin({self.left.label}, {self.right.label}, left_on={self.left_on}, right_on={self.right_on})"
        _same_sites(where, self.left, self.right)
        lay = L.join_layout(self.left.layout, self.left.type, self.right.layout, self.right.type,
                            self.left_on, self.right_on, self.join_type, where, self.left.label, self.right.label)
        if self.key_fn is None:
            return lay
        keys, _ = self.key_fn.apply(self.join_type.keys)
        to_out = self.type.locate(keys)
        return L.Layout(lay.nsites, to_out[lay.rows], lay.sites, lay.partial, lay.lineage, lay.moved, lay.origin)


@dataclass(frozen=True, eq=False)
class ConcatAgg:
    """The paper's ``arrayConcatOp``: a group aggregation that concatenates the
    group's chunks along ``array_dim`` in ``key_dim`` order (how concat compiles)."""

    key_dim: int
    array_dim: int

    @property
    def token(self):
        return ("concat", self.key_dim, self.array_dim)

    def __repr__(self):
        return f"concat(key_dim={self.key_dim}, array_dim={self.array_dim})"


@dataclass(frozen=True, eq=False, repr=False)
class LocalAggregate(PNode):
    """Aggregate within each site, grouping by ``group_by`` and site."""

    input: PNode
    group_by: tuple
    kernel: object  # Kernel (binary fold) or ConcatAgg
    _op = "LocalAggregate"
    _children = ("input",)

    def _infer_type(self):
        if isinstance(self.kernel, ConcatAgg):
            t = concat_type(SimpleNamespace(input=self.input, key_dim=self.kernel.key_dim, array_dim=self.kernel.array_dim))
            rest = tuple(d for d in range(self.input.type.arity) if d != self.kernel.key_dim)
            if tuple(self.group_by) != rest:
                raise ValueError(
                    f"LocalAggregate({self.input.label}, {self.kernel!r}): group_by must be the other "
                    f"key dims {rest}, got {tuple(self.group_by)}"
                )
            return t
        return _typed(("aggregate", self.input.type, tuple(self.group_by), self.kernel), lambda: aggregate_type(self))

    def _infer_layout(self):
        k = self.kernel
        can = isinstance(k, Kernel) and k.associative and k.commutative
        where = f"LocalAggregate({self.input.label}, group_by={self.group_by}, kernel={k!r})"
        return L.aggregate_layout(self.input.layout, self.input.type, self.group_by, self.type,
                                  can_be_partial=can, where=where)


@dataclass(frozen=True, eq=False, repr=False)
class LocalFilter(PNode):
    input: PNode
    pred: object
    _op = "LocalFilter"
    _children = ("input",)

    def _infer_type(self):
        return filter_type(self)

    def _infer_layout(self):
        t = self.input.type
        keep = np.asarray(self.pred.evaluate(t.keys), dtype=bool).reshape(-1)
        src = np.flatnonzero(keep)
        return L.expand_layout(self.input.layout, t.ntuples, np.arange(len(src)), src)


@dataclass(frozen=True, eq=False)
class KeyArrayMap:
    """``(keyMapFunc, arrayMapFunc)`` of a LocalMap: a key function of multiplicity
    m (rekey; ``insert_dim`` for the paper's insertDim/duplicate) and a unary kernel
    (None = idOp) applied once per tuple, its result shared by the m output keys."""

    key_fn: KeyFn
    kernel: Kernel | None = None

    @property
    def token(self):
        return ("keyarray", self.key_fn.token, None if self.kernel is None else self.kernel.token)

    def out_type(self, inp) -> RelationType:
        t = rekey_type(SimpleNamespace(input=inp, key_fn=self.key_fn))
        if self.kernel is None:
            return t
        return transform_type(SimpleNamespace(input=SimpleNamespace(type=t, label=inp.label), kernel=self.kernel))

    def lineage(self, t_in: RelationType, t_out: RelationType):
        fn = self.key_fn
        if isinstance(fn, InsertDim) and t_out.ntuples == t_in.ntuples * fn.count:
            # t_out is the insert_dim of t_in (out_type: keys distinct, so every copy is
            # a key): where each copy lands is arithmetic, no key matrix, no lookup
            n = t_in.ntuples
            return fn.sorted_rows(t_in.keys), np.repeat(np.arange(n, dtype=L._positions(n * fn.count)), fn.count)
        keys, src = fn.apply(t_in.keys)
        return t_out.locate(keys), src

    def __repr__(self):
        proj = getattr(self.key_fn, "projection", None)  # the identity reads as idOp
        parts = [] if proj is not None and proj == tuple(range(len(proj))) and proj else [f"key_fn={self.key_fn!r}"]
        if self.kernel is not None:
            parts.append(f"kernel={self.kernel!r}")
        return ", ".join(parts) or "idOp"


@dataclass(frozen=True, eq=False)
class TileMap:
    """``(keyTileOp, arrayTileOp)`` of a LocalMap: split each chunk along
    ``tile_dim``; the tile index becomes the new last key dim."""

    tile_dim: int
    tile_size: int

    @property
    def token(self):
        return ("tile", self.tile_dim, self.tile_size)

    def out_type(self, inp) -> RelationType:
        return tile_type(SimpleNamespace(input=inp, tile_dim=self.tile_dim, tile_size=self.tile_size))

    def lineage(self, t_in: RelationType, t_out: RelationType):
        sizes = np.array([s[self.tile_dim] for s in t_in.shapes], dtype=np.int64)[t_in.shape_ids]
        counts = -(-sizes // self.tile_size)
        src = np.repeat(np.arange(t_in.ntuples), counts)
        tix = np.arange(len(src)) - np.repeat(np.cumsum(counts) - counts, counts)
        return t_out.locate(np.concatenate([t_in.keys[src], tix[:, None]], axis=1)), src

    def __repr__(self):
        return f"tile(tile_dim={self.tile_dim}, tile_size={self.tile_size})"


@dataclass(frozen=True, eq=False, repr=False)
class LocalMap(PNode):
    """A multi-map within each site (paper §4): rekey, transform and tile are its
    special cases (``op`` is a :class:`KeyArrayMap` or a :class:`TileMap`)."""

    input: PNode
    op: object
    _op = "LocalMap"
    _children = ("input",)

    def _fmt_params(self):
        return repr(self.op)

    def _infer_type(self):
        return _typed(("map", self.input.type, self.op), lambda: self.op.out_type(self.input))

    def _infer_layout(self):
        lay = self.input.layout
        if lay.partial and not (isinstance(self.op, KeyArrayMap) and self.op.kernel is None):
            raise L.PlacementError(
                f"LocalMap({self.input.label}, {self.op!r}): the input holds partial aggregates; "
                f"only a pure rekey may run on them, finish the aggregation first"
            )
        out_rows, src = self.op.lineage(self.input.type, self.type)
        if isinstance(self.op, TileMap):
            data = "new"
        else:
            data = "same" if self.op.kernel is None else "per_input"
        return L.expand_layout(lay, self.input.type.ntuples, out_rows, src, data)


def _describe(node: PNode):
    lay, t = node.layout, node.type
    if isinstance(node, PSource):
        return node.placement_
    if lay.partial:
        return "partial"
    if isinstance(node, Broadcast):
        return All(lay.nsites)
    if isinstance(node, Shuffle):
        return node.target
    if lay.is_all(t):
        return All(lay.nsites)
    if lay.single_copy():
        for dims in _candidate_dims(node):
            if np.array_equal(Part(dims, lay.nsites).sites(t)[lay.rows], lay.sites):
                return Part(dims, lay.nsites)
    return "mixed"


def _candidate_dims(node: PNode):
    """Partitionings worth recognising in explain(): the input's, carried through."""
    arity = node.type.arity
    seen = []
    for c in node.children:
        p = c.placement
        if isinstance(p, Part):
            dims = p.dims
            if isinstance(node, LocalJoin) and c is node.right:
                dims = tuple(_right_to_out(d, node) for d in dims)
            if isinstance(node, LocalAggregate):
                if not set(dims) <= set(node.group_by):
                    continue
                dims = tuple(node.group_by.index(d) for d in dims)
            if all(d is not None and d < arity for d in dims) and dims not in seen:
                seen.append(dims)
    seen.append((0,) if arity else ())
    return seen


def _right_to_out(d, node):
    if d in node.right_on:
        return node.left_on[node.right_on.index(d)]
    rest = [r for r in range(node.right.type.arity) if r not in node.right_on]
    return node.left.type.arity + rest.index(d)
