"""A real cluster started with the `dask scheduler` and `dask worker` commands."""

import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from distributed import Client

import tra_dask as td
from helpers import stop_processes
from tra_dask.programs import matmul, random_uniform

pytestmark = pytest.mark.cluster

DASK = str(Path(sys.executable).with_name("dask"))


def _start(args, env):
    """A ``dask`` process; its log goes to a file, read when it fails (a pipe nobody
    reads can fill with a lying kernel's tracebacks and block the process)."""
    log = tempfile.TemporaryFile("w+")
    p = subprocess.Popen([DASK, *args], env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
    p.log = log
    return p


def _log(p) -> str:
    p.log.seek(0)
    return p.log.read()


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
                pytest.fail(f"dask scheduler exited: {_log(procs[0])}")
            time.sleep(0.1)
        for _ in range(2):
            procs.append(_start(["worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
                                 "--nworkers", "1", "--nthreads", "1", "--no-dashboard", "--no-nanny"], env))
        yield sched_file, procs
    finally:
        stop_processes(procs)


def test_submit_on_a_dask_scheduler_cluster(real_cluster, calibrating):
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


def _slow_chunk(key):
    time.sleep(0.15)
    return np.random.default_rng(key[0] * 1000 + key[1]).random((100, 100))


@pytest.mark.timeout(180)
def test_a_killed_dask_worker_costs_no_result(real_cluster):
    """A `dask worker` process (no nanny) SIGKILLed while a plan runs: the plan resumes
    on the worker that is left, and the result is exact."""
    import signal

    sched_file, procs = real_cluster
    with Client(scheduler_file=str(sched_file), timeout="30s") as client:
        client.wait_for_workers(2, timeout=60)
        A = td.from_function(_slow_chunk, (600, 600), 100, "float64", name="A")
        rf = td.submit(matmul(A, A), client=client)
        victim = rf.lowered.workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        time.sleep(1.5)  # about half of the plan (36 loads of 0.15 s on 2 workers, then the products)
        os.kill(pid, signal.SIGKILL)
        t0 = time.monotonic()
        a = np.block([[np.random.default_rng(i * 1000 + j).random((100, 100)) for j in range(6)] for i in range(6)])
        np.testing.assert_allclose(rf.to_numpy(), a @ a, rtol=1e-12)
        assert time.monotonic() - t0 < 60
        assert len(rf.recoveries) == 1 and "resumed on 1 worker(s)" in rf.recoveries[0][1], rf.recoveries
        assert victim not in rf.lowered.workers
        client.shutdown()  # stops the scheduler and the workers this test started


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


# ---------------------------------------------------------------------------
# clusters started as docs/cli.md and notebook 04 say: nothing listens beyond 127.0.0.1

README = Path(__file__).parents[1] / "docs" / "cli.md"  # the commands moved there from the README
NOTEBOOK_04 = Path(__file__).parents[1] / "notebooks" / "04-real-cluster.ipynb"
DOC_PORT, DOC_DASHBOARD = "8786", "8787"  # the ports docs/cli.md's commands use, replaced by free ones here


def readme_commands(marker: str) -> list[list[str]]:
    """The commands of docs/cli.md's ```sh block that follows ``marker``, split as a shell would."""
    block = re.search(re.escape(marker) + r".*?```sh\n(.*?)```", README.read_text(), re.S).group(1)
    return [shlex.split(line.rstrip().removesuffix("&")) for line in block.splitlines() if line.strip()]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(procs) -> list[tuple[str, int]]:
    """``(ip, port)`` of every socket the processes (and their children) listen on."""
    out = []
    for p in procs:
        try:
            family = [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
        for q in family:
            try:
                out += [(c.laddr.ip, c.laddr.port) for c in q.net_connections(kind="inet")
                        if c.status == psutil.CONN_LISTEN]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return out


def _wait_for_workers(address: str, n: int, procs, sec=None, timeout: float = 60) -> None:
    from tra_dask import cli

    deadline = time.monotonic() + timeout
    while True:
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"exited: {dead}"
        try:
            if len(cli.scheduler_workers(address, sec)) >= n:
                return
        except cli.UsageError:  # not listening yet
            pass
        assert time.monotonic() < deadline, f"{n} workers did not join {address} in {timeout:g} s"
        time.sleep(0.2)


@contextlib.contextmanager
def documented_cluster(marker: str, cwd: Path, sec=None):
    """docs/cli.md's commands after ``marker`` (its ports replaced by free ones), run in
    ``cwd``: the `dask` ones started, waited for; yields ``(address, dashboard, procs,
    tra-dask argv lists)``."""
    port, dashboard = str(free_port()), str(free_port())

    def local(arg: str) -> str:
        return port if arg == DOC_PORT else arg.replace(f":{DOC_PORT}", f":{port}").replace(
            f":{DOC_DASHBOARD}", f":{dashboard}")

    lines = [[local(a) for a in line] for line in readme_commands(marker)]
    assert {line[0] for line in lines} == {"dask", "tra-dask"}, lines
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    procs = []
    try:
        for i, line in enumerate(line for line in lines if line[0] == "dask"):
            log = open(cwd / f"dask-{i}.log", "w")
            procs.append(subprocess.Popen([DASK, *line[1:]], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        runs = [[sys.executable, "-m", "tra_dask.cli", *line[1:]] for line in lines if line[0] == "tra-dask"]
        address = runs[0][runs[0].index("--scheduler") + 1]
        _wait_for_workers(address, sum(line[1] == "worker" for line in lines if line[0] == "dask"), procs, sec)
        yield address, f"http://127.0.0.1:{dashboard}", procs, runs
    finally:
        stop_processes(procs)


def test_the_readme_cluster_listens_on_loopback_only_and_runs_the_command(tmp_path):
    with documented_cluster("A cluster of your own on this machine", tmp_path) as (address, dashboard, procs, runs):
        assert address.startswith("tcp://127.0.0.1:")
        addrs = listening(procs)
        assert {ip for ip, _ in addrs} == {"127.0.0.1"}, addrs  # not 0.0.0.0, not ::
        assert int(address.rsplit(":", 1)[1]) in {p for _, p in addrs}
        assert int(dashboard.rsplit(":", 1)[1]) in {p for _, p in addrs}
        assert len(addrs) >= 1 + 1 + 2 * 3  # scheduler and dashboard; each worker: nanny, worker, dashboard
        out = subprocess.run(runs[0], cwd=tmp_path, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stderr
        assert f"cluster: scheduler {address}, 2 workers, 2 sites" in out.stdout and "-> OK" in out.stdout


def test_notebook_04_starts_a_cluster_that_listens_on_loopback_only():
    """The notebook's own cell that starts `dask scheduler` and `dask worker`, run here."""
    import nbformat

    cells = [c.source for c in nbformat.read(NOTEBOOK_04, 4).cells if c.cell_type == "code"]
    (start,) = [s for s in cells if '"scheduler"' in s and "Popen" in s]
    ns: dict = {}
    try:
        exec(compile(start, "04-real-cluster.ipynb", "exec"), ns)
        address = json.loads(ns["sched_file"].read_text())["address"]
        _wait_for_workers(address, 2, ns["procs"])
        addrs = listening(ns["procs"])
        assert addrs and {ip for ip, _ in addrs} == {"127.0.0.1"}, addrs
    finally:
        stop_processes(ns.get("procs", []))
        if "tmp" in ns:
            shutil.rmtree(ns["tmp"], ignore_errors=True)
