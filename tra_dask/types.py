"""Array types and relation types: what every TRA node knows without touching data.

A tensor relation is a set of ``(key, chunk)`` pairs (paper §3).  Its *type* is
everything the optimizer needs and nothing more: the exact set of keys, the true
shape of every chunk (edge chunks of a tensor whose extent is not a multiple of the
chunk shape are smaller) and the dtype.  Keys are dense and unique, so a relation of
tens of thousands of tuples is described exactly by a few small integer arrays; all
key-level work below is vectorised with numpy so that planning at the paper's scale
(10^4 input tuples, 10^6 join tuples) costs milliseconds, not seconds.

>>> t = grid_type((5, 4), (2, 4), "float64")
>>> t.arity, t.ntuples, t.frontier
(2, 3, (3, 1))
>>> t.chunk_shape((2, 0)), t.nbytes
((1, 4), 160)
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

Key = tuple[int, ...]
Shape = tuple[int, ...]

__all__ = [
    "ArrayType",
    "RelationType",
    "Key",
    "Shape",
    "grid_type",
    "normalize_key",
    "normalize_chunks",
    "check_extents",
    "encode_rows",
    "join_pairs",
    "check_size",
    "max_tuples",
    "MAX_KEY_ENTRIES",
]


@dataclass(frozen=True, slots=True)
class ArrayType:
    """The type of one chunk: its shape and dtype (the paper's rank and bound).

    >>> ArrayType((2, 3), np.dtype("float32")).nbytes
    24
    """

    shape: Shape
    dtype: np.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"ArrayType({self.shape}, {self.dtype})"


def normalize_key(key, *, where: str = "key") -> Key:
    """Return ``key`` as a tuple of plain non-negative Python ints, or raise.

    >>> normalize_key((np.int64(1), 2))
    (1, 2)
    >>> normalize_key(3)
    (3,)
    """
    if isinstance(key, (int, np.integer)) and not isinstance(key, (bool, np.bool_)):
        key = (key,)
    if not isinstance(key, tuple):
        raise TypeError(f"{where}: a key must be a tuple of non-negative ints, got {key!r}")
    out = []
    for v in key:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(
                f"{where}: key {key!r} has a non-integer entry {v!r} "
                f"({type(v).__name__}); keys are tuples of non-negative ints"
            )
        if v < 0:
            raise ValueError(f"{where}: key {key!r} has a negative entry {v}; keys are non-negative")
        if v >= 2**63:
            raise ValueError(f"{where}: key {key!r} has an entry {v} that does not fit in int64; keys are below 2**63")
        out.append(int(v))
    return tuple(out)


MAX_RANK = 64  # numpy's limit on array dims (NPY_MAXDIMS)
MAX_EXTENT = 2**63 - 1  # extents, chunk sizes and keys are int64 in the types and plans


def check_extents(shape, where: str, *, what: str = "shape") -> Shape:
    """``shape`` as a tuple of Python ints, each >= 1 and < 2**63 — the one check of
    every constructor that takes a shape (or block sizes: ``what``), named by
    ``where`` in its errors.

    Accepted: a tuple or list (or 1-d integer numpy array) of Python ints and numpy
    integer scalars, or one int for one dim.  A TypeError for an extent that is not
    an int — a float (even ``4.0``, as numpy refuses it: ``int(2.5)`` would make a
    dim of 2), a string, a bool, None, NaN or an infinity — and for a shape that is
    not a sequence (a string is not one); a ValueError for an extent < 1 (zero:
    relations, and the constructors that make data, have no empty axes; an empty
    numpy or dask array given to ``td.from_array`` is the front-end's, which knows
    every result over it from shapes alone), one >= 2**63 (it does not fit in int64) and
    more than :data:`MAX_RANK` dims.

    >>> check_extents((np.int64(2), 3), "f")
    (2, 3)
    >>> check_extents((2.5, 3), "f")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    TypeError: f: shape (2.5, 3) has extent 2.5 (float) for dim 0; extents must be ints >= 1 and < 2**63 ...
    """
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    elif isinstance(shape, np.ndarray) and shape.ndim == 1 and shape.dtype.kind in "iu":
        shape = tuple(shape.tolist())
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{where}: {what} must be a tuple of ints, got {shape!r} ({type(shape).__name__}); "
                        f"extents are ints >= 1 and < 2**63")
    shown = tuple(shape)
    for d, n in enumerate(shown):
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise TypeError(
                f"{where}: {what} {shown!r} has extent {n!r} ({type(n).__name__}) for dim {d}; extents must be "
                f"ints >= 1 and < 2**63 (Python or numpy ints: not bool, float, str or None)"
            )
    out = tuple(int(n) for n in shown)
    for d, n in enumerate(out):
        if n < 1:
            raise ValueError(
                f"{where}: {what} {out} has an empty or negative dim (extent {n} for dim {d}); every extent "
                f"must be an int >= 1"
            )
        if n > MAX_EXTENT:
            raise ValueError(
                f"{where}: {what} {out} has extent {n} for dim {d}, which does not fit in int64; every extent "
                f"must be an int >= 1 and < 2**63"
            )
    if len(out) > MAX_RANK:
        raise ValueError(
            f"{where}: {what} has {len(out)} dims; a chunk is a numpy array, which has at most {MAX_RANK}"
        )
    return out


def normalize_chunks(chunks, shape: Shape, *, where: str) -> Shape:
    """Chunk shape for a tensor of ``shape``: an int for every dim, a tuple, and
    ``-1``/``None`` meaning the whole extent (as in dask).

    >>> normalize_chunks(2, (5, 4), where="x")
    (2, 2)
    >>> normalize_chunks((2, -1), (5, 4), where="x")
    (2, 4)
    """
    if isinstance(chunks, (int, np.integer)) and not isinstance(chunks, bool):
        chunks = (int(chunks),) * len(shape)
    if not isinstance(chunks, (tuple, list)):
        raise TypeError(f"{where}: chunks must be an int or a tuple of ints, got {chunks!r}")
    if len(chunks) != len(shape):
        raise ValueError(
            f"{where}: chunks {tuple(chunks)} have {len(chunks)} entries but the tensor "
            f"has rank {len(shape)} (shape {shape}); give one chunk size per dim"
        )
    out = []
    for d, (c, n) in enumerate(zip(chunks, shape)):
        if c is None or (isinstance(c, (int, np.integer)) and c == -1):
            c = max(n, 1)
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)):
            raise TypeError(f"{where}: chunk size for dim {d} must be an int, got {c!r}")
        if c <= 0 or c > MAX_EXTENT:
            raise ValueError(
                f"{where}: chunk size {c} for dim {d} is {'not positive' if c <= 0 else 'over 2**63 - 1'}; "
                f"valid chunk sizes are 1..{n} (or -1 for the whole dim)"
            )
        out.append(int(c))
    return tuple(out)


# ---------------------------------------------------------------------------
# vectorised key helpers


def encode_rows(rows: np.ndarray) -> np.ndarray:
    """One int64 code per row of a non-negative int matrix, equal iff rows are equal.

    Codes are a mixed-radix number when that fits in 63 bits (order-preserving:
    sorting codes sorts rows lexicographically), else dense ids from ``np.unique``.

    >>> encode_rows(np.array([[1, 2], [0, 5], [1, 2]])).tolist()
    [8, 5, 8]
    """
    n, c = rows.shape
    if c == 0:
        return np.zeros(n, dtype=np.int64)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bases = np.array(_column_max(rows), dtype=object) + 1
    if math.prod(int(b) for b in bases) < 2**62:
        if rows.dtype.kind in "iu" and rows.dtype != np.uint64:  # in place: one buffer, no temporaries
            return _mixed_radix(rows, [int(b) for b in bases])
        code = np.zeros(n, dtype=np.int64)
        for j in range(c):
            code = code * int(bases[j]) + rows[:, j]
        return code
    _, inv = np.unique(rows, axis=0, return_inverse=True)
    return inv.reshape(-1).astype(np.int64)


def unique(a: np.ndarray, bound: int | None = None) -> np.ndarray:
    """Sorted distinct values (sort-based: numpy's hash-based ``np.unique`` is an
    order of magnitude slower on 10^6 ints; by counting, linear, when the values are
    non-negative ints below ``bound`` and ``bound`` is not much larger than ``len(a)``).

    >>> unique(np.array([3, 1, 3, 2])).tolist()
    [1, 2, 3]
    >>> unique(np.array([3, 1, 3, 2]), bound=4).tolist()
    [1, 2, 3]
    """
    a = np.asarray(a).reshape(-1)
    if bound is not None and len(a) and bound <= 16 * len(a) + 1024 and int(a.min()) >= 0 and int(a.max()) < bound:
        seen = np.zeros(bound, dtype=bool)  # one byte per possible value
        seen[a] = True
        return np.flatnonzero(seen).astype(a.dtype, copy=False)
    s = np.sort(a)
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


def _radix(rows: np.ndarray):
    """``(bases, codes)``: the order-preserving mixed-radix code of each row of a
    non-negative int matrix (bases = column max + 1), or ``None`` when it would not
    fit in 62 bits."""
    n, c = rows.shape
    if n == 0 or c == 0:
        return (), np.zeros(n, dtype=np.int64)
    if any(rows[:, j].min() < 0 for j in range(c)):
        return None
    bases = tuple(m + 1 for m in _column_max(rows))
    if math.prod(bases) >= 2**62:
        return None
    return bases, _mixed_radix(rows, bases)


def _column_max(rows: np.ndarray) -> list:
    """Max of each column as ints (column by column: ``max(axis=0)`` on a tall, narrow
    matrix runs an inner loop as long as the row, several times slower)."""
    return [int(rows[:, j].max()) for j in range(rows.shape[1])]


def _mixed_radix(rows: np.ndarray, bases) -> np.ndarray:
    return mixed_radix_cols(rows, range(rows.shape[1]), bases)


def mixed_radix_cols(rows: np.ndarray, dims, bases) -> np.ndarray:
    """The mixed-radix code of ``rows[:, dims]``, read column by column (no copy of
    the columns; zeros for no dims)."""
    dims = list(dims)
    if not dims:
        return np.zeros(len(rows), dtype=np.int64)
    code = rows[:, dims[0]].astype(np.int64, copy=True)
    for b, d in zip(bases[1:], dims[1:]):
        code *= b
        code += rows[:, d]
    return code


def sorting_permutation(codes: np.ndarray):
    """Stable permutation sorting ``codes``; ``None`` when they already are sorted."""
    if len(codes) <= 1 or bool(np.all(codes[1:] >= codes[:-1])):
        return None
    return stable_argsort(codes)


def stable_argsort(codes: np.ndarray, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    """``np.argsort(codes, kind="stable")`` for ints, by one or two 16-bit radix passes
    when the values span less than 2**32 (numpy radix-sorts 16-bit keys only; a
    comparison sort of 10^6 int64 is about 3x slower).  ``lo``/``hi``: known bounds."""
    n = len(codes)
    if n < 1024 or codes.dtype.kind not in "iu":
        return np.argsort(codes, kind="stable")
    lo = int(codes.min()) if lo is None else lo
    hi = int(codes.max()) if hi is None else hi
    span = hi - lo
    if span < 1 << 16:
        return np.argsort((codes - lo).astype(np.uint16), kind="stable")
    if span < 1 << 32:
        c = codes - lo
        order = np.argsort((c & 0xFFFF).astype(np.uint16), kind="stable")
        return order[np.argsort((c[order] >> 16).astype(np.uint16), kind="stable")]
    return np.argsort(codes, kind="stable")


def lexsort_rows(rows: np.ndarray) -> np.ndarray:
    """Permutation that sorts rows lexicographically (dim 0 most significant); stable,
    like ``np.lexsort``."""
    if rows.shape[1] == 0 or rows.shape[0] <= 1:
        return np.arange(rows.shape[0])
    rc = _radix(rows)
    if rc is None:
        return np.lexsort(rows.T[::-1])
    order = sorting_permutation(rc[1])
    return np.arange(rows.shape[0]) if order is None else order


def unique_inverse(a: np.ndarray, bound: int | None = None):
    """``(values, inverse)`` as ``np.unique(a, return_inverse=True)`` gives them, for
    non-negative ints; by counting (linear) when ``bound`` (> every value) is not much
    larger than ``len(a)``, else by sorting.

    >>> [v.tolist() for v in unique_inverse(np.array([5, 1, 5, 2]), 6)]
    [[1, 2, 5], [2, 0, 2, 1]]
    """
    a = np.asarray(a).reshape(-1)
    if bound is not None and len(a) and bound <= 4 * len(a) + 1024:
        present = np.bincount(a, minlength=bound) > 0
        values = np.flatnonzero(present).astype(a.dtype, copy=False)
        lut = np.cumsum(present) - 1
        return values, lut[a].astype(np.intp, copy=False)
    values, inverse = np.unique(a, return_inverse=True)
    return values, inverse.reshape(-1)


def zeros_view(n: int) -> np.ndarray:
    """``n`` zeros (intp) as a read-only view of one: the shape ids of a relation
    whose chunks all have one shape (the usual case) hold no memory."""
    return np.broadcast_to(np.zeros(1, dtype=np.intp), (n,))


def _is_zeros_view(a: np.ndarray) -> bool:
    return a.ndim == 1 and len(a) > 0 and a.strides == (0,) and int(a[0]) == 0


def unique_first_inverse(a: np.ndarray, bound: int | None = None):
    """``np.unique(a, return_index=True, return_inverse=True)`` for non-negative ints:
    by counting when ``bound`` (> every value) is not much larger than ``len(a)``
    (``np.unique`` sorts: seconds on 10^7 values), else ``np.unique`` itself.

    >>> [v.tolist() for v in unique_first_inverse(np.array([5, 1, 5, 2]), 6)]
    [[1, 2, 5], [1, 3, 0], [2, 0, 2, 1]]
    """
    a = np.asarray(a).reshape(-1)
    n = len(a)
    if bound is None or not n or bound > 4 * n + 1024:
        values, first, inverse = np.unique(a, return_index=True, return_inverse=True)
        return values, first, inverse.reshape(-1)
    counts = np.bincount(a, minlength=bound)
    values = np.flatnonzero(counts).astype(a.dtype, copy=False)
    if len(values) == 1:  # one value (a join's or an aggregation's single chunk shape)
        return values, np.zeros(1, dtype=np.intp), np.zeros(n, dtype=np.intp)
    lut = np.cumsum(counts > 0) - 1
    inverse = lut[a].astype(np.intp, copy=False)
    first = np.empty(len(values), dtype=np.intp)
    first[inverse[::-1]] = np.arange(n - 1, -1, -1, dtype=np.intp)  # a repeated index keeps the last write
    return values, first, inverse


def first_of_each(a: np.ndarray, dtype=np.int64) -> np.ndarray:
    """For each position of the ints ``a``, the first position holding the same value
    (positions of type ``dtype``): by a table when the values span a range not much
    larger than ``len(a)`` (fresh ids do), else by a stable sort.

    >>> first_of_each(np.array([7, 3, 7, 3, 9])).tolist()
    [0, 1, 0, 1, 4]
    """
    a = np.asarray(a).reshape(-1)
    n = len(a)
    if not n:
        return np.zeros(0, dtype=dtype)
    got = _first_table(a, dtype)
    if got is not None:
        c, at = got
        return at[c]
    order = np.argsort(a, kind="stable")
    v = a[order]
    new = np.r_[True, v[1:] != v[:-1]]
    out = np.empty(n, dtype=np.int64)
    out[order] = order[new][np.cumsum(new) - 1]
    return out.astype(dtype, copy=False)


def first_positions(a: np.ndarray) -> np.ndarray:
    """Positions of the first occurrence of each distinct value of the ints ``a``,
    ascending (``first_of_each(a) == arange``): by a table of int32 positions when the
    values span a compact range, no (n,) int64 temporaries (a layout's 10^7 origins).

    >>> first_positions(np.array([7, 3, 7, 3, 9])).tolist()
    [0, 1, 4]
    """
    a = np.asarray(a).reshape(-1)
    n = len(a)
    got = _first_table(a, np.int32 if n < 2**31 - 1 else np.int64) if n else None
    if got is None:
        return np.flatnonzero(first_of_each(a) == np.arange(n))
    c, at = got
    seen = np.zeros(len(at), dtype=bool)
    seen[c] = True
    mark = np.zeros(n, dtype=bool)
    mark[at[seen]] = True
    return np.flatnonzero(mark)


def _first_table(a: np.ndarray, dtype):
    """``(a - min, table)`` where ``table[v]`` is the first position (of type ``dtype``)
    holding ``min + v`` (unset where none does), when ``a``'s values span at most
    about 4x its length; else None."""
    n = len(a)
    lo = int(a.min())
    span = int(a.max()) - lo + 1
    if span > 4 * n + 1024:
        return None
    c = a - lo if lo else a
    at = np.empty(span, dtype=dtype)
    at[c[::-1]] = np.arange(n - 1, -1, -1, dtype=dtype)  # a repeated index keeps the last write: the first
    return c, at


def join_pairs(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs ``(i, j)`` with ``left[i] == right[j]`` (rows compared whole).

    >>> li, ri = join_pairs(np.array([[0], [1], [1]]), np.array([[1], [0], [1]]))
    >>> sorted(zip(li.tolist(), ri.tolist()))
    [(0, 1), (1, 0), (1, 2), (2, 0), (2, 2)]
    """
    codes = key_codes(left, range(left.shape[1]), right, range(right.shape[1]))
    return join_codes(*codes)


def key_codes(left: np.ndarray, ldims, right: np.ndarray, rdims) -> tuple[np.ndarray, np.ndarray]:
    """``encode_rows`` of ``left[:, ldims]`` stacked on ``right[:, rdims]``, split back
    into the two sides' codes: equal iff the rows agree on those dims.  Read column by
    column when the mixed-radix code fits (the usual case): no stacked copy of the
    rows, the same codes."""
    ldims, rdims = list(ldims), list(rdims)
    nl, nr = len(left), len(right)
    if ldims and nl and nr and all(a.dtype.kind in "iu" and a.dtype != np.uint64 for a in (left, right)):
        bases = [max(int(left[:, a].max()), int(right[:, b].max())) + 1 for a, b in zip(ldims, rdims)]
        if math.prod(bases) < 2**62:  # encode_rows' condition on the stacked rows' column maxima
            return mixed_radix_cols(left, ldims, bases), mixed_radix_cols(right, rdims, bases)
    codes = encode_rows(np.concatenate([left[:, ldims], right[:, rdims]]))
    return codes[:nl], codes[nl:]


def pair_count(lc: np.ndarray, rc: np.ndarray) -> int:
    """How many pairs :func:`join_codes` would make (without making them).

    >>> pair_count(np.array([0, 1, 1]), np.array([1, 0, 1]))
    5
    """
    if not len(lc) or not len(rc):
        return 0
    lv, lcount = np.unique(lc, return_counts=True)
    rv, rcount = np.unique(rc, return_counts=True)
    _, li, ri = np.intersect1d(lv, rv, assume_unique=True, return_indices=True)
    return int(np.dot(lcount[li].astype(object), rcount[ri].astype(object))) if len(li) else 0


def join_codes(lc: np.ndarray, rc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All index pairs ``(i, j)`` with ``lc[i] == rc[j]`` (int codes): ``i`` ascending,
    and for one ``i`` the ``j`` ascending.

    >>> [p.tolist() for p in join_codes(np.array([0, 1, 1]), np.array([1, 0, 1]))]
    [[0, 1, 1, 2, 2], [1, 0, 2, 0, 2]]
    """
    nl = len(lc)
    both_min = min(int(lc.min()), int(rc.min())) if nl and len(rc) else -1
    bound = max(int(lc.max()), int(rc.max())) + 1 if both_min >= 0 else None
    if bound is not None and bound <= 4 * (nl + len(rc)) + 1024:
        # small codes (the usual case: a few key dims and a site): count, don't search
        nr = len(rc)
        if nr > 2 * nl + 1024:  # a long right side (a broadcast): keep the rows that can meet
            wanted = np.zeros(bound, dtype=bool)
            wanted[lc] = True
            keep = np.flatnonzero(wanted[rc])  # ascending: each i's matches stay in order
            if len(keep) < nr:
                li, ri = join_codes(lc, rc[keep])
                return li, keep[ri]
        at = np.full(bound, -1, dtype=np.int32 if nr < 2**31 else np.int64)
        at[rc] = np.arange(nr, dtype=at.dtype)  # a repeated code keeps its last position
        if np.array_equal(at[rc], np.arange(nr, dtype=at.dtype)):
            # each right code once (a one-to-one join): the table is the whole join
            j = at[lc]
            hit = j >= 0
            if hit.all():  # every left row meets one right row (a 3-D multiply's local join)
                return np.arange(nl), j.astype(np.intp)
            li = np.flatnonzero(hit)
            return li, j[li].astype(np.intp)
        del at
        per = np.bincount(rc, minlength=bound)
        order = stable_argsort(rc, 0, bound - 1)
        meet = np.flatnonzero((per > 0)[lc])  # the left rows with a match: often few (a broadcast side)
        if len(meet) < nl:  # the others make no pair: leaving them out moves no pair
            lc = lc[meet]
        else:
            meet = None
        count = per[lc]
        start = (np.cumsum(per) - per)[lc]
    else:
        order = np.argsort(rc, kind="stable")
        rs = rc[order]
        start = np.searchsorted(rs, lc, side="left")
        count = np.searchsorted(rs, lc, side="right") - start
        meet = None
    ends = np.cumsum(count)
    total = int(ends[-1]) if len(ends) else 0
    # the pairs' positions as int32 while they fit (a 3-D multiply's logical join: 10^7 pairs)
    ix = np.int32 if max(total, nl, len(rc)) < 2**31 - 1 else np.int64
    li = np.repeat(np.arange(nl, dtype=ix) if meet is None else meet.astype(ix), count)
    # pair p of left row i is match (p - first pair of i) of i's run, at start[i] in order
    shift = np.repeat((start - (ends - count)).astype(ix), count)
    shift += np.arange(total, dtype=ix)
    ri = order.astype(ix, copy=False)[shift]
    return li, ri


# ---------------------------------------------------------------------------


class RelationType:
    """Exact description of a tensor relation without its arrays.

    Parameters
    ----------
    keys : (n, k) int array
        The keys; stored sorted lexicographically and read-only.
    shape_ids : (n,) int array
        Index into ``shapes`` of each key's chunk shape.
    shapes : sequence of shapes
        The distinct chunk shapes (usually one, a few more with edge chunks).
    dtype : numpy dtype
        The dtype shared by all chunks.

    Instances are immutable and built by the type rules of the logical nodes; user
    code reads them.  A full grid of keys (:meth:`grid`) makes its key array when it
    is first read.  Uniqueness of keys is the caller's job (see
    :meth:`duplicates`), continuity is a property (:attr:`is_continuous`).
    """

    __slots__ = ("_keys", "shape_ids", "shapes", "dtype", "_memo")

    def __init__(self, keys, shape_ids, shapes: Sequence[Shape], dtype, *, sort: bool = True,
                 like: "RelationType | None" = None):
        # like: a type whose key array *is* ``keys`` (a transform, a one-to-one join):
        # its key facts (frontier, index, distinctness) hold as they are, nothing is
        # sorted or coded again
        if like is not None and keys is not like.keys:
            raise ValueError("RelationType: like= needs the other type's own key array")
        keys = np.asarray(keys, dtype=np.int64)
        shape_ids = np.asarray(shape_ids, dtype=np.intp).reshape(-1)
        if keys.ndim != 2 or len(keys) != len(shape_ids):
            raise ValueError("RelationType: keys must be (n, k) with one shape id per key")
        shapes = [tuple(int(v) for v in s) for s in shapes]
        if shapes and len({len(s) for s in shapes}) != 1:
            raise ValueError(f"RelationType: chunks of different ranks {sorted(set(shapes))}")
        # one table entry per distinct shape in use, renumbered; an empty relation keeps
        # its shape table, so it still knows its chunk rank and dtype
        if shapes and _is_zeros_view(shape_ids):  # every chunk of shape 0: nothing to check or renumber
            shapes = (shapes[0],)
        elif len(shape_ids):
            if shape_ids.min() < 0:
                raise ValueError("RelationType: shape ids must be non-negative")
            shape_ids, shapes = _renumber_shapes(shape_ids, shapes)
        else:
            shapes = tuple(dict.fromkeys(shapes))
        memo: dict = {}
        if like is not None:
            memo.update((k, v) for k, v in like._memo.items() if k in ("frontier", "index", "distinct"))
        elif sort and len(keys) > 1:
            rc = _radix(keys) if keys.shape[1] else None
            if rc is None:
                order = lexsort_rows(keys)
                keys, shape_ids = keys[order], shape_ids[order]
            else:  # the codes are order-preserving: sort them, keep them for locate
                bases, codes = rc
                if bool(np.all(codes[1:] > codes[:-1])):  # sorted and distinct (the usual case): one pass
                    memo["distinct"] = True
                else:
                    order = sorting_permutation(codes)
                    if order is not None:
                        keys, shape_ids, codes = keys[order], shape_ids[order], codes[order]
                memo["index"] = _KeyIndex(bases, codes, None)
                if memo["index"].dense:
                    keys = _shared_grid(bases, keys)
        keys.setflags(write=False)
        shape_ids = shape_ids.reshape(-1)
        if len(shapes) == 1 and len(shape_ids) and not _is_zeros_view(shape_ids):
            shape_ids = zeros_view(len(shape_ids))  # (one shape: every id is 0)
        shape_ids.setflags(write=False)
        self._keys = keys
        self.shape_ids = shape_ids
        self.shapes = shapes
        self.dtype = np.dtype(dtype)
        self._memo = memo  # derived facts, computed once (the type is immutable)

    @classmethod
    def grid(cls, bases: tuple, shape: Shape, dtype) -> "RelationType":
        """The type whose keys are every key below ``bases``, in order, each with a
        chunk of ``shape``: made without sorting or coding them (a 3-D multiply's
        join of two full grids: 10^7 keys).  Its key array is made when first read
        (:func:`dense_keys`, shared); what the planner asks of a grid (its size, its
        groups, the sites of its keys: :meth:`key_column`) needs none."""
        bases = tuple(int(b) for b in bases)
        n = math.prod(bases)
        if not n:
            return cls(np.zeros((0, len(bases)), np.int64), [], [shape], dtype)
        t = cls(np.zeros((1, len(bases)), np.int64), zeros_view(1), [shape], dtype, sort=False)
        t._keys, t.shape_ids = None, zeros_view(n)
        index = _KeyIndex.__new__(_KeyIndex)
        index.bases, index.codes, index.order, index.dense = bases, None, None, True
        t._memo.update(frontier=bases if n else (0,) * len(bases), distinct=True, index=index)
        return t

    @property
    def keys(self) -> np.ndarray:
        """The keys, sorted, read-only (an ``(ntuples, arity)`` int64 array)."""
        k = self._keys
        if k is None:  # a grid's, made on first read
            k = dense_keys(self._memo["frontier"])
            k.setflags(write=False)
            self._keys = k
        return k

    @property
    def is_grid(self) -> bool:
        """Whether the keys are every key below the frontier, in order (known without
        reading them: a type made by :meth:`grid`, or whose keys were found so)."""
        index = self._memo.get("index")
        return index is not None and index.dense and len(self.shapes) <= 1

    def key_column(self, d: int) -> np.ndarray:
        """Key dim ``d`` of every key: ``keys[:, d]``, or for a grid whose keys are
        not made, ``arange(frontier[d])`` shaped to broadcast over the grid (of shape
        the frontier; :func:`flat_over` makes it one value per key)."""
        if self._keys is None:
            f = self._memo["frontier"]
            return np.arange(f[d]).reshape([f[d] if j == d else 1 for j in range(len(f))])
        return self._keys[:, d]

    def column(self, d: int) -> np.ndarray:
        """Key dim ``d`` of every key, one value per key (``keys[:, d]``; for a grid
        whose keys are not made, that column alone)."""
        return flat_over(self.key_column(d), self.frontier)

    def same_keys(self, other: "RelationType") -> bool:
        """Whether ``other``'s keys are this type's key array itself (a cheap test,
        not a comparison): the same array, or grids of one frontier."""
        if self._keys is not None and self._keys is other._keys:
            return True
        return self.is_grid and other.is_grid and self.frontier == other.frontier

    # -- basic facts -------------------------------------------------------
    @property
    def arity(self) -> int:
        """Key arity ``k``."""
        return len(self._memo["frontier"]) if self._keys is None else self._keys.shape[1]

    @property
    def ntuples(self) -> int:
        return len(self.shape_ids)

    @property
    def rank(self) -> int:
        """Rank of every chunk."""
        return len(self.shapes[0]) if self.shapes else 0

    @property
    def frontier(self) -> Key:
        """The smallest vector bounding every key (paper §3.2); ``()`` for arity 0."""
        f = self._memo.get("frontier")
        if f is None:
            if self.ntuples == 0:
                f = (0,) * self.arity
            else:
                f = tuple(m + 1 for m in _column_max(self.keys))
            self._memo["frontier"] = f
        return f

    @property
    def bound(self) -> Shape:
        """The largest extent of any chunk along each array dim (the paper's bound)."""
        if not self.shapes:
            return ()
        return tuple(int(v) for v in np.max(np.array(self.shapes, dtype=np.int64), axis=0))

    @property
    def chunk_sizes(self) -> np.ndarray:
        """Elements in each chunk, aligned with :attr:`keys` (computed once, read-only)."""
        out = self._memo.get("chunk_sizes")
        if out is None:
            sizes = self.shape_sizes
            if len(sizes) == 1:  # one chunk shape (the usual case): a constant view, no memory
                out = np.broadcast_to(sizes[0], (self.ntuples,))
            else:
                out = sizes[self.shape_ids]
                out.setflags(write=False)
            self._memo["chunk_sizes"] = out
        return out

    @property
    def shape_sizes(self) -> np.ndarray:
        """Elements in a chunk of each of :attr:`shapes` (index it with shape ids)."""
        out = self._memo.get("shape_sizes")
        if out is None:
            out = np.array([math.prod(s) for s in self.shapes], dtype=np.int64)
            out.setflags(write=False)
            self._memo["shape_sizes"] = out
        return out

    @property
    def nelements(self) -> int:
        """Floats held by the relation (elements over all chunks)."""
        out = self._memo.get("nelements")
        if out is None:
            counts = np.bincount(self.shape_ids, minlength=len(self.shapes))
            out = self._memo["nelements"] = int(sum(int(c) * math.prod(s) for c, s in zip(counts, self.shapes)))
        return out

    @property
    def nbytes(self) -> int:
        return self.nelements * self.dtype.itemsize

    def key_list(self) -> list[Key]:
        return [tuple(r) for r in self.keys.tolist()]

    def chunk_shapes(self) -> dict[Key, Shape]:
        """``{key: chunk shape}`` for every key."""
        return {tuple(k): self.shapes[i] for k, i in zip(self.keys.tolist(), self.shape_ids.tolist())}

    def grid_extents(self) -> tuple:
        """Per key dim ``d``, the extent along array dim ``d`` of the chunks with key
        value ``0..frontier[d]-1`` there (read on the keys that are 0 elsewhere): a
        chunk grid's dask-style chunks.  For a continuous grid with arity <= rank."""
        shapes = self.chunk_shapes()
        return tuple(
            tuple(int(shapes[tuple(v if j == d else 0 for j in range(self.arity))][d]) for v in range(self.frontier[d]))
            for d in range(self.arity)
        )

    def _index(self):
        """The keys' mixed-radix codes (bases: the frontier) with the permutation that
        sorts them — or ``None`` when they do not fit in 62 bits."""
        if "index" not in self._memo:
            rc = _radix(self.keys)
            if rc is None:
                self._memo["index"] = None
            else:
                bases, codes = rc
                order = sorting_permutation(codes)
                self._memo["index"] = _KeyIndex(bases, codes if order is None else codes[order], order)
        return self._memo["index"]

    def locate(self, keys, dims=None) -> np.ndarray:
        """Row index of each of ``keys`` (an (m, k) int array), or of each of
        ``keys[:, dims]`` (read in place: no copy of the columns); -1 where absent."""
        keys = np.asarray(keys, dtype=np.int64)
        if dims is not None:
            dims = list(dims)
            if keys.ndim == 2 and len(dims) == self.arity and self.ntuples:
                index = self._index()
                if index is not None:
                    return index.locate(keys, dims)
            keys = keys[:, dims]
        if keys.ndim != 2:
            keys = keys.reshape(-1, self.arity) if self.arity else keys.reshape(len(keys), 0)
        if self.ntuples == 0:
            return np.full(len(keys), -1, dtype=np.intp)
        if keys.shape[1] == self.arity:
            index = self._index()
            if index is not None:
                return index.locate(keys)
        both = encode_rows(np.concatenate([self.keys, keys]))
        mine, theirs = both[: self.ntuples], both[self.ntuples :]
        order = np.argsort(mine, kind="stable")
        pos = np.minimum(np.searchsorted(mine[order], theirs), self.ntuples - 1)
        return np.where(mine[order][pos] == theirs, order[pos], -1)

    def chunk_type(self, key) -> ArrayType:
        """The :class:`ArrayType` of the chunk under ``key``; ``KeyError`` if absent."""
        key = normalize_key(key)
        row = int(self.locate(np.array([key], dtype=np.int64))[0]) if len(key) == self.arity else -1
        if row < 0:
            raise KeyError(key)
        return ArrayType(self.shapes[self.shape_ids[row]], self.dtype)

    def chunk_shape(self, key) -> Shape:
        return self.chunk_type(key).shape

    def __contains__(self, key) -> bool:
        try:
            self.chunk_type(key)
        except (KeyError, TypeError, ValueError):
            return False
        return True

    # -- integrity ---------------------------------------------------------
    def duplicates(self) -> list[Key]:
        """Keys that occur more than once (uniqueness, paper §3.2)."""
        if self.ntuples < 2 or self._memo.get("distinct"):
            return []
        same = np.ones(self.ntuples - 1, dtype=bool)
        for j in range(self.arity):  # column by column (see _column_max)
            same &= self.keys[1:, j] == self.keys[:-1, j]
        return sorted({tuple(r) for r in self.keys[1:][same].tolist()})

    @property
    def is_continuous(self) -> bool:
        """True when every key below the frontier is present (no holes)."""
        return self.ntuples == math.prod(self.frontier) and not self.duplicates()

    def holes(self, limit: int = 5) -> list[Key]:
        """Up to ``limit`` keys below the frontier that are missing."""
        f = self.frontier
        if math.prod(f) > 10**7:  # too many to list; continuity still known exactly
            return []
        grid = np.indices(f).reshape(self.arity, -1).T if self.arity else np.zeros((1, 0), np.int64)
        return [tuple(r) for r in grid[self.locate(grid) < 0][:limit].tolist()]

    def __eq__(self, other) -> bool:
        if not isinstance(other, RelationType):
            return NotImplemented
        if self.dtype != other.dtype or (self.ntuples, self.arity) != (other.ntuples, other.arity):
            return False
        if self.is_grid and other.is_grid:  # every key below the frontier: equal iff the frontiers are
            return self.frontier == other.frontier and self._same_chunk_shapes(other)
        return bool(np.array_equal(self.keys, other.keys)) and self._same_chunk_shapes(other)

    def _same_chunk_shapes(self, other: "RelationType") -> bool:
        """Row by row, equal chunk shapes (``shapes`` tables hold distinct shapes)."""
        if self.shapes == other.shapes:
            return bool(np.array_equal(self.shape_ids, other.shape_ids))
        mine = {s: i for i, s in enumerate(self.shapes)}
        to_mine = np.array([mine.get(s, -1) for s in other.shapes], dtype=np.intp)
        return bool(np.array_equal(self.shape_ids, to_mine[other.shape_ids])) if len(to_mine) else (
            len(self.shape_ids) == 0)

    __hash__ = None  # mutable-looking arrays inside; compare, don't hash

    def __repr__(self) -> str:
        shapes = ", ".join(str(s) for s in self.shapes[:4]) + (", ..." if len(self.shapes) > 4 else "")
        return (
            f"RelationType(arity={self.arity}, tuples={self.ntuples}, frontier={self.frontier}, "
            f"chunks=[{shapes}], dtype={self.dtype})"
        )


def _renumber_shapes(shape_ids: np.ndarray, shapes) -> tuple[np.ndarray, tuple]:
    """``(ids, table)``: one table entry per distinct shape in use, in order of first
    use by id.  Ids that already are that numbering (the usual case: every shape used,
    no two equal) are kept as they are, not rewritten."""
    bound = int(shape_ids.max()) + 1
    if bound > 4 * len(shape_ids) + 1024:  # sparse ids: unique_inverse sorts
        used, shape_ids = unique_inverse(shape_ids, bound)
        lut = None
    else:
        used = np.flatnonzero(np.bincount(shape_ids, minlength=bound))
        lut = np.arange(bound, dtype=np.intp)
    distinct: dict[Shape, int] = {}
    remap = np.array([distinct.setdefault(shapes[i], len(distinct)) for i in used], dtype=np.intp)
    if lut is None:
        shape_ids = remap[shape_ids.reshape(-1)]
    elif len(used) < bound or not np.array_equal(remap, lut):
        lut[used] = remap
        shape_ids = lut[shape_ids]
    return shape_ids, tuple(distinct)


_GRIDS: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()
_GRIDS_LOCK = threading.Lock()
SHARE_FROM = 1 << 16  # key arrays this long or longer are shared (small ones: not worth a lock)


def _shared_grid(bases: tuple, keys: np.ndarray) -> np.ndarray:
    """``keys``, which are every key below the frontier ``bases`` in order, or the one
    array of those keys already held (read-only) by another relation: the 3-D
    multiply's operand replicas and its join are three relations of the same 10^7
    keys."""
    if len(keys) < SHARE_FROM:
        return keys
    with _GRIDS_LOCK:
        held = _GRIDS.get(bases)
        if held is not None and held.shape == keys.shape:
            return held
        if keys.base is None and keys.flags.c_contiguous:
            keys.setflags(write=False)
            _GRIDS[bases] = keys
    return keys


def group_rows(t: RelationType, dims, out: RelationType) -> np.ndarray:
    """For each key of ``t``, the row in ``out`` of its values on ``dims``
    (``out.locate(t.keys, dims)``): their mixed-radix code, without ``t``'s keys,
    when both are grids and ``out``'s frontier is ``t``'s on those dims."""
    dims = list(dims)
    if t.is_grid and out.is_grid and t.ntuples and out.frontier == tuple(t.frontier[d] for d in dims):
        code = np.zeros((), np.int64)
        for d, b in zip(dims, out.frontier):
            code = code * b + t.key_column(d)
        return flat_over(code, t.frontier)
    return out.locate(t.keys, dims)


def flat_over(a: np.ndarray, bases: tuple) -> np.ndarray:
    """One value per key of the grid ``bases`` (in key order) of ``a``, an array that
    broadcasts over it (:meth:`RelationType.key_column`'s and arithmetic on them);
    ``a`` itself when it already is one per key (a column of made keys)."""
    if a.ndim == 1:  # (a lazy grid's columns have its arity's dims: 1-D is one per key)
        return a
    return np.ascontiguousarray(np.broadcast_to(a, tuple(bases))).reshape(-1)


def dense_keys(bases: tuple) -> np.ndarray:
    """Every key below the frontier ``bases``, in order (read-only; the one array
    another relation holds of them, when one does: :func:`_shared_grid`)."""
    n, a = math.prod(bases), len(bases)
    if n >= SHARE_FROM:
        with _GRIDS_LOCK:
            held = _GRIDS.get(bases)
        if held is not None and held.shape == (n, a):
            return held
    keys = np.empty((n, a), dtype=np.int64)
    view = keys.reshape(tuple(bases) + (a,))
    for d, b in enumerate(bases):  # column d is value v across the d-th axis of the grid
        view[..., d] = np.arange(b).reshape([b if j == d else 1 for j in range(a)])
    return _shared_grid(tuple(bases), keys)


class _KeyIndex:
    """Sorted mixed-radix codes of a relation's keys, for :meth:`RelationType.locate`.
    ``order`` maps a sorted position to its row (``None``: the rows are sorted).  When
    the keys are every key below the frontier, in order, a key's code *is* its row."""

    __slots__ = ("bases", "codes", "order", "dense")

    def __init__(self, bases, codes, order):
        n = len(codes)
        self.dense = order is None and n == math.prod(bases) and (
            n == 0 or (int(codes[0]) == 0 and int(codes[-1]) == n - 1 and bool(np.all(codes[1:] != codes[:-1]))))
        # a dense index needs no table: the code is the row
        self.bases, self.codes, self.order = bases, (None if self.dense else codes), order

    def rows_of(self, code: np.ndarray):
        """Row of each code (of keys below the frontier), or ``None`` if one is absent."""
        if self.dense:
            return code
        pos = np.minimum(np.searchsorted(self.codes, code), len(self.codes) - 1)
        if not np.array_equal(self.codes[pos], code):
            return None
        return pos if self.order is None else self.order[pos]

    def locate(self, keys: np.ndarray, dims=None) -> np.ndarray:
        """Row of each of ``keys[:, dims]`` (default: all dims), -1 where absent."""
        dims = range(keys.shape[1]) if dims is None else list(dims)
        m, k = len(keys), len(dims)
        if k == 0:  # every query is the key (), row 0
            return np.zeros(m, dtype=np.intp)
        valid = None  # None: every key is below the frontier (checked by min and max, no masks)
        for d, b in zip(dims, self.bases):  # column by column (see _column_max)
            col = keys[:, d]
            if valid is None and m and int(col.min()) >= 0 and int(col.max()) < b:
                continue
            if valid is None:
                valid = np.ones(m, dtype=bool)
            valid &= (col >= 0) & (col < b)
        ok = valid is None or bool(valid.all())
        if ok:
            code = mixed_radix_cols(keys, dims, self.bases)
        else:
            code = _mixed_radix(np.where(valid[:, None], keys[:, dims], 0), self.bases)
        if self.dense:
            return code if ok else np.where(valid, code, -1)
        n = len(self.codes)
        pos = np.minimum(np.searchsorted(self.codes, code), n - 1)
        hit = self.codes[pos] == code
        if not ok:
            hit &= valid
        rows = pos if self.order is None else self.order[pos]
        return np.where(hit, rows, -1)


def grid_extents(shape: Shape, chunks: Shape) -> list[list[int]]:
    """Chunk extents along each dim of a tensor of ``shape`` cut into ``chunks``.

    >>> grid_extents((5, 4), (2, 4))
    [[2, 2, 1], [4]]
    """
    out = []
    for n, c in zip(shape, chunks):
        full, rest = divmod(n, c)
        out.append([c] * full + ([rest] if rest else []))
    return out


def grid_type(shape: Shape, chunks: Shape, dtype, *, where: str = "grid_type") -> RelationType:
    """The type of a tensor of ``shape`` cut into chunks of ``chunks`` (one key dim
    per array dim, smaller edge chunks).

    Linear in the number of chunks at any rank: only the chunk shapes that occur are
    made (a dim whose last chunk is smaller doubles them, but it also has two chunks
    at least, so there are never more shapes than chunks).

    >>> grid_type((1,) * 40, (1,) * 40, "float64").ntuples
    1
    """
    if any(n <= 0 for n in shape):
        raise ValueError(f"{where}: shape {shape} has an empty dim; every extent must be >= 1")
    extents = grid_extents(shape, chunks)
    nblocks = tuple(len(e) for e in extents)
    check_size(where, math.prod(nblocks), len(shape), what=f"a tensor of shape {tuple(shape)} in chunks of "
               f"{tuple(chunks)} ({' x '.join(map(str, nblocks))} chunks)")
    keys = np.indices(nblocks).reshape(len(shape), -1).T.astype(np.int64) if shape else np.zeros((1, 0), np.int64)
    # shape id: a mixed-radix number over "is this the smaller edge chunk" of the ragged
    # dims only (those with a smaller last chunk); each has >= 2 chunks, so the ids in use
    # number at most the chunks, and fit in int64 (2**62 chunks are far over the size limit)
    ragged = [d for d, e in enumerate(extents) if e[-1] != e[0]]
    ids = np.zeros(len(keys), dtype=np.int64)
    for d in ragged:
        ids = ids * 2 + (keys[:, d] == nblocks[d] - 1)
    used, ids = unique_inverse(ids)  # only the codes that occur (never 2**rank of them)
    table = np.tile(np.array([e[0] for e in extents], dtype=np.int64), (len(used), 1))
    for i, d in enumerate(reversed(ragged)):
        table[:, d] = np.where((used >> i) & 1, extents[d][-1], extents[d][0])
    return RelationType(keys, ids, [tuple(r) for r in table.tolist()], dtype)


# Planning keeps every relation's keys as an int64 array in memory (several copies
# while a type is derived): past this many key entries (tuples x key arity) a relation
# is refused with a ValueError rather than a MemoryError deep inside numpy.
MAX_KEY_ENTRIES = 2**27  # 1 GiB of keys: 6.7e7 tuples of arity 2, 4.5e7 of arity 3


def max_tuples(arity: int) -> int:
    """How many tuples a relation of key ``arity`` may hold (:data:`MAX_KEY_ENTRIES`)."""
    return MAX_KEY_ENTRIES // max(int(arity), 1)


def check_size(where: str, ntuples: int, arity: int, *, what: str = "") -> None:
    """A ValueError naming ``where`` when a relation of ``ntuples`` tuples of key
    ``arity`` would be more than planning can hold (:func:`max_tuples`).

    >>> check_size("from_function f", 10**9, 2)
    Traceback (most recent call last):
    ...
    ValueError: from_function f: 1,000,000,000 tuples of key arity 2; a relation may hold at most 67,108,864 tuples of that arity (its keys are planned in memory); use bigger chunks
    """
    limit = max_tuples(arity)
    if ntuples > limit:
        raise ValueError(
            f"{where}: {f'{what}: ' if what else ''}{int(ntuples):,} tuples of key arity {arity}; a relation may "
            f"hold at most {limit:,} tuples of that arity (its keys are planned in memory); use bigger chunks"
        )


def keys_from_list(keys: Iterable[Key], arity: int) -> np.ndarray:
    rows = list(keys)
    if not rows:
        return np.zeros((0, arity), dtype=np.int64)
    return np.array(rows, dtype=np.int64).reshape(len(rows), arity)
