"""physical.work is THE derivation of a plan's work: the cost model counts its tasks,
the lowering emits them.  For every program of the repertoire, on 1, 2, 3 and 5
sites, compiled and optimized: predicted tasks == lowered tasks (per node and in
all), and the arrays that cross sites in the lowered graph are exactly work's
transfers, whose bytes are the exact cost model's.  No cluster: the lowering needs
only worker address strings."""

import dataclasses

import numpy as np
import pytest
from dask.local import get_sync
from dask.task_spec import DataNode
from dask.task_spec import List as DaskList
from dask.task_spec import Task as DaskTask

import tra_dask as td
from tra_dask.frontend.run import build_local
from tra_dask.keys import insert_dim, k0, k1
from tra_dask.logical.evaluate import flatten_outputs
from tra_dask.logical.sources import ClusterSource
from tra_dask.lowering import lower, tasks
from tra_dask.node import toposort
from tra_dask.optimizer import search as search_module
from tra_dask.optimizer.time import fusion_for
from tra_dask.physical import (Broadcast, ConcatAgg, LocalAggregate, LocalJoin, Part, PSource, Shuffle, node_work,
                               plan_work)
from tra_dask.physical.work import Fusion, FusedCounts, PlanWork
from tra_dask.programs import (ffnn_forward, ffnn_sgd_step, ffnn_sgd_step_array, matmul, nearest_neighbor,
                               random_uniform)

from helpers import PAPER_A, PAPER_B

rng = np.random.default_rng(5)
RA = td.from_numpy(PAPER_A, (2, 2), name="R_A")
RB = td.from_chunks({(0,): PAPER_B[:, :4], (1,): PAPER_B[:, 4:]}, name="R_B")
A = td.from_numpy(rng.normal(size=(7, 5)), (3, 2), name="A")
B = td.from_numpy(rng.normal(size=(5, 6)), (2, 4), name="B")
M = td.from_numpy(rng.normal(size=(8, 8)), 2, name="M")
V = td.from_numpy(rng.normal(size=(2, 8)), (2, 4), name="V")
W = td.from_numpy(rng.normal(size=(6, 3)), (4, 2), name="W")
F1 = random_uniform((10, 6), (4, 3), seed=1, name="F1")
F2 = random_uniform((6, 4), (3, 2), seed=2, name="F2")

# the README's example
_a, _b = np.random.default_rng(0).random((1000, 700)), np.random.default_rng(1).random((700, 500))
RA_ME = td.from_numpy(_a, chunks=(256, 256), name="A")
RB_ME = td.from_numpy(_b, chunks=(256, 128), name="B")
README = td.aggregate(td.join(RA_ME, RB_ME, left_on=(1,), right_on=(0,), kernel="matmul"), group_by=(0, 2), kernel="add")

_x, _y = rng.normal(size=(6, 6)), rng.normal(size=(6, 6))
X6, Y6 = td.from_numpy(_x, 3, name="X6"), td.from_numpy(_y, 3, name="Y6")
_xs, _ys = rng.normal(size=(5, 7)), rng.normal(size=(7, 4))
XS, YS = td.from_numpy(_xs, (2, 3), name="XS"), td.from_numpy(_ys, (3, 2), name="YS")

_n = rng.normal
SGD = ffnn_sgd_step(td.from_numpy(_n(size=(8, 6)), (4, 3), name="X"),
                    td.from_numpy(np.eye(4)[rng.integers(0, 4, 8)], (4, 2), name="Y"),
                    td.from_numpy(_n(size=(6, 6)), 3, name="W1"), td.from_numpy(_n(size=(6, 4)), (3, 2), name="W2"), 0.1)

PROGRAMS = {
    # the suite's programs, small
    "matmul": matmul(A, B),
    "matmul from_function": matmul(F1, F2),
    "a from_function source alone (no task reads another)": F1,
    "nearest neighbour": nearest_neighbor(td.from_numpy(_n(size=6), 4), td.from_numpy(_n(size=(11, 6)), (3, 4)),
                                          td.from_numpy(np.eye(6) * 2 + 0.1, 4)),
    "nearest neighbour 1xD query": nearest_neighbor(td.from_numpy(_n(size=(1, 8)), 2), M, td.from_numpy(np.eye(8), 2)),
    "ffnn forward": ffnn_forward(A, B, W),
    "ffnn sgd step (two outputs)": SGD,
    "README example": README,
    # the paper's examples
    "aggregate by (1,)": td.aggregate(RA, (1,), "add"),
    "aggregate by ()": td.aggregate(RA, (), "add"),
    "join 010": td.join(RA, RA, (1,), (0,), "matmul"),
    "A x A": td.aggregate(td.join(RA, RA, (1,), (0,), "matmul"), (0, 2), "add"),
    "tile then rekey": td.rekey(td.tile(RB, 1, 2), 2 * k0 + k1),
    "concat of tile": td.concat(td.tile(RB, 1, 2), 1, 1),
    "concat of tile, groups of one chunk": td.concat(td.tile(M, 1, 2), 2, 1),
    "concat of tile size 1": td.concat(td.tile(M, 1, 1), 2, 1),
    "concat over key dim 0": td.concat(A, 0, 0),
    "tile then rekey 2k1+k2": td.rekey(td.tile(V, 1, 2), (k0, 2 * k1 + td.k[2])),
    "diagonal": td.transform(td.rekey(td.filter(RA, k0 == k1), k0), "diag"),
    "diag of sum": td.transform(td.rekey(td.filter(td.join(X6, Y6, (0, 1), (0, 1), "add"), k0 == k1), k0), "diag"),
    "insert_dim duplicate": td.rekey(RA, insert_dim(2, 2)),
    "insert_dim then aggregate": td.aggregate(td.rekey(M, insert_dim(1, 3)), (2, 0), "add"),
    "replication matmul": td.aggregate(td.join(td.rekey(XS, insert_dim(2, YS.frontier[1])),
                                               td.rekey(YS, insert_dim(0, XS.frontier[0])),
                                               (0, 1, 2), (0, 1, 2), "matmul"), (0, 2), "add"),
    "filter": td.filter(A, k0 < 2),
    "filter then transform": td.transform(td.filter(M, k0 + k1 < 3), "relu"),
    "rekey transpose": td.transform(td.rekey(A, (k1, k0)), "transpose"),
    "transform": td.transform(A, "relu"),
    "join cross product": td.join(td.from_numpy(np.arange(3.0), 1), td.from_numpy(np.arange(4.0), 2), (), (), "mul"),
    # several outputs sharing work
    "several outputs, shared": (matmul(A, B), td.transform(matmul(A, B), "neg"), td.aggregate(M, (), "add")),
    "several outputs, dict": {"c": matmul(A, B), "t": td.concat(td.tile(M, 1, 2), 2, 1)},
}

