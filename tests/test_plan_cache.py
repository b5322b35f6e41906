"""Plans reused across submissions of the same structure (issue 15: planning off the
hot path): the signature, rebinding, the LRU, and the runtime's use of it."""

from __future__ import annotations

import gc
import time
import weakref

import dask
import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.optimizer.cache import PlanCache, rebind, signature


def _mm(a, b, chunks=(3, 3)):
    return td.programs.matmul(td.from_numpy(a, chunks, name="A"), td.from_numpy(b, chunks, name="B"))


def _sources(expr):
    return signature(expr)[1]


def test_signature_ignores_data_and_sees_structure():
    rng = np.random.default_rng(0)
    a, b, c = (rng.random((7, 5)) for _ in range(3))
    d = rng.random((5, 4))
    same = signature(_mm(a, d))[0]
    assert signature(_mm(b, d))[0] == same  # other numbers, same types
    assert signature(_mm(a, d, chunks=(2, 2)))[0] != same  # other chunking
    assert signature(_mm(a.astype(np.float32), d.astype(np.float32)))[0] != same  # other dtype
    assert signature(_mm(np.ones((8, 5)), d))[0] != same  # other shape
    A = td.from_numpy(a, (3, 3), name="A")
    assert signature(td.transform(A, "neg"))[0] != signature(td.transform(A, "exp"))[0]  # other kernel
    # one source read twice is not two sources that happen to have the same type
    C = td.from_numpy(c, (3, 3), name="C")
    twice = td.join(A, A, (0, 1), (0, 1), "add")
    two = td.join(A, C, (0, 1), (0, 1), "add")
    assert signature(twice)[0] != signature(two)[0]
    assert len(_sources(twice)) == 1 and len(_sources(two)) == 2
    # a fixed placement is part of a source's slot
    assert signature(_mm(a, d), lambda s: "here")[0] != same


@pytest.mark.parametrize("sites", [1, 2, 3])
def test_a_rebound_plan_computes_the_new_data(sites):
    rng = np.random.default_rng(sites)
    a, b = rng.random((9, 6)), rng.random((6, 8))
    first = _mm(a, b)
    plan = td.optimize(first, sites=sites)
    cache = PlanCache()
    key = signature(first)[0]
    cache.put(key, plan, _sources(first))
    for _ in range(3):
        a2, b2 = rng.random((9, 6)), rng.random((6, 8))
        nxt = _mm(a2, b2)
        again = cache.get(key, nxt, _sources(nxt))
        assert again is not None and again.stages[0].name == "cache"
        assert again.expr is nxt
        got = td.simulate(again).result
        assert set(got) == set(td.evaluate(nxt))
        np.testing.assert_allclose(td.to_numpy(nxt, got), a2 @ b2)
        # the same operators, placements and predicted cost as a plan made for it
        fresh = td.optimize(nxt, sites=sites)
        assert again.cost.floats_moved == fresh.cost.floats_moved == plan.cost.floats_moved
        assert again.strategies() == plan.strategies()
        assert len(again.alternatives) == len(plan.alternatives)
        assert all(td.simulate(alt).result.keys() == got.keys() for alt in again.alternatives[:3])
        # fused and timed when read (not when cached): the same as the first plan's
        assert [(x.cost.tasks, x.cost.seconds) for x in again.alternatives] == [
            (x.cost.tasks, x.cost.seconds) for x in plan.alternatives]
        def tree(p):
            return [ln for ln in p.explain().splitlines()[1:] if not ln.startswith("  search:")]

        assert tree(again) == tree(fresh)
    assert cache.hits == 3 and cache.misses == 0


def test_the_cache_keeps_no_data_alive():
    a, b = np.random.rand(40, 30), np.random.rand(30, 20)
    ref = weakref.ref(a)
    expr = _mm(a, b, (10, 10))
    plan = td.optimize(expr, sites=2)
    cache = PlanCache()
    cache.put("k", plan, _sources(expr))
    del a, expr, plan
    gc.collect()
    assert ref() is None  # only the types and placements are kept
    nxt = _mm(np.ones((40, 30)), np.ones((30, 20)), (10, 10))
    hit = cache.get("k", nxt, _sources(nxt))
    got = td.simulate(hit).result
    np.testing.assert_allclose(td.to_numpy(nxt, got), np.full((40, 20), 30.0))
    # its alternatives were never derived before it was cached: they are, over the new data
    assert hit.alternatives and all(td.simulate(alt).result.keys() == got.keys() for alt in hit.alternatives)


