"""The Array API namespace (``tra_dask.array_api``, ``x.__array_namespace__()``), numpy
as the oracle: creation functions made on the workers, elementwise functions,
reductions, manipulation and linear algebra, and code written against the standard
running unchanged."""

import numpy as np
import pytest

import tra_dask as td
import tra_dask.array_api as xp

RNG = np.random.default_rng(3)
A = RNG.standard_normal((4, 6))
Bm = RNG.standard_normal((6, 3))


def _eq(got, want):
    got, want = td.to_numpy(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_namespace_and_array_attributes():
    x = td.from_array(A)
    assert x.__array_namespace__() is xp and xp.__array_api_version__ == "2023.12"
    assert x.device == xp.__array_namespace_info__().default_device() and x.to_device(x.device) is x
    with pytest.raises(ValueError, match=r"the only device is 'tra_dask'"):
        x.to_device("cuda:0")
    with pytest.raises(ValueError, match=r"version '2099.12' is not supported"):
        x.__array_namespace__(api_version="2099.12")
    assert xp.isdtype(xp.int8, "integral") and not xp.isdtype(xp.float32, ("integral", "complex floating"))
    assert xp.result_type(x, xp.float32) == np.float64 and xp.result_type(xp.int8, 1) == np.int8
    assert xp.finfo(xp.float32).eps == np.finfo(np.float32).eps and xp.iinfo(x.astype(xp.int16)).max == 32767


def test_creation_functions():
    _eq(xp.zeros((3, 2)), np.zeros((3, 2)))
    _eq(xp.ones(4, dtype=xp.int32), np.ones(4, np.int32))
    _eq(xp.full((2, 3), 2.5), np.full((2, 3), 2.5))
    _eq(xp.full((2,), True), np.full((2,), True))
    _eq(xp.arange(10), np.arange(10))
    _eq(xp.arange(1, 2, 0.25), np.arange(1, 2, 0.25))
    _eq(xp.arange(5, 0, -2, dtype=xp.int8), np.arange(5, 0, -2, dtype=np.int8))
    _eq(xp.linspace(0, 1, 7), np.linspace(0, 1, 7))
    _eq(xp.linspace(0, 1, 4, endpoint=False), np.linspace(0, 1, 4, endpoint=False))
    _eq(xp.eye(3, 5, k=1), np.eye(3, 5, k=1))
    _eq(xp.zeros_like(td.from_array(A)), np.zeros_like(A))
    _eq(xp.full_like(td.from_array(A), 7, dtype=xp.int64), np.full_like(A, 7, dtype=np.int64))
    _eq(xp.asarray([[1, 2], [3, 4]], dtype=xp.float32), np.asarray([[1, 2], [3, 4]], dtype=np.float32))
    _eq(xp.asarray(3.5), np.asarray(3.5))
    # made on the workers: a leaf with a region function, not data from here
    assert type(xp.arange(1000)._node.data).__name__ == "_Arange"
    rel, _ = (xp.arange(40, dtype=xp.float64) * 2).to_relation(sites=4)
    np.testing.assert_array_equal(td.to_numpy(rel), np.arange(40.0) * 2)


def test_elementwise_reductions_linalg():
    x, y = td.from_array(A), td.from_array(A[::-1].copy())
    for name, ref in [("sin", np.sin), ("acos", lambda v: np.arccos(np.clip(v, -1, 1))), ("round", np.round),
                      ("bitwise_invert", None), ("trunc", np.trunc), ("logical_not", np.logical_not)]:
        if ref is None:
            _eq(xp.bitwise_invert(x.astype(xp.int32)), ~A.astype(np.int32))
        elif name == "acos":
            _eq(xp.acos(xp.clip(x, -1, 1)), ref(A))
        else:
            _eq(getattr(xp, name)(x), ref(A))
    for name, ref in [("add", np.add), ("atan2", np.arctan2), ("pow", lambda a, b: np.abs(a) ** b),
                      ("less_equal", np.less_equal), ("logaddexp", np.logaddexp), ("not_equal", np.not_equal)]:
        if name == "pow":
            _eq(xp.pow(xp.abs(x), y), ref(A, A[::-1]))
        else:
            _eq(getattr(xp, name)(x, y), ref(A, A[::-1]))
    _eq(xp.add(x, 1), A + 1)
    _eq(xp.sum(x, axis=1), A.sum(axis=1))
    _eq(xp.sum(x.astype(xp.int32)), A.astype(np.int32).sum(dtype=np.int64))
    _eq(xp.prod(x, axis=0, keepdims=True), A.prod(axis=0, keepdims=True))
    _eq(xp.var(x, axis=0, correction=1), A.var(axis=0, ddof=1))
    _eq(xp.std(x), A.std())
    _eq(xp.argmax(x, axis=1, keepdims=True), A.argmax(axis=1)[:, None])
    _eq(xp.any(x > 1, axis=0), (A > 1).any(axis=0))
    _eq(xp.matmul(x, td.from_array(Bm)), A @ Bm)
    _eq(xp.tensordot(x, td.from_array(Bm), axes=1), np.tensordot(A, Bm, axes=1))
    _eq(xp.vecdot(x, y), (A * A[::-1]).sum(axis=-1))
    _eq(xp.matrix_transpose(xp.reshape(x, (2, 2, 6))), np.swapaxes(A.reshape(2, 2, 6), -1, -2))
    _eq(xp.permute_dims(x, (1, 0)), A.T)
    _eq(xp.concat([x, y], axis=1), np.concatenate([A, A[::-1]], axis=1))
    _eq(xp.stack([x, y]), np.stack([A, A[::-1]]))
    _eq(xp.broadcast_to(x[0], (3, 6)), np.broadcast_to(A[0], (3, 6)))
    _eq(xp.where(x > 0, x, xp.zeros_like(x)), np.where(A > 0, A, 0))
    _eq(xp.squeeze(xp.expand_dims(x, axis=1), axis=1), A)
    _eq(xp.cumulative_sum(x, axis=1), np.cumsum(A, axis=1))
    _eq(xp.cumulative_sum(x[0], include_initial=True), np.concatenate([[0.0], np.cumsum(A[0])]))


def test_scalar_conversions_compute_one_element_arrays():
    x = td.from_array(A)
    assert float(xp.sum(x)) == pytest.approx(A.sum()) and bool(xp.all(x < 10))
    assert int(xp.argmax(x[0])) == int(A[0].argmax()) and complex(x[1, 2]) == complex(A[1, 2])
    assert range(10)[xp.asarray(3)] == 3  # __index__
    with pytest.raises(TypeError, match=r"bool\(\) of an array of shape \(4, 6\) \(24 elements\)"):
        bool(x > 0)
    with pytest.raises(TypeError, match=r"only integer arrays are an index"):
        range(3)[xp.asarray(1.0)]
    with pytest.raises(TypeError, match=r"td.Array is immutable"):
        x[0] = 1


def _standard_code(xp, X, w):
    """Written against the standard only: a standardised linear model's residual norm."""
    mu = xp.mean(X, axis=0, keepdims=True)
    sd = xp.std(X, axis=0, keepdims=True)
    Z = (X - mu) / sd
    pred = xp.matmul(Z, w)
    return xp.sqrt(xp.sum(xp.square(pred - xp.mean(pred))))


def test_code_written_against_the_standard_runs_unchanged():
    X, w = RNG.standard_normal((50, 4)), RNG.standard_normal((4,))
    got = _standard_code(td.from_array(X).__array_namespace__(), td.from_array(X), td.from_array(w))
    assert isinstance(got, td.Array)
    np.testing.assert_allclose(td.to_numpy(got), _standard_code(np, X, w), rtol=1e-12)


def test_manipulation_and_indexing_functions_of_the_standard():
    """take, flip, roll, repeat, tile, tril/triu; argmin over the flattened array;
    arange's default dtype from all its arguments; an axis out of range is an
    IndexError (numpy's AxisError) as the standard asks."""
    rng = np.random.default_rng(2)
    a = rng.random((5, 6))
    x = xp.asarray(a)
    cases = [(xp.take(x, xp.asarray([4, 0, 4]), axis=0), np.take(a, [4, 0, 4], axis=0)),
             (xp.flip(x, axis=1), np.flip(a, 1)), (xp.roll(x, -2, axis=0), np.roll(a, -2, axis=0)),
             (xp.roll(x, 7), np.roll(a, 7)), (xp.repeat(x, 2, axis=1), np.repeat(a, 2, axis=1)),
             (xp.tile(x, (2, 1)), np.tile(a, (2, 1))), (xp.tril(x, k=1), np.tril(a, 1)), (xp.triu(x), np.triu(a)),
             (xp.argmin(x), np.argmin(a)), (xp.argmax(x), np.argmax(a))]
    for got, want in cases:
        np.testing.assert_array_equal(td.to_numpy(got), want)
    assert xp.arange(0, 5.5).dtype == xp.float64 and xp.arange(5).dtype == xp.int64
    with pytest.raises(IndexError, match=r"axis 3 is out of range for rank 3"):
        xp.expand_dims(x, axis=3)
    assert xp.expand_dims(x, axis=2).shape == (5, 6, 1)