SITES = [1, 2, 3, 5]


def _workers(s):
    return [f"tcp://127.0.0.1:{9000 + i}" for i in range(s)]


def _plan(how, expr, sites):
    return td.compile(expr, sites) if how == "compile" else td.optimize(expr, sites)


def check_work(plan):
    workers = _workers(plan.sites)
    lo = lower(plan, workers, "tok")
    work = lo.work

    # tasks: predicted == lowered, in all and per node (a task fused into its reader is nested in it)
    assert plan.cost.tasks == lo.ntasks == work.ntasks
    by_node, nested = {}, {}
    for layer in lo.layers.values():
        for key, task in layer.items():
            by_node[key[0]] = by_node.get(key[0], 0) + 1
            nested.update({k: key for k in _nested_keys(task)})
    for i, n in enumerate(work.order):
        assert (by_node.get(f"{n._op}-{i}-tok", 0) + work.fused_in(n) == plan.cost.nodes[n].tasks
                == work[n].ntasks), (i, n._op)
    # the fused pairs, counted off the pass's arrays (len, per node) and named (items) alike
    assert len(work.into) == len(dict(work.into.items())) == sum(work.fused_in(n) for n in work.order)
    index = {n: i for i, n in enumerate(work.order)}
    tkey = lambda n, t: (f"{n._op}-{index[n]}-tok", int(work[n].task_tuple[t]))  # noqa: E731
    for (n, t), (rn, rt) in work.into.items():  # nested in its reader's task, on the same site, off the graph
        top = nested[tkey(n, t)]
        assert tkey(n, t) not in lo.planned and top in lo.planned
        assert lo.planned[top] == workers[int(work[n].task_site[t])] == workers[int(work[rn].task_site[rt])]
        assert tkey(rn, rt) == top or nested[tkey(rn, rt)] == top

    # every task runs where work says, on its inputs' keys
    site_of = {w: s for s, w in enumerate(workers)}
    scattered = {k for d in lo.scatter.values() for k in d}
    known = lo.graph_keys() | scattered
    for n in work.order:
        if isinstance(n, PSource) and isinstance(n.source, ClusterSource):
            known |= {k for _, k in n.source.dask_keys}
    for layer_worker, layer in lo.layers.items():
        for key, task in layer.items():
            assert lo.planned[key] == layer_worker
            assert task.dependencies <= known
    for i, n in enumerate(work.order):
        w = work[n]
        for t, x in enumerate(work.tasks(n)):
            key = (f"{n._op}-{i}-tok", x.tuple)
            if w.kind == "scatter":  # named by content, position and worker (the scatter cache)
                key = lo.node_keys[n][x.tuple]
                assert key in lo.scatter[workers[x.site]] and key[1] == workers[x.site]
            elif (n, t) not in work.into:
                assert lo.planned[key] == workers[x.site] and key in lo.layers[workers[x.site]]

    # transfers: the cross-site edges of the lowered graph are work's transfers, once each
    where = {**{k: w for w, d in lo.layers.items() for k in d}, **{k: w for w, d in lo.scatter.items() for k in d}}
    for n in work.order:
        if isinstance(n, PSource) and isinstance(n.source, ClusterSource):
            lay, rows = n.layout, n.type.key_list()
            keys = dict(n.source.dask_keys)
            where.update({keys[rows[r]]: workers[s] for r, s in zip(lay.rows.tolist(), lay.sites.tolist())})
    graph_moves = {(dep, site_of[w]) for w, layer in lo.layers.items() for task in layer.values()
                   for dep in task.dependencies if where[dep] != w}
    work_moves = set()
    for x in work.transfers:
        src_key = lo.node_keys[x.node.input][int(work[x.node].in_tuple[x.task])]
        assert site_of[where[src_key]] == x.src != x.dest
        work_moves.add((src_key, x.dest))
    assert len(work_moves) == len(work.transfers)
    assert graph_moves == work_moves == {(k, s) for k, s in lo.moves}
    assert work.bytes_moved == plan.cost.bytes_moved
    assert work.floats_moved == plan.cost.floats_moved

    # the graph, fused tasks and all, computes the expression (run in this process)
    resident = any(isinstance(n, PSource) and isinstance(n.source, ClusterSource) for n in work.order)
    if plan.expr is not None and not resident:  # (resident chunks live on a cluster, not here)
        dsk = {**{k: t for d in lo.layers.values() for k, t in d.items()},
               **{k: DataNode(k, c) for d in lo.scatter.values() for k, c in d.items()}}
        wanted = [dk for o in lo.outputs for dk in o.values()]
        got = dict(zip(wanted, get_sync(dsk, wanted)))
        for o, (rel, ref) in enumerate(zip(flatten_outputs(plan.expr)[0], _evaluated(plan.expr))):
            assert set(lo.outputs[o]) == set(ref)
            for k, dk in lo.outputs[o].items():
                np.testing.assert_allclose(got[dk], ref[k], rtol=1e-9, atol=1e-12)
    return lo


