"""Two-layer feed-forward network (paper §6.3) in the TRA."""

from __future__ import annotations

from ..logical import Relation, transform
from .linalg import matmul, softmax_rows


def ffnn_forward(X: Relation, W1: Relation, W2: Relation, *, softmax: bool = True) -> Relation:
    """Forward pass ``softmax(relu(X @ W1) @ W2)`` (no biases, as in the paper).

    ``X`` is N×D, ``W1`` D×H, ``W2`` H×L, each a chunked matrix; the chunking of the
    contracted dims must agree (D between X and W1, H between W1 and W2).
    """
    hidden = transform(matmul(X, W1), "relu")
    logits = matmul(hidden, W2)
    return softmax_rows(logits) if softmax else logits
