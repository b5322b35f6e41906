"""The time model's terms priced by what the work does: kernels classed by their
subscripts, a result's write counted once, rates that depend on how many workers of
a host are busy, and calibration that keeps the quiet reading of repeated probes."""

import dataclasses

import numpy as np
import pytest

import tra_dask as td
from tra_dask.frontend.chunk_ops import einsum_kernel
from tra_dask.kernels import compose, get_kernel
from tra_dask.optimizer.time import busiest, contraction_class, kernel_class, kernel_rate, node_seconds_per_site
from tra_dask.physical import LocalJoin
from tra_dask.programs import matmul, random_uniform
from tra_dask.runtime.calibrate import _alone_rates, host_rate, quiet_reading


@pytest.mark.parametrize("sub, cls", [
    ("ij,jk->ik", "blas"),  # matmul
    ("ji,jk->ik", "blas"),  # gram X.T @ X
    ("ij,kj->ik", "blas"),
    ("bij,bjk->bik", "blas"),  # batched: a GEMM per batch index
    ("ij,ij->i", "elementwise"),  # row dot: every element read once
    ("ij,ij->", "elementwise"),  # a product then a sum
    ("ij,ij->ij", "elementwise"),  # Hadamard
    ("i,j->ij", "elementwise"),  # outer product: no summed index
    ("ij,j->i", "elementwise"),  # matrix-vector: no kept index on one side
    ("ij->i", "elementwise"),
    ("ii,ij->j", "elementwise"),  # a diagonal: no BLAS call
])
def test_contractions_are_classed_by_their_subscripts(sub, cls):
    assert contraction_class(sub) == cls
    assert contraction_class("ab,bc,cd->ad") == "elementwise"  # (not a kernel: three operands)
    # the front-end's kernel, whatever its name (a row dot is named tensordot)
    assert kernel_class(einsum_kernel(sub)) == cls


def test_kernels_carry_their_subscripts_and_compositions_their_stages():
    assert [get_kernel(n).subscripts for n in ("matmul", "matmul_tn", "matmul_nt")] == [
        "ij,jk->ik", "ji,jk->ik", "ij,kj->ik"]
    assert kernel_class(get_kernel("matmul_tn")) == "blas" and kernel_class(get_kernel("add")) == "elementwise"
    assert einsum_kernel("ij,ij->i").name == "tensordot"  # the name would say BLAS
    relu_mm = compose(get_kernel("relu"), get_kernel("matmul"))
    assert [k.name for k in relu_mm.stages] == ["matmul", "relu"] and kernel_class(relu_mm) == "blas"
    assert kernel_class(compose(get_kernel("relu"), einsum_kernel("ij,ij->i"))) == "elementwise"
    # a user's kernel without subscripts: by its name, as before
    user = td.kernel(name="matmul_mine", shape=lambda a, b: (a[0], b[1]), flops=lambda a, b: 2 * a[0] * a[1] * b[1])(
        lambda a, b: a @ b)
    assert user.subscripts is None and kernel_class(user) == "blas"


def _plan(sub, shapes, chunks, spec):
    rng = np.random.default_rng(0)
    arrays = [td.from_array(rng.random(s), chunks=c) for s, c in zip(shapes, chunks)]
    rel = td.einsum(sub, *arrays).to_relation(sites=1)[0]
    return td.optimize(rel, sites=spec.sites, cluster=spec)


def _join(plan):
    (join,) = [n for n in plan.cost.nodes if isinstance(n, LocalJoin)]
    return join


def test_a_row_dot_runs_at_the_pace_of_memory_not_of_blas():
    """``ij,ij->i`` reads each element once for two flops: priced by the elements it
    touches at the elementwise rate (an in-place add touches three per element), not
    at the matmul rate its kernel's name suggested (predicted 87% fast)."""
    spec = td.ClusterSpec(1, rates={"blas": 4e10, "elementwise": 1e9}, fresh_bandwidth=1e10)
    n, d = 4000, 200
    plan = _plan("ij,ij->i", [(n, d), (n, d)], [(n, d), (n, d)], spec)
    join = _join(plan)
    assert kernel_class(join.kernel) == "elementwise"
    touched = 2 * n * d + n
    assert kernel_rate(join, spec) == pytest.approx(1e9 * 3 * (2 * n * d) / touched)
    assert plan.cost.node_seconds[join] == pytest.approx(touched / 3e9 + 8 * n / 1e10)
    assert plan.cost.node_seconds[join] > 10 * (2 * n * d) / 4e10  # far from the BLAS price


