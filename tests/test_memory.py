"""Plans within real memory: the budget is the workers' memory *target* less their
baseline, measured on a real LocalCluster(processes=True) with a ``memory_limit``; a
plan over it is refused before anything is submitted, and the array front-end picks
a chunking under it — no worker is restarted (the scheduler's records say so)."""

import logging

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.programs import matmul
from tra_dask.runtime.submit import _memory_budget, memory_fraction

pytestmark = pytest.mark.cluster

LIMIT = 250_000_000


@pytest.fixture(scope="module")
def client():
    config = {"distributed.scheduler.active-memory-manager.start": False}
    with dask.config.set(config), LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0",
            memory_limit=LIMIT, silence_logs=logging.CRITICAL) as cl, Client(cl) as c:
        events = []
        c.subscribe_topic("all", events.append)
        c.removals = lambda: [e for _, e in events if isinstance(e, dict) and e.get("action") == "remove-worker"]
        yield c


def test_the_budget_is_the_target_less_the_baseline(client):
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    budget = _memory_budget(client, workers)
    baseline = client.run_on_scheduler(lambda dask_scheduler: max(
        ws.memory.unmanaged_old for ws in dask_scheduler.workers.values()))
    assert memory_fraction() == (0.6, "target")
    assert 30e6 < baseline < 150e6  # an interpreter with numpy and distributed loaded
    assert budget == pytest.approx(0.6 * LIMIT - baseline, rel=0.05)
    assert f"60% (target) of its memory_limit {LIMIT:,} bytes" in budget.why


def test_a_plan_over_the_budget_is_refused_before_submit(client):
    rng = np.random.default_rng(0)
    a = rng.random((4000, 4000))
    A, B = td.from_numpy(a, (2000, 2000), name="A"), td.from_numpy(a.T.copy(), (2000, 2000), name="B")
    free = td.plan_for(matmul(A, B), client, memory_limit=1e15)  # what the optimizer picks with no limit
    budget = _memory_budget(client, sorted(client.scheduler_info(n_workers=-1)["workers"]))
    kill = 0.95 * LIMIT - (0.6 * LIMIT - budget)  # the nanny's threshold, less the baseline
    # measured for this plan: about 290 MB per worker on top of the baseline — past the kill threshold
    assert free.cost.peak_bytes_per_site.max() > kill
    before = client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks))
    with pytest.raises(ValueError, match=r"no plan fits in [\d,]+ bytes per site.*memory_limit 250,000,000 bytes, "
                                         r"less the [\d,]+ bytes its process holds besides data"):
        td.submit(matmul(A, B), client=client)
    assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.tasks)) == before  # nothing sent
    assert not client.removals()


def test_the_array_front_end_chunks_to_fit(client, monkeypatch):
    import importlib

    runtime_submit = importlib.import_module("tra_dask.runtime.submit")
    # what earlier tests of this module left freed but held (garbage, malloc's free lists) goes
    # back first: the budget is measured from the workers' baseline, and this test is about
    # choosing a chunking under it, not about how much an earlier test left behind
    client.run(lambda: __import__("gc").collect())
    client.run(runtime_submit._trim_and_measure)
    rng = np.random.default_rng(1)
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    budget = _memory_budget(client, workers)  # 60% of 250 MB less a baseline of 60-85 MB

    def roomy_peak(n):  # the chunking chosen with no memory limit, planned keys only
        x = td.matmul(*(td.from_region(lambda region: None, (n, n), "float64") for _ in range(2)))
        return x.to_relation(sites=2)[1].cost.peak_bytes_per_site.max()

    # sized from the budget: the chunking chosen with no limit needs 12% more than the
    # budget per site (its peak grows as n²), and a finer one (a sixth less) fits it
    n = int(1730 * (1.12 * budget / roomy_peak(1730)) ** 0.5)
    a, b = rng.random((n, n)), rng.random((n, n))
    x = td.matmul(a, b)
    _, roomy = x.to_relation(sites=2)
    assert roomy.cost.peak_bytes_per_site.max() > budget
    seen = []  # the budgets planning used (the baseline is measured each time: it drifts a little)

    def spy(*args):
        seen.append(_memory_budget(*args))
        return seen[-1]

    monkeypatch.setattr(runtime_submit, "_memory_budget", spy)
    rf = td.submit(x, client=client)
    assert seen and rf.plan.cost.peak_bytes_per_site.max() <= seen[-1]
    np.testing.assert_allclose(rf.to_numpy(), a @ b, rtol=1e-10)
    assert not client.removals()  # no worker was restarted
    assert sorted(client.scheduler_info(n_workers=-1)["workers"]) == workers


def _keep_freed_memory(dask_worker, nbytes=200_000_000, block=65536):
    """Allocate ``nbytes`` in blocks malloc serves from its heap, free all but the last
    (which pins the heap's top): the process keeps the memory until malloc_trim."""
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(block) for _ in range(nbytes // block)]
    for p in blocks:
        ctypes.memset(p, 1, block)  # touched: resident
    for p in blocks[:-1]:
        libc.free(p)
    dask_worker._tra_test_pin = blocks[-1]
    return dask_worker.monitor.get_process_memory()


def test_memory_an_allocator_keeps_is_handed_back_before_a_plan_is_refused():
    """A worker that freed a lot keeps it (glibc's heap): Dask counts it as held, and a
    plan that fits once the worker hands it back was refused as if it did not."""
    import time

    limit = 600_000_000
    config = {"distributed.scheduler.active-memory-manager.start": False,
              "distributed.worker.memory.recent-to-old-time": "1s"}
    with dask.config.set(config), LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0",
            memory_limit=limit, silence_logs=logging.CRITICAL) as cl, Client(cl) as c:
        workers = sorted(c.scheduler_info()["workers"])
        roomy = _memory_budget(c, workers)
        c.run(_keep_freed_memory)
        old = lambda: c.run_on_scheduler(lambda dask_scheduler: max(  # noqa: E731
            ws.memory.unmanaged_old for ws in dask_scheduler.workers.values()))
        deadline = time.time() + 30
        while old() < 150e6 and time.time() < deadline:  # the freed memory counts as held (old) once it stayed
            time.sleep(0.2)
        tight = _memory_budget(c, workers)
        assert tight < roomy - 150e6
        # a sum over chunks made on the worker, its peak between the two budgets
        need = (tight + roomy) / 2
        n = int(need / 8 / 2000) // 100 * 100
        rel = td.aggregate(td.programs.random_uniform((n, 2000), (100, 2000)), (1,), "add")
        peak = td.optimize(rel, 1, memory_limit=1e15).cost.peak_bytes_per_site.max()
        assert tight < peak < roomy - 50e6, (tight, peak, roomy)
        plan = td.plan_for(rel, c)  # refused before the worker handed its freed memory back
        assert plan.cost.peak_bytes_per_site.max() == peak
        deadline = time.time() + 10
        while _memory_budget(c, workers) < peak and time.time() < deadline:  # and Dask sees it back, too
            time.sleep(0.2)
        assert _memory_budget(c, workers) > peak