def _nested_keys(task) -> set:
    """Keys of the tasks nested (fused) inside ``task`` (a fold's deferred inputs are
    ``[DEFERRED, key, func, *args]`` lists)."""
    return _nested(task.func, task.args)


def _nested(func, args) -> set:
    out = set()
    for a in args:
        if isinstance(a, DaskList) and a.args and a.args[0] == tasks.DEFERRED:
            out |= {a.args[1]} | _nested(a.args[2], a.args[3:])
        elif isinstance(a, DaskTask):
            out |= {a.key} | _nested(a.func, a.args)
    return out


def _evaluated(expr) -> list:
    res = td.evaluate(expr, check=False)
    outs, _ = flatten_outputs(expr)
    if isinstance(res, (tuple, list)):  # a tuple of outputs (of one, too)
        return list(res)
    if len(outs) == 1:
        return [res]
    return list(res.values()) if isinstance(res, dict) else list(res)


@pytest.mark.parametrize("name,sites,how", [(n, s, h) for n in PROGRAMS for s in SITES for h in ("compile", "optimize")
                                             if n != "ffnn sgd step (two outputs)" or s in (1, 5) or h == "compile"])
# (the FFNN step's searches are the suite's longest here: optimized on 1 and 5 sites, compiled on each)
def test_predicted_tasks_and_moves_are_the_lowered_ones(name, sites, how):
    check_work(_plan(how, PROGRAMS[name], sites))


@pytest.mark.parametrize("sites", SITES)
@pytest.mark.parametrize("how", ["compile", "optimize"])
def test_resident_cluster_chunks_are_neither_tasks_nor_scattered(sites, how):
    t = M.type
    R = ClusterSource(tuple((k, f"resident-{k[0]}-{k[1]}") for k in t.key_list()), t, "R", fetch=lambda k: None)
    where = {k: (k[0] + k[1]) % sites for k in t.key_list()}
    expr = matmul(R, td.from_numpy(rng.normal(size=(8, 4)), 2, name="Q"))
    plan = td.compile(expr, sites, placements={R: where}) if how == "compile" else \
        td.optimize(expr, sites, placements={R: where})
    lo = check_work(plan)
    src = next(n for n in plan.nodes if isinstance(n, PSource) and n.source is R)
    assert plan.cost.nodes[src].tasks == 0 and lo.work[src].resident


def test_concat_over_groups_of_one_chunk_is_an_alias():
    # tile size 2 on 2-wide chunks: every group of the concat holds one chunk, which is the result
    expr = td.concat(td.tile(M, 1, 2), 2, 1)
    plan = td.compile(expr, 2)
    agg = plan.outputs[0]
    assert isinstance(agg, LocalAggregate)
    w = plan_work(plan)[agg]
    assert w.ntasks == 0 and (w.alias >= 0).all()
    lo = lower(plan, _workers(2), "tok")
    assert set(lo.outputs[0].values()) <= set(lo.node_keys[agg.input])  # the (shuffled) tiles themselves
    assert not any(k[0].startswith("LocalAggregate") for layer in lo.layers.values() for k in layer)
    # and concat groups of two are one task each, in key_dim order
    plan = td.compile(td.concat(td.tile(M, 1, 1), 2, 1), 2)
    w = plan_work(plan)[plan.outputs[0]]
    assert w.kind == "concat" and w.ntasks == M.ntuples
    tile_node = plan.outputs[0].input.input
    tkeys = tile_node.type.keys[tile_node.layout.rows]
    for x in w.tasks():
        assert [tkeys[i][-1] for _, i in x.inputs] == [0, 1]


def test_an_array_moved_to_a_site_twice_travels_once():
    # a Broadcast and a Shuffle of one source both send some chunks to the same site:
    # the later one (in plan order) reads the earlier one's copy there
    S = td.from_numpy(rng.normal(size=(4, 4)), 2, name="S")
    T = td.from_numpy(rng.normal(size=(4, 4)), 2, name="T")
    src, tsrc = PSource(S, Part((0,), 2)), PSource(T, Part((0,), 2))
    j1 = LocalJoin(Broadcast(src), tsrc, (1,), (0,), td.kernels.get_kernel("matmul"))
    j2 = LocalJoin(Shuffle(src, (1,)), Shuffle(tsrc, (1,)), (1,), (1,), td.kernels.get_kernel("add"))
    plan = td.Plan((j1, j2))
    work = plan_work(plan)
    assert work.via  # some transfer task reads an earlier copy
    for (n, t), (fn, ft) in work.via.items():
        assert work[n].task_site[t] == work[fn].task_site[ft] and work[n].task_array[t] == work[fn].task_array[ft]
        assert work.order.index(fn) < work.order.index(n)
    assert "copy" in {x.kind for n in work.order for x in work.tasks(n)}
    check_work(plan)


def test_planning_counts_fused_tasks_without_naming_them():
    """The time objective ranks whole plans by their fused tasks: a plan of many tasks
    is planned without naming its fused pairs ``(node, task)`` (a dict of millions of
    tuples at 10^4 blocks per input); the lowering names them, and they are what the
    count says."""
    a = td.from_function(lambda key: np.ones((2, 2)), (40, 40), (2, 2), "float64", name="A")
    b = td.from_function(lambda key: np.ones((2, 2)), (40, 40), (2, 2), "float64", name="B")
    plan = td.optimize(matmul(a, b), sites=4)
    into = plan.work.into
    assert len(into) > 100 and into._dict is None  # counted, not named
    lowered = lower(plan, _workers(plan.sites), "tok")
    assert into._dict is not None and len(dict(into.items())) == len(into)
    assert plan.cost.tasks == lowered.ntasks == plan.work.ntasks


