"""Results behave like Dask collections; the open client is used; kernels are checked
on the workers; scattered data is sent once; any result becomes a dask array.
A real LocalCluster(processes=True) on 127.0.0.1 (the `dask scheduler`/`dask worker`
cluster versions are in test_real_cluster.py)."""

import subprocess
import sys
import textwrap
import time

import dask
import dask.array as da
import distributed
import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.programs import matmul
from tra_dask.runtime import cluster as runtime_cluster

from helpers import binary_liar as _binary_liar, dtype_liar as _dtype_liar, liar as _liar, ScatterSpy


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as c:  # the default client
        yield c


def _mm(n=6, chunks=(2, 2), seed=0):
    x = np.random.default_rng(seed).random((n, n))
    A = td.from_numpy(x, chunks, name="A")
    return x, matmul(A, A)


def _same(got: dict, want: dict):
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12)


def check_dask_protocols(client, rf, want: dict):
    """Dask's own calls on a RelationFutures (shared with the CLI-cluster test)."""
    distributed.wait(rf, timeout=60)
    assert all(f.done() for f in rf.values())
    assert {f.key for f in distributed.futures_of(rf)} == {f.key for f in rf.values()}
    (got,) = dask.compute(rf)
    _same(got, want)
    _same(rf.compute(), want)
    _same(client.compute(rf).result(timeout=60), want)
    _same(client.gather(dict(rf)), want)
    persisted = client.persist(rf)
    assert isinstance(persisted, td.RelationFutures) and set(persisted) == set(rf)
    _same(persisted.gather(), want)
    (p2,) = dask.persist(rf)
    assert isinstance(p2, td.RelationFutures)
    _same(p2.gather(), want)
    distributed.progress(rf)  # a text bar over the result's futures; returns when they are done
    x = rf.to_dask_array()
    np.testing.assert_allclose(x.compute(), td.to_numpy(rf.node, want), rtol=1e-12)


def test_dask_protocols_on_results(client):
    x, C = _mm()
    rf = td.submit(C, client=client)
    check_dask_protocols(client, rf, td.evaluate(C))


def test_the_open_client_is_used(client):
    before = dict(runtime_cluster._EMBEDDED)
    x, C = _mm(seed=1)
    rf = td.submit(C)  # no client given: the default one, not an embedded cluster
    assert rf.client is client
    assert runtime_cluster._EMBEDDED.get("client") is before.get("client")
    np.testing.assert_allclose(rf.to_numpy(), x @ x, rtol=1e-12)
    # a dask array persisted by the open client composes with submit (no "another cluster" error)
    X = td.from_dask_array(da.from_array(x, chunks=3))
    np.testing.assert_allclose(td.submit(matmul(X, X)).to_numpy(), x @ x, rtol=1e-12)
    np.testing.assert_allclose(td.compute(td.einsum("ij,jk->ik", x, x)), x @ x, rtol=1e-12)


@pytest.mark.parametrize("kernel, got", [(_liar, "(2, 1) and dtype float64"), (_dtype_liar, "(2, 2) and dtype float32")])
def test_a_lying_kernel_fails_on_the_worker_with_its_name(client, kernel, got):
    A = td.from_numpy(np.ones((4, 4)), (2, 2), name="A")
    rf = td.submit(td.transform(A, kernel), client=client)
    with pytest.raises(RuntimeError, match=rf"kernel '{kernel.name}' says \(2, 2\) and float64") as e:
        rf.to_numpy()
    assert got in str(e.value) and "chunk (" in str(e.value)
    with pytest.raises(RuntimeError, match=kernel.name):
        rf.to_dask_array().compute()
    with pytest.raises(RuntimeError, match=kernel.name):
        td.submit(td.transform(A, kernel), client=client).gather()


def test_lying_join_and_aggregation_kernels_fail_on_the_worker(client):
    A = td.from_numpy(np.ones((4, 4)), (2, 2), name="A")
    for rel in (td.join(A, A, (0, 1), (0, 1), _binary_liar), td.aggregate(A, (0,), _binary_liar)):
        with pytest.raises(RuntimeError, match=r"came out with shape \(1, 2\).*kernel 'binary_liar' says \(2, 2\)"):
            td.submit(rel, client=client).to_numpy()


