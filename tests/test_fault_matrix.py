"""The fault matrix (issue 39) on real LocalCluster(processes=True) workers on
127.0.0.1: {relation API, array front-end} × {SIGKILL at 25/50/90% of the run,
SIGSTOP, two workers one after the other, the worker holding scattered data} ×
{matmul, FFNN step, a chained result}.  The cells and faults are those of
``benchmarks/faults.py`` (which runs the whole matrix and times it); here a subset in
which every API, fault and workload occurs, each result checked against numpy and
each run bounded by the worker timeout + 90 s.  The SIGSTOP cell is a worker frozen
*before* a submission (its scatter meets it); the last test freezes one under
``rf.transfers()`` (``client.run``): the liveness watch removes it and the call
answers."""

import logging
import os
import signal
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.programs import matmul
from tra_dask.runtime.cluster import WorkersLeft, run_on_workers, worker_timeout

BENCH = str(Path(__file__).parents[1] / "benchmarks")
if BENCH not in sys.path:  # before any cluster starts: its workers import the cells' functions from there
    sys.path.insert(0, BENCH)

import faults  # noqa: E402  (benchmarks/faults.py)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

BOUND = 90  # seconds beyond the worker timeout that a call may take: a hang is not a result


@pytest.fixture(scope="module")
def client():
    """One 3-worker cluster for the module (a SIGKILLed worker's nanny starts a new one;
    the frozen worker removed in the last tests is not replaced)."""
    with dask.config.set(faults.CONFIG), LocalCluster(
            n_workers=faults.WORKERS, threads_per_worker=1, processes=True, host="127.0.0.1",
            dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL) as cl, Client(cl) as c:
        yield c


# every API, fault and workload at least once (the whole product: benchmarks/faults.py);
# the FFNN step once (its plan search takes 15-35 s here), the frozen worker last (it is
# not replaced)
CELLS = [
    ("relation", "kill at 25%", "matmul"),
    ("array", "kill at 50%", "FFNN step"),
    ("relation", "kill at 90%", "chain"),
    ("relation", "two kills (25%, 60%)", "matmul"),
    ("array", "scatter holder killed at 25%", "chain"),
    ("array", "SIGSTOP before the submission", "matmul"),
]


def test_the_subset_covers_every_row_and_column():
    assert {c[0] for c in CELLS} == set(faults.APIS)
    assert {c[1] for c in CELLS} == set(faults.FAULTS)
    assert {c[2] for c in CELLS} == set(faults.WORKLOADS)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("api, fault, workload", CELLS)
def test_a_fault_costs_no_result(client, api, fault, workload):
    work = faults.Workload(api, workload, n=300, block=100, delay=0.15)
    with dask.config.set(faults.CONFIG):
        assert faults.settle(client), "the killed workers' nannies did not start new ones"
        base, holder = faults.measure(client, work, repeat=1)  # exact with no failure too
        assert faults.settle(client)  # (a worker restarted by its nanny may leave again while it starts)
        before = faults.workers_of(client)
        seconds, exact, note, _ = faults.faulted(client, work, fault, base, holder)
        assert exact, (fault, note)
        assert seconds < worker_timeout() + BOUND
        after = set(faults.workers_of(client))
        if fault.startswith("SIGSTOP"):  # removed from the cluster, not waited for
            assert before[1] not in after
        if fault.startswith("two kills"):
            assert not {before[1], before[2]} & after
        if fault.startswith("scatter holder"):
            assert holder not in after


def _freeze(client, worker):
    pid = client.run(os.getpid, workers=[worker])[worker]
    os.kill(pid, signal.SIGSTOP)
    return pid


def _wake(pid):
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # its nanny ended it after the scheduler removed it
        pass


@pytest.mark.timeout(120)
def test_transfer_logs_and_client_run_are_watched(client):
    """A worker frozen after a result is done: ``rf.transfers()`` (``client.run`` on
    the workers) reads the logs of the others (the frozen one is removed: its log is
    lost with it, as a lost worker's) instead of waiting for it; ``run_on_workers`` on
    it then raises ``WorkersLeft`` naming it; ``td.einsum(...).compute()`` runs on the
    workers there are.  (After the SIGSTOP cell above: two workers, then one.)"""
    x = np.arange(300 * 300, dtype=float).reshape(300, 300) % 7
    with dask.config.set(faults.CONFIG):
        c = client
        rf = td.submit(matmul(td.from_numpy(x, (100, 100), name="X"), td.from_numpy(x, (100, 100), name="Y")))
        np.testing.assert_array_equal(rf.to_numpy(), x @ x)
        assert rf.transfers() == rf.plan.cost.bytes_moved  # all three logs
        workers = faults.workers_of(c)
        pid = _freeze(c, workers[0])
        try:
            t0 = time.monotonic()
            moved = rf.transfers()
            assert time.monotonic() - t0 < worker_timeout() + BOUND
            assert isinstance(moved, int) and 0 <= moved <= rf.plan.cost.bytes_moved
            assert workers[0] not in faults.workers_of(c)
            with pytest.raises(WorkersLeft, match="left the cluster") as e:
                run_on_workers(c, os.getpid, workers[:2])
            assert e.value.gone == {workers[0]}
            # and the next call runs on the workers there are
            got = td.einsum("ij,kj->ik", td.from_array(x, chunks=100), td.from_array(x, chunks=100)).compute()
            np.testing.assert_array_equal(got, x @ x.T)
        finally:
            _wake(pid)
