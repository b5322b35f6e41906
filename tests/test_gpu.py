"""GPU workers: cupy chunks everywhere numpy chunks go, the GPU terms of the time
model, GPU clusters.

The tests of formulas, dispatch and arguments run everywhere; those that need a
device (marked ``gpu``) skip, saying why, where cupy or a CUDA device is missing —
nothing here fakes a GPU result.  ``benchmarks/gpu.py`` runs them on a GPU machine.
"""

import dataclasses
import json

import dask
import numpy as np
import pytest

import tra_dask as td
from helpers import ScatterSpy
from tra_dask.runtime.calibrate import _gpu_rates, _gpu_spec_of
from tra_dask.kernels import content_digest, is_device, on_device_of, to_host
from tra_dask.optimizer.time import node_seconds_per_site, write_bandwidth
from tra_dask.physical import Broadcast, LocalAggregate, LocalJoin, Shuffle
from tra_dask.programs import matmul
from tra_dask.runtime.cluster import visible_gpus
from tra_dask.runtime.device import LAST, gather_device


def _gpus() -> int:
    return visible_gpus()


needs_gpu = pytest.mark.skipif(_gpus() == 0, reason="needs cupy and a CUDA device (none visible here)")

GPU = td.GpuSpec(memory=80e9, blas={"float32": 5e13, "float64": 4e13}, elementwise=3e11, to_host=2e10,
                 from_host=2.5e10, blas_half_size=1000.0, launch=2e-5, name="test device")


# -- everywhere: the content digest that names device chunks -------------------------------


def test_content_digest_names_content_shape_and_dtype():
    rng = np.random.default_rng(0)
    a = rng.random((37, 21))
    d = content_digest(a)
    assert d == content_digest(a.copy())
    assert d == content_digest(np.asfortranarray(a))  # the same elements in the same order
    assert d != content_digest(a.T.copy())
    assert d != content_digest(a.reshape(21, 37))
    assert d != content_digest(a.astype(np.float32))
    for i, j in [(0, 0), (36, 20), (18, 5)]:  # any one element changed: another name
        b = a.copy()
        b[i, j] = np.nextafter(b[i, j], 2.0)
        assert content_digest(b) != d
    odd = np.arange(13, dtype=np.uint8)  # bytes not a multiple of 8: padded, still exact
    assert content_digest(odd) != content_digest(np.r_[odd[:12], np.uint8(1)])


def test_content_digest_of_a_large_array_spans_blocks(monkeypatch):
    import tra_dask.kernels as K

    a = np.arange(10_000, dtype=np.float64)
    whole = content_digest(a)
    monkeypatch.setattr(K, "_DIGEST_BLOCK", 1000)  # many blocks: the same name
    assert content_digest(a) == whole
    b = a.copy()
    b[9_999] = -1
    assert content_digest(b) != whole


def test_numpy_chunks_pass_unchanged_and_stay_on_the_host():
    a, b = np.ones(3), np.zeros(3)
    assert on_device_of((a, b)) == (a, b)
    assert not is_device(a)
    assert to_host([1, 2]).tolist() == [1, 2]
    x = td.einsum("ij,jk->ik", np.ones((4, 3)), np.ones((3, 5)))
    assert isinstance(td.evaluate(x), np.ndarray) and isinstance(td.to_numpy(x), np.ndarray)
    assert not td.from_numpy(np.ones((4, 4)), 2).device


# -- everywhere: the spec and the time model's GPU terms ------------------------------------


def test_gpu_spec_checks_its_numbers_and_round_trips(tmp_path):
    with pytest.raises(ValueError, match="GpuSpec: memory must be a positive"):
        dataclasses.replace(GPU, memory=0)
    with pytest.raises(ValueError, match="not a dtype"):
        dataclasses.replace(GPU, blas={"fast": 1e12})
    with pytest.raises(TypeError, match="non-empty dict"):
        dataclasses.replace(GPU, blas={})
    with pytest.raises(TypeError, match="gpu must be a td.GpuSpec"):
        td.ClusterSpec(2, gpu="H100")
    spec = td.ClusterSpec(2, memory_per_site=200e9, gpu=GPU)
    assert spec.memory_budget == 80e9 and spec.on_host().memory_budget == 200e9 and spec.on_host().gpu is None
    assert GPU.blas_rate("float32") == 5e13 and GPU.blas_rate("float16") == 4e13  # not named: the slowest
    path = tmp_path / "spec.json"
    spec.save(path)
    assert json.loads(path.read_text())["gpu"]["name"] == "test device"
    assert td.ClusterSpec.load(path) == spec and hash(td.ClusterSpec.load(path)) == hash(spec)


