"""A worker that a plan is pinned to dies or freezes: the submission is planned again
on the workers there are and its results are exact.  Real LocalCluster(processes=True)
workers killed with SIGKILL or stopped with SIGSTOP; every wait is bounded."""

import functools
import logging
import os
import signal
import time

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.programs import ffnn_sgd_step, matmul

pytestmark = pytest.mark.cluster

CONFIG = {"distributed.scheduler.active-memory-manager.start": False}


def chunk(key):
    return np.random.default_rng(key[0] * 1000 + key[1]).random((100, 100))


def slow_chunk(key):
    time.sleep(0.15)
    return chunk(key)


A = td.from_function(slow_chunk, (600, 600), 100, "float64", name="A")


@functools.cache
def a_numpy():
    """A without the sleeps (computed on first use: workers import this module to
    unpickle slow_chunk, and must not pay for it)."""
    return np.block([[chunk((i, j)) for j in range(6)] for i in range(6)])


@functools.cache
def a_squared():
    return a_numpy() @ a_numpy()


def _cluster(n=3, **kw):
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address=None, silence_logs=logging.CRITICAL, **kw)


def _pid(client, worker):
    return client.run(os.getpid, workers=[worker])[worker]


def _kill_one_of(client, workers, sig=signal.SIGKILL):
    """Kill one of ``workers`` that is alive now; its address.  The workers alive are
    those that answer a call now (``client.scheduler_info()`` may answer from a cache
    that lists no worker)."""
    deadline, pids, victim = time.monotonic() + 30, {}, None
    while victim is None and time.monotonic() < deadline:
        try:
            pids = client.run(os.getpid)
        except OSError:  # (a connection the loaded machine did not make in time: asked again)
            pids = {}
        victim = next((w for w in workers if w in pids), None)
        if victim is None:
            time.sleep(0.5)
    assert victim is not None, f"none of {workers} is alive: the workers answering are {sorted(pids)}"
    os.kill(pids[victim], sig)
    return victim


@pytest.mark.timeout(240)
@pytest.mark.parametrize("when,calibrated", [(0.25, False), (0.9, True)])
def test_a_killed_worker_costs_no_result(when, calibrated, request):
    if calibrated:  # (the suite's kept spec otherwise)
        request.getfixturevalue("calibrating")
    with dask.config.set(CONFIG), _cluster() as cl, Client(cl) as c:
        td.cluster_spec(c)  # calibrated outside the timing below (the first plan would); the
        # recovery then plans on the survivors with this spec, not measuring again
        t0 = time.monotonic()
        np.testing.assert_allclose(td.submit(matmul(A, A)).to_numpy(), a_squared(), rtol=1e-12)
        base = time.monotonic() - t0
        rf = td.submit(matmul(A, A))
        victim = rf.lowered.workers[1]
        pid = _pid(c, victim)
        time.sleep(when * base)
        os.kill(pid, signal.SIGKILL)  # the nanny starts a new worker, under another address
        np.testing.assert_allclose(rf.to_numpy(), a_squared(), rtol=1e-12)
        assert len(rf.recoveries) == 1 and victim in rf.recoveries[0][1]
        assert victim not in rf.lowered.workers
        assert "resumed" in rf.recoveries[0][1]  # the unfinished part ran again, not the whole plan
        assert rf.transfers() > 0  # both parts' transfers, as the surviving workers logged them


@pytest.mark.timeout(240)
def test_two_workers_killed_one_after_the_other():
    with dask.config.set(CONFIG), _cluster(n=3) as cl, Client(cl) as c:
        rf = td.submit(matmul(A, A))
        first = rf.lowered.workers[0]
        os.kill(_pid(c, first), signal.SIGKILL)
        deadline = time.monotonic() + 60
        while first in rf.lowered.workers:  # the first recovery has run
            try:
                rf.wait(timeout=0.5)
            except TimeoutError:
                pass
            assert time.monotonic() < deadline
        second = rf.lowered.workers[-1]
        os.kill(_pid(c, second), signal.SIGKILL)
        np.testing.assert_allclose(rf.to_numpy(), a_squared(), rtol=1e-12)
        assert len(rf.recoveries) == 2
        assert first not in rf.lowered.workers and second not in rf.lowered.workers


@pytest.mark.timeout(240)
def test_a_frozen_worker_is_detected_and_the_plan_recovers():
    with dask.config.set({**CONFIG, "tra-dask.worker-timeout": "3s"}), _cluster(n=3) as cl, Client(cl) as c:
        rf = td.submit(matmul(A, A))
        victim = rf.lowered.workers[2]
        pid = _pid(c, victim)
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            np.testing.assert_allclose(rf.to_numpy(), a_squared(), rtol=1e-12)
            assert time.monotonic() - t0 < 60
            assert "stopped answering" in rf.recoveries[0][1]
            assert victim not in rf.lowered.workers
        finally:
            os.kill(pid, signal.SIGCONT)


