"""The chunk choice at scale: candidates ranked by the analytic estimate, only a few
planned whatever the number of sites, and the choice as good as planning each of a
grid of uniform chunkings (keys only: simulated clusters, no workers)."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

import tra_dask as td
import tra_dask.frontend.run as run
from tra_dask.frontend.chunking import PLANNED, UNFIT, AxisClasses
from tra_dask.frontend.estimate import Estimator
from tra_dask.optimizer.cluster import ClusterSpec
from tra_dask.optimizer.optimize import NoPlanFits


def nodata(region):
    raise AssertionError("planning must not make data")


def arr(*shape):
    return td.from_region(nodata, shape, "float64")


@pytest.fixture
def plans(monkeypatch):
    """Counts the optimizer runs of the chunk choice: (sites, search options) of each."""
    calls = []
    orig = run.optimize

    def counted(*a, **k):
        calls.append((k.get("sites", a[1] if len(a) > 1 else None), k.get("options")))
        return orig(*a, **k)

    monkeypatch.setattr(run, "optimize", counted)
    run._CHOICES.clear()
    return calls


@pytest.mark.parametrize("sites", [16, 256, 1024])
def test_the_plans_made_do_not_grow_with_the_sites(plans, sites):
    """However many sites, the chooser plans at most PLANNED chunkings and the winner
    again in full (the estimate ranks hundreds)."""
    rel, plan = run.build_local(arr(4096, 4096) @ arr(4096, 4096), sites=sites)
    note = plan.stage("chunking").note
    ranked = int(note.split("the best of ")[1].split(" ")[0])
    assert ranked >= 100 and len(plans) <= PLANNED + 1, (len(plans), note)
    assert plan.cost.seconds < math.inf and plan.cost.peak_bytes_per_site.max() <= ClusterSpec(sites).memory_budget


@pytest.mark.parametrize("shape,sites", [((4096, 4096, 4096), 16), ((4096, 4096, 4096), 256),
                                         ((20000, 512, 512), 8), ((1000, 64000, 1000), 16)])
def test_the_choice_is_as_fast_as_the_best_uniform_chunking(shape, sites):
    """The chosen plan's predicted seconds are within 10% of the best of the uniform
    chunkings (b blocks per index, b a power of two up to 16), each planned in full."""
    m, k, n = shape
    _, chosen = run.build_local(arr(m, k) @ arr(k, n), sites=sites)
    best = math.inf
    for b in (1, 2, 4, 8, 16):
        if b > min(shape):
            break
        a_, b_ = (td.from_region(nodata, s, "float64", chunks=tuple(-(-d // b) for d in s)) for s in ((m, k), (k, n)))
        try:
            best = min(best, run.build_local(a_ @ b_, sites=sites)[1].cost.seconds)
        except NoPlanFits:
            continue
    assert chosen.cost.seconds <= 1.1 * best, (chosen.stage("chunking").note, chosen.cost.seconds, best)


def test_the_estimate_prices_the_time_models_terms():
    """More sites never make a multiply's estimate slower (a grid may leave sites
    idle); a chunking whose block product cannot fit a site is infinite."""
    x = arr(4096, 4096) @ arr(4096, 4096)
    cl = AxisClasses([x._node])
    blocks = [1024] * len(cl.classes)
    est = [Estimator(cl, p, ClusterSpec(p))(blocks) for p in (4, 16, 64, 256)]
    assert all(b <= a * 1.0001 for a, b in zip(est, est[1:])), est
    small = ClusterSpec(4, memory_per_site=300e6)
    assert Estimator(cl, 4, small)([4096] * len(cl.classes)) == math.inf  # 3 x 134 MB on one site
    assert Estimator(cl, 4, small)([1024] * len(cl.classes)) < math.inf
    # 4 block products of each result block held before they are summed: 134 MB a site at best
    assert Estimator(cl, 4, ClusterSpec(4, memory_per_site=120e6))([1024] * len(cl.classes)) == math.inf
    assert Estimator(cl, 4, ClusterSpec(4, memory_per_site=120e6))([1024, 4096, 1024]) < math.inf


@pytest.mark.parametrize("sites,blocks", [(8, [512, 4096, 512]), (8, [1024, 1024, 1024]), (8, [256, 16384, 256]),
                                          (64, [512, 4096, 512]), (64, [1024, 1024, 1024]), (64, [1024, 8192, 1024])])
def test_the_estimated_traffic_is_what_the_plan_of_that_chunking_moves(sites, blocks):
    """``Estimator.moved`` -- each operand piece to the other sites of the grid that
    need it, each partial product once to be summed -- is the floats the optimizer's
    plan of that chunking moves, where the plan uses the estimate's grid (a 1024 x
    65536 x 1024 multiply: 3-D grids, a cut of the contracted dim folded flat or by a
    tree); ``spread`` is the sites that grid uses."""
    m, k, n = 1024, 65536, 1024
    x = arr(m, k) @ arr(k, n)
    est = Estimator(AxisClasses([x._node]), sites, ClusterSpec(sites))
    assert est(blocks) < math.inf
    a = td.from_region(nodata, (m, k), "float64", chunks=tuple(blocks[:2]))
    b = td.from_region(nodata, (k, n), "float64", chunks=tuple(blocks[1:]))
    plan = run.build_local(a @ b, sites=sites)[1]
    assert est.moved(blocks) == plan.cost.floats_moved
    assert est.spread(blocks) == min(sites, math.prod(-(-d // c) for d, c in zip((m, k, n), blocks)))


def test_the_chunking_of_least_traffic_near_the_fastest_is_planned_and_chosen(plans):
    """At 64 sites the estimate ranks a 2x16x2 grid (1.5e8 floats) fastest and the
    64-way cut of the contracted dim (6.6e7 floats, the lower bound) 15% slower: the
    chooser plans that one too, and the time objective's band takes it (the plans
    predict 0.377 s against 0.363 s: within the model's error, for 2.3x less traffic)."""
    m, k, n = 1024, 65536, 1024
    plan = run.build_local(arr(m, k) @ arr(k, n), sites=64)[1]
    assert len(plans) <= PLANNED + 2
    assert plan.cost.floats_moved == 63 * m * n and "tree" in plan.strategies()[0]
    assert "moves 2.3x its floats" in plan.stage("chunking").note