def _plan(spec, n=2000, block=500, dtype=np.float64):
    def never(key):  # keys only: planning reads the types
        raise AssertionError("planning made a chunk")

    e = matmul(td.from_function(never, (n, n), block, dtype, name="A"),
               td.from_function(never, (n, n), block, dtype, name="B"))
    return td.optimize(e, sites=spec.sites, objective="time", cluster=spec)


def test_gpu_terms_of_each_node_are_the_formulas():
    host = td.ClusterSpec(2, bandwidth=1e9)
    dev = dataclasses.replace(host, gpu=GPU)
    plan = _plan(host)
    seen = set()
    for node, nc in plan.cost.nodes.items():
        t_host, t_dev = node_seconds_per_site(nc, host), node_seconds_per_site(nc, dev)
        if isinstance(node, (Broadcast, Shuffle)) and nc.recv_per_site is not None and nc.recv_per_site.any():
            item = node.type.dtype.itemsize
            extra = nc.send_per_site * item / GPU.to_host + nc.recv_per_site * item / GPU.from_host
            np.testing.assert_allclose(t_dev, t_host + extra, rtol=1e-12)
            seen.add("move")
        elif isinstance(node, LocalJoin) and nc.flops_per_site.any():
            chunk = node.children[0].type.shapes[0][0]  # n of the n x n x n block products
            rate = GPU.blas["float64"] / (1 + GPU.blas_half_size / chunk)
            want = (nc.flops_per_site / rate + nc.made_per_site / write_bandwidth(dev)
                    + nc.tasks_per_site * GPU.launch)
            np.testing.assert_allclose(t_dev, want, rtol=1e-9)
            seen.add("product")
        elif isinstance(node, LocalAggregate) and nc.flops_per_site.any():
            want = (nc.flops_per_site / GPU.elementwise + nc.made_per_site / write_bandwidth(dev)
                    + nc.tasks_per_site * GPU.launch)
            np.testing.assert_allclose(t_dev, want, rtol=1e-9)
            seen.add("sum")
    assert {"product", "sum"} <= seen


def test_a_measured_device_link_prices_moves_end_to_end():
    host = td.ClusterSpec(2, bandwidth=1e9)
    dev = dataclasses.replace(host, gpu=dataclasses.replace(GPU, link=3e9))
    plan = _plan(host)
    moved = 0
    for node, nc in plan.cost.nodes.items():
        if isinstance(node, (Broadcast, Shuffle)) and nc.recv_per_site is not None and nc.recv_per_site.any():
            want = (nc.recv_per_site + nc.send_per_site) * node.type.dtype.itemsize / 3e9
            np.testing.assert_allclose(node_seconds_per_site(nc, dev), want, rtol=1e-12)
            moved += 1
    assert moved
    with pytest.raises(ValueError, match="link must be a positive"):
        dataclasses.replace(GPU, link=-1.0)


def test_workers_sharing_a_device_each_get_their_share():
    host = td.ClusterSpec(2, bandwidth=1e9, memory_per_site=200e9)
    one = dataclasses.replace(host, gpu=GPU)
    two = dataclasses.replace(host, gpu=dataclasses.replace(GPU, sharing=2))
    assert two.memory_budget == GPU.memory / 2
    plan = _plan(host)
    for node, nc in plan.cost.nodes.items():
        t_host, t1, t2 = (node_seconds_per_site(nc, s) for s in (host, one, two))
        if isinstance(node, (Broadcast, Shuffle)) and nc.recv_per_site is not None:
            np.testing.assert_allclose(t2 - t_host, 2 * (t1 - t_host), rtol=1e-12)  # the copies halve
        elif nc.tasks_per_site is not None and nc.flops_per_site.any():
            launch = nc.tasks_per_site * GPU.launch  # a launch takes as long; the kernel's share halves
            np.testing.assert_allclose(t2 - launch, 2 * (t1 - launch), rtol=1e-12)


