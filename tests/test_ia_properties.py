"""Hypothesis properties of the IA: frontier inference, and simulate == evaluate with
moved floats == the exact prediction under random placements and site counts."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tra_dask as td
from tra_dask.keys import Dim, key_map
from tra_dask.optimizer.cost import brute_force_frontier
from tra_dask.physical import LocalFilter, LocalMap, PSource
from tra_dask.programs import matmul

settings.register_profile("tra", max_examples=60, deadline=None)
settings.load_profile("tra")


@st.composite
def grid_relation(draw, max_arity=3):
    arity = draw(st.integers(1, max_arity))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=arity, max_size=arity)))
    return td.from_numpy(np.zeros(shape), 1, name="R")


@st.composite
def predicate(draw, arity):
    d = [Dim(i) for i in range(arity)]
    atoms = []
    for _ in range(draw(st.integers(1, 3))):
        i, j = draw(st.integers(0, arity - 1)), draw(st.integers(0, arity - 1))
        c = draw(st.integers(0, 5))
        kind = draw(st.sampled_from(["lt", "eq", "ge", "sum", "mod"]))
        atoms.append({"lt": d[i] < c, "eq": d[i] == d[j], "ge": d[i] >= c,
                      "sum": d[i] + d[j] <= c, "mod": d[i] % 2 == c % 2}[kind])
    p = atoms[0]
    for q in atoms[1:]:
        p = (p & q) if draw(st.booleans()) else (p | q)
    return p


@given(grid_relation(), st.data())
def test_filter_frontier_by_brute_force_equals_exact(R, data):
    pred = data.draw(predicate(R.key_arity), label="pred")
    node = td.compile(td.filter(R, pred), sites=1).outputs[0]
    assert isinstance(node, LocalFilter)
    assert brute_force_frontier(node) == node.type.frontier


@given(grid_relation(), st.data())
def test_map_frontier_by_brute_force_equals_exact(R, data):
    n = R.key_arity
    perm = data.draw(st.permutations(range(n)), label="perm")
    exprs = [data.draw(st.integers(1, 3)) * Dim(p) + data.draw(st.integers(0, 4)) for p in perm]
    if data.draw(st.booleans()):
        exprs.append(Dim(0) + Dim(n - 1))  # an extra derived dim keeps the map injective
    node = td.compile(td.rekey(R, key_map(*exprs)), sites=1).outputs[0]
    assert isinstance(node, LocalMap)
    assert brute_force_frontier(node) == node.type.frontier


@st.composite
def placement_for(draw, rel, sites):
    kind = draw(st.sampled_from(["part", "all", "keys"]))
    if kind == "all":
        return "all"
    if kind == "part":
        return tuple(draw(st.lists(st.integers(0, rel.key_arity - 1), unique=True, max_size=rel.key_arity)))
    return {k: draw(st.integers(0, sites - 1)) for k in rel.keys}


@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 9), st.integers(1, 5), st.data())
def test_random_placements_simulate_exactly(I, K, J, sites, data):
    ci, ck, cj = (data.draw(st.integers(1, n)) for n in (I, K, J))
    rng = np.random.default_rng(I * 100 + K * 10 + J)
    X = td.from_numpy(rng.normal(size=(I, K)), (ci, ck), name="X")
    Y = td.from_numpy(rng.normal(size=(K, J)), (ck, cj), name="Y")
    expr = (matmul(X, Y), td.aggregate(td.transform(X, "relu"), (1,), "add") if I % ci == 0 else td.transform(X, "exp"))
    placements = {"X": data.draw(placement_for(X, sites)), "Y": data.draw(placement_for(Y, sites))}
    plan = td.compile(expr, sites=sites, placements=placements)
    sim = td.simulate(plan)
    want = td.evaluate(expr)
    for got, ref in zip(sim.result, want):
        assert sorted(got) == sorted(ref)
        for key in ref:
            np.testing.assert_allclose(got[key], ref[key], rtol=1e-12, atol=1e-12)
    assert sim.floats_moved == plan.cost.floats_moved
    assert all(not n.free for n in plan.nodes if isinstance(n, PSource))
    if sites == 1:
        assert sim.floats_moved == 0