@pytest.mark.timeout(240)
def test_compute_with_progress_and_chained_results_recover(capsys):
    rng = np.random.default_rng(0)
    X = td.from_numpy(rng.random((64, 32)), (32, 16), name="X")
    Y = td.from_numpy(np.eye(8)[rng.integers(0, 8, 64)], (32, 8), name="Y")
    W1 = td.from_numpy(rng.random((32, 16)) * 0.1, (16, 8), name="W1")
    W2 = td.from_numpy(rng.random((16, 8)) * 0.1, (8, 8), name="W2")
    want = td.evaluate(ffnn_sgd_step(X, Y, W1, W2, 0.1))
    with dask.config.set(CONFIG), _cluster(n=3) as cl, Client(cl) as c:
        first = td.submit(matmul(A, A))  # an earlier result, used as an input below
        nxt = td.transform(first, "neg")
        _kill_one_of(c, first.lowered.workers)
        # planning over the earlier result waits for it, which recovers it first
        np.testing.assert_allclose(td.submit(nxt).to_numpy(), -a_squared(), rtol=1e-12)
        assert first.recoveries
        # td.compute draws its bar without blocking: the waits behind it recover
        step = ffnn_sgd_step(X, Y, W1, W2, 0.1)
        out = td.submit(step)
        _kill_one_of(c, out[0].lowered.workers[::-1])
        got = td.compute(step)
        for g, w in zip(got, want):
            assert set(g) == set(w) and all(np.allclose(g[k], w[k]) for k in w)
        for r, w in zip(out, want):
            got_r = r.gather()
            assert all(np.allclose(got_r[k], w[k]) for k in w)
        assert "100% Completed" in capsys.readouterr().out


@pytest.mark.timeout(180)
def test_dask_calls_fail_at_once_and_work_after_the_recovery():
    """Dask's own calls on a result whose worker was lost raise at once (the tasks pinned
    there fail with WorkerLeft) instead of waiting forever; rf.wait() resumes the plan,
    and Dask's calls then give the exact result."""
    from distributed.client import FutureCancelledError

    from tra_dask.runtime.keeper import WorkerLeft

    with dask.config.set(CONFIG), _cluster(n=3) as cl, Client(cl) as c:
        rf = td.submit(matmul(A, A))
        victim = rf.lowered.workers[1]
        os.kill(_pid(c, victim), signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises((WorkerLeft, FutureCancelledError)):
            dask.compute(rf)
        assert time.monotonic() - t0 < 30
        rf.wait()
        assert len(rf.recoveries) == 1
        got = dask.compute(rf)[0]
        np.testing.assert_allclose(td.to_numpy(rf.node, got), a_squared(), rtol=1e-12)


@pytest.mark.timeout(180)
def test_a_running_plan_over_an_earlier_result_recovers_both():
    """A worker dies while a plan that reads an earlier result runs: the earlier result
    recovers first, then the plan (its input's chunks have new keys: planned again)."""
    with dask.config.set(CONFIG), _cluster(n=3) as cl, Client(cl) as c:
        first = td.submit(matmul(A, A)).wait()
        rf = td.submit(matmul(first, A))  # loads A again: about 2 s
        time.sleep(0.5)
        _kill_one_of(c, first.lowered.workers)
        np.testing.assert_allclose(rf.to_numpy(), a_squared() @ a_numpy(), rtol=1e-10)
        assert rf.recoveries
        np.testing.assert_allclose(first.to_numpy(), a_squared(), rtol=1e-12)  # recovered too if it lost chunks


def test_the_keeper_fails_a_stranded_task_once_and_not_while_the_scheduler_closes():
    """The scheduler plugin's part alone, over a stand-in for the scheduler's state:
    a tra_dask task pinned to a lost worker is failed once (Dask sends an erred
    task's erred dependents back to waiting when an input is released, so failing it
    each time it came back would cycle: on a closing scheduler, where every task is
    stranded at once, that cycle queued callbacks without end and the process never
    exited), and nothing is failed while the scheduler closes."""
    from types import SimpleNamespace

    from distributed.core import Status

    from tra_dask.runtime.keeper import TraKeeper

    key = ("LocalJoin-3-0123456789", 0)
    made = []

    class Scheduler:
        status = Status.running
        workers = {"tcp://127.0.0.1:2"}
        tasks = {key: SimpleNamespace(state="no-worker", worker_restrictions={"tcp://127.0.0.1:1"})}

        def transition(self, k, finish, **kw):
            made.append((k, finish, kw["exception_text"]))
            return {}

        def transitions(self, recs, stimulus_id):
            pass

    keeper = TraKeeper()
    keeper.scheduler = Scheduler()
    keeper._fail_if_stranded(key)
    keeper._fail_if_stranded(key)  # back in no-worker: failed already
    assert made == [(key, "erred", "worker tcp://127.0.0.1:1 left")]
    keeper.transition(key, "erred", "forgotten")  # forgotten: a later submission of the key may fail again
    keeper.scheduler.status = Status.closing
    keeper._fail_if_stranded(key)
    assert len(made) == 1
    keeper.scheduler.status = Status.running
    keeper._fail_if_stranded(key)
    assert len(made) == 2
    keeper.scheduler.tasks[key].worker_restrictions = {"tcp://127.0.0.1:2"}  # its worker is there: it will run
    keeper.transition(key, "erred", "forgotten")
    keeper._fail_if_stranded(key)
    assert len(made) == 2