def test_a_chunking_is_planned_for_its_traffic_only_when_it_moves_far_less():
    """The chooser's extra candidate: near the fastest estimate (PLANNED_MARGIN), on no
    fewer sites, not planned yet, moving at most 1/TRAFFIC_RATIO of every chunking
    planned -- and strictly less (chunkings that all move nothing: none)."""
    from tra_dask.frontend.chunking import PLANNED_MARGIN, _least_traffic_candidate

    class Est:
        def __init__(self, moved, spread):
            self.m, self.s = moved, spread

        def moved(self, k):
            return self.m[tuple(k)]

        def spread(self, k):
            return self.s[tuple(k)]

    ranked = [(1.0, (1,)), (1.1, (2,)), (1.2, (3,)), (PLANNED_MARGIN * 1.01, (4,))]
    tried = {(1,): (None, 1.0), (2,): (None, 1.1)}
    wide = {(1,): 64, (2,): 64, (3,): 64, (4,): 64}
    assert _least_traffic_candidate(ranked, tried, Est({(1,): 0.0, (2,): 0.0, (3,): 0.0, (4,): 0.0}, wide)) is None
    assert _least_traffic_candidate(ranked, tried, Est({(1,): 3.0, (2,): 4.0, (3,): 2.0, (4,): 1.0}, wide)) == (3,)
    assert _least_traffic_candidate(ranked, tried, Est({(1,): 3.0, (2,): 4.0, (3,): 2.5, (4,): 1.0}, wide)) is None
    assert _least_traffic_candidate(ranked, tried, Est({(1,): 3.0, (2,): 4.0, (3,): 2.0, (4,): 1.0},
                                                       {**wide, (3,): 8})) is None


