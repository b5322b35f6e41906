"""Grids whose keys are not made, and origins held as recipes: the same plans.

A type made by ``RelationType.grid`` (the full grid below a frontier) makes its key
array only when read; what the planner asks of it (its size, its groups, the sites
of its keys, the type of an insert_dim or aggregation of it, a join of two alike)
is answered from the frontier.  Layouts of pure rekeys, insert_dims and their moves
hold their origins as a recipe (``layout.Gathered``).  Each test compares against
the general rules (the fast paths turned off): equal types, layouts, origin classes,
task inputs and costs."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tra_dask as td
from tra_dask import types as T
from tra_dask.logical.builders import aggregate, join, rekey
from tra_dask.keys import insert_dim
from tra_dask.node import toposort
from tra_dask.physical import layout as L
from tra_dask.physical import work as W
from tra_dask.physical.work import plan_work
from tra_dask.programs import matmul
from tra_dask.types import first_of_each


class NoData:
    def __call__(self, key):
        raise AssertionError("planning must not load data")


def src(shape, blocks, name):
    return td.from_function(NoData(), shape, tuple(-(-n // b) for n, b in zip(shape, blocks)), "float64", name=name)


def general(monkeypatch):
    """Turn the fast paths off: no type is known to be a grid, no origin recipe is made,
    and an aggregation's groups are sorted."""
    monkeypatch.setattr(T.RelationType, "is_grid", property(lambda self: False))
    monkeypatch.setattr(L, "_carried_origins", lambda inp, phys: inp.origin[phys])
    monkeypatch.setattr(L, "_moved_origins", lambda inp, src, dest, moved, s: L._moved_origin(
        inp.origin[src], dest, moved, s, copy=False))
    monkeypatch.setattr(W, "_grid_groups", lambda *a: None)


def classes(a: np.ndarray) -> np.ndarray:
    """Which positions hold equal values (the first position of each), whatever the ids."""
    return first_of_each(np.asarray(a, dtype=np.int64))


def assert_same_plans(p, q):
    assert p.cost.floats_moved == q.cost.floats_moved
    assert p.cost.seconds == pytest.approx(q.cost.seconds, rel=1e-12)
    assert p.cost.fused == q.cost.fused
    np.testing.assert_array_equal(p.cost.peak_bytes_per_site, q.cost.peak_bytes_per_site)
    np.testing.assert_array_equal(p.cost.flops_per_site, q.cost.flops_per_site)
    assert list(p.strategies()) == list(q.strategies())
    a, b = toposort(p.outputs), toposort(q.outputs)
    assert [type(n).__name__ for n in a] == [type(n).__name__ for n in b]
    wa, wb = plan_work(p.outputs), plan_work(q.outputs)
    assert wa.ntasks == wb.ntasks and len(wa.into) == len(wb.into) and wa.floats_moved == wb.floats_moved
    for m, n in zip(a, b):
        assert m.type == n.type
        np.testing.assert_array_equal(m.type.keys, n.type.keys)
        x, y = m.layout, n.layout
        np.testing.assert_array_equal(x.rows, y.rows)
        np.testing.assert_array_equal(x.sites, y.sites)
        assert len(x.lineage) == len(y.lineage) and x.partial == y.partial
        for u, v in zip(x.lineage, y.lineage):
            np.testing.assert_array_equal(u, v)
        assert (x.moved is None) == (y.moved is None)
        if x.moved is not None:
            np.testing.assert_array_equal(x.moved, y.moved)
        np.testing.assert_array_equal(classes(x.origin), classes(y.origin))
        assert x.origins_distinct() == y.origins_distinct()
        np.testing.assert_array_equal(x.first_positions(), y.first_positions())
        idx = np.arange(0, x.ntuples, 3)
        np.testing.assert_array_equal(x.origin_at(idx), x.origin[idx])
        u, v = wa[m], wb[n]
        assert (u.kind, u.ntasks) == (v.kind, v.ntasks)
        np.testing.assert_array_equal(u.task_tuple, v.task_tuple)
        if u.ntasks and u.kind != "transfer":
            np.testing.assert_array_equal(u.in_ptr, v.in_ptr)
            np.testing.assert_array_equal(u.in_tuple, v.in_tuple)
    for m, n in zip(a, b):  # the recipes' ids are new: none is an id of the other plan's input of it
        if "_origin_of" in m.layout.__dict__ and m.children:
            mv = m.layout.moved
            if mv is not None and mv.any():
                assert not np.isin(m.layout.origin[mv], m.children[0].layout.origin).any()


