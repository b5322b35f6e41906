"""A numpy user's einsum code runs unchanged (issue 41): contraction paths of any
arity (opt_einsum's ``dp`` reduces one operand in a step) and in numpy's format,
``optimize=True/False``, the interleaved (sublist) form, ``tensordot`` over more
axes than there are letters, and ``Array.dot``.  numpy is the oracle: every result
is compared with ``np.einsum`` / ``np.tensordot`` / ``ndarray.dot`` on the same data,
in this process."""

import numpy as np
import opt_einsum
import pytest

import tra_dask as td


def _check(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def _ops(sub, *shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


# -- paths of any arity --------------------------------------------------------------

def test_dp_path_with_one_operand_steps():
    a, c = _ops("", (3, 4), (5,))
    path, _ = opt_einsum.contract_path("ab,ab,c->", a, a, c, optimize="dp")
    assert any(len(step) == 1 for step in path)  # (the case: dp reduces c on its own)
    _check(td.to_numpy(td.einsum("ab,ab,c->", a, a, c, optimize="dp")), np.einsum("ab,ab,c->", a, a, c))
    _check(td.to_numpy(td.einsum("ab,ab,c->", a, a, c, chunks=2)), np.einsum("ab,ab,c->", a, a, c))
    rel, _ = td.einsum("ab,ab,c->", a, a, c, optimize="dp").to_relation(sites=3)
    _check(td.to_numpy(rel), np.einsum("ab,ab,c->", a, a, c))


@pytest.mark.slow
@pytest.mark.parametrize("sub,shapes,path", [
    ("ab,bc,cd->da", [(3, 4), (4, 5), (5, 2)], [(0, 1, 2)]),                 # three at once
    ("ab,bc,cd,de->ea", [(3, 4), (4, 5), (5, 2), (2, 3)], [(0, 1, 2, 3)]),   # four at once
    ("ab,bc,cd,de->ea", [(3, 4), (4, 5), (5, 2), (2, 3)], [(1, 3, 2), (0, 1)]),
    ("ab,ab,c->", [(3, 4), (3, 4), (5,)], [(2,), (0, 1), (0, 1)]),            # one reduced
    ("ab,bc,c->ca", [(3, 4), (4, 5), (5,)], [(0,), (1,), (0, 1), (0,), (0, 1)]),  # transposes and sums alone
    ("ij,jk->ki", [(3, 4), (4, 5)], [(1,), (0, 1)]),                         # two operands
    ("ij,jk->ki", [(3, 4), (4, 5)], [(0, 1), (0,)]),                         # a last step of one
    ("ii,ij,j->i", [(3, 3), (3, 4), (4,)], [(1, 2), (0,), (0, 1)]),
])
def test_explicit_path_of_any_arity(sub, shapes, path):
    ops = _ops(sub, *shapes)
    want = np.einsum(sub, *ops)
    for chunks in ("auto", 2):
        _check(td.to_numpy(td.einsum(sub, *ops, optimize=path, chunks=chunks)), want)
    rel, _ = td.einsum(sub, *ops, optimize=path).to_relation(sites=2)
    _check(td.to_numpy(rel), want)


@pytest.mark.parametrize("strategy", ["dp", "greedy", "optimal", "branch-2", True, False])
def test_strategies_and_numpy_booleans(strategy):
    sub = "ab,bc,cd,a,d->"
    ops = _ops(sub, (3, 4), (4, 5), (5, 2), (3,), (2,))
    _check(td.to_numpy(td.einsum(sub, *ops, optimize=strategy)), np.einsum(sub, *ops))


def test_optimize_false_is_left_to_right_and_true_is_ours():
    ops = _ops("", (3, 4), (4, 5), (5, 2))
    assert td.einsum("ab,bc,cd->ad", *ops, optimize=False)._node.optimize == ((0, 1), (0, 1))
    # opt_einsum's format puts a step's result last: left to right is (0, 1), then 0 with the last
    four = _ops("", (3, 4), (4, 5), (5, 2), (2, 6))
    assert td.einsum("ab,bc,cd,de->ae", *four, optimize=False)._node.optimize == ((0, 1), (0, 2), (0, 1))
    assert td.einsum("ab,bc,cd->ad", *ops, optimize=True)._node.optimize == "auto"
    # through numpy's own function (numpy's default is optimize=False)
    x = td.from_array(ops[0])
    for opt in (True, False, "greedy", ["einsum_path", (0, 1), (0, 1)]):
        _check(td.to_numpy(np.einsum("ab,bc,cd->ad", x, *ops[1:], optimize=opt)), np.einsum("ab,bc,cd->ad", *ops))


# -- numpy's path format, and paths checked --------------------------------------------

def test_numpy_path_format():
    a, c = _ops("", (3, 4), (5,))
    want = np.einsum("ab,ab,c->", a, a, c)
    _check(td.to_numpy(td.einsum("ab,ab,c->", a, a, c, optimize=["einsum_path", (0, 1), (0, 1)])), want)
    path, _ = np.einsum_path("ab,ab,c->", a, a, c, optimize="greedy")
    assert path[0] == "einsum_path"
    _check(td.to_numpy(td.einsum("ab,ab,c->", a, a, c, optimize=path)), want)
    b = _ops("", (4, 6), seed=1)[0]
    _check(td.to_numpy(td.einsum("ab,bc->ac", a, b, optimize=["einsum_path", (0, 1)])), a @ b)


@pytest.mark.parametrize("nops,path,match", [
    (3, [(0, 5), (0, 1)], r"optimize path step 0 is \(0, 5\); with 3 operand\(s\) left .* 0\.\.2"),
    (3, [(0, 1)], r"optimize path \[\(0, 1\)\] leaves 2 operands of 3"),
    (3, [(0, 0), (0, 1)], r"step 0 is \(0, 0\).*distinct"),
    (3, ["greedy", (0, 1), (0, 1)], r"optimize=.*optionally after 'einsum_path'"),
    (3, [(), (0, 1), (0, 1)], r"step 0 is \(\)"),
    (3, [(0, 1.5), (0, 1)], r"step 0 is \(0, 1.5\)"),
    (3, [0, 1], r"step 0 is 0"),
    (2, [(0, 1), (0, 1)], r"step 1 is \(0, 1\); with 1 operand\(s\) left"),  # two operands: checked too
    (2, [], r"leaves 2 operands of 2"),
    (2, ["einsum_path", (0, 2)], r"step 0 is \(0, 2\)"),
    (2, "fastest", r"optimize='fastest' is not a strategy; valid: 'auto', True, False"),
    (2, 3, r"optimize must be 'auto', True, False, an opt_einsum strategy or a path"),
])
def test_bad_paths_are_clear_errors(nops, path, match):
    sub = ["ab,bc->ac", "ab,bc,cd->ad"][nops - 2]
    ops = _ops(sub, (3, 4), (4, 5), (5, 2))[:nops]
    with pytest.raises(ValueError, match=match):
        td.einsum(sub, *ops, optimize=path)


# -- labels not limited by an alphabet ---------------------------------------------------

def test_tensordot_over_27_axes():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1,) * 20 + (2,) * 7)
    _check(td.to_numpy(td.tensordot(x, x, 27)), np.tensordot(x, x, 27))
    y = rng.standard_normal((1,) * 20 + (2,) * 7 + (3,))
    _check(td.to_numpy(td.tensordot(x, y, 27)), np.tensordot(x, y, 27))


