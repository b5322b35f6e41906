"""The time model: ClusterSpec, td.calibrate, predicted seconds, the "time" objective."""

import dataclasses
import json

import numpy as np
import pytest
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.optimizer.cost import plan_cost
from tra_dask.optimizer.time import kernel_class, kernel_rate, plan_seconds
from tra_dask.physical import Broadcast, KeyArrayMap, LocalAggregate, LocalJoin, LocalMap, Shuffle
from tra_dask.physical.work import plan_work
from tra_dask.programs import ffnn_sgd_step, matmul, nearest_neighbor


def _mat(rng, shape, chunks, name):
    return td.from_numpy(rng.normal(size=shape), chunks, name=name)


def _programs():
    rng = np.random.default_rng(5)
    A, B = _mat(rng, (400, 300), (100, 100), "A"), _mat(rng, (300, 200), (100, 50), "B")
    return {
        "matmul": matmul(A, B),
        "nn": nearest_neighbor(_mat(rng, (60,), (20,), "q"), _mat(rng, (300, 60), (50, 20), "X"),
                               _mat(rng, (60, 60), (20, 20), "M")),
        "ffnn": ffnn_sgd_step(_mat(rng, (80, 40), (20, 20), "X"), _mat(rng, (80, 10), (20, 10), "Y"),
                              _mat(rng, (40, 60), (20, 20), "W1"), _mat(rng, (60, 10), (20, 10), "W2"), 0.1),
    }


SPEC = td.ClusterSpec(3, memory_per_site=2e9, bandwidth=2e8, rates={"blas": 1e10, "elementwise": 5e8},
                      task_overhead=2e-3, threads=2, fresh_bandwidth=1e9)


def _by_hand(plan, spec):
    """The makespan recomputed from physical.work's derivation (tasks and transfers
    read off the work, not off the cost), with the same formula."""
    work = plan.work  # its derivation, fusion (for its threads) included
    cost = plan.cost
    recv = {n: np.zeros(plan.sites) for n in work.order}
    send = {n: np.zeros(plan.sites) for n in work.order}
    for x in work.transfers:
        recv[x.node][x.dest] += x.floats
        send[x.node][x.src] += x.floats
    finish, on_site = {}, np.zeros(plan.sites)
    for n in work.order:
        t = np.zeros(plan.sites)
        flops = cost.nodes[n].flops_per_site
        if flops.any():
            t = t + flops / (kernel_rate(n, spec) * spec.threads)
        if isinstance(n, (Broadcast, Shuffle)):
            t = t + (recv[n] + send[n]) * n.type.dtype.itemsize / spec.link_bandwidth
        if isinstance(n, (LocalJoin, LocalAggregate)) or (isinstance(n, LocalMap) and isinstance(n.op, KeyArrayMap)):
            w = work[n]  # each kernel task makes one new array: its first tuple's chunk
            made = n.type.chunk_sizes[n.layout.rows[w.task_tuple]] * n.type.dtype.itemsize
            t = t + np.bincount(w.task_site, weights=made, minlength=plan.sites) / spec.fresh_bandwidth
        finish[n] = float(t.max()) + max((finish[c] for c in n.children), default=0.0)
        on_site += t
    path = max(max(finish[o] for o in plan.outputs), on_site.max())  # a site's work runs one thing at a time
    named = {id(n.source.array): n.source.array.nbytes for n in work.order  # numpy inputs, hashed per submission
             if isinstance(getattr(getattr(n, "source", None), "array", None), np.ndarray)}
    return spec.submit_overhead + sum(named.values()) / spec.hash_bandwidth + work.ntasks * spec.task_overhead + path


@pytest.mark.parametrize("name", ["matmul", "nn", "ffnn"])
def test_predicted_seconds_are_the_formula_over_the_work(name):
    expr = _programs()[name]
    plan = td.optimize(expr, sites=3, cluster=SPEC)
    assert plan.cost.seconds == pytest.approx(_by_hand(plan, SPEC), rel=1e-9)
    for alt in plan.alternatives[:5]:
        assert alt.cost.seconds == pytest.approx(_by_hand(alt, SPEC), rel=1e-9)
    # the chosen plan is the fastest the search kept (ties broken by bytes)
    assert plan.cost.seconds <= min(a.cost.seconds for a in plan.alternatives) + 1e-12
    assert "predicted time" in plan.explain() and "time=" in plan.explain()


