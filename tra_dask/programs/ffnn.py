"""Two-layer feed-forward network (paper §6.3) in the TRA."""

from __future__ import annotations

from ..logical import Relation, aggregate, join, transform
from .linalg import _need_matrix, matmul, softmax_rows
from ..kernels import scale


def ffnn_forward(X: Relation, W1: Relation, W2: Relation, *, softmax: bool = True) -> Relation:
    """Forward pass ``softmax(relu(X @ W1) @ W2)`` (no biases, as in the paper).

    ``X`` is N×D, ``W1`` D×H, ``W2`` H×L, each a chunked matrix; the chunking of the
    contracted dims must agree (D between X and W1, H between W1 and W2).
    """
    hidden = transform(matmul(X, W1), "relu")
    logits = matmul(hidden, W2)
    return softmax_rows(logits) if softmax else logits


def ffnn_sgd_step(X: Relation, Y: Relation, W1: Relation, W2: Relation, lr: float):
    """One SGD step of the paper's two-layer network (§6.3), in the TRA.

    ``X`` N×D inputs, ``Y`` N×L one-hot labels, ``W1`` D×H, ``W2`` H×L; ReLU hidden
    layer, softmax output, mean cross-entropy loss over the batch, no biases.
    Returns ``(W1_new, W2_new)``, both to be evaluated together (they share the
    forward pass).

    Forward: Z1 = X W1, A1 = relu(Z1), P = softmax(A1 W2).
    Backward: dZ2 = (P - Y) / N, dW2 = A1ᵀ dZ2, dA1 = dZ2 W2ᵀ,
    dZ1 = dA1 ⊙ [Z1 > 0], dW1 = Xᵀ dZ1; W ← W - lr dW.
    """
    X, Y, W1, W2 = (_need_matrix("ffnn_sgd_step", n, r) for n, r in (("X", X), ("Y", Y), ("W1", W1), ("W2", W2)))
    n_rows = sum(X.chunk_shape((i, 0))[0] for i in range(X.frontier[0]))
    Z1 = matmul(X, W1)                                   # (n, h)
    A1 = transform(Z1, "relu")
    P = softmax_rows(matmul(A1, W2))                     # (n, l)
    dZ2 = transform(join(P, Y, (0, 1), (0, 1), "sub"), scale(1.0 / n_rows))
    dW2 = aggregate(join(A1, dZ2, (0,), (0,), "matmul_tn"), (1, 2), "add")     # A1ᵀ dZ2: (h, l)
    dA1 = aggregate(join(dZ2, W2, (1,), (1,), "matmul_nt"), (0, 2), "add")     # dZ2 W2ᵀ: (n, h)
    dZ1 = join(dA1, Z1, (0, 1), (0, 1), "relu_grad")
    dW1 = aggregate(join(X, dZ1, (0,), (0,), "matmul_tn"), (1, 2), "add")      # Xᵀ dZ1: (d, h)
    W1_new = join(W1, transform(dW1, scale(lr)), (0, 1), (0, 1), "sub")
    W2_new = join(W2, transform(dW2, scale(lr)), (0, 1), (0, 1), "sub")
    return W1_new, W2_new