def test_more_indices_than_letters():
    """53 indices in one contraction (numpy's tensordot has no alphabet either)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2,) * 4 + (1,) * 41)
    y = rng.standard_normal((1,) * 41 + (3,) * 4)
    axes = (list(range(8, 45)), list(range(37)))
    _check(td.to_numpy(td.tensordot(x, y, axes=axes)), np.tensordot(x, y, axes=axes))


def test_ellipsis_past_the_letters():
    from tra_dask.frontend.einsum import parse, symbol

    subs, out, _ = parse("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXY...", [(1,) * 53])
    assert subs == ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + symbol(52)]
    assert out[:2] == "Z" + symbol(52)


def test_wide_kernel_agrees_with_numpy_einsum():
    """The kernel past 52 indices computes what ``numpy.einsum`` computes (checked on
    indices that are symbols but few enough for numpy): a pair with a batch index,
    a diagonal, a sum, booleans and a dtype."""
    from tra_dask.frontend.chunk_ops import _einsum_wide
    from tra_dask.frontend.einsum import symbol

    rng = np.random.default_rng(4)
    p, q, r, s = (symbol(60 + k) for k in range(4))
    letters = str.maketrans({p: "i", q: "j", r: "k", s: "l"})
    x, y = rng.standard_normal((3, 4, 5)), rng.standard_normal((5, 4, 2))
    for sub, args in [(f"{p}{q}{r},{r}{q}{s}->{s}{p}", (x, y)), (f"{p}{q}{r},{r}{q}{s}->{q}{s}", (x, y)),
                      (f"{p}{p}->{p}", (x[:, :3, 0],)), (f"{p}{q}{r}->{r}", (x,)),
                      (f"{p}{q},{q}{r}->{p}{r}", (x[:, :, 0] > 0, y[:4, :, 0] > 0)),
                      (f"{p}{q},{q}{r}->{p}{r}", (np.int32([[1, 2]]), np.int32([[3], [4]])))]:
        want = np.einsum(sub.translate(letters), *args)
        _check(_einsum_wide(*args, sub, None), want)
    i, j = np.int32([[1, 2], [3, 4]]), np.int32([[5, 6], [7, 8]])
    _check(_einsum_wide(i, j, f"{p}{q},{q}{r}->{p}{r}", "float64"), np.einsum("ij,jk->ik", i, j, dtype="float64"))
    _check(_einsum_wide(x, y, f"{p}{q}{r},{r}{q}{s}->{p}{s}", None), np.einsum("ijk,kjl->il", x, y))


def test_pair_gemm_kernel_is_one_broadcast_matmul_and_agrees_with_numpy():
    """A pair einsum that is a GEMM with batch indices, its output ending in one
    side's free indices after the other's, runs as one broadcast ``matmul`` (the
    BLAS the time model prices it at), on random subscripts of that form: batch,
    free and summed indices in random operand and output orders, indices of one
    operand broadcast, float32/float64/complex mixes.  The result is numpy.einsum's
    (shape, dtype, values), contiguous; forms it does not cover are None."""
    from tra_dask.frontend.chunk_ops import MATMUL_MIN_SIDE, _einsum, _matmul_form

    rng = np.random.default_rng(7)
    used = 0
    for trial in range(300):
        letters = list("abcdefghij")
        rng.shuffle(letters)
        nb, nm, nn, nk = rng.integers(0, 3), rng.integers(1, 3), rng.integers(1, 3), rng.integers(1, 3)
        nx, ny = rng.integers(0, 2), rng.integers(0, 2)
        cut = np.cumsum([nb, nm, nn, nk, nx, ny])
        batch, m, n, k, xonly, yonly = (letters[a:b] for a, b in zip([0, *cut[:-1]], cut))
        xs = batch + m + k + xonly  # xonly / yonly: kept, in one operand alone (a broadcast axis of the other)
        ys = batch + k + n + yonly
        out_head = batch + xonly + yonly
        rng.shuffle(out_head)
        left, right = (m, n) if rng.random() < 0.5 else (n, m)
        out = "".join(out_head + list(rng.permutation(left)) + list(rng.permutation(right)))
        xs, ys = "".join(rng.permutation(xs)), "".join(rng.permutation(ys))
        sub = f"{xs},{ys}->{out}"
        size = {c: int(rng.choice([0, 1, 2, 3, 8, 9], p=[0.05, 0.15, 0.2, 0.2, 0.2, 0.2])) for c in xs + ys}
        for c in m[:1] + n[:1]:
            size[c] = MATMUL_MIN_SIDE + int(rng.integers(0, 5))
        dt = rng.choice(["float64", "float32", "complex128", "complex64"], size=2)
        x = rng.standard_normal([size[c] for c in xs]).astype(dt[0])
        y = rng.standard_normal([size[c] for c in ys]).astype(dt[1])
        form = _matmul_form(sub)
        assert form is not None, sub
        if 0 not in size.values():  # (an empty side may fall below the matmul's least size)
            assert form(np, x, y) is not None, sub
            used += 1
        got, want = _einsum(x, y, sub, None), np.einsum(sub, x, y)
        assert got.shape == want.shape and got.dtype == want.dtype, sub
        assert got.flags.c_contiguous
        tol = 1e-4 if "float32" in dt or "complex64" in dt else 1e-10
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10, err_msg=sub)
    assert used > 200
    assert _matmul_form("ij,jk->ki") is not None  # the output's last run may be either side's
    for sub in ("ij,ij->i", "ii,ij->j", "ijk,jl->il", "bij,bjk->ikb", "bij,bjk->ibk", "i,j->ij", "ij,j->i"):
        assert _matmul_form(sub) is None, sub  # not a GEMM, a diagonal, a one-sided sum, no free runs last
    wide = np.ones((4, 9, 5)), np.ones((1, 5, 10))  # a shared index of extents 4 and 1: numpy broadcasts it
    assert _matmul_form("bij,bjk->bik")(np, *wide) is None
    _check(_einsum(*wide, "bij,bjk->bik", None), np.einsum("bij,bjk->bik", *wide))
    for dt in ("float16", "int64", "bool"):  # no BLAS type: numpy.einsum's own accumulation
        x, y = rng.standard_normal((3, 9, 8)).astype(dt), rng.standard_normal((3, 8, 10)).astype(dt)
        np.testing.assert_array_equal(_einsum(x, y, "bij,bjk->bik", None),
                                      np.einsum("bij,bjk->bik", x, y, optimize=True))  # (its path, bit for bit)
    small = np.ones((4, 64)), np.ones((64, 4))
    assert _matmul_form("ij,jk->ik")(np, *small) is None  # small sides: numpy.einsum's loops
    _check(_einsum(*small, "ij,jk->ik", None), np.einsum("ij,jk->ik", *small))


# -- Array.dot ---------------------------------------------------------------------------

@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((4,), (4, 2)),
                                   ((2, 3, 4), (5, 4, 6)), ((2, 3, 4), (4,)), ((), (3, 2)), ((3, 2), ())])
def test_array_dot_method(sa, sb):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    want = np.asarray(a).dot(b)
    _check(td.to_numpy(td.from_array(a).dot(b)), want)
    _check(td.to_numpy(td.from_array(a).dot(td.from_array(b))), want)
    with pytest.raises(TypeError, match=r"td.Array.dot: out= is not supported"):
        td.from_array(a).dot(b, out=np.empty_like(want))


# -- the interleaved (sublist) form --------------------------------------------------------

@pytest.mark.parametrize("args_of", [
    lambda a, b, x: (a, [0, 1], b, [1, 2], [0, 2]),
    lambda a, b, x: (a, [0, 1], b, [1, 2]),                    # implicit output
    lambda a, b, x: (a, [1, 0], b, [0, 2], [2, 1]),
    lambda a, b, x: (a, [27, 0], b, [0, 51]),                  # implicit output in numeric order
    lambda a, b, x: (a, (np.int64(3), 5), b, [5, 7], [7, 3]),
    lambda a, b, x: (x, [Ellipsis, 0], [Ellipsis]),
    lambda a, b, x: (x, [Ellipsis, 0]),
    lambda a, b, x: (x, [0, Ellipsis], [Ellipsis, 0]),
    lambda a, b, x: (x, [Ellipsis, 1, 2], a, [1, 2], [Ellipsis, 1]),
    lambda a, b, x: (x[:, :2, :2], [1, 0, 0]),                  # a diagonal
    lambda a, b, x: (a[:, :3], [4, 4]),                         # a trace
    lambda a, b, x: (a, [0, 1], a, [0, 1], b, [1, 2], []),
])
def test_interleaved_form(args_of):
    rng = np.random.default_rng(6)
    a, b, x = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((2, 3, 4))
    args = args_of(a, b, x)
    want = np.einsum(*args)
    _check(td.to_numpy(td.einsum(*args)), want)
    tdargs = [td.from_array(v) if isinstance(v, np.ndarray) else v for v in args]
    _check(td.to_numpy(td.einsum(*tdargs, optimize=False)), want)
    _check(td.to_numpy(np.einsum(*tdargs)), want)  # numpy's function, dispatched to ours


def test_interleaved_form_errors():
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match=r"the sublist of operand 0 \[0, 52\] holds 52; .* ints in 0\.\.51"):
        td.einsum(x, [0, 52])
    with pytest.raises(ValueError, match=r"holds -1"):
        td.einsum(x, [0, -1])
    with pytest.raises(ValueError, match=r"holds True"):
        td.einsum(x, [0, True])
    with pytest.raises(ValueError, match=r"the output sublist \[Ellipsis, Ellipsis\] has more than one Ellipsis"):
        td.einsum(x, [Ellipsis, 0], [Ellipsis, Ellipsis])
    with pytest.raises(TypeError, match=r"the sublist of operand 1 must be a list of ints in 0\.\.51"):
        td.einsum(x, [0, 1], x, "ij")
    with pytest.raises(ValueError, match=r"interleaved form is einsum\(op0, sublist0"):
        td.einsum(x)
    with pytest.raises(ValueError, match=r"operand 0 has shape \(2, 3\) \(rank 2\)"):
        td.einsum(x, [0])  # the subscript checks as for a string
    with pytest.raises(ValueError, match=r"output index 'C' appears in no input"):
        td.einsum(x, [0, 1], [2])
