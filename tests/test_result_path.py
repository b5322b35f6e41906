"""The result's way to the client: ``td.compute`` gathers straight from the workers
(one copy of the result in the client, not the scheduler's relay too), hands a
one-chunk result over as it came, and is priced by the time model (``td.submit``'s
plan is not: its results stay on the workers).  numpy is the oracle; no timings."""

import tracemalloc

import numpy as np
import pytest

import tra_dask as td
from tra_dask.optimizer.time import gather_seconds, plan_seconds
from tra_dask.programs import matmul
from tra_dask.runtime import arrays, gather as result_gather
from tra_dask.runtime.calibrate import cluster_spec


def test_gather_seconds_counts_what_the_call_does():
    spec = td.ClusterSpec(2, client_bandwidth=1e9, assemble_bandwidth=2e9)
    results = ((4e8, 4), (1e8, 1))
    assert gather_seconds(results, spec) == 0.0  # td.submit: the results stay on the workers
    assert gather_seconds(results, spec.gathering("chunks")) == pytest.approx(0.5)  # 5e8 bytes at 1 GB/s
    # assembled into arrays: the 4-chunk result is copied once more, the 1-chunk one is not
    assert gather_seconds(results, spec.gathering("array")) == pytest.approx(0.5 + 0.2)


def test_a_plans_results_are_priced_only_when_gathered(tmp_path):
    a = np.ones((60, 40))
    rel = matmul(td.from_numpy(a, (30, 40)), td.from_numpy(a.T.copy(), (40, 30)))
    spec = td.ClusterSpec(2)
    kept = td.optimize(rel, sites=2, objective="time", cluster=spec)
    got = td.optimize(rel, sites=2, objective="time", cluster=spec.gathering("array"))
    assert got.cost.results == ((60 * 60 * 8.0, 4),)  # a 2x2 grid of 30x30 float64 blocks
    extra = 60 * 60 * 8 / spec.client_bandwidth + 60 * 60 * 8 / spec.assemble_bandwidth
    assert got.cost.seconds == pytest.approx(plan_seconds(got.cost, spec)[0] + extra)
    assert kept.cost.seconds == pytest.approx(plan_seconds(kept.cost, spec)[0])
    # the call is not the cluster's: a saved spec does not keep it
    spec.gathering("array").save(tmp_path / "spec.json")
    assert td.ClusterSpec.load(tmp_path / "spec.json").gathers is None
    with pytest.raises(ValueError, match="gathers"):
        td.ClusterSpec(2, gathers="all")


@pytest.mark.slow
def test_compute_of_a_4200x280x4200_product(client):
    """The case of issue 43: two 70 MB result blocks took over a second to reach the
    client through the scheduler."""
    rng = np.random.default_rng(43)
    a, b = rng.standard_normal((4200, 280)), rng.standard_normal((280, 4200))
    x = td.einsum("ij,jk->ik", td.asarray(a), td.asarray(b))
    np.testing.assert_allclose(td.compute(x), a @ b, rtol=1e-10, atol=1e-9)
    assert result_gather.LAST["direct"] is True  # workers on 127.0.0.1: fetched from them, not via the scheduler

    workers = sorted(client.scheduler_info()["workers"])
    spec = cluster_spec(client, workers=workers)
    on_workers = arrays.plan_on(x, client, workers)  # what td.submit runs
    to_client = arrays.plan_on(x, client, workers, gathers="array")  # what td.compute runs
    nbytes = 4200 * 4200 * 8.0
    (result,) = to_client.cost.results
    assert result[0] == nbytes
    term = gather_seconds(to_client.cost.results, spec.gathering("array"))
    assert term >= nbytes / spec.client_bandwidth
    assert to_client.cost.seconds == pytest.approx(plan_seconds(to_client.cost, spec)[0] + term)
    assert on_workers.cost.seconds == pytest.approx(plan_seconds(on_workers.cost, spec)[0])

    # the gather holds the result once in this process (the scheduler, in this process
    # with a LocalCluster, held a second copy while it relayed the chunks)
    rf = td.submit(x).wait()
    tracemalloc.start()
    try:
        chunks = rf.gather()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sum(c.nbytes for c in chunks.values()) == nbytes
    assert peak < 1.2 * nbytes, f"gathering {nbytes / 1e6:.0f} MB held {peak / 1e6:.0f} MB at its peak"
    del chunks


def test_a_one_chunk_result_is_handed_over_without_a_copy(client):
    a = np.random.default_rng(1).standard_normal((1000, 1000))
    rf = td.submit(td.from_array(a, chunks=(1000, 1000)) * 2.0).wait()
    assert len(rf) == 1
    tracemalloc.start()
    try:
        got = rf.assembled()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got, a * 2.0)
    assert peak < 1.5 * a.nbytes, f"a {a.nbytes / 1e6:.0f} MB result held {peak / 1e6:.0f} MB (copied?)"
    got[0, 0] = -1.0  # the caller's own array: the cluster's chunk is unchanged
    np.testing.assert_array_equal(rf.assembled(), a * 2.0)
