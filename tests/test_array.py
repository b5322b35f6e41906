"""The array front-end: td.einsum / td.Array against numpy, in this process and on a
real 3-worker LocalCluster(processes=True), with numpy, dask and mixed inputs."""

import logging

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tra_dask as td
from tra_dask.physical import PSource
from tra_dask.logical import ClusterSource

# 44 einsum expressions: matmul (all transposes), batched, bilinear forms, outer
# products, traces, diagonals, transposes, attention, MTTKRP, chains, ellipses
EINSUMS = [
    "ij,jk->ik", "ij,kj->ik", "ji,jk->ik", "ji,kj->ki", "ij,jk", "ij,jk->ki", "bij,bjk->bik", "bij,bjk->bki",
    "i,i->", "i,i", "i,j->ij", "i,j,k->ijk", "ij,ij->ij", "ij,ij->", "ij->ji", "ij->", "ij->i", "ij->j",
    "ii->i", "ii->", "ii", "iij->ij", "iij,jk->ik", "ij,jk,kl->il", "ijk,jr,kr->ir", "bhqd,bhkd->bhqk",
    "bhqk,bhkd->bhqd", "i,ij,j->", "ij,j->i", "ij,i->j", "ijk->kji", "ijk,k->ij", "abc,cd,de->abe",
    "ab,bc,cd,de->ae", "ij,jk->", "ijk,ijk->k", "...ij,...jk->...ik", "i...,i->...", "ij,jk,ik->",
    "ab,ab,ab->ab", "abcd,cd->ab", "ij,jk->jik", "ab,cd->abcd", "bn,anm,bm->ba",
]
assert len(EINSUMS) >= 40


def _operands(sub, seed, dtype=np.float64, scale=1):
    """Random operands for ``sub`` with random extents (1-7 times ``scale``: most do
    not divide the chunks)."""
    rng = np.random.default_rng(seed)
    sizes = {c: int(rng.integers(1, 8)) * scale for c in "abcdefghijklmnopqrstuvwxyz"}
    terms = sub.split("->")[0].split(",")
    return [rng.standard_normal(tuple(sizes[c] for c in t.replace("...", "xy"))).astype(dtype) for t in terms]