EXPRS = {  # (src's third argument: blocks per dim)
    "square 12^3 blocks": lambda: matmul(src((1200, 1200), (12, 12), "A"), src((1200, 1200), (12, 12), "B")),
    "square 40^3 blocks (sketched)": lambda: matmul(src((4000, 4000), (40, 40), "A"),
                                                    src((4000, 4000), (40, 40), "B")),
    "lopsided 6x30x8": lambda: matmul(src((600, 3000), (6, 30), "A"), src((3000, 800), (30, 8), "B")),
    "chain": lambda: matmul(matmul(src((800, 800), (8, 8), "A"), src((800, 800), (8, 8), "B")),
                            src((800, 800), (8, 8), "C")),
}


CASES = [(name, sites) for name in EXPRS for sites in ((8, 27) if "sketched" in name else (2, 4, 8, 27))]


@pytest.mark.parametrize("name,sites", CASES)
def test_plans_are_the_general_rules_plans(monkeypatch, name, sites):
    fast = td.optimize(EXPRS[name](), sites=sites)
    with monkeypatch.context() as m:
        general(m)
        slow = td.optimize(EXPRS[name](), sites=sites)
    assert_same_plans(fast, slow)


def test_a_sketched_3d_multiply_makes_no_key_grid_and_holds_no_origin_array():
    plan = td.optimize(EXPRS["square 40^3 blocks (sketched)"](), sites=8)
    assert "RMM (3-D, 2x2x2 grid of sites)" in plan.strategies()
    nodes = toposort(plan.outputs)
    big = [n for n in nodes if n.type.ntuples == 40 ** 3]
    assert len(big) == 5  # two replicas, two shuffles, the join
    # the join's and the aggregations' keys were never made (the replicas' types are
    # shared with the other plans replayed, whose rules may read them)
    assert [type(n).__name__ for n in nodes if n.type._keys is None][:2] == ["LocalJoin", "LocalAggregate"]
    recipes = [n for n in big if "_origin_of" in n.layout.__dict__]
    assert [type(n).__name__ for n in recipes] == ["LocalMap", "Shuffle", "LocalMap", "Shuffle"]


@pytest.mark.parametrize("bases", [(1,), (5,), (3, 4), (2, 1, 3), (4, 3, 2, 2)])
def test_a_grid_type_is_its_keys(bases):
    g = T.RelationType.grid(bases, (2, 2), "float32")
    made = T.RelationType(np.indices(bases).reshape(len(bases), -1).T, np.zeros(int(np.prod(bases)), np.intp),
                          [(2, 2)], "float32")
    assert g._keys is None and g.is_grid and (made.is_grid or made.ntuples < 2)  # (one key: no index made)
    assert (g.ntuples, g.arity, g.frontier) == (made.ntuples, made.arity, made.frontier)
    for d in range(len(bases)):
        np.testing.assert_array_equal(g.column(d), made.keys[:, d])
    assert g._keys is None
    assert g == made and made == g and (g.same_keys(made) or not made.is_grid)  # (a cheap test: may miss)
    assert g != T.RelationType.grid(bases, (2, 3), "float32")
    assert g != T.RelationType.grid(bases, (2, 2), "float64")
    if len(bases) > 1:
        other = tuple(bases[:-1]) + (bases[-1] + 1,)
        assert g != T.RelationType.grid(other, (2, 2), "float32") and not g.same_keys(T.RelationType.grid(
            other, (2, 2), "float32"))
    back = pickle.loads(pickle.dumps(g))
    assert back == g
    np.testing.assert_array_equal(g.keys, made.keys)  # made when read
    assert g._keys is not None and not g.keys.flags.writeable
    assert T.RelationType.grid((0, 3), (2,), "float32").ntuples == 0


