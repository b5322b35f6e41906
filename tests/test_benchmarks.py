"""Every workload benchmark runs in --quick mode (a smoke test: no timing assertions)."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

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


def test_time_model_runs_every_plan_of_a_round_on_one_placement():
    """benchmarks/time_model.py: each run gets its own copy of the inputs (new keys),
    made block by block on the workers Dask put the round's first copy on."""
    sys.path.insert(0, str(BENCH))  # (the workers, started below, import the blocks' maker from it too)
    try:
        _check_one_placement()
    finally:
        sys.path.remove(str(BENCH))


def _check_one_placement():
    import dask
    import numpy as np
    from distributed import Client, LocalCluster
    from time_model import Inputs

    with dask.config.set({"distributed.scheduler.active-memory-manager.start": False}):
        with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
            inputs = Inputs(client, seed=7)
            copies = []
            for _ in range(3):
                inputs.copy()
                copies.append((inputs((60, 40), (10, 20), "float32"), inputs((40,), (10,), "float64")))
            for k in range(2):
                names = {c[k].name for c in copies}
                assert len(names) == 3  # new keys every copy
                where = [{key[1:]: w for key, (w,) in client.who_has(c[k]).items()} for c in copies]
                assert where[0] == where[1] == where[2] and len(where[0]) == copies[0][k].npartitions
                assert all(c[k].dtype == copies[0][k].dtype and c[k].chunks == copies[0][k].chunks for c in copies)
                assert np.isfinite(copies[2][k].compute(scheduler=client.get)).all()


def test_time_model_quick_run():
    out = subprocess.run([sys.executable, "time_model.py", "--quick", "--runs", "2", "--only", "blocks 4x4x4",
                          "--no-write"], cwd=BENCH, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.stdout.splitlines() if line.startswith("| 2 |")]
    assert rows and rows[0][3].startswith("tra_dask chosen")
    assert all(float(r[4]) > 0 and float(r[5]) > 0 for r in rows), rows


def test_late_fusion_quick_run():
    """benchmarks/late_fusion.py: the time objective's plan with and without the
    small-granule rule, run on one placement; a row with both systems' times."""
    out = subprocess.run([sys.executable, "late_fusion.py", "--quick", "--only", "blocks 8x8x8"], cwd=BENCH,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.stdout.splitlines() if line.startswith("| 2 |")]
    assert len(rows) == 1, out.stdout
    before_min, before_tasks, granules_min, granules_tasks = float(rows[0][3]), int(rows[0][5]), float(rows[0][7]), \
        int(rows[0][9])
    assert before_min > 0 and granules_min > 0 and before_tasks > 0 and granules_tasks > 0


@pytest.mark.slow
def test_auto_chunking_quick_run(tmp_path):
    """benchmarks/auto_chunking.py on three of its shapes, small: a row per shape with
    auto's time over the best of at least 6 hand grids, a prediction for every plan
    timed, its distribution, and the workloads' table (one row per workload run)."""
    md = tmp_path / "auto.md"
    out = subprocess.run([sys.executable, "auto_chunking.py", "--quick", "--no-dask", "--markdown", str(md),
                          "--only", "row dot", "outer", "gram"], cwd=BENCH, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    text = md.read_text()
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| 2 |")]
    shapes = [r for r in table if len(r) == 11 and r[2] == "float64"]  # the comparison: one row per shape
    assert sorted(r[1].split()[0] for r in shapes) == ["gram", "outer-like", "row"], text
    for r in shapes:
        auto, best, ratio, worst, pred = float(r[3]), float(r[5]), float(r[6]), float(r[7]), float(r[9])
        # the ratio is of the unrounded times: it lies within what the printed ones (3 decimals) allow
        low, high = (auto - 5e-4) / (best + 5e-4), (auto + 5e-4) / max(best - 5e-4, 1e-9)
        assert 0 < best <= worst and auto > 0 and pred > 0 and low - 0.005 <= ratio <= high + 0.005, r
    workloads = [r for r in table if len(r) == 7]
    assert sorted(r[1] for r in workloads) == ["X.T @ X", "outer product", "row dot"], text
    every = [r for r in table if len(r) == 11 and r[2] != "float64"]  # every plan timed
    for shape in {r[1] for r in shapes}:
        plans = [r for r in every if r[1] == shape]
        assert len(plans) >= 7 and plans[0][2] == "auto", plans  # auto and at least 6 hand grids
        assert all(float(r[4]) > 0 and float(r[5]) > 0 for r in plans)
    # plans found identical (pooled) count once in the distribution
    distinct = {(r[1], frozenset([r[2], *filter(None, r[3].split(", "))])) for r in every}
    summary = next(line for line in text.splitlines() if line.startswith("Predicted (`plan.cost.seconds`"))
    assert f"over {len(distinct)} distinct plans timed" in summary, summary
    assert "rows within 1.2x" in text
