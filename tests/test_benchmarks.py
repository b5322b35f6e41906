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