def _check(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("chunks", ["auto", 2, 3])
@pytest.mark.parametrize("sub", EINSUMS)
def test_einsum_equals_numpy_in_process(sub, chunks):
    ops = _operands(sub, EINSUMS.index(sub))
    _check(td.to_numpy(td.einsum(sub, *ops, chunks=chunks)), np.einsum(sub, *ops))


@pytest.mark.parametrize("sub", ["ij,jk->ik", "bij,bjk->bik", "ijk,jr,kr->ir", "ii->i", "ab,bc,cd,de->ae"])
def test_einsum_planned_for_three_sites_in_process(sub):
    """Chunking chosen for 3 sites (default cluster description), evaluated here."""
    ops = _operands(sub, 7)
    rel, plan = td.einsum(sub, *ops).to_relation(sites=3)
    assert plan.sites == 3 and plan.stage("chunking").note
    _check(td.to_numpy(rel), np.einsum(sub, *ops))


def test_einsum_float32_and_int_dtypes():
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = np.ones((4, 2), np.float32)
    _check(td.to_numpy(td.einsum("ij,jk->ik", a, b, chunks=2)), np.einsum("ij,jk->ik", a, b))
    _check(td.to_numpy(td.einsum("ij->", a, chunks=2)), np.einsum("ij->", a))


@pytest.mark.slow
def test_contraction_order_is_a_costed_choice():
    ops = [np.ones((2, 30)), np.ones((30, 30)), np.ones((30, 30)), np.ones((30, 2))]
    rel, plan = td.einsum("ab,bc,cd,de->ae", *ops).to_relation(sites=2)
    assert "contraction order" in plan.stage("chunking").note
    _check(td.to_numpy(rel), np.einsum("ab,bc,cd,de->ae", *ops))
    # an explicit strategy or path is honoured
    for opt in ["greedy", [(0, 1), (0, 1), (0, 1)]]:
        _check(td.to_numpy(td.einsum("ab,bc,cd,de->ae", *ops, optimize=opt)), np.einsum("ab,bc,cd,de->ae", *ops))


# ---------------------------------------------------------------------------
# numpy-style expressions

rng = np.random.default_rng(1)
a, b, c, d = (rng.standard_normal(s) for s in [(7, 5), (5,), (7, 1), (3, 7, 5)])
ai = rng.integers(-5, 5, size=(6, 4))
A, B, C, D = (td.from_array(x, chunks=ch) for x, ch in [(a, (3, 2)), (b, 2), (c, None), (d, (2, 3, 2))])
AI = td.from_array(ai)

EXPRESSIONS = {
    "A+B": (lambda: A + B, lambda: a + b), "A*C": (lambda: A * C, lambda: a * c), "C-A": (lambda: C - A, lambda: c - a),
    "D/(A*A+1)": (lambda: D / (A * A + 1), lambda: d / (a * a + 1)), "A*2": (lambda: A * 2.0, lambda: a * 2),
    "1-A": (lambda: 1 - A, lambda: 1 - a), "2/A": (lambda: 2 / A, lambda: 2 / a), "A**2": (lambda: A ** 2, lambda: a ** 2),
    "-A": (lambda: -A, lambda: -a), "abs": (lambda: abs(A), lambda: abs(a)), "exp": (lambda: np.exp(A), lambda: np.exp(a)),
    "log": (lambda: np.log(abs(A) + 1), lambda: np.log(abs(a) + 1)), "sqrt": (lambda: np.sqrt(abs(D)), lambda: np.sqrt(abs(d))),
    "tanh": (lambda: np.tanh(A), lambda: np.tanh(a)), "relu": (lambda: np.maximum(A, 0), lambda: np.maximum(a, 0)),
    "maximum": (lambda: np.maximum(A, C), lambda: np.maximum(a, c)), "minimum": (lambda: np.minimum(C, D), lambda: np.minimum(c, d)),
    "sum": (lambda: A.sum(), lambda: a.sum()), "sum0": (lambda: A.sum(axis=0), lambda: a.sum(0)),
    "sum1 keepdims": (lambda: A.sum(axis=1, keepdims=True), lambda: a.sum(1, keepdims=True)),
    "sum(0,2)": (lambda: D.sum(axis=(0, 2)), lambda: d.sum((0, 2))), "max1": (lambda: D.max(axis=1), lambda: d.max(1)),
    "min": (lambda: D.min(), lambda: d.min()), "mean-1": (lambda: D.mean(axis=-1), lambda: d.mean(-1)),
    "mean keepdims": (lambda: A.mean(axis=0, keepdims=True), lambda: a.mean(0, keepdims=True)),
    "int sum": (lambda: AI.sum(axis=0), lambda: ai.sum(0)), "int mean": (lambda: AI.mean(), lambda: ai.mean()),
    "argmin1": (lambda: A.argmin(axis=1), lambda: a.argmin(1)), "argmax0": (lambda: A.argmax(axis=0), lambda: a.argmax(0)),
    "argmin 1-d": (lambda: B.argmin(), lambda: b.argmin()), "argmax 3-d": (lambda: D.argmax(axis=1), lambda: d.argmax(1)),
    "int argmax ties": (lambda: AI.argmax(axis=0), lambda: ai.argmax(0)),
    "T": (lambda: A.T, lambda: a.T), "transpose": (lambda: D.transpose(2, 0, 1), lambda: d.transpose(2, 0, 1)),
    "slice": (lambda: A[3:6, 2:], lambda: a[3:6, 2:]), "slice ...": (lambda: D[..., 2:4], lambda: d[..., 2:4]),
    "slice free": (lambda: td.from_array(a)[1:4, 2:3], lambda: a[1:4, 2:3]),
    "integer index": (lambda: D[1, 4], lambda: d[1, 4]), "row": (lambda: A[-2], lambda: a[-2]),
    "index and slice": (lambda: D[2, 3:, 1], lambda: d[2, 3:, 1]),
    "A @ A.T": (lambda: A @ A.T, lambda: a @ a.T), "matvec": (lambda: A @ B, lambda: a @ b),
    "vecmat": (lambda: td.matmul(a[:, 0], A), lambda: a[:, 0] @ a), "vecvec": (lambda: B @ B, lambda: b @ b),
    "batched": (lambda: D @ A.T, lambda: d @ a.T), "np.matmul": (lambda: np.matmul(a, A.T), lambda: a @ a.T),
    "tensordot": (lambda: td.tensordot(D, A, axes=([1, 2], [0, 1])), lambda: np.tensordot(d, a, axes=([1, 2], [0, 1]))),
    "tensordot int": (lambda: td.tensordot(A, a.T, axes=1), lambda: np.tensordot(a, a.T, axes=1)),
    "dot": (lambda: td.dot(D, B), lambda: np.dot(d, b)), "dot 2-d": (lambda: td.dot(A, a.T), lambda: np.dot(a, a.T)),
    "np.einsum": (lambda: np.einsum("ij,ij->i", A, a), lambda: np.einsum("ij,ij->i", a, a)),
    "np.sum": (lambda: np.sum(A, axis=1), lambda: a.sum(1)), "np.mean": (lambda: np.mean(D), lambda: d.mean()),
    "np.transpose": (lambda: np.transpose(D), lambda: np.transpose(d)),
    "numpy @ td": (lambda: a @ A.T + 1, lambda: a @ a.T + 1),
    "ffnn layer": (lambda: np.maximum(A @ A.T, 0).sum(axis=1), lambda: np.maximum(a @ a.T, 0).sum(1)),
    "nearest neighbour": (lambda: ((D[0] - A) ** 2).sum(axis=1).argmin(), lambda: ((d[0] - a) ** 2).sum(1).argmin()),
    "scalar ** array": (lambda: 2.0 ** A, lambda: 2.0 ** a),
    "array ** array": (lambda: abs(A) ** C, lambda: abs(a) ** c),
}


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_numpy_style_expressions(name):
    make, want = EXPRESSIONS[name]
    _check(td.to_numpy(make()), want())


def test_array_metadata_and_protocols():
    x = td.from_array(a, chunks=(3, 2))
    assert (x.shape, x.dtype, x.ndim, x.size, len(x)) == ((7, 5), a.dtype, 2, 35, 7)
    assert x.chunks == ((3, 3, 1), (2, 2, 1))
    assert (x @ x.T).chunks is None  # chosen with the plan
    assert (x @ x.T).shape == (7, 7) and (x.sum(axis=0)).shape == (5,) and x.argmin(axis=1).dtype == np.int64
    np.testing.assert_allclose(np.asarray(x @ x.T), a @ a.T)  # __array__: here, no client is current
    rel = (x @ x.T).relation
    assert isinstance(rel, td.Relation) and "matmul" in repr(rel)
    assert isinstance(td.from_array(x.relation), td.Array)  # relations round-trip
    _check(td.to_numpy(td.from_array(td.from_numpy(a, (4, 4))) * 2.0), a * 2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_hypothesis_random_einsum_equals_numpy(data):
    letters = "abcd"
    sizes = {ch: data.draw(st.integers(1, 5), label=f"size {ch}") for ch in letters}
    nops = data.draw(st.integers(1, 3), label="operands")
    terms = [data.draw(st.text(letters, min_size=0, max_size=3), label=f"term {i}") for i in range(nops)]
    used = sorted(set("".join(terms)))
    explicit = data.draw(st.booleans(), label="explicit output")
    if explicit:
        out = "".join(data.draw(st.permutations(used), label="out")[:data.draw(st.integers(0, len(used)), label="k")])
        sub = ",".join(terms) + "->" + out
    else:
        sub = ",".join(terms)
    ops = [np.random.default_rng(len(t)).standard_normal(tuple(sizes[ch] for ch in t)) for t in terms]
    chunks = data.draw(st.sampled_from(["auto", 1, 2, 3]), label="chunks")
    _check(td.to_numpy(td.einsum(sub, *ops, chunks=chunks)), np.einsum(sub, *ops))


# ---------------------------------------------------------------------------
# bad input: clear errors before anything runs


def test_bad_einsum_inputs():
    x, y = np.ones((3, 4)), np.ones((5, 2))
    with pytest.raises(ValueError, match=r"index 'j' has extent 4 in operand 0 but 5 in operand 1"):
        td.einsum("ij,jk->ik", x, y)
    with pytest.raises(ValueError, match=r"output index 'z' appears in no input; valid output indices: 'ijk'"):
        td.einsum("ij,jk->iz", x, np.ones((4, 2)))
    with pytest.raises(ValueError, match=r"operand 1 has shape \(5, 2\) \(rank 2\) but its subscript 'jkl' names 3"):
        td.einsum("ij,jkl->ik", x, y)
    with pytest.raises(ValueError, match=r"2 operand subscript\(s\) for 1 operand"):
        td.einsum("ij,jk", x)
    with pytest.raises(ValueError, match=r"output index 'i' appears twice"):
        td.einsum("ij->ii", x)
    with pytest.raises(ValueError, match=r"invalid characters"):
        td.einsum("i1,1k", x, x)
    with pytest.raises(ValueError, match=r"chunks names index 'q'"):
        td.einsum("ij,jk", x, np.ones((4, 2)), chunks={"q": 2})
    with pytest.raises(ValueError, match=r"matmul: shapes \(3, 4\) and \(5, 2\) do not align"):
        td.from_array(x) @ y


def test_bad_array_inputs():
    x = td.from_array(np.ones((3, 4)))
    with pytest.raises(TypeError, match=r"does not support numpy.frexp; supported ufuncs: .*exp.*sin"):
        np.frexp(x)
    with pytest.raises(TypeError, match=r"does not support numpy.sort"):
        np.sort(x)
    with pytest.raises(ValueError, match=r"shapes \(3, 4\) and \(3,\) do not broadcast"):
        x + np.ones(3)
    with pytest.raises(ValueError, match=r"axis 2 is out of range for an array of shape \(3, 4\); valid axes: -2..1"):
        x.sum(axis=2)
    with pytest.raises(TypeError, match=r"integers, slices, None, ... and one integer or boolean array only"):
        x[{1, 2}]
    with pytest.raises(IndexError, match=r"index 3 is out of bounds for axis 0 with extent 3"):
        x[3]
    # a slice inside fixed chunks is a re-cut, not an error
    np.testing.assert_array_equal(td.to_numpy(td.from_array(np.arange(6.0), chunks=2)[1:4]), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"cut differently along one axis"):
        td.to_numpy(td.from_array(np.ones(6), chunks=2) + td.from_array(np.ones(6), chunks=3))
    with pytest.raises(TypeError, match=r"dtype <U1 is not supported; use bool, integer, floating or complex"):
        td.from_array(np.array(["x"]))
    with pytest.raises(TypeError, match=r"einsum\('ij'\) operand 0: cannot use this builtins.object"):
        td.einsum("ij", object())


# ---------------------------------------------------------------------------
# on a real cluster: numpy, dask and mixed inputs

CONFIG = {"distributed.scheduler.active-memory-manager.start": False}


@pytest.fixture(scope="module")
def client():
    with dask.config.set(CONFIG):
        with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
            with Client(cluster, set_as_default=False) as c:
                c.wait_for_workers(3, timeout=60)
                yield c


def _inputs(ops, kind):
    if kind == "numpy":
        return ops
    as_dask = [da.from_array(x, chunks=2) if x.ndim else x for x in ops]
    if kind == "dask":
        return as_dask
    return [dx if i % 2 == 0 else x for i, (x, dx) in enumerate(zip(ops, as_dask))]  # mixed


# dask and mixed inputs differ from numpy ones in how operands become sources (resident
# on the workers, placed where Dask put them, their chunks kept): one expression per
# operand structure — ranks 1 to 4, a diagonal, an ellipsis, an implicit output, three and
# four operands, an outer product, a full reduction, a permuted output — not all of
# EINSUMS, whose forms the numpy case and the in-process tests cover on their own
BY_INPUT_KIND = ["ij,jk->ik", "ij,jk", "bij,bjk->bki", "i,j,k->ijk", "ii->i", "iij,jk->ik", "ijk->kji",
                 "ab,bc,cd,de->ae", "bhqd,bhkd->bhqk", "...ij,...jk->...ik", "i...,i->...", "ij,jk,ik->",
                 "ab,cd->abcd", "bn,anm,bm->ba", "ij->", "i,i->"]
assert set(BY_INPUT_KIND) <= set(EINSUMS)


@pytest.mark.parametrize("kind", ["numpy", "dask", "mixed"])
def test_einsum_on_cluster(client, kind):
    """Every expression (numpy inputs; dask and mixed ones: BY_INPUT_KIND) on 3 workers,
    blocks of 2 (dask inputs keep theirs)."""
    for sub in EINSUMS if kind == "numpy" else BY_INPUT_KIND:
        ops = _operands(sub, EINSUMS.index(sub))
        got = td.einsum(sub, *_inputs(ops, kind), chunks=2).compute(client)
        _check(got, np.einsum(sub, *ops))


@pytest.mark.parametrize("sub", ["ij,jk->ik", "bhqd,bhkd->bhqk", "ijk,jr,kr->ir", "ii->i"])
def test_auto_chunking_on_cluster(client, sub):
    rank = max(len(t) for t in sub.split("->")[0].split(","))
    big = _operands(sub, 3, scale={2: 40, 3: 8}.get(rank, 3))  # a few hundred thousand elements at most
    x = td.einsum(sub, *big)
    plan = x.plan(client)
    assert plan.sites == 3 and plan.cost.seconds > 0
    assert "chunking:" in plan.explain()
    _check(x.compute(client), np.einsum(sub, *big))


@pytest.mark.parametrize("sub", ["ij,jk->ik", "ijk,jr,kr->ir"])
def test_auto_chunking_on_cluster_with_dask_and_numpy_inputs(client, sub):
    """Mixed inputs, chunks="auto": the dask operands' chunks are candidates (kept or
    re-chunked, whichever the plan predicts faster), the numpy ones are cut to match."""
    rank = max(len(t) for t in sub.split("->")[0].split(","))
    big = _operands(sub, 4, scale={2: 40, 3: 8}.get(rank, 3))
    mixed = [da.from_array(x, chunks=tuple(max(1, n // 3) for n in x.shape)) if i == 0 else x
             for i, x in enumerate(big)]
    x = td.einsum(sub, *mixed)
    note = x.plan(client).stage("chunking").note
    assert "(kept)" in note or "(chosen)" in note
    _check(x.compute(client), np.einsum(sub, *big))


def test_dask_inputs_stay_where_they_are(client):
    """A dask input whose chunks are kept is a cluster-resident source with a fixed
    placement: its blocks are read where they live."""
    x = np.random.default_rng(5).standard_normal((40, 30))
    dx = client.persist(da.from_array(x, chunks=(10, 10)))
    y = td.einsum("ij,jk->ik", dx, x.T, chunks={"i": 10, "j": 10})
    plan = y.plan(client)
    srcs = [n for n in plan.nodes if isinstance(n, PSource)]
    resident = [n for n in srcs if isinstance(n.source, ClusterSource)]
    assert resident and all(not n.free for n in resident)
    assert "(kept)" in plan.stage("chunking").note or "(given)" in plan.stage("chunking").note
    _check(y.compute(client), x @ x.T)


def test_results_as_dask_arrays(client):
    x = np.random.default_rng(6).standard_normal((12, 9))
    dx = da.from_array(x, chunks=(5, 4))
    out = (td.from_array(dx) @ x.T).to_dask_array(client)
    assert isinstance(out, da.Array) and out.shape == (12, 12)
    np.testing.assert_allclose(out.compute(scheduler=client.get), x @ x.T)
    np.testing.assert_allclose(td.compute(td.from_array(x).sum(axis=0), client), x.sum(0))
    # the result feeds the next expression without leaving the cluster
    again = td.einsum("ij->i", td.submit(td.from_array(x) * 2.0, client))
    np.testing.assert_allclose(again.compute(client), (2 * x).sum(1))


# ---------------------------------------------------------------------------
# the paper's programs on the front-end; several outputs as one plan


def test_comparisons_are_elementwise():
    x = td.from_array(a, chunks=(3, 2))
    _check(td.to_numpy(x > 0), a > 0)
    _check(td.to_numpy(0.5 <= x), 0.5 <= a)
    _check(td.to_numpy(np.less(c, x)), c < a)
    _check(td.to_numpy(x * (x > 0)), a * (a > 0))


def test_paper_programs_on_the_front_end():
    from tra_dask.programs import (ffnn_forward, ffnn_forward_array, ffnn_sgd_step, ffnn_sgd_step_array,
                                   nearest_neighbor, nearest_neighbor_array)

    r = np.random.default_rng(8)
    X, A_, q = r.standard_normal((23, 6)), r.standard_normal((6, 6)), r.standard_normal(6)
    A_ = A_ @ A_.T
    dist = np.einsum("ij,jk,ik->i", X - q, A_, X - q)
    assert int(td.to_numpy(nearest_neighbor_array(q, X, A_))) == int(dist.argmin())
    rel = td.to_numpy(nearest_neighbor(td.from_numpy(q, 3), td.from_numpy(X, (5, 3)), td.from_numpy(A_, 3)))
    assert int(rel[1]) == int(dist.argmin())
    W1, W2 = r.standard_normal((6, 9)) * 0.3, r.standard_normal((9, 4)) * 0.3
    Y = np.eye(4)[r.integers(0, 4, 23)]
    want = td.to_numpy(ffnn_forward(td.from_numpy(X, (5, 3)), td.from_numpy(W1, 3), td.from_numpy(W2, (3, 4))))
    _check(td.to_numpy(ffnn_forward_array(X, W1, W2)), want)
    new1, new2 = td.to_numpy(ffnn_sgd_step_array(X, Y, W1, W2, 0.1))
    rel_step = ffnn_sgd_step(td.from_numpy(X, (5, 3)), td.from_numpy(Y, (5, 4)), td.from_numpy(W1, 3),
                             td.from_numpy(W2, (3, 4)), 0.1)
    chunks = td.evaluate(rel_step)
    _check(new1, td.to_numpy(rel_step[0], chunks[0]))
    _check(new2, td.to_numpy(rel_step[1], chunks[1]))


def test_several_outputs_planned_together(client):
    from tra_dask.programs import ffnn_sgd_step_array

    r = np.random.default_rng(9)
    X, Y = r.standard_normal((40, 8)), np.eye(3)[r.integers(0, 3, 40)]
    W1, W2 = r.standard_normal((8, 12)) * 0.3, r.standard_normal((12, 3)) * 0.3
    # a dask input, the others cut by hand (the chunk choice of an FFNN step, a search per
    # candidate, is test_estimate's and the fault tests')
    Y, W1, W2 = td.from_array(Y, chunks=(10, 3)), td.from_array(W1, chunks=(8, 6)), td.from_array(W2, chunks=(6, 3))
    step = ffnn_sgd_step_array(da.from_array(X, chunks=(10, 8)), Y, W1, W2, 0.05)
    got = td.compute(step, client)
    want = td.to_numpy(step)
    assert isinstance(got, tuple) and len(got) == 2
    _check(got[0], want[0])
    _check(got[1], want[1])


# ---------------------------------------------------------------------------
# the chunking choice: memory is a hard limit; the choice is explained


@pytest.mark.slow
def test_chunking_respects_the_memory_limit():
    r = np.random.default_rng(10)
    a, b = r.standard_normal((600, 600)), r.standard_normal((600, 600))
    x = td.einsum("ij,jk->ik", a, b)
    _, roomy = x.to_relation(sites=3)
    limit = 7_000_000  # bytes per site: A, B and C in one block each (8.6 MB, + chunks in flight) do not fit
    rel, tight = x.to_relation(sites=3, memory_limit=limit)
    assert roomy.cost.peak_bytes_per_site.max() > limit
    assert tight.cost.peak_bytes_per_site.max() <= limit
    assert "block(s)" in tight.stage("chunking").note
    _check(td.to_numpy(rel), a @ b)
    with pytest.raises(ValueError, match=r"no chunking fits in memory|no plan fits"):
        x.to_relation(sites=3, memory_limit=20_000)


def test_chunking_on_one_site_respects_the_memory_limit():
    """One site: one block per index unless that does not fit; then the chunking that does."""
    r = np.random.default_rng(11)
    a, b = r.standard_normal((600, 600)), r.standard_normal((600, 600))
    x = td.einsum("ij,jk->ik", a, b)
    _, whole = x.to_relation(sites=1)
    assert "1 block(s) of 600" in whole.stage("chunking").note and "2 block(s)" not in whole.stage("chunking").note
    limit = 13_500_000  # A, B and C whole (8.6 MB) plus two 2.9 MB chunks in flight do not fit; halves do
    rel, tight = x.to_relation(sites=1, memory_limit=limit)
    assert whole.cost.peak_bytes_per_site.max() > limit >= tight.cost.peak_bytes_per_site.max()
    assert "2 block(s) of 300" in tight.stage("chunking").note
    _check(td.to_numpy(rel), a @ b)
    with pytest.raises(ValueError, match=r"no chunking fits in memory"):
        x.to_relation(sites=1, memory_limit=7_000_000)


def _region_values(region):  # a chunk-free function of the global index (module level: picklable)
    i, j = (np.arange(s.start, s.stop, dtype=np.float64) for s in region)
    return np.sin(np.add.outer(i * 0.37, j * 0.11))


def test_arrays_made_on_the_workers_get_their_chunking_chosen():
    """``from_region`` / ``programs.uniform_array``: the values do not depend on the
    chunking, so any chunking the optimizer picks computes the same array."""
    from tra_dask.programs import UniformRegion, uniform_array

    whole = _region_values((slice(0, 57), slice(0, 31)))
    x = td.from_region(_region_values, (57, 31), "float64")
    assert x.shape == (57, 31) and x.chunks is None
    for chunks in [None, 7, (20, 31), (57, 4)]:
        y = td.from_region(_region_values, (57, 31), "float64", chunks=chunks)
        _check(td.to_numpy(y @ y.T), whole @ whole.T)
    u = UniformRegion((57, 31), seed=4)
    full = u((slice(0, 57), slice(0, 31)))
    assert -1 <= full.min() < -0.9 and 0.9 < full.max() < 1 and abs(full.mean()) < 0.1
    assert not np.array_equal(full, UniformRegion((57, 31), seed=5)((slice(0, 57), slice(0, 31))))
    _check(u((slice(13, 40), slice(3, 30))), full[13:40, 3:30])
    w = uniform_array((57, 31), seed=4, dtype="float32")
    rel, plan = (w.T @ x).to_relation(sites=3)
    assert "(chosen)" in plan.stage("chunking").note
    _check(td.to_numpy(rel), full.astype(np.float32).T @ whole)


def test_bad_region_functions():
    with pytest.raises(TypeError, match="must be callable"):
        td.from_region(3, (2, 2), "float64")
    with pytest.raises(ValueError, match="from_region _region_values: shape \\(0, 2\\) has an empty or negative dim"):
        td.from_region(_region_values, (0, 2), "float64")
    with pytest.raises(TypeError, match="not supported"):
        td.from_region(_region_values, (2, 2), "U3")
    liar = td.from_region(lambda r: np.zeros((1, 1)), (4, 4), "float64", chunks=2)
    with pytest.raises(ValueError, match=r"returned float64 of shape \(1, 1\) for the region "
                                         r"\[\(0, 2\), \(0, 2\)\], which has shape \(2, 2\)"):
        td.to_numpy(liar + 1.0)
    floats_as_ints = td.from_region(_region_values, (4, 4), "int64", chunks=2)  # no silent truncation
    with pytest.raises(TypeError, match=r"returned float64 .* the array is int64, and float64 does not cast"):
        td.to_numpy(floats_as_ints + 1)
    ints = td.from_region(lambda r: np.ones(tuple(s.stop - s.start for s in r), dtype=np.int32), (4, 4), "int64")
    _check(td.to_numpy(ints.sum()), np.int64(16))  # a safe cast is fine
    from tra_dask.programs import UniformRegion, uniform_array

    with pytest.raises(TypeError, match="need a float dtype, not int64"):
        uniform_array((3, 3), dtype="int64")
    with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
        UniformRegion((3, 3), seed=1.5)


def test_arrays_made_on_the_workers_on_cluster(client):
    """On 3 workers: the chunks are made where the plan puts them (free sources, no
    data from the client), in the chunking chosen with the plan."""
    from tra_dask.logical import FromFunction
    from tra_dask.programs import UniformRegion, uniform_array

    x, w = uniform_array((300, 200), seed=1), uniform_array((200, 90), seed=2)
    y = (x @ w).sum(axis=1)
    plan = y.plan(client)
    srcs = [n for n in plan.nodes if isinstance(n, PSource)]
    assert srcs and all(isinstance(n.source, FromFunction) and n.free for n in srcs)
    assert "(chosen)" in plan.stage("chunking").note
    xf = UniformRegion((300, 200), 1)((slice(0, 300), slice(0, 200)))
    wf = UniformRegion((200, 90), 2)((slice(0, 200), slice(0, 90)))
    _check(y.compute(client), (xf @ wf).sum(axis=1))


def test_dask_chunks_are_kept_when_they_are_good():
    """A dask input already cut the way the plan wants is not re-chunked."""
    x = np.random.default_rng(12).standard_normal((64, 48))
    dx = da.from_array(x, chunks=(32, 48))
    rel, plan = td.from_array(dx).sum(axis=1).to_relation(sites=2)
    assert "(kept)" in plan.stage("chunking").note
    _check(td.to_numpy(rel), x.sum(1))


def test_fuzz_findings_stay_fixed():
    """Cases a fuzzing campaign against numpy found (values, dtypes, errors)."""
    B = np.array([[True, True, False], [False, True, False]])
    # numpy counts booleans once any operand is numeric: no partial sum may be a logical or
    _check(td.to_numpy(td.einsum("a,bc->ab", np.ones(1), B)), np.einsum("a,bc->ab", np.ones(1), B))
    B2, w = np.array([[True, True, True], [True, False, True]]), np.array([1, 10])
    for sites in (1, 3):
        rel, _ = td.einsum("ij,ij,i->i", B2, B2, w).to_relation(sites=sites)
        _check(td.to_numpy(rel), np.einsum("ij,ij,i->i", B2, B2, w))
    # argmin/argmax: the first NaN wins, across chunks too
    for x in (np.array([1.0, np.nan, 0.0, 5.0]), np.array([3.0, np.nan, np.nan])):
        for ch in (1, 2):
            assert int(td.to_numpy(td.from_array(x, chunks=ch).argmin())) == int(np.argmin(x))
            assert int(td.to_numpy(td.from_array(x, chunks=ch).argmax())) == int(np.argmax(x))
    b = np.array([True, False, True])
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(td.to_numpy(td.from_array(b) / td.from_array(b)), b / b)
    a32 = np.array([1.0, -2.0], np.float32)
    for x, want in [(td.from_array(a32) + np.int64(1), a32 + np.int64(1)),
                    (td.from_array(a32) * np.float64(-0.5), a32 * np.float64(-0.5)),
                    (np.maximum(td.from_array(a32), np.float64(0)), np.maximum(a32, np.float64(0))),
                    (td.from_array(np.array([True, False])).sum(axis=()), np.array([True, False]).sum(axis=())),
                    (np.abs(td.from_array(b)), np.abs(b))]:
        assert x.dtype == want.dtype
        _check(td.to_numpy(x), want)
    irregular = da.from_array(np.arange(20.0).reshape(5, 4), chunks=((2, 3), (4,)))
    _check(td.to_numpy(td.from_array(irregular) * 2), np.arange(20.0).reshape(5, 4) * 2)
    with pytest.raises(ValueError, match=r"out of range"):
        td.from_array(a).transpose(2, 1)
    with pytest.raises(ValueError, match=r"axis 3 is out of range for the first operand"):
        td.tensordot(a, a.T, axes=([3], [0]))
    with pytest.raises(ValueError, match=r"repeat an axis"):
        td.tensordot(a, a, axes=([0, 0], [0, 1]))


def test_inputs_in_another_byte_order_as_matrices_or_masked_are_taken_as_numpy_takes_them():
    """Data read as big-endian ('>f8', from a file) computes like numpy's native arrays
    (views, reductions, products, einsum), from numpy, dask and relations; an
    ``np.matrix`` is an ndarray of its values; a masked array is refused where it
    enters, naming what to pass instead (the kernels would drop the mask); numpy's
    conjugate of a bool array is int8, as numpy's."""
    import dask.array as da

    x = np.arange(30, dtype=">f8").reshape(6, 5)
    for a in (td.from_array(x), td.from_array(da.from_array(x, chunks=(3, 2))),
              td.from_array(td.from_numpy(x, (3, 5)))):
        assert a.dtype == np.float64 and a.dtype.isnative
        np.testing.assert_array_equal(td.to_numpy(a.T @ a), x.T @ x)
        np.testing.assert_array_equal(td.to_numpy(a[::2, ::-1]), x[::2, ::-1])
        np.testing.assert_array_equal(td.to_numpy(-a.reshape(5, 6).sum(axis=0)), -x.reshape(5, 6).sum(axis=0))
        np.testing.assert_array_equal(td.to_numpy(td.einsum("ij->ji", a)), x.T)
    i = np.arange(12, dtype=">i2").reshape(3, 4)
    np.testing.assert_array_equal(td.to_numpy(td.from_array(i) * 3), i * 3)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # (numpy's own on np.matrix)
        M = np.asmatrix(np.arange(6.0).reshape(2, 3))
    got = td.to_numpy(td.from_array(M).sum(axis=0))
    assert type(got) is np.ndarray and got.shape == (3,)
    np.testing.assert_array_equal(got, np.asarray(M).sum(axis=0))
    m = np.ma.masked_array(np.arange(12.0).reshape(4, 3), np.arange(12).reshape(4, 3) > 6)
    for make in (lambda: td.from_array(m), lambda: td.from_array(m, name="m"), lambda: td.matmul(m, m.T),
                 lambda: td.from_array(np.ones((4, 3))) + m, lambda: td.einsum("ij,kj->ik", m, m),
                 lambda: td.from_numpy(m, 2), lambda: td.from_array(da.from_array(m, chunks=2))):
        with pytest.raises(TypeError, match=r"masked arrays are not supported .*x\.filled\(value\)"):
            make()
    b = np.array([[True, False], [False, True]])
    got = td.to_numpy(np.conjugate(td.from_array(b)))
    assert got.dtype == np.conjugate(b).dtype == np.int8 and (got == b).all()
    assert td.from_array(b).conj().dtype == b.conj().dtype == np.bool_


def test_mean_accumulates_as_numpy_does_and_bad_axes_are_numpy_errors():
    """``mean`` sums integers and bools in float64 (an int64 sum of timestamps would
    wrap) and float16 in float32 (its sum overflows at 65504), as numpy; an axis that
    is not an integer is numpy's TypeError, naming the call, one out of range its
    AxisError (a ValueError)."""
    t = np.array([1_700_000_000_000_000_000 + i * 1_000_000_000 for i in range(10)], dtype=np.int64)
    for x in (t, t.reshape(2, 5), np.full((100, 100), 10, dtype=np.float16), np.ones((7, 3), bool),
              np.arange(12, dtype=np.uint8).reshape(3, 4) * 20):
        a = td.from_array(x)
        for axis in (None, 0, -1, ()):
            want = x.mean(axis=axis)
            got = td.to_numpy(a.mean(axis=axis))
            assert got.dtype == want.dtype, (x.dtype, axis)
            np.testing.assert_allclose(got, want, rtol=1e-6 if x.dtype == np.float16 else 1e-12)
        # (against float64: numpy's own var of this float16 array overflows in its mean, to inf)
        np.testing.assert_allclose(td.to_numpy(a.var()), x.astype(np.float64).var(), rtol=1e-3, atol=1e-6)
    X = td.from_array(np.arange(20.0).reshape(4, 5))
    for call, name in ((lambda: X.sum(axis=1.5), "sum"), (lambda: X.sum(axis="a"), "sum"),
                       (lambda: X.mean(axis=(0, 1.0)), "mean"), (lambda: X.sum(axis=True), "sum"),
                       (lambda: X.argmax(axis=(0, 1)), "argmax"), (lambda: X.cumsum(axis=(0,)), "cumsum")):
        with pytest.raises(TypeError, match=rf"td.Array.{name}: axis .* cannot be interpreted as an integer"):
            call()
    with pytest.raises(np.exceptions.AxisError, match=r"td.Array.sum: axis 5 is out of range"):
        X.sum(axis=5)
    assert td.to_numpy(X.sum(axis=np.array(1))).shape == (4,)  # (an integer scalar array is an axis, as numpy's)


def test_integer_and_bool_only_ops_after_other_elementwise_ops_plan():
    """A chain of elementwise ops fused into one kernel whose later stage takes no
    floats (``~``, ``&``, ``<<`` after a comparison or an add): its flops are counted
    from the stages' shapes, whatever the dtype (the count asked each stage about a
    float64 chunk, and ``invert`` refused it, in the planner)."""
    x, i = np.array([1.0, 2.0, 3.0, np.nan]), np.array([1, 2, 3, -4])
    X, I = td.from_array(x), td.from_array(i)
    for got, want in ((~(X < 2.0), ~(x < 2.0)), (~(I + 1), ~(i + 1)), (~np.isnan(X), ~np.isnan(x)),
                      (~((X > 0) | (X < 3)), ~((x > 0) | (x < 3))), ((I + 1) & 3, (i + 1) & 3),
                      ((I * 2) << 1, (i * 2) << 1), ((I - 1) >> 1, (i - 1) >> 1)):
        rel, plan = got.to_relation(sites=2)
        out = td.to_numpy(rel)
        assert out.dtype == want.dtype and plan.cost.seconds > 0
        np.testing.assert_array_equal(out, want)


def test_arg_reductions_of_large_unsigned_values_across_chunks():
    """uint64 values of 2**63 and above keep their order across chunks (the
    ``[value, index]`` pairs are uint64, not int64, where they wrapped negative)."""
    x = np.array([[1, 2**63 + 5, 3], [2**63 + 1, 0, 7]], dtype=np.uint64)
    for axis in (None, 0, 1):
        for op in ("argmax", "argmin"):
            got = td.to_numpy(getattr(td.from_array(x, chunks=1), op)(axis=axis))
            want = getattr(x, op)(axis=axis)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_array_api_checks_its_arguments_when_called():
    """Creation functions check the shape and dtype when called (not at compute);
    ``moveaxis`` checks its axes as numpy does; ``argmax(keepdims=True)`` over every
    axis keeps one of each; ``bool ** 2`` is numpy's square (int8)."""
    import tra_dask.array_api as xp

    with pytest.raises(ValueError, match=r"full: shape \(2, -1\)"):
        xp.full((2, -1), 1.0)
    with pytest.raises(TypeError, match=r"full: shape \(2.5, 3\) has extent 2.5 \(float\)"):
        xp.zeros((2.5, 3))
    with pytest.raises(TypeError, match=r"full: dtype <U3 is not supported"):
        xp.ones((2,), dtype="U3")
    assert td.to_numpy(xp.zeros((0, 3))).shape == (0, 3) and td.to_numpy(xp.zeros(())).shape == ()
    a = xp.ones((2, 3, 4))
    for src, dst in ((0, 5), (-4, 0)):
        with pytest.raises(np.exceptions.AxisError):
            xp.moveaxis(a, src, dst)
    with pytest.raises(ValueError, match="repeated axis"):
        xp.moveaxis(a, [0, 1], [2, 2])
    assert xp.moveaxis(a, [0, 1], [-1, -2]).shape == np.moveaxis(np.ones((2, 3, 4)), [0, 1], [-1, -2]).shape
    x = np.arange(12.0).reshape(3, 4)
    for op in ("argmax", "argmin"):
        got = td.to_numpy(getattr(xp, op)(td.from_array(x), keepdims=True))
        assert got.shape == getattr(np, op)(x, keepdims=True).shape == (1, 1)
    b = np.array([True, False])
    assert td.to_numpy(td.from_array(b) ** 2).dtype == (b ** 2).dtype == np.int8
    assert td.to_numpy(np.power(td.from_array(b), 2)).dtype == np.power(b, 2).dtype == np.int64


def test_reductions_of_a_0d_array_take_numpys_axis_0():
    """numpy's reductions (sum, prod, max, min, any, all, argmax, argmin) take the int
    axis 0 or -1 of a 0-d array as the whole of it (not a tuple, not mean's)."""
    x = np.array(3.0)
    X = td.from_array(x)
    for op in ("sum", "prod", "max", "min", "any", "all", "argmax", "argmin"):
        for axis in (0, -1):
            want = getattr(x, op)(axis=axis)
            got = td.to_numpy(getattr(X, op)(axis=axis))
            assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want) and got == want
        with pytest.raises(np.exceptions.AxisError):
            getattr(X, op)(axis=1)
    with pytest.raises(np.exceptions.AxisError):
        X.sum(axis=(0,))
    with pytest.raises(np.exceptions.AxisError):
        X.mean(axis=0)