def test_node_work_alone_counts_what_the_cost_model_counts():
    plan = td.compile(SGD, 3)
    need = plan_work(plan).need
    for n in plan.nodes:
        assert node_work(n, need[n]).ntasks == plan.cost.nodes[n].tasks
    # without a demand every tuple is needed
    src = next(n for n in plan.nodes if isinstance(n, Shuffle))
    assert node_work(src).ntasks == len(np.unique(src.layout.origin[src.layout.moved]))


def test_task_flops_are_the_kernels_flops_of_each_task():
    plan = td.compile(matmul(A, B), 2)  # A 7x5 in (3, 2) blocks, B 5x6 in (2, 4): ragged edges
    work = plan_work(plan)
    joins = [n for n in work.order if isinstance(n, LocalJoin)]
    folds = [n for n in work.order if isinstance(n, LocalAggregate)]
    assert sum(work[n].task_flops.sum() for n in joins) == 2 * 7 * 5 * 6  # every block product once
    # a fold of k chunks is k - 1 adds of the output chunk: 3 k-blocks, a 7x6 result
    assert sum(work[n].task_flops.sum() for n in folds) == (3 - 1) * 7 * 6
    for n in work.order:  # and the cost model's flops per site are these, summed
        w = work[n]
        np.testing.assert_array_equal(plan.cost.nodes[n].flops_per_site,
                                      np.bincount(w.task_site, weights=w.task_flops, minlength=plan.sites))


def _many_small_blocks():
    a, b = rng.normal(size=(12, 12)), rng.normal(size=(12, 12))
    return matmul(td.from_numpy(a, 3, name="A12"), td.from_numpy(b, 3, name="B12"))  # 4x4x4 blocks


def test_cheap_tasks_fuse_into_readers_that_wait_for_transfers():
    """A task whose reader waits for a transfer fuses into it only when it is cheap —
    its seconds with those of the tasks already fused into it at most
    ``cheap_below`` — so a fused chain never runs late by more than that."""
    one = lambda w: np.ones(len(w.task_tuple))  # noqa: E731  every task runs 1 s
    for expr in (_many_small_blocks(), PROGRAMS["nearest neighbour"]):
        plan = td.compile(expr, 2)
        plain = plan_work(plan.outputs).into
        assert plan_work(plan.outputs, fusion=Fusion(1, one, 0.5)).into == plain  # nothing that cheap
        cheap = plan_work(plan.outputs, fusion=Fusion(1, one, 1.5)).into
        every = plan_work(plan.outputs, fusion=Fusion(1, one, 1e9)).into
        assert set(plain) < set(cheap) <= set(every)

        def late_with_work_in(into):  # fused past a transfer, with tasks fused into it (2 s or more)
            took = set(into.values())
            return [t for t in set(into) - set(plain) if t in took]
        assert not late_with_work_in(cheap)
        if expr is not PROGRAMS["nearest neighbour"]:  # the products join their sums past the transfers
            assert any(isinstance(n, LocalJoin) and n.kernel.name == "matmul" for n, _ in set(cheap) - set(plain))
        else:  # chains that are not cheap fuse only when everything is
            assert late_with_work_in(every)
        two = plan_work(plan.outputs, fusion=Fusion(2, one, 1e9)).into  # threads=2: one per reader still
        assert len(set(two.values())) == len(two)


def _one_sum_per_site():
    a, b = rng.normal(size=(4, 32)), rng.normal(size=(32, 4))
    return matmul(td.from_numpy(a, (4, 4), name="A1"), td.from_numpy(b, (4, 4), name="B1"))  # 1x8x1 blocks


@pytest.mark.parametrize("seconds", ["ones", "random"])
def test_late_tasks_fuse_into_readers_that_are_small_granules_of_their_site(seconds):
    """``Fusion.granules``: a late task (one whose reader waits for a transfer) fuses
    into its reader exactly when the reader, with every input it could take in, runs
    at most 1/granules of its site's work on its node — checked both ways against
    the fusions that every candidate would make; 0 never, 1 always."""
    r = np.random.default_rng(7)
    if seconds == "ones":
        secs = lambda w: np.ones(len(w.task_tuple))  # noqa: E731
    else:
        secs = lambda w: r.uniform(0.1, 3.0, len(w.task_tuple))  # noqa: E731
    for sites in (2, 3):
        for name, expr in (("small blocks", _many_small_blocks()), ("nearest neighbour", PROGRAMS["nearest neighbour"]),
                           ("one sum per site", _one_sum_per_site())):
            plan = td.compile(expr, sites)
            work = plan.work
            timing = {}  # each node's task seconds, drawn once (the rule reads them node by node)

            def one(w):
                if w.node not in timing:
                    timing[w.node] = secs(w)
                return timing[w.node]
            plain = plan_work(plan.outputs).into
            assert plan_work(plan.outputs, fusion=Fusion(1, one, 0.0, 0)).into == plain
            every = plan_work(plan.outputs, fusion=Fusion(1, one, 1e9)).into  # every candidate
            assert plan_work(plan.outputs, fusion=Fusion(1, one, 0.0, 1)).into == every
            some = plan_work(plan.outputs, fusion=Fusion(1, one, 0.0, 4)).into
            assert set(plain) <= set(some) <= set(every)
            fused: dict = {}

            def own(task):  # a task's seconds with what was fused into it
                if task not in fused:
                    fused[task] = float(timing[task[0]][task[1]]) + sum(own(c) for c, q in some.items() if q == task)
                return fused[task]

            def whole(task):  # ... with every input it could take in
                return float(timing[task[0]][task[1]]) + sum(own(c) for c, q in every.items() if q == task)

            def small(task):
                n, t = task
                on_site = np.flatnonzero(work[n].task_site == work[n].task_site[t])
                return 4 * whole(task) <= sum(whole((n, u)) for u in on_site.tolist()) + 1e-9
            for task in set(some) - set(plain):  # taken in late: its reader is a small granule
                assert small(some[task])
            for task in set(every) - set(some):  # left out: its reader is not
                assert not small(every[task])
            late_products = [n for n, _ in set(some) - set(plain) if isinstance(n, LocalJoin) and n.kernel.name == "matmul"]
            if name == "small blocks":  # 16 sums, 8 or 5-6 to a site: their products join them late
                assert late_products
            if name == "one sum per site":  # each site's products could join its one sum, and do not
                assert set(every) > set(plain) and some == plain


