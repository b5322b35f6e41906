import os
import tempfile

import dask
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