def test_kernel_rates_by_class_and_chunk_size():
    rng = np.random.default_rng(0)
    spec = td.ClusterSpec(2, rates={"blas": 1e10, "elementwise": 1e9}, blas_half_size=100)
    for n, want in [(100, 0.5e10), (400, 0.8e10)]:  # rate(n) = peak / (1 + half / n)
        A = _mat(rng, (2 * n, 2 * n), n, "A")
        plan = td.compile(matmul(A, A), 2)
        join = next(x for x in plan.nodes if type(x).__name__ == "LocalJoin")
        assert kernel_class(join.kernel) == "blas" and kernel_rate(join, spec) == pytest.approx(want)
        agg = plan.outputs[0]
        assert kernel_class(agg.kernel) == "elementwise" and kernel_rate(agg, spec) == 1e9
    # float32 runs twice as fast
    A32 = td.from_numpy(rng.normal(size=(800, 800)).astype("float32"), 400, name="A")
    join = next(x for x in td.compile(matmul(A32, A32), 2).nodes if type(x).__name__ == "LocalJoin")
    assert kernel_rate(join, spec) == pytest.approx(2 * 0.8e10)


def test_imbalance_and_slow_links_cost_time():
    rng = np.random.default_rng(0)
    A, B = _mat(rng, (1600, 1600), (400, 400), "A"), _mat(rng, (1600, 1600), (400, 400), "B")
    e = matmul(A, B)
    c = plan_cost(td.compile(e, 4).outputs)
    fast, slow = td.ClusterSpec(4, bandwidth=1e10), td.ClusterSpec(4, bandwidth=1e7)
    assert plan_seconds(c, slow)[0] > plan_seconds(c, fast)[0]
    # the data on site 0: computing there moves only the result, but the time objective spreads
    # the products over the four sites, and predicts that faster
    at0 = {"A": {k: 0 for k in A.keys}, "B": {k: 0 for k in B.keys}}
    serial = td.compile(e, 4, placements=at0)
    assert serial.cost.flops_balance > 3.9  # every product on site 0
    spread = td.optimize(e, sites=4, placements=at0, cluster=fast)
    assert spread.cost.floats_moved > 0 and spread.cost.flops_balance < 2
    assert spread.cost.seconds < plan_seconds(serial.cost, fast)[0]


