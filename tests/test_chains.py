"""Chains of products (``a @ b @ c @ ...``) are merged into one einsum whose
contraction order is chosen like any einsum's (tra_dask/frontend/chains.py): the
same result as numpy, the best order's flops and predicted time, and only where the
merge is exact."""

import numpy as np
import pytest

import tra_dask as td
from tra_dask.frontend.chains import merge_chains
from tra_dask.frontend.nodes import Einsum


def _einsums(roots):
    """The einsum nodes under ``roots``: ``{id: node}``."""
    out, todo = {}, list(roots)
    while todo:
        n = todo.pop()
        if id(n) not in out:
            out[id(n)] = n
            todo += list(n.inputs)
    return [n for n in out.values() if isinstance(n, Einsum)]


@pytest.mark.slow
def test_a_lopsided_chain_runs_in_its_best_order():
    """2000x10 @ 10x2000 @ 2000x10 @ 10x2000 @ 2000x10: as written, two 2000x2000
    products (1.6e8 flops); in the best order (the 10x10 products of the inner pairs
    first) 2·(3·2000·10·10 + 10³) = 1,202,000 flops."""
    rng = np.random.default_rng(0)
    n, k = 2000, 10
    xs = [rng.normal(size=s) for s in [(n, k), (k, n), (n, k), (k, n), (n, k)]]
    a, b, c, d, e = (td.asarray(x) for x in xs)
    chain = a @ b @ c @ d @ e
    rel, plan = chain.to_relation(sites=2)
    np.testing.assert_allclose(td.to_numpy(rel), xs[0] @ xs[1] @ xs[2] @ xs[3] @ xs[4], rtol=1e-9)
    assert plan.cost.flops_per_site.sum() == 2 * (3 * n * k * k + k ** 3)
    eq = "ab,bc,cd,de,ef->af"
    best = td.einsum(eq, a, b, c, d, e, optimize=((1, 2), (1, 2), (1, 2), (0, 1))).to_relation(sites=2)[1]
    assert plan.cost.seconds == pytest.approx(best.cost.seconds, rel=1e-12)
    written = td.einsum(eq, a, b, c, d, e, optimize=False).to_relation(sites=2)[1]  # left to right
    assert written.cost.flops_per_site.sum() > 100 * plan.cost.flops_per_site.sum()
    assert written.cost.seconds > 1.2 * plan.cost.seconds


def test_chains_merge_into_one_einsum_only_where_exact():
    rng = np.random.default_rng(1)
    a, b, c, d = (td.asarray(rng.normal(size=s)) for s in [(6, 3), (3, 5), (5, 4), (4, 2)])
    # a chain: one einsum of four operands, the inner sums renamed apart
    (m,) = merge_chains([(a @ b @ c @ d)._node])
    assert isinstance(m, Einsum) and len(m.subs) == 4 and all(isinstance(i, type(a._node)) for i in m.inputs)
    assert len(set(m.subs[0] + m.subs[1] + m.subs[2] + m.subs[3])) == 5 and m.shape == (6, 2)
    # a product read twice is computed once: not merged into either reader
    t = a @ b
    x, y = t @ c, t.T @ a
    got = merge_chains([x._node, y._node])
    assert all(len(n.subs) == 2 for n in _einsums(got))
    assert got[0].inputs[0] is t._node
    # an output is not merged into another output
    got = merge_chains([t._node, (t @ c)._node])
    assert got[1].inputs[0] is got[0]
    # a product in another dtype keeps its rounding; a given order or block size is the user's
    t32 = td.asarray(rng.normal(size=(6, 3)).astype(np.float32)) @ td.asarray(np.ones((3, 5), np.float32))
    for e in [t32 @ c, td.einsum("ij,jk->ik", a @ b, c, optimize=False), td.einsum("ij,jk->ik", a @ b, c, chunks=2)]:
        assert merge_chains([e._node]) == [e._node]
    # a batch dim that broadcasts is left as written
    batched = td.asarray(rng.normal(size=(1, 6, 3))) @ td.asarray(rng.normal(size=(4, 3, 5)))
    assert all(len(n.subs) == 2 for n in _einsums(merge_chains([(batched @ c)._node])))


