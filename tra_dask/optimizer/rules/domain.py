"""Domain-specific rules (paper §5.2.2): the three distributed matrix multiplies.

Each matches a *contraction* — a local aggregation (add-like: associative and
commutative) of a local join of two key-arity-2 relations on one dim each, grouped by
the two free dims — and yields the whole implementation:

* BMM: broadcast one operand; the other stays where it is (its free dim's
  partitioning carries to the output, so the final shuffle may be a no-op);
* CMM: co-partition both operands on the contracted dim, fold locally, shuffle only
  the partial products (pre-aggregation, R2-5); ``cmm_tree`` folds those partial
  products by a reduction tree instead of into one site per output chunk;
* RMM: the 3-D algorithm — replicate each operand along the other's free dim
  (``insert_dim``, the paper's insertDim/duplicate), shuffle both on the output's
  (i, j), join on all three dims, aggregate locally.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator, NamedTuple

import numpy as np

from ...keys import BinOp, Const, Dim, KeyMap, insert_dim, project
from ...node import toposort
from ...physical import (Assign, Broadcast, Grid, KeyArrayMap, KeySites, LocalAggregate, LocalJoin, LocalMap, PNode,
                         PSource, Shuffle, affinity_table, blocked_table)
from ._util import attempt, broadcast, shuffle

_MOVES = (Broadcast, Shuffle)


class Contraction(NamedTuple):
    left: PNode
    right: PNode
    a: int          # contracted dim of the left key
    b: int          # contracted dim of the right key
    kernel: object  # the join kernel
    agg: object     # the aggregation kernel
    group_by: tuple


def _strip(n: PNode) -> PNode:
    while isinstance(n, _MOVES):
        n = n.input
    return n


def match_contraction(node: PNode) -> Contraction | None:
    """The contraction a LocalAggregate computes, or None."""
    if not isinstance(node, LocalAggregate):
        return None
    k = node.kernel
    if not (getattr(k, "associative", False) and getattr(k, "commutative", False) and getattr(k, "arity", 0) == 2):
        return None
    inner = node.input
    if isinstance(inner, Shuffle):
        inner = inner.input
    if isinstance(inner, LocalAggregate) and inner.kernel == k:  # already pre-aggregated:
        if tuple(node.group_by) != tuple(range(len(inner.group_by))):  # only a finishing fold
            return None  # (a fold to fewer dims is another aggregation on top of the contraction)
        inner = inner.input
        if isinstance(inner, Shuffle):
            inner = inner.input
    if not isinstance(inner, LocalJoin) or inner.key_fn is not None:
        return None
    L, R = _strip(inner.left), _strip(inner.right)
    if isinstance(L, LocalMap) or isinstance(R, LocalMap):  # an RMM already
        return None
    if L.type.arity != 2 or R.type.arity != 2 or len(inner.left_on) != 1:
        return None
    a, b = inner.left_on[0], inner.right_on[0]
    lf = 1 - a
    if node.group_by and node.input is not inner and isinstance(node.input, LocalAggregate):
        return None
    gb = node.group_by if not (isinstance(node.input, Shuffle) and isinstance(node.input.input, LocalAggregate)) \
        else node.input.input.group_by
    if sorted(gb) != sorted((lf, 2)):
        return None
    return Contraction(L, R, a, b, inner.kernel, k, tuple(gb))


_MEMO: ContextVar = ContextVar("tra_dask_contraction_memo", default=None)


@contextmanager
def contraction_memo():
    """Within this block (one search), a contraction rule builds its plans once per
    contraction.  The memo ends with the block: a module-wide cache kept the last
    contractions' sources, and so the user's arrays, alive after the search."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def contraction_rule(build):
    """A domain rule from ``build(contraction) -> plans``: it matches the contraction a
    node computes (:func:`match_contraction`), and since its plans depend on nothing
    else, builds them once per contraction within a search (which meets one
    contraction under many placements of the moves above its inputs;
    :func:`contraction_memo`)."""

    @functools.wraps(build)
    def rule(node: PNode) -> Iterator[PNode]:
        c = match_contraction(node)
        if c is None:
            return
        memo = _MEMO.get()
        if memo is None:
            yield from build(c)
            return
        plans = memo.get((build, c))
        if plans is None:
            plans = memo[(build, c)] = tuple(build(c))
        yield from plans

    return rule