def test_a_gpu_plan_is_chosen_by_the_gpu_model_within_device_memory():
    host = td.ClusterSpec(4, bandwidth=1e9, memory_per_site=64e9)
    dev = dataclasses.replace(host, gpu=GPU)
    p_host, p_dev = _plan(host, 16000, 2000), _plan(dev, 16000, 2000)
    # the device's kernels are 1000x the host's: its plan is predicted far faster
    assert p_dev.cost.seconds < p_host.cost.seconds / 5
    # device memory is the hard limit: a GPU of too little memory for any plan fits none
    small = dataclasses.replace(host, gpu=dataclasses.replace(GPU, memory=1e6))
    with pytest.raises(td.optimizer.NoPlanFits):
        _plan(small, 16000, 2000)


def test_gpu_spec_from_each_workers_measurements():
    def one(scale):
        return {"memory": 80e9 * scale, "name": "dev", "float32@1024": 3e13, "float32@4096": 4.5e13,
                "float64@1024": 2e13 * scale, "float64@4096": 3e13 * scale, "elementwise": 1e11 * scale,
                "launch": 1e-5, "to_host": 1e10, "from_host": 1.2e10}

    g = _gpu_spec_of({"w0": one(1.0), "w1": one(2.0), "w2": one(1.5)})
    assert g.memory == 80e9  # the smallest device
    assert g.elementwise == 1.5e11  # the median worker
    # peak and half size through the two sizes: rate(n) = peak / (1 + half / n)
    peak, half = g.blas["float32"], g.blas_half_size
    np.testing.assert_allclose([peak / (1 + half / 1024), peak / (1 + half / 4096)], [3e13, 4.5e13], rtol=1e-12)
    assert _gpu_spec_of({"w0": one(1.0), "w1": None}) is None  # a worker without a GPU: a host cluster
    assert _gpu_spec_of({"w0": one(1.0)}, sharing=2).sharing == 2


@pytest.mark.cluster
@pytest.mark.skipif(_gpus() > 0, reason="checks the answer where no GPU is visible")
def test_without_a_gpu_the_gpu_paths_say_so():
    assert _gpu_rates() is None
    assert gather_device(None, {}, {}) is None and LAST["path"] == "network" and "no device here" in LAST["why"]
    with pytest.raises(RuntimeError, match="no GPU is visible"):
        td.embedded_client(gpu=True)


# -- on a GPU ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cp():
    if _gpus() == 0:
        pytest.skip("needs cupy and a CUDA device (none visible here)")
    import cupy

    return cupy


@needs_gpu
def test_the_device_digest_equals_the_host_digest(cp):
    a = np.random.default_rng(1).random((300, 77)).astype(np.float32)
    assert content_digest(cp.asarray(a)) == content_digest(a)
    assert content_digest(cp.asarray(a)[:, 3:40]) == content_digest(a[:, 3:40])


@needs_gpu
def test_the_reference_evaluator_runs_on_cupy(cp):
    rng = np.random.default_rng(2)
    a, b = rng.random((300, 200)), rng.random((200, 150))
    ga, gb = cp.asarray(a), cp.asarray(b)
    x = td.einsum("ij,jk->ik", ga, gb)
    got = td.to_numpy(x)
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, a @ b, rtol=1e-10)
    dev = td.evaluate(x)
    assert is_device(dev)
    np.testing.assert_allclose(dev.get(), a @ b, rtol=1e-10)
    # reductions and numpy-style functions keep the data on the device
    y = td.asarray(ga)
    for expr, want in [(y.sum(axis=0), a.sum(0)), (y.max(axis=1), a.max(1)), (y.mean(), a.mean()),
                       (y.argmax(axis=0), a.argmax(0)), (np.tanh(y) * 2 - 1, np.tanh(a) * 2 - 1),
                       ((y @ gb).T, (a @ b).T), (y[10:120, :50], a[10:120, :50])]:
        out = td.evaluate(expr)
        assert is_device(out), expr
        np.testing.assert_allclose(out.get(), want, rtol=1e-10)
    # a relation of cupy chunks through the TRA API
    R = td.from_numpy(ga, (100, 100), name="R")
    sums = td.evaluate(td.aggregate(R, (1,), "add"))
    assert all(is_device(c) for c in sums.values())
    np.testing.assert_allclose(td.to_numpy(td.aggregate(R, (1,), "add")),
                               td.to_numpy(td.aggregate(td.from_numpy(a, (100, 100)), (1,), "add")), rtol=1e-12)


