"""The paper's programs written with the array front-end (:mod:`tra_dask.frontend`):
numpy code over ``td.Array``s, planned and chunked by tra_dask.  The relation-level
versions (:mod:`.linalg`, :mod:`.nearest_neighbor`, :mod:`.ffnn`) stay for people
who want the algebra; these are what a numpy user writes.

>>> import numpy as np, tra_dask as td
>>> x = np.arange(12.0).reshape(4, 3)
>>> bool(np.allclose(td.to_numpy(matmul_array(x, x.T)), x @ x.T))
True
"""

from __future__ import annotations

import numpy as np

from ..frontend import Array, from_array

__all__ = ["matmul_array", "nearest_neighbor_array", "ffnn_forward_array", "ffnn_sgd_step_array"]


def _arr(x, name: str | None = None) -> Array:
    return x if isinstance(x, Array) else from_array(x, name=name)


def matmul_array(A, B) -> Array:
    """``A @ B``."""
    return _arr(A, "A") @ _arr(B, "B")


def nearest_neighbor_array(x_q, X, A) -> Array:
    """``argmin_i (x_i - x_q) A (x_i - x_q)ᵀ`` (paper §6.2): the row index of the
    nearest row of ``X`` (N×D) to the query ``x_q`` (D,) under the metric ``A`` (D×D)."""
    diff = _arr(X, "X") - _arr(x_q, "x_q")
    return ((diff @ _arr(A, "A")) * diff).sum(axis=1).argmin()


def _softmax_rows(z: Array) -> Array:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def ffnn_forward_array(X, W1, W2, *, softmax: bool = True) -> Array:
    """``softmax(relu(X @ W1) @ W2)`` (paper §6.3, no biases)."""
    logits = np.maximum(_arr(X, "X") @ _arr(W1, "W1"), 0) @ _arr(W2, "W2")
    return _softmax_rows(logits) if softmax else logits


def ffnn_sgd_step_array(X, Y, W1, W2, lr: float):
    """One SGD step of the paper's two-layer network (§6.3): ReLU hidden layer,
    softmax output, mean cross-entropy over the batch.  Returns ``(W1_new,
    W2_new)``; compute them together (``td.compute((W1n, W2n))``) so the forward
    pass runs once."""
    X, Y, W1, W2 = (_arr(v, n) for v, n in ((X, "X"), (Y, "Y"), (W1, "W1"), (W2, "W2")))
    Z1 = X @ W1
    A1 = np.maximum(Z1, 0)
    P = _softmax_rows(A1 @ W2)
    dZ2 = (P - Y) * (1.0 / X.shape[0])
    dW2 = A1.T @ dZ2
    dZ1 = (dZ2 @ W2.T) * (Z1 > 0)
    dW1 = X.T @ dZ1
    return W1 - dW1 * float(lr), W2 - dW2 * float(lr)