def test_workers_sharing_a_hosts_cores_take_an_idle_ones_core():
    """Three single-threaded workers on a 2-core host: the measured rates are shared
    ones, and a worker that idles gives its core to the others — 8/4/4 units of work
    take as long as 6/5/5 (the host's 16 units over its 2 cores at 1.5x the shared
    rate), where three cores would finish 6/5/5 first."""
    from tra_dask.optimizer.time import busiest

    shared, own = td.ClusterSpec(3, cores=2), td.ClusterSpec(3)
    assert [len(s) for s, _, _ in shared.shared_hosts] == [3] and not own.shared_hosts
    assert not td.ClusterSpec(3, cores=3).shared_hosts and not td.ClusterSpec(3, cores=2, hosts=(0, 1, 2)).shared_hosts
    for v in ([8.0, 4.0, 4.0], [6.0, 5.0, 5.0]):
        assert busiest(np.array(v), shared) == pytest.approx(16 / 3)
    assert busiest(np.array([8.0, 4, 4]), own) == 8 and busiest(np.array([6.0, 5, 5]), own) == 6
    assert busiest(np.array([3.0, 0, 0]), shared) == pytest.approx(2)  # alone: 1.5x the shared rate
    assert busiest(np.array([5.0, 5, 5]), shared) == 5  # all busy: the measured rates
    # 2 workers x 4 threads on 4 cores: calibrated one thread per worker (each had a core),
    # so one busy worker runs as predicted and two share the 4 cores (twice as long)
    threads = td.ClusterSpec(2, threads=4, cores=4)
    assert busiest(np.array([1.0, 0]), threads) == 1 and busiest(np.array([1.0, 1]), threads) == 2
    assert busiest(np.array([1.0, 1]), td.ClusterSpec(2, threads=2, cores=4)) == 1  # a core per thread
    # new sites are new hosts, whatever the known hosts are called
    assert td.ClusterSpec(3, hosts=(0, 0, 4)).with_sites(4).hosts == (0, 0, 4, 5)
    assert td.ClusterSpec(2, hosts=("a", "a")).with_sites(3).hosts[:2] == ("a", "a")
    assert len(set(td.ClusterSpec(2, hosts=("a", "a")).with_sites(3).hosts)) == 2
    # two hosts, one shared (sites 0-2 on 2 cores), one not (site 3 alone)
    mixed = td.ClusterSpec(4, cores=2, hosts=(0, 0, 0, 1))
    assert busiest(np.array([3.0, 0, 0, 2.5]), mixed) == 2.5 and busiest(np.array([3.0, 0, 0, 1]), mixed) == 2
    # the optimizer: balancing 16 products 6/5/5 by moving a row of blocks gains nothing
    # on 2 cores, so the plan that moves less wins there
    A = td.from_function(lambda k: None, (4000, 500), (1000, 500), "float64", name="A")
    B = td.from_function(lambda k: None, (500, 4000), (500, 1000), "float64", name="B")
    at = {"A": {k: (0, 1, 2, 0)[k[0]] for k in A.keys}, "B": {k: (0, 1, 2, 0)[k[1]] for k in B.keys}}
    spec = td.ClusterSpec(3, bandwidth=3e9, rates={"blas": 5.5e10, "elementwise": 9e8}, fresh_bandwidth=1.6e10)
    on_own = td.optimize(matmul(A, B), sites=3, placements=at, cluster=spec)
    on_two = td.optimize(matmul(A, B), sites=3, placements=at, cluster=dataclasses.replace(spec, cores=2))
    assert on_two.cost.floats_moved < on_own.cost.floats_moved
    assert on_two.cost.seconds < plan_seconds(on_own.cost, dataclasses.replace(spec, cores=2))[0]
    assert on_own.cost.seconds < plan_seconds(on_two.cost, spec)[0]
    np.testing.assert_array_equal(sorted(on_own.cost.flops_per_site), [5e9, 5e9, 6e9])


def test_a_slow_network_prefers_moving_less_and_a_fast_one_balancing():
    """The same multiply on 3 sites: with a 10 MB/s link the fastest plan moves fewer
    bytes than with a 10 GB/s link, where balancing the products wins."""
    A = td.from_function(lambda k: None, (500, 32000), (125, 8000), "float64", name="A")
    B = td.from_function(lambda k: None, (32000, 500), (8000, 125), "float64", name="B")
    e = matmul(A, B)
    slow = td.optimize(e, sites=3, cluster=td.ClusterSpec(3, bandwidth=1e7))
    fast = td.optimize(e, sites=3, cluster=td.ClusterSpec(3, bandwidth=1e10, rates={"blas": 1e9}))
    assert slow.cost.floats_moved < fast.cost.floats_moved
    assert fast.cost.flops_balance < slow.cost.flops_balance


