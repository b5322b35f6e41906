"""Edge cases: identity of kernels, deep and shared expressions, empty relations,
key arity 0, dtype rules of the built-in kernels."""


import numpy as np
import pytest

import tra_dask as td
from tra_dask.keys import k0, k1


@pytest.fixture
def A():
    return td.from_numpy(np.arange(16.0).reshape(4, 4), 2, name="A")


def test_kernels_sharing_a_name_are_not_confused(A):
    f1 = td.kernel(lambda x: x + 1, name="f", shape="same", register_as=False)
    f2 = td.kernel(lambda x: x * 10, name="f", shape="same", register_as=False)
    t1, t2 = td.transform(A, f1), td.transform(A, f2)
    assert t1 != t2
    r1, r2 = td.evaluate((t1, t2))
    np.testing.assert_array_equal(r1[(0, 0)], np.array([[1.0, 2], [5, 6]]))
    np.testing.assert_array_equal(r2[(0, 0)], np.array([[0.0, 10], [40, 50]]))


def test_deep_chain_builds_and_evaluates(A):
    x = A
    for _ in range(1500):
        x = td.transform(x, "identity")
    assert x.type == A.type and x == x
    np.testing.assert_array_equal(td.to_numpy(x), td.to_numpy(A))


def test_shared_dag_is_linear_not_exponential(A):
    def build(depth):
        x = A
        for _ in range(depth):
            x = td.join(x, x, (0, 1), (0, 1), "add")
        return x

    x, y = build(40), build(40)  # 2^40 paths: anything exponential never finishes
    assert x == y and hash(x) == hash(y)
    np.testing.assert_array_equal(td.to_numpy(x), 2.0**40 * td.to_numpy(A))


def test_empty_relation_keeps_rank_and_dtype(A):
    E = td.filter(A, k0 > 10)
    assert E.ntuples == 0 and E.rank == 2 and E.dtype == np.float64
    assert td.tile(E, 0, 1).ntuples == 0
    ints = td.from_numpy(np.arange(4).reshape(2, 2), 1)
    assert td.transform(td.filter(ints, k0 > 5), "exp").dtype == np.float64


def test_key_arity_zero(A):
    S = td.aggregate(A, (), "add")
    assert S.chunk_shape(()) == (2, 2) and () in S.type and S.type.holes() == []
    scalar = td.from_function(lambda k: np.ones(()), (), (), "float64", name="scalar")
    assert scalar.keys == [()] and float(td.evaluate(scalar)[()]) == 1.0


@pytest.mark.parametrize("dtype", ["int8", "int32", "bool"])
def test_row_sum_dtype_follows_numpy(dtype):
    R = td.from_numpy(np.ones((4, 4), dtype=dtype), 2)
    T = td.transform(R, "row_sum")
    assert T.dtype == np.ones((1, 1), dtype=dtype).sum(axis=1).dtype
    td.evaluate(T)  # the evaluator checks every chunk against the declared dtype


def test_scale_and_relu_grad_dtypes():
    ints = td.from_numpy(np.arange(4), 2)
    assert td.transform(ints, td.kernels.scale(0.5)).dtype == np.float64
    td.evaluate(td.transform(ints, td.kernels.scale(0.5)))
    g = td.from_numpy(np.ones((2, 2), dtype="float32"), 2)
    z = td.from_numpy(np.ones((2, 2)), 2)
    J = td.join(g, z, (0, 1), (0, 1), "relu_grad")
    assert J.dtype == np.float32
    td.evaluate(J)


def test_neg_of_bool_is_rejected_when_built():
    with pytest.raises(ValueError, match="cannot negate boolean chunks"):
        td.transform(td.from_numpy(np.ones(2, dtype=bool), 1), "neg")


def test_key_division_by_zero(A):
    with pytest.raises(ValueError, match=r"divides by zero"):
        td.rekey(A, (k0 // k1, k1))


def test_insert_dim_arguments_are_ints():
    with pytest.raises(TypeError, match="insert_dim: pos must be an int"):
        td.keys.insert_dim(1.5, 2)
    assert td.keys.k[np.int64(1)] .i == 1
