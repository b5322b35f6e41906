"""Matrix multiply, nearest neighbour (§6.2) and the FFNN forward pass (§6.3) in
the TRA, checked against numpy on random shapes, including extents that are not a
multiple of the chunk shape."""

import numpy as np
import pytest

import tra_dask as td
from tra_dask.programs import ffnn_forward, matmul, nearest_neighbor, random_uniform

SHAPES = [
    # (I, K, J), chunks of A, chunks of B
    ((4, 4, 4), (2, 2), (2, 2)),
    ((7, 5, 3), (3, 2), (2, 2)),     # nothing divides
    ((10, 9, 11), (4, 9), (9, 5)),  # one K block
    ((1, 13, 6), (1, 4), (4, 6)),
    ((12, 8, 5), (5, 3), (3, 5)),
]


@pytest.mark.parametrize("dims,ca,cb", SHAPES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_matmul_equals_numpy(dims, ca, cb, dtype):
    I, K, J = dims
    rng = np.random.default_rng(sum(dims))
    a, b = rng.normal(size=(I, K)).astype(dtype), rng.normal(size=(K, J)).astype(dtype)
    C = matmul(td.from_numpy(a, ca), td.from_numpy(b, cb))
    assert C.dtype == np.dtype(dtype)
    got = td.to_numpy(C)
    assert got.shape == (I, J) and got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5)


def test_matmul_from_function_sources_matches_numpy():
    A = random_uniform((9, 7), (4, 3), seed=3, name="A")
    B = random_uniform((7, 5), (3, 2), seed=4, name="B")
    a, b = td.to_numpy(A), td.to_numpy(B)
    assert a.min() >= -1 and a.max() <= 1
    np.testing.assert_allclose(td.to_numpy(matmul(A, B)), a @ b)


@pytest.mark.parametrize("N,D,cn,cd", [(10, 6, 3, 4), (40, 9, 7, 9), (5, 5, 5, 2), (23, 8, 4, 3)])
def test_nearest_neighbor_equals_numpy(N, D, cn, cd):
    rng = np.random.default_rng(N * D)
    X = rng.normal(size=(N, D))
    M = rng.normal(size=(D, D))
    A = M @ M.T + D * np.eye(D)  # a metric: symmetric positive definite
    xq = rng.normal(size=D)
    d = np.einsum("nd,de,ne->n", X - xq, A, X - xq)
    R = nearest_neighbor(td.from_numpy(xq, (cd,)), td.from_numpy(X, (cn, cd)), td.from_numpy(A, (cd, cd)))
    assert R.keys == [()]
    (value, index), = td.evaluate(R).values()
    assert int(index) == int(np.argmin(d))
    np.testing.assert_allclose(value, d.min())


def test_nearest_neighbor_takes_a_1xD_query_and_breaks_ties_by_index():
    X = np.array([[1.0, 0], [0, 1], [1, 0], [3, 3]])
    R = nearest_neighbor(td.from_numpy(np.array([[1.0, 0]]), (1, 1)), td.from_numpy(X, (1, 1)),
                         td.from_numpy(np.eye(2), 1))
    value, index = td.evaluate(R)[()]
    assert (value, index) == (0.0, 0.0)  # rows 0 and 2 tie; the smaller index wins


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("N,D,H,L,cn,cd,ch,cl", [
    (8, 6, 10, 3, 4, 3, 5, 3),
    (9, 7, 5, 4, 4, 3, 2, 3),   # nothing divides
    (6, 12, 8, 10, 6, 12, 8, 10),  # one chunk each
])
def test_ffnn_forward_equals_numpy(N, D, H, L, cn, cd, ch, cl):
    rng = np.random.default_rng(N + D + H + L)
    x, w1, w2 = rng.normal(size=(N, D)), rng.normal(size=(D, H)), rng.normal(size=(H, L))
    X, W1, W2 = td.from_numpy(x, (cn, cd)), td.from_numpy(w1, (cd, ch)), td.from_numpy(w2, (ch, cl))
    want_logits = np.maximum(x @ w1, 0) @ w2
    np.testing.assert_allclose(td.to_numpy(ffnn_forward(X, W1, W2, softmax=False)), want_logits, atol=1e-12)
    P = td.to_numpy(ffnn_forward(X, W1, W2))
    np.testing.assert_allclose(P, _softmax(want_logits), rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)


def test_programs_reject_non_matrices(RB):
    with pytest.raises(ValueError, match="R_B.*key arity 1"):
        matmul(RB, RB)
