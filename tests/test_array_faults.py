"""What most users call survives faults too: the array front-end (``td.einsum``,
``td.Array``) under a lost worker, a chained result, Dask's Active Memory Manager and
a dask input that raises.  Real LocalCluster(processes=True) workers killed with
SIGKILL; every wait is bounded."""

import logging
import os
import signal
import threading
import time

import dask
import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.programs.arrays import ffnn_sgd_step_array

pytestmark = pytest.mark.cluster  # every test starts a cluster of its own

CONFIG = {"distributed.scheduler.active-memory-manager.start": False}
# Dask's defaults (the AMM on), dropping replicas often
AMM = {"distributed.scheduler.active-memory-manager.start": True,
       "distributed.scheduler.active-memory-manager.interval": "200ms"}
N, B = 300, 100  # 3x3 blocks


def values(region):
    """Small integers (products and sums of them are exact in float64), the same
    whatever the cut."""
    i = np.arange(region[0].start, region[0].stop)[:, None]
    j = np.arange(region[1].start, region[1].stop)[None, :]
    return ((i * 7 + j * 3) % 11 - 5).astype("float64")


def slow_values(region):
    time.sleep(0.15)
    return values(region)


def full():
    return values((slice(0, N), slice(0, N)))


def boom(block):
    raise ValueError("boom")


def _cluster(n=3, **kw):
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address=None, silence_logs=logging.CRITICAL, **kw)


def _pid(client, worker):
    return client.run(os.getpid, workers=[worker])[worker]


def _kill(client, worker):
    os.kill(_pid(client, worker), signal.SIGKILL)


def _slow(name):
    return td.from_region(slow_values, (N, N), "float64", chunks=B, name=name)


@pytest.mark.timeout(180)
def test_a_worker_killed_during_an_einsum_costs_no_result():
    with dask.config.set(CONFIG), _cluster() as cl, Client(cl) as c:
        rf = td.submit(td.einsum("ij,jk->ik", _slow("a"), _slow("b")))
        assert isinstance(rf, td.ArrayFutures)
        assert rf._submission.outputs[0] is rf  # the user's object is the one recovery updates
        victim = rf.lowered.workers[1]
        time.sleep(0.6)
        _kill(c, victim)
        t0 = time.monotonic()
        np.testing.assert_array_equal(rf.to_numpy(), full() @ full())
        assert time.monotonic() - t0 < 90
        assert rf.recoveries and victim in rf.recoveries[0][1]
        assert victim not in rf.lowered.workers
        np.testing.assert_array_equal(np.asarray(rf), full() @ full())  # Dask's path: the same futures
        np.testing.assert_array_equal(dask.compute(rf)[0], full() @ full())


def _ffnn_step():
    rng = np.random.default_rng(0)
    X, W1, W2 = rng.random((64, 32)), rng.random((32, 16)) * 0.1, rng.random((16, 8)) * 0.1
    Y = np.eye(8)[rng.integers(0, 8, 64)]
    # fixed chunks: planning takes ~5 s, not the chunking search's ~15 s on two cores
    X, Y, W1, W2 = (td.from_array(v, chunks=32, name=n) for v, n in ((X, "X"), (Y, "Y"), (W1, "W1"), (W2, "W2")))
    step = ffnn_sgd_step_array(X, Y, W1, W2, 0.1)
    return step, td.to_numpy(step)


