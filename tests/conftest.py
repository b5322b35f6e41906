import logging
import os
import tempfile

import dask
import distributed.utils
import pytest

import tra_dask as td
from helpers import PAPER_A, PAPER_B

# Every cluster the suite starts would be calibrated on its first plan (3-5 s each, ~35
# clusters): the suite plans on one kept spec instead, as a user who saved one does
# (the Dask config tra-dask.cluster-spec, inherited by the notebooks', README's and
# command line's subprocesses). The tests of calibration and of the runtime calibrating
# on its own (test_time, the dask-scheduler cluster, a recovery) ask for `calibrating`.
_SPEC = os.path.join(tempfile.mkdtemp(prefix="tra-dask-tests-"), "cluster-spec.json")
td.ClusterSpec(16, source="defaults, kept for the test suite (tests/conftest.py)").save(_SPEC)
os.environ["DASK_TRA_DASK__CLUSTER_SPEC"] = _SPEC
dask.config.set({"tra-dask.cluster-spec": _SPEC})
# The clusters the suite starts in its own processes fork their workers from a server
# that imported distributed, numpy and tra_dask once (Dask's own test suite does the same):
# starting a worker costs a fork, not an interpreter importing them again.  The
# subprocesses (command line, notebooks, README, benchmarks, `dask worker`) keep Dask's
# default, spawn, as a user's script gets it; so does test_gpu.py's cluster (CUDA).
dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})
_mp = distributed.utils.get_mp_context()  # (sets Dask's preload list once; tra_dask joins it)
_mp.set_forkserver_preload(["distributed", "numpy", "tra_dask"])


@pytest.fixture
def calibrating():
    """The runtime calibrates each cluster on its first plan (the default outside
    the suite)."""
    with dask.config.set({"tra-dask.cluster-spec": None}):
        yield

# imported by the tests as `helpers`; collected for doctests it would be imported a second time
# (and register its kernels twice)
collect_ignore = ["helpers.py"]


@pytest.fixture
def RA():
    return td.from_numpy(PAPER_A, (2, 2), name="R_A")


@pytest.fixture
def RB():
    return td.from_chunks({(0,): PAPER_B[:, :4], (1,): PAPER_B[:, 4:]}, name="R_B")


# ---------------------------------------------------------------------------
# the fast lane: `pytest -m "not cluster and not slow"` (make test-fast)

# fixtures that start a Dask cluster (or processes of one): a test that asks for any
# of them is marked `cluster` (pyproject.toml registers the markers)
CLUSTER_FIXTURES = {"client", "cluster", "gpu_client", "tls_cluster", "three_workers"}


# parametrized cases that take seconds each (the other cases of these tests stay fast):
# the start of their node ids
SLOW_CASES = (
    "tests/test_work.py::test_predicted_tasks_and_moves_are_the_lowered_ones[ffnn sgd step (two outputs)-",
    "tests/test_work.py::test_predicted_tasks_and_moves_are_the_lowered_ones[nearest neighbour 1xD query-",
    "tests/test_time.py::test_predicted_seconds_are_the_formula_over_the_work[ffnn]",
    "tests/test_array.py::test_einsum_planned_for_three_sites_in_process[ab,bc,cd,de->ae]",
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)
        if item.nodeid.startswith(SLOW_CASES):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def client():
    """The shared cluster: a 2-worker ``LocalCluster(processes=True)`` on 127.0.0.1 and
    its client (the default client while it is open), one per test module that asks
    for it.  Modules that need another cluster (more workers, a memory limit, a
    configuration) define their own ``client``."""
    from distributed import Client, LocalCluster

    with LocalCluster(processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        with Client(cluster) as c:
            yield c