def test_an_outer_products_result_is_written_once():
    """An outer product's work is its result: the elements it touches (its result
    once) at the in-place elementwise pace, plus the new array once at the
    new-memory bandwidth — not its 2·I·J flops as elements and the new array again
    (predicted 3.2x its time)."""
    spec = td.ClusterSpec(1, rates={"blas": 4e10, "elementwise": 1e9}, fresh_bandwidth=4e9)
    i, j = 3000, 2000
    plan = _plan("i,j->ij", [(i,), (j,)], [(i,), (j,)], spec)
    join = _join(plan)
    out = i * j
    got = plan.cost.node_seconds[join]
    assert got == pytest.approx((i + j + out) / 3e9 + 8 * out / 4e9)
    assert got < 0.6 * (2 * out / 1e9 + 8 * out / 4e9)  # the old charge: 2·I·J elements, then the array again
    assert node_seconds_per_site(plan.cost.nodes[join], spec)[0] == pytest.approx(got)


def test_a_gemm_is_never_faster_than_its_elements_can_be_touched():
    """A product with a tiny contracted dimension writes more than it computes: its
    rate is capped by the memory pace of the elements it touches (a roofline)."""
    spec = td.ClusterSpec(1, rates={"blas": 4e10, "elementwise": 1e9}, blas_half_size=0)
    thin = _join(_plan("ij,jk->ik", [(2000, 2), (2, 2000)], [(2000, 2), (2, 2000)], spec))
    square = _join(_plan("ij,jk->ik", [(500, 500), (500, 500)], [(500, 500), (500, 500)], spec))
    assert kernel_class(thin.kernel) == "blas" and kernel_rate(square, spec) == pytest.approx(4e10)
    flops, touched = 2 * 2000 * 2 * 2000, 2 * 2000 * 2 + 2000 * 2000
    assert kernel_rate(thin, spec) == pytest.approx(1e9 * 3 * flops / touched)


def test_transcendental_elements_cost_their_adds():
    """``exp``, ``sin``, ``x ** 2.5`` are compute bound: their elements count at their cost
    in in-place adds (ELEMENT_COST), a composition at its stages' mean, a square as an
    add; on a GPU (memory bound) and in the chunk choice's estimate alike."""
    from tra_dask.frontend.chunk_ops import scalar_kernel, ufunc_kernel
    from tra_dask.frontend.estimate import Estimator
    from tra_dask.frontend.chunking import AxisClasses
    from tra_dask.optimizer.time import ELEMENT_COST, call_rate, element_cost

    exp, add = get_kernel("exp"), get_kernel("add")
    assert element_cost(exp) == ELEMENT_COST["exp"] > 4 and element_cost(add) == 1.0
    assert element_cost(ufunc_kernel("sin")) == ELEMENT_COST["sin"]
    assert element_cost(scalar_kernel("pow", 2)) == 1.0 < element_cost(scalar_kernel("pow", 2.5))
    assert element_cost(scalar_kernel("pow", 2, reflected=True)) == ELEMENT_COST["pow"]  # 2 ** x
    assert element_cost(compose(exp, add)) == pytest.approx((1 + ELEMENT_COST["exp"]) / 2)
    spec = td.ClusterSpec(1, rates={"blas": 4e10, "elementwise": 1e9})
    shapes = [(1000, 1000)]
    assert call_rate(exp, shapes, np.float64, spec) == pytest.approx(1e9 / ELEMENT_COST["exp"])
    assert call_rate(add, shapes * 2, np.float64, spec) == pytest.approx(1e9)
    # a cluster whose exp costs 2 adds (td.calibrate measures it) scales the table, never under one add
    cheap = td.ClusterSpec(1, rates={"blas": 4e10, "elementwise": 1e9}, exp_cost=2.0)
    scale = 2.0 / ELEMENT_COST["exp"]
    assert call_rate(exp, shapes, np.float64, cheap) == pytest.approx(1e9 / 2.0)
    assert call_rate(ufunc_kernel("sin"), shapes, np.float64, cheap) == pytest.approx(1e9 / (ELEMENT_COST["sin"] * scale))
    assert element_cost(get_kernel("sqrt"), 2.0) == 1.0  # (1.4 x scale < 1)
    gpu = td.ClusterSpec(1, gpu=td.GpuSpec(memory=80e9, blas={"float64": 4e13}, elementwise=3e11, to_host=2e10,
                                          from_host=2.5e10))
    assert call_rate(exp, shapes, np.float64, gpu) == call_rate(add, shapes * 2, np.float64, gpu)

    # the plan and the estimate price np.exp(a) above a + 1 by the kernel's extra adds
    a = td.from_region(lambda r: None, (2000, 2000), "float64")
    secs = {}
    for name, x in (("exp", np.exp(a)), ("add", a + 1.0)):
        plan = td.frontend.run.build_local(x, sites=2)[1]
        est = Estimator(AxisClasses([x._node]), 2, td.ClusterSpec(2), {})([1000, 2000])
        secs[name] = (plan.cost.seconds, est)
    extra = 2000 * 2000 / 2 * (ELEMENT_COST["exp"] - 1) / td.ClusterSpec(2).rates["elementwise"]
    assert secs["exp"][0] - secs["add"][0] == pytest.approx(extra, rel=0.05)
    assert secs["exp"][1] - secs["add"][1] == pytest.approx(extra, rel=0.05)