@pytest.mark.parametrize("sites", [2, 3])
def test_explain_counts_alternatives_without_making_them(sites):
    """Fusing and timing each alternative costs ms (60 ms for the FFNN xml step's, on
    every submission: td.submit's dashboard record is the plan's explain); the count
    it shows needs none of them made."""
    rng = np.random.default_rng(sites)
    first, nxt = (_mm(rng.random((9, 6)), rng.random((6, 8))) for _ in range(2))
    cache = PlanCache()
    cache.put(signature(first)[0], td.optimize(first, sites=sites), _sources(first))
    hit = cache.get(signature(nxt)[0], nxt, _sources(nxt))
    for plan in (td.optimize(first, sites=sites), hit):
        text = plan.explain()
        assert not isinstance(plan._alternatives, tuple)  # counted, not made
        n = len(plan.alternatives)
        assert n > 0 and f"; {n} alternatives kept" in text
        assert plan.explain() == text  # the same once they are made


def test_lru_evicts_and_refuses():
    cache = PlanCache(maxsize=2)
    exprs = [_mm(np.ones((4 + i, 3)), np.ones((3, 2))) for i in range(3)]
    for i, e in enumerate(exprs):
        cache.put(i, td.optimize(e, sites=2), _sources(e))
    assert len(cache) == 2
    assert cache.get(0, exprs[0], _sources(exprs[0])) is None  # evicted
    assert cache.get(2, exprs[2], _sources(exprs[2])) is not None
    assert cache.get(1, exprs[1], _sources(exprs[1]), accept=lambda p, extra: False) is None
    assert (cache.hits, cache.misses) == (1, 2)


def test_a_slot_is_never_loaded():
    e = _mm(np.ones((4, 3)), np.ones((3, 2)))
    cache = PlanCache()
    cache.put("k", td.optimize(e, sites=2), _sources(e))
    stored = cache._items["k"][0]
    with pytest.raises(RuntimeError, match="stand-in"):
        td.simulate(stored)


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=3, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def _step(client, rng, workers=None):
    a, b = rng.random((60, 40)), rng.random((40, 50))
    expr = _mm(a, b, (20, 20))
    plan = td.plan_for(expr, client, workers)
    rf = td.submit(plan, client=client, sites=workers)
    np.testing.assert_allclose(rf.to_numpy(), a @ b)
    assert rf.transfers() == plan.cost.bytes_moved  # measured bytes still equal predicted
    return plan


def test_repeated_submissions_reuse_the_plan_on_a_cluster(client):
    from tra_dask.runtime.submit import _plan_cache

    rng = np.random.default_rng(7)
    _plan_cache(client).clear()
    first = _step(client, rng)
    assert first.stages[0].name != "cache"
    for _ in range(3):  # a training loop's next steps: new data, same structure
        plan = _step(client, rng)
        assert plan.stages[0].name == "cache"
        assert plan.strategies() == first.strategies()
    assert _plan_cache(client).hits == 3
    # another set of workers is another plan
    workers = sorted(client.scheduler_info()["workers"])[:2]
    assert _step(client, rng, workers).stages[0].name != "cache"
    assert _step(client, rng, workers).stages[0].name == "cache"
    # td.submit(expr) goes through the same cache
    a, b = rng.random((60, 40)), rng.random((40, 50))
    rf = td.submit(_mm(a, b, (20, 20)), client=client)
    assert rf.plan.stages[0].name == "cache"
    np.testing.assert_allclose(rf.to_numpy(), a @ b)


