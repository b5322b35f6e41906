"""Calibration through the client it is given (issue 39): a ``Client(...,
set_as_default=False)`` and the command line's client of a ``--scheduler`` are not
the default client, and the first plan on a cluster without a kept spec calibrates
it — every call on that path goes through the explicit client
(``distributed.wait`` and friends ask for the default client: "No clients found")."""

import logging
import warnings

import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from test_cli import dask_cluster, tra_dask

pytestmark = pytest.mark.cluster


@pytest.fixture
def no_default_client(monkeypatch):
    """As in a process where no client is the default, whatever other tests left open:
    ``distributed.default_client()`` (and so ``distributed.wait``, ``get_client``, …)
    finds none."""
    import distributed.client

    monkeypatch.setattr(distributed.client, "_get_global_client", lambda: None)
    with pytest.raises(ValueError, match="No clients found"):
        distributed.client.default_client()


def test_submit_calibrates_through_a_client_that_is_not_the_default(calibrating, no_default_client):
    rng = np.random.default_rng(39)
    # small integers in float64: every sum is exact, whatever order the plan adds in
    a, b = rng.integers(-9, 10, (6, 4)).astype(float), rng.integers(-9, 10, (4, 5)).astype(float)
    with LocalCluster(processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        client = Client(cluster, set_as_default=False)
        try:
            from tra_dask.runtime.calibrate import CalibrationNotice

            with pytest.warns(CalibrationNotice, match=f"measuring the cluster at {client.scheduler.address}"):
                rf = td.submit(td.einsum("ij,jk->ik", td.asarray(a), td.asarray(b)), client=client)
            np.testing.assert_array_equal(rf.to_numpy(), np.einsum("ij,jk->ik", a, b))
            with warnings.catch_warnings():  # said once: the next plan on this cluster does not measure it
                warnings.simplefilter("error", CalibrationNotice)
                td.submit(td.einsum("ij,jk->ik", td.asarray(b.T), td.asarray(a.T)), client=client).wait()
            # it was measured (not the suite's kept spec), once, on this cluster
            spec = td.cluster_spec(client)
            assert spec.source.startswith(f"calibrated on {client.scheduler.address}"), spec.source
            assert spec.sites == 2
        finally:
            client.close()


def test_the_command_line_calibrates_a_dask_scheduler_cluster(tmp_path, monkeypatch):
    """``tra-dask run matmul --scheduler`` against `dask scheduler`/`dask worker`
    processes, with no kept spec: its first plan calibrates the cluster through the
    command's own client (not a default one), and the result checks against numpy."""
    monkeypatch.delenv("DASK_TRA_DASK__CLUSTER_SPEC", raising=False)  # the suite's kept spec (conftest.py)
    with dask_cluster(tmp_path, 2) as address:
        out, _ = tra_dask("run", "matmul", "--scheduler", address, "--scale", "0.002", "--blocks", "2",
                          timeout=240)
    assert out.returncode == 0, out.stderr
    assert f"calibrated on {address}" in out.stdout, out.stdout
    assert "-> OK" in out.stdout, out.stdout