@pytest.mark.parametrize("bases,pos,count", [((3, 4), 0, 2), ((3, 4), 1, 3), ((3, 4), 2, 5), ((2, 3, 2), 1, 1),
                                             ((5,), 0, 4), ((5,), 1, 4)])
def test_insert_dim_and_aggregation_of_a_grid_are_the_general_rules(monkeypatch, bases, pos, count):
    shape = tuple(4 * b for b in bases)
    x = td.from_function(NoData(), shape, tuple(4 for _ in bases), "float64", name="X")
    exprs = [rekey(x, insert_dim(pos, count))]
    arity = len(bases) + 1
    for gb in [(0,), (arity - 1,), tuple(range(arity - 1)), tuple(reversed(range(arity)))[:2]]:
        exprs.append(aggregate(exprs[0], gb, "add"))
    exprs.append(join(x, x, tuple(range(len(bases))), tuple(range(len(bases))), "add"))
    fast = [e.type for e in exprs]
    with monkeypatch.context() as m:
        general(m)
        exprs2 = [rekey(x, insert_dim(pos, count))]
        for gb in [(0,), (arity - 1,), tuple(range(arity - 1)), tuple(reversed(range(arity)))[:2]]:
            exprs2.append(aggregate(exprs2[0], gb, "add"))
        exprs2.append(join(x, x, tuple(range(len(bases))), tuple(range(len(bases))), "add"))
        slow = [e.type for e in exprs2]
        for a, b in zip(fast, slow):
            np.testing.assert_array_equal(a.keys, b.keys)
            assert a.shapes == b.shapes and a.dtype == b.dtype
            np.testing.assert_array_equal(a.shape_ids, b.shape_ids)
    assert fast[0]._keys is None or fast[0].ntuples < T.SHARE_FROM


@pytest.mark.parametrize("bases", [(3, 5), (2, 3, 4), (6, 1, 2)])
def test_sites_and_groups_of_a_grid_are_those_of_its_keys(bases):
    from tra_dask.physical.placement import Grid, Part
    g = T.RelationType.grid(bases, (1,), "float64")
    made = T.RelationType(np.indices(bases).reshape(len(bases), -1).T, np.zeros(int(np.prod(bases)), np.intp),
                          [(1,)], "float64")
    a = len(bases)
    placements = [Part((0,), 4), Part(tuple(range(a)), 7), Part((a - 1, 0), 3),
                  Grid((0, None), (2, 3), 6), Grid((a - 1, 0), (2, 2), 4), Grid((None,), (5,), 5)]
    for p in placements:
        np.testing.assert_array_equal(p.sites(g), p.sites(made))
    for dims in [(0,), (a - 1, 0), tuple(range(a))]:
        out = T.RelationType.grid(tuple(bases[d] for d in dims), (1,), "float64")
        np.testing.assert_array_equal(T.group_rows(g, dims, out), out.locate(made.keys, dims))
    assert g._keys is None


def test_a_grid_with_no_axis_driven_by_a_dim_gives_one_site_per_key():
    """A ``Grid`` whose axes are all spread puts every key on one site, one site per
    key, whether or not the keys fill their frontier (the sum of no dims once made a
    0-d site that the frontier broadcast to 9 sites for 5 keys)."""
    from tra_dask.physical.placement import Grid

    keys = np.array([[0, 0], [0, 2], [1, 1], [2, 0], [2, 2]])  # not every key below the frontier (3, 3)
    sparse = T.RelationType(keys, np.zeros(len(keys), np.intp), [(2, 2)], "float64")
    full = T.RelationType.grid((3, 3), (2, 2), "float64")
    for t in (sparse, full):
        for p in (Grid((None,), (5,), 5), Grid((None, None), (2, 2), 4)):
            np.testing.assert_array_equal(p.sites(t), np.zeros(t.ntuples, np.int64))
