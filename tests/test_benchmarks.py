"""Every workload benchmark runs in --quick mode (a smoke test: no timing assertions)."""

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"


@pytest.mark.parametrize("script", ["matmul.py", "ffnn.py", "nearest_neighbor.py"])
def test_quick_run(script):
    out = subprocess.run([sys.executable, script, "--quick", "--no-write"], cwd=BENCH, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("|")]
    systems = {line.split("|")[3].strip().split(":")[0] for line in rows}
    assert {"tra_dask chosen", "dask.array", "numpy"} <= systems


def test_profile_quick_run():
    """The per-plan profile (benchmarks/profile_plans.py) on the matmul shapes, small: a
    row per system with its breakdown, and tra_dask's tasks and bytes as it ran them
    (measured MiB = predicted MiB)."""
    out = subprocess.run([sys.executable, "profile_plans.py", "--quick", "--only", "matmul"], cwd=BENCH,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.stdout.splitlines() if line.startswith("| matmul")]
    assert [r[1] for r in rows] == ["tra_dask", "dask.array", "numpy"] * 3, out.stdout
    for r in rows[::3]:  # tra_dask: it ran tasks, its wall splits into parts that are not negative,
        # it has a predicted time, and it moved the bytes its plan predicts (on the placement both systems share)
        wall, predicted, tasks = float(r[2]), float(r[10]), int(r[11])
        assert tasks > 0 and wall > 0 and predicted > 0 and all(float(x) >= 0 for x in r[3:10])
        assert r[12] == r[13], r
