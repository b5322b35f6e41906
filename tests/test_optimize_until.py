"""``td.optimize(..., until=stage)``: the plan as it stands after a stage, unfused.

The pipeline's stages are recorded on every plan (``plan.stages``); fusion runs after
the last of them.  Stopping early gives the plan a stage produced, with the stages
that ran, and never a fused plan.
"""

from __future__ import annotations

import numpy as np
import pytest

import tra_dask as td
import tra_dask.optimizer.sketch as S
from tra_dask.optimizer.optimize import STAGES
from tra_dask.programs import matmul


def _matmul(shape=(12, 12), chunks=(2, 2)):
    rng = np.random.default_rng(0)
    A = td.from_numpy(rng.normal(size=shape), chunks, name="A")
    B = td.from_numpy(rng.normal(size=shape[::-1]), chunks[::-1], name="B")
    return matmul(A, B), A.to_numpy() @ B.to_numpy()


def test_until_search_is_the_plan_before_fusion():
    e, want = _matmul()
    full = td.optimize(e, sites=3)
    early = td.optimize(e, sites=3, until="search")
    assert [s.name for s in full.stages] == ["compile", "search", "check"]
    assert [s.name for s in early.stages] == ["compile", "search"]
    assert full.fusion is not None and early.fusion is None  # the full pipeline fused; this one did not
    assert early.outputs == full.stage("search").plan.outputs
    assert early.expr is e and early.sites == 3
    np.testing.assert_allclose(td.to_numpy(e, td.simulate(early).result), want)  # it computes the product


def test_every_stage_stops_where_it_says():
    e, _ = _matmul()
    full = td.optimize(e, sites=3)
    compiled = td.optimize(e, sites=3, until="compile")
    assert [s.name for s in compiled.stages] == ["compile"]
    assert compiled.outputs == full.compiled.outputs  # the paper's initial plan
    checked = td.optimize(e, sites=3, until="check")
    assert [s.name for s in checked.stages] == ["compile", "search", "check"]
    assert checked.outputs == full.stage("check").plan.outputs and checked.fusion is None
    # no sketch ran: "replay" stops where "search" does
    assert [s.name for s in td.optimize(e, sites=3, until="replay").stages] == ["compile", "search"]
    assert td.optimize(e, sites=3, until=None).outputs == full.outputs


def test_until_on_a_sketch():
    def keys_only(shape, blocks, name):
        chunks = tuple(-(-n // b) for n, b in zip(shape, blocks))
        return td.from_function(lambda key: None, shape, chunks, "float64", name=name)

    saved = S.SKETCH_TUPLES
    S.SKETCH_TUPLES = 100
    try:
        e = matmul(keys_only((1600, 1600), (16, 16), "A"), keys_only((1600, 1600), (16, 16), "B"))
        full = td.optimize(e, sites=4, objective="bytes")
        assert full.search.sketch is not None
        early = td.optimize(e, sites=4, objective="bytes", until="search")
        # the search ran on the sketch; what it returns is the expression's plan, replayed at full size
        assert [s.name for s in early.stages] == ["compile", "search", "replay"]
        assert early.outputs[0].type == e.type and early.fusion is None
        assert early.outputs == full.stage("replay").plan.outputs
        compiled = td.optimize(e, sites=4, objective="bytes", until="compile")
        assert compiled.outputs[0].type == e.type  # never the sketch's initial plan
    finally:
        S.SKETCH_TUPLES = saved


@pytest.mark.parametrize("bad", ["fuse", "Search", "lower", ""])
def test_an_unknown_stage_names_the_stages(bad):
    e, _ = _matmul()
    with pytest.raises(ValueError, match="the stages are compile, search, replay, check"):
        td.optimize(e, sites=2, until=bad)
    assert STAGES == ("compile", "search", "replay", "check")
