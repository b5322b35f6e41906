"""Source relations: where tensors enter the algebra.

A source knows its type from metadata alone (shape, chunks, dtype); its chunks are
produced by :meth:`Source.load` only when data is needed, by the evaluator here and
by the workers later.  Sources are checked for the paper's integrity constraints
(uniqueness and continuity, §3.2) when they are made.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..kernels import is_device
from ..types import Key, RelationType, Shape, check_extents, grid_type, normalize_chunks, normalize_key
from .nodes import Relation, _fmt_keys

__all__ = ["Source", "FromNumpy", "FromChunks", "FromFunction", "ClusterSource", "Pieces"]


class Source(Relation):
    """A leaf relation."""

    name: str

    @property
    def label(self) -> str:
        return self.name

    @abstractmethod
    def load(self, key: Key) -> Any:
        """The chunk under ``key`` (makes or reads data)."""

    @property
    def device(self) -> bool:
        """Whether its chunks are GPU (cupy) arrays (a plan over them computes on the
        device; a ``from_function`` source is taken to make host chunks)."""
        return False

    def __repr__(self) -> str:
        return self.name


def _check_dtype(where: str, dtype) -> np.dtype:
    """Chunks hold numbers: bool, int, unsigned, float or complex (kernels do arithmetic)."""
    try:
        dtype = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{where}: {dtype!r} is not a dtype ({e})") from None
    if dtype.kind not in "biufc":
        raise TypeError(f"{where}: dtype {dtype} is not supported; chunks are bool, integer, float or complex arrays")
    return dtype


def _slices(key: Key, chunks: Shape, shape: Shape) -> tuple[slice, ...]:
    return tuple(slice(k * c, min((k + 1) * c, n)) for k, c, n in zip(key, chunks, shape))


@dataclass(frozen=True, eq=False, repr=False)
class FromNumpy(Source):
    """A numpy (or cupy) array cut into chunks of ``chunks``."""

    array: Any
    chunks: Shape
    name: str

    def _params(self):
        return (id(self.array), self.array.shape, str(self.array.dtype), self.chunks)

    def _infer_type(self) -> RelationType:
        return grid_type(self.array.shape, self.chunks, self.array.dtype, where=f"from_numpy {self.name}")

    def load(self, key: Key):
        return self.array[_slices(key, self.chunks, self.array.shape)]

    @property
    def device(self) -> bool:
        return is_device(self.array)


@dataclass(frozen=True, eq=False, repr=False)
class FromFunction(Source):
    """Chunks made by ``fn(key) -> chunk`` on demand; the type comes from ``shape``,
    ``chunks`` and ``dtype`` alone, so planning never calls ``fn``."""

    fn: Callable[[Key], Any]
    shape: Shape
    chunks: Shape
    dtype_: np.dtype
    name: str

    def _params(self):
        return (self.fn, self.shape, self.chunks, self.dtype_.str)

    def _infer_type(self) -> RelationType:
        return grid_type(self.shape, self.chunks, self.dtype_, where=f"from_function {self.name}")

    def load(self, key: Key):
        chunk = self.fn(key)
        want = self.type.chunk_type(key)
        shape = tuple(getattr(chunk, "shape", ()))
        dtype = getattr(chunk, "dtype", None)
        if shape != want.shape or dtype != want.dtype:
            raise ValueError(
                f"from_function {self.name}: fn({key}) returned a chunk of shape {shape} and "
                f"dtype {dtype}; expected shape {want.shape} and dtype {want.dtype}"
            )
        return chunk


@dataclass(frozen=True, eq=False, repr=False)
class FromChunks(Source):
    """A relation given as ``{key: chunk}``."""

    items: tuple  # ((key, chunk), ...) sorted by key
    name: str

    def _params(self):
        return tuple((k, id(a)) for k, a in self.items)

    @property
    def device(self) -> bool:
        return any(is_device(a) for _, a in self.items)

    def _infer_type(self) -> RelationType:
        where = f"from_chunks {self.name}"
        if not self.items:
            raise ValueError(f"{where}: no chunks given; a relation needs at least one (key, chunk)")
        arities = {len(k) for k, _ in self.items}
        if len(arities) > 1:
            raise ValueError(f"{where}: keys of different arities {sorted(arities)}; all keys need one arity")
        ranks = {getattr(a, "ndim", None) for _, a in self.items}
        if len(ranks) > 1:
            by = {getattr(a, "ndim", None): k for k, a in self.items}
            raise ValueError(
                f"{where}: chunks of different ranks: "
                + ", ".join(f"{by[r]} has rank {r}" for r in sorted(by, key=str))
                + "; every chunk of a relation has one rank"
            )
        dtypes = {np.dtype(a.dtype) for _, a in self.items}
        if len(dtypes) > 1:
            by = {np.dtype(a.dtype): k for k, a in self.items}
            raise ValueError(
                f"{where}: chunks of different dtypes: "
                + ", ".join(f"{by[d]} is {d}" for d in sorted(by, key=str))
                + "; every chunk of a relation has one dtype (cast them first)"
            )
        keys = np.array([k for k, _ in self.items], dtype=np.int64).reshape(len(self.items), -1)
        shape_rows = np.array([a.shape for _, a in self.items], dtype=np.int64).reshape(len(self.items), -1)
        table, ids = np.unique(shape_rows, axis=0, return_inverse=True)
        t = RelationType(keys, ids.reshape(-1), [tuple(r) for r in table.tolist()], dtypes.pop())
        if not t.is_continuous:
            raise ValueError(
                f"{where}: the keys have holes below the frontier {t.frontier}: missing "
                f"{_fmt_keys(t.holes())}; a source relation must be continuous (paper §3.2)"
            )
        if len(table) > 1:
            _check_grid(where, keys, shape_rows)
        return t

    def load(self, key: Key):
        lookup = self.__dict__.get("_lookup")
        if lookup is None:
            lookup = dict(self.items)
            object.__setattr__(self, "_lookup", lookup)
        return lookup[key]


@dataclass(frozen=True, eq=False, repr=False)
class ClusterSource(Source):
    """Chunks that already live on a cluster under Dask keys (a persisted dask
    array's blocks, the futures of an earlier submission).  Its placement is fixed:
    where the data is.  The logical layer only holds the keys; ``fetch`` (given by the
    runtime) brings a chunk here for the reference evaluator, and ``keeper`` keeps the
    cluster data alive while this relation exists."""

    dask_keys: tuple  # ((TRA key, dask key), ...) sorted by TRA key
    rtype: RelationType
    name: str
    fetch: Callable[[Any], Any]
    keeper: Any = None
    on_device: bool = False  # its chunks are cupy arrays (a dask array's meta, a device plan's result)

    @property
    def device(self) -> bool:
        return self.on_device

    def _params(self):
        return (self.dask_keys,)

    def _infer_type(self) -> RelationType:
        if self.rtype.key_list() != [k for k, _ in self.dask_keys]:
            raise ValueError(f"cluster source {self.name}: its keys do not match its type")
        return self.rtype

    def load(self, key: Key):
        lookup = self.__dict__.get("_lookup")
        if lookup is None:
            lookup = dict(self.dask_keys)
            object.__setattr__(self, "_lookup", lookup)
        return self.fetch(lookup[key])


def piece_table(extent: int, block, src, out_block: int, step: int | None = 1) -> np.ndarray:
    """The pieces of a re-cut, one row ``(j, q, i, start, count, o)`` each.  Output
    element ``o`` of an axis cut in blocks of ``out_block`` is input element ``src[o]``
    of an axis of ``extent`` cut in blocks of ``block`` (an int, or each block's
    extent: dask's chunks along the axis, empty blocks included — no piece comes from
    one).  A piece is a run of output
    elements in one output block ``j`` taken from one input block ``i`` — with
    ``step``, a run whose input elements go up by ``step`` (``count`` of them from
    ``start`` in block ``i``); with ``step=None``, any run (its positions
    ``src[o:o+count] - i*block``).  ``q`` numbers block ``j``'s pieces in output order.

    >>> piece_table(10, 4, np.arange(3, 9), 4).tolist()  # x[3:9] of blocks of 4, cut in blocks of 4
    [[0, 0, 0, 3, 1, 0], [0, 1, 1, 0, 3, 1], [1, 0, 1, 3, 1, 4], [1, 1, 2, 0, 1, 5]]
    >>> piece_table(10, 4, np.arange(9, -1, -1), 4, -1).tolist()[:2]  # x[::-1]: x[9], x[8]; then x[7], x[6]
    [[0, 0, 2, 1, 2, 0], [0, 1, 1, 3, 2, 2]]
    """
    if isinstance(src, Progression):
        return _progression_table(extent, block, src, out_block, step)
    src = np.asarray(src, dtype=np.int64).reshape(-1)
    length = len(src)
    sizes = np.atleast_1d(np.asarray(block, dtype=np.int64))
    if step == 0 or (sizes < 0).any() or not sizes.any() or out_block <= 0 or length == 0 \
            or (sizes.size > 1 and sizes.sum() != extent):
        raise ValueError(f"piece_table: step {step}, block {block}, out_block {out_block}, length {length}")
    if src.min() < 0 or src.max() >= extent:
        raise ValueError(f"piece_table: elements {src.min()}..{src.max()} outside an extent of {extent}")
    if sizes.size == 1:  # the input block of each output element, and where it starts
        i = src // int(sizes[0])
        first = i * int(sizes[0])
    else:
        starts = np.r_[0, np.cumsum(sizes)[:-1]]
        i = np.searchsorted(starts, src, side="right") - 1  # (the last of equal starts: not an empty block)
        first = starts[i]
    j = np.arange(length, dtype=np.int64) // out_block
    brk = (i[1:] != i[:-1]) | (j[1:] != j[:-1])
    if step is not None:
        brk |= src[1:] != src[:-1] + step
    starts = np.flatnonzero(np.r_[True, brk])
    counts = np.diff(np.r_[starts, length])
    pj, pi = j[starts], i[starts]
    jstart = np.flatnonzero(np.r_[True, pj[1:] != pj[:-1]])
    pq = np.arange(len(starts)) - np.repeat(jstart, np.diff(np.r_[jstart, len(starts)]))
    return np.stack([pj, pq, pi, src[starts] - first[starts], counts, starts], axis=1)


@dataclass(frozen=True)
class Progression:
    """The input elements ``first + o*step`` for ``o < length`` of a re-cut, held as
    the three numbers (a slice or a reshape's re-cut of an axis of 5·10⁸ elements held
    them as an array of that length)."""

    first: int
    step: int
    length: int

    def __array__(self, dtype=None, copy=None):
        return (self.first + self.step * np.arange(self.length, dtype=np.int64)).astype(dtype or np.int64)


def _progression_table(extent: int, block, src: Progression, out_block: int, step) -> np.ndarray:
    """:func:`piece_table` of ``src``'s elements, from the block boundaries alone: a
    piece starts at each output block's first element and where the elements enter
    another input block (as many rows as pieces, not as elements)."""
    first, stride, length = int(src.first), int(src.step), int(src.length)
    sizes = np.atleast_1d(np.asarray(block, dtype=np.int64))
    last = first + stride * (length - 1)
    if stride == 0 or step != stride or (sizes < 0).any() or not sizes.any() or out_block <= 0 or length <= 0 \
            or (sizes.size > 1 and sizes.sum() != extent) or min(first, last) < 0 or max(first, last) >= extent:
        raise ValueError(f"piece_table: {src}, step {step}, block {block}, out_block {out_block}, extent {extent}")
    starts_in = (np.arange(0, extent, int(sizes[0]), dtype=np.int64) if sizes.size == 1
                 else np.r_[0, np.cumsum(sizes)[:-1]].astype(np.int64))
    lo, hi = min(first, last), max(first, last)
    b = np.unique(starts_in[(starts_in > lo) & (starts_in <= hi)])
    if stride > 0:  # the first output element at or past each boundary
        enter = -((first - b) // stride)
    else:  # the first output element below each boundary
        enter = (first - b) // (-stride) + 1
    brk = np.unique(np.r_[np.arange(0, length, out_block, dtype=np.int64), enter[(enter > 0) & (enter < length)]])
    at = first + stride * brk
    i = np.searchsorted(starts_in, at, side="right") - 1  # (the last of equal starts: not an empty block)
    counts = np.diff(np.r_[brk, length])
    pj = brk // out_block
    jstart = np.flatnonzero(np.r_[True, pj[1:] != pj[:-1]])
    pq = np.arange(len(brk)) - np.repeat(jstart, np.diff(np.r_[jstart, len(brk)]))
    return np.stack([pj, pq, i, at - starts_in[i], counts, brk], axis=1)


@dataclass(frozen=True, eq=False, repr=False)
class Pieces(Source):
    """The geometry of a re-cut of one axis (:func:`piece_table`), as a relation: the
    ``q``-th piece of output block ``j`` is taken from input block ``i``; the key is
    ``(i, j, q)`` (the input block first, to join on; not continuous — a block is in
    few pieces — as a filter leaves).  With a ``step`` the chunk is an empty int8 array
    of shape ``(start, count, 0)``: metadata, no bytes, read from the shape, so every
    type stays a function of shapes.  Without, it is the piece's ``count`` positions
    in its input block (int64): data, and costed as data.  ``src`` (read-only): the
    input element of each output element."""

    extent: int
    block: Any  # an int, or a tuple of each block's extent
    src: Any
    out_block: int
    step: int | None
    name: str

    def _params(self):
        digest = self.__dict__.get("_digest")
        if digest is None:
            data = (repr(self.src).encode() if isinstance(self.src, Progression)
                    else np.ascontiguousarray(self.src).tobytes())
            digest = hashlib.blake2b(data, digest_size=16).hexdigest()
            object.__setattr__(self, "_digest", digest)
        return (self.extent, self.block, digest, self.out_block, self.step)

    @property
    def table(self) -> np.ndarray:
        t = self.__dict__.get("_table")
        if t is None:
            t = piece_table(self.extent, self.block, self.src, self.out_block, self.step)
            object.__setattr__(self, "_table", t)
        return t

    def _infer_type(self) -> RelationType:
        t = self.table
        if self.step is None:
            rows, dtype = t[:, 4:5], np.int64
        else:
            rows, dtype = np.c_[t[:, 3:5], np.zeros(len(t), np.int64)], np.int8
        shapes, ids = np.unique(rows, axis=0, return_inverse=True)
        return RelationType(t[:, [2, 0, 1]], ids.reshape(-1), [tuple(r) for r in shapes.tolist()], dtype)

    def load(self, key: Key):
        if self.step is not None:
            return np.empty(self.type.chunk_type(key).shape, dtype=np.int8)
        rows = self.__dict__.get("_rows")
        if rows is None:  # (j, q) -> (start, count, o), made once
            rows = {(j, q): (start, count, o) for j, q, _, start, count, o in self.table.tolist()}
            object.__setattr__(self, "_rows", rows)
        start, count, o = rows[tuple(key[1:])]
        return self.src[o:o + count] - (self.src[o] - start)


def _check_grid(where: str, keys: np.ndarray, shapes: np.ndarray) -> None:
    """Chunks of different shapes are allowed only as the smaller edge chunks of one
    tensor's grid: key dim d indexes array dim d, the extent along d depends on the
    key's d-th value alone, and only the last value may have a smaller extent."""
    ref_key, ref_shape = tuple(keys[0].tolist()), tuple(shapes[0].tolist())
    arity, rank = keys.shape[1], shapes.shape[1]
    if arity > rank:
        bad = int(np.flatnonzero(np.any(shapes != shapes[0], axis=1))[0])
        raise ValueError(
            f"{where}: chunk {tuple(keys[bad].tolist())} has shape {tuple(shapes[bad].tolist())} "
            f"but chunk {ref_key} has {ref_shape}; chunks must share one shape"
        )
    for d in range(rank):
        if d >= arity:
            bad_rows = np.flatnonzero(shapes[:, d] != shapes[0, d])
            col_ok = len(bad_rows) == 0
        else:
            last = keys[:, d] == keys[:, d].max()
            full = shapes[~last, d]
            extent = full[0] if len(full) else shapes[0, d]
            per_value_ok = all(len(np.unique(shapes[keys[:, d] == v, d])) == 1 for v in np.unique(keys[:, d]))
            col_ok = per_value_ok and np.all(full == extent) and np.all(shapes[last, d] <= extent)
            if per_value_ok:
                bad_rows = np.flatnonzero(np.where(last, shapes[:, d] > extent, shapes[:, d] != extent))
            else:  # rows whose extent differs from another row with the same key value
                bad_rows = np.array([
                    i for i in range(len(keys))
                    if np.any(shapes[keys[:, d] == keys[i, d], d] != shapes[i, d])
                ])
        if not col_ok:
            b = int(bad_rows[0]) if len(bad_rows) else 0
            raise ValueError(
                f"{where}: chunk {tuple(keys[b].tolist())} has shape {tuple(shapes[b].tolist())} "
                f"but chunk {ref_key} has {ref_shape}; chunks must share one shape, except "
                f"smaller edge chunks at the last key value of a grid dim"
            )


def refuse_masked(where: str, kind: str):
    raise TypeError(f"{where}: {kind} masked arrays are not supported (tra_dask's kernels compute on the "
                    f"data and would drop the mask); pass x.filled(value), or numpy.ma.getdata(x) for the "
                    f"data alone")


def native_dtype(dtype):
    """``dtype`` in the machine's byte order where it is a numeric dtype in the other
    one; else None (nothing to convert)."""
    dtype = np.dtype(dtype)
    return dtype.newbyteorder("=") if dtype.kind in "biufc" and not dtype.isnative else None


def host_array(x, where: str):
    """``x`` as the kernels compute on it: an ndarray (an ``np.matrix`` is viewed as
    one: its reductions would keep two axes and its ``*`` is a product) in the
    machine's byte order (data read as ``'>f8'`` is converted once, here: numpy's
    results are native, and a chunk's dtype must be its relation's); a masked array
    is refused, saying ``where``.

    >>> host_array(np.arange(3, dtype=">i4"), "x").dtype.isnative
    True
    """
    if isinstance(x, np.ma.MaskedArray):
        refuse_masked(where, "numpy")
    if isinstance(x, np.matrix):
        x = np.asarray(x)
    native = native_dtype(x.dtype) if hasattr(x, "dtype") else None
    return x if native is None else np.asarray(x).astype(native)


def from_numpy(array, chunks, name: str | None = None) -> FromNumpy:
    """A tensor relation from an array cut into ``chunks`` (one key dim per array
    dim; edge chunks smaller where the extent is not a multiple).

    >>> r = from_numpy(np.arange(20.0).reshape(4, 5), (2, 2))
    >>> r.frontier, r.chunk_shape((1, 2))
    ((2, 3), (2, 1))
    """
    if not hasattr(array, "shape") or not hasattr(array, "dtype"):
        try:
            array = np.asarray(array)
        except (TypeError, ValueError) as e:  # a ragged list, ...
            raise ValueError(f"from_numpy {name or ''}: {type(array).__name__} is not an array ({e})") from None
    where = f"from_numpy {name}" if name else f"from_numpy(array of shape {tuple(array.shape)} {array.dtype})"
    array = host_array(array, where)
    shape = check_extents(array.shape, where)
    _check_dtype(where, array.dtype)
    chunks = normalize_chunks(chunks, shape, where=where)
    name = name or f"array[{'x'.join(map(str, shape))} {array.dtype}]"
    return FromNumpy(array, chunks, name)


def from_function(fn: Callable[[Key], Any], shape, chunks, dtype, name: str | None = None) -> FromFunction:
    """A tensor relation whose chunk under key ``k`` is ``fn(k)``, made only when data
    is needed (never by type inference or planning).

    >>> r = from_function(lambda k: np.full((2, 2), float(sum(k))), (4, 4), 2, "float64")
    >>> r.ntuples, r.nbytes
    (4, 128)
    """
    if not callable(fn):
        raise TypeError(f"from_function: fn must be callable key -> chunk, got {fn!r}")
    where = f"from_function {name or getattr(fn, '__name__', '')}".rstrip()
    shape = check_extents(shape, where)
    chunks = normalize_chunks(chunks, shape, where=where)
    dtype = _check_dtype(where, dtype)
    name = name or f"{getattr(fn, '__name__', 'fn')}[{'x'.join(map(str, shape))} {dtype}]"
    return FromFunction(fn, shape, chunks, dtype, name)


def from_chunks(chunks: dict, name: str | None = None) -> FromChunks:
    """A tensor relation from ``{key_tuple: chunk}``.  Keys must be unique tuples of
    non-negative ints with no holes; chunks share rank and dtype, and one shape but
    for smaller edge chunks of a grid."""
    if not isinstance(chunks, dict):
        raise TypeError(f"from_chunks: expected a dict {{key tuple: array}}, got {type(chunks).__name__}")
    where = f"from_chunks {name}" if name else f"from_chunks({len(chunks)} chunks)"
    items: dict[Key, Any] = {}
    for k, a in chunks.items():
        key = normalize_key(k, where=where)
        if key in items:
            raise ValueError(f"{where}: key {k!r} appears twice (as {key}); keys must be unique")
        if not hasattr(a, "shape") or not hasattr(a, "dtype"):
            try:
                a = np.asarray(a)
            except (TypeError, ValueError) as e:  # a ragged list, ...
                raise ValueError(f"{where}: chunk {key} is not an array ({e})") from None
        _check_dtype(f"{where}: chunk {key}", a.dtype)
        if any(int(n) <= 0 for n in a.shape):
            raise ValueError(f"{where}: chunk {key} has shape {tuple(a.shape)}, with an empty dim; every "
                             f"extent must be >= 1")
        items[key] = a
    name = name or f"chunks[{len(items)}]"
    return FromChunks(tuple(sorted(items.items(), key=lambda kv: kv[0])), name)

