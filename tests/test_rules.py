"""Every rule: a golden before/after pair (readable reprs) and a hypothesis property
that both sides simulate to the same tuples on random relations, placements and
site counts."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tra_dask as td
from tra_dask.kernels import get_kernel as K
from tra_dask.keys import identity, k0, k1, project
from tra_dask.optimizer import rules as R
from tra_dask.physical import (All, Broadcast, KeyArrayMap, KeySites, LocalAggregate, LocalFilter, LocalJoin,
                               LocalMap, Part, PSource, Shuffle)

settings.register_profile("rules", max_examples=25, deadline=None)
settings.load_profile("rules")


def _before(name, a, b):
    """The 'before' plan each rule is tested on, over sources a (n x n) and b."""
    return {
        "r1_1": lambda: LocalFilter(LocalFilter(a, k0 < 1), k1 < 1),
        "r1_2": lambda: LocalMap(LocalMap(a, KeyArrayMap(project(1, 0), K("relu"))), KeyArrayMap(identity(2), K("neg"))),
        "r1_3": lambda: LocalMap(LocalFilter(a, k0 < 1), KeyArrayMap(identity(2), K("exp"))),
        "r1_4": lambda: LocalMap(LocalAggregate(Shuffle(a, (0,)), (0,), K("add")), KeyArrayMap(identity(1), K("row_sum"))),
        "r1_5": lambda: LocalFilter(LocalAggregate(Shuffle(a, (1,)), (1,), K("add")), k0 < 1),
        "r1_6": lambda: LocalFilter(LocalJoin(Broadcast(a), b, (0, 1), (0, 1), K("add")), k0 == k1),
        "r1_7": lambda: LocalMap(LocalJoin(Broadcast(a), b, (0, 1), (0, 1), K("add")), KeyArrayMap(project(1, 0), K("diag"))),
        "r2_1": lambda: Shuffle(Shuffle(a, (1,)), (0, 1)),
        "r2_2": lambda: Broadcast(LocalFilter(a, k0 < 1)),
        "r2_3": lambda: Shuffle(LocalMap(a, KeyArrayMap(identity(2), K("neg"))), (1,)),
        "r2_4": lambda: LocalAggregate(Shuffle(a, (0,)), (0,), K("add")),
        "r2_5": lambda: LocalAggregate(Shuffle(a, (1,)), (1,), K("add")),
        "r2_6": lambda: LocalJoin(Broadcast(a), b, (1,), (0,), K("matmul")),
        "r2_7": lambda: Shuffle(LocalJoin(Shuffle(a, (1,)), Shuffle(b, (0,)), (1,), (0,), K("matmul")), (1,)),
        "noop": lambda: Shuffle(a, (0,)),
        "bmm": lambda: LocalAggregate(Shuffle(LocalJoin(Broadcast(a), b, (1,), (0,), K("matmul")), (0, 2)), (0, 2), K("add")),
        "cmm": lambda: LocalAggregate(Shuffle(LocalJoin(Broadcast(a), b, (1,), (0,), K("matmul")), (0, 2)), (0, 2), K("add")),
        "rmm": lambda: LocalAggregate(Shuffle(LocalJoin(Broadcast(a), b, (1,), (0,), K("matmul")), (0, 2)), (0, 2), K("add")),
        "rmm_grid": lambda: LocalAggregate(Shuffle(LocalJoin(Broadcast(a), b, (1,), (0,), K("matmul")), (0, 2)), (0, 2), K("add")),
        "free": lambda: Shuffle(a, (1,)),
        # A's row blocks held the other way round from Part(0): the table follows them
        "affinity": lambda: LocalAggregate(Shuffle(LocalJoin(Broadcast(_flipped(a)), b, (1,), (0,), K("matmul")), (0, 2)),
                                           (0, 2), K("add")),
    }[name]()


def _flipped(a):
    """``a`` held (not free) with row block i on site 1 - i."""
    return PSource(a.source, KeySites(tuple((k, 1 - k[0]) for k in a.source.type.key_list()), 2), free=False)


RULE = {
    "r1_1": R.r1_1_merge_filters, "r1_2": R.r1_2_merge_maps, "r1_3": R.r1_3_swap_map_and_filter,
    "r1_4": R.r1_4_map_through_aggregate, "r1_5": R.r1_5_push_filter_into_aggregate,
    "r1_6": R.r1_6_push_filter_into_join, "r1_7": R.r1_7_merge_map_into_join,
    "r2_1": R.r2_1_last_move_wins, "r2_2": R.r2_2_swap_move_and_filter, "r2_3": R.r2_3_swap_move_and_map,
    "r2_4": R.r2_4_drop_shuffle_before_aggregate, "r2_5": R.r2_5_pre_aggregate, "r2_6": R.r2_6_join_strategies,
    "r2_7": R.r2_7_drop_shuffle_after_join, "noop": R.drop_noop_move, "bmm": R.bmm, "cmm": R.cmm, "rmm": R.rmm,
    "rmm_grid": R.rmm_grid, "free": R.place_free_source, "affinity": R.affinity_mm,
}

GOLDEN = {
    "r1_1": ["LocalFilter(A@Part(0), pred=(k0 < 1) & (k1 < 1))"],
    "r1_2": ["LocalMap(A@Part(0), key_fn=key(k1, k0), kernel='neg∘relu')"],
    "r1_3": ["LocalFilter(LocalMap(A@Part(0), kernel='exp'), pred=k0 < 1)"],
    "r1_4": ["LocalAggregate(LocalMap(Shuffle(A@Part(0), dims=(0,)), kernel='row_sum'), group_by=(0,), kernel='add')"],
    "r1_5": ["LocalAggregate(LocalFilter(Shuffle(A@Part(0), dims=(1,)), pred=k1 < 1), group_by=(1,), kernel='add')"],
    "r1_6": ["LocalJoin(LocalFilter(Broadcast(A@Part(0)), pred=k0 == k1), LocalFilter(B@Part(0), pred=k0 == k1), "
             "left_on=(0, 1), right_on=(0, 1), kernel='add')"],
    "r1_7": ["LocalJoin(Broadcast(A@Part(0)), B@Part(0), left_on=(0, 1), right_on=(0, 1), kernel='diag∘add', key_fn=key(k1, k0))",
             "LocalJoin(Broadcast(A@Part(0)), B@Part(0), left_on=(0, 1), right_on=(0, 1), kernel='add∘(diag×diag)', key_fn=key(k1, k0))"],
    "r2_1": ["Shuffle(A@Part(0), dims=(0, 1))"],
    "r2_2": ["LocalFilter(Broadcast(A@Part(0)), pred=k0 < 1)"],
    "r2_3": ["LocalMap(Shuffle(A@Part(0), dims=(1,)), kernel='neg')"],
    "r2_4": ["LocalAggregate(A@Part(0), group_by=(0,), kernel='add')"],
    "r2_5": ["LocalAggregate(Shuffle(LocalAggregate(A@Part(0), group_by=(1,), kernel='add'), dims=(0,)), group_by=(0,), kernel='add')"],
    "r2_6": ["LocalJoin(Broadcast(A@Part(0)), B@Part(0), left_on=(1,), right_on=(0,), kernel='matmul')",
             "LocalJoin(A@Part(0), Broadcast(B@Part(0)), left_on=(1,), right_on=(0,), kernel='matmul')",
             "LocalJoin(Shuffle(A@Part(0), dims=(1,)), Shuffle(B@Part(0), dims=(0,)), left_on=(1,), right_on=(0,), kernel='matmul')"],
    "r2_7": ["LocalJoin(Shuffle(A@Part(0), dims=(1,)), Shuffle(B@Part(0), dims=(0,)), left_on=(1,), right_on=(0,), kernel='matmul')"],
    "noop": ["A@Part(0)"],
    "bmm": ["LocalAggregate(Shuffle(LocalJoin(Broadcast(A@Part(0)), B@Part(0), left_on=(1,), right_on=(0,), kernel='matmul'), dims=(0, 2)), group_by=(0, 2), kernel='add')",
            "LocalAggregate(Shuffle(LocalJoin(A@Part(0), Broadcast(B@Part(0)), left_on=(1,), right_on=(0,), kernel='matmul'), dims=(0, 2)), group_by=(0, 2), kernel='add')"],
    "cmm": ["LocalAggregate(Shuffle(LocalAggregate(LocalJoin(Shuffle(A@Part(0), dims=(1,)), Shuffle(B@Part(0), dims=(0,)), "
            "left_on=(1,), right_on=(0,), kernel='matmul'), group_by=(0, 2), kernel='add'), dims=(0, 1)), group_by=(0, 1), kernel='add')"],
    "rmm": ["LocalAggregate(LocalJoin(Shuffle(LocalMap(A@Part(0), key_fn=insert_dim(2, 2)), dims=(0, 2)), "
            "Shuffle(LocalMap(B@Part(0), key_fn=insert_dim(0, 2)), dims=(0, 2)), left_on=(0, 1, 2), right_on=(0, 1, 2), "
            "kernel='matmul'), group_by=(0, 2), kernel='add')"],
    # on 2 sites: the 1x1x2, 1x2x1 (partial sums folded, then shuffled to one of their sites) and 2x1x1 grids;
    # the free sources are made on the grid cells that need them
    "rmm_grid": [
        "LocalAggregate(LocalJoin(Shuffle(LocalMap(A@Grid(0, 1, * on 1x1x2), key_fn=insert_dim(2, 2)), grid=Grid(0, 1, 2 on 1x1x2)), "
        "Shuffle(LocalMap(B@Grid(*, 0, 1 on 1x1x2), key_fn=insert_dim(0, 2)), grid=Grid(0, 1, 2 on 1x1x2)), left_on=(0, 1, 2), "
        "right_on=(0, 1, 2), kernel='matmul'), group_by=(0, 2), kernel='add')",
        "LocalAggregate(Shuffle(LocalAggregate(LocalJoin(Shuffle(LocalMap(A@Grid(0, 1, * on 1x2x1), key_fn=insert_dim(2, 2)), "
        "grid=Grid(0, 1, 2 on 1x2x1)), Shuffle(LocalMap(B@Grid(*, 0, 1 on 1x2x1), key_fn=insert_dim(0, 2)), "
        "grid=Grid(0, 1, 2 on 1x2x1)), left_on=(0, 1, 2), right_on=(0, 1, 2), kernel='matmul'), group_by=(0, 2), kernel='add'), "
        "grid=Grid(0, *, 1 on 1x2x1)), group_by=(0, 1), kernel='add')",
        "LocalAggregate(LocalJoin(Shuffle(LocalMap(A@Grid(0, 1, * on 2x1x1), key_fn=insert_dim(2, 2)), grid=Grid(0, 1, 2 on 2x1x1)), "
        "Shuffle(LocalMap(B@Grid(*, 0, 1 on 2x1x1), key_fn=insert_dim(0, 2)), grid=Grid(0, 1, 2 on 2x1x1)), left_on=(0, 1, 2), "
        "right_on=(0, 1, 2), kernel='matmul'), group_by=(0, 2), kernel='add')"],
    "free": ["A@Part(1)"],
    "affinity": ["LocalAggregate(LocalJoin(Shuffle(LocalMap(A@KeySites[4 keys], key_fn=insert_dim(2, 2)), "
                 "table=Assign(0 by 10)), Shuffle(LocalMap(B@Part(0), key_fn=insert_dim(0, 2)), table=Assign(0 by 10)), "
                 "left_on=(0, 1, 2), right_on=(0, 1, 2), kernel='matmul'), group_by=(0, 2), kernel='add')"],
}


@pytest.fixture(scope="module")
def ab():
    A = td.from_numpy(np.arange(16.0).reshape(4, 4), 2, name="A")
    B = td.from_numpy(np.arange(16.0).reshape(4, 4) + 1, 2, name="B")
    return PSource(A, Part((0,), 2)), PSource(B, Part((0,), 2))


def check_same(before, after):
    want = td.simulate(td.Plan([before])).result
    got = td.simulate(td.Plan([after])).result
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden(name, ab):
    before = _before(name, *ab)
    after = [repr(x) for x in RULE[name](before)]
    assert after == GOLDEN[name]
    for x in RULE[name](before):
        check_same(before, x)


def _placement(draw, rel, sites):
    kind = draw(st.sampled_from(["part0", "part1", "all", "keys"]))
    if kind == "all":
        return All(sites)
    if kind == "keys":
        return KeySites(tuple((k, draw(st.integers(0, sites - 1))) for k in rel.keys), sites)
    return Part((0,) if kind == "part0" else (1,), sites)


@pytest.mark.parametrize("name", list(GOLDEN))
@given(data=st.data())
def test_both_sides_simulate_alike(name, data):
    n = data.draw(st.integers(2, 6), label="n")
    c = data.draw(st.integers(1, n), label="chunk")
    sites = data.draw(st.integers(1, 4), label="sites")
    seed = data.draw(st.integers(0, 1000), label="seed")
    rng = np.random.default_rng(seed)
    A = td.from_numpy(rng.normal(size=(n, n)), c, name="A")
    B = td.from_numpy(rng.normal(size=(n, n)), c, name="B")
    a = PSource(A, _placement(data.draw, A, sites), free=True)
    b = PSource(B, _placement(data.draw, B, sites), free=True)
    try:
        before = _before(name, a, b)
    except ValueError:  # e.g. a local aggregate over a layout that leaves partial folds
        return
    if before.layout.partial:
        return
    for after in RULE[name](before):
        check_same(before, after)


@given(data=st.data())
def test_affinity_plans_simulate_alike_and_move_only_split_values(data):
    """Operands held where Dask put them (random sites, not free): every plan
    affinity_mm offers computes the product, balanced (no site takes more than its
    share of the dim's values), and a left operand partitioned on its row dim moves
    no chunk of a row block that was whole on one site it kept."""
    n, m = data.draw(st.integers(2, 6), label="n"), data.draw(st.integers(2, 6), label="m")
    c = data.draw(st.integers(1, 3), label="chunk")
    sites = data.draw(st.integers(2, 4), label="sites")
    rng = np.random.default_rng(data.draw(st.integers(0, 1000), label="seed"))
    A = td.from_numpy(rng.normal(size=(n, m)), c, name="A")
    B = td.from_numpy(rng.normal(size=(m, n)), c, name="B")
    held = lambda R: PSource(R, KeySites(tuple((k, data.draw(st.integers(0, sites - 1))) for k in R.keys), sites),  # noqa: E731
                             free=False)
    a, b = held(A), held(B)
    before = LocalAggregate(Shuffle(LocalJoin(Broadcast(a), b, (1,), (0,), K("matmul")), (0, 2)), (0, 2), K("add"))
    for after in R.affinity_mm(before):
        check_same(before, after)
        shuffles = [x for x in td.Plan([after]).nodes if isinstance(x, Shuffle) and x.table]
        table = shuffles[0].table
        assert np.bincount(table, minlength=sites).max() <= -(-len(table) // sites)
        if shuffles[0].dims == (0,):  # A's row blocks: one wholly on one site stays there unless that site is full
            cap, load = -(-len(table) // sites), np.bincount(table, minlength=sites)
            where = {}
            for row, site in zip(a.layout.rows, a.layout.sites):
                where.setdefault(int(A.keys[row][0]), set()).add(int(site))
            for i, held_on in where.items():
                if len(held_on) == 1:
                    (h,) = held_on
                    assert table[i] == h or load[h] == cap, (i, h, table)


@pytest.mark.parametrize("on", [((1,), (0,), "matmul"), ((0,), (0,), "matmul_tn"), ((1,), (1,), "matmul_nt")])
def test_affinity_over_transposed_and_filtered_contractions(on):
    """The contracted dim keyed on either side, and a filter pushed into one side
    that narrows its range of the contracted dim (review: the table's extent was the
    left's alone, and planning crashed): every plan computes the expression."""
    from tra_dask.keys import k0 as q0, k1 as q1

    left_on, right_on, kernel = on
    rng = np.random.default_rng(3)
    A = td.from_numpy(rng.normal(size=(6, 6)), 2, name="A")
    B = td.from_numpy(rng.normal(size=(6, 6)), 2, name="B")
    held = lambda R: KeySites(tuple((k, (k[0] + 2 * k[1]) % 2) for k in R.keys), 2)  # noqa: E731
    lf = 1 - left_on[0]
    for expr in (td.aggregate(td.join(A, B, left_on, right_on, kernel), (lf, 2), "add"),
                 td.aggregate(td.filter(td.join(A, B, left_on, right_on, kernel), q0 + q1 < 2), (lf, 2), "add")):
        want = td.evaluate(expr)
        plan = td.optimize(expr, sites=2, placements={A: held(A), B: held(B)})
        got = td.simulate(plan).result
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-12)
        for alt in plan.alternatives:
            res = td.simulate(alt).result
            assert all(np.allclose(res[k], want[k]) for k in want)


def test_opaque_predicates_and_key_functions_stop_the_rules(ab):
    a, b = ab
    opaque = td.keys.CallablePredicate(lambda key: key[0] == key[1])
    assert list(R.r1_6_push_filter_into_join(LocalFilter(LocalJoin(Broadcast(a), b, (0, 1), (0, 1), K("add")), opaque))) == []
    first = td.keys.CallablePredicate(lambda key: key[0] == 0)
    assert list(R.r1_5_push_filter_into_aggregate(LocalFilter(LocalAggregate(Shuffle(a, (1,)), (1,), K("add")), first))) == []
    f = td.keys.CallableKeyFn(lambda key: (key[1], key[0]))
    assert list(R.r1_2_merge_maps(LocalMap(LocalMap(a, KeyArrayMap(f)), KeyArrayMap(identity(2), K("neg"))))) == []
    # a kernel that does not distribute over the aggregation keeps its place
    assert list(R.r1_4_map_through_aggregate(LocalMap(LocalAggregate(Shuffle(a, (0,)), (0,), K("add")),
                                                      KeyArrayMap(identity(1), K("exp"))))) == []
    # no pre-aggregation with a kernel that is not associative and commutative
    assert list(R.r2_5_pre_aggregate(LocalAggregate(Shuffle(a, (1,)), (1,), K("sub")))) == []


def test_rules_tuple_is_the_whole_optimizer_vocabulary():
    assert len(R.RULES_R1) == 7 and len(R.RULES_R2) == 8 and len(R.DOMAIN_RULES) == 7
    assert [r.__name__ for r in R.RULES_R1] == sorted(r.__name__ for r in R.RULES_R1)
    for r in R.RULES:
        assert r.__doc__ and len(r.__doc__) > 40, r.__name__


def test_r1_3_keeps_a_kernel_above_the_filter_that_makes_its_chunks_fit():
    """Below ``k0 == k1`` a diagonal kernel would meet the off-diagonal edge chunks
    (2x1) it cannot take: R1-3 must not push it there (found by td.einsum('ii->i'))."""
    from tra_dask.frontend.chunk_ops import einsum_kernel

    m = np.arange(49.0).reshape(7, 7)
    M = td.from_numpy(m, 2, name="M")
    f = LocalFilter(td.compile(M, sites=2).outputs[0], k0 == k1)
    node = LocalMap(f, KeyArrayMap(identity(2), einsum_kernel("ii->i")))
    assert list(R.r1_3_swap_map_and_filter(node)) == []
    # an elementwise kernel takes every chunk: the swap stays available
    node = LocalMap(f, KeyArrayMap(identity(2), K("exp")))
    assert len(list(R.r1_3_swap_map_and_filter(node))) == 1
    expr = td.rekey(td.transform(td.filter(M, k0 == k1), einsum_kernel("ii->i")), project(0))
    plan = td.optimize(expr, sites=2)
    np.testing.assert_allclose(td.to_numpy(expr, td.simulate(plan).result), np.diag(m))