def test_cluster_spec_bad_input_and_a_file(tmp_path):
    for kw, msg in [({"bandwidth": 0}, "bandwidth must be a positive"),
                    ({"memory_per_site": -1}, "memory_per_site must be a positive"),
                    ({"task_overhead": float("inf")}, "task_overhead must be a positive, finite"),
                    ({"submit_overhead": 0}, "submit_overhead must be a positive"),
                    ({"blas_half_size": -1}, "blas_half_size must be a finite number >= 0"),
                    ({"fresh_bandwidth": 0}, "fresh_bandwidth must be a positive"),
                    ({"blas_float32": 0}, "blas_float32 must be a positive"),
                    ({"rates": {"blas": 0}}, r"rates\['blas'\] must be a positive"),
                    ({"rates": {"gpu": 1e12}}, "unknown kernel class 'gpu'"),
                    ({"threads": 0}, "threads must be an int >= 1"),
                    ({"cores": 0}, r"cores must be an int >= 1 \(each host's cores\) or None"),
                    ({"cores": 1.5}, "cores must be an int >= 1"),
                    ({"hosts": (0, 1)}, "hosts names 2 sites' hosts; the cluster has 3")]:
        with pytest.raises(ValueError, match=msg):
            td.ClusterSpec(3, **kw)
    with pytest.raises(ValueError, match="sites must be an int >= 1"):
        td.ClusterSpec(0)
    with pytest.raises(TypeError, match="cluster must be a td.ClusterSpec"):
        td.optimize(_programs()["matmul"], sites=3, cluster={"bandwidth": 1})
    path = tmp_path / "spec.json"
    SPEC.save(path)
    assert td.ClusterSpec.load(path) == SPEC
    # its hash is kept once computed, but neither saved nor pickled (str hashes are per process)
    import pickle

    assert hash(td.ClusterSpec.load(path)) == hash(SPEC) and "_hash" not in json.loads(path.read_text())
    assert "_hash" not in pickle.loads(pickle.dumps(SPEC)).__dict__ and pickle.loads(pickle.dumps(SPEC)) == SPEC
    # a file saved before a field existed loads with that field's default
    d = json.loads(path.read_text())
    del d["fresh_bandwidth"], d["blas_float32"]
    path.write_text(json.dumps(d))
    old = td.ClusterSpec.load(path)
    assert (old.fresh_bandwidth, old.blas_float32) == (td.ClusterSpec(3).fresh_bandwidth, 2.0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"sites": 2, "bandwith": 1e9}))
    with pytest.raises(ValueError, match=r"unknown ClusterSpec fields \['bandwith'\]"):
        td.ClusterSpec.load(bad)
    # the cluster's memory is a hard limit
    with pytest.raises(ValueError, match="no plan fits in 1,000 bytes per site"):
        td.optimize(_programs()["matmul"], sites=3, cluster=td.ClusterSpec(3, memory_per_site=1000))


@pytest.fixture(autouse=True)
def _calibrating(calibrating):
    """This module tests calibration: no kept spec (tests/conftest.py)."""


@pytest.fixture(scope="module")
def cluster(client):
    """The shared 2-worker cluster's client (``client`` in tests/conftest.py), by the name
    these tests use."""
    return client


def test_calibrate_a_local_cluster(cluster):
    spec = td.calibrate(cluster, refresh=True)  # (refresh: the runtime plans on it from now on)
    assert spec.sites == 2 and spec.threads == 1 and spec.hosts == (0, 0)
    assert spec.rates["blas"] > spec.rates["elementwise"] > 0  # a matrix product runs faster per flop
    assert 1e7 < spec.bandwidth < 1e12 and 0 < spec.task_overhead < 0.05 and 0 < spec.submit_overhead < 2
    assert spec.blas_half_size >= 0 and 1e7 < spec.fresh_bandwidth < 1e12
    assert 0.5 < spec.blas_float32 < 16 and "float32 x" in repr(spec)  # measured, not the default's 2
    assert spec.blas_float32 != td.ClusterSpec(2).blas_float32
    assert "new arrays written at" in repr(spec)
    info = cluster.scheduler_info()["workers"]
    assert spec.memory_per_site == min(w["memory_limit"] for w in info.values())
    assert "calibrated on tcp://127.0.0.1:" in spec.source
    from dask.system import CPU_COUNT  # the cores the workers may use (this process's are theirs)

    assert spec.cores == CPU_COUNT and f"{CPU_COUNT} cores per host" in repr(spec)
    # measured alone too: kept only where a worker ran faster with its host's others idle
    assert spec.rates_alone is None or all(spec.rates_alone[k] > spec.rates[k] for k in spec.rates_alone)
    # cached per cluster: the runtime measures once (here: the refreshed spec)
    assert td.cluster_spec(cluster) is spec and td.cluster_spec(cluster) is td.cluster_spec(cluster)
    # a plan for it runs and its bytes are as predicted
    rng = np.random.default_rng(1)
    e = matmul(_mat(rng, (300, 200), (100, 100), "A"), _mat(rng, (200, 100), (100, 50), "B"))
    rf = td.submit(e, client=cluster, objective="time")
    assert rf.plan.cost.seconds is not None and rf.transfers() == rf.plan.cost.bytes_moved
    np.testing.assert_allclose(rf.to_numpy(), td.to_numpy(e))


