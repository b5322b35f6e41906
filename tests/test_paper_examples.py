"""The paper's worked examples (§3.1, §5.2.2), with the paper's numbers."""

import numpy as np

import tra_dask as td
from tra_dask.keys import insert_dim, k0, k1

from helpers import assert_chunks_equal


def test_R_A_is_the_papers_relation(RA):
    out = td.evaluate(RA)
    assert_chunks_equal(out, {
        (0, 0): [[1, 2], [3, 4]], (0, 1): [[5, 6], [7, 8]],
        (1, 0): [[9, 10], [11, 12]], (1, 1): [[13, 14], [15, 16]],
    })


def test_aggregate_by_dim_1(RA):
    # Σ(⟨1⟩, matAdd)(R_A): sums the arrays vertically
    out = td.evaluate(td.aggregate(RA, (1,), "add"))
    assert_chunks_equal(out, {(0,): [[10, 12], [14, 16]], (1,): [[18, 20], [22, 24]]})


def test_aggregate_by_empty_key(RA):
    # Σ(⟨⟩, matAdd)(R_A): one array
    out = td.evaluate(td.aggregate(RA, (), "add"))
    assert_chunks_equal(out, {(): [[28, 32], [36, 40]]})


def test_join_tuple_010(RA):
    # ⋈(⟨1⟩, ⟨0⟩, matMul)(R_A, R_A) pairs (0,1) with (1,0) into key (0,1,0)
    J = td.join(RA, RA, (1,), (0,), "matmul")
    assert J.key_arity == 3 and J.ntuples == 8
    out = td.evaluate(J)
    np.testing.assert_array_equal(out[(0, 1, 0)], [[111, 122], [151, 166]])


def test_A_times_A(RA):
    # Σ(⟨0,2⟩, matAdd)(⋈(⟨1⟩, ⟨0⟩, matMul)(R_A, R_A)) = A × A
    AA = td.aggregate(td.join(RA, RA, (1,), (0,), "matmul"), (0, 2), "add")
    from helpers import PAPER_A
    np.testing.assert_array_equal(td.to_numpy(AA), PAPER_A @ PAPER_A)


def test_tile_then_rekey(RB):
    T = td.tile(RB, 1, 2)
    assert_chunks_equal(td.evaluate(T), {
        (0, 0): [[1, 2], [3, 4]], (0, 1): [[5, 6], [7, 8]],
        (1, 0): [[9, 10], [11, 12]], (1, 1): [[13, 14], [15, 16]],
    })
    # rekey ⟨k0, k1⟩ → ⟨2k0 + k1⟩: back to one 2x8 matrix in four 2x2 blocks
    R = td.rekey(T, 2 * k0 + k1)
    assert_chunks_equal(td.evaluate(R), {
        (0,): [[1, 2], [3, 4]], (1,): [[5, 6], [7, 8]],
        (2,): [[9, 10], [11, 12]], (3,): [[13, 14], [15, 16]],
    })


def test_concat_of_tile_is_identity(RB):
    back = td.concat(td.tile(RB, 1, 2), 1, 1)
    assert_chunks_equal(td.evaluate(back), td.evaluate(RB))
    assert back.type == RB.type


def test_diagonal_example(RA):
    # λ(diag)(rekey(getKey0)(σ(isEq)(R_A))): the filter leaves holes, which an
    # intermediate relation may have; the result is continuous again.
    F = td.filter(RA, k0 == k1)
    assert F.keys == [(0, 0), (1, 1)]
    assert not F.type.is_continuous  # (0,1) and (1,0) are holes below frontier (2,2)
    D = td.transform(td.rekey(F, k0), "diag")
    assert D.keys == [(0,), (1,)] and D.type.is_continuous
    assert_chunks_equal(td.evaluate(D), {(0,): [[1, 0], [0, 4]], (1,): [[13, 0], [0, 16]]})


def test_diag_of_sum_example():
    # §5.2: diag(X + Y) = λ(diag)(rekey(merge)(σ(isEq)(⋈(⟨0,1⟩,⟨0,1⟩,matAdd)(X, Y))))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
    X, Y = td.from_numpy(x, 3), td.from_numpy(y, 3)
    e = td.transform(td.rekey(td.filter(td.join(X, Y, (0, 1), (0, 1), "add"), k0 == k1), k0), "diag")
    out = td.evaluate(e)
    for i in range(2):
        blk = (x + y)[3 * i:3 * i + 3, 3 * i:3 * i + 3]
        np.testing.assert_allclose(out[(i,)], np.diag(np.diag(blk)))


def test_replication_map_insert_dim_duplicate(RA):
    # §5.2.2: map(insertDim(2, xDups), duplicate(xDups)) with xDups = 2 makes every
    # tuple two tuples, the new key dim last, the array copied.
    R = td.rekey(RA, insert_dim(2, 2))
    assert R.keys == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1),
                      (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    blocks = {(0, 0): [[1, 2], [3, 4]], (0, 1): [[5, 6], [7, 8]],
              (1, 0): [[9, 10], [11, 12]], (1, 1): [[13, 14], [15, 16]]}
    assert_chunks_equal(td.evaluate(R), {k + (d,): v for k, v in blocks.items() for d in (0, 1)})


def test_replication_based_matmul_in_tra():
    # The replication (3-D) matrix multiply of §5.2.2 written with insert_dim:
    # X* = insertDim(2, J) on X (i,k) -> (i,k,j); Y* = insertDim(0, I) on Y (k,j) -> (i,k,j)
    # then join on all three dims with matmul and aggregate by (i, j).
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(5, 7)), rng.normal(size=(7, 4))
    X, Y = td.from_numpy(x, (2, 3)), td.from_numpy(y, (3, 2))
    I, J = X.frontier[0], Y.frontier[1]
    Xs, Ys = td.rekey(X, insert_dim(2, J)), td.rekey(Y, insert_dim(0, I))
    C = td.aggregate(td.join(Xs, Ys, (0, 1, 2), (0, 1, 2), "matmul"), (0, 2), "add")
    np.testing.assert_allclose(td.to_numpy(C), x @ y)