def _killed_while_submitted(client, step, delay):
    """``td.submit(step)`` with a worker SIGKILLed ``delay`` s after it began (while it
    plans, sends or runs); its results gathered."""
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    killer = threading.Timer(delay, os.kill, (_pid(client, workers[1]), signal.SIGKILL))
    killer.start()
    try:
        out = td.submit(step)
        return out, [o.to_numpy() for o in out]
    finally:
        killer.cancel()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_ffnn_array_step_survives_a_worker_killed_while_it_is_submitted():
    step, want = _ffnn_step()
    with dask.config.set(CONFIG), _cluster() as cl, Client(cl) as c:
        out, got = _killed_while_submitted(c, step, 0.5)
        assert isinstance(out, tuple) and all(isinstance(o, td.ArrayFutures) for o in out)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10)
        # the same step again (its plan cached: it is sent at once), a worker killed while it runs
        out = td.submit(step)
        assert all(o._submission.outputs[i] is o for i, o in enumerate(out))
        victim = out[0].lowered.workers[0]
        _kill(c, victim)
        for o, w in zip(out, want):
            np.testing.assert_allclose(o.to_numpy(), w, rtol=1e-10)
        assert out[0].recoveries == out[1].recoveries  # one submission, recovered once for both
        assert all(victim not in o.lowered.workers for o in out)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_worker_killed_while_the_cluster_is_calibrated(calibrating):
    """The first plan on a user's cluster measures it (seconds): a worker killed then
    fails that measurement's calls; the expression (two results) is planned again on
    the workers there are."""
    rng = np.random.default_rng(1)
    a, b = rng.random((64, 32)), rng.random((32, 48))
    A, B = td.from_array(a, chunks=16, name="A"), td.from_array(b, chunks=16, name="B")
    step, want = (td.einsum("ij,jk->ik", A, B), td.einsum("ij->j", A)), (a @ b, a.sum(axis=0))
    with dask.config.set(CONFIG), _cluster() as cl, Client(cl) as c:
        _, got = _killed_while_submitted(c, step, 0.5)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10)


@pytest.mark.timeout(180)
def test_a_chained_array_result_recovers():
    c_np = full()[::-1].copy()
    with dask.config.set(CONFIG), _cluster() as cl, Client(cl) as c:
        first = td.submit(td.einsum("ij,jk->ik", _slow("a"), _slow("b"))).wait()
        dark = first.to_dask_array()  # taken before the loss: it follows the recovery
        _kill(c, first.lowered.workers[0])
        y = td.einsum("ij,jk->ik", td.from_array(first), td.from_array(c_np, chunks=B))
        np.testing.assert_array_equal(td.submit(y).to_numpy(), full() @ full() @ c_np)
        assert first.recoveries
        np.testing.assert_array_equal(first.to_numpy(), full() @ full())
        np.testing.assert_array_equal(dark.compute(), full() @ full())


@pytest.mark.timeout(240)
def test_back_to_back_submissions_over_dask_arrays_with_the_memory_manager_on():
    x_np, y_np = full(), full().T.copy()
    with dask.config.set(AMM), _cluster() as cl, Client(cl) as c:
        assert c.run_on_scheduler(lambda dask_scheduler: dask_scheduler.extensions["amm"].running)
        x = da.from_array(x_np, chunks=B).persist()
        y = da.from_array(y_np, chunks=B).persist()
        for i in range(8):
            e = td.einsum("ij,jk->ik", td.from_array(x), td.from_array(y)) if i % 2 == 0 else \
                td.einsum("ij,kj->ik", td.from_array(y), td.from_array(x))
            want = x_np @ y_np if i % 2 == 0 else y_np @ x_np.T
            np.testing.assert_array_equal(td.submit(e).to_numpy(), want)


@pytest.mark.timeout(120)
def test_a_dask_input_whose_block_raises_gives_the_users_error():
    with dask.config.set(CONFIG), _cluster(n=2) as cl, Client(cl) as c:
        good = da.from_array(full(), chunks=B)
        bad = good.map_blocks(boom, dtype="float64")
        with pytest.raises(ValueError, match="boom"):
            td.submit(td.einsum("ij,jk->ik", td.from_array(bad), td.from_array(good))).to_numpy()
        with pytest.raises(ValueError, match="boom"):
            td.compute(td.from_array(bad) @ td.from_array(good))
        # the cluster is still usable
        np.testing.assert_array_equal(td.compute(td.from_array(good) @ td.from_array(good)), full() @ full())
