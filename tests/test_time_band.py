"""The time objective under its own error: it does not buy a small predicted gain with
much more traffic (optimizer.optimize.less_traffic)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tra_dask as td
from tra_dask.optimizer.objective import BAND, FastestTime
from tra_dask.optimizer.time import fusion_for
from tra_dask.physical.work import plan_work
from tra_dask.programs import matmul, nearest_neighbor


def _never(key):
    raise AssertionError("planning made a chunk")


def _src(shape, chunks, name):
    return td.from_function(_never, shape, chunks, "float64", name=name)


def test_the_papers_general_multiply_no_longer_doubles_its_traffic_for_six_percent():
    # 40000^3 on 10 sites, the paper's cost model: the fastest plan moved 2x the floats of
    # the bytes objective's for a predicted 6% (issue: the time objective buys noise)
    A, B = _src((40000, 40000), 4000, "A"), _src((40000, 40000), 4000, "B")
    t = td.optimize(matmul(A, B), sites=10, objective="time", cost_model="paper")
    b = td.optimize(matmul(A, B), sites=10, objective="bytes", cost_model="paper")
    assert t.cost.floats_moved == b.cost.floats_moved
    note = t.stage("traffic").note
    assert "2.0x its floats" in note and "10%" in note
    assert "traffic: chosen over a plan predicted" in t.explain()
    # with no band the fastest plan is taken, whatever it moves
    fast = td.optimize(matmul(A, B), sites=10, objective=FastestTime(band=0.0), cost_model="paper")
    assert fast.cost.floats_moved == 2 * b.cost.floats_moved and fast.cost.seconds < t.cost.seconds


@pytest.mark.slow
def test_nearest_neighbour_does_not_move_18x_the_floats_for_a_percent():
    # N=6000, D=100000 on 8 sites: 18x the floats for a predicted 1.4% (issue)
    q, X, A = _src((1, 100000), (1, 10000), "q"), _src((6000, 100000), (1000, 10000), "X"), \
        _src((100000, 100000), 10000, "A")
    t = td.optimize(nearest_neighbor(q, X, A), sites=8, objective="time", cost_model="paper")
    b = td.optimize(nearest_neighbor(q, X, A), sites=8, objective="bytes", cost_model="paper")
    assert t.cost.floats_moved <= 1.5 * b.cost.floats_moved or t.cost.seconds <= (1 - BAND) * b.cost.seconds


def test_band_is_checked():
    with pytest.raises(ValueError, match="band must be a number in"):
        FastestTime(band=1.5)


@st.composite
def _case(draw):
    m, k, n = (draw(st.sampled_from([200, 600, 1000, 3000, 8000])) for _ in range(3))
    bm, bk, bn = (draw(st.sampled_from([1, 2, 3, 4])) for _ in range(3))
    sites = draw(st.integers(2, 8))
    spec = td.ClusterSpec(sites, bandwidth=draw(st.sampled_from([1e8, 4.5e8, 2e9, 1e10])),
                          task_overhead=draw(st.sampled_from([1e-4, 5e-4, 5e-3, 2e-2])),
                          rates={"blas": draw(st.sampled_from([1e9, 4e10, 1e12])), "elementwise": 1e9})
    A = _src((m, k), (-(-m // bm), -(-k // bk)), "A")
    B = _src((k, n), (-(-k // bk), -(-n // bn)), "B")
    expr = matmul(A, B) if draw(st.booleans()) else td.transform(matmul(td.transform(A, "relu"), B), "exp")
    return expr, spec


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(_case())
def test_more_traffic_only_for_a_gain_beyond_the_band(case):
    """Whenever the time objective's plan moves more than 1.5x the floats of the bytes
    objective's plan, its predicted time is at least the band (10%) lower."""
    expr, spec = case
    t = td.optimize(expr, sites=spec.sites, objective="time", cluster=spec)
    b = td.optimize(expr, sites=spec.sites, objective="bytes")
    # the bytes plan as the time objective would see it: fused for this cluster, then timed on it
    fused = len(plan_work(b.outputs, fusion=fusion_for(spec)).into)
    b_seconds = FastestTime(cluster=spec).annotate(dataclasses.replace(b.cost, seconds=None).with_fused(fused)).seconds
    if t.cost.floats_moved > 1.5 * b.cost.floats_moved:
        assert t.cost.seconds <= (1 - BAND) * b_seconds, (t.cost.floats_moved, b.cost.floats_moved,
                                                         t.cost.seconds, b_seconds)


def _planned(seconds, floats):
    """A planned chunking as the chunk choice holds it: (plan, predicted seconds)."""
    from types import SimpleNamespace

    return SimpleNamespace(cost=SimpleNamespace(floats_moved=floats)), seconds


def test_the_chunk_choice_keeps_the_band_across_chunkings():
    """The chunk choice compares chunkings as the search compares plans: the fastest
    chunking is passed over for one predicted within the band (10%) that moves a 1.5th
    of its floats or less, and the rule is applied again from there; beyond the band, or
    at less than 1.5x the traffic, the fastest stands.  (A 3-operand chain on 2 workers:
    its i2k2 chunking, predicted 6% faster than i2 and moving 2x its floats, ran 13-32%
    slower.)"""
    from tra_dask.frontend.chunking import less_traffic_chunking

    tried = {(1, 1): _planned(0.0430, 320_000), (1, 2): _planned(0.0459, 160_000), (2, 2): _planned(0.0480, 960_000)}
    got, note = less_traffic_chunking(tried, [1, 1])
    assert got == [1, 2]
    assert "6.3% faster" in note and "2.0x its floats" in note and "10%" in note
    # then again from there: a third within the band of the second that moves far less
    tried[(3, 3)] = _planned(0.0490, 10_000)
    got, note = less_traffic_chunking(tried, [1, 1])
    assert got == [3, 3] and note.count("chosen over") == 2
    # beyond the band: the fastest stands
    far = {(1, 1): _planned(0.040, 320_000), (1, 2): _planned(0.046, 160_000)}
    assert less_traffic_chunking(far, [1, 1]) == ([1, 1], "")
    # within the band but not 1.5x the traffic: the fastest stands
    near = {(1, 1): _planned(0.043, 200_000), (1, 2): _planned(0.045, 160_000)}
    assert less_traffic_chunking(near, [1, 1]) == ([1, 1], "")
    # a chunking that did not fit is never taken; no band, no rule
    unfit = {(1, 1): _planned(0.043, 320_000), (1, 2): (None, float("inf"))}
    assert less_traffic_chunking(unfit, [1, 1]) == ([1, 1], "")
    import dask

    with dask.config.set({"tra-dask.time-band": 0.0}):
        assert less_traffic_chunking(tried, [1, 1]) == ([1, 1], "")