@contraction_rule
def bmm(c: Contraction) -> Iterator[PNode]:
    """Broadcast matrix multiply: broadcast the left or the right operand."""
    for j in (lambda: LocalJoin(broadcast(c.left), c.right, (c.a,), (c.b,), c.kernel),
              lambda: LocalJoin(c.left, broadcast(c.right), (c.a,), (c.b,), c.kernel)):
        for join in attempt(j):
            yield from attempt(lambda: LocalAggregate(shuffle(join, c.group_by), c.group_by, c.agg))


def _co_partitioned_join(c: Contraction) -> PNode:
    """Both operands shuffled on the contracted dim and joined there (CMM's join)."""
    return LocalJoin(shuffle(c.left, (c.a,)), shuffle(c.right, (c.b,)), (c.a,), (c.b,), c.kernel)


@contraction_rule
def cmm(c: Contraction) -> Iterator[PNode]:
    """Cross-product matrix multiply: co-partition on the contracted dim, pre-aggregate."""
    for join in attempt(lambda: _co_partitioned_join(c)):
        all_dims = tuple(range(len(c.group_by)))
        yield from attempt(lambda: LocalAggregate(
            shuffle(LocalAggregate(join, c.group_by, c.agg), all_dims), all_dims, c.agg))


#: fan-ins of the reduction trees :func:`cmm_tree` offers
TREE_FANINS = (2, 4)


def _value_sites(x: PNode, dim: int) -> np.ndarray:
    """The site of a physical tuple with each value of key dim ``dim`` (-1: no tuple)."""
    t, lay = x.type, x.layout
    out = np.full(t.frontier[dim], -1, dtype=np.int64)
    out[t.column(dim)[lay.rows]] = lay.sites
    return out


def _group_sites(sites_of: np.ndarray, groups: int) -> tuple:
    """The site of each group of values ``v ≡ g (mod groups)``: where its member g is
    (else any member that exists; else site 0)."""
    table = []
    for g in range(groups):
        members = sites_of[g::groups]
        there = members[members >= 0]
        table.append(int(there[0]) if len(there) else 0)
    return tuple(table)


def _tree_level(x: PNode, dim: int, groups: int, agg) -> PNode:
    """One level of a reduction tree over key dim ``dim`` of ``x`` (values 0..K-1):
    the key's value v becomes (v mod groups) in place and (v // groups) as a new last
    dim (an injective rekey, no data touched), each group of values moves to the site
    of its first member (``Shuffle`` by a table on ``dim``) and is folded there, so
    the output keeps the key with ``groups`` values on ``dim``."""
    arity = x.type.arity
    exprs = [Dim(d) for d in range(arity)]
    exprs[dim] = BinOp("%", Dim(dim), Const(groups))
    exprs.append(BinOp("//", Dim(dim), Const(groups)))
    split = LocalMap(x, KeyArrayMap(KeyMap(tuple(exprs))))
    table = _group_sites(_value_sites(x, dim), groups)
    return LocalAggregate(shuffle(split, (dim,), table=table), tuple(range(arity)), agg)