def _reductions():
    rng = np.random.default_rng(5)
    x, y = rng.random((6, 8)), rng.random((4, 6, 8))
    A, A6 = td.from_numpy(x, (2, 3), name="A"), td.from_numpy(x[:, :6], (2, 3), name="A6")
    blocks = [x[i:i + 2, j:j + 3] for i in range(0, 6, 2) for j in range(0, 6, 3)]
    return {  # name: (relation, what numpy says, or None: the evaluator's assembly only)
        "total": (td.aggregate(A6, (), "add"), sum(blocks)),  # key (), one (2, 3) chunk
        "row sums": (td.aggregate(td.transform(A, "row_sum"), (0,), "add"), x.sum(axis=1, keepdims=True)),
        "block columns": (td.aggregate(A6, (1,), "add"), None),  # key (j,) indexes array dim 0
        "one number": (td.aggregate(td.transform(A, "row_sum"), (), "add"), None),
        "3-d, two key dims": (td.aggregate(td.from_numpy(y, (2, 3, 4)), (0, 2), "add"), None),
    }


@pytest.mark.parametrize("case", list(_reductions()))
def test_reductions_and_any_arity_become_dask_arrays(client, case):
    rel, want = _reductions()[case]
    arr = td.submit(rel, client=client).to_dask_array()
    ref = td.to_numpy(rel)  # the reference evaluator's assembly
    assert arr.shape == ref.shape and arr.dtype == ref.dtype
    np.testing.assert_allclose(arr.compute(), ref, rtol=1e-12)
    if want is not None:
        np.testing.assert_allclose(ref, want, rtol=1e-12)


def test_a_result_that_is_not_one_tensor_is_a_clear_error(client):
    A = td.from_numpy(np.ones((4, 4)), (2, 2), name="A")
    rel = td.rekey(A, lambda k: (k[0], k[1], 0))  # key arity 3 > chunk rank 2
    rf = td.submit(rel, client=client)
    with pytest.raises(ValueError, match="key arity 3 exceeds chunk rank 2"):
        rf.to_dask_array()


def test_in_process_data_is_sent_once(client):
    with ScatterSpy(client) as sent:
        x = np.random.default_rng(2).random((400, 300))
        y = np.random.default_rng(3).random((300, 200))
        X, Y = td.from_numpy(x, (100, 150), name="X"), td.from_numpy(y, (150, 100), name="Y")
        for i in range(3):
            sent.clear()
            rf = td.submit(matmul(X, Y), client=client)
            np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)
            # bytes between workers as predicted: copies earlier runs left are dropped first
            assert rf.transfers() == rf.plan.cost.bytes_moved
            assert sum(sent) == (x.nbytes + y.nbytes if i == 0 else 0)
        # a new relation over the same array finds the data too (same chunks, same workers)
        sent.clear()
        rf = td.submit(matmul(td.from_numpy(x, (100, 150)), Y), client=client)
        np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)
        assert sum(sent) == 0
        # changed data is sent again (only the chunk that changed), never a stale copy
        x[0, 0] += 1.0
        sent.clear()
        rf = td.submit(matmul(X, Y), client=client)
        np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)
        assert sum(sent) == 100 * 150 * 8
        # dropped on request: sent again
        assert td.drop_scattered(client) > 0
        sent.clear()
        td.submit(matmul(X, Y), client=client).wait()
        assert sum(sent) == x.nbytes + y.nbytes


def test_one_array_under_two_chunkings_is_sent_once_each(client):
    """A loop that uses one array under two chunkings keeps both cuts on the workers
    (they used to evict each other's: every submit sent the array again)."""
    with ScatterSpy(client) as sent:
        rng = np.random.default_rng(9)
        x, y = rng.random((400, 300)), rng.random((300, 200))
        Y = td.from_numpy(y, (150, 100), name="Y")
        cuts = [td.from_numpy(x, (100, 150), name="X100"), td.from_numpy(x, (200, 150), name="X200")]
        for turn in range(4):
            sent.clear()
            rf = td.submit(matmul(cuts[turn % 2], Y), client=client)
            np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)
            if turn >= 2:  # both cuts (and Y) are on the workers from the first round
                assert sum(sent) == 0, (turn, sent)