@pytest.mark.parametrize("sites", [2, 3])
def test_a_plan_whose_late_products_fuse_into_small_granules_computes_the_expression(sites):
    spec = td.ClusterSpec(sites, task_overhead=1e-9)  # no task is cheap: only granules fuse late tasks
    plan = td.optimize(_many_small_blocks(), sites, cluster=spec, objective="time")
    no_granules = dataclasses.replace(fusion_for(spec), granules=0)
    assert set(plan_work(plan.outputs, fusion=no_granules).into) < set(plan.work.into)
    check_work(plan)


@pytest.mark.parametrize("sites", [2, 3])
def test_a_plan_with_cheap_tasks_fused_lowers_and_computes_the_expression(sites):
    spec = td.ClusterSpec(sites, task_overhead=1.0)  # a task costs a second: every kernel task is cheap
    plan = td.optimize(_many_small_blocks(), sites, cluster=spec, objective="time")
    assert len(plan.work.into) > len(plan_work(plan.outputs, fusion=Fusion(1)).into)
    lo = check_work(plan)
    assert lo.ntasks == plan.cost.tasks < plan_work(plan.outputs, fuse=False).ntasks


def test_a_fold_makes_its_fused_inputs_one_at_a_time():
    """``tasks.fold_deferred``: each deferred input is made just before it is folded
    in, when only the running result is alive — not the inputs before it (``tasks.fold``'s
    inputs, all made before it runs, would be ten) — and a deferred fold within a
    deferred input makes its own inputs the same way."""
    import weakref

    alive, at_make = [0], []

    def gone():
        alive[0] -= 1

    def tracked(x):
        alive[0] += 1
        weakref.finalize(x, gone)
        return x

    def make(v):
        at_make.append(alive[0])  # arrays alive when an input is about to be made
        return tracked(np.full(3, float(v)))

    def add(a, b):
        return tracked(a + b)

    check = ((3,), "float64", "test", None, ())
    D = tasks.DEFERRED
    got = tasks.fold_deferred(add, (), check, *[[D, ("product", i), make, i] for i in range(10)])
    np.testing.assert_array_equal(got, np.full(3, 45.0))
    assert max(at_make) <= 1, at_make
    # deferred and plain inputs mix, in order (a fold that is not commutative); a fold within
    sub = lambda a, b: a - b  # noqa: E731
    inner = [D, ("inner", 0), tasks.fold_deferred, add, (), check, [D, ("p", 2), make, 2], [D, ("p", 3), make, 3]]
    at_make.clear()
    got = tasks.fold_deferred(sub, (), check, np.full(3, 10.0), [D, ("p", 1), make, 4], inner)
    np.testing.assert_array_equal(got, np.full(3, 1.0))
    assert at_make and max(at_make) <= 2, at_make  # the outer fold's result and the inner fold's


@pytest.mark.parametrize("sites", [2, 3])
def test_partial_products_fused_into_their_fold_are_deferred(sites):
    """A site's partial products fused into their sum are made inside the fold one at
    a time; the graph still runs the work's tasks and computes the expression."""
    plan = td.optimize(_many_small_blocks(), sites)
    lo = check_work(plan)
    folds = [t for layer in lo.layers.values() for t in layer.values() if t.func is tasks.fold_deferred]
    assert folds and all(any(isinstance(a, DaskList) and a.args[0] == tasks.DEFERRED for a in t.args)
                         for t in folds)


def test_first_moves_names_a_copy_by_what_it_carries_and_where_not_by_its_node():
    """A copy two movers made of one array at one site is one copy: a later move of
    either to another site is one transfer (the simulator's rule, and Dask's: a key
    fetched once)."""
    from tra_dask.physical.work import first_moves

    a = lambda *v: np.array(v, dtype=np.int64)  # noqa: E731
    S = 2
    # array 10 to site 1 twice (copies 20, 21), then copy 21 to site 0 (22), copy 20 to site 0 (23),
    # and array 10 to site 0 (24: another copy, from the original)
    moves = [(a(10), a(1), a(20)), (a(10), a(1), a(21)), (a(21), a(0), a(22)), (a(20), a(0), a(23)),
             (a(10), a(0), a(24))]
    first = first_moves(moves, S)
    assert [f.tolist() for f in first] == [[0], [0], [2], [2], [4]]
    # several moves per mover, a chain of renamed copies, and unrelated arrays
    moves = [(a(1, 2), a(1, 1), a(30, 31)), (a(2, 1, 5), a(1, 1, 1), a(40, 41, 42)), (a(40, 41), a(0, 0), a(50, 51)),
             (a(51, 30), a(1, 0), a(60, 61))]
    first = first_moves(moves, S)
    assert [f.tolist() for f in first] == [[0, 1], [1, 0, 4], [5, 6], [7, 6]]
    # disjoint movers: each move its own
    assert [f.tolist() for f in first_moves([(a(1), a(0), a(9)), (a(3), a(1), a(8))], S)] == [[0], [1]]


