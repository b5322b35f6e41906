"""Results are arrays: what ``td.submit`` returns for an array expression
(:class:`td.ArrayFutures`) is the operand of the next numpy-style expression without
leaving the workers — ``rf + 1``, ``rf.T``, ``numpy.tanh(rf)``, ``rf @ w`` build a lazy
``td.Array`` over the futures; numpy never gathers it silently.  On the shared
2-worker cluster, numpy as the oracle."""

import numpy as np
import pytest

import tra_dask as td
from tra_dask.logical import ClusterSource
from tra_dask.logical.nodes import toposort

RNG = np.random.default_rng(7)
X = RNG.standard_normal((40, 30))
W = RNG.standard_normal((30, 20))


def _reads_futures(expr: td.Array, rf) -> bool:
    """``expr``'s relation reads ``rf``'s chunks where they are (a cluster source)."""
    return any(isinstance(n, ClusterSource) and n.keeper is rf for n in toposort([expr.relation]))


CASES = [
    ("rf + 1", lambda r: r + 1, lambda x: x + 1),
    ("1 - rf", lambda r: 1 - r, lambda x: 1 - x),
    ("rf.T", lambda r: r.T, lambda x: x.T),
    ("np.tanh(rf)", lambda r: np.tanh(r), np.tanh),
    ("np.sin(rf)", lambda r: np.sin(r), np.sin),
    ("rf @ w", lambda r: r @ W, lambda x: x @ W),
    ("ndarray + rf", lambda r: np.ones(30) + r, lambda x: np.ones(30) + x),
    ("rf.sum(1)[:, None]", lambda r: r.sum(1)[:, None], lambda x: x.sum(1)[:, None]),
    ("rf[3]", lambda r: r[3], lambda x: x[3]),
    ("rf == rf", lambda r: r == r, lambda x: x == x),
    ("np.where", lambda r: np.where(r > 0, r, 0.0), lambda x: np.where(x > 0, x, 0.0)),
    ("np.std", lambda r: np.std(r, axis=0), lambda x: np.std(x, axis=0)),
    ("np.concatenate", lambda r: np.concatenate([r, r]), lambda x: np.concatenate([x, x])),
    ("softmax", lambda r: td.softmax(r), lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
]


ON_CLUSTER = ("rf + 1", "np.tanh(rf)", "rf @ w", "rf.sum(1)[:, None]", "np.where")


def test_results_are_array_operands_on_the_workers(client):
    rf = td.submit(td.from_array(X) * 2, client)
    assert isinstance(rf, td.ArrayFutures) and rf.shape == X.shape and rf.size == X.size
    run = []
    for name, f, g in CASES:
        e = f(rf)
        assert isinstance(e, td.Array), name
        assert _reads_futures(e, rf), name  # its chunks, where they are: nothing gathered to the client
        want = g(X * 2)
        got = td.to_numpy(e)  # the reference evaluator here (it fetches the chunks: asked for)
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)
        if name in ON_CLUSTER:
            run.append((name, e, want))
    got = td.compute(tuple(e for _, e, _ in run), client)  # on the workers, one plan for all of them
    for (name, _, want), v in zip(run, got):
        assert v.shape == want.shape and v.dtype == want.dtype, name
        np.testing.assert_allclose(v, want, rtol=1e-12, atol=1e-12, err_msg=name)


def test_chained_results_stay_on_the_cluster(client):
    r1 = td.submit(td.from_array(X) @ W, client)
    r2 = td.submit(np.tanh(r1) - r1.mean(axis=0), client)  # no client round trip in between
    assert isinstance(r2, td.ArrayFutures)
    assert not any(r2.lowered.scatter.values())  # nothing was sent from the client
    np.testing.assert_allclose(r2.compute(), np.tanh(X @ W) - (X @ W).mean(axis=0), rtol=1e-12)


def test_mapping_keys_and_clear_errors(client):
    rf = td.submit(td.from_array(X, chunks=(20, 30)), client)
    assert (0, 0) in rf and rf[(0, 0)].key  # a tuple of ints: the chunk's future (a Mapping)
    assert len(rf) == 2 and list(rf) == [(0, 0), (1, 0)]
    with pytest.raises(KeyError, match=r"for an element use r.array\[5, 5\]"):
        rf[5, 5]
    with pytest.raises(TypeError, match=r"does not support numpy.allclose"):
        np.allclose(rf, X)  # never a silent gather
    with pytest.raises(TypeError, match=r"numpy.add.reduce|as a plain call only"):
        np.add.reduce(rf)
    np.testing.assert_array_equal(np.asarray(rf), X)  # an explicit one


def test_a_plan_of_an_array_expression_submits_to_array_futures(client):
    plan = (td.from_array(X) @ W).plan(client)
    rf = td.submit(plan, client)
    assert isinstance(rf, td.ArrayFutures)
    np.testing.assert_allclose((rf + 1).compute(client), X @ W + 1, rtol=1e-12)


def test_submitted_arrays_are_arrays_to_compute_submit_and_plan(client):
    """A submitted array's futures are an array to ``td.compute``, ``td.submit`` and
    ``td.plan`` too, alone or in a tuple with other arrays (each read where it is)."""
    rf = td.submit(td.from_array(X) @ W, client)
    np.testing.assert_allclose(td.compute(rf, client), X @ W, rtol=1e-12)
    both = td.compute((rf, rf + 1), client)
    assert isinstance(both, tuple) and len(both) == 2
    np.testing.assert_allclose(both[0], X @ W, rtol=1e-12)
    np.testing.assert_allclose(both[1], X @ W + 1, rtol=1e-12)
    again = td.submit([rf * 2, td.from_array(X)], client)
    assert isinstance(again, (tuple, list)) and all(isinstance(a, td.ArrayFutures) for a in again)
    np.testing.assert_allclose(again[0].compute(), 2 * (X @ W), rtol=1e-12)
    from tra_dask.api import plan

    assert plan(rf, client).cost.floats_moved == 0  # read where it is: nothing moves