def test_a_repeated_submission_hashes_each_array_once_not_its_chunks(client, monkeypatch):
    """Naming in-process chunks by content hashes data on every submission; a strided
    chunk is copied to be hashed.  Unchanged arrays are hashed whole (no copy), their
    chunks' names remembered; a changed array's chunks are hashed again."""
    import tra_dask.lowering as lowering

    hashed = []
    real = lowering.tokenize

    def spy(x, *a, **k):
        hashed.append(getattr(x, "shape", None))
        return real(x, *a, **k)

    monkeypatch.setattr(lowering, "tokenize", spy)
    x = np.random.default_rng(4).random((400, 300))
    y = np.random.default_rng(5).random((300, 200))
    X, Y = td.from_numpy(x, (100, 150), name="X"), td.from_numpy(y, (150, 100), name="Y")
    td.submit(matmul(X, Y), client=client).wait()
    assert (100, 150) in hashed  # the first submission names every chunk
    hashed.clear()
    rf = td.submit(matmul(X, Y), client=client)
    np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)
    assert sorted(hashed) == [(300, 200), (400, 300)]  # the two arrays, whole
    x[399, 299] = -1.0
    hashed.clear()
    rf = td.submit(matmul(X, Y), client=client)
    np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)
    # the changed array hashed whole, its chunks, then whole again (unchanged meanwhile: names kept)
    assert hashed.count((100, 150)) == 8 and hashed.count((400, 300)) == 2
    hashed.clear()
    td.submit(matmul(X, Y), client=client).wait()
    assert sorted(hashed) == [(300, 200), (400, 300)]
    # a non-contiguous array is not hashed whole (that would copy all of it): its chunks every time
    xt = x[:, :250]  # neither C- nor F-contiguous
    assert not (xt.flags.c_contiguous or xt.flags.f_contiguous)
    XT = td.from_numpy(xt, (100, 125), name="XT")
    for _ in range(2):
        hashed.clear()
        rf = td.submit(matmul(XT, td.from_numpy(y[:250], (125, 100), name="Y2")), client=client)
        np.testing.assert_allclose(rf.to_numpy(), xt @ y[:250], rtol=1e-12)
        assert hashed.count((100, 125)) == 8 and (400, 250) not in hashed


def test_chunk_names_found_while_the_array_changed_are_not_kept(client, monkeypatch):
    """Another thread changing the array while its chunks are hashed: the names found
    are not remembered, so a later submission hashes again (never a stale name)."""
    import tra_dask.lowering as lowering

    x = np.random.default_rng(6).random((200, 200))
    y = np.random.default_rng(7).random((200, 100))
    real, calls = lowering.content_token, []

    def racing(a):
        calls.append(a.shape)
        if a.shape == (100, 100) and len(calls) == 3:  # while the chunks are being named
            x[150, 150] += 1.0
        return real(a)

    monkeypatch.setattr(lowering, "content_token", racing)
    X, Y = td.from_numpy(x, (100, 100), name="X"), td.from_numpy(y, (100, 100), name="Y")
    td.submit(matmul(X, Y), client=client).wait()
    assert id(x) not in lowering._CHUNK_TOKENS  # the array changed meanwhile: nothing kept
    monkeypatch.setattr(lowering, "content_token", real)
    rf = td.submit(matmul(X, Y), client=client)
    np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)
    assert id(x) in lowering._CHUNK_TOKENS


def test_in_process_arrays_changed_between_submissions_never_give_stale_results(client):
    """Random in-place changes (a region, a single element, none) to a contiguous
    array and to a strided view of another, between submissions in two chunkings:
    every result equals numpy's on the data as it is at the submission."""
    rng = np.random.default_rng(11)
    x = rng.random((60, 40))
    base = rng.random((40, 90))
    y = base[:, ::2]  # 40 x 45, not contiguous
    for step in range(14):
        which, how = rng.integers(2), rng.integers(3)
        a = x if which == 0 else base
        if how == 1:
            i, j = rng.integers(0, a.shape[0] - 5), rng.integers(0, a.shape[1] - 5)
            a[i:i + 5, j:j + 5] = rng.random((5, 5))
        elif how == 2:
            a[tuple(rng.integers(0, n) for n in a.shape)] += 1.0
        cx, cy = ((20, 20), (20, 15)) if step % 2 else ((30, 10), (10, 45))
        rf = td.submit(matmul(td.from_numpy(x, cx, name="X"), td.from_numpy(y, cy, name="Y")), client=client)
        np.testing.assert_allclose(rf.to_numpy(), x @ y, rtol=1e-12)


