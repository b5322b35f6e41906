"""TRA expression nodes (paper §3.1): immutable, structurally equal, typed on creation.

Every node is a frozen dataclass.  Its :attr:`~Relation.type` (exact key set, chunk
shape of every key, dtype) is derived from its children when the node is made, which
is where every mistake is reported: a join on a dim that does not exist, chunks a
kernel cannot take, a rekey that makes duplicate keys.  Nothing touches arrays.

Structural identity: two nodes are equal when they are the same operator with equal
parameters over equal children (kernels and key functions compare by name and
structure; arrays in sources by identity).  The hash is computed once.  Equal nodes
are one node to the evaluator (and later to the optimizer and runtime), which is what
makes shared subexpressions evaluate once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..kernels import Kernel, KernelTypeError
from ..keys import InsertDim, KeyFn, Predicate
from ..node import Node, toposort
from ..viz import relation_html
from ..types import (ArrayType, Key, RelationType, Shape, mixed_radix_cols, check_size, encode_rows, join_codes,
                     key_codes, lexsort_rows, max_tuples, pair_count, unique, unique_first_inverse,
                     zeros_view)

__all__ = ["Relation", "Aggregate", "Join", "Rekey", "Filter", "Transform", "Tile", "Concat", "toposort"]


def as_relation(x, where: str, role: str = "input") -> "Relation":
    """``x`` as a relation: a Relation, or anything with ``__tra_relation__()`` (the
    futures of an earlier submission)."""
    if not isinstance(x, Relation) and hasattr(x, "__tra_relation__"):
        x = x.__tra_relation__()
    if not isinstance(x, Relation):
        raise TypeError(
            f"{where}: the {role} must be a tensor relation (td.from_numpy, td.from_chunks, "
            f"td.from_function, td.from_dask_array, submitted futures or an operator), got "
            f"{type(x).__name__}"
        )
    return x


def _fmt_keys(keys, limit: int = 4) -> str:
    keys = [tuple(k) for k in keys]
    s = ", ".join(str(k) for k in keys[:limit])
    return s + (f", ... ({len(keys)} in all)" if len(keys) > limit else "")


def check_dims(where: str, rel: "Relation", dims, what: str, n: int, unit: str = "key") -> tuple[int, ...]:
    """``dims`` as a tuple of distinct ints in ``range(n)`` or a clear error."""
    if isinstance(dims, (int, np.integer)) and not isinstance(dims, bool):
        dims = (dims,)
    if not isinstance(dims, (tuple, list)):
        raise TypeError(f"{where}: {what} must be a tuple of {unit} dims, got {dims!r}")
    valid = f"valid {unit} dims are 0..{n - 1}" if n else f"it has no {unit} dims"
    out = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{where}: {what} {tuple(dims)} has a non-integer dim {d!r}")
        if not 0 <= d < n:
            arity = "key arity" if unit == "key" else "chunk rank"
            raise ValueError(
                f"{where}: {what} dim {d} is out of range for {rel.label} ({arity} {n}); {valid}"
            )
        out.append(int(d))
    if len(set(out)) != len(out):
        raise ValueError(f"{where}: {what} {tuple(out)} repeats a dim")
    return tuple(out)


def _with_shape_rows(keys: np.ndarray, shape_rows: np.ndarray, dtype) -> RelationType:
    """A RelationType from one shape row per key (deduplicated into a table)."""
    if len(shape_rows) == 0:
        return RelationType(keys, np.zeros(0, np.intp), [], dtype)
    table, ids = np.unique(shape_rows, axis=0, return_inverse=True)
    return RelationType(keys, ids.reshape(-1), [tuple(r) for r in table.tolist()], dtype)


# The most bytes one relation may hold: 64 PiB.  Plans count bytes per site in int64 (a
# node's peak sums its inputs', a broadcast copies one to every site), so a relation
# far below 2**63 keeps every sum exact.
MAX_BYTES = 2**56


class Relation(Node):
    """A tensor relation: a TRA expression node.  Subclasses are frozen dataclasses."""

    _op: str = "relation"

    def __post_init__(self):
        try:
            super().__post_init__()
        except MemoryError:  # the size limit (types.check_size) is meant to come first
            raise ValueError(
                f"{self.label}: its type (key set) does not fit in memory; use bigger chunks"
            ) from None
        nbytes = self.type.nbytes
        if nbytes > MAX_BYTES:
            raise ValueError(
                f"{self.label}: {self.type.nelements:,} elements of {self.type.dtype} ({nbytes:.3g} bytes); a "
                f"relation may hold at most {MAX_BYTES:.3g} bytes (2**{MAX_BYTES.bit_length() - 1}: plans count "
                f"bytes exactly in 64-bit integers, and no cluster has that much memory)")

    @property
    def key_arity(self) -> int:
        return self.type.arity

    @property
    def keys(self) -> list[Key]:
        return self.type.key_list()

    @property
    def ntuples(self) -> int:
        return self.type.ntuples

    @property
    def frontier(self) -> Key:
        return self.type.frontier

    @property
    def dtype(self) -> np.dtype:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    def chunk_shape(self, key) -> Shape:
        return self.type.chunk_shape(key)

    def chunk_type(self, key) -> ArrayType:
        return self.type.chunk_type(key)

    # -- naming ------------------------------------------------------------

    # -- fluent API (same semantics as the td.* functions) -----------------
    def aggregate(self, group_by, kernel):
        return _builders.aggregate(self, group_by, kernel)

    def join(self, right, left_on, right_on, kernel):
        return _builders.join(self, right, left_on, right_on, kernel)

    def rekey(self, key_fn):
        return _builders.rekey(self, key_fn)

    def filter(self, pred):
        return _builders.filter(self, pred)

    def transform(self, kernel):
        return _builders.transform(self, kernel)

    def tile(self, tile_dim, tile_size):
        return _builders.tile(self, tile_dim, tile_size)

    def concat(self, key_dim, array_dim):
        return _builders.concat(self, key_dim, array_dim)

    def evaluate(self, **kw):
        return _evaluate_expr(self, **kw)

    def to_numpy(self):
        return _to_numpy(self)

    def _repr_html_(self) -> str:
        return relation_html(self)


# ---------------------------------------------------------------------------
# operators (their type rules are the module functions ``*_type`` below, shared with
# the IA operators that implement them)


@dataclass(frozen=True, eq=False, repr=False)
class Aggregate(Relation):
    """``Σ(group_by, kernel)(input)``: group by ``group_by`` dims, fold each group's
    chunks with a binary kernel; output key = ``key[group_by]`` in that order."""

    input: Relation
    group_by: tuple
    kernel: Kernel
    _op = "aggregate"
    _children = ("input",)

    def _infer_type(self) -> RelationType:
        return aggregate_type(self)


@dataclass(frozen=True, eq=False, repr=False)
class Join(Relation):
    """``⋈(left_on, right_on, kernel)(left, right)``: pair tuples whose ``left_on``
    dims equal the ``right_on`` dims; output key = all of the left key, then the right
    key's dims not in ``right_on`` (paper §3.1)."""

    left: Relation
    right: Relation
    left_on: tuple
    right_on: tuple
    kernel: Kernel
    _op = "join"
    _children = ("left", "right")

    @property
    def right_rest(self) -> tuple[int, ...]:
        """The right key dims that are appended to the left key."""
        return tuple(d for d in range(self.right.key_arity) if d not in self.right_on)

    def _infer_type(self) -> RelationType:
        return join_type(self)