def reduction_tree(x: PNode, dim: int, group_by: tuple, agg, fanin: int) -> PNode:
    """``Σ_group_by(x)`` — ``dim`` not in ``group_by``, the other dims in it — as a
    tree of folds: by associativity and commutativity, Σ over the values of ``dim``
    is Σ over groups of Σ within them.  A first level folds the values one site holds
    when there are more than sites (values v ≡ g mod sites), then each level folds
    groups of ``fanin``, each on the site of one member, and the last folds each
    output chunk's survivors (at most ``fanin``) where the flat fold would (a Shuffle
    by ``group_by``).  A flat fold sends all K partial results of an output chunk into
    one site; the tree sends each once too (one more where the last fold's site holds
    none) but at most ``fanin - 1`` of a chunk into a site per level (log_fanin K levels)."""
    K = x.type.frontier[dim]
    s = x.nsites
    if K > s:
        x, K = _tree_level(x, dim, s, agg), s
    while K > fanin:
        groups = -(-K // fanin)
        x, K = _tree_level(x, dim, groups, agg), groups
    return LocalAggregate(shuffle(x, group_by), group_by, agg)


@contraction_rule
def cmm_tree(c: Contraction) -> Iterator[PNode]:
    """CMM with a reduction tree: co-partition on the contracted dim, multiply each
    site's pairs, then fold the partial products over the contracted dim by
    :func:`reduction_tree` (fan-ins :data:`TREE_FANINS`) instead of shuffling all of
    them to one site per output chunk.  Each partial product still moves once (the
    1-D bound's (K-1)·|C| words), but no site receives more than ``fanin - 1`` of
    an output chunk's per level.  Offered when the contracted dim has more values
    than the fan-in and the join holds each value on one site."""
    if c.left.nsites == 1:
        return
    for join in attempt(lambda: _co_partitioned_join(c)):
        K = join.type.frontier[c.a]
        lay = join.layout
        if np.any(_value_sites(join, c.a)[join.type.keys[lay.rows, c.a]] != lay.sites):  # a value on two sites
            continue
        for f in TREE_FANINS:
            if K > f:
                yield from attempt(lambda f=f: reduction_tree(join, c.a, c.group_by, c.agg, f))


def _replicated_join(c: Contraction, left: PNode, right: PNode, move) -> PNode:
    """The 3-D multiply's join: the left replicated along the right's free dim
    (``insert_dim(2, J)``), the right put in (contracted, free) key order and
    replicated along the left's free dim (``insert_dim(lf, I)``), both moved by
    ``move(x)`` (a shuffle), joined on all three dims of (l0, l1, r)."""
    lf, rf = 1 - c.a, 1 - c.b
    xs = LocalMap(left, KeyArrayMap(insert_dim(2, c.right.type.frontier[rf])))
    r = right if c.b == 0 else LocalMap(right, KeyArrayMap(project(c.b, rf)))
    ys = LocalMap(r, KeyArrayMap(insert_dim(lf, c.left.type.frontier[lf])))
    return LocalJoin(move(xs), move(ys), (0, 1, 2), (0, 1, 2), c.kernel)


@contraction_rule
def rmm(c: Contraction) -> Iterator[PNode]:
    """Replication (3-D) matrix multiply, the paper's §5.2.2 plan: with the join's
    output key (l0, l1, r) — the left key, then the right's free dim — replicate the
    left along r (``insert_dim(2, J)``), the right along the left's free dim
    (``insert_dim(lf, I)`` after putting its key in (contracted, free) order), shuffle
    both on the free dims, join on all three dims, aggregate locally."""
    free = (1 - c.a, 2)

    def build():
        join = _replicated_join(c, c.left, c.right, lambda x: shuffle(x, free))
        return LocalAggregate(join, c.group_by, c.agg)

    yield from attempt(build)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def site_grids(nsites: int, limits: tuple) -> list[tuple]:
    """Every grid ``(g0, g1, ...)`` of exactly ``nsites`` sites with ``g[a] <=
    limits[a]`` (an axis is never larger than the key extent that drives it).

    >>> site_grids(8, (4, 4, 4))
    [(1, 2, 4), (1, 4, 2), (2, 1, 4), (2, 2, 2), (2, 4, 1), (4, 1, 2), (4, 2, 1)]
    """
    if not limits:
        return [()] if nsites == 1 else []
    out = []
    for g in _divisors(nsites):
        if g <= limits[0]:
            out += [(g,) + rest for rest in site_grids(nsites // g, limits[1:])]
    return out


def largest_grid_sites(nsites: int, limits: tuple) -> int:
    """The most sites, at most ``nsites``, of a grid with ``g[a] <= limits[a]``.

    >>> largest_grid_sites(256, (4, 4, 4)), largest_grid_sites(8, (4, 4, 4)), largest_grid_sites(7, (2, 2, 2))
    (64, 8, 4)
    """
    best = {1}
    for lim in limits:  # (each step: the products up to nsites, about nsites·log(nsites) of them tried)
        best = {u * g for u in best for g in range(1, min(lim, nsites // u) + 1)}
    return max(best)


def _promising_grids(c: Contraction, s: int, extents: tuple, keep: int = 3) -> list[tuple]:
    """The ``keep`` grids with the fewest words by the classic 3-D estimate — each
    left chunk to the g_j sites of its grid row, each right chunk to g_i, each result
    element's g_k partial sums folded onto one site — out of all :func:`site_grids`
    of the most sites the key extents allow (all ``s`` where a grid of ``s`` fits
    them; at 4096 sites there are dozens, and each is a plan over up to 10⁶ join
    tuples: that is where planning time would go).  The estimate only orders the
    candidates; the cost model chooses among the plans."""
    lf, rf = 1 - c.a, 1 - c.b
    A, B = float(c.left.type.nelements), float(c.right.type.nelements)
    C = _array_extent(c.left.type, lf) * _array_extent(c.right.type, rf)

    def words(g):
        return A * (g[2] - 1) + B * (g[lf] - 1) + C * (g[c.a] - 1)

    grids = site_grids(s, extents) or site_grids(largest_grid_sites(s, extents), extents)
    return sorted(grids, key=words)[:keep]


def _array_extent(t, dim: int) -> float:
    """The array's extent along key dim ``dim`` of a 2-d chunked matrix: the chunk
    extents along it, over one line of the key grid."""
    other = 1 - dim
    line = t.keys[:, other] == t.keys[:, other].min()
    ids = t.shape_ids[line]
    if any(len(t.shapes[i]) <= dim for i in ids):  # chunks are not matrices along the key dims:
        return float(len(ids))  # the key extent is the estimate (it only orders the grids)
    return float(sum(t.shapes[i][dim] for i in ids))


def _placed(rel: PNode, placement) -> PNode:
    """A free source made where the plan wants it (the choice of a free source's
    placement, as :func:`place_free_source`); anything else as it is."""
    if isinstance(rel, PSource) and rel.free and rel.placement_ != placement:
        return PSource(rel.source, placement, free=True)
    return rel


@contraction_rule
def rmm_grid(c: Contraction) -> Iterator[PNode]:
    """The 3-D multiply on a grid of sites (Agarwal et al.'s 3-D algorithm; the
    grid COSMA and CTF choose): the join's output key (i, k, j) — the left key, then
    the right's free dim — is mapped onto a g_i × g_k × g_j grid of sites (every
    grid whose sizes multiply to the site count and fit the key extents).  Each
    operand is replicated (``insert_dim``) along the dim it lacks and shuffled onto
    the grid, so a left chunk travels to the g_j sites of its (i, k) cell and a
    right chunk to the g_i sites of its (k, j) cell; each site multiplies what it
    holds and folds its products.  When g_k > 1 a result chunk has partial sums on
    g_k sites: they are folded locally (R2-5), then shuffled to one of those sites
    (the grid's k axis is spread by ``(i + j) mod g_k``) and folded again.  A free
    source is made on the grid cell that needs it.  (1 × s × 1 is CMM, s × 1 × 1
    with a whole right operand per site is BMM.)"""
    s = c.left.nsites
    lf, rf = 1 - c.a, 1 - c.b
    n_left_free, n_right_free = c.left.type.frontier[lf], c.right.type.frontier[rf]
    extents = [0, 0, n_right_free]
    extents[lf], extents[c.a] = n_left_free, c.left.type.frontier[c.a]
    dims3 = (0, 1, 2)
    if s == 1:
        return
    for g in _promising_grids(c, s, tuple(extents)):
        left_axes = (0, 1, None)
        right_axes = tuple(None if t == lf else (c.b if t == c.a else rf) for t in dims3)

        def build(g=g, left_axes=left_axes, right_axes=right_axes):
            left = _placed(c.left, Grid(left_axes, g, s))
            right = _placed(c.right, Grid(right_axes, g, s))
            join = _replicated_join(c, left, right, lambda x: shuffle(x, dims3, g))
            if g[c.a] == 1:
                return LocalAggregate(join, c.group_by, c.agg)
            pre = LocalAggregate(join, c.group_by, c.agg)
            axes = tuple(None if t == c.a else c.group_by.index(t) for t in dims3)
            out_dims = tuple(range(len(c.group_by)))
            return LocalAggregate(shuffle(pre, axes, g), out_dims, c.agg)

        yield from attempt(build)


def _on_cluster(rel: PNode) -> bool:
    """Whether ``rel`` derives from chunks placed key by key (a fixed ``KeySites``
    source: data already on the cluster).  A free source is made wherever the plan
    wants it, and a Part or Grid placement is one the other rules already follow."""
    return not rel.layout.partial and any(
        isinstance(n, PSource) and not n.free and isinstance(n.placement_, KeySites) for n in toposort([rel]))


def _held(rel: PNode, dim: int):
    """(values on ``dim``, sites, elements) of every physical tuple ``rel`` holds."""
    lay, t = rel.layout, rel.type
    return t.keys[lay.rows, dim], lay.sites, t.chunk_sizes[lay.rows]


@contraction_rule
def affinity_mm(c: Contraction) -> Iterator[PNode]:
    """The 1-D multiplies partitioned where the operands already are: one dim of the
    join's key (the left key, then the right's free dim) — the left's free dim (BMM,
    broadcast right), the contracted dim (CMM) or the right's free dim (BMM,
    broadcast left) — is dealt to the sites by a table
    (:func:`~tra_dask.physical.affinity_table`) that sends each value where most of
    the operands' chunks with that value already live, balanced, instead of by
    blocks (:func:`rmm_grid`'s s×1×1, 1×s×1 and 1×1×s grids).  Over inputs Dask
    placed (chunk by chunk, wherever it ran them) a blocked grid moves about
    (s-1)/s of the partitioned operand; this moves the chunks of a value split
    across sites, and whole values only where balance needs it.  The operand the dim
    is not in is replicated as in the 3-D multiply (partitioned on the contracted
    dim, the partial sums move as in CMM); a free source is made where the table
    puts it.  Offered when some operand derives from chunks placed key by key
    (``KeySites``: inputs on the cluster) and the table is not the blocked one."""
    s = c.left.nsites
    held_on = {c.left: _on_cluster(c.left), c.right: _on_cluster(c.right)}
    if s == 1 or not any(held_on.values()):
        return
    lf, rf = 1 - c.a, 1 - c.b
    extents = [0, 0, c.right.type.frontier[rf]]
    # the contracted dim's values on either side (a filter pushed into one side can narrow its range)
    extents[lf], extents[c.a] = c.left.type.frontier[lf], max(c.left.type.frontier[c.a], c.right.type.frontier[c.b])
    for t in (0, 1, 2):
        ldim = t if t < 2 else None
        rdim = c.b if t == c.a else (rf if t == 2 else None)
        held = [_held(rel, d) for rel, d in ((c.left, ldim), (c.right, rdim)) if d is not None and held_on[rel]]
        table = affinity_table(extents[t], s, held) if held and extents[t] > 1 else None
        if table is None or table == blocked_table(extents[t], s):
            continue

        def build(t=t, ldim=ldim, rdim=rdim, table=table):
            left = c.left if ldim is None else _placed(c.left, Assign(ldim, table, s))
            right = c.right if rdim is None else _placed(c.right, Assign(rdim, table, s))
            join = _replicated_join(c, left, right, lambda x: shuffle(x, (t,), table=table))
            if t != c.a:
                return LocalAggregate(join, c.group_by, c.agg)
            out_dims = tuple(range(len(c.group_by)))
            return LocalAggregate(shuffle(LocalAggregate(join, c.group_by, c.agg), out_dims), out_dims, c.agg)

        yield from attempt(build)


def place_free_source(node: PNode) -> Iterator[PNode]:
    """The choice of a free source's initial placement: a source whose chunks are
    made on the workers (``from_function``, scattered ``from_numpy``) costs the same
    to make on any site, so ``Shuffle_d(source)`` ≡ the source made where the
    shuffle would put it (balanced ``Part(d)`` or the shuffle's grid; never
    everything on one site: d must be non-empty)."""
    if isinstance(node, Shuffle) and isinstance(node.input, PSource) and node.input.free and node.dims:
        src = node.input
        yield from attempt(lambda: PSource(src.source, node.target, free=True))


DOMAIN_RULES = (bmm, cmm, cmm_tree, rmm, rmm_grid, affinity_mm, place_free_source)


def _role(join: PNode, dim: int) -> str:
    """The role of key dim ``dim`` of a 1-D multiply's (l0, l1, r) join key."""
    if dim == 2:
        return "right operand's free dim"
    return "contracted dim" if dim == join.left_on[0] else "left operand's free dim"


def is_pure_rekey(node: PNode) -> bool:
    """A LocalMap that only rekeys, one key to one (a reduction tree's level)."""
    return (isinstance(node, LocalMap) and isinstance(node.op, KeyArrayMap) and node.op.kernel is None
            and node.op.key_fn.multiplicity == 1)


def classify(node: PNode) -> str | None:
    """Name the strategy a plan node uses for a contraction: BMM (which side is
    broadcast), CMM or RMM; with ``data-parallel``/``model-parallel`` for a product
    of two sources X @ W (broadcasting the right operand, the model, is data
    parallelism; broadcasting the left, the data, is model parallelism)."""
    if not isinstance(node, LocalAggregate):
        return None
    inner, tree = node.input, False
    while isinstance(inner, (Shuffle, LocalAggregate)) or is_pure_rekey(inner):
        tree = tree or isinstance(inner, LocalMap)
        inner = inner.input
    if not isinstance(inner, LocalJoin) or inner.key_fn is not None or not isinstance(node.kernel, type(inner.kernel)):
        return None
    sides = [inner.left, inner.right]
    under = [s.input if isinstance(s, Shuffle) else s for s in sides]
    if all(isinstance(u, LocalMap) and getattr(getattr(u.op, "key_fn", None), "multiplicity", 1) > 1 for u in under):
        if isinstance(sides[0], Shuffle) and sides[0].grid:
            return f"RMM (3-D, {'x'.join(map(str, sides[0].grid))} grid of sites)"
        table = next((x for x in sides if isinstance(x, Shuffle) and x.table), None)
        if table is not None:  # (one side's shuffle may have been dropped: it moved nothing)
            return f"1-D multiply partitioned on the {_role(inner, table.dims[0])} where the data is"
        return "RMM"
    if not getattr(node.kernel, "associative", False):
        return None

    for i, s in enumerate(sides):
        if isinstance(s, Broadcast):
            other = sides[1 - i]
            base = _strip(s)
            name = f"BMM (broadcast {base.label if isinstance(base, PSource) else 'an intermediate'})"
            if isinstance(base, PSource) and isinstance(_strip(other), PSource):
                name += ", data-parallel" if i == 1 else ", model-parallel"
            return name
    if len(inner.left_on) == 1:
        if tree:
            return "CMM (co-partitioned on the contracted dim, partial products folded by a tree)"
        return "CMM (co-partitioned on the contracted dim)"
    return None