def test_the_runtime_plans_for_time_by_default_on_the_spec_it_is_given(cluster, tmp_path):
    """The time objective is the default; a spec kept in a file replaces the cluster's
    calibration, and a plan cached under the old spec is not reused under the new."""
    rng = np.random.default_rng(2)
    e = matmul(_mat(rng, (300, 200), (100, 100), "A"), _mat(rng, (200, 100), (100, 50), "B"))
    calibrated = td.cluster_spec(cluster)
    first = td.plan_for(e, cluster)
    assert first.cost.seconds == pytest.approx(plan_seconds(first.cost, calibrated)[0])
    slow = td.ClusterSpec(2, memory_per_site=1e9, bandwidth=1e6, rates={"blas": 1e8, "elementwise": 1e7},
                          task_overhead=0.5)
    slow.save(tmp_path / "slow.json")
    td.set_cluster_spec(cluster, td.ClusterSpec.load(tmp_path / "slow.json"))
    assert td.cluster_spec(cluster) == slow
    again = td.plan_for(e, cluster)
    assert again is not first
    assert again.cost.seconds == pytest.approx(plan_seconds(again.cost, slow)[0])
    assert again.cost.seconds > 10 * first.cost.seconds
    rf = td.submit(e, client=cluster)  # the default objective, planned on the spec set
    assert rf.plan.cost.seconds == pytest.approx(again.cost.seconds)
    np.testing.assert_allclose(rf.to_numpy(), td.to_numpy(e))
    with pytest.raises(TypeError, match="spec must be a td.ClusterSpec"):
        td.set_cluster_spec(cluster, {"sites": 2})
    td.set_cluster_spec(cluster, calibrated)


def test_an_objective_object_brings_its_own_cluster_and_memory_limit(cluster):
    """``td.submit(..., objective=FastestTime(...))`` plans with that objective's spec
    and limit (the workers' memory budget is not passed in beside it)."""
    from tra_dask.optimizer.objective import FastestTime

    rng = np.random.default_rng(3)
    e = matmul(_mat(rng, (300, 200), (100, 100), "A"), _mat(rng, (200, 100), (100, 50), "B"))
    spec = td.ClusterSpec(2, bandwidth=1e6, rates={"blas": 1e8, "elementwise": 1e7}, cores=1)
    rf = td.submit(e, client=cluster, objective=FastestTime(cluster=spec))
    assert rf.plan.cost.seconds == pytest.approx(plan_seconds(rf.plan.cost, spec)[0])
    np.testing.assert_allclose(rf.to_numpy(), td.to_numpy(e))
    with pytest.raises(ValueError, match="no plan fits in 1,000 bytes per site"):
        td.plan_for(e, cluster, objective=FastestTime(memory_limit=1000, cluster=spec))
    with pytest.raises(ValueError, match="pass memory_limit to the objective itself"):
        td.plan_for(e, cluster, objective=FastestTime(cluster=spec), memory_limit=1e9)


def test_a_replaced_worker_on_the_same_host_is_not_calibrated_again():
    """The spec is cached per cluster shape (hosts and threads), not per worker
    address: a recovery that replaces a worker plans on the spec measured before."""
    from tra_dask.runtime.calibrate import _shape

    a = {"tcp://127.0.0.1:4001": {"nthreads": 1}, "tcp://127.0.0.1:4002": {"nthreads": 1}}
    b = {"tcp://127.0.0.1:4001": {"nthreads": 1}, "tcp://127.0.0.1:4999": {"nthreads": 1}}
    assert _shape(a) == _shape(b)
    assert _shape(a) != _shape({**a, "tcp://127.0.0.1:4003": {"nthreads": 1}})  # one more worker
    assert _shape(a) != _shape({"tcp://127.0.0.1:4001": {"nthreads": 1}, "tcp://10.0.0.2:4002": {"nthreads": 1}})
    assert _shape(a) != _shape({"tcp://127.0.0.1:4001": {"nthreads": 2}, "tcp://127.0.0.1:4002": {"nthreads": 1}})