def _fmt_range(v: np.ndarray) -> str:
    if len(v) == 0:
        return "no values"
    if len(v) == v[-1] - v[0] + 1:
        return f"{int(v[0])}..{int(v[-1])}"
    return "{" + ", ".join(str(int(x)) for x in v[:6]) + (", ...}" if len(v) > 6 else "}")


@dataclass(frozen=True, eq=False, repr=False)
class Rekey(Relation):
    """``rekey(key_fn)(input)``: a new key per tuple.  A key function of
    multiplicity m (``insert_dim``) gives every tuple m keys sharing its chunk: the
    paper's replication map ``insertDim``/``duplicate`` (§5.2.2)."""

    input: Relation
    key_fn: KeyFn
    _op = "rekey"
    _children = ("input",)

    def _infer_type(self) -> RelationType:
        return rekey_type(self)


@dataclass(frozen=True, eq=False, repr=False)
class Filter(Relation):
    """``σ(pred)(input)``: keep the tuples whose key satisfies ``pred``."""

    input: Relation
    pred: Predicate
    _op = "filter"
    _children = ("input",)

    def _infer_type(self) -> RelationType:
        return filter_type(self)


@dataclass(frozen=True, eq=False, repr=False)
class Transform(Relation):
    """``λ(kernel)(input)``: a unary kernel on every chunk; keys unchanged."""

    input: Relation
    kernel: Kernel
    _op = "transform"
    _children = ("input",)

    def _infer_type(self) -> RelationType:
        return transform_type(self)


