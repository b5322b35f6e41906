"""Matrix building blocks in the TRA."""

from __future__ import annotations

from ..logical import Relation, aggregate, join, transform
from ..logical.nodes import as_relation


def _need_matrix(where: str, name: str, rel: Relation) -> Relation:
    rel = as_relation(rel, where, name)
    if rel.key_arity != 2 or rel.rank != 2:
        raise ValueError(
            f"{where}: {name} = {rel.label} must be a chunked matrix (key arity 2, 2-d chunks); "
            f"it has key arity {rel.key_arity} and chunk rank {rel.rank}"
        )
    return rel


def matmul(A: Relation, B: Relation) -> Relation:
    """``A @ B`` as the paper writes it (§3.1, §6.1):
    ``Σ(⟨0,2⟩, add)(⋈(⟨1⟩, ⟨0⟩, matmul)(A, B))``.

    >>> import numpy as np, tra_dask as td
    >>> a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    >>> C = matmul(td.from_numpy(a, (1, 2)), td.from_numpy(b, (2, 3)))
    >>> bool(np.allclose(td.to_numpy(C), a @ b))
    True
    """
    A = _need_matrix("matmul", "A", A)
    B = _need_matrix("matmul", "B", B)
    return aggregate(join(A, B, (1,), (0,), "matmul"), (0, 2), "add")


def softmax_rows(Z: Relation) -> Relation:
    """Row-wise softmax of a chunked matrix, stable (row max subtracted first):
    the row max and row sum are aggregations over the column-block key dim."""
    Z = _need_matrix("softmax_rows", "Z", Z)
    row_max = aggregate(transform(Z, "row_max"), (0,), "max")
    E = transform(join(Z, row_max, (0,), (0,), "sub"), "exp")
    row_sum = aggregate(transform(E, "row_sum"), (0,), "add")
    return join(E, row_sum, (0,), (0,), "div")
