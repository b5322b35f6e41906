"""A numpy user's einsum and array code runs unchanged (issue 41): complex dtypes end
to end, numpy's einsum keywords (``dtype=``, ``casting=``, ``order=``) and axes of
extent 0.  numpy is the oracle: every result is compared with numpy's on the same
data; what numpy refuses (or what tra_dask refuses: ordering complex numbers) is an
error whose message names the op or the argument."""

import warnings

import numpy as np
import pytest

import tra_dask as td
from tra_dask.kernels import KernelTypeError, flop_factor, get_kernel


def _check(got, want, rtol=1e-9):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


def _c(shape, dtype=np.complex128, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal(shape) + 1j * r.standard_normal(shape)).astype(dtype)


def _tol(dtype):
    return 1e-4 if np.dtype(dtype) in (np.complex64, np.float32) else 1e-9


# -- complex dtypes ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("sub,shapes", [
    ("ij,jk->ik", [(4, 5), (5, 3)]),
    ("ij,kj->ik", [(4, 5), (3, 5)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 3)]),
    ("ii->i", [(4, 4)]),
    ("ij,ij->", [(3, 4), (3, 4)]),
    ("ab,bc,cd->da", [(3, 4), (4, 5), (5, 2)]),
    ("i,j->ij", [(3,), (4,)]),
])
def test_complex_einsum(sub, shapes, dtype):
    ops = [_c(s, dtype, seed=i) for i, s in enumerate(shapes)]
    want = np.einsum(sub, *ops)
    for chunks in ("auto", 2):
        _check(td.to_numpy(td.einsum(sub, *ops, chunks=chunks)), want, _tol(dtype))
    rel, _ = td.einsum(sub, *ops).to_relation(sites=3)
    _check(td.to_numpy(rel), want, _tol(dtype))
    _check(td.to_numpy(np.einsum(sub, td.asarray(ops[0]), *ops[1:])), want, _tol(dtype))


def test_complex_mixed_with_real_operands():
    a, b = _c((4, 5), np.complex64), np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    _check(td.to_numpy(td.einsum("ij,jk->ik", a, b, chunks=2)), np.einsum("ij,jk->ik", a, b), 1e-4)
    i = np.arange(20).reshape(4, 5)
    c = _c((4, 5))
    _check(td.to_numpy(td.asarray(i) + c), i + c)
    _check(td.to_numpy(td.asarray(c) @ i.T), c @ i.T)


def test_complex_elementwise_unary_and_reductions():
    a, b = _c((6, 4)), _c((6, 4), seed=1)
    A, B = td.from_array(a, chunks=2), td.asarray(b)
    cases = {
        "add": (A + B, a + b), "sub": (A - B, a - b), "mul": (A * B, a * b), "div": (A / B, a / b),
        "pow": (A ** 2, a ** 2), "neg": (-A, -a), "abs": (abs(A), abs(a)), "np.abs": (np.abs(A), np.abs(a)),
        "exp": (np.exp(A), np.exp(a)), "log": (np.log(A), np.log(a)), "sqrt": (np.sqrt(A), np.sqrt(a)),
        "tanh": (np.tanh(A), np.tanh(a)),
        "scalar": (A * 1j + (2 - 1j), a * 1j + (2 - 1j)), "rscalar": ((1 + 2j) / A, (1 + 2j) / a),
        "np scalar": (A * np.complex64(2j), a * np.complex64(2j)), "real * 1j": (td.asarray(a.real) * 1j, a.real * 1j),
        "sum": (A.sum(), a.sum()), "sum0": (A.sum(axis=0), a.sum(axis=0)), "np.sum": (np.sum(A, axis=1), a.sum(1)),
        "mean": (A.mean(axis=1), a.mean(axis=1)),
        "conj": (A.conj(), a.conj()), "conjugate": (A.conjugate(), a.conjugate()), "np.conj": (np.conj(A), np.conj(a)),
        "real": (A.real, a.real), "imag": (A.imag, a.imag), "np.real": (np.real(A), np.real(a)),
        "np.imag": (np.imag(A), np.imag(a)),
        "T": (A.T @ B, a.T @ b), "slice": (A[2:4] * 2, a[2:4] * 2), "take": (A[1], a[1]),
        "tensordot": (td.tensordot(A, B, axes=([0], [0])), np.tensordot(a, b, axes=([0], [0]))),
        "dot": (np.dot(A, B.T), np.dot(a, b.T)),
    }
    for name, (got, want) in cases.items():
        assert got.dtype == want.dtype, name
        _check(td.to_numpy(got), want)
    # real dtypes: .real is the array, .imag zeros of its dtype, conj itself (as numpy)
    x = np.arange(6.0).reshape(2, 3)
    X = td.asarray(x)
    assert X.real is X and X.conj() is X
    _check(td.to_numpy(X.imag), x.imag)
    _check(td.to_numpy(td.asarray(np.arange(3)).imag), np.arange(3).imag)