def test_two_copies_one_move_carries_are_one_array_to_its_next_site():
    """Two Shuffles bring one array X to site 1 (copies of X that are one copy there);
    a Broadcast carries both on to site 0: one transfer, the second task reads the
    first's copy — an earlier task of the same node (found by a review: the lowering
    looked that node's keys up before it had made them)."""
    from tra_dask.physical.nodes import KeyArrayMap, LocalMap

    S = td.from_numpy(np.arange(4.0).reshape(1, 4), (1, 4), name="S")
    dup = LocalMap(PSource(S, Part((0,), 2)), KeyArrayMap(insert_dim(2, 2)))  # two keys, one array, site 0
    s2 = Shuffle(Shuffle(dup, (2,), table=(0, 1)), (2,), table=(1, 1))  # each key to site 1 by its own Shuffle
    plan = td.Plan((Broadcast(s2),))
    work = plan_work(plan)
    b = plan.outputs[0]
    assert work.via.get((b, 1)) == (b, 0)
    assert plan.cost.floats_moved == work.floats_moved == td.simulate(plan).floats_moved == 8
    check_work(plan)


def _uneven(w):  # seconds that differ task by task, the same whoever asks (cheap and granule rules both fire)
    return 0.05 + (w.task_tuple % 7) * 0.3


FUSIONS = [Fusion(1), Fusion(1, _uneven, 0.5), Fusion(1, _uneven, 0.0, 4), Fusion(2, _uneven, 1e9),
           Fusion(1, _uneven, 1e9, 2)]


def test_fused_counts_are_what_the_whole_plan_pass_fuses():
    """``FusedCounts(root)``, built from the subplans below ``root`` one node at a time,
    is ``len(plan_work([root]).into)`` for every node of every program's compiled
    plans on 2, 3 and 5 sites (the search's candidates: the next test; one counter per fusion
    setting, shared by all: subplans met again are remembered, and DAGs whose children
    share nodes or moves are derived whole)."""
    roots = {}  # every node of the plans, each once (canonical: equal nodes are one object)
    for name, expr in PROGRAMS.items():
        for p in (td.compile(expr, 2), td.compile(expr, 3), td.compile(expr, 5)):
            roots.update((node, name) for node in toposort(p.outputs))
    for fusion in FUSIONS:
        counts = FusedCounts(fusion)
        for node, name in roots.items():
            assert counts(node) == len(plan_work([node], fusion=fusion).into), (name, fusion, node._op)


class _CheckedCounts(FusedCounts):
    """A FusedCounts that checks each count against the whole-plan pass."""

    calls = 0

    def __call__(self, root):
        got = super().__call__(root)
        assert got == len(plan_work([root], fusion=self.fusion).into), root._op
        _CheckedCounts.calls += 1
        return got


def test_the_search_ranks_by_the_fusions_the_whole_plan_pass_makes(monkeypatch):
    """Every candidate the time objective ranks after fusion (``search._Fused``) is
    counted as the whole-plan pass would: the search of the FFNN SGD step over
    arrays in two row blocks (a DAG whose subexpressions are read twice: a quarter
    of its subplans' children share nodes)."""
    monkeypatch.setattr(search_module, "FusedCounts", _CheckedCounts)
    _CheckedCounts.calls = 0
    r = np.random.default_rng(3)
    x, w1, w2 = r.random((64, 8)), r.random((8, 16)), r.random((16, 4))
    y = np.eye(4)[r.integers(0, 4, 64)]
    x, y, w1, w2 = (td.from_array(a, chunks=c) for a, c in ((x, (32, 8)), (y, (32, 4)), (w1, (8, 16)), (w2, (16, 4))))
    build_local(ffnn_sgd_step_array(x, y, w1, w2, 0.1), sites=2)
    assert _CheckedCounts.calls > 300


@pytest.mark.parametrize("sites", [2, 5])
def test_plans_over_narrow_shared_index_arrays_lower_and_compute_as_predicted(sites, monkeypatch):
    """Large layouts hold their positions as int32, rows one per key as one shared
    read-only arange, dense key grids once for every relation with those keys, and a
    join of two layouts alike position by position pairs each tuple with its own
    (``physical.layout``, ``types``): below a size those paths are skipped, so here
    they are forced on every array; every program still lowers to the tasks and moves
    its work derives, and computes the expression."""
    from tra_dask import types as types_module
    from tra_dask.physical import layout as layout_module
    monkeypatch.setattr(layout_module, "NARROW_FROM", 1)
    monkeypatch.setattr(types_module, "SHARE_FROM", 1)
    r = np.random.default_rng(sites)
    a8, b8 = (td.from_numpy(r.normal(size=(16, 16)), 2, name=n) for n in ("A8", "B8"))
    grid = matmul(a8, b8)  # (on 8 sites: a 2x2x2 grid of replicas, made here: their keys shared)
    narrowed = alike = 0
    for name, expr, s in [(n, e, sites) for n, e in PROGRAMS.items()] + [("3-D multiply", grid, 8)]:
        if name == "ffnn sgd step (two outputs)":
            continue  # (the suite's longest search; its layouts are the multiplies' above)
        plan = td.optimize(expr, s)
        check_work(plan)
        for n in plan.nodes:
            lay = n.layout
            narrowed += lay.ntuples > 1 and lay.rows.dtype == np.int32
            if isinstance(n, LocalJoin):
                lp, rp = lay.lineage
                alike += lp is rp
            # the first copy of each array (told to an insert_dim's replicas, else found) is what the origins say
            _, first = np.unique(lay.origin, return_index=True)
            assert lay.first_positions().tolist() == np.sort(first).tolist(), (name, n)
            assert lay.origins_distinct() == (len(first) == lay.ntuples), (name, n)
    assert narrowed and alike  # (the paths were taken)


@pytest.mark.parametrize("distinct", [True, False])
def test_replicas_know_the_first_copy_of_each_array(distinct):
    """An expansion of k copies per tuple of an input whose arrays are distinct (an
    insert_dim's replicas) is told where each array's first copy is; of an input whose
    arrays repeat, it finds them from its origins.  Both are what the origins say."""
    from tra_dask.physical.layout import Layout, expand_layout
    origin = np.array([5, 9, 7, 1]) if distinct else np.array([5, 9, 5, 1])
    inp = Layout(2, np.array([0, 1, 2, 3]), np.array([0, 1, 1, 0]), origin=origin)
    out = expand_layout(inp, 4, np.arange(12), np.repeat(np.arange(4), 3))
    assert ("_first_positions" in out.__dict__) == distinct
    _, first = np.unique(out.origin, return_index=True)
    assert out.first_positions().tolist() == np.sort(first).tolist()
    assert not out.origins_distinct()