@dataclass(frozen=True, eq=False, repr=False)
class Tile(Relation):
    """``tile(tile_dim, tile_size)(input)``: split every chunk along array dim
    ``tile_dim`` into pieces of ``tile_size`` (the last may be smaller); the tile
    index becomes a new last key dim."""

    input: Relation
    tile_dim: int
    tile_size: int
    _op = "tile"
    _children = ("input",)

    def _infer_type(self) -> RelationType:
        return tile_type(self)


@dataclass(frozen=True, eq=False, repr=False)
class Concat(Relation):
    """``concat(key_dim, array_dim)(input)``: the inverse of tile.  Group by every
    key dim but ``key_dim`` and concatenate each group's chunks along ``array_dim``
    in ``key_dim`` order; output key = the key without ``key_dim``."""

    input: Relation
    key_dim: int
    array_dim: int
    _op = "concat"
    _children = ("input",)

    def _infer_type(self) -> RelationType:
        return concat_type(self)


def aggregate_type(node) -> RelationType:
    """Type rule of aggregate (also used by the IA operator that implements it)."""
    where = f"aggregate({node.input.label}, group_by={node.group_by}, kernel={node.kernel!r})"
    t = node.input.type
    gb = check_dims(where, node.input, node.group_by, "group_by", t.arity)
    object.__setattr__(node, "group_by", gb)
    if t.ntuples == 0:
        return RelationType(np.zeros((0, len(gb)), np.int64), [], [], t.dtype)
    if t.is_grid:  # one chunk shape; the groups are every key below the group-by dims' frontier
        _check_fold_kernel(where, node.kernel, [t.shapes[0]], t.dtype)
        return RelationType.grid(tuple(t.frontier[d] for d in gb), t.shapes[0], t.dtype)
    uniq, first, inv = _groups(t, gb)
    # every group must hold chunks of one shape: the fold maps T x T -> T
    ns = len(t.shapes)
    pair = unique(inv * ns + t.shape_ids, bound=len(uniq) * ns) if ns > 1 else uniq
    if len(pair) != len(uniq):
        g = int(np.flatnonzero(np.bincount(pair // len(t.shapes)) > 1)[0])
        members = np.flatnonzero(inv == g)
        shapes = sorted({t.shapes[t.shape_ids[i]] for i in members})
        raise ValueError(
            f"{where}: group {tuple(t.keys[first[g], list(gb)].tolist())} mixes chunk shapes "
            f"{', '.join(map(str, shapes))}; an aggregation folds chunks of one shape "
            f"(group by the dims that index the smaller edge chunks too)"
        )
    used = np.bincount(t.shape_ids, minlength=ns) > 0 if ns > 1 else [True]
    _check_fold_kernel(where, node.kernel, [s for sid, s in enumerate(t.shapes) if used[sid]], t.dtype)
    return RelationType(t.keys[first][:, list(gb)], t.shape_ids[first], t.shapes, t.dtype)


def _check_fold_kernel(where: str, kernel, shapes, dtype) -> None:
    """An aggregation kernel maps two chunks of each shape folded to one of that shape."""
    for s in shapes:
        a = ArrayType(s, dtype)
        try:
            out = kernel.out_type(a, a)
        except KernelTypeError as e:
            raise ValueError(f"{where}: {e}") from None
        if out != a:
            raise ValueError(
                f"{where}: kernel {kernel!r} maps two {a} chunks to {out}; an "
                f"aggregation kernel must return chunks of its input type"
            )


def _groups(t: RelationType, gb) -> tuple:
    """``np.unique(encode_rows(t.keys[:, gb]), return_index=True, return_inverse=True)``
    — the groups in key order, each one's first row, each row's group — read column
    by column and counted, not sorted, when the groups' mixed-radix code (bases: the
    frontier) is small; the same arrays."""
    bases = [t.frontier[d] for d in gb]
    bound = math.prod(bases)
    if bound < 2**62:  # encode_rows' code (its bases are the column maxima + 1: the frontier)
        return unique_first_inverse(mixed_radix_cols(t.keys, gb, bases), bound)
    uniq, first, inv = np.unique(encode_rows(t.keys[:, list(gb)]), return_index=True, return_inverse=True)
    return uniq, first, inv.reshape(-1)


def join_type(node, strict_ranges: bool = True) -> RelationType:
    """Type rule of join (also used by the IA operator that implements it)."""
    # strict_ranges: a TRA join of dims that range over different key values is a
    # user error (tensors chunked differently); the IA's local join is an inner join
    # and rewrites may legitimately filter one side only, so it passes False.
    L, R = node.left.type, node.right.type
    where = (
        f"join({node.left.label}, {node.right.label}, left_on={node.left_on}, "
        f"right_on={node.right_on}, kernel={node.kernel!r})"
    )
    lo = check_dims(where, node.left, node.left_on, "left_on", L.arity)
    ro = check_dims(where, node.right, node.right_on, "right_on", R.arity)
    if len(lo) != len(ro):
        raise ValueError(
            f"{where}: left_on {lo} and right_on {ro} have different lengths; "
            f"they pair dims one to one"
        )
    object.__setattr__(node, "left_on", lo)
    object.__setattr__(node, "right_on", ro)
    for a, b in zip(lo, ro) if strict_ranges else ():
        va, vb = unique(L.keys[:, a]), unique(R.keys[:, b])
        if not np.array_equal(va, vb):
            raise ValueError(
                f"{where}: left key dim {a} of {node.left.label} takes {_fmt_range(va)} "
                f"but right key dim {b} of {node.right.label} takes {_fmt_range(vb)}; "
                f"joined dims must range over the same key values (chunk both tensors "
                f"alike along the joined dim)"
            )
    rest = [d for d in range(R.arity) if d not in ro]
    arity = L.arity + len(rest)
    grid = _grid_join(node, L, R, lo, ro, rest, where)
    if grid is not None:
        return grid
    if (len(lo) == L.arity and not rest and L.ntuples == R.ntuples
            and ((L.keys is R.keys and lo == ro)
                 or np.array_equal(L.keys[:, list(lo)], R.keys[:, list(ro)]))):
        # every key dim of both joined and the keys alike, row by row (keys are distinct):
        # each left tuple pairs with the right tuple in its row, and with no other
        li = ri = np.arange(L.ntuples, dtype=np.int64)
    else:
        lc, rc = key_codes(L.keys, lo, R.keys, ro)
        if L.ntuples * R.ntuples > max_tuples(arity):  # may be too many: count the pairs first
            check_size(where, pair_count(lc, rc), arity)
        li, ri = join_codes(lc, rc)
    # li ascends, and for one li the ri ascend: the keys come out sorted (and distinct)
    nl, n = L.ntuples, len(li)
    same_keys = not rest and n == nl and (n < 2 or bool(np.all(li[1:] > li[:-1])))  # li is 0..nl-1
    if same_keys:  # a one-to-one join on every left dim: the output keys are the left keys
        keys = L.keys
    else:  # column by column: no (pairs x arity) gathers to concatenate
        keys = np.empty((n, L.arity + len(rest)), dtype=np.int64)
        for j in range(L.arity):
            keys[:, j] = L.keys[:, j][li]
        for j, d in enumerate(rest):
            keys[:, L.arity + j] = R.keys[:, d][ri]
    ns = len(R.shapes)
    if len(L.shapes) * ns == 1:  # one chunk shape a side: every pair is shape pair 0
        uniq, first, inv = (np.zeros(1, np.int64), np.zeros(1, np.intp), zeros_view(n)) if n else \
            (np.zeros(0, np.int64),) * 3
    else:
        uniq, first, inv = unique_first_inverse(L.shape_ids[li] * ns + R.shape_ids[ri], len(L.shapes) * ns)
    out_shapes, dtypes = [], set()
    for c, f in zip(uniq.tolist(), first.tolist()):
        la, ra = ArrayType(L.shapes[c // ns], L.dtype), ArrayType(R.shapes[c % ns], R.dtype)
        try:
            out = node.kernel.out_type(la, ra)
        except KernelTypeError as e:
            raise ValueError(
                f"{where}: chunk {tuple(L.keys[li[f]].tolist())} of {node.left.label} "
                f"(shape {la.shape}) and chunk {tuple(R.keys[ri[f]].tolist())} of "
                f"{node.right.label} (shape {ra.shape}) do not fit: {e}"
            ) from None
        out_shapes.append(out.shape)
        dtypes.add(out.dtype)
    dtype = dtypes.pop() if dtypes else np.result_type(L.dtype, R.dtype)
    return RelationType(keys, inv.reshape(-1), out_shapes, dtype, like=L if same_keys else None)


def _grid_join(node, L: RelationType, R: RelationType, lo, ro, rest, where) -> "RelationType | None":
    """The type of a join of two full key grids in one chunk shape each, on dims of
    equal range: the full grid of the left dims then the right's others (each left
    key meets every value of those; with none left, the right key of its values), in
    order — made without pairing the keys.  None where that does not hold."""
    if len(L.shapes) != 1 or len(R.shapes) != 1 or not L.ntuples or not R.ntuples:
        return None
    li, ri = L._index(), R._index()
    if li is None or ri is None or not li.dense or not ri.dense:
        return None
    lf, rf = L.frontier, R.frontier
    if any(lf[a] != rf[b] for a, b in zip(lo, ro)):
        return None
    bases = tuple(lf) + tuple(rf[d] for d in rest)
    if math.prod(bases) > max_tuples(len(bases)):
        check_size(where, math.prod(bases), len(bases))
    la, ra = ArrayType(L.shapes[0], L.dtype), ArrayType(R.shapes[0], R.dtype)
    try:
        out = node.kernel.out_type(la, ra)
    except KernelTypeError as e:
        raise ValueError(
            f"{where}: chunk {tuple(L.keys[0].tolist())} of {node.left.label} (shape {la.shape}) and chunk "
            f"{tuple(R.keys[0].tolist())} of {node.right.label} (shape {ra.shape}) do not fit: {e}") from None
    return RelationType.grid(bases, out.shape, out.dtype)


def _check_reads(where: str, rel: "Relation", reads, what: str) -> None:
    """A key function or predicate may only read key dims its input has (opaque
    ones, ``reads is None``, are checked when they run)."""
    arity = rel.type.arity
    if reads and max(reads) >= arity:
        raise ValueError(
            f"{where}: {what} reads key dim {max(reads)} but {rel.label} has key arity "
            f"{arity}; valid key dims are 0..{arity - 1}"
        )


def rekey_type(node) -> RelationType:
    """Type rule of rekey (also used by the IA operator that implements it)."""
    t = node.input.type
    where = f"rekey({node.input.label}, {node.key_fn!r})"
    _check_reads(where, node.input, node.key_fn.dims_read, "the key function")
    if node.key_fn.multiplicity > 1:  # a replication map: more tuples out than in
        check_size(where, t.ntuples * node.key_fn.multiplicity, t.arity + 1,
                   what=f"{t.ntuples:,} tuples x {node.key_fn.multiplicity} copies")
    if isinstance(node.key_fn, InsertDim) and t.is_grid and t.ntuples and node.key_fn.pos <= t.arity:
        # copies of every key below the frontier, the new dim's values 0..count-1: every
        # key below the new frontier (no key made, sorted or checked)
        f = t.frontier
        p = node.key_fn.pos
        return RelationType.grid(f[:p] + (node.key_fn.count,) + f[p:], t.shapes[0], t.dtype)
    try:  # the order of the pairs is free (the type sorts): take the one that needs no sort
        keys, rows = node.key_fn.apply_sorted(t.keys)
    except (TypeError, ValueError) as e:
        raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{where}: {e}") from None
    if keys.size and keys.min() < 0:
        keys, rows = node.key_fn.apply(t.keys)  # errors name keys in apply's order
        bad = int(np.flatnonzero((keys < 0).any(axis=1))[0])
        raise ValueError(
            f"{where}: key {tuple(t.keys[rows[bad]].tolist())} maps to "
            f"{tuple(keys[bad].tolist())}, which has a negative entry; keys are non-negative"
        )
    # one chunk shape: every id is 0 (zeros are not written, a 10^7-copy insert_dim saves a gather)
    sids = zeros_view(len(rows)) if len(t.shapes) == 1 else t.shape_ids[rows]
    out = RelationType(keys, sids, t.shapes, t.dtype)
    dup = out.duplicates()
    if dup:
        keys, rows = node.key_fn.apply(t.keys)  # errors name keys in apply's order
        d = np.array(dup[0])
        src = t.keys[rows[np.all(keys == d, axis=1)]]
        raise ValueError(
            f"{where}: keys {_fmt_keys(src.tolist())} all map to {tuple(dup[0])}; a rekey "
            f"must keep keys unique ({len(dup)} duplicated key(s) in all)"
        )
    return out


def filter_type(node) -> RelationType:
    """Type rule of filter (also used by the IA operator that implements it)."""
    t = node.input.type
    where = f"filter({node.input.label}, {node.pred!r})"
    _check_reads(where, node.input, node.pred.dims_read, "the predicate")
    try:
        mask = np.asarray(node.pred.evaluate(t.keys), dtype=bool).reshape(-1)
    except (TypeError, ValueError) as e:
        raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{where}: {e}") from None
    return RelationType(t.keys[mask], t.shape_ids[mask], t.shapes, t.dtype, sort=False)


def transform_type(node) -> RelationType:
    """Type rule of transform (also used by the IA operator that implements it)."""
    t = node.input.type
    shapes, dtypes = [], set()
    for s in t.shapes:
        try:
            out = node.kernel.out_type(ArrayType(s, t.dtype))
        except KernelTypeError as e:
            raise ValueError(f"transform({node.input.label}, kernel={node.kernel!r}): {e}") from None
        shapes.append(out.shape)
        dtypes.add(out.dtype)
    dtype = dtypes.pop() if dtypes else t.dtype
    return RelationType(t.keys, t.shape_ids, shapes, dtype, like=t)


def tile_type(node) -> RelationType:
    """Type rule of tile (also used by the IA operator that implements it)."""
    t = node.input.type
    where = f"tile({node.input.label}, tile_dim={node.tile_dim}, tile_size={node.tile_size})"
    (d,) = check_dims(where, node.input, (node.tile_dim,), "tile_dim", t.rank, unit="array")
    size = node.tile_size
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size <= 0:
        raise ValueError(f"{where}: tile_size must be a positive int, got {size!r}")
    shapes = np.array(t.shapes, dtype=np.int64).reshape(len(t.shapes), t.rank)
    ntiles = -(-shapes[:, d] // size)
    counts = ntiles[t.shape_ids]
    check_size(where, int(counts.sum()), t.arity + 1)
    rows = np.repeat(np.arange(t.ntuples), counts)
    tix = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    rows_shape = shapes[t.shape_ids[rows]].copy()
    rows_shape[:, d] = np.minimum(size, rows_shape[:, d] - tix * size)
    keys = np.concatenate([t.keys[rows], tix[:, None]], axis=1)
    return _with_shape_rows(keys, rows_shape, t.dtype)


def concat_type(node) -> RelationType:
    """Type rule of concat (also used by the IA operator that implements it)."""
    t = node.input.type
    where = f"concat({node.input.label}, key_dim={node.key_dim}, array_dim={node.array_dim})"
    (kd,) = check_dims(where, node.input, (node.key_dim,), "key_dim", t.arity)
    (ad,) = check_dims(where, node.input, (node.array_dim,), "array_dim", t.rank, unit="array")
    rest = [i for i in range(t.arity) if i != kd]
    sort_keys = np.concatenate([t.keys[:, rest], t.keys[:, [kd]]], axis=1)
    order = lexsort_rows(sort_keys)
    gkeys, pos = t.keys[order][:, rest], t.keys[order][:, kd]
    shapes = np.array(t.shapes, dtype=np.int64).reshape(len(t.shapes), t.rank)[t.shape_ids[order]]
    gcode = encode_rows(gkeys)
    starts = np.flatnonzero(np.r_[True, gcode[1:] != gcode[:-1]]) if len(gcode) else np.zeros(0, int)
    sizes = np.diff(np.r_[starts, len(gcode)])
    expected = np.arange(len(pos)) - np.repeat(starts, sizes)
    if np.any(pos != expected):
        g = int(np.searchsorted(starts, np.flatnonzero(pos != expected)[0], side="right") - 1)
        vals = pos[starts[g] : starts[g] + sizes[g]].tolist()
        raise ValueError(
            f"{where}: the group {tuple(gkeys[starts[g]].tolist())} has key_dim values "
            f"{vals}; concat needs each group's key_dim values to be 0..m-1 with no gaps"
        )
    other = [i for i in range(t.rank) if i != ad]
    if other and len(shapes):
        lo = np.minimum.reduceat(shapes[:, other], starts, axis=0)
        hi = np.maximum.reduceat(shapes[:, other], starts, axis=0)
        if np.any(lo != hi):
            g = int(np.flatnonzero(np.any(lo != hi, axis=1))[0])
            members = shapes[starts[g] : starts[g] + sizes[g]].tolist()
            raise ValueError(
                f"{where}: the chunks of group {tuple(gkeys[starts[g]].tolist())} have "
                f"shapes {members}, which differ outside array dim {ad}; they cannot be "
                f"concatenated along it"
            )
    out_shapes = shapes[starts].copy()
    if len(shapes):
        out_shapes[:, ad] = np.add.reduceat(shapes[:, ad], starts)
    return _with_shape_rows(gkeys[starts], out_shapes, t.dtype)


# ---------------------------------------------------------------------------


# the fluent methods above call these; they import this module (so they come last)
from . import builders as _builders  # noqa: E402
from .evaluate import evaluate as _evaluate_expr, to_numpy as _to_numpy  # noqa: E402