def test_two_chunkings_of_one_memory_map_are_two_sets_of_chunks(client, tmp_path):
    """Dask's token of a memory map covers its bytes, not its shape: chunks of
    different shapes at the same key and the same bytes must still differ."""
    mm = np.memmap(tmp_path / "zeros.dat", dtype="float64", mode="w+", shape=(10, 10))
    ones = np.ones((10, 10))
    for chunks in ((2, 5), (5, 2)):
        A = td.from_numpy(mm, chunks, name="M")
        rf = td.submit(matmul(A, td.from_numpy(ones, (chunks[1], 10), name="O")), client=client)
        np.testing.assert_allclose(rf.to_numpy(), np.zeros((10, 10)))


def _run_script(tmp_path, body: str, timeout=120):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return p, time.monotonic() - t0


@pytest.mark.cluster
def test_embedded_cluster_results_compute_with_dask_calls(tmp_path):
    p, _ = _run_script(tmp_path, """
        import dask, numpy as np, tra_dask as td
        from tra_dask.programs import matmul

        if __name__ == "__main__":
            x = np.arange(36.0).reshape(6, 6)
            A = td.from_numpy(x, (3, 3))
            rf = td.submit(matmul(A, A), sites=2)  # the embedded cluster
            assert np.allclose(rf.to_dask_array().compute(), x @ x)
            (chunks,) = dask.compute(rf)
            assert np.allclose(td.to_numpy(rf.node, chunks), x @ x)
            assert np.allclose(td.submit(td.aggregate(A, (), "add")).to_dask_array().compute(),
                               sum(x[i:i + 3, j:j + 3] for i in (0, 3) for j in (0, 3)))
            print("OK")
    """)
    assert p.returncode == 0 and "OK" in p.stdout, p.stderr[-3000:]


@pytest.mark.cluster
def test_a_script_without_main_guard_gets_a_clear_error(tmp_path):
    p, took = _run_script(tmp_path, """
        import numpy as np, tra_dask as td
        A = td.from_numpy(np.ones((4, 4)), (2, 2))
        td.compute(td.aggregate(A, (), "add"))
    """, timeout=60)
    assert p.returncode != 0
    assert 'if __name__ == "__main__":' in p.stderr and "script.py, line 4" in p.stderr
    assert took < 30  # no worker process was started


def test_array_results_compute_to_arrays(client):
    rng = np.random.default_rng(11)
    a, b = rng.random((30, 20)), da.from_array(rng.random((20, 25)), chunks=(10, 5))
    want = np.maximum(a @ b.compute(), 0).sum(axis=1)
    r = td.submit(np.maximum(td.einsum("ij,jk->ik", a, b), 0).sum(axis=1))
    assert isinstance(r, td.ArrayFutures) and r.shape == (30,) and r.dtype == np.float64 and r.ndim == 1
    for got in (dask.compute(r)[0], r.compute(), client.compute(r).result(timeout=60), np.asarray(r), r.to_numpy(),
                r.to_dask_array().compute()):
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, want, rtol=1e-12)
    distributed.wait(r)
    s, m = td.submit((td.from_array(a).sum(), td.from_array(a).max(axis=0)))  # several results, one plan
    got_s, got_m = dask.compute(s, m)
    np.testing.assert_allclose(got_s, a.sum(), rtol=1e-12)
    np.testing.assert_allclose(got_m, a.max(axis=0), rtol=1e-12)


def test_a_submission_has_the_name_given_on_the_dashboard(client):
    from tra_dask.runtime.dashboard import TraScheduler

    x, C = _mm(seed=4)
    rf = td.submit(C, client=client, name="my product")
    r = td.submit(td.from_array(x).sum(), client=client, name="my sum")
    rf.wait(), r.wait()

    def names(dask_scheduler):
        return {t: p.record["name"] for t, p in dask_scheduler.plugins[TraScheduler.name].plans.items()}

    got = client.run_on_scheduler(names)
    assert got[rf.token] == "my product" and got[r.token] == "my sum"