def test_a_fold_reads_its_members_in_key_order():
    """A fold is left to right in key order, as the reference evaluator folds (a
    non-commutative kernel's result depends on it); the order is read off the input's
    sorted rows where its keys are distinct: each task's members, over every
    aggregation of the suite's plans, come in increasing key order."""
    checked = 0
    for name, expr in PROGRAMS.items():
        for sites in (1, 3):
            plan = td.optimize(expr, sites) if name != "ffnn sgd step (two outputs)" else td.compile(expr, sites)
            for n in plan.nodes:
                if not isinstance(n, LocalAggregate) or isinstance(n.kernel, ConcatAgg):
                    continue
                w = node_work(n)
                keys = n.input.type.keys[n.input.layout.rows]
                for t in range(w.ntasks):
                    a, b = int(w.in_ptr[t]), int(w.in_ptr[t + 1])
                    members = [tuple(k) for k in keys[w.in_tuple[a:b]].tolist()]
                    assert members == sorted(members), (name, sites, n._op)
                    checked += 1
    assert checked > 100


@pytest.mark.parametrize("block", [1, 3, 64])
def test_the_fusion_pass_over_ranges_of_a_nodes_tasks_fuses_what_it_fuses_whole(monkeypatch, block):
    """A node of many input slots is fused in ranges of its tasks (``work.SLOT_BLOCK``
    slots at a time, so a 3-D multiply's join of 10^7 tasks holds a few million slots
    at once): the same pairs, and the same seconds and depths of every task, as the
    pass over each node whole — under every rule (cheap tasks, small granules, one per
    reader with threads > 1)."""
    from tra_dask.physical import work as work_module
    r = np.random.default_rng(11)
    timing: dict = {}

    def secs(w):  # each node's task seconds, drawn once
        if w.node not in timing:
            timing[w.node] = r.uniform(0.1, 3.0, len(w.task_tuple))
        return timing[w.node]
    fusions = (None, Fusion(1, secs, 1.5), Fusion(1, secs, 0.0, 4), Fusion(2, secs, 1e9), Fusion(2, secs, 0.5, 3))
    # (a hand-built plan whose transfers read earlier copies: "copy" tasks in ranges too)
    S = td.from_numpy(rng.normal(size=(8, 8)), 2, name="S")
    src = PSource(S, Part((0,), 2))
    copies = (LocalJoin(Broadcast(src), src, (1,), (0,), td.kernels.get_kernel("matmul")),
              LocalJoin(Shuffle(src, (1,)), Shuffle(src, (1,)), (1,), (1,), td.kernels.get_kernel("add")))
    assert PlanWork(copies).via
    plans = [td.compile(e, s).outputs for e in (_many_small_blocks(), _one_sum_per_site(),
                                                 PROGRAMS["nearest neighbour"], SGD) for s in (2, 3)]
    for outputs in plans + [copies]:
        for fusion in fusions:
            masks = {o: np.ones(o.layout.ntuples, bool) for o in outputs}
            whole = PlanWork(outputs, fusion=fusion, masks=masks)
            monkeypatch.setattr(work_module, "SLOT_BLOCK", block)
            ranged = PlanWork(outputs, fusion=fusion, masks=masks)
            monkeypatch.undo()
            assert dict(ranged.into.items()) == dict(whole.into.items())
            if whole.producers is not None:
                for f in ("work_in", "depth", "readers", "late", "prod"):
                    np.testing.assert_array_equal(getattr(ranged.producers, f), getattr(whole.producers, f))


def test_readers_are_counted_over_compact_and_sparse_spans_alike():
    from tra_dask.physical.work import _count_into
    r = np.random.default_rng(3)
    for ids in (r.integers(10, 50, 1000), r.integers(0, 10**7, 50), np.array([5, 5, 9_000_000, 5]), np.zeros(0, int)):
        got = np.zeros(10**7 + 1, np.int32)
        _count_into(got, ids.astype(np.int32))
        np.testing.assert_array_equal(got, np.bincount(ids, minlength=len(got)))