@needs_gpu
def test_mixed_numpy_and_cupy_inputs_compute_on_the_device(cp):
    rng = np.random.default_rng(3)
    a, b = rng.random((64, 48)), rng.random((48, 32))
    x = td.einsum("ij,jk->ik", cp.asarray(a), b)
    out = td.evaluate(x)
    assert is_device(out)
    np.testing.assert_allclose(out.get(), a @ b, rtol=1e-10)
    np.testing.assert_allclose(td.to_numpy(td.asarray(cp.asarray(a)) + a), 2 * a)


@needs_gpu
def test_a_kernel_that_lies_about_its_output_fails_naming_itself_on_cupy(cp):
    liar = td.kernel(lambda x: x.astype(cp.float32), name="gpu_liar_test", shape="same", dtype="float64",
                     flops="elementwise")
    R = td.from_numpy(cp.ones((4, 4)), 2, name="R")
    with pytest.raises(RuntimeError, match="gpu_liar_test"):
        td.evaluate(td.transform(R, liar))


@pytest.fixture(scope="module")
def gpu_client(cp):
    from distributed import Client, LocalCluster

    # (Dask's default start of worker processes, spawn: CUDA in a forked process is not for this test)
    with dask.config.set({"distributed.worker.multiprocessing-method": "spawn"}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address="127.0.0.1:0") as cluster, Client(cluster, set_as_default=False) as c:
        yield c


@needs_gpu
def test_cupy_arrays_on_gpu_workers(cp, gpu_client):
    rng = np.random.default_rng(4)
    a, b = rng.random((1000, 800)), rng.random((800, 600))
    ga, gb = cp.asarray(a), cp.asarray(b)
    x = td.einsum("ij,jk->ik", ga, gb)
    out = x.compute(client=gpu_client)
    assert is_device(out)  # as dask returns it for cupy chunks
    np.testing.assert_allclose(out.get(), a @ b, rtol=1e-10)
    assert LAST["path"] == "ipc", LAST  # gathered device to device, not through the host
    rf = td.submit(x, client=gpu_client)
    assert isinstance(rf.to_numpy(), np.ndarray) and rf.plan.on_device
    d = rf.to_dask_array()
    assert is_device(d._meta)
    np.testing.assert_allclose(to_host(d.compute(scheduler=gpu_client.get)), a @ b, rtol=1e-10)
    # the workers hold cupy chunks
    held = gpu_client.run(lambda dask_worker: sorted({type(v).__module__.split(".")[0]
                                                      for v in dask_worker.data.values()}))
    assert any("cupy" in mods for mods in held.values())


@needs_gpu
def test_cupy_data_is_sent_once(cp, gpu_client):
    with ScatterSpy(gpu_client) as sent:
        x = cp.asarray(np.random.default_rng(5).random((400, 300)))
        y = cp.asarray(np.random.default_rng(6).random((300, 200)))
        X, Y = td.from_numpy(x, (100, 150), name="X"), td.from_numpy(y, (150, 100), name="Y")
        for i in range(3):
            sent.clear()
            rf = td.submit(matmul(X, Y), client=gpu_client)
            np.testing.assert_allclose(rf.to_numpy(), (x @ y).get(), rtol=1e-12)
            assert sum(sent) == (x.nbytes + y.nbytes if i == 0 else 0)
        x[0, 0] += 1.0  # changed on the device: that chunk is sent again, never a stale copy
        sent.clear()
        rf = td.submit(matmul(X, Y), client=gpu_client)
        np.testing.assert_allclose(rf.to_numpy(), (x @ y).get(), rtol=1e-12)
        assert sum(sent) == 100 * 150 * 8