def test_a_join_whose_result_is_reduced_inside_it_is_not_refused_for_that_result():
    """(a * b + 1).sum(0) of 240x64 on 4 sites of 67 kB: the product's operands and
    result are 369 kB whole, but the sum runs inside the join's kernel (each pair's
    chunk summed as it is made), so a plan holds the operands, 61 kB a site, and no
    more; it was refused before anything was planned.  Its result counts where it is
    an output."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((240, 64))
    x = (td.from_array(a) * td.from_array(2 * a) + 1).sum(axis=0)
    rel, plan = x.to_relation(sites=4, memory_limit=67_000)
    assert plan.cost.peak_bytes_per_site.max() <= 67_000
    np.testing.assert_allclose(td.to_numpy(rel), (2 * a * a + 1).sum(axis=0))
    with pytest.raises(NoPlanFits, match=r"the elementwise mul of shape \(240, 64\)"):
        (td.from_array(a) * td.from_array(2 * a)).to_relation(sites=4, memory_limit=67_000)
    # 64x100 on one site of 110 kB: no cluster-sized grid fits; of the finer ones, the estimated
    # peak counts no chunk of a * b (made inside the join's kernel), so one that fits is planned
    a = a[:64, :].repeat(2, axis=1)[:, :100]
    x = (td.from_array(a) * td.from_array(2 * a) + 1).sum(axis=0)
    rel, plan = x.to_relation(sites=1, memory_limit=110_017)
    assert plan.cost.peak_bytes_per_site.max() <= 110_017
    np.testing.assert_allclose(td.to_numpy(rel), (2 * a * a + 1).sum(axis=0))


def test_an_operands_indices_summed_before_its_join_are_not_held_by_the_join():
    """einsum('ij,jk->') of 64x400 and 400x240 on 4 sites of 225 kB: its operands are
    973 kB whole (243 kB a site), but i and k are summed out of each before they meet
    (frontend.build), so the join holds two 400-vectors; the chunk choice plans (it was
    refused before planning)."""
    import numpy as np

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((64, 400)), rng.standard_normal((400, 240))
    rel, plan = td.einsum("ij,jk->", td.from_array(a), td.from_array(b)).to_relation(sites=4,
                                                                                       memory_limit=224_624)
    assert plan.cost.peak_bytes_per_site.max() <= 224_624
    np.testing.assert_allclose(td.to_numpy(rel), np.einsum("ij,jk->", a, b))
    # 240x400 and 400x64 on 3 sites of 325 kB: the estimate sums i and k out of each operand
    # first too (its peak: an operand's share while it is summed), so it ranks what fits (it
    # priced the join of the whole operands, 0.6-1 MB a site, and its 11 plans all failed)
    a, b = rng.standard_normal((240, 400)), rng.standard_normal((400, 64))
    rel, plan = td.einsum("ij,jk->", td.from_array(a), td.from_array(b)).to_relation(sites=3, memory_limit=324_816)
    assert plan.cost.peak_bytes_per_site.max() <= 324_816
    np.testing.assert_allclose(td.to_numpy(rel), np.einsum("ij,jk->", a, b))


def test_chunkings_too_large_to_plan_are_refused_saying_so(plans):
    """2000³ on 2 sites of 20 MB: the operands and result (96 MB) fit the sites' 40 MB in
    no chunking, so nothing is planned, and the refusal names the step and the bytes."""
    with pytest.raises(NoPlanFits, match=r"the contraction ij,jk->ik of ij,jk->ik holds its operands \(and its "
                                          r"result, where that is an output or another step's operand\), "
                                          r"96,000,000 bytes, at least 48,000,000 bytes per site on 2 "
                                          r"site\(s\) against the limit of 20,000,000 bytes"):
        (arr(2000, 2000) @ arr(2000, 2000)).to_relation(sites=2, memory_limit=20e6)
    assert plans == []


@pytest.mark.parametrize("make", [
    lambda: td.einsum("a,bca,ca,bca,c,bca->", arr(32), arr(2048, 65536, 32), arr(65536, 32),
                      arr(2048, 65536, 32), arr(65536), arr(2048, 65536, 32)),
    lambda: arr(4096, 10000, 100) * arr(4096, 10000, 100),
])
def test_no_plan_fits_is_decided_before_planning_when_a_join_holds_more_than_every_site(plans, make):
    """A join whose operands and result are more bytes than all the sites hold (a 34 GB
    operand three times, 16 sites of 4 GB) is refused at once, naming it — every
    chunking planned failed the same way, in 8-25 s."""
    with pytest.raises(NoPlanFits, match=r"no chunking fits in memory: the (contraction|elementwise) .* holds its "
                                          r"operands \(and its result, .*\), [\d,]+ bytes, at least [\d,]+ bytes per site "
                                          r"on 16 site\(s\) against the limit of 4,000,000,000 bytes"):
        make().to_relation(sites=16)
    assert plans == []


def test_a_chunking_whose_block_products_outgrow_the_sites_is_not_planned(plans):
    """80000x10000x80000 on 64 sites of 4 GB: cutting the summed index 8 ways holds
    8 block products of every result block before they are summed (6.4 GB a site at
    best), so such chunkings are ruled out by the estimate and a chunking that fits
    is planned (was: 11 chunkings planned, every one cutting the summed index,
    NoPlanFits after 5 s)."""
    a = td.from_region(nodata, (80000, 10000), "float64", name="A")
    b = td.from_region(nodata, (10000, 80000), "float64", name="B")
    rel, plan = (a @ b).to_relation(sites=64)
    assert plan.cost.peak_bytes_per_site.max() <= 4e9 and len(plans) <= PLANNED + UNFIT + 1


def test_mirror_images_are_planned_once(plans, monkeypatch):
    """The 5-operand chain ab,bc,cd,de,ef->af reads the same backwards: cutting b or d
    in two, and its two mirror contraction orders, are priced exactly alike and cut as
    many classes as many ways, so one of each is planned (2 searches, was 4), and the
    choice is the one planning them all makes."""
    import tra_dask.frontend.chunking as C

    def chain():
        return td.einsum("ab,bc,cd,de,ef->af", *[arr(4096, 4096) for _ in range(5)])

    rel, plan = run.build_local(chain(), sites=16)
    assert len(plans) == 2, plans
    once = plan.cost.seconds
    plans.clear()
    run._CHOICES.clear()
    monkeypatch.setattr(C, "_cut_counts", lambda cl, k: object())  # no two chunkings alike
    rel, plan = run.build_local(chain(), sites=16)
    assert len(plans) > 2 and plan.cost.seconds == pytest.approx(once, rel=1e-12)


def test_finer_grids_than_the_clusters_are_tried_before_no_plan_fits():
    """A 24x4 argmax on one site of 1,360 bytes: no chunking of the cluster-sized grids
    (up to 4 blocks a class) has a plan within the limit, but 12 row blocks do; the
    chooser tries grids of more blocks before it gives up (it raised NoPlanFits)."""
    import numpy as np

    a = np.round(np.random.default_rng(0).standard_normal((24, 4)), 3)
    rel, plan = td.from_array(a).argmax(1).to_relation(sites=1, memory_limit=1360)
    assert plan.cost.peak_bytes_per_site.max() <= 1360
    np.testing.assert_array_equal(td.to_numpy(rel), a.argmax(1))


def test_finer_grids_are_ranked_by_what_they_hold_first():
    """(100x400) @ (400x400) on one site of 2,262,400 bytes: no grid of up to 4 blocks a
    class fits (B's 400x100 blocks, two in flight, are 2.56 MB with the rest), but 8 column
    blocks do (2.24 MB); among the finer grids (800 of them: a descent) those whose
    estimated peak is over the memory weigh most, so the descent goes to one that fits
    (it went by the estimate's seconds alone, to grids as coarse as those that did not fit,
    and planned none: NoPlanFits)."""
    import numpy as np

    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((100, 400)), rng.standard_normal((400, 400))
    rel, plan = (td.from_array(a) @ td.from_array(b)).to_relation(sites=1, memory_limit=2_262_400)
    assert plan.cost.peak_bytes_per_site.max() <= 2_262_400
    np.testing.assert_allclose(td.to_numpy(rel), a @ b, rtol=1e-10)


def test_a_chunking_that_holds_less_is_planned_after_one_that_did_not_fit():
    """(2400x400) @ (400x400) on 2 sites of 11,648,000 bytes: 4 row blocks peak at
    12.8 MB a site (half of each matrix, the whole of the broadcast one, two 1.9 MB
    blocks in flight), 8 row blocks at 11.52 MB.  Until one fits, the chooser passes
    over only the chunkings whose estimated peak is no smaller than one that did not fit (it passed
    over those whose largest block step was no smaller: 8 row blocks' tied 4 row
    blocks cut twice along k, and NoPlanFits was raised); the estimate's peak is the
    plan's here."""
    import numpy as np

    from tra_dask.frontend.chunking import AxisClasses
    from tra_dask.frontend.estimate import Estimator

    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2400, 400)), rng.standard_normal((400, 400))
    x = td.from_array(a) @ td.from_array(b)
    rel, plan = x.to_relation(sites=2, memory_limit=11_648_000)
    assert plan.cost.peak_bytes_per_site.max() <= 11_648_000
    np.testing.assert_allclose(td.to_numpy(rel), a @ b, rtol=1e-10)
    est = Estimator(AxisClasses([x._node]), 2, td.ClusterSpec(sites=2, memory_per_site=11_648_000))
    for rows in (600, 300):
        fixed = (td.from_array(a, chunks=(rows, 400)) @ td.from_array(b, chunks=(400, 400)))
        _, p = fixed.to_relation(sites=2, memory_limit=1e9)
        assert est.peak([rows, 400, 400]) == p.cost.peak_bytes_per_site.max()


