"""The tra-dask command, run as a user would (a subprocess)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("shape,dtype", [("general", "float64"), ("common-large-dim", "float32"), ("two-large-dims", "float64")])
def test_run_matmul_checks_against_numpy(shape, dtype):
    out = subprocess.run(
        [sys.executable, "-m", "tra_dask.cli", "run", "matmul", "--shape", shape, "--scale", "0.002",
         "--blocks", "3", "--dtype", dtype, "--no-progress"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "-> OK" in out.stdout
    predicted, measured = (line for line in out.stdout.splitlines() if "bytes moved between workers" in line), None
    line = next(predicted)
    assert line.split("predicted ")[1].split(",")[0] == line.split("measured ")[1]  # e.g. 76.3 MiB both
    assert "dashboard: http://127.0.0.1:" in out.stdout
    assert "aggregate(join(A, B, left_on=(1,), right_on=(0,), kernel='matmul'), group_by=(0, 2), kernel='add')" in out.stdout


def test_bad_arguments_fail_clearly():
    out = subprocess.run([sys.executable, "-m", "tra_dask.cli", "run", "matmul", "--scale", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--scale, --blocks and --sites must be positive" in out.stderr


def test_submit_overhead_benchmark_runs(tmp_path):
    out = subprocess.run([sys.executable, "benchmarks/submit_overhead.py", "--sizes", "50", "--repeat", "1", "--no-write"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ms/task" in out.stdout


def test_optimizer_benchmark_quick_runs():
    out = subprocess.run([sys.executable, "benchmarks/optimizer_time.py", "--quick", "--no-write"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "matmul common-large-dim" in out.stdout and "chosen 1.00e+09" in out.stdout
