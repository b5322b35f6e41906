"""The search finds the best plan of its space: a brute-force enumerator agrees on
small programs; site grids reach the communication lower bound; the objective, the
budget and bad input."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tra_dask as td
from brute_force import enumerate_dp_space, enumerate_plans
from tra_dask.keys import k0, k1
from tra_dask.optimizer.bounds import matmul_lower_bound
import tra_dask.optimizer.search as S
from test_soundness import programs
from tra_dask.node import toposort
from tra_dask.optimizer.cost import DeliveredCosts, plan_cost
from tra_dask.optimizer.time import makespan, plan_seconds
from tra_dask.optimizer.objective import FewestBytes
from tra_dask.optimizer.rules import RULES
from tra_dask.physical import Grid
from tra_dask.programs import ffnn_sgd_step, matmul, nearest_neighbor


def _best_key(plans):
    obj = FewestBytes()
    return min(obj(plan_cost(list(p))) for p in plans)


def _searched_key(expr, sites):
    """The search's plan costed as the brute force costs its candidates: before fusion
    (fusion after placement merges tasks, the bytes and flops are the same)."""
    plan = td.optimize(expr, objective="bytes", sites=sites)
    key = FewestBytes()(plan.cost)
    unfused = FewestBytes()(plan_cost(list(plan.outputs)))
    assert key[:-2] == unfused[:-2] and key[-2] == unfused[-2] - plan.cost.fused
    return unfused


def _assert_best(searched, best):
    """The search's key is the space's best in every term; in the last, the physical
    tuples, it may be lower: the search costs its best plan again without the moves
    that move nothing it needs (search._idle_moves_dropped), which can make a plan
    the rules' space does not hold."""
    assert searched[:-1] == best[:-1] and searched[-1] <= best[-1], (searched, best)


def _mat(rng, shape, chunks, name):
    return td.from_numpy(rng.normal(size=shape), chunks, name=name)


@pytest.mark.slow
@pytest.mark.parametrize("kind,sites", [(k, s) for k in ("chain", "nn", "ffnn") for s in (2, 3, 5)
                                        if k != "ffnn" or s == 2])  # (ffnn's unbounded search: on 5 sites
# ~30 CPU-s, on 3 ~25 s, on 2 ~13 s; its weaker claim, never worse, is checked on 2)
def test_default_beam_finds_what_an_unbounded_beam_finds(kind, sites):
    """Deeper programs, whose unpruned space is too large to list (a chain of two
    multiplies: > 4000 plans): keeping every placement signature per node (beam
    unbounded) finds nothing better."""
    expr = _program(kind, np.random.default_rng(sites))
    obj = FewestBytes()
    default, wide = obj(td.optimize(expr, objective="bytes", sites=sites).cost), obj(td.optimize(expr, objective="bytes", sites=sites, beam=10**6).cost)
    if kind == "ffnn":
        # two outputs sharing the forward pass: per-output ranking does not see which
        # candidates share nodes, so a wider beam can crowd out the candidate that
        # shares best (README: known limitation) — the default is never the worse one
        assert default <= wide
    else:
        assert default == wide


def _program(kind, rng):
    if kind == "chain":
        i, k, j, l = rng.integers(1, 3, 4)
        ab = matmul(_mat(rng, (2 * i, 2 * k), 2, "A"), _mat(rng, (2 * k, 2 * j), 2, "B"))
        return matmul(ab, _mat(rng, (2 * j, 2 * l), 2, "C"))
    if kind == "nn":
        n, d = rng.integers(1, 4, 2)
        return nearest_neighbor(_mat(rng, (2 * d,), 2, "q"), _mat(rng, (2 * n, 2 * d), 2, "X"),
                                _mat(rng, (2 * d, 2 * d), 2, "M"))
    assert kind == "ffnn"
    return ffnn_sgd_step(_mat(rng, (4, 4), 2, "X"), _mat(rng, (4, 2), 2, "Y"), _mat(rng, (4, 4), 2, "W1"),
                         _mat(rng, (4, 2), 2, "W2"), 0.1)


@pytest.mark.slow
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(blocks=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3)), sites=st.integers(2, 6),
       seed=st.integers(0, 10_000))
def test_search_equals_brute_force_for_random_multiplies(blocks, sites, seed):
    """The search's whole plan space, unpruned (every candidate at every node, every
    combination): its cheapest plan is the search's."""
    rng = np.random.default_rng(seed)
    i, k, j = blocks
    expr = matmul(_mat(rng, (2 * i, 2 * k), 2, "A"), _mat(rng, (2 * k, 2 * j), 2, "B"))
    space = enumerate_dp_space(list(td.compile(expr, sites).outputs), RULES, limit=4000)
    _assert_best(_searched_key(expr, sites), _best_key(space))