def test_a_worker_alone_on_its_host_runs_at_the_rate_alone():
    """Rates measured with every worker busy and alone: a node whose only busy site
    is on a host of two runs at the rate alone, capped by the host's capacity (the
    two workers' rates together); k busy workers of a host share it."""
    together = td.ClusterSpec(2, rates={"blas": 1e10, "elementwise": 1e9}, cores=2)
    assert not together.shared_hosts  # every thread has a core, nothing measured alone
    fast = td.ClusterSpec(2, rates={"blas": 1e10, "elementwise": 1e9}, rates_alone={"blas": 1.5e10}, cores=2)
    (sites, alone, share), = fast.shared_hosts
    assert list(sites) == [0, 1] and alone["blas"] == pytest.approx(1 / 1.5) and alone["elementwise"] == 1
    assert share == pytest.approx(0.5)
    v = np.array([3.0, 0.0])
    assert busiest(v, together, "blas") == 3 and busiest(v, fast, "blas") == pytest.approx(2)
    assert busiest(v, fast, "elementwise") == 3 and busiest(v, fast, None) == 3
    assert busiest(np.array([3.0, 3.0]), fast, "blas") == 3  # both busy: the measured rate
    # 2.3x alone on two workers: one busy worker gets the host's capacity, twice the rate
    greedy = td.ClusterSpec(2, rates={"blas": 1e10}, rates_alone={"blas": 2.3e10}, cores=2)
    assert busiest(v, greedy, "blas") == pytest.approx(1.5)
    # four workers, 1.6x alone: k busy of 4 run at min(alone, 4/k x together)
    four = td.ClusterSpec(4, rates={"blas": 1e10}, rates_alone={"blas": 1.6e10}, cores=4)
    for k, want in ((1, 1 / 1.6), (2, 1 / 1.6), (3, 3 / 4), (4, 1.0)):
        assert busiest(np.array([1.0] * k + [0.0] * (4 - k)), four, "blas") == pytest.approx(want)
    # kept in a file, with defaults where only one rate is known
    assert td.ClusterSpec(2).rates_alone is None and not td.ClusterSpec(2).shared_hosts
    with pytest.raises(ValueError, match="unknown kernel class 'gemm' in rates_alone"):
        td.ClusterSpec(2, rates_alone={"gemm": 1e10})
    with pytest.raises(ValueError, match=r"rates_alone\['blas'\] must be a positive"):
        td.ClusterSpec(2, rates_alone={"blas": -1})


def test_a_one_block_multiply_is_not_predicted_slower_than_the_split_plan(tmp_path):
    """4200x280 @ 280x4200 float64 on 2 workers of one host: with dgemm measured 2.3x
    as fast alone as with both workers busy, the one-block plan (1 task, one busy
    worker) is not predicted 1.8x slower than the 2100-block plan (it ran as fast or
    faster); with one rate for both (as before) it is."""
    def plans(spec):
        out = []
        for b in (4200, 2100):
            e = matmul(random_uniform((4200, 280), (b, 280), seed=1, name="A"),
                       random_uniform((280, 4200), (280, b), seed=2, name="B"))
            out.append(td.optimize(e, sites=2, cluster=spec, objective="time").cost.seconds)
        return out

    base = dict(rates={"blas": 9e9, "elementwise": 1e9}, cores=2, bandwidth=1.5e9, task_overhead=5e-4)
    one, split = plans(td.ClusterSpec(2, **base))
    assert one > 1.6 * split  # the model before: one rate, whatever is busy
    spec = td.ClusterSpec(2, rates_alone={"blas": 2.3 * 9e9}, **base)
    spec.save(tmp_path / "spec.json")
    assert td.ClusterSpec.load(tmp_path / "spec.json") == spec
    one, split = plans(spec)
    assert one < 1.15 * split