def test_vdot_and_outer():
    a, b = _c((3, 4)), _c((3, 4), seed=1)
    for got in (np.vdot(td.asarray(a), b), td.vdot(a, b), td.vdot(td.from_array(a, chunks=2), b)):
        _check(td.to_numpy(got), np.vdot(a, b))
    _check(td.to_numpy(td.vdot(a.real, b.real)), np.vdot(a.real, b.real))
    _check(td.to_numpy(td.vdot(np.arange(3), np.arange(3))), np.vdot(np.arange(3), np.arange(3)))
    x, y = _c(4), _c(5, seed=2)
    _check(td.to_numpy(np.outer(td.asarray(x), y)), np.outer(x, y))
    _check(td.to_numpy(td.outer(x, y)), np.outer(x, y))
    _check(td.to_numpy(td.outer(x.real, y)), np.outer(x.real, y))
    with pytest.raises(ValueError, match=r"vdot: operands of shapes \(3, 4\) and \(12,\); td.vdot needs one shape"):
        td.vdot(a, b.reshape(-1))
    with pytest.raises(ValueError, match=r"outer: operands of shapes \(3, 4\) and \(5,\); td.outer takes 1-d"):
        np.outer(td.asarray(a), y)
    with pytest.raises(TypeError, match=r"numpy.outer with out= is not supported"):
        np.outer(td.asarray(x), y, out=np.empty((4, 5), complex))


@pytest.mark.parametrize("op", [
    lambda X: X.max(), lambda X: X.min(axis=0), lambda X: X.argmin(axis=0), lambda X: X.argmax(axis=1),
    lambda X: X > 0, lambda X: X <= X, lambda X: np.maximum(X, 0), lambda X: np.minimum(X, X),
    lambda X: np.max(X), lambda X: np.argmin(X, axis=0), lambda X: np.greater(1j, X),
    lambda X: td.asarray(np.ones((3, 4))) < X,
], ids=["max", "min", "argmin", "argmax", ">", "<=", "maximum0", "minimum", "np.max", "np.argmin", "greater",
        "real<complex"])
def test_ordering_complex_numbers_is_refused_naming_the_op(op):
    X = td.asarray(_c((3, 4)))
    with pytest.raises(TypeError, match=r"not defined for complex numbers \(complex128\): they have no order"):
        op(X)


def test_ordering_kernels_refuse_complex_chunks():
    R = td.from_numpy(_c((4, 4)), 2, name="C")
    for name in ("relu", "row_max"):
        with pytest.raises(KernelTypeError, match=r"complex numbers \(complex128\) cannot be"):
            get_kernel(name).out_type(td.ArrayType((2, 2), np.dtype(np.complex128)))
    with pytest.raises(ValueError, match=r"complex numbers \(complex128\) cannot be"):
        td.join(R, R, [0, 1], [0, 1], "max")


def test_from_region_and_dask_inputs_of_complex_dtype():
    da = pytest.importorskip("dask.array")
    a = _c((6, 4))
    x = td.from_region(lambda r: a[r], (6, 4), "complex128", chunks=2)
    _check(td.to_numpy(x.sum(axis=1)), a.sum(axis=1))
    d = td.from_array(da.from_array(a, chunks=(3, 2)))
    _check(td.to_numpy(d.conj().T @ d), a.conj().T @ a)


# -- the cost of complex numbers -------------------------------------------------------