@pytest.mark.slow
@pytest.mark.parametrize("sites", [2, 5])
def test_search_equals_brute_force_for_matmul_plus_elementwise(sites):
    rng = np.random.default_rng(sites)
    expr = td.join(matmul(_mat(rng, (4, 4), 2, "A"), _mat(rng, (4, 2), 2, "B")), _mat(rng, (4, 2), 2, "D"),
                   (0, 1), (0, 1), "add")
    space = enumerate_dp_space(list(td.compile(expr, sites).outputs), RULES, limit=4000)
    assert len(space) > 500  # (the space is large: the search prunes it to a few dozen)
    _assert_best(_searched_key(expr, sites), _best_key(space))


@pytest.mark.parametrize("sites", [2, 3])
@pytest.mark.parametrize("name", ["add+row_sum", "agg of mul", "diag", "filter+agg", "rekey+add"])
def test_search_equals_exhaustive_rewriting_on_tiny_programs(name, sites):
    """Every rule at every position, every free-source placement, to a fixed point:
    the whole space the rules reach, without the search's structure."""
    rng = np.random.default_rng(0)
    A, B = _mat(rng, (4, 4), 2, "A"), _mat(rng, (4, 4), 2, "B")
    expr = {
        "add+row_sum": lambda: td.transform(td.join(A, B, (0, 1), (0, 1), "add"), "row_sum"),
        "agg of mul": lambda: td.aggregate(td.join(A, B, (0, 1), (0, 1), "mul"), (0,), "add"),
        "diag": lambda: td.transform(td.rekey(td.filter(A, k0 == k1), k0), "diag"),
        "filter+agg": lambda: td.filter(td.aggregate(A, (1,), "max"), k0 < 1),
        "rekey+add": lambda: td.join(td.rekey(A, (k1, k0)), B, (0, 1), (0, 1), "add"),
    }[name]()
    space = enumerate_plans(td.compile(expr, sites).outputs, RULES, limit=1500)
    _assert_best(_searched_key(expr, sites), _best_key(space))


# the default spec and skewed ones: tasks that cost 20 ms, a slow network, a fast BLAS,
# two threads per worker (a reader then takes in at most one task)
SPECS = {"default": {}, "tasks of 20 ms": {"task_overhead": 0.02}, "slow network": {"bandwidth": 1e6},
         "fast BLAS": {"rates": {"blas": 1e13}}, "2 threads": {"threads": 2, "task_overhead": 0.005}}


def _fastest_fused(space, spec) -> float:
    """The least predicted seconds of any plan of ``space`` once fused, on ``spec``:
    every plan fused whose seconds with every task of a local computation that is not
    a result removed (fusion removes no other) could still beat the best."""
    from tra_dask.optimizer.objective import FastestTime
    from tra_dask.optimizer.time import fusion_for
    from tra_dask.physical import LocalAggregate, LocalJoin, LocalMap
    from tra_dask.physical.work import plan_work

    def local_tasks(p, c):
        return sum(nc.tasks for n, nc in c.nodes.items() if isinstance(n, (LocalJoin, LocalAggregate, LocalMap))
                   and n not in p)

    timed, fusion = FastestTime(cluster=spec), fusion_for(spec)
    costs = sorted(((timed.seconds(c) - local_tasks(p, c) * spec.task_overhead, p, c)
                    for p, c in ((p, plan_cost(list(p))) for p in space)), key=lambda x: x[0])
    best = float("inf")
    for bound, p, c in costs:
        if bound > best:
            break
        best = min(best, timed.annotate(c.with_fused(len(plan_work(p, fusion=fusion).into))).seconds)
    return best


def _small_program(name, rng):
    A, B = _mat(rng, (4, 4), 2, "A"), _mat(rng, (4, 4), 2, "B")
    return {
        "matmul 1x3x2": lambda: matmul(_mat(rng, (2, 6), 2, "A"), _mat(rng, (6, 4), 2, "B")),
        "matmul + add": lambda: td.join(matmul(A, _mat(rng, (4, 2), 2, "C")), _mat(rng, (4, 2), 2, "D"),
                                        (0, 1), (0, 1), "add"),
        "add + row_sum": lambda: td.transform(td.join(A, B, (0, 1), (0, 1), "add"), "row_sum"),
        "agg of mul": lambda: td.aggregate(td.join(A, B, (0, 1), (0, 1), "mul"), (0,), "add"),
        "rekey + add": lambda: td.join(td.rekey(A, (k1, k0)), B, (0, 1), (0, 1), "add"),
    }[name]()


