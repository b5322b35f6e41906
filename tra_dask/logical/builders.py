"""The TRA operators as functions (``td.join``, ``td.aggregate``, ...).

Each normalises its arguments (kernel specs, key functions, dims) and builds the
node, whose type rule validates everything against its inputs.  Key conventions are
the paper's (§3.1).

>>> import numpy as np
>>> A = from_numpy(np.arange(16.0).reshape(4, 4), (2, 2), name="A")
>>> C = aggregate(join(A, A, (1,), (0,), "matmul"), (0, 2), "add")
>>> C
aggregate(join(A, A, left_on=(1,), right_on=(0,), kernel='matmul'), group_by=(0, 2), kernel='add')
>>> C.keys
[(0, 0), (0, 1), (1, 0), (1, 1)]
"""

from __future__ import annotations

from ..kernels import as_kernel
from ..keys import as_key_fn, as_predicate
from .nodes import Aggregate, Concat, Filter, Join, Rekey, Relation, Tile, Transform, as_relation
from .sources import from_chunks, from_function, from_numpy

__all__ = [
    "aggregate", "join", "rekey", "filter", "transform", "tile", "concat",
    "from_numpy", "from_chunks", "from_function",
]


def _rel(x, where: str, role: str = "input") -> Relation:
    return as_relation(x, where, role)


def _converted(convert, value, where: str):
    """``convert(value)``; its TypeError names the call it was made for."""
    try:
        return convert(value)
    except TypeError as e:
        raise TypeError(f"{where}: {e}") from None


def _dims(dims) -> tuple:
    if isinstance(dims, int) and not isinstance(dims, bool):
        return (dims,)
    return tuple(dims) if isinstance(dims, (tuple, list)) else dims


def aggregate(rel: Relation, group_by, kernel) -> Aggregate:
    """Group ``rel`` by the key dims ``group_by`` (``()`` for one group) and fold each
    group with the binary ``kernel``; output key = ``key[group_by]``."""
    rel = _rel(rel, "aggregate")
    return Aggregate(rel, _dims(group_by), as_kernel(kernel, 2, where=f"aggregate({rel.label})"))


def join(left: Relation, right: Relation, left_on, right_on, kernel) -> Join:
    """Join tuples of ``left`` and ``right`` whose ``left_on`` dims equal the
    ``right_on`` dims, applying the binary ``kernel`` to each pair.  Output key: all
    of the left key, then the right key's dims not in ``right_on``."""
    left = _rel(left, "join", "left input")
    right = _rel(right, "join", "right input")
    where = f"join({left.label}, {right.label})"
    return Join(left, right, _dims(left_on), _dims(right_on), as_kernel(kernel, 2, where=where))


def rekey(rel: Relation, key_fn) -> Rekey:
    """Give every tuple a new key ``key_fn(key)``: a :mod:`tra_dask.keys` function
    (``2*k0 + k1``, ``project(1, 0)``, ``insert_dim(2, n)``), a tuple of key
    expressions, or a plain callable (opaque)."""
    rel = _rel(rel, "rekey")
    return Rekey(rel, _converted(as_key_fn, key_fn, f"rekey({rel.label})"))


def filter(rel: Relation, pred) -> Filter:  # noqa: A001 - the paper's name
    """Keep the tuples of ``rel`` whose key satisfies ``pred`` (``k0 == k1``, ...)."""
    rel = _rel(rel, "filter")
    return Filter(rel, _converted(as_predicate, pred, f"filter({rel.label})"))


def transform(rel: Relation, kernel) -> Transform:
    """Apply the unary ``kernel`` to every chunk of ``rel``."""
    rel = _rel(rel, "transform")
    return Transform(rel, as_kernel(kernel, 1, where=f"transform({rel.label})"))


def tile(rel: Relation, tile_dim: int, tile_size: int) -> Tile:
    """Split every chunk along array dim ``tile_dim`` into pieces of ``tile_size``;
    the tile index is appended as the last key dim."""
    return Tile(_rel(rel, "tile"), tile_dim, tile_size)


def concat(rel: Relation, key_dim: int, array_dim: int) -> Concat:
    """Inverse of :func:`tile`: concatenate along ``array_dim`` the chunks that agree
    on every key dim but ``key_dim``, in ``key_dim`` order."""
    return Concat(_rel(rel, "concat"), key_dim, array_dim)