def _matmul_plan(dtype, objective=None, n=64):
    from tra_dask.optimizer import optimize

    a = np.ones((n, n), dtype)
    A, B = td.from_numpy(a, n // 2, name="A"), td.from_numpy(a, n // 2, name="B")
    e = td.aggregate(td.join(A, B, [1], [0], "matmul"), [0, 2], "add")
    if objective is None:
        return td.compile(e, sites=2)
    return optimize(e, sites=2, objective="time", cluster=td.ClusterSpec(sites=2))


def test_a_complex_multiply_add_is_four_real_ones():
    real = _matmul_plan(np.float64).cost
    cplx = _matmul_plan(np.complex128).cost
    products = 8 * 2 * 32 ** 3  # 8 block products of 32 x 32 x 32, 2 flops per multiply-add
    folds = 64 * 64  # the aggregation's adds (elementwise: counted per element)
    assert real.flops_per_site.sum() == products + folds
    assert cplx.flops_per_site.sum() == 4 * products + folds
    assert cplx.floats_moved == real.floats_moved and cplx.bytes_moved == 2 * real.bytes_moved  # 16-byte items
    assert cplx.peak_bytes_per_site.max() == 2 * real.peak_bytes_per_site.max()
    assert _matmul_plan(np.complex64).cost.bytes_moved == real.bytes_moved
    assert flop_factor(get_kernel("matmul"), ["complex64"]) == 4
    assert flop_factor(get_kernel("add"), ["complex128"]) == 1
    from tra_dask.frontend.chunk_ops import einsum_kernel

    assert flop_factor(einsum_kernel("ij,jk->ik"), ["complex128"]) == 4
    assert flop_factor(einsum_kernel("ij,ij->ij"), ["complex128"]) == 4
    assert flop_factor(einsum_kernel("ij->i"), ["complex128"]) == 1
    # the time model: a complex block product takes about 4x a real one (its flops; the
    # array it writes is twice the bytes), and a move of complex128 chunks 2x (the bytes)
    from tra_dask.optimizer.time import plan_seconds

    def per_node(dtype):
        spec = td.ClusterSpec(sites=2)
        _, per = plan_seconds(_matmul_plan(dtype, "time", n=256).cost, spec)
        return {type(node).__name__: t for node, t in per.items()}

    real, cplx = per_node(np.float64), per_node(np.complex128)
    assert 3.2 < cplx["LocalJoin"] / real["LocalJoin"] <= 4.5
    assert cplx["Broadcast"] / real["Broadcast"] == pytest.approx(2)


def test_time_model_rates_of_complex_dtypes():
    from tra_dask.optimizer.time import kernel_rate

    spec = td.ClusterSpec(sites=2)

    def rate(dtype, kernel):
        R = td.from_numpy(np.ones((8, 8), dtype), 4, name="R")
        rel = td.transform(R, kernel) if kernel != "matmul" else td.join(R, R, [1], [0], "matmul")
        plan = td.compile(rel, sites=1)
        node = plan.outputs[0]
        while not hasattr(node, "kernel") and not hasattr(getattr(node, "op", None), "kernel"):
            node = node.children[0]
        return kernel_rate(node, spec)

    # elementwise kernels are memory bound: a complex128 element moves twice a float64's bytes
    assert rate(np.complex128, "exp") == pytest.approx(rate(np.float64, "exp") / 2)
    assert rate(np.complex64, "exp") == pytest.approx(rate(np.float64, "exp"))
    # matmul: complex64 at the float32 multiple, complex128 at the float64 rate (its flops count 4x)
    assert rate(np.complex64, "matmul") == pytest.approx(rate(np.float32, "matmul"))
    assert rate(np.complex128, "matmul") == pytest.approx(rate(np.float64, "matmul"))


# -- numpy's einsum keywords -------------------------------------------------------------

A64 = np.random.default_rng(3).standard_normal((4, 5))
B64 = np.random.default_rng(4).standard_normal((5, 3))


@pytest.mark.parametrize("dtype,casting", [
    (np.float32, "same_kind"), (np.float32, "unsafe"), (np.float64, "safe"), (np.complex128, "safe"),
    (np.complex64, "same_kind"), ("float64", "no"), (np.int64, "unsafe"), (None, "safe"), (None, "no"),
])
def test_einsum_dtype_and_casting_as_numpy(dtype, casting):
    want = np.einsum("ij,jk->ik", A64, B64, dtype=dtype, casting=casting)
    for chunks in ("auto", 2):
        got = td.einsum("ij,jk->ik", A64, B64, dtype=dtype, casting=casting, chunks=chunks)
        assert got.dtype == want.dtype
        _check(td.to_numpy(got), want, _tol(want.dtype) if want.dtype.kind != "i" else 0)
    got = np.einsum("ij,jk->ik", td.asarray(A64), B64, dtype=dtype, casting=casting)
    _check(td.to_numpy(got), want, _tol(want.dtype) if want.dtype.kind != "i" else 0)


def test_einsum_dtype_of_summed_and_reduced_operands():
    b = np.random.default_rng(5).random((3, 4)) > 0.5
    for sub, ops, dtype in [("ij,jk->ik", (b, b.T), np.int64), ("ij->i", (A64,), np.float32),
                            ("ij->ji", (A64,), np.complex64), ("ii->", (A64[:4, :4],), np.float32),
                            ("ab,bc,cd->da", (A64, B64, B64.T), np.float32)]:
        want = np.einsum(sub, *ops, dtype=dtype, casting="unsafe")
        _check(td.to_numpy(td.einsum(sub, *ops, dtype=dtype, casting="unsafe", chunks=2)), want, 1e-4)


def test_einsum_dtype_is_ignored_where_numpy_returns_a_view():
    """numpy's einsum of one operand that sums nothing (a transpose, a diagonal) is a
    view of it: dtype= and casting= are ignored (float64 stays float64)."""
    for sub, x in [("ij->ji", A64), ("ii->i", A64[:4, :4]), ("ij", A64)]:
        want = np.einsum(sub, x, dtype=np.float32)
        assert want.dtype == np.float64
        _check(td.to_numpy(td.einsum(sub, x, dtype=np.float32)), want)
    want = np.einsum("ii", A64[:4, :4], dtype=np.float32, casting="same_kind")  # a trace sums: float32
    _check(td.to_numpy(td.einsum("ii", A64[:4, :4], dtype=np.float32, casting="same_kind")), want, 1e-5)
    # the interleaved form takes the keywords too
    want = np.einsum(A64, [0, 1], B64, [1, 2], [0, 2], dtype=np.complex64, casting="same_kind")
    _check(td.to_numpy(td.einsum(A64, [0, 1], B64, [1, 2], [0, 2], dtype=np.complex64, casting="same_kind")),
           want, 1e-4)


@pytest.mark.parametrize("dtype,casting,operand", [
    (np.float32, "safe", 0), (np.int64, "same_kind", 0), ("float64", "no", 1), (np.float64, "equiv", 1),
])
def test_einsum_casting_refused_as_numpy_refuses(dtype, casting, operand):
    b = B64.astype(np.float32) if operand == 1 else B64
    with pytest.raises(TypeError):
        np.einsum("ij,jk->ik", A64, b, dtype=dtype, casting=casting)
    for call in (lambda: td.einsum("ij,jk->ik", A64, b, dtype=dtype, casting=casting),
                 lambda: np.einsum("ij,jk->ik", td.asarray(A64), b, dtype=dtype, casting=casting)):
        with pytest.raises(TypeError, match=rf"operand {operand} \(float\d+\) cannot be cast to \w+ under "
                                            rf"casting='{casting}'"):
            call()


def test_einsum_casting_default_is_safe_and_without_dtype_checks_promotion():
    with pytest.raises(TypeError, match=r"casting='safe' \(numpy's default for einsum: pass casting='same_kind'"):
        td.einsum("ij,jk->ik", A64, B64, dtype=np.float32)
    with pytest.raises(TypeError, match=r"operand 1 \(float32\) cannot be cast to float64 under casting='no'"):
        td.einsum("ij,jk->ik", A64, B64.astype(np.float32), casting="no")


@pytest.mark.parametrize("order", ["K", "A", "C", "F", "k", None])
def test_einsum_order_is_accepted_and_the_result_is_c_order(order):
    got = td.to_numpy(td.einsum("ij,jk->ki", A64, B64, order=order))
    _check(got, np.einsum("ij,jk->ki", A64, B64))
    assert got.flags["C_CONTIGUOUS"]
    _check(td.to_numpy(np.einsum("ij,jk->ki", td.asarray(A64), B64, order=order)), np.einsum("ij,jk->ki", A64, B64))


def test_einsum_bad_keywords_are_named():
    with pytest.raises(ValueError, match=r"order must be one of 'C', 'F', 'A', or 'K' \(got 'X'\)"):
        np.einsum("ij,jk", A64, B64, order="X")  # (numpy's own message)
    with pytest.raises(ValueError, match=r"einsum 'ij,jk': order must be one of 'C', 'F', 'A', or 'K' \(got 'X'\); "
                                         r"the result is assembled in C order"):
        td.einsum("ij,jk", A64, B64, order="X")
    with pytest.raises(ValueError, match=r"casting must be one of 'no', 'equiv', 'safe', 'same_kind', 'unsafe' "
                                         r"\(got 'bad'\)"):
        td.einsum("ij,jk", A64, B64, casting="bad")
    with pytest.raises(TypeError, match=r"casting must be a str"):
        td.einsum("ij,jk", A64, B64, casting=None)
    with pytest.raises(TypeError, match=r"dtype=<U3 is not supported"):
        td.einsum("ij,jk", A64, B64, dtype="U3", casting="unsafe")
    with pytest.raises(TypeError, match=r"dtype='nope' is not a dtype"):
        td.einsum("ij,jk", A64, B64, dtype="nope")
    with pytest.raises(TypeError, match=r"numpy.einsum with out= is not supported"):
        np.einsum("ij,jk", td.asarray(A64), B64, out=np.empty((4, 3)))
    with pytest.raises(TypeError, match=r"numpy.einsum with foo= is not supported"):
        np.einsum("ij,jk", td.asarray(A64), B64, foo=1)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'out'"):
        td.einsum("ij,jk", A64, B64, out=np.empty((4, 3)))


# -- empty axes ----------------------------------------------------------------------------

@pytest.mark.parametrize("sub,shapes", [
    ("ij,jk->ik", [(0, 5), (5, 3)]),   # an empty result
    ("ij,jk->ik", [(4, 0), (0, 3)]),   # a sum over an empty index: zeros
    ("ij,jk->", [(4, 0), (0, 3)]),     # ... to a scalar
    ("ij,jk", [(4, 5), (5, 0)]),
    ("i,i", [(0,), (1,)]),             # 1 broadcasts against 0
    ("bij,bjk->bik", [(0, 2, 3), (0, 3, 4)]),
    ("ii->i", [(0, 0)]),
    ("ij->", [(3, 0)]),
    ("...j,j->...", [(2, 3, 0), (0,)]),
])
def test_einsum_with_empty_axes_as_numpy(sub, shapes):
    ops = [np.random.default_rng(i).standard_normal(s) for i, s in enumerate(shapes)]
    want = np.einsum(sub, *ops)
    _check(td.to_numpy(td.einsum(sub, *ops)), want)
    _check(td.to_numpy(np.einsum(sub, td.asarray(ops[0]), *ops[1:])), want)
    _check(np.asarray(td.einsum(sub, *ops, chunks=2)), want)
    ints = [o.astype(np.int32) for o in ops]
    _check(td.to_numpy(td.einsum(sub, *ints)), np.einsum(sub, *ints))
    want32 = np.einsum(sub, *ops, dtype=np.float32, casting="same_kind")
    _check(td.to_numpy(td.einsum(sub, *ops, dtype=np.float32, casting="same_kind")), want32)


def test_matmul_tensordot_dot_with_empty_axes():
    e, a = np.ones((4, 0)), np.ones((0, 3))
    for got, want in [(td.asarray(e) @ a, e @ a), (td.matmul(a.T, e.T), a.T @ e.T), (np.dot(td.asarray(e), a), e @ a),
                      (td.tensordot(e, a, axes=1), np.tensordot(e, a, axes=1)),
                      (td.asarray(np.ones((0, 5))) @ np.ones((5, 3)), np.ones((0, 5)) @ np.ones((5, 3))),
                      (td.asarray(e) @ a + np.ones((4, 3)), e @ a + 1), (td.outer(np.ones(0), np.ones(3)),
                                                                           np.outer(np.ones(0), np.ones(3))),
                      (td.vdot(np.ones(0), np.ones(0)), np.vdot(np.ones(0), np.ones(0)))]:
        _check(td.to_numpy(got), want)


def test_elementwise_reductions_and_shapes_of_empty_arrays():
    z = np.random.default_rng(0).standard_normal((0, 3))
    Z = td.asarray(z)
    cases = {
        "add": (Z + np.ones(3), z + np.ones(3)), "scalar": (Z * 2, z * 2), "rscalar": (1 - Z, 1 - z),
        "exp": (np.exp(Z), np.exp(z)), "neg": (-Z, -z), "gt": (Z > 0, z > 0), "T": (Z.T, z.T),
        "sum": (Z.sum(), z.sum()), "sum0": (Z.sum(axis=0), z.sum(axis=0)), "sum1": (Z.sum(axis=1), z.sum(axis=1)),
        "keepdims": (Z.sum(axis=0, keepdims=True), z.sum(axis=0, keepdims=True)),
        "bool sum": (td.asarray(z > 0).sum(axis=0), (z > 0).sum(axis=0)),
        "max1": (Z.max(axis=1), z.max(axis=1)), "argmin1": (Z.argmin(axis=1), z.argmin(axis=1)),
        "slice": (Z[:, 1:], z[:, 1:]), "take": (Z[:, 1], z[:, 1]), "empty slice": (td.asarray(np.ones(4))[2:2],
                                                                                   np.ones(4)[2:2]),
        "empty slice 2d": (td.asarray(np.ones((3, 4)))[1:1, 1], np.ones((3, 4))[1:1, 1]),
        "complex": (td.asarray(z.astype(complex)).conj() * 1j, z.astype(complex).conj() * 1j),
    }
    for name, (got, want) in cases.items():
        assert got.shape == want.shape, name
        _check(td.to_numpy(got), want)
    with warnings.catch_warnings(record=True) as w:  # numpy's warning, and its NaNs
        warnings.simplefilter("always")
        got = td.to_numpy(Z.mean(axis=0))
        want = z.mean(axis=0)
    _check(got, want)
    assert any("Mean of empty slice" in str(m.message) for m in w)
    for op in ("max", "min"):
        with pytest.raises(ValueError, match=rf"td.Array.{op}: zero-size array to reduction operation "
                                             rf"{op}imum which has no identity \(axis 0 of shape \(0, 3\)"):
            getattr(Z, op)(axis=0)
        with pytest.raises(ValueError, match="zero-size array"):
            getattr(td.asarray(np.ones((0, 0))), op)(axis=0)  # (numpy refuses even when the result is empty)
    with pytest.raises(ValueError, match=r"td.Array.argmax: attempt to get argmax of an empty sequence"):
        Z.argmax(axis=0)


def test_empty_inputs_from_dask_and_results_of_every_kind():
    da = pytest.importorskip("dask.array")
    D = td.from_array(da.ones((2, 0), chunks=1))
    assert D.shape == (2, 0) and D.dtype == np.float64
    _check(td.to_numpy(D @ np.ones((0, 3))), np.zeros((2, 3)))
    _check(td.to_numpy(td.einsum("ij,jk->ik", da.ones((2, 0), chunks=1), da.ones((0, 3), chunks=1))), np.zeros((2, 3)))
    x = td.asarray(np.arange(6.0).reshape(2, 3))
    E = td.asarray(np.ones((0, 3)))
    got = td.to_numpy((x.sum(axis=0), E, x * 2))  # a tuple: the empty one from its shape, the others run
    _check(got[0], np.arange(6.0).reshape(2, 3).sum(axis=0))
    _check(got[1], np.ones((0, 3)))
    _check(got[2], np.arange(6.0).reshape(2, 3) * 2)
    _check(td.evaluate(E), np.ones((0, 3)))
    _check(E.to_dask_array().compute(), np.ones((0, 3)))
    with pytest.raises(ValueError, match=r"td.Array.to_relation: the td.Array of shape \(0, 3\) is empty"):
        E.relation
    with pytest.raises(ValueError, match=r"the td.Array of shape \(0, 3\) is empty .*nothing to plan or run"):
        E.to_relation(sites=2)
    # constructors that make data keep refusing empty extents
    with pytest.raises(ValueError, match=r"from_region f: shape \(0, 2\) has an empty or negative dim"):
        td.from_region(lambda r: np.zeros((0, 2)), (0, 2), "float64", name="f")
    from tra_dask.frontend.array import _check_leaf

    with pytest.raises(ValueError, match=r"from_array: shape \(-1, 2\) has an empty or negative dim"):
        _check_leaf("from_array", (-1, 2), np.float64, empty=True)  # (0 allowed there, never < 0)


# -- on a cluster ---------------------------------------------------------------------------

@pytest.mark.cluster
def test_complex_einsum_on_a_cluster():
    distributed = pytest.importorskip("distributed")
    a, b = _c((6, 8), np.complex128), _c((8, 4), np.complex128, seed=1)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as client:
        got = td.einsum("ij,jk->ik", a, b, chunks=4).compute(client=client)
        _check(got, a @ b)
        got = (td.asarray(a).conj().T @ a).compute(client=client)  # a Gram matrix of complex vectors
        _check(got, a.conj().T @ a)
        _check(np.asarray(td.einsum("ij,jk->ik", np.ones((3, 0)), np.ones((0, 2)), dtype=complex)),
               np.zeros((3, 2), complex))  # a sum over an empty index: zeros, made on the workers
        _check(td.asarray(np.ones((0, 2), np.complex64)).compute(client=client), np.ones((0, 2), np.complex64))
