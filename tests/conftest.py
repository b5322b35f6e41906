import pytest

import tra_dask as td
from helpers import PAPER_A, PAPER_B

# imported by the tests as `helpers`; collected for doctests it would be imported a second time
# (and register its kernels twice)
collect_ignore = ["helpers.py"]


@pytest.fixture
def RA():
    return td.from_numpy(PAPER_A, (2, 2), name="R_A")


@pytest.fixture
def RB():
    return td.from_chunks({(0,): PAPER_B[:, :4], (1,): PAPER_B[:, 4:]}, name="R_B")