def test_calibration_keeps_the_quiet_reading_of_noisy_repeats():
    """Another process's load only slows a probe down: the quiet reading of a rate is
    the highest of its repeats, of a cost a low quantile; the disagreement says how
    loaded the machine was."""
    rng = np.random.default_rng(5)
    true = 2.0e10
    for _ in range(50):  # each repeat slowed by a random load, one of them not at all
        slow = np.concatenate([[1.0], rng.uniform(1.0, 17.0, size=4)])
        rate, spread = quiet_reading(true / rng.permutation(slow))
        assert rate == pytest.approx(true) and spread == pytest.approx(slow.max())
    # costs: a low quantile, neither the mean nor the lucky lowest
    walls = [0.031, 0.012, 0.0101, 0.0102, 0.150, 0.0105, 0.2, 0.0103]
    got, spread = quiet_reading(walls, rate=False)
    assert 0.0101 < got <= 0.0105 and spread == pytest.approx(0.2 / 0.0101)
    assert quiet_reading([3.0, 3.0, 3.0]) == (3.0, 1.0)
    with pytest.raises(ValueError, match="positive and finite"):
        quiet_reading([1.0, 0.0])
    with pytest.raises(ValueError, match="positive and finite"):
        quiet_reading([])
    # the rates alone: only where measurably faster than with every worker busy
    assert _alone_rates({"blas": 1e10, "elementwise": 1e9}, {"blas": 2.3, "elementwise": 1.02}) == {"blas": 2.3e10}
    assert _alone_rates({"blas": 1e10, "elementwise": 1e9}, {"blas": 1.0}) is None


def test_calibration_reads_a_hosts_rate_window_by_window():
    """Workers of a host run their windows at once: a window's mean over them is the
    host's rate per worker.  Three one-thread workers time-sliced on two cores (the OS
    gives each a core in some windows and a share in others) each read nearly a core's
    rate in their best window; the rate every worker gets while all are busy is 2/3 of it,
    and a host whose workers disagree only that way is not a loaded machine."""
    rng = np.random.default_rng(7)
    core = 1.2e9
    for _ in range(50):  # in each window one worker waits most of it, the others hold a core most of it
        windows = [rng.permutation([0.2, 0.8, 1.0]) * core for _ in range(3)]
        per_worker = {w: {"add": [win[i] for win in windows]} for i, w in enumerate("abc")}
        rate, spread = host_rate(per_worker, "add", dict.fromkeys("abc", "h"))
        assert rate == pytest.approx(2 * core / 3) and spread == pytest.approx(1.0)
        # each worker's own best window, the median over workers: 0.8-1.0 of a core
        assert np.median([max(r["add"]) for r in per_worker.values()]) >= 1.15 * rate
    # hosts apart: each host's own windows, the median over hosts; a loaded host shows
    per_worker = {"a": {"k": [1.0, 1.0]}, "b": {"k": [1.0, 1.0]}, "c": {"k": [4.0, 1.0]}, "d": {"k": [2.0, 2.0]},
                  "e": {"k": [3.0, 3.0]}}
    rate, spread = host_rate(per_worker, "k", {"a": 0, "b": 0, "c": 1, "d": 2, "e": 2})
    assert rate == 2.5 and spread == 4.0  # (hosts 0 and 2 count twice: 1, 1, 4, 2.5, 2.5)
    # a host of three workers outweighs one of one
    per_worker = {"a": {"k": [1.0, 1.0]}, "b": {"k": [1.0, 1.0]}, "c": {"k": [1.0, 1.0]}, "d": {"k": [9.0, 9.0]}}
    assert host_rate(per_worker, "k", {"a": 0, "b": 0, "c": 0, "d": 1})[0] == 1.0


def test_in_process_inputs_are_named_on_every_submission():
    """Each submission hashes the plan's numpy inputs (so that chunks the workers hold
    are not sent again): their bytes at the spec's ``hash_bandwidth``, each array once
    however many chunks or readers it has; data made on the workers costs nothing."""
    from tra_dask.frontend.chunking import AxisClasses
    from tra_dask.frontend.estimate import Estimator
    from tra_dask.optimizer.time import plan_seconds

    x = np.ones((400, 300))
    a = td.from_array(x)
    _, plan = td.frontend.run.build_local(a @ a.T + 1.0, sites=2)
    assert plan.cost.named == x.nbytes
    fast = dataclasses.replace(td.ClusterSpec(2), hash_bandwidth=1e15)
    slow = dataclasses.replace(fast, hash_bandwidth=1e6)
    assert plan_seconds(plan.cost, slow)[0] - plan_seconds(plan.cost, fast)[0] == pytest.approx(x.nbytes / 1e6, rel=1e-6)
    made = td.from_region(lambda r: None, (400, 300), "float64")
    assert td.frontend.run.build_local(made @ made.T + 1.0, sites=2)[1].cost.named == 0
    cl = AxisClasses([(a @ a.T)._node])
    blocks = [c[0] for c in (cl.candidates(ci, 2) for ci in range(len(cl.classes)))]
    assert Estimator(cl, 2, slow, {})(blocks) - Estimator(cl, 2, fast, {})(blocks) == pytest.approx(x.nbytes / 1e6)