@pytest.mark.parametrize("sites", [1, 3])
def test_fixed_input_slots_are_the_listed_inputs(sites):
    """Where every task reads as many inputs (joins, moves, maps), the fusion pass
    reads them off the lineage (``fixed_slots``, any range of tasks) instead of
    listing them: the same (child, tuple) per slot as ``in_ptr``/``in_child``/``in_tuple``."""
    seen = set()
    for expr in list(PROGRAMS.values()) + [_many_small_blocks(), _one_sum_per_site()]:
        plan = td.compile(expr, sites)
        for n, w in plan.work.nodes.items():
            k = w.slots_per_task
            if k is None:
                continue
            seen.add((type(n).__name__, k))
            m = len(w.task_tuple)
            np.testing.assert_array_equal(w.in_ptr, np.arange(m + 1) * k)
            assert w.nslots == len(w.in_tuple)
            for t0, t1 in ((0, m), (m // 3, m - m // 4), (m, m)):
                fixed = w.fixed_slots(t0, t1)
                assert len(fixed) == k
                for j, (c, tup) in enumerate(fixed):
                    np.testing.assert_array_equal(w.in_child[k * t0 + j:k * t1:k], c)
                    np.testing.assert_array_equal(w.in_tuple[k * t0 + j:k * t1:k], tup)
    assert {("LocalJoin", 2), ("Shuffle", 1), ("Broadcast", 1), ("LocalMap", 1)} <= seen


@pytest.mark.parametrize("share_from", [1, 1 << 16])
def test_a_join_of_two_full_key_grids_is_the_grid_without_pairing_keys(monkeypatch, share_from):
    """A join of two relations whose keys are every key below their frontiers, one
    chunk shape each, is typed as the full grid of its output dims, made directly
    (``types.RelationType.grid``): the same keys, chunk shapes, dtype and key index
    as pairing the keys finds, and evaluated to the same relation, with right dims
    left over or none (every right dim joined: the left's grid); ragged blocks or
    holes take the general rule."""
    from tra_dask import types as types_module
    from tra_dask.logical import nodes as lnodes
    from tra_dask.logical.builders import join
    from tra_dask.logical.evaluate import evaluate
    monkeypatch.setattr(types_module, "SHARE_FROM", share_from)
    r = np.random.default_rng(2)
    cases = [(td.from_numpy(r.normal(size=(6, 4)), 2, name="G1"), td.from_numpy(r.normal(size=(4, 10)), 2, name="G2"),
              (1,), (0,), "matmul", True),
             (td.from_numpy(r.normal(size=(6, 4)), 2, name="H1"), td.from_numpy(r.normal(size=(8, 6)), 2, name="H2"),
              (0,), (1,), "add", True),  # left dim 0 with right dim 1: keys (i, j, k) from (i, j) and (k, i)
             (td.from_numpy(r.normal(size=(7, 4)), (3, 2), name="R1"), td.from_numpy(r.normal(size=(4, 5)), 2,
                                                                                    name="R2"),
              (1,), (0,), "matmul", False),  # ragged blocks: more than one chunk shape
             (td.from_numpy(r.normal(size=(6, 4)), 2, name="S1"), td.from_numpy(r.normal(size=(4, 6)), 2, name="S2"),
              (0, 1), (1, 0), "add", True)]  # every right dim joined: nothing left over
    took = []
    real = lnodes._grid_join

    def spy(*a):
        got = real(*a)
        took.append(got is not None)
        return got
    for left, right, lo, ro, kernel, fast in cases:
        took.clear()
        monkeypatch.setattr(lnodes, "_grid_join", spy)
        j = join(left, right, lo, ro, kernel)
        monkeypatch.setattr(lnodes, "_grid_join", lambda *a: None)
        g = join(left, right, lo, ro, kernel)
        monkeypatch.setattr(lnodes, "_grid_join", real)
        assert took == [fast]
        a, b = j.type, g.type
        np.testing.assert_array_equal(a.keys, b.keys)
        np.testing.assert_array_equal(a.shape_ids, b.shape_ids)
        assert a.shapes == b.shapes and a.dtype == b.dtype and a.frontier == b.frontier
        probe = np.concatenate([b.keys[::2], b.keys[:1] + 50])
        np.testing.assert_array_equal(a.locate(probe), b.locate(probe))
        ea, eb = evaluate(j), evaluate(g)
        assert set(ea) == set(eb) and all(np.allclose(ea[k], eb[k]) for k in eb)


def _sgd_reading_y_twice():
    r = np.random.default_rng(0)
    return ffnn_sgd_step(td.from_numpy(r.normal(size=(8, 4)), (2, 1), name="X"),
                         td.from_numpy(np.eye(2)[r.integers(0, 2, 8)], (2, 1), name="Y"),
                         td.from_numpy(r.normal(size=(4, 8)), (1, 8), name="W1"),
                         td.from_numpy(r.normal(size=(8, 2)), (8, 1), name="W2"), 0.1)


def _product_reading_a_twice():
    r = np.random.default_rng(0)
    A = td.from_array(r.normal(size=(30, 36)), chunks=(8, 8), name="A")
    B = td.from_array(r.normal(size=(36, 36)), chunks=(8, 8), name="B")
    C = td.from_array(r.normal(size=(36, 31)), chunks=(8, 8), name="C")
    return ((A @ B @ C).T @ A).to_relation(sites=1)[0]


@pytest.mark.parametrize("case, sites, obj", [("sgd", 2, "bytes"), ("product", 6, "time")])
def test_a_chunk_two_placements_put_on_one_site_is_one_array(case, sites, obj):
    """Data of this process placed by two nodes (a source read twice, under two
    placements) is one array where both put a chunk on one site: the lowering names
    it by its content, key and worker, so moving it on to a site is one transfer.
    The cost, the work and the simulator count it once, as the lowered graph moves it."""
    expr = _sgd_reading_y_twice() if case == "sgd" else _product_reading_a_twice()
    plan = td.optimize(expr, sites=sites, objective=obj)
    sources = [n for n in plan.nodes if isinstance(n, PSource)]
    assert len({n.source for n in sources}) < len(sources)  # (a source placed twice)
    check_work(plan)  # the lowered graph's moves are the work's transfers, one each
    assert td.simulate(plan).floats_moved == plan.cost.floats_moved == plan.work.floats_moved


def test_folds_of_the_same_arrays_into_two_groups_are_two_arrays():
    """An aggregation of an insert_dim's copies folds the same arrays into one group
    per copy: a task each, so two arrays (the lowering's), and moving both moves
    both — the simulator counts what the cost and the lowered graph count."""
    S = td.from_numpy(np.arange(4.0).reshape(2, 2), 1, name="S")
    R0 = td.aggregate(td.rekey(S, insert_dim(0, 3)), (0, 1), "add")
    expr = td.join(R0, R0, (0, 1), (0, 1), "min")
    for sites in (2, 3):
        plan = td.optimize(expr, sites=sites, objective="bytes")
        plans = [plan, *plan.alternatives]
        assert any(p.cost.floats_moved for p in plans)
        for p in plans:
            assert td.simulate(p).floats_moved == p.cost.floats_moved
            check_work(p)


def test_a_tuple_of_one_output_lowers_as_predicted():
    check_work(td.optimize((matmul(A, B),), sites=2))
