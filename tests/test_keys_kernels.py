"""The key-function language and the kernel registry."""

import math

import numpy as np
import pytest

import tra_dask as td
from tra_dask.kernels import ArrayType, KernelTypeError, array_module, as_kernel, get_kernel, scale
from tra_dask.keys import (CallableKeyFn, CallablePredicate, KeyMap, as_key_fn, identity, insert_dim,
                           k0, k1, k2, key_map, project)

# -- keys ----------------------------------------------------------------------------


def test_affine_key_map_vectorised_and_scalar():
    f = key_map(2 * k0 + k1, k1 % 2, k0 // 2)
    keys = np.array([[0, 0], [1, 3], [4, 1]])
    out, rows = f.apply(keys)
    assert out.tolist() == [[0, 0, 0], [5, 1, 0], [9, 1, 2]]
    assert rows.tolist() == [0, 1, 2]
    assert [f(tuple(r)) for r in keys.tolist()] == [tuple(r) for r in out.tolist()]
    assert f.dims_read == {0, 1} and not f.is_identity(2)


def test_projection_permutation_identity():
    assert project(2, 0)((7, 8, 9)) == (9, 7)
    assert project(1, 0).projection == (1, 0)
    assert identity(3).is_identity(3) and not identity(3).is_identity(2)
    assert project(0, 1).is_identity(2) and not project(1, 0).is_identity(2)
    assert key_map(k0, k1 + 0).projection is None
    assert project(1).dims_read == {1}


def test_compose():
    inner = key_map(k1, k0)         # swap
    outer = key_map(2 * k0 + k1)    # linearise
    c = outer.compose(inner)
    for key in [(0, 1), (3, 2), (1, 1)]:
        assert c(key) == outer(inner(key))
    assert repr(c) == "key((2*k1 + k0))"


def test_predicates():
    p = (k0 == k1) & ~(k0 > 2) | (k2 == 5)
    keys = np.array([[1, 1, 0], [3, 3, 0], [0, 1, 5], [0, 1, 4]])
    assert p.evaluate(keys).tolist() == [True, False, True, False]
    assert [p(tuple(r)) for r in keys.tolist()] == [True, False, True, False]
    assert p.dims_read == {0, 1, 2}
    assert (k0 < 1).dims_read == {0}
    opaque = CallablePredicate(lambda key: key[0] == 0)
    assert opaque.dims_read is None and opaque.is_opaque
    assert ((k0 == 0) & opaque).dims_read is None  # unknown as soon as one part is opaque


def test_key_expression_has_no_truth_value():
    with pytest.raises(TypeError, match="no truth value"):
        bool(k0)


def test_insert_dim_multiplicity():
    f = insert_dim(1, 3)
    assert f.multiplicity == 3
    assert f((4, 5)) == [(4, 0, 5), (4, 1, 5), (4, 2, 5)]
    out, rows = f.apply(np.array([[4, 5], [6, 7]]))
    assert rows.tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match=r"needs keys of arity >= 3"):
        insert_dim(3, 2).apply(np.array([[1, 2]]))


def test_as_key_fn_forms():
    assert isinstance(as_key_fn(k0), KeyMap)
    assert as_key_fn((k1, 0))((5, 6)) == (6, 0)
    assert isinstance(as_key_fn(lambda k: k), CallableKeyFn)
    with pytest.raises(TypeError, match="is a predicate, not a key function"):
        as_key_fn(k0 == 1)
    with pytest.raises(TypeError, match="a key function must be"):
        as_key_fn(3.5)


def test_opaque_and_symbolic_rekey_agree():
    R = td.from_numpy(np.arange(24.0).reshape(4, 6), (2, 3))
    sym = td.rekey(R, (k1, k0))
    opq = td.rekey(R, lambda key: (key[1], key[0]))
    assert sym.keys == opq.keys
    for key, a in td.evaluate(sym).items():
        np.testing.assert_array_equal(a, td.evaluate(opq)[key])


# -- kernels -----------------------------------------------------------------------

F64 = np.dtype("float64")