@pytest.mark.cluster
def test_a_cluster_that_lost_a_worker_plans_on_the_spec_measured_before(monkeypatch):
    """A recovery plans on the survivors: the spec measured with them (and the lost
    worker), for fewer sites — not a new calibration while the cluster is in flux.
    One more worker than was measured is calibrated."""
    from tra_dask.runtime import calibrate as calibration

    class Sched:
        address = "tcp://127.0.0.1:9999"

    class Client:
        scheduler = Sched()

    three = {f"tcp://127.0.0.1:{p}": {"nthreads": 1} for p in (1, 2, 3)}
    now = dict(three)
    measured = []

    def calibrate(client):
        measured.append(len(now))
        return td.ClusterSpec(len(now), rates={"blas": 1e9 * len(now)})

    monkeypatch.setattr(calibration, "_CACHE", {})
    monkeypatch.setattr(calibration, "workers_info", lambda client: dict(now))
    monkeypatch.setattr(calibration, "calibrate", calibrate)
    spec3 = calibration.cluster_spec(Client())
    del now["tcp://127.0.0.1:2"]  # lost
    spec2 = calibration.cluster_spec(Client())
    assert measured == [3] and spec2.sites == 2 and spec2.rates == spec3.rates
    now["tcp://127.0.0.1:7"] = {"nthreads": 1}  # replaced on the same host
    assert calibration.cluster_spec(Client()) is spec3 and measured == [3]
    now["tcp://127.0.0.1:8"] = {"nthreads": 1}  # one more than measured
    assert calibration.cluster_spec(Client()).sites == 4 and measured == [3, 4]
    now.clear()
    now.update({"tcp://127.0.0.1:1": {"nthreads": 2}})  # other threads: not the cluster measured
    calibration.cluster_spec(Client())
    assert measured == [3, 4, 1]


@pytest.mark.cluster
def test_a_kept_spec_named_by_the_dask_config_replaces_calibration(monkeypatch, tmp_path):
    from tra_dask.runtime import calibrate as calibration

    class Sched:
        address = "tcp://127.0.0.1:9998"

    class Client:
        scheduler = Sched()

    monkeypatch.setattr(calibration, "_CACHE", {})
    monkeypatch.setattr(calibration, "workers_info", lambda client: {"tcp://127.0.0.1:1": {}, "tcp://127.0.0.1:2": {}})
    monkeypatch.setattr(calibration, "calibrate", lambda client: pytest.fail("calibrated although a spec was kept"))
    kept = td.ClusterSpec(4, bandwidth=3e9, source="kept")
    kept.save(tmp_path / "spec.json")
    import dask

    with dask.config.set({"tra-dask.cluster-spec": str(tmp_path / "spec.json")}):
        got = calibration.cluster_spec(Client())
    assert got.sites == 2 and got.bandwidth == 3e9 and got.source == "kept"
    monkeypatch.setattr(calibration, "_CACHE", {})
    (tmp_path / "bad.json").write_text("[1, 2]")
    with dask.config.set({"tra-dask.cluster-spec": str(tmp_path / "bad.json")}):
        with pytest.raises(ValueError, match="tra-dask.cluster-spec = .*bad.json.* is not a saved td.ClusterSpec"):
            calibration.cluster_spec(Client())


def test_calibrated_rates_are_throughput_over_a_window():
    """Workers sharing a core run some repetitions at full speed and some not at all:
    the calibrated rate is the work over the whole window, not the fastest call."""
    from tra_dask.runtime.calibrate import _throughput

    now = [0.0]
    steps = iter([1.0, 9.0] * 10)  # calls alternately fast and slow (a core shared with another worker)

    def call():
        now[0] += next(steps)

    rate = _throughput(call, 5.0, seconds=15.0, clock=lambda: now[0])
    # after one untimed (fast) call: 9 + 1 + 9 = 19 time units cover 3 calls, 15 work
    assert rate == pytest.approx(15.0 / 19.0)
    assert rate < 5.0 / 1.0  # the fastest call's rate would be 5


