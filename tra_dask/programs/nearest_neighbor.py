"""Nearest neighbour in a Riemannian metric (paper §6.2) in the TRA."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..keys import k1
from ..logical import Relation, aggregate, from_function, join, rekey, transform
from ..logical.nodes import as_relation
from .linalg import _need_matrix


@dataclass(frozen=True)
class RowIndex:
    """Chunk loader for the global row indices ``[k0*chunk, ...)`` of an ``n``-row
    tensor (a picklable value, so equal loaders are one source)."""

    n: int
    chunk: int
    dtype: str

    def __call__(self, key):
        start = key[0] * self.chunk
        return np.arange(start, min(start + self.chunk, self.n), dtype=self.dtype)


def nearest_neighbor(x_q: Relation, X: Relation, A: Relation) -> Relation:
    """``argmin_i (x_i - x_q) A (x_i - x_q)^T`` as the paper's TRA program (§6.2).

    ``X`` is N×D (keys ``(i, j)``), ``A`` is D×D, and ``x_q`` is the query, either a
    vector (keys ``(j,)``) or a 1×D matrix (keys ``(0, j)``), chunked like X's
    columns.  Returns a relation with the single key ``()`` holding
    ``[min distance, row index]``.  (Indices are carried in X's dtype: exact below
    2**24 rows for float32, 2**53 for float64.)
    """
    where = "nearest_neighbor"
    X = _need_matrix(where, "X", X)
    A = _need_matrix(where, "A", A)
    x_q = as_relation(x_q, where, "x_q")
    if x_q.key_arity == 2:
        if x_q.frontier[0] != 1:
            raise ValueError(f"{where}: x_q = {x_q.label} must be one row (key dim 0 frontier 1), got frontier {x_q.frontier}")
        x_q = rekey(x_q, (k1,))
    if x_q.key_arity != 1:
        raise ValueError(f"{where}: x_q = {x_q.label} must have key arity 1 (a vector) or 2 (a 1xD matrix)")
    diff = join(X, x_q, (1,), (0,), "sub")
    proj = aggregate(join(diff, A, (1,), (0,), "matmul"), (0, 2), "add")
    # The paper writes λ(rowSum)(Σ(⟨0⟩, add)(...)); summing rows first is equal (row_sum
    # distributes over add, R1-4) and also works when D's column blocks differ in width,
    # where the paper's order would add chunks of different shapes.
    dist = aggregate(transform(join(proj, diff, (0, 1), (0, 1), "mul"), "row_sum"), (0,), "add")
    rows = [X.chunk_shape((i, 0))[0] for i in range(X.frontier[0])]
    if len(set(rows[:-1])) > 1 or rows[-1] > rows[0]:
        raise ValueError(f"{where}: X = {X.label} must have a regular row chunking, got row extents {rows}")
    index = from_function(
        RowIndex(sum(rows), rows[0], X.dtype.str), (sum(rows),), (rows[0],), X.dtype, name="row_index"
    )
    return aggregate(join(dist, index, (0,), (0,), "argmin_with_index"), (), "min_pair")