def test_builtin_type_rules_and_flops():
    mm = get_kernel("matmul")
    assert mm.out_type(ArrayType((2, 3), F64), ArrayType((3, 4), np.dtype("float32"))) == ArrayType((2, 4), F64)
    assert mm.flops((2, 3), (3, 4)) == 2 * 2 * 3 * 4
    assert get_kernel("matmul_tn").out_type(ArrayType((3, 2), F64), ArrayType((3, 4), F64)).shape == (2, 4)
    assert get_kernel("matmul_nt").out_type(ArrayType((2, 3), F64), ArrayType((4, 3), F64)).shape == (2, 4)
    assert get_kernel("add").out_type(ArrayType((2, 3), F64), ArrayType((1, 3), F64)).shape == (2, 3)
    assert get_kernel("row_sum").out_type(ArrayType((5, 3), F64)).shape == (5, 1)
    assert get_kernel("exp").out_type(ArrayType((2,), np.dtype("int64"))).dtype == F64
    assert get_kernel("transpose").out_type(ArrayType((2, 5), F64)).shape == (5, 2)
    with pytest.raises(KernelTypeError, match=r"inner dims differ"):
        mm.out_type(ArrayType((2, 3), F64), ArrayType((4, 5), F64))


def test_builtin_kernels_compute_what_they_say():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    np.testing.assert_allclose(get_kernel("matmul_tn")(a, b), a.T @ b)
    np.testing.assert_allclose(get_kernel("matmul_nt")(a, b), a @ b.T)
    np.testing.assert_allclose(get_kernel("relu_grad")(a, b), a * (b > 0))
    np.testing.assert_allclose(get_kernel("diag")(a), a * np.eye(3, 4))
    np.testing.assert_allclose(get_kernel("row_max")(a), a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(get_kernel("argmin_with_index")(np.array([[3.0], [1.0], [2.0]]), np.array([10, 11, 12])), [1.0, 11.0])
    np.testing.assert_allclose(get_kernel("min_pair")(np.array([1.0, 5.0]), np.array([1.0, 3.0])), [1.0, 3.0])


@pytest.mark.parametrize("name", ["add", "mul", "min", "max", "min_pair"])
def test_associative_commutative_facts_hold(name):
    k = get_kernel(name)
    assert k.associative and k.commutative
    rng = np.random.default_rng(1)
    a, b, c = (rng.integers(0, 5, size=2).astype(float) for _ in range(3))
    np.testing.assert_allclose(k(k(a, b), c), k(a, k(b, c)))
    np.testing.assert_allclose(k(a, b), k(b, a))
    if k.identity is not None:
        np.testing.assert_allclose(k(np.full(2, k.identity), a), a)


@pytest.mark.parametrize("unary", ["neg", "transpose", "diag", "row_sum", "relu", "exp", "row_max", "identity"])
def test_distributes_over_facts_hold(unary):
    f = get_kernel(unary)
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    assert f.distributes_over
    for name in f.distributes_over:
        g = get_kernel(name)
        if g.arity != 2 or name == "matmul":
            continue
        np.testing.assert_allclose(f(g(a, b)), g(f(a), f(b)), err_msg=f"{unary} over {name}")


def test_scale_is_parametrised():
    s = scale(0.5)
    assert s == scale(0.5) and s != scale(0.25) and repr(s) == "scale(0.5)"
    R = td.from_numpy(np.arange(4.0), 2)
    assert td.transform(R, scale(0.5)) == td.transform(R, scale(0.5))
    np.testing.assert_array_equal(td.to_numpy(td.transform(R, s)), np.arange(4.0) / 2)


def test_user_kernel_decorator_with_declared_rule():
    @td.kernel(name="test_outer_sum", shape=lambda a, b: (a[0], b[0]), flops=lambda a, b: a[0] * b[0],
               commutative=False)
    def outer_sum(a, b):
        xp = array_module(a, b)
        return xp.add.outer(a, b)

    assert get_kernel("test_outer_sum") is outer_sum
    u, v = td.from_numpy(np.arange(4.0), 2), td.from_numpy(np.arange(3.0), 3)
    J = td.join(u, v, (), (), "test_outer_sum")
    assert J.chunk_shape((1, 0)) == (2, 3) and outer_sum.flops((2,), (3,)) == 6
    np.testing.assert_array_equal(td.evaluate(J)[(1, 0)], np.add.outer([2.0, 3.0], np.arange(3.0)))


def test_user_kernel_without_rule_is_probed():
    @td.kernel(name="test_first_col")
    def first_col(x):
        return x[:, :1]

    R = td.from_numpy(np.ones((4, 6)), (2, 3))
    assert td.transform(R, "test_first_col").chunk_shape((0, 1)) == (2, 1)


def test_plain_callable_kernel_is_opaque_and_typed_by_dry_run():
    R = td.from_numpy(np.arange(12.0).reshape(3, 4), (2, 2))
    T = td.transform(R, lambda x: x.sum(axis=0))
    assert T.chunk_shape((1, 1)) == (2,) and T.kernel.opaque
    assert not T.kernel.associative and not T.kernel.distributes_over
    np.testing.assert_array_equal(td.evaluate(T)[(0, 0)], [4.0, 6.0])
    with pytest.raises(ValueError, match=r"fails on chunks of shapes \(2, 2\) and \(2, 2\)"):
        td.join(R, R, (0, 1), (0, 1), lambda a, b: a @ b.reshape(1, 4))


def test_lying_kernel_is_caught_by_the_evaluator():
    liar = td.Kernel("test_liar", lambda x: x[:1], 1, shape=lambda s: s)
    R = td.from_numpy(np.ones((4, 4)), 2)
    with pytest.raises(RuntimeError, match=r"came out with shape \(1, 2\).*kernel 'test_liar'.*says \(2, 2\)"):
        td.evaluate(td.transform(R, liar))


def test_registry_rejects_silent_redefinition():
    with pytest.raises(ValueError, match="already registered"):
        td.kernel(name="add", shape="same")(lambda a, b: a - b)


def test_array_module_is_numpy_for_numpy_chunks():
    assert array_module(np.ones(2)) is np
    assert as_kernel("add", 2, where="t")(np.ones(2), np.ones(2)).__class__ is np.ndarray


def test_cupy_chunks_stay_cupy():
    cp = pytest.importorskip("cupy", reason="cupy (the gpu extra) is not installed on this machine")
    try:
        x = cp.arange(16, dtype=cp.float64).reshape(4, 4)
    except Exception as e:  # cupy installed but no usable GPU
        pytest.skip(f"no usable GPU: {e}")
    R = td.from_numpy(x, 2)
    out = td.evaluate(td.aggregate(td.join(R, R, (1,), (0,), "matmul"), (0, 2), "add"))
    assert all(type(a).__module__.startswith("cupy") for a in out.values())
    assert math.isclose(float(td.to_numpy(td.aggregate(td.join(R, R, (1,), (0,), "matmul"), (0, 2), "add")).sum()),
                        float((x @ x).sum()))


def test_row_sum_of_a_product_runs_in_one_pass_and_equals_the_two_kernels():
    """compose(row_sum, mul) — what R1-7 makes of the nearest-neighbour distance —
    is one einsum over float chunks of one shape, the two kernels otherwise; a user
    kernel that only shares the name "mul" is not taken for it."""
    from tra_dask.kernels import Kernel, _row_sum_of_mul, compose

    rs, mul = get_kernel("row_sum"), get_kernel("mul")
    k = compose(rs, mul)
    assert k.fn is _row_sum_of_mul and k.name == "row_sum∘mul"
    rng = np.random.default_rng(0)
    for dt, shapes in [("f8", ((7, 5), (7, 5))), ("f4", ((7, 5), (7, 5))), ("f8", ((7, 5), (1, 5))),
                       ("i4", ((7, 5), (7, 5))), ("f2", ((3, 4), (3, 4)))]:
        a, b = (rng.integers(-9, 9, s).astype(dt) for s in shapes)
        want = rs(mul(a, b))
        got = k(a, b)
        assert got.dtype == want.dtype and got.shape == want.shape == k.out_type(
            ArrayType(a.shape, a.dtype), ArrayType(b.shape, b.dtype)).shape
        np.testing.assert_allclose(got, want, rtol=1e-6)
    a, b = rng.random((7, 5)), rng.random((7, 5))
    np.testing.assert_allclose(k(a[:, ::-1], b.T.copy().T), (a[:, ::-1] * b).sum(1, keepdims=True))
    assert k.flops((7, 5), (7, 5)) == mul.flops((7, 5), (7, 5))  # one pass over the elements
    fake = Kernel("mul", lambda x, y: x - y, 2, "same")
    np.testing.assert_allclose(compose(rs, fake)(a, b), (a - b).sum(1, keepdims=True))


def test_a_sum_over_axes_of_a_product_runs_in_one_pass():
    """The front-end's reduce_sum∘mul (nearest neighbour written with arrays) is one
    einsum over float chunks of one shape, for any axes; other reductions, dtypes and
    broadcasting chunks run the two kernels — all equal numpy."""
    from tra_dask.frontend.chunk_ops import _sum_of_mul, reduce_kernel
    from tra_dask.kernels import compose

    rng = np.random.default_rng(1)
    mul = get_kernel("mul")
    for op, axes, shapes, dt in [("sum", (1,), ((6, 4), (6, 4)), "f8"), ("sum", (0,), ((6, 4), (6, 4)), "f4"),
                                 ("sum", (0, 1), ((6, 4), (6, 4)), "f8"), ("sum", (0, 2), ((3, 4, 5), (3, 4, 5)), "f8"),
                                 ("sum", (1,), ((6, 4), (1, 4)), "f8"), ("sum", (1,), ((6, 4), (6, 4)), "i4"),
                                 ("max", (1,), ((6, 4), (6, 4)), "f8")]:
        k = compose(reduce_kernel(op, axes), mul)
        assert k.fn is _sum_of_mul and k.name == f"reduce_{op}∘mul"
        a, b = (rng.integers(-9, 9, s).astype(dt) for s in shapes)
        want = np.asarray(getattr(np, op)(a * b, axis=axes))
        got = k(a, b)
        assert got.dtype == want.dtype and got.shape == want.shape, (op, axes, dt)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _unaligned(shape, offset=4):
    """A float64 array whose data starts ``offset`` bytes past an aligned address (as
    Dask's comms can deliver one: a view at an offset of the buffer it arrived in)."""
    n = int(np.prod(shape))
    buf = np.zeros(n * 8 + 16, np.uint8)
    start = (-buf.ctypes.data) % 16 + offset
    x = buf[start:start + n * 8].view(np.float64).reshape(shape)
    x[...] = np.arange(n, dtype=np.float64).reshape(shape)
    return x


def test_worker_tasks_hand_kernels_aligned_chunks():
    """numpy runs its slow unaligned loops on such an array (no BLAS for a matmul): the
    worker-side task functions copy an unaligned chunk before a kernel sees it, and
    leave aligned ones as they are."""
    from tra_dask.kernels import aligned
    from tra_dask.lowering import tasks

    x, y = _unaligned((6, 4)), np.ones((4, 3))
    assert not x.flags.aligned and y.flags.aligned
    got = aligned((x, y, 7))
    assert got[0].flags.aligned and got[1] is y and got[2] == 7
    np.testing.assert_array_equal(got[0], x)
    # one copy while it lives: a fused x.T and the product x.T @ x read one buffer
    assert aligned((x,))[0] is got[0] and aligned((x, x))[1] is got[0]
    seen = []

    def kernel(a, b):
        seen.append((a.flags.aligned, b.flags.aligned))
        return a @ b

    check = ((6, 3), "float64", "test", None, (0, 0))
    np.testing.assert_array_equal(tasks.apply(kernel, (), check, x, y), np.asarray(x) @ y)
    check4 = ((6, 4), "float64", "test", None, (0, 0))
    np.testing.assert_array_equal(tasks.fold(np.add, (), check4, x, _unaligned((6, 4), 2)), 2 * np.asarray(x))
    assert seen == [(True, True)]
    one_buffer = []

    def product(a, b):
        one_buffer.append(a.base is b)
        return a @ b

    gram = tasks.apply(product, (), ((4, 4), "float64", "t", None, (0,)),
                       tasks.apply(np.transpose, (), ((4, 6), "float64", "t", None, (0,)), x), x)
    np.testing.assert_array_equal(gram, np.asarray(x).T @ np.asarray(x))
    assert one_buffer == [True]
