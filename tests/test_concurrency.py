"""Many threads submitting at once: on the shared embedded cluster (with different
``sites``), and 50 threads on one client for a while, every result exact.

``TRA_DASK_CONCURRENCY_SECONDS`` sets how long the 50 threads submit (default 5: each
thread finishes a few submissions, all 50 at once on 2 cores; for an hour-long soak,
``TRA_DASK_CONCURRENCY_SECONDS=3600 pytest tests/test_concurrency.py``)."""

import collections
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.programs import matmul
from tra_dask.runtime import workers_info

pytestmark = pytest.mark.cluster

SECONDS = float(os.environ.get("TRA_DASK_CONCURRENCY_SECONDS", "5"))
THREADS = 50

SHARED_EMBEDDED = textwrap.dedent("""
    import threading
    import numpy as np
    import tra_dask as td
    from tra_dask.programs import matmul
    from tra_dask.runtime import cluster, workers_info

    def mm(seed):
        y = np.random.default_rng(seed).random((64, 64))
        return y, matmul(*[td.from_numpy(y, (32, 32), name=f"Y{seed}")] * 2)

    if __name__ == "__main__":
        x, X2 = mm(0)
        first = td.submit(X2, sites=2)  # starts the embedded cluster: 2 workers
        np.testing.assert_allclose(first.to_numpy(), x @ x, rtol=1e-12)
        started = cluster._EMBEDDED["cluster"]
        errors, done = [], []

        def run(seed, sites):
            try:
                y, Y2 = mm(seed)
                got = td.to_numpy(Y2, td.compute(Y2, sites=sites, progress=False))
                np.testing.assert_allclose(got, y @ y, rtol=1e-12)
                done.append(sites)
            except Exception as e:
                errors.append(f"sites={sites}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=run, args=(i + 1, s)) for i, s in enumerate([2, 3, None] * 4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and len(done) == 12, errors
        assert cluster._EMBEDDED["cluster"] is started and first.client.status == "running"  # never restarted
        assert len(workers_info(first.client)) == 3  # scaled up for sites=3
        np.testing.assert_allclose(first.to_numpy(), x @ x, rtol=1e-12)  # earlier results stay usable
        one = td.submit(X2, sites=1)  # fewer sites: a subset of its workers
        assert len(one.lowered.workers) == 1 and len(workers_info(one.client)) == 3
        np.testing.assert_allclose(one.to_numpy(), x @ x, rtol=1e-12)
        print("SHARED OK")
""")


def test_threads_share_the_embedded_cluster(tmp_path):
    """Threads with sites=2, 3 and None at once on the embedded cluster (in a fresh
    process: the embedded cluster is per process): all exact, nothing restarted."""
    script = tmp_path / "shared_embedded.py"
    script.write_text(SHARED_EMBEDDED)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert p.returncode == 0 and "SHARED OK" in p.stdout, p.stderr[-3000:]


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster, set_as_default=False) as c:
        td.cluster_spec(c)  # calibrated once up front (a first calibration is not shared between threads yet)
        yield c


def _submission(client, i: int, rng, shared) -> None:
    """One submission, checked against numpy: kinds and sites vary with ``i``."""
    a, b = rng.random((64, 64)), rng.random((64, 64))
    sites = (2, 3, None)[i % 3]
    kind = i % 4 if shared is None else 4
    if kind == 0:  # relations, fresh data
        A, B = td.from_numpy(a, (32, 32), name="A"), td.from_numpy(b, (32, 32), name="B")
        rf = td.submit(matmul(A, B), client=client, sites=sites)
        got, want = rf.to_numpy(), a @ b
        assert not rf.recoveries, rf.recoveries
    elif kind == 1:  # arrays: chunking and plan chosen for this cluster
        got, want = td.compute(td.einsum("ij,jk->ik", a, b, chunks=32), client=client, sites=sites), a @ b
    elif kind == 2:
        got, want = td.compute(td.einsum("ij,kj->ik", a, b, chunks=32) + a, client=client, sites=sites), a @ b.T + a
    elif kind == 3:
        rows = td.aggregate(td.transform(td.from_numpy(a, (32, 32), name="A"), "row_sum"), (0,), "add")
        rf = td.submit(rows, client=client, sites=sites)
        got, want = rf.to_numpy(), a.sum(axis=1, keepdims=True)
        assert not rf.recoveries, rf.recoveries
    else:  # the same in-process inputs in every thread (sent once, kept on the workers)
        A, B, want = shared
        rf = td.submit(matmul(A, B), client=client, sites=sites)
        got = rf.to_numpy()
        assert not rf.recoveries, rf.recoveries
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _hammer(client, seconds: float, shared=None) -> collections.Counter:
    """THREADS threads submitting for ``seconds``; counts and the distinct errors."""
    workers = sorted(workers_info(client))
    counts, errors, lock = collections.Counter(), collections.Counter(), threading.Lock()
    stop = time.monotonic() + seconds

    def loop(t):
        rng, i = np.random.default_rng(t), t
        while time.monotonic() < stop:
            try:
                _submission(client, i, rng, shared)
                with lock:
                    counts["ok"] += 1
            except Exception as e:
                with lock:
                    counts["failed"] += 1
                    errors[f"{type(e).__name__}: {str(e)[:300]}"] += 1
            i += 1

    threads = [threading.Thread(target=loop, args=(t,), daemon=True, name=f"submitter-{t}") for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:  # a submission started before the deadline finishes after it
        t.join(max(1.0, stop + 120 - time.monotonic()))
    assert not [t.name for t in threads if t.is_alive()], "submitters still running 120 s after the deadline"
    print(f"{THREADS} threads, {seconds:g} s: {dict(counts)}")
    assert not errors, errors.most_common(5)
    assert counts["ok"] >= THREADS  # each thread finished at least one
    assert sorted(workers_info(client)) == workers  # no worker died or was removed
    return counts


@pytest.mark.timeout(SECONDS + 300)
def test_fifty_threads_submit_on_one_client(client):
    _hammer(client, SECONDS)


@pytest.mark.timeout(SECONDS + 300)
def test_fifty_threads_share_inputs(client):
    r = np.random.default_rng(99)
    x, y = r.random((64, 64)), r.random((64, 64))
    _hammer(client, SECONDS, (td.from_numpy(x, (32, 32), name="SX"), td.from_numpy(y, (32, 32), name="SY"),
                                       x @ y))