def test_a_contraction_whose_fastest_grid_holds_too_much_is_priced_on_one_that_fits():
    """A @ B @ C of 64x40, 40x64, 64x64 on 4 sites of 54,814 bytes (4x2x4x4 blocks by
    hand: 54,272 a site): at these sizes the fastest grid of a step is one site, which
    holds every operand and block product (140 kB estimated); a plan under the limit
    spreads them, so the estimate's peak is the grid's that fits.  Every chunking was
    passed over as holding too much and NoPlanFits raised after 3 plans."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b, c = rng.standard_normal((64, 40)), rng.standard_normal((40, 64)), rng.standard_normal((64, 64))
    rel, plan = (td.from_array(a) @ td.from_array(b) @ td.from_array(c)).to_relation(sites=4, memory_limit=54_814)
    assert plan.cost.peak_bytes_per_site.max() <= 54_814
    np.testing.assert_allclose(td.to_numpy(rel), a @ b @ c, rtol=1e-10)


def test_an_input_read_through_a_slice_holds_only_the_blocks_it_reads():
    """A[:, :50] @ B[:50] of 40x100, 100x64 on 1 site of 69,164 bytes: the blocks the
    slices do not read are never made (the plan of 5x50x8 blocks holds 68,480 bytes, as
    estimated; the estimate counted whole inputs, 83 kB, and no chunking was planned
    that fits)."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 100)), rng.standard_normal((100, 64))
    rel, plan = (td.from_array(a)[:, :50] @ td.from_array(b)[:50]).to_relation(sites=1, memory_limit=69_164)
    assert plan.cost.peak_bytes_per_site.max() <= 69_164
    np.testing.assert_allclose(td.to_numpy(rel), a[:, :50] @ b[:50], rtol=1e-10)
    x = td.from_array(a)[:, :50] @ td.from_array(b)[:50]
    est = Estimator(AxisClasses([x._node]), 1, td.ClusterSpec(sites=1, memory_per_site=69_164))
    _, p = (td.from_array(a, chunks=(5, 50))[:, :50] @ td.from_array(b, chunks=(50, 8))[:50]).to_relation(
        sites=1, memory_limit=1e9)
    assert est.peak([5, 50, 8]) == p.cost.peak_bytes_per_site.max()


