"""One submission resolves its client and workers once (issue 40).

``_resolve(client, sites)`` (:mod:`tra_dask.runtime.cluster`) is what turns the
caller's ``client`` / ``sites`` into ``(client, workers)``: the default or embedded
client, the workers' list.  A submission resolves once and hands the result down to
its planning (every candidate chunking of an array, the calibration, the memory
budget) and sending.  The count is taken on every module that bound the function.
"""

from __future__ import annotations

import sys

import dask.array as da
import numpy as np
import pytest

import tra_dask as td
from tra_dask.runtime import cluster as runtime_cluster


@pytest.fixture
def resolves(monkeypatch):
    calls = []
    original = runtime_cluster._resolve

    def counting(client, sites):
        calls.append(sites)
        return original(client, sites)

    bound = [name for name, mod in list(sys.modules.items())
             if name.startswith("tra_dask") and getattr(mod, "_resolve", None) is original]
    assert "tra_dask.runtime.submit" in bound  # the walk finds the submission's own binding
    for name in bound:
        monkeypatch.setattr(sys.modules[name], "_resolve", counting)
    return calls


def test_a_relation_submission_resolves_once(client, resolves):
    a = np.arange(36.0).reshape(6, 6)
    A = td.from_numpy(a, (3, 3), name="A")
    out = td.submit(td.programs.matmul(A, A), client)
    assert len(resolves) == 1, resolves
    np.testing.assert_allclose(out.to_numpy(), a @ a)


def test_an_array_submission_resolves_once(client, resolves):
    a = np.arange(48.0).reshape(6, 8)
    x = td.asarray(a)
    out = td.submit(x @ x.T + 1.0, client)
    assert len(resolves) == 1, resolves
    np.testing.assert_allclose(out.assembled(), a @ a.T + 1.0)


def test_an_array_over_a_dask_array_resolves_once(client, resolves):
    a = np.arange(64.0).reshape(8, 8)
    x = td.from_array(da.from_array(a, chunks=(4, 4)))
    out = td.submit(x @ x, client)
    assert len(resolves) == 1, resolves
    np.testing.assert_allclose(out.assembled(), a @ a)