def test_a_transposed_operand_is_read_as_it_is():
    """``a @ b.T``: the einsum reads ``b`` with its indices permuted (no transpose node
    between the source and the join); a transposed product read once is merged through
    the transpose; one read twice stays a product of its own."""
    rng = np.random.default_rng(3)
    a, b, c = (td.asarray(rng.normal(size=s)) for s in [(6, 3), (5, 3), (6, 4)])
    (m,) = merge_chains([(a @ b.T)._node])
    assert isinstance(m, Einsum) and m.inputs == (a._node, b._node)
    assert m.subs[0][1] == m.subs[1][1] and m.subs[0][0] + m.subs[1][0] == m.out
    (m,) = merge_chains([((a @ b.T).T @ c)._node])  # (b a^T) c: one einsum of three operands
    assert len(m.subs) == 3 and m.inputs == (a._node, b._node, c._node)
    t = (a @ b.T).T
    got = merge_chains([(t @ td.asarray(rng.normal(size=(6, 2))))._node, (t + 1.0)._node])
    assert all(len(n.subs) == 2 for n in _einsums(got))  # the product is read twice (through its transpose)


def test_a_transposed_operand_plans_as_its_untransposed_product():
    """Keys only, 64 sites: ``a @ b.T`` and ``a.T @ b.T`` plan as ``a @ b`` does (a
    transpose between a source and its join hid the 3-D strategies: 1.38 s on 4
    sites' worth of work against 0.39 s)."""
    def nodata(region):
        raise AssertionError("planning must not make data")

    a, b = (td.from_region(nodata, (4096, 4096), "float64", name=n) for n in "AB")
    base = (a @ b).to_relation(sites=64)[1].cost
    for x in (a @ b.T, a.T @ b.T, td.tensordot(a, b, axes=([1], [1]))):
        cost = x.to_relation(sites=64)[1].cost
        assert cost.seconds == pytest.approx(base.seconds, rel=1e-9) and cost.flops_balance < 1.01


@pytest.mark.parametrize("name", ["matrices", "vector at the end", "vector first", "batched", "int", "read twice",
                                  "einsum and matmul", "tensordot", "transposed operands", "transposed product",
                                  "transposed product read twice", "diagonal of a transposed product"])
def test_merged_chains_equal_numpy(name):
    rng = np.random.default_rng(2)
    a, b, c = rng.normal(size=(5, 3)), rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    v, w = rng.normal(size=2), rng.normal(size=5)
    p, q = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 3, 4))
    ia, ib, ic = (rng.integers(-9, 9, size=s) for s in [(5, 3), (3, 4), (4, 2)])
    A, B, C, V, W, P, Q, IA, IB, IC = (td.asarray(x) for x in (a, b, c, v, w, p, q, ia, ib, ic))
    got, want = {
        "matrices": (lambda: A @ B @ C, lambda: a @ b @ c),
        "vector at the end": (lambda: A @ B @ C @ V, lambda: a @ b @ c @ v),
        "vector first": (lambda: W @ A @ B @ C, lambda: w @ a @ b @ c),
        "batched": (lambda: P @ Q @ C, lambda: p @ q @ c),
        "int": (lambda: IA @ IB @ IC, lambda: ia @ ib @ ic),
        "read twice": (lambda: (lambda t: t @ C + t.sum(axis=1, keepdims=True))(A @ B),
                       lambda: a @ b @ c + (a @ b).sum(1, keepdims=True)),
        "einsum and matmul": (lambda: td.einsum("ij,jk->ki", A @ B, C) @ W, lambda: np.einsum("ij,jk->ki", a @ b, c) @ w),
        "tensordot": (lambda: td.tensordot(P, Q @ C, axes=([0, 2], [0, 1])), lambda: np.tensordot(p, q @ c, axes=([0, 2], [0, 1]))),
        "transposed operands": (lambda: A.T.T @ B @ C.T.T, lambda: a @ b @ c),
        "transposed product": (lambda: (A @ B).T @ W + (B.T @ A.T).sum(axis=1), lambda: (a @ b).T @ w + (b.T @ a.T).sum(1)),
        "transposed product read twice": (lambda: (lambda t: t @ W + t[:, 0])((A @ B).T),
                                          lambda: (a @ b).T @ w + (a @ b).T[:, 0]),
        "diagonal of a transposed product": (lambda: td.einsum("ii->i", (A @ B @ B.T @ A.T).T),
                                             lambda: np.einsum("ii->i", (a @ b @ b.T @ a.T).T)),
    }[name]
    x = got()
    out = td.to_numpy(x)
    assert out.dtype == want().dtype and out.shape == want().shape
    np.testing.assert_allclose(out, want(), rtol=1e-9, atol=1e-9)