def test_a_reduction_across_blocks_holds_a_partial_result_per_block():
    """mean and var of a 40x40 array on 2 sites of 8,080 bytes: each input block's partial
    sum is held until summed, so finer grids hold more (1x1 blocks: 12,976 bytes, the
    estimate said 6,576) and the 12 planned all failed; counted, the estimate is each
    grid's plan's, and 10x5 blocks (8,000 bytes) is planned."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((40, 40))
    x = td.from_array(a)
    rel, plan = td.frontend.run.build_local((x.mean(0), x.var(0)), sites=2, memory_limit=8_080)
    assert plan.cost.peak_bytes_per_site.max() <= 8_080
    got = td.to_numpy(rel[0]), td.to_numpy(rel[1])
    np.testing.assert_allclose(got[0], a.mean(0), rtol=1e-12)
    np.testing.assert_allclose(got[1], a.var(0), rtol=1e-12)
    est = Estimator(AxisClasses([x.mean(0)._node, x.var(0)._node]), 2, td.ClusterSpec(sites=2, memory_per_site=8_080))
    for blocks in ((10, 5), (2, 2), (1, 1)):
        y = td.from_array(a, chunks=blocks)
        _, p = td.frontend.run.build_local((y.mean(0), y.var(0)), sites=2, memory_limit=1e9)
        assert est.peak(list(blocks) + [1] * (len(est.cl.classes) - 2)) == p.cost.peak_bytes_per_site.max(), blocks


def test_a_slice_above_a_join_leaves_the_choice_to_the_plans(plans):
    """A slice may read a sliver of a join: the join's whole bytes bound nothing, and
    the chunk choice plans (here, a plan that fits: only the sliver is computed)."""
    x = (arr(4096, 10000, 100) * arr(4096, 10000, 100))[:8]
    rel, plan = x.to_relation(sites=16)
    assert plan.cost.peak_bytes_per_site.max() <= 4e9 and plans


@pytest.mark.parametrize("make", [
    lambda: arr(100, 2048, 10000).sum(),
    lambda: (td.from_region(nodata, (100, 2048, 5000), "float64", name="A")
             * td.from_region(nodata, (100, 2048, 5000), "float64", name="B")).sum(),
])
def test_a_reduction_of_a_large_array_spreads_over_every_site(plans, make):
    """A 16 GB array (or the product of two 8 GB ones) summed on 16 sites of 4 GB:
    every block's step (its chunk and what is made of it) fits, and the blocks are
    spread evenly — a grid of blocks that no single key dim spreads (8x2, 4x4) is
    placed row-major round the sites (was: NoPlanFits, 8 sites holding two 1 GB chunks
    each; the product on 8 sites, flops balance 2.08)."""
    rel, plan = make().to_relation(sites=16)
    assert plan.cost.flops_balance <= 1.01 and plan.cost.peak_bytes_per_site.max() <= 4e9


def test_no_chunking_fits_says_the_bytes_needed_and_gives_up_soon(plans):
    with pytest.raises(NoPlanFits, match=r"the least any needs is [\d,]+ bytes per site against the limit of "
                                          r"60,000,000 bytes"):
        (arr(2000, 2000) @ arr(2000, 2000)).to_relation(sites=2, memory_limit=60e6)
    assert len(plans) <= PLANNED + UNFIT


def test_orders_estimated_far_slower_are_not_planned(plans):
    """A lopsided chain's two orders: (A B) C is estimated 2.4x slower than A (B C) on
    2 sites, so only A (B C) is planned under the chosen chunking (planning an order
    costs a search; one estimated within the margin would be planned too)."""
    x = td.einsum("ij,jk,kl->il", arr(2000, 400), arr(400, 2000), arr(2000, 400))
    rel, plan = run.build_local(x, sites=2)
    note = plan.stage("chunking").note
    assert "contraction order [[1, 2], [0, 1]], the fastest of 1 planned (of 2 from opt_einsum" in note, note
    planned_chunkings = int(note.split("least predicted time of ")[1].split(" ")[0])
    # each chunking planned once (the estimate's best with the kept plan's search, which won), no second order
    assert len(plans) == planned_chunkings, plans
    assert [o for _, o in plans] == [run.kept_search()] + ["quick"] * (planned_chunkings - 1), plans


@pytest.mark.parametrize("expr,sites", [
    (lambda: td.einsum("ab,bc,cd,de,ef->af", *[arr(4096, 4096) for _ in range(5)]), 16),
    (lambda: td.einsum("ij,jk,kl->il", arr(600, 400), arr(400, 500), arr(500, 300)), 2),
    (lambda: td.einsum("abcdef,bcdfg->abcdeg", arr(*(24,) * 6), arr(*(24,) * 5)), 16),
    (lambda: td.einsum("bij,bjk->bik", arr(8, 200, 100), arr(8, 100, 200)), 3),
])
def test_the_quick_searches_choose_what_the_wider_quick_search_chose(expr, sites, monkeypatch):
    """The chunk choice compares chunkings and contraction orders by quick searches that
    rewrite a node past the beam for two rounds and keep no least-traffic candidates
    beyond the beam (target.SEARCH_OPTIONS):
    fewer candidates than the beam of two with the full closure and those candidates,
    and the same chunking, order and plan cost."""
    from tra_dask.optimizer import target as T

    def choose(quick):
        monkeypatch.setitem(T.SEARCH_OPTIONS, "quick", quick)
        run._CHOICES.clear()
        seen = []
        orig = run.optimize

        def counted(*a, **k):
            p = orig(*a, **k)
            if k.get("options") == "quick":
                seen.append(p.search.candidates)
            return p

        monkeypatch.setattr(run, "optimize", counted)
        _, plan = run.build_local(expr(), sites=sites)
        monkeypatch.setattr(run, "optimize", orig)
        return plan, seen

    narrow, quick = choose(T.SEARCH_OPTIONS["quick"])
    assert (T.SEARCH_OPTIONS["quick"].bound_rounds, T.SEARCH_OPTIONS["quick"].least_traffic) == (2, False)
    wide, wide_quick = choose(T.SearchOptions("quick", beam=2))
    assert narrow.stage("chunking").note == wide.stage("chunking").note
    assert narrow.cost.seconds == pytest.approx(wide.cost.seconds, rel=1e-9)
    assert narrow.cost.floats_moved == wide.cost.floats_moved
    assert sum(quick) < sum(wide_quick), (quick, wide_quick)


@pytest.mark.parametrize("expr,sites", [
    (lambda: td.einsum("ab,bc,cd,de,ef->af", *[arr(4096, 4096) for _ in range(5)]), 16),
    (lambda: td.einsum("ij,jk,kl->il", arr(600, 400), arr(400, 500), arr(500, 300)), 2),
    (lambda: td.einsum("abcdef,bcdfg->abcdeg", arr(*(24,) * 6), arr(*(24,) * 5)), 16),
    (lambda: td.einsum("db,b,cad->ab", arr(512, 64), arr(64), arr(256, 1024, 512)), 2),
    (lambda: arr(8000, 400) @ arr(400, 8000) @ arr(8000, 400), 3),
    (lambda: (arr(3000, 3000) @ arr(3000, 3000)).sum(axis=0) + arr(3000), 4),
])
def test_the_plan_kept_predicts_what_the_default_search_of_its_chunking_finds(expr, sites, plans):
    """The array front-end keeps its chosen chunking's plan as the narrow search makes
    it (``run.kept_search()``: the quick search's beam, with the least-traffic candidates
    the time band's near ties go to), not the default search of six placements per node:
    on these expressions that search, run on the same relation, predicts the same
    seconds and moves the same floats.  The Dask config ``tra-dask.array-search``
    chooses another search for the plan kept."""
    from tra_dask.optimizer import optimize
    from tra_dask.optimizer.target import Target

    assert run.kept_search() == "narrow"
    rel, plan = run.build_local(expr(), sites=sites)
    # (the estimate's best chunking narrow at once; once more only if another chunking or order won)
    assert [o for _, o in plans].count("auto") == 0 and 1 <= [o for _, o in plans].count("narrow") <= 2, plans
    wide = optimize(rel, Target(sites, cluster=ClusterSpec(sites=sites)), objective="time", options="auto")
    assert plan.cost.seconds == pytest.approx(wide.cost.seconds, rel=1e-9)
    assert plan.cost.floats_moved == wide.cost.floats_moved
    import dask

    run._CHOICES.clear()
    plans.clear()
    with dask.config.set({"tra-dask.array-search": "auto"}):
        _, again = run.build_local(expr(), sites=sites)
    assert [o for _, o in plans].count("auto") <= 1 and "narrow" not in [o for _, o in plans], plans
    assert again.cost.seconds == pytest.approx(wide.cost.seconds, rel=1e-9)


def test_a_search_for_the_plan_kept_that_is_not_named_is_refused():
    import dask

    with dask.config.set({"tra-dask.array-search": "widest"}):
        with pytest.raises(ValueError, match="unknown search options 'widest'; valid: 'auto', 'quick'"):
            run.build_local(arr(100, 100) @ arr(100, 100), sites=2)


def _shared_host(sites: int, cores: int) -> ClusterSpec:
    """One host of ``sites`` one-thread workers on ``cores`` cores whose BLAS and
    elementwise kernels run twice as fast while the host's other workers idle (as
    ``td.calibrate`` measured 4 workers on this VM's 2 cores)."""
    return dataclasses.replace(ClusterSpec(sites), hosts=(0,) * sites, cores=cores,
                               rates={"blas": 2.0e10, "elementwise": 8.0e8},
                               rates_alone={"blas": 4.0e10, "elementwise": 1.8e9})


@pytest.mark.parametrize("shape,sites,cores", [((512, 8192, 512), 4, 2), ((512, 8192, 512), 8, 8)])
def test_a_shared_hosts_choice_is_the_best_of_the_chunkings_planned(shape, sites, cores):
    """On a host whose workers run faster while others idle, the estimate paces a step
    on part of the sites as the time model does (:func:`~tra_dask.optimizer.time.busiest`),
    so the chosen plan is within 5% of the best of every chunking with each index in
    1, 2 or 4 blocks, each planned in full.  (Estimated at every worker's shared rate,
    a 512x8192x512 multiply on 4 workers of 2 cores cut its summed index 4 ways,
    predicted 10% slower than 2 ways, which runs 2 products at the rate alone; on 8
    workers of 8 cores 20% slower.)"""
    m, k, n = shape
    spec = _shared_host(sites, cores)
    _, chosen = run.build_local(arr(m, k) @ arr(k, n), cluster=spec)
    best = math.inf
    for bi, bj, bk in itertools.product((1, 2, 4), repeat=3):
        a_ = td.from_region(nodata, (m, k), "float64", chunks=(-(-m // bi), -(-k // bj)))
        b_ = td.from_region(nodata, (k, n), "float64", chunks=(-(-k // bj), -(-n // bk)))
        best = min(best, run.build_local(a_ @ b_, cluster=spec)[1].cost.seconds)
    assert chosen.cost.seconds <= 1.05 * best, (chosen.stage("chunking").note, chosen.cost.seconds, best)


def test_the_estimate_of_a_step_on_part_of_a_shared_host_is_the_plans():
    """The estimate of a 512x8192x512 multiply cut 2 ways along its summed index on 4
    workers of 2 cores is within 10% of the plan's predicted seconds (it was 1.76x:
    the 2 busy workers were priced at the rate of 4 busy)."""
    spec = _shared_host(4, 2)
    x = arr(512, 8192) @ arr(8192, 512)
    cl = AxisClasses([x._node])
    blocks = [512 if e == 512 else 4096 for e in cl.extent]
    est = Estimator(cl, 4, spec)(blocks)
    a_ = td.from_region(nodata, (512, 8192), "float64", chunks=(512, 4096))
    b_ = td.from_region(nodata, (8192, 512), "float64", chunks=(4096, 512))
    planned = run.build_local(a_ @ b_, cluster=spec)[1].cost.seconds
    assert est == pytest.approx(planned, rel=0.10), (est, planned)


def test_planning_on_a_given_spec_refuses_another_number_of_sites():
    """``to_relation(cluster=spec)`` plans on the spec's sites; a different ``sites``
    is refused, naming both."""
    with pytest.raises(ValueError, match="sites=3 but the cluster has 4 sites"):
        (arr(64, 64) @ arr(64, 64)).to_relation(sites=3, cluster=_shared_host(4, 2))