def test_threads_that_miss_one_key_at_once_plan_it_once(client, monkeypatch):
    """Eight threads plan the same structure over their own data at once: one of them
    searches, the others wait for its plan and get it from the cache (rebound to their
    data), each exact."""
    import importlib
    import threading

    submit = importlib.import_module("tra_dask.runtime.submit")  # (the package's `submit` is the function)
    submit._plan_cache(client).clear()
    searches, real = [], submit._optimize

    def slow_search(*a, **k):  # (long enough that every thread misses while it runs)
        searches.append(1)
        time.sleep(1.0)
        return real(*a, **k)

    monkeypatch.setattr(submit, "_optimize", slow_search)
    rng = np.random.default_rng(11)
    data = [(rng.random((12, 9)), rng.random((9, 6))) for _ in range(8)]
    got, errors = [None] * 8, []

    def plan(i):
        try:
            got[i] = td.plan_for(_mm(*data[i], (3, 3)), client)
        except Exception as e:  # (reported below)
            errors.append(e)

    threads = [threading.Thread(target=plan, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(searches) == 1
    assert sum(p.stages[0].name == "cache" for p in got) == 7
    for p, (a, b) in zip(got, data):
        np.testing.assert_allclose(td.to_numpy(p.expr, td.simulate(p).result), a @ b, rtol=1e-12)


def test_a_planner_that_fails_lets_the_waiting_threads_plan():
    """The thread planning a key is done whether it succeeds or raises: the others wait
    for it, then look again (and plan themselves on a miss)."""
    import threading

    cache, order = PlanCache(), []

    def first():
        with pytest.raises(RuntimeError), cache.planning("k") as mine:
            assert mine
            order.append("first plans")
            time.sleep(0.5)
            raise RuntimeError("no plan")

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.1)
    with cache.planning("k") as mine:
        order.append(f"second planning: {mine}")
    t.join(10)
    assert order == ["first plans", "second planning: False"]
    with cache.planning("k") as mine:
        assert mine  # nobody is planning it now


def test_the_cache_can_be_turned_off(client):
    rng = np.random.default_rng(8)
    _step(client, rng)
    with dask.config.set({"tra-dask.plan-cache": False}):
        assert _step(client, rng).stages[0].name != "cache"


def test_cluster_data_in_another_place_is_another_plan(client):
    import dask.array as da

    rng = np.random.default_rng(9)
    workers = sorted(client.scheduler_info()["workers"])
    b = rng.random((40, 50))
    plans = []
    for where in (workers[:1], workers[1:2], workers[1:2]):
        a = rng.random((60, 40))
        x = client.persist(da.from_array(a, chunks=(20, 20)), workers=where)
        X = td.from_dask_array(x, name="X")
        expr = td.programs.matmul(X, td.from_numpy(b, (20, 20), name="B"))
        plan = td.plan_for(expr, client)
        rf = td.submit(plan, client=client)
        np.testing.assert_allclose(rf.to_numpy(), a @ b)
        plans.append(plan)
    assert plans[1].stages[0].name != "cache"  # the data moved to another worker: planned again
    assert plans[2].stages[0].name == "cache"


@pytest.mark.slow
def test_an_array_expression_of_the_same_structure_reuses_its_chunking():
    from tra_dask.frontend.run import _CHOICES

    rng = np.random.default_rng(11)
    _CHOICES.clear()

    def step(n=30):
        x, w = rng.random((n, 20)), rng.random((20, 25))
        y = np.maximum(td.from_array(x) @ td.from_array(w), 0).sum(axis=1)
        rel, plan = y.to_relation(sites=3)
        np.testing.assert_allclose(td.to_numpy(rel), np.maximum(x @ w, 0).sum(axis=1))
        np.testing.assert_allclose(td.to_numpy(rel, td.simulate(plan).result), np.maximum(x @ w, 0).sum(axis=1))
        return plan.stage("chunking").note

    first = step()
    assert "made before" not in first
    again = step()
    assert "made before" in again and again.startswith(first)
    assert "made before" not in step(n=31)  # another shape is another choice
    assert len(_CHOICES) == 2


def test_array_steps_on_a_cluster_reuse_chunking_and_plan(client):
    rng = np.random.default_rng(12)
    notes = []
    for _ in range(3):
        x, w = rng.random((40, 30)), rng.random((30, 20))
        y = td.from_array(x) @ td.from_array(w)
        plan = y.plan(client)
        notes.append((plan.stages[0].note, [st.name for st in plan.stages]))
        np.testing.assert_allclose(y.compute(), x @ w)
    assert "made before" not in notes[0][0]
    assert all("made before" in n for n, _ in notes[1:])
    assert all("cache" in names for _, names in notes[1:])  # the plan too


def test_an_arrays_plan_is_the_one_its_compute_runs(client, monkeypatch):
    """``x.plan()`` then ``x.compute()`` (the README's example): the plan explained is
    the one compute runs, costed with the results' way back, and compute searches
    nothing again; ``tra_dask.api.plan(x)`` is the plan ``td.submit`` runs, costed without it."""
    import sys

    from tra_dask.api import plan as submits_plan

    searches = []
    opt = sys.modules["tra_dask.optimizer.optimize"]
    search = opt.search
    monkeypatch.setattr(opt, "search", lambda *a, **k: searches.append(1) or search(*a, **k))
    rng = np.random.default_rng(21)
    a, b = rng.random((130, 90)), rng.random((90, 70))
    y = np.maximum(td.einsum("ij,jk->ik", a, b), 0.5).sum(axis=1)
    plan = y.plan(client)
    assert searches and plan.stage("chunking").note
    del searches[:]
    np.testing.assert_allclose(y.compute(client), np.maximum(a @ b, 0.5).sum(axis=1))
    assert not searches  # the chunking and the plan were made by y.plan()
    assert plan.search.objective.spec(plan.sites).gathers == "array"
    submitted = submits_plan(y, client)
    assert submitted.search.objective.spec(submitted.sites).gathers is None


@pytest.mark.slow
@pytest.mark.parametrize("sites", [2, 3, 4])
def test_interning_nodes_in_a_search_changes_no_plan(sites, monkeypatch):
    """The search shares a node's derived type, layout and memos with an equal node
    made before in it (physical.nodes.interned): the same plans, only faster."""
    import contextlib

    import tra_dask.optimizer.search as search_mod
    from tra_dask.programs.data import random_uniform as ru

    exprs = [td.programs.matmul(ru((m, k), (bm, bk), name="A"), ru((k, n), (bk, bn), seed=1, name="B"))
             for (m, k, n), (bm, bk, bn) in [((40, 40, 40), (10, 10, 10)), ((10, 640, 10), (10, 80, 10)),
                                             ((80, 10, 80), (20, 10, 20)), ((9, 7, 5), (3, 4, 2))]]
    if sites == 2:  # (its search is the longest: once)
        exprs.append(td.programs.nearest_neighbor(ru((1, 6), (1, 6), name="q"), ru((75, 6), (10, 6), seed=5, name="X"),
                                                  ru((6, 6), (6, 6), seed=6, name="M")))
    with_interning = [td.optimize(e, sites=sites) for e in exprs]
    monkeypatch.setattr(search_mod, "interned", contextlib.nullcontext)
    without = [td.optimize(e, sites=sites) for e in exprs]
    for a, b in zip(with_interning, without):
        assert a.explain() == b.explain()
        assert [alt.cost.floats_moved for alt in a.alternatives] == [alt.cost.floats_moved for alt in b.alternatives]


def test_a_node_made_as_an_equal_of_another_compares_equal_without_a_walk(monkeypatch):
    """Inside a search a node equal to one made before points to it (``_canon``), and
    equality stops there instead of comparing parameters down both trees; nodes made
    apart still compare by structure, unequal ones stay unequal, and the links end
    with the search (they would keep the other node alive)."""
    import dataclasses

    from tra_dask.node import toposort
    from tra_dask.physical import Shuffle
    from tra_dask.physical.nodes import interned

    plan = td.compile(_mm(np.ones((9, 6)), np.ones((6, 8))), 2)
    s = next(n for n in toposort(plan.outputs) if isinstance(n, Shuffle))
    compared = []
    real = Shuffle._same_extra
    monkeypatch.setattr(Shuffle, "_same_extra", lambda a, b: compared.append(a) or real(a, b))
    with interned(toposort(plan.outputs)):
        again = dataclasses.replace(s, input=s.input)
        other = dataclasses.replace(s, dims=(1,) if s.dims != (1,) else (0,))
        assert again is not s and again.__dict__["_canon"] is s
        compared.clear()
        assert again == s and not compared  # no walk
        assert other != s and other.__dict__.get("_canon") is None
    assert "_canon" not in again.__dict__  # ended with the block
    apart = dataclasses.replace(s, input=s.input)  # outside a search: compared by structure
    compared.clear()
    assert apart == s == again and compared