@pytest.mark.slow
@pytest.mark.parametrize("name,sites", [("matmul 1x3x2", 3), ("matmul + add", 2), ("add + row_sum", 3),
                                        ("agg of mul", 2), ("rekey + add", 3)])
def test_time_objective_finds_the_fastest_fused_plan_of_its_space(name, sites):
    """The search's whole space, unpruned, every plan fused as the optimizer fuses it:
    no plan is predicted faster than the time objective's (without its error band,
    which may trade time for less traffic on purpose) — on the default spec and on
    skewed ones.  (Ranked before fusion with 4 runners-up fused again, it missed in
    12 of 44 such cases: a matmul and an add by 3%, and by 36% with 20 ms tasks.)"""
    from tra_dask.optimizer.objective import FastestTime

    expr = _small_program(name, np.random.default_rng(sites))
    space = enumerate_dp_space(list(td.compile(expr, sites).outputs), RULES, limit=4000)
    for kind, kw in SPECS.items():
        spec = td.ClusterSpec(sites, **kw)
        got = td.optimize(expr, sites, objective=FastestTime(cluster=spec, band=0.0)).cost.seconds
        assert got <= _fastest_fused(space, spec) * (1 + 1e-12), kind


def _keys_only(shape, blocks, name):
    chunks = tuple(-(-s // b) for s, b in zip(shape, blocks))
    return td.from_function(lambda k: None, shape, chunks, "float64", name=name)


@pytest.mark.parametrize("P,shape,blocks", [
    (8, (16384, 16384, 16384), (4, 4, 4)),
    (64, (16384, 16384, 16384), (8, 8, 8)),
    (8, (10_000, 640_000, 10_000), (1, 64, 1)),
    (64, (10_000, 640_000, 10_000), (2, 128, 2)),
    (64, (80_000, 10_000, 80_000), (16, 2, 16)),
])
def test_matmul_plans_reach_the_communication_lower_bound(P, shape, blocks):
    m, k, n = shape
    A, B = _keys_only((m, k), blocks[:2], "A"), _keys_only((k, n), blocks[1:], "B")
    plan = td.optimize(matmul(A, B), objective="bytes", sites=P)
    bound = matmul_lower_bound(m, k, n, P) * P  # every site does its share, so each must receive the bound
    assert plan.cost.flops_balance <= 1.01
    assert bound <= plan.cost.floats_moved <= 1.3 * bound


def test_two_large_dims_on_8_sites_is_the_best_grid():
    """80000 x 10000 x 80000 on 8 sites (the bound's 2-D regime: A and B at their
    shares, C touched 2.83 x 2.83 finer): the bound needs a 2.83 x 1 x 2.83 grid; the
    best integer grids (2x1x4, 4x1x2) move 3.2e9 floats, 1.09x the bound, and the
    search finds one."""
    A, B = _keys_only((80_000, 10_000), (8, 1), "A"), _keys_only((10_000, 80_000), (1, 8), "B")
    plan = td.optimize(matmul(A, B), objective="bytes", sites=8)
    assert plan.cost.floats_moved == 3_200_000_000
    assert plan.cost.floats_moved / (matmul_lower_bound(80_000, 10_000, 80_000, 8) * 8) == pytest.approx(1.0938, abs=1e-4)
    assert any("2x1x4" in s or "4x1x2" in s for s in plan.strategies())


def test_grid_plans_compute_the_product():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(8, 12)), rng.normal(size=(12, 8))
    expr = matmul(td.from_numpy(a, (2, 3), name="A"), td.from_numpy(b, (3, 2), name="B"))
    plan = td.optimize(expr, objective="bytes", sites=8)
    grids = [p for p in [plan, *plan.alternatives] if any("grid of sites" in s for s in p.strategies())]
    assert grids
    for p in grids:
        sim = td.simulate(p)
        got = np.block([[sim.result[(i, j)] for j in range(4)] for i in range(4)])
        np.testing.assert_allclose(got, a @ b, rtol=1e-12)
        assert sim.floats_moved == p.cost.floats_moved


def test_grid_placement_is_balanced_and_co_partitions():
    from tra_dask.types import grid_type

    t = grid_type((8, 8, 8), (1, 1, 1), "float64")
    sites = Grid((0, 1, 2), (2, 2, 2), 8).sites(t)
    assert np.bincount(sites).tolist() == [64] * 8
    left = grid_type((8, 8), (1, 1), "float64")
    s_left = Grid((0, 1, None), (2, 2, 2), 8).sites(left)
    # a left chunk (i, k) sits on a site of its (i, k) cell: the grid plan's shuffle finds it there
    cell = (left.keys[:, 0] * 2 // 8) * 4 + (left.keys[:, 1] * 2 // 8) * 2
    assert set((s_left - cell).tolist()) <= {0, 1}
    with pytest.raises(ValueError, match="4x2 grid has 8 sites, more than the 4 there are"):
        Grid((0, 1), (4, 2), 4)
    # a grid smaller than the cluster: sites 0-3 of 8, the others idle
    assert set(Grid((0, 1), (2, 2), 8).sites(left).tolist()) == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="drives at most one axis"):
        Grid((0, 0), (2, 2), 4)


def test_balance_is_a_tie_breaker_not_a_gate():
    """The CLI's common-large-dim multiply on 3 sites in 4x4 blocks: the plan moving
    3.8 MiB at balance 1.5 beats one moving 488 MiB (main picked the latter)."""
    A, B = _keys_only((500, 32_000), (4, 4), "A"), _keys_only((32_000, 500), (4, 4), "B")
    plan = td.optimize(matmul(A, B), objective="bytes", sites=3)
    assert plan.cost.bytes_moved < 5 * 2**20


def test_serial_plans_lose():
    """A multiply whose result is one chunk: running every product on one site moves
    nothing, but leaves 7 of 8 sites idle; the objective counts that."""
    A, B = _keys_only((1000, 64_000), (1, 64), "A"), _keys_only((64_000, 1000), (64, 1), "B")
    plan = td.optimize(matmul(A, B), objective="bytes", sites=8)
    assert plan.cost.flops_balance < 1.05 and plan.cost.floats_moved > 0


def test_objective_is_pluggable():
    class FewestTasks:
        name, memory_limit = "tasks", None

        def __call__(self, cost):
            return (cost.tasks, cost.floats_moved)

    A, B = _keys_only((400, 400), (4, 4), "A"), _keys_only((400, 400), (4, 4), "B")
    plan = td.optimize(matmul(A, B), sites=4, objective=FewestTasks())
    assert plan.search.objective.name == "tasks"
    assert plan.cost.tasks == min([plan.cost.tasks] + [a.cost.tasks for a in plan.alternatives])


def test_bad_input_is_a_clear_error():
    A, B = _keys_only((400, 400), (4, 4), "A"), _keys_only((400, 400), (4, 4), "B")
    e = matmul(A, B)
    with pytest.raises(ValueError, match="unknown cost_model 'bytes'; valid: exact, paper"):
        td.optimize(e, objective="bytes", sites=2, cost_model="bytes")
    with pytest.raises(ValueError, match="unknown objective 'speed'; valid: time, bytes"):
        td.optimize(e, sites=2, objective="speed")
    with pytest.raises(ValueError, match="a cluster spec is for the 'time' objective"):
        td.optimize(e, sites=2, objective="bytes", cluster=td.ClusterSpec(2))
    with pytest.raises(TypeError, match="objective must be a name"):
        td.optimize(e, sites=2, objective=42)
    with pytest.raises(ValueError, match="beam must be an int >= 1, got 1.5"):
        td.optimize(e, objective="bytes", sites=2, beam=1.5)
    with pytest.raises(ValueError, match="budget must be an int >= 1, got '10'"):
        td.optimize(e, objective="bytes", sites=2, budget="10")
    with pytest.raises(ValueError, match="memory_limit 'lots' is not a size"):
        td.optimize(e, objective="bytes", sites=2, memory_limit="lots")
    with pytest.raises(ValueError, match="positive, finite number of bytes"):
        td.optimize(e, objective="bytes", sites=2, memory_limit=-1)
    # a size string is parsed as Dask parses it
    free = td.optimize(e, objective="bytes", sites=2)
    assert td.optimize(e, objective="bytes", sites=2, memory_limit="1GB").cost.floats_moved == free.cost.floats_moved
    # no plan fits: the error names the smallest peak of any plan found
    with pytest.raises(ValueError, match=r"no plan fits in 1,000 bytes per site: the smallest peak .* is [\d,]+ bytes"):
        td.optimize(e, objective="bytes", sites=2, memory_limit="1kB")


def test_budget_cut_short_says_so():
    A, B = _keys_only((400, 400), (4, 4), "A"), _keys_only((400, 400), (4, 4), "B")
    plan = td.optimize(matmul(A, B), objective="bytes", sites=4, budget=5)
    assert plan.search.truncated and "budget exhausted" in plan.explain()
    assert plan.search.rewrites == 5


def test_equal_nodes_built_apart_are_one_set_of_arrays():
    """Found by the soundness test: a source reached along two paths (a filter that
    keeps everything, and directly) was two structurally equal nodes with different
    array ids, so two shuffles of the same chunks to the same sites were predicted as
    two transfers where the simulator (and Dask) make one."""
    S = td.from_numpy(np.random.default_rng(0).random((2, 2)), (1, 1), name="S0")
    e = td.transform(td.join(td.filter(S, k0 == k0), S, (0, 1), (0, 1), "mul"), "row_sum")
    for sites in (2, 3):
        plan = td.optimize(e, objective="bytes", sites=sites)
        for p in [plan, *plan.alternatives]:
            assert td.simulate(p).floats_moved == p.cost.floats_moved


def test_a_kernel_that_returns_its_input_still_makes_a_new_array():
    """Found by the soundness campaign: ``identity`` hands back its input object, and
    the simulator took the result for the source's own array (one transfer where the
    runtime, whose kernel task is a new key, makes two)."""
    S = td.from_numpy(np.random.default_rng(0).normal(size=(2, 2)), (1, 1), name="S1")
    e = td.join(S, td.transform(S, "identity"), (1,), (1,), "mul")
    for sites in (2, 3):
        plan = td.optimize(e, objective="bytes", sites=sites)
        for p in [plan, *plan.alternatives]:
            assert td.simulate(p).floats_moved == p.cost.floats_moved


def test_grids_for_a_contraction_of_vector_chunks():
    """Found by the soundness test: a contraction whose key arity is 2 but whose
    chunks are vectors made the grid estimate index a missing chunk dim."""
    S = td.from_numpy(np.random.default_rng(0).random(1), (1,), name="S0")
    j = td.join(S, S, (), (), "add")
    e = td.aggregate(td.join(j, j, (0,), (0,), "add"), (1, 2), "add")
    ref = td.evaluate(e)
    for p in [td.optimize(e, objective="bytes", sites=2)]:
        sim = td.simulate(p)
        assert all(np.allclose(sim.result[k], ref[k]) for k in ref)


def _speech_step_as_persisted():
    """The FFNN speech step (benchmarks/ffnn.py, float32) over inputs where one Dask
    persist on 2 workers put them, and that cluster's calibration (2026-11-26)."""
    N, D, H, L = 10_000, 1600, 10_000, 10
    shapes = {"X": ((N, D), (4, 2)), "Y": ((N, L), (4, 1)), "W1": ((D, H), (2, 4)), "W2": ((H, L), (4, 1))}
    rel = {n: td.from_function(lambda k: None, s, tuple(-(-a // b) for a, b in zip(s, g)), "float32", name=n)
           for n, (s, g) in shapes.items()}
    where = {"X": "10101010", "Y": "0101", "W1": "10101100", "W2": "0101"}
    placements = {n: {k: int(c) for k, c in zip(np.ndindex(*shapes[n][1]), where[n])} for n in shapes}
    spec = td.ClusterSpec(2, memory_per_site=12.6e9, bandwidth=3.06e9, rates={"blas": 8.53e10, "elementwise": 1.38e9},
                          task_overhead=5.04e-4, submit_overhead=0.0098, blas_half_size=0.0, blas_float32=2.36,
                          fresh_bandwidth=2.14e10)
    return ffnn_sgd_step(rel["X"], rel["Y"], rel["W1"], rel["W2"], 0.1), placements, spec


@pytest.mark.slow
def test_a_subexpression_both_results_read_is_computed_once():
    """The forward product X @ W1 feeds both weight updates.  On this placement the
    search planned each update over its own placement of it — 484 GFLOP per site where
    one evaluation is 323, predicted 2.8 s where 1.9 s was possible — because each
    output's few kept candidates were ranked on their own.  The search now plans the
    readers again over each of the twice-computed node's candidates alone."""
    from tra_dask.optimizer.objective import as_objective
    from tra_dask.optimizer.search import search

    step, placements, spec = _speech_step_as_persisted()
    plan = td.optimize(step, sites=2, placements=placements, objective="time", cluster=spec, memory_limit=7.5e9)
    once = plan.compiled.cost.flops_per_site.sum()  # the compiled plan computes every node once
    assert plan.cost.flops_per_site.sum() <= 1.01 * once
    assert plan.cost.seconds < 2.2
    # without planning the readers again, the same search keeps the plan that computes it twice
    compiled = td.compile(step, 2, placements=placements)
    timed = as_objective("time", 7.5e9, spec)
    twice = search(list(compiled.outputs), RULES, objective=timed, reshare=0)
    assert twice.best_cost.flops_per_site.sum() > 1.4 * once
    assert timed(plan.search.first_pass_cost) == timed(twice.best_cost)  # (what the search reports of it)
    assert timed.seconds(twice.best_cost) > plan.cost.seconds * 1.3


def _shared_host_spec(sites):
    """Three one-thread workers on one 2-core host, dgemm 1.24x as fast alone: a
    calibration of this VM (2026-12-02)."""
    return td.ClusterSpec(sites, memory_per_site=8.4e9, bandwidth=2.0e9, hosts=[0] * sites, cores=2,
                          rates={"blas": 1.94e10, "elementwise": 8.7e8},
                          rates_alone={"blas": 2.41e10, "elementwise": 1.32e9}, task_overhead=1.05e-3,
                          submit_overhead=0.0136, blas_half_size=47.0, blas_float32=1.97, fresh_bandwidth=1.06e10)


@pytest.mark.parametrize("case", ["persisted, 2 sites", "shared host, 3 sites"])
def test_planning_readers_again_saves_no_more_than_computing_once_can(case, monkeypatch):
    """The search plans a twice-computed node's readers again only where computing it
    once could save RESHARE_GAIN of the best plan's seconds; the bound it reads
    (``_once_saves``: the dropped candidates' site-seconds and task overheads) is at
    least what one round of planning again gains, with or without the gate."""
    from tra_dask.optimizer.objective import as_objective

    if case.startswith("persisted"):
        step, placements, spec = _speech_step_as_persisted()
        compiled, sites = td.compile(step, 2, placements=placements), 2
    else:
        rng = np.random.default_rng(0)
        X, Y = td.from_numpy(rng.random((2500, 1600)), (2500, 1600), "X"), td.from_numpy(rng.random((2500, 10)), (2500, 10), "Y")
        W1 = td.from_numpy(rng.random((1600, 2500)), (1600, 1250), "W1")
        W2 = td.from_numpy(rng.random((2500, 10)), (1250, 10), "W2")
        spec, sites = _shared_host_spec(3), 3
        compiled = td.compile(ffnn_sgd_step(X, Y, W1, W2, 0.1), sites)
    timed = as_objective("time", None, spec)
    bounds = []
    once_saves = S._once_saves

    def recorded(*a):
        bounds.append(once_saves(*a))
        return bounds[-1]

    monkeypatch.setattr(S, "_once_saves", recorded)
    monkeypatch.setattr(S, "RESHARE_GAIN", 0.0)
    again = S.search(list(compiled.outputs), RULES, objective=timed, reshare=1)
    gain = timed.seconds(again.first_pass_cost) - timed.seconds(again.best_cost)
    assert len(bounds) <= 1 and (bounds or gain == 0)
    if bounds:
        assert 0 <= gain <= bounds[0] + 1e-12, (gain, bounds)
    monkeypatch.setattr(S, "RESHARE_GAIN", 0.01)  # the gate: a round is planned only where it may pay
    gated = S.search(list(compiled.outputs), RULES, objective=timed, reshare=1)
    if bounds and bounds[-1] < 0.01 * timed.seconds(again.first_pass_cost):
        assert gated.candidates < again.candidates and timed(gated.best_cost) == timed(again.first_pass_cost)
    else:
        assert timed(gated.best_cost) == timed(again.best_cost)


class _CheckedCosts(DeliveredCosts):
    """DeliveredCosts that checks each subplan's cost against plan_cost of it whole."""
    checked = 0

    def __call__(self, root):
        got = super().__call__(root)
        want = plan_cost([root], self.model, whole=True)
        assert list(got.nodes) == list(want.nodes), root
        for n, a in got.nodes.items():
            b = want.nodes[n]
            assert (a.floats_moved, a.tasks) == (b.floats_moved, b.tasks), n
            for f in ("peak_bytes_per_site", "flops_per_site", "tasks_per_site", "recv_per_site", "send_per_site"):
                x, y = getattr(a, f), getattr(b, f)
                assert (x is None) == (y is None) and (x is None or np.array_equal(x, y)), (f, n)
        assert (got.floats_moved, got.bytes_moved) == (want.floats_moved, want.bytes_moved), root
        assert np.array_equal(got.peak_bytes_per_site, want.peak_bytes_per_site), root
        assert np.allclose(got.flops_per_site, want.flops_per_site, rtol=1e-12), root
        for spec in (td.ClusterSpec(root.nsites), td.ClusterSpec(root.nsites, cores=1)):  # (shared hosts)
            assert makespan(got, spec) == pytest.approx(plan_seconds(want, spec)[0], rel=1e-12), root
        _CheckedCosts.checked += 1
        return got


def test_a_move_of_a_renamed_copy_is_costed_as_the_whole_subplan():
    """Two moves of one array to one site make one copy (the second is renamed to the
    first's), so a later move of the second copy repeats a move of the first: its codes
    do not show it.  The incremental cost must take it from the whole subplan (here 8
    floats, not 12)."""
    from tra_dask.keys import insert_dim
    from tra_dask.physical import Part, PSource, Shuffle
    from tra_dask.physical.nodes import KeyArrayMap, LocalMap

    S_ = td.from_numpy(np.arange(4.0).reshape(1, 4), (1, 4), name="S")
    two = LocalMap(PSource(S_, Part((0,), 3)), KeyArrayMap(insert_dim(2, 2)))  # keys 0, 1: one array, site 0
    m1 = Shuffle(two, (2,), table=(1, 0))  # key 0 to site 1 (copy c1)
    m2 = Shuffle(m1, (2,), table=(1, 1))  # key 1 to site 1: the same array again (c2 is c1)
    m3 = Shuffle(m2, (2,), table=(2, 1))  # c1 to site 2
    n = Shuffle(m3, (2,), table=(2, 2))  # c2 (= c1) to site 2: no transfer
    got, want = DeliveredCosts("exact")(n), plan_cost([n], "exact", whole=True)
    assert [c.floats_moved for c in got.nodes.values()] == [c.floats_moved for c in want.nodes.values()]
    assert got.floats_moved == want.floats_moved == td.simulate(td.Plan((n,))).floats_moved == 8


@settings(max_examples=80, deadline=None, derandomize=True, database=None)
@given(st.integers(2, 4), st.data())
def test_chains_of_moves_of_one_array_cost_as_their_whole_subplans(keys, data):
    """Chains of moves (Shuffles to random sites, Broadcasts) over keys that all hold one
    array — repeated moves, renamed copies, moves of them — and joins of two such
    chains: every node's incremental cost is plan_cost of its whole subplan."""
    from tra_dask.keys import insert_dim
    from tra_dask.physical import Broadcast, LocalJoin, Part, PlacementError, PSource, Shuffle
    from tra_dask.physical.nodes import KeyArrayMap, LocalMap

    S_ = td.from_numpy(np.arange(4.0).reshape(1, 4), (1, 4), name="S")
    base = LocalMap(PSource(S_, Part((0,), 3)), KeyArrayMap(insert_dim(2, keys)))

    def chain(n):
        for _ in range(data.draw(st.integers(1, 5))):
            if data.draw(st.integers(0, 4)) == 0 and n.layout.nsites:
                n = Broadcast(n)
            else:
                n = Shuffle(n, (2,), table=tuple(data.draw(st.lists(st.integers(0, 2), min_size=keys, max_size=keys))))
        return n

    roots = [chain(base)]
    try:
        roots.append(LocalJoin(roots[0], chain(base), (2,), (2,), td.kernels.get_kernel("add")))
    except PlacementError:  # the two chains' placements do not co-locate the keys
        pass
    delivered = DeliveredCosts("exact")
    for n in toposort(roots):
        got, want = delivered(n), plan_cost([n], "exact", whole=True)
        assert list(got.nodes) == list(want.nodes)
        assert [c.floats_moved for c in got.nodes.values()] == [c.floats_moved for c in want.nodes.values()], n


def test_a_search_whose_beam_never_bound_finds_what_a_wider_beam_finds():
    """A search that kept every placement signature at every node
    (SearchResult.beam_unbound) searched the whole space a wider beam would: the chunk
    choice takes its quick plan as the full one (optimize.searched_alike).  On random
    programs, the quick search (beam 2) and the default (beam 6) then rank the same
    candidates and choose plans of equal cost; where the beam bound, it says so."""
    from tra_dask.optimizer.optimize import searched_alike

    seen = {"unbound": 0, "bound": 0}

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
    @given(programs())
    def prop(prog):
        outs, sites, placements = prog
        quick = td.optimize(outs, sites=sites, placements=placements, options="quick")
        wide = td.optimize(outs, sites=sites, placements=placements, options="auto")
        if searched_alike(quick, "quick", "auto"):
            seen["unbound"] += 1
            assert quick.search.candidates == wide.search.candidates
            assert (quick.cost.seconds, quick.cost.floats_moved) == (wide.cost.seconds, wide.cost.floats_moved)
        elif wide.search.candidates > quick.search.candidates:
            seen["bound"] += 1

    prop()
    assert seen["unbound"] >= 5 and seen["bound"] >= 1, seen


@pytest.mark.parametrize("sites", [2, 3])
def test_moves_of_one_array_in_two_branches_are_counted_once_incrementally(sites, monkeypatch):
    """X.T @ (X @ W): X moves in both branches, so adding the branches' subplan costs
    would count a move of X to a site twice.  The search counts the movers' moves
    again over the subplan in plan order (cost._counted_once) instead of costing it
    whole; every candidate's cost equals plan_cost of its whole subplan, node by node."""
    import sys

    import tra_dask.optimizer.cost as C

    rng = np.random.default_rng(1)
    X = td.from_numpy(rng.random((6, 6)), (2, 3), name="X")
    W = td.from_numpy(rng.random((6, 4)), (3, 2), name="W")
    e = td.aggregate(td.join(X, matmul(X, W), (0,), (0,), "matmul_tn"), (1, 2), "add")
    recounted = []
    counted_once = C._counted_once

    def spy(*a):
        recounted.append(sys._getframe(1).f_code.co_name)
        return counted_once(*a)

    monkeypatch.setattr(C, "_counted_once", spy)
    monkeypatch.setattr(S, "DeliveredCosts", _CheckedCosts)
    before = _CheckedCosts.checked
    where = {(0, 0): 1, (0, 1): 0, (1, 0): 0, (1, 1): 1, (2, 0): 1, (2, 1): 1}
    td.optimize(e, sites=sites, placements={"X": {k: v % sites for k, v in where.items()}})
    assert _CheckedCosts.checked > before
    assert recounted.count("_added") >= 5, recounted  # (the path under test ran)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(programs(), st.sampled_from(["exact", "paper"]))
def test_incremental_subplan_costs_are_the_whole_subplans(prog, model):
    """The search costs a candidate from its children's subplans' costs where that is
    exact (cost.DeliveredCosts), and its predicted seconds from theirs
    (time.makespan): on random programs (shared subexpressions, moves of one array in
    two branches, several outputs, fixed placements) every candidate's cost equals
    plan_cost of its whole subplan, node by node, and its seconds plan_seconds'."""
    outs, sites, placements = prog
    before = _CheckedCosts.checked
    saved = S.DeliveredCosts
    S.DeliveredCosts = _CheckedCosts
    try:
        td.optimize(outs, sites=sites, placements=placements, cost_model=model)
    finally:
        S.DeliveredCosts = saved
    assert _CheckedCosts.checked > before


def test_a_move_whose_copies_no_reader_takes_is_dropped_from_the_best_plan():
    """Of candidates alike in layout and key the search keeps the first, which may
    carry a Broadcast whose copies no reader takes: the best plan is costed again
    without it (the same plan, fewer nodes and tuples); a move a reader needs stays."""
    from tra_dask.kernels import get_kernel
    from tra_dask.physical import Broadcast, LocalJoin, Part, PSource

    rng = np.random.default_rng(5)
    A, B = _mat(rng, (4, 4), 2, "A"), _mat(rng, (4, 4), 2, "B")
    a, b = PSource(A, Part((0,), 2)), PSource(B, Part((0,), 2))
    add = get_kernel("add")
    idle = [LocalJoin(Broadcast(a), b, (0, 1), (0, 1), add)]  # a and b are co-partitioned: no copy is read
    cost = plan_cost(idle)
    assert cost.floats_moved == 0
    got, got_cost = S._idle_moves_dropped(idle, cost, FewestBytes(), "exact")
    assert got == [LocalJoin(a, b, (0, 1), (0, 1), add)]
    assert FewestBytes()(got_cost)[:-1] == FewestBytes()(cost)[:-1] and got_cost.tuples < cost.tuples
    needed = [LocalJoin(Broadcast(a), PSource(B, Part((1,), 2)), (0, 1), (0, 1), add)]
    cost = plan_cost(needed)
    assert cost.floats_moved > 0
    assert S._idle_moves_dropped(needed, cost, FewestBytes(), "exact")[0] is needed


@pytest.mark.parametrize("objective", ["bytes", "time"])
def test_candidates_alike_in_layout_and_key_are_kept_once(objective):
    """Over one-block operands nearly every rewrite makes a plan alike to one seen (a
    move of a tuple that stays where it is, a broadcast no join reads, every Part of a
    one-block source): each node keeps one of each layout and key, and rewrites only
    that one (the search ranked 201 candidates for this chain when it kept them all)."""
    rng = np.random.default_rng(0)
    A, B, C = (td.from_numpy(rng.normal(size=s), s, name=n) for s, n in (((6, 4), "A"), ((4, 5), "B"), ((5, 3), "C")))
    plan = td.optimize(matmul(matmul(A, B), C), sites=2, objective=objective)
    assert plan.cost.floats_moved == 0 and plan.search.candidates <= 40
    sim = td.simulate(plan)
    np.testing.assert_allclose(sim.result[(0, 0)], td.to_numpy(A) @ td.to_numpy(B) @ td.to_numpy(C))
    assert sim.floats_moved == 0
