"""A real cluster started with the `dask scheduler` and `dask worker` commands."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from distributed import Client

import tra_dask as td
from tra_dask.programs import matmul, random_uniform

DASK = str(Path(sys.executable).with_name("dask"))


def _start(args, env):
    return subprocess.Popen([DASK, *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def real_cluster(tmp_path):
    sched_file = tmp_path / "scheduler.json"
    env = dict(os.environ, DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH="1000000",
               DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__START="False",
               # kernels defined in test modules unpickle on the workers
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    procs = [_start(["scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(sched_file)], env)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            if procs[0].poll() is not None:
                pytest.fail(f"dask scheduler exited: {procs[0].stderr.read()}")
            time.sleep(0.1)
        for _ in range(2):
            procs.append(_start(["worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
                                 "--nworkers", "1", "--nthreads", "1", "--no-dashboard", "--no-nanny"], env))
        yield sched_file, procs
    finally:
        for p in procs[::-1]:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_submit_on_a_dask_scheduler_cluster(real_cluster):
    sched_file, procs = real_cluster
    address = json.loads(sched_file.read_text())["address"]
    assert address.startswith("tcp://127.0.0.1:")
    with Client(scheduler_file=str(sched_file), timeout="30s") as client:
        client.wait_for_workers(2, timeout=60)
        workers = client.scheduler_info()["workers"]
        assert all(w.startswith("tcp://127.0.0.1:") for w in workers)  # nothing bound to all interfaces
        X = random_uniform((600, 400), (200, 200), seed=3, name="X")
        Y = random_uniform((400, 300), (200, 150), seed=4, name="Y")
        rf = td.submit(matmul(X, Y), client=client)
        np.testing.assert_allclose(rf.to_numpy(), td.to_numpy(X) @ td.to_numpy(Y), rtol=1e-10, atol=1e-10)
        ran, planned = rf.ran_on(), rf.planned_on()
        assert set(ran) == set(planned) and all(ran[k] == w for k, w in planned.items())
        assert rf.transfers() == rf.plan.cost.bytes_moved
        # the time objective plans for this cluster, measured once and cached
        timed = td.submit(matmul(X, Y), client=client, objective="time")
        spec = td.cluster_spec(client)
        assert spec.sites == 2 and spec.source.startswith(f"calibrated on {address}")
        assert timed.plan.search.objective.cluster == spec and timed.transfers() == timed.plan.cost.bytes_moved
        np.testing.assert_allclose(timed.to_numpy(), td.to_numpy(X) @ td.to_numpy(Y), rtol=1e-10, atol=1e-10)
        client.shutdown()  # stops the scheduler and the workers this test started
    for p in procs:
        assert p.wait(timeout=30) is not None


def test_dask_native_on_a_dask_scheduler_cluster(real_cluster):
    """Dask's own calls, the open client, a lying kernel, reductions to dask arrays and
    data sent once — on `dask scheduler`/`dask worker` processes."""
    from helpers import binary_liar
    from test_dask_native import check_dask_protocols

    sched_file, procs = real_cluster
    with Client(scheduler_file=str(sched_file), timeout="30s") as client:  # the default client
        client.wait_for_workers(2, timeout=60)
        x = np.random.default_rng(7).random((400, 300))
        X = td.from_numpy(x, (200, 150), name="X")
        C = matmul(X, td.from_numpy(x.T.copy(), (150, 200), name="XT"))
        rf = td.submit(C)  # no client passed: the open one
        assert rf.client is client
        check_dask_protocols(client, rf, td.evaluate(C))
        sent = []
        scatter = client.scatter
        client.scatter = lambda data, *a, **k: sent.append(sum(v.nbytes for v in data.values())) or scatter(data, *a, **k)
        again = td.submit(C)
        np.testing.assert_allclose(again.to_numpy(), x @ x.T, rtol=1e-12)
        assert sum(sent) == 0 and again.transfers() == again.plan.cost.bytes_moved
        del client.scatter
        rows = td.aggregate(td.transform(X, "row_sum"), (0,), "add")
        np.testing.assert_allclose(td.submit(rows).to_dask_array().compute(), x.sum(axis=1, keepdims=True), rtol=1e-12)
        with pytest.raises(RuntimeError, match="kernel 'binary_liar'"):
            td.submit(td.aggregate(X, (0,), binary_liar)).to_numpy()