@needs_gpu
def test_dask_arrays_of_cupy_chunks(cp, gpu_client):
    import dask.array as da

    rng = np.random.default_rng(7)
    a, b = rng.random((800, 800)), rng.random((800, 400))
    A = gpu_client.persist(da.from_array(cp.asarray(a), chunks=400, asarray=False))
    B = gpu_client.persist(da.from_array(cp.asarray(b), chunks=400, asarray=False))
    out = td.einsum("ij,jk->ik", A, B).compute(client=gpu_client)
    assert is_device(out)
    np.testing.assert_allclose(out.get(), a @ b, rtol=1e-10)
    s = np.tanh(td.asarray(A)).sum(axis=0).compute(client=gpu_client)
    assert is_device(s)
    np.testing.assert_allclose(s.get(), np.tanh(a).sum(0), rtol=1e-10)


@needs_gpu
def test_calibrate_measures_the_gpus_and_plans_use_them(cp, gpu_client):
    spec = td.calibrate(gpu_client)
    assert spec.gpu is not None and spec.gpu.memory > 1e9
    assert spec.gpu.blas["float32"] > 1e12 and spec.gpu.to_host > 1e8 and spec.gpu.launch < 1e-2
    assert spec.gpu.link is not None and spec.gpu.link > 1e8  # two workers: the device ring was measured
    assert spec.gpu.sharing == 2 // min(2, _gpus())  # both workers on the first GPU unless told otherwise
    td.set_cluster_spec(gpu_client, spec)
    a = cp.ones((2048, 2048), dtype=cp.float32)
    p_dev = td.einsum("ij,jk->ik", a, a).plan(client=gpu_client)
    p_host = td.einsum("ij,jk->ik", a.get(), a.get()).plan(client=gpu_client)
    assert p_dev.on_device and not p_host.on_device
    assert p_dev.cost.seconds < p_host.cost.seconds  # priced on the device, not the host's BLAS


_EMBEDDED_GPU = """
import numpy as np, cupy, tra_dask as td
if __name__ == "__main__":
    client = td.embedded_client(gpu=True)
    a = cupy.asarray(np.arange(12.0).reshape(4, 3))
    out = td.einsum("ij,kj->ik", a, a).compute()
    assert type(out).__module__.startswith("cupy"), type(out)
    np.testing.assert_allclose(out.get(), a.get() @ a.get().T)
    print("OK", type(client.cluster).__name__, len(client.scheduler_info()["workers"]))
"""


@pytest.mark.cluster
@needs_gpu
def test_the_embedded_cluster_with_gpu_workers(cp, tmp_path):
    import subprocess
    import sys

    script = tmp_path / "embedded_gpu.py"
    script.write_text(_EMBEDDED_GPU)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-4000:]
    try:
        import dask_cuda  # noqa: F401
    except Exception:
        assert "LocalCluster" in r.stdout  # without dask-cuda: workers share the GPU
    else:
        assert "LocalCUDACluster" in r.stdout, r.stdout  # one worker per GPU


@pytest.mark.cluster
@needs_gpu
def test_dask_cuda_worker_processes(cp, tmp_path):
    """A `dask scheduler` and `dask cuda worker` processes on 127.0.0.1, as a user starts them."""
    import subprocess
    import sys
    import time

    from distributed import Client

    try:
        import dask_cuda  # noqa: F401
    except Exception as e:
        pytest.skip(f"dask-cuda is not importable here ({type(e).__name__}: {e}); the gpu extra installs it")
    sched = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched)])]
    try:
        deadline = time.time() + 60
        while not sched.exists():
            assert procs[0].poll() is None and time.time() < deadline, "dask scheduler did not start"
            time.sleep(0.1)
        procs.append(subprocess.Popen([sys.executable, "-m", "dask", "cuda", "worker", "--scheduler-file", str(sched),
                                       "--host", "127.0.0.1", "--no-dashboard"]))
        with Client(scheduler_file=str(sched), timeout="30s", set_as_default=False) as client:
            client.wait_for_workers(1, timeout=60)
            rng = np.random.default_rng(8)
            a, b = rng.random((600, 500)), rng.random((500, 400))
            rf = td.submit(td.einsum("ij,jk->ik", cp.asarray(a), cp.asarray(b)), client=client)
            np.testing.assert_allclose(rf.to_numpy(), a @ b, rtol=1e-10)
            assert is_device(rf.assembled())
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
