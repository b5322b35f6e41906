"""The tra-dask command, run as a user would (a subprocess)."""

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tra_dask import __version__, cli
from helpers import stop_processes
from test_real_cluster import listening

TRA_DASK = [sys.executable, "-m", "tra_dask.cli"]
DASK = str(Path(sys.executable).with_name("dask"))
SMALL = ["--scale", "0.002", "--blocks", "2", "--no-progress"]


def tra_dask(*args, timeout=60):
    """Run the command; ``(completed process, seconds)``."""
    t0 = time.monotonic()
    out = subprocess.run([*TRA_DASK, *args], capture_output=True, text=True, timeout=timeout)
    return out, time.monotonic() - t0


def assert_one_line_error(out, elapsed, message):
    assert out.returncode != 0, out.stdout
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
    assert out.stderr.startswith("tra-dask: error: ") and message in out.stderr, out.stderr
    assert elapsed < 45  # an error, not a hang (its own timeouts are 5 s; generous for a loaded machine)


@pytest.mark.cluster
@pytest.mark.parametrize("shape,dtype", [("general", "float64"), ("common-large-dim", "float32"), ("two-large-dims", "float64")])
def test_run_matmul_checks_against_numpy(shape, dtype):
    out, _ = tra_dask("run", "matmul", "--shape", shape, "--scale", "0.002", "--blocks", "3", "--dtype", dtype,
                      "--no-progress", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "-> OK" in out.stdout
    line = next(line for line in out.stdout.splitlines() if "bytes moved between workers" in line)
    assert line.split("predicted ")[1].split(",")[0] == line.split("measured ")[1]  # e.g. 76.3 MiB both
    assert "embedded LocalCluster on 127.0.0.1, 2 workers, 2 sites" in out.stdout  # the embedded default
    assert "dashboard: http://127.0.0.1:" in out.stdout
    assert "aggregate(join(A, B, left_on=(1,), right_on=(0,), kernel='matmul'), group_by=(0, 2), kernel='add')" in out.stdout


def test_bad_arguments_fail_clearly():
    out, _ = tra_dask("run", "matmul", "--scale", "-1")
    assert out.returncode == 2 and "--scale, --blocks and --sites must be positive" in out.stderr


def test_version():
    out, _ = tra_dask("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"tra-dask {__version__}"


def test_explain_plans_without_a_cluster(monkeypatch, capsys):
    import distributed

    def no_cluster(*a, **k):
        raise AssertionError("explain started a cluster")

    monkeypatch.setattr(distributed.LocalCluster, "__init__", no_cluster)
    monkeypatch.setattr(distributed.Client, "__init__", no_cluster)
    assert cli.main(["explain", "matmul", "--scale", "0.01", "--sites", "3"]) == 0
    out = capsys.readouterr().out
    assert "plan for 3 sites: optimized" in out and "Plan on 3 site(s)" in out and "strategy:" in out
    assert "predicted bytes moved between workers: 2.4 MiB" in out
    assert "cluster:" not in out and "ran " not in out


def test_unexpected_errors_are_one_line_unless_debug(monkeypatch, capsys):
    def boom(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(cli, "explain_matmul", boom)
    assert cli.main(["explain", "matmul"]) == 1
    err = capsys.readouterr().err
    assert err == "tra-dask: error: RuntimeError: boom second line (--debug for the traceback)\n"
    for argv in (["--debug", "explain", "matmul"], ["explain", "matmul", "--debug"]):
        with pytest.raises(RuntimeError, match="boom"):
            cli.main(argv)


@pytest.mark.slow
def test_unreachable_scheduler_fails_at_once():
    out, elapsed = tra_dask("run", "matmul", "--scheduler", "tcp://127.0.0.1:1", *SMALL)  # a closed port
    assert_one_line_error(out, elapsed, "cannot reach a Dask scheduler at tcp://127.0.0.1:1 in 5 s")
    assert out.returncode == 2


@pytest.mark.cluster
def test_submit_overhead_benchmark_runs(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/submit_overhead.py", "--sizes", "50", "--repeat", "1", "--no-write"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ms/task" in out.stdout


@pytest.mark.slow
def test_optimizer_benchmark_quick_runs():
    out = subprocess.run([sys.executable, "benchmarks/optimizer_time.py", "--quick", "--no-write"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "matmul common-large-dim" in out.stdout and "chosen 1.00e+09" in out.stdout


# ---------------------------------------------------------------------------
# a cluster of `dask scheduler` and `dask worker` processes


@contextlib.contextmanager
def dask_cluster(directory: Path, n_workers: int):
    """The address of a `dask scheduler` with ``n_workers`` `dask worker` processes, all on 127.0.0.1."""
    sched_file = directory / "scheduler.json"
    env = dict(os.environ, DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH="1000000",
               DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__START="False")
    common = ["--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)]
    procs = []
    try:
        procs.append(subprocess.Popen([DASK, "scheduler", "--port", "0", *common], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            assert procs[0].poll() is None and time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.1)
        address = json.loads(sched_file.read_text())["address"]
        if n_workers:
            procs.append(subprocess.Popen([DASK, "worker", "--nthreads", "1", "--nworkers", str(n_workers), *common],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        while len(cli.scheduler_workers(address)) < n_workers:
            assert procs[1].poll() is None and time.monotonic() < deadline, "dask workers did not start"
            time.sleep(0.2)
        yield address
    finally:
        stop_processes(procs)


@pytest.fixture(scope="module")
def three_workers(tmp_path_factory):
    with dask_cluster(tmp_path_factory.mktemp("cli_cluster"), 3) as address:
        yield address


@pytest.mark.cluster
def test_a_scheduler_without_workers_fails_at_once(tmp_path):
    with dask_cluster(tmp_path, 0) as address:
        out, elapsed = tra_dask("run", "matmul", "--scheduler", address, *SMALL)
    assert_one_line_error(out, elapsed, f"the Dask scheduler at {address} has no workers")


def test_sites_default_to_the_schedulers_workers(three_workers):
    assert three_workers.startswith("tcp://127.0.0.1:")
    out, _ = tra_dask("run", "matmul", "--scheduler", three_workers, *SMALL, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"cluster: scheduler {three_workers}, 3 workers, 3 sites (all its workers; --sites to choose)" in out.stdout
    assert "plan for 3 sites" in out.stdout and "-> OK" in out.stdout
    out, _ = tra_dask("run", "matmul", "--scheduler", three_workers, "--sites", "2", *SMALL, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "3 workers, 2 sites (ready" in out.stdout and "-> OK" in out.stdout


def test_more_sites_than_workers_fails_at_once(three_workers):
    out, elapsed = tra_dask("run", "matmul", "--scheduler", three_workers, "--sites", "5", *SMALL)
    assert_one_line_error(out, elapsed, f"--sites 5 but the Dask scheduler at {three_workers} has 3 worker(s)")
    assert out.returncode == 2
    for debug in (["--debug", "run", "matmul"], ["run", "matmul", "--debug"]):
        out, _ = tra_dask(*debug, "--scheduler", three_workers, "--sites", "5", *SMALL)
        assert out.returncode != 0 and "Traceback" in out.stderr and "UsageError: --sites 5" in out.stderr


# ---------------------------------------------------------------------------
# --keep


def _lines(proc) -> queue.Queue:
    """The process's stdout lines, read by a thread (so that waiting on them can time out)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return lines


@pytest.mark.cluster
def test_keep_serves_the_dashboard_until_ctrl_c():
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # (SIGABRT dumps every thread's stack: a hang says where)
    # started with SIGINT ignored, as a test runner's worker may start it (it hung so: the
    # command must install its own handler)
    proc = subprocess.Popen([*TRA_DASK, "run", "matmul", *SMALL, "--keep"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        lines, deadline = _lines(proc), time.monotonic() + 120
        while "keeping the cluster up until Ctrl-C" not in (line := lines.get(timeout=deadline - time.monotonic())):
            pass
        status, page = re.search(r"dashboard (http://127\.0\.0\.1:\d+/status) \(this plan: (\S+)#\w+\)", line).groups()
        addrs = listening([proc])  # the command, its scheduler and dashboard, its worker processes
        assert len(addrs) >= 2 + 2 and {ip for ip, _ in addrs} == {"127.0.0.1"}, addrs
        body = {}
        for url in (status, page):
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.status == 200
                body[url] = r.read().decode()
        assert "Dask needs bokeh" not in body[status]  # the Bokeh dashboard renders
        assert "tra-dask run matmul general" in body[page]  # this submission, by the name the command gave it
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the command and its worker processes
        try:  # a clean exit, not a fast one
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGABRT)
            proc.wait(timeout=10)
            raise AssertionError(f"tra-dask run --keep did not exit after Ctrl-C; its stacks:\n{proc.stderr.read()[-8000:]}")
        assert rc == 0
        assert proc.stderr.read() == ""  # no tracebacks, from the command or its workers
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_progress_in_a_log_is_a_few_milestone_lines():
    lines = list(cli.progress_lines(1000, range(1000), clock=lambda: 0.0))
    assert [line.split("%")[0].strip() for line in lines] == ["25", "50", "75", "100"]
    assert "(250/1000 result chunks)" in lines[0] and "(1000/1000 result chunks)" in lines[-1]
    assert list(cli.progress_lines(1, range(1), clock=lambda: 0.0)) == ["  100% done (1/1 result chunks) after 0.0 s"]
    assert len(list(cli.progress_lines(3, range(3)))) == 3  # 25% and 50% are both the 2nd of 3: one line
    assert len(list(cli.progress_lines(8, range(3)))) == 1  # only the marks reached: 25%


@pytest.mark.cluster
def test_run_into_a_log_prints_milestones_not_a_bar():
    # stdout is a pipe here, as in `make demo > log`: no bar redrawn with carriage returns
    out, _ = tra_dask("run", "matmul", "--scale", "0.002", "--blocks", "3", timeout=120)
    assert out.returncode == 0, out.stderr
    assert "\r" not in out.stdout and "[####" not in out.stdout, out.stdout
    marks = [line for line in out.stdout.splitlines() if "% done (" in line]
    assert [m.split("%")[0].strip() for m in marks] == ["25", "50", "75", "100"], out.stdout