def test_bandwidth_is_measured_with_every_worker_moving_at_once():
    """A plan's shuffle moves on every link at once: calibration's transfer pairs make
    each worker send one array and receive one — within each host a ring, across
    hosts every worker from one on another host."""
    from collections import Counter

    from tra_dask.runtime.calibrate import _rings

    def every_worker_once(pairs, workers):
        return Counter(s for s, _ in pairs) == Counter(d for _, d in pairs) == Counter(workers)

    w = ["a1", "a2", "a3"]
    local, remote = _rings(w, ["a"] * 3)
    assert every_worker_once(local, w) and remote == [] and all(s != d for s, d in local)
    local, remote = _rings(["a"], ["h"])
    assert local == remote == []
    w, hosts = ["a1", "a2", "a3", "b1", "b2", "b3"], ["a"] * 3 + ["b"] * 3
    host = dict(zip(w, hosts))
    local, remote = _rings(w, hosts)
    assert every_worker_once(local, w) and all(host[s] == host[d] for s, d in local)
    assert every_worker_once(remote, w) and all(host[s] != host[d] for s, d in remote)
    w, hosts = ["a1", "a2", "b1", "c1"], ["a", "a", "b", "c"]  # b and c have no local ring
    host = dict(zip(w, hosts))
    local, remote = _rings(w, hosts)
    assert sorted(local) == [("a1", "a2"), ("a2", "a1")]
    assert remote and all(host[s] != host[d] for s, d in remote)


@pytest.mark.cluster
def test_calibrate_bad_input():
    with pytest.raises(TypeError, match="calibrate needs a distributed.Client"):
        td.calibrate("tcp://127.0.0.1:8786")
    with LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address="127.0.0.1:0") as c:
        with Client(c) as client:
            with pytest.raises(RuntimeError, match="the cluster has no workers"):
                td.calibrate(client)


def test_independent_branches_on_the_same_sites_take_the_sum_of_their_times():
    """Two outputs that keep the same sites busy run one after the other on those
    sites: the makespan is bounded below by the busiest site's total, not the larger
    branch alone (the critical path alone would say 1x)."""
    rng = np.random.default_rng(3)
    spec = td.ClusterSpec(2, bandwidth=2e8, rates={"blas": 1e10, "elementwise": 5e8}, task_overhead=2e-3,
                          fresh_bandwidth=1e9)
    A, B, C, D = (_mat(rng, (200, 200), (50, 50), n) for n in "ABCD")

    def path(plan):  # the makespan less the overheads
        return plan.cost.seconds - spec.submit_overhead - plan.cost.tasks * spec.task_overhead
    one = td.optimize(matmul(A, B), 2, cluster=spec)
    both = td.optimize((matmul(A, B), matmul(C, D)), 2, cluster=spec)
    assert path(both) == pytest.approx(2 * path(one), rel=0.05)
    assert both.cost.seconds == pytest.approx(_by_hand(both, spec), rel=1e-9)


def test_a_float32_matmul_runs_at_the_specs_float32_rate():
    """A float32 product's rate is the float64 one times the spec's measured
    ``blas_float32``, other products' the float64 one; elementwise kernels scale by
    the itemsize."""
    rng = np.random.default_rng(3)
    plans = {dt: td.optimize(matmul(td.from_numpy(rng.random((400, 300)).astype(dt), (100, 100), name="A"),
                                    td.from_numpy(rng.random((300, 200)).astype(dt), (100, 100), name="B")),
                             sites=2, objective="bytes") for dt in ("float64", "float32", "float16")}
    spec = td.ClusterSpec(2, blas_half_size=0, rates={"blas": 1e10, "elementwise": 1e9})

    def rates(plan, spec):
        return {kernel_class(getattr(n, "kernel", None)): kernel_rate(n, spec) for n in plan.nodes
                if isinstance(n, (LocalJoin, LocalAggregate)) and getattr(n, "kernel", None) is not None}

    assert rates(plans["float64"], spec) == {"blas": 1e10, "elementwise": 1e9}
    assert rates(plans["float32"], spec) == {"blas": 2e10, "elementwise": 2e9}
    assert rates(plans["float16"], spec) == {"blas": 1e10, "elementwise": 4e9}  # no BLAS for float16
    fast = dataclasses.replace(spec, blas_float32=2.5)
    assert rates(plans["float32"], fast) == {"blas": 2.5e10, "elementwise": 2e9}
    assert rates(plans["float64"], fast) == rates(plans["float64"], spec)
    assert plan_seconds(plans["float32"].cost, fast)[0] < plan_seconds(plans["float32"].cost, spec)[0]
