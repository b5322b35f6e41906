"""Plans in pictures and in the Dask dashboard; nothing bound to all interfaces."""

import json
import re
import shutil
import subprocess
import time
import urllib.request

import dask
import numpy as np
import psutil
import pytest

import tra_dask as td
from tra_dask.physical import LocalAggregate, LocalJoin, Part, PSource, Shuffle
from tra_dask.programs import matmul, random_uniform


def _plan():
    A = td.from_numpy(np.arange(64.0).reshape(8, 8), 2, name="A")
    return td.optimize(matmul(A, A), sites=3)


def test_to_networkx_matches_the_plan():
    plan = _plan()
    g = plan.to_networkx()
    assert g.number_of_nodes() == len(plan.nodes)
    assert g.number_of_edges() == sum(len(n.children) for n in plan.nodes)
    moved = sum(d["floats_moved"] for _, d in g.nodes(data=True))
    assert moved == plan.cost.floats_moved
    assert {d["op"] for _, d in g.nodes(data=True)} >= {"Source", "LocalJoin", "LocalAggregate"}


@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_visualize_writes_a_picture_whose_nodes_match(tmp_path, fmt):
    plan = _plan()
    out = plan.visualize(str(tmp_path / f"plan.{fmt}"))
    data = open(out, "rb").read()
    assert len(data) > 1000
    if fmt == "svg":
        assert len(set(re.findall(rb'id="tra-node-(\d+)"', data))) == len(plan.nodes)
    else:
        assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_site_grid_shows_the_placement():
    from tra_dask.viz import site_grid

    plan = td.compile(td.from_numpy(np.zeros((6, 4)), 2), sites=3)
    grid = site_grid(plan.outputs[0])
    assert grid.tolist() == [[0, 0], [1, 1], [2, 2]]  # Part(0): row block i on site i


def test_html_reprs():
    plan = _plan()
    A = td.from_numpy(np.ones((4, 4)), 2, name="A")
    assert "tuples" in A._repr_html_() and "<table>" in A._repr_html_()
    assert "<pre>" in plan._repr_html_() and "alternatives considered" in plan._repr_html_()


def _listening(pids):
    out = []
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out += [c.laddr.ip for c in conns if c.status == psutil.CONN_LISTEN]
    return out


@pytest.mark.cluster
def test_embedded_cluster_listens_on_loopback_only():
    from tra_dask.runtime import embedded_client

    client = embedded_client(2)
    me = psutil.Process()
    pids = [me.pid] + [p.pid for p in me.children(recursive=True)]
    addrs = _listening(pids)
    assert addrs, "the cluster should be listening somewhere"
    assert set(addrs) == {"127.0.0.1"}, addrs
    assert client.dashboard_link.startswith("http://127.0.0.1:")


class _WS:  # the scheduler's WorkerState / TaskState, as far as the plugin reads them
    def __init__(self, address):
        self.address = address


class _TS:
    def __init__(self, key, nbytes, deps=()):
        self.key, self.nbytes, self.dependencies, self.who_has, self.processing_on = key, nbytes, deps, set(), None

    def get_nbytes(self):
        return self.nbytes


def test_live_count_follows_the_scheduler_transitions():
    """One fetch per (chunk, worker) however many tasks wait for it; a chunk dropped
    and needed again moves again; named plans are titled by their name."""
    from tra_dask.runtime.dashboard import TraScheduler

    w0, w1 = _WS("tcp://w0"), _WS("tcp://w1")
    a = _TS(("source-0-t", 0), 800)
    moves = [_TS(("Broadcast-1-t", j), 800, (a,)) for j in range(3)]
    record = {"token": "t", "label": "Broadcast(X)", "name": "my plan", "explain": "", "strategies": [],
              "predicted_bytes": 800, "workers": [w0.address, w1.address],
              "keys": [list(a.key)] + [list(m.key) for m in moves], "key_workers": [w0.address] + [w1.address] * 3,
              "nodes": [{"index": 0, "op": "source", "label": "X", "prefix": "source-0-t", "params": "", "inputs": [],
                         "tasks": 1},
                        {"index": 1, "op": "Broadcast", "label": "Broadcast(X)", "prefix": "Broadcast-1-t",
                         "params": "", "inputs": [0], "tasks": 3}],
              "outputs": [{"label": "Broadcast(X)", "node": 1, "keys": [list(m.key) for m in moves]}]}
    plugin = TraScheduler()
    plugin.scheduler = type("Scheduler", (), {"tasks": {t.key: t for t in [a, *moves]}})()
    plugin.add_plan(record)

    def run(ts, ws, finish="memory"):
        ts.processing_on = ws
        plugin.transition(ts.key, "waiting", "processing")
        return lambda: plugin.transition(ts.key, "processing", finish, worker=ws.address)

    run(a, w0)()
    a.who_has = {w0}
    first, second = run(moves[0], w1), run(moves[1], w1)  # both wait for the same fetch
    a.who_has = {w0, w1}  # the worker reports its copy before it runs them
    first()
    second()
    live = plugin.snapshot()[0]
    assert live["title"] == "my plan" and live["live_bytes"] == 800
    a.who_has = {w0}  # w1 dropped its copy; a later task needs it again
    run(moves[2], w1)()
    live = plugin.snapshot()[0]
    assert live["live_bytes"] == 1600 and live["outputs"][0]["live_bytes"] == 1600
    assert live["transfers"]["bytes"] == [[0, 1600], [0, 0]]
    assert [(n["state"], n["done"], n["total"]) for n in live["nodes"]] == [("done", 1, 1), ("done", 3, 3)]
    assert live["done"] == live["total"] == 4 and live["per_site"][w1.address] == {"tasks": 3, "done": 3}
    page = plugin.render_page()
    assert "<h2 id='t'>my plan" in page and "computes <b>Broadcast(X)</b>" in page and "1,600 bytes" in page


def _record(token: str, ntasks: int, extra=()) -> dict:
    """A plan record as ``runtime.submit._publish`` sends it: ``ntasks`` tasks over
    three operators (keys ``(prefix, j)``), plus the keys ``extra`` of no operator."""
    workers = ["tcp://w0", "tcp://w1"]
    nodes = [{"index": i, "op": op, "label": f"{op}(X)", "prefix": f"{op}-{i}-{token}", "params": "",
              "inputs": [i - 1] if i else [], "tasks": ntasks // 3 + (i < ntasks % 3)}
             for i, op in enumerate(["source", "Broadcast", "LocalAggregate"])]
    keys = [(n["prefix"], j) for n in nodes for j in range(n["tasks"])] + list(extra)
    return {"token": token, "label": "LocalAggregate(X)", "name": None, "explain": "", "strategies": [],
            "predicted_bytes": 0, "workers": workers, "keys": keys,
            "key_workers": [workers[t % 2] for t in range(len(keys))], "nodes": nodes,
            "outputs": [{"label": "LocalAggregate(X)", "node": 2, "keys": keys[-3:]}]}


def _plugin():
    from tra_dask.runtime.dashboard import TraScheduler

    plugin = TraScheduler()
    plugin.scheduler = type("Scheduler", (), {"tasks": {}})()
    return plugin


def _run(plugin, key, worker="tcp://w0"):
    plugin.transition(key, "waiting", "processing")
    plugin.transition(key, "processing", "memory", worker=worker)


def test_plans_expire_by_count_and_by_age():
    plugin = _plugin()
    with dask.config.set({"tra-dask.dashboard.keep-plans": 3, "tra-dask.dashboard.keep-seconds": "1h"}):
        for i in range(5):
            plugin.add_plan(_record(f"p{i}", 30, extra=[f"loose-p{i}", (f"Broadcast-1-p{i}", 10**9)]))
        assert list(plugin.plans) == ["p2", "p3", "p4"]  # the oldest went
        _run(plugin, ("source-0-p0", 0))  # an expired plan's task: not followed, recorded as any task
        assert plugin.ran[("source-0-p0", 0)] == "tcp://w0" and not plugin.ran.get(("source-0-p4", 0))
        for key in [("source-0-p4", 0), ("Broadcast-1-p4", 10**9), "loose-p4"]:  # a sparse j, a loose key
            _run(plugin, key, "tcp://w1")
        assert plugin.ran["loose-p4"] == plugin.ran[("Broadcast-1-p4", 10**9)] == "tcp://w1"
        for p in ("p2", "p3"):  # idle for two hours
            plugin.plans[p].active -= 7200
        with dask.config.set({"tra-dask.dashboard.keep-seconds": 0}):  # no age limit
            assert plugin.expire() == [] and len(plugin.plans) == 3
        assert plugin.expire() == ["p2", "p3"] and list(plugin.plans) == ["p4"]
        assert {pl.token for pl, _ in plugin.prefixes.values()} | {pl.token for pl, _ in plugin.loose.values()} == {"p4"}
        live = plugin.snapshot()
        assert [p["token"] for p in live] == ["p4"] and live[0]["done"] == 3 and live[0]["total"] == 32
        assert [n["done"] for n in live[0]["nodes"]] == [1, 1, 0]
        page = plugin.render_page()
        assert "1 plan(s)" in page and "p4" in page and "p3" not in page and "3 / 32 tasks done" in page
        plugin.plans["p4"].active -= 7200
        assert "No TRA plan" in plugin.render_page() and plugin.render_json() == "[]"
    from tra_dask.runtime.dashboard import DEFAULTS

    assert DEFAULTS == {"tra-dask.dashboard.keep-plans": 50, "tra-dask.dashboard.keep-seconds": "1h",
                        "tra-dask.dashboard.page-plans": 10}


def test_page_draws_the_newest_plans_and_lists_the_others():
    plugin = _plugin()
    for i in range(5):
        plugin.add_plan(_record(f"p{i}", 6))
    _run(plugin, ("source-0-p1", 0))
    with dask.config.set({"tra-dask.dashboard.page-plans": 2}):
        page = plugin.render_page()
        assert page.count("<svg") == 2 and "id='tra-op-p4-0'" in page and "id='tra-op-p3-0'" in page
        older = re.findall(r"<tr id='(p\d)'><td class='l'><a href='/tra-dask\?plan=(p\d)'>", page)
        assert older == [("p2", "p2"), ("p1", "p1"), ("p0", "p0")]
        assert "<td>1 / 6</td>" in page  # p1's row
        one = plugin.render_page("p1")
        assert one.count("<svg") == 1 and "id='tra-op-p1-0'" in one and "1 / 6 tasks done" in one
        assert [p["token"] for p in json.loads(plugin.render_json("p1"))] == ["p1"]
        assert "not kept" in plugin.render_page("nope") and plugin.render_json("nope") == "[]"
    assert plugin.render_page().count("<svg") == 5  # page-plans back at 10
    assert plugin.render_page() is plugin.render_page()  # nothing changed: served again as made
    before = plugin.render_page()
    _run(plugin, ("source-0-p4", 1))
    assert plugin.render_page() != before


def test_render_reads_counts_never_tasks():
    """The page and the JSON for plans of 70k tasks come from per-operator counts: with
    the per-task arrays taken away they are the same; adding such a plan keeps a
    few bytes per task."""
    import tracemalloc

    plugin = _plugin()
    big = [_record(f"big{i}", 70_000) for i in range(3)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        plugin.add_plan(big[0])
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 32 * 70_000, kept  # 13 bytes a task (the record's keys are ~100 each)
    for rec in big[1:]:
        plugin.add_plan(rec)
    for j in range(500):
        _run(plugin, ("Broadcast-1-big1", j), "tcp://w1")
    page, api = plugin.render_page(), plugin.render_json()
    for plan in plugin.plans.values():
        plan.state = plan.pinned = plan.ran = plan.lookup = plan.loose = None
    plugin.version += 1
    assert plugin.render_page() == page and plugin.render_json() == api
    assert "500 / 70,000" not in page and "500 / 23333" in page


def _get(url: str) -> str:
    return urllib.request.urlopen(url, timeout=10).read().decode()


def _api(rf) -> dict:
    base = rf.dashboard_link.split("/tra-dask")[0]
    return next(p for p in json.loads(_get(base + "/tra-dask/api/plans")) if p["token"] == rf.token)


def _received(rf) -> dict:
    """Bytes of this submission each worker received, from the senders' transfer logs
    (as ``transfers()`` reads them: scattered chunks' keys name their content, so an
    earlier submission may have moved the same keys)."""
    ours = rf.lowered.graph_keys() | {k for d in rf.lowered.scatter.values() for k in d}

    def sent(dask_worker, ours=ours, workers=set(rf.lowered.workers), since=rf._started - 0.01,
             until=rf._finished + 0.5):
        out = {}
        for e in dask_worker.transfer_outgoing_log:
            if e["who"] in workers and since <= e["start"] <= until:
                out[e["who"]] = out.get(e["who"], 0) + sum(n for k, n in e["keys"].items() if k in ours)
        return out

    got = {}
    for per in rf.client.run(sent).values():
        for w, n in per.items():
            got[w] = got.get(w, 0) + n
    return {w: n for w, n in got.items() if n}


def _shuffle_plan(sites=2):
    k = td.kernels.get_kernel
    X, Y = random_uniform((400, 400), 100, seed=5, name="X"), random_uniform((400, 400), 100, seed=6, name="Y")
    px, py = PSource(X, Part((0,), sites)), PSource(Y, Part((1,), sites))
    j = LocalJoin(Shuffle(px, (1,)), Shuffle(py, (0,)), (1,), (0,), k("matmul"))
    return td.Plan([LocalAggregate(Shuffle(j, (0, 2)), (0, 2), k("add"))], sites=sites)


PLANS = {
    "broadcast": lambda: matmul(random_uniform((400, 400), 100, seed=1, name="X"),
                                td.from_numpy(np.ones((400, 400)), 100, name="Y")),
    "shuffle": _shuffle_plan,
}


@pytest.mark.cluster
@pytest.mark.parametrize("kind", list(PLANS))
def test_bytes_counted_live_equal_the_transfer_logs(kind):
    rf = td.submit(PLANS[kind](), sites=2, optimize=False).wait()
    live = _api(rf)
    assert live["done"] == live["total"] > 0 and live["predicted_bytes"] == rf.plan.cost.bytes_moved
    measured = rf.transfers()
    assert live["live_bytes"] == measured > 0  # the scheduler's count is exact, not an estimate
    # per operator: only moves fetch; per output: what its operators fetched
    fetched = [n for n in live["nodes"] if n["live_bytes"]]
    assert sum(n["live_bytes"] for n in fetched) == measured
    assert {n["op"] for n in fetched} == ({"Shuffle"} if kind == "shuffle" else {"Broadcast", "Shuffle"})
    assert [o["live_bytes"] for o in live["outputs"]] == [measured]
    assert all(n["state"] in ("done", "no tasks") for n in live["nodes"])
    # the site matrix: nothing to itself; what each worker received is exact
    t = live["transfers"]
    assert t["workers"][:2] == rf.lowered.workers and all(t["bytes"][i][i] == 0 for i in range(len(t["workers"])))
    received = {w: sum(row[j] for row in t["bytes"]) for j, w in enumerate(t["workers"])}
    assert {w: n for w, n in received.items() if n} == _received(rf)
    page = _get(rf.dashboard_link.split("#")[0])
    assert f"counted live <b class='measured' id='live-{rf.token}'>{measured:,} bytes</b>" in page
    assert f"measured by transfers(): <b class='transfers'>{measured:,} bytes</b>" in page


@pytest.mark.cluster
def test_dashboard_page_lists_the_plan_and_its_bytes():
    rf = td.submit(matmul(random_uniform((400, 400), 100, seed=1, name="X"),
                          random_uniform((400, 400), 100, seed=2, name="Y")), sites=2)
    rf.wait()
    measured = rf.transfers()
    link = rf.dashboard_link
    assert link.startswith("http://127.0.0.1:") and link.endswith("#" + rf.token)
    page = _get(link.split("#")[0])
    assert rf.token in page and "LocalJoin" in page and rf.node.label in page  # the full label
    assert f"{rf.plan.cost.bytes_moved:,}" in page and f"{measured:,} bytes" in page
    assert "href='/status'" in page  # back to Dask's dashboard
    assert len(re.findall(rf"id='tra-op-{rf.token}-(\d+)'", page)) == len(_api(rf)["nodes"])  # the drawing
    mine = _api(rf)
    assert mine["done"] == mine["total"] > 0 and mine["predicted_bytes"] == rf.plan.cost.bytes_moved
    assert mine["title"] == rf.node.label and mine["measured_bytes"] == measured == mine["live_bytes"]
    base = link.split("/tra-dask")[0]
    alone = _get(f"{base}/tra-dask?plan={rf.token}")  # the plan on a page of its own
    assert alone.count("<svg") == 1 and f"id='tra-op-{rf.token}-0'" in alone
    assert [p["token"] for p in json.loads(_get(f"{base}/tra-dask/api/plans?plan={rf.token}"))] == [rf.token]
    expiring = rf.client.run_on_scheduler(
        lambda dask_scheduler: dask_scheduler.periodic_callbacks["tra-dask-expire"].is_running())
    assert expiring  # plans past keep-seconds go even when nobody looks


@pytest.mark.cluster
def test_dask_dashboard_renders_and_links_to_the_tra_dask_page():
    rf = td.submit(td.from_numpy(np.ones((4, 4)), 2), sites=2).wait()  # registers the plugin
    base = rf.dashboard_link.split("/tra-dask")[0]
    status = _get(base + "/status")
    assert "needs bokeh" not in status  # what Dask serves there without bokeh
    bokeh_js = re.search(r'<script src="(static/js/bokeh\.min\.js[^"]*)"', status)
    assert bokeh_js and len(_get(f"{base}/{bokeh_js.group(1)}")) > 100_000  # served by Dask's Bokeh server
    assert '<a href="tra-dask">' in status  # in the top bar of every Dask page
    assert '<a href="tra-dask">' in _get(base + "/workers")


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Gated:
    """A loader whose chunks off the first block row each take 3 s until the file
    ``release`` exists, then none: the plan runs (56 of them on 2 one-thread workers:
    about 84 s, longer than the 20 s wait for the first bytes and the browser's 60 s
    limit together; the threads free between loads for the transfers) until the test
    has looked, and ends soon after."""

    def __init__(self, release):
        self.release = str(release)

    def __call__(self, key):
        import os

        until = time.monotonic() + 3.0
        while key[0] != 0 and not os.path.exists(self.release) and time.monotonic() < until:
            time.sleep(0.05)
        return np.ones((50, 50))


def _chromium(tmp_path, *args, timeout=60):
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=timeout).stdout


@pytest.mark.cluster
@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium here (.ci/run installs Debian's chromium)")
def test_browser_sees_the_running_plan(tmp_path):
    # the plan waits for the browser: with loads of a fixed length (64 of 0.3 s, then of
    # 0.5 s on 2 workers), a headless Chromium started on a loaded 2-core machine looked
    # after the plan had ended, in two suite runs of five; with loads of up to 1.5 s
    # (42 s in all), in one fresh clone's run of three
    release = tmp_path / "looked"
    R = td.from_function(Gated(release), (400, 400), 50, "float64", name="slow")
    rf = td.submit(matmul(R, R), sites=2)
    url = rf.dashboard_link.split("#")[0]
    live = re.compile(r"id=.live-" + rf.token + r".>([\d,]+) bytes<")
    shot = tmp_path / "tra-dask-page.png"
    try:
        deadline = time.monotonic() + 20
        while int(live.search(_get(url)).group(1).replace(",", "")) == 0:  # the first broadcast chunks land
            assert time.monotonic() < deadline, "no bytes counted on the page"
            time.sleep(0.2)
        dom = _chromium(tmp_path, "--dump-dom", url)
        running = not all(f.done() for f in rf.values())
        _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,1400", url)
    finally:
        release.touch()  # (the plan ends soon after, whatever happened here)
    assert running, "the plan finished before the browser looked"
    seen = live.search(dom)
    assert seen and int(seen.group(1).replace(",", "")) > 0  # counted on the scheduler, no client call yet
    assert rf.token in dom and "Source slow" in dom and "Broadcast" in dom and "LocalAggregate" in dom
    assert f"{rf.plan.cost.bytes_moved:,}" in dom  # predicted bytes on the page
    assert "running" in dom and "tasks done" in dom and "<svg" in dom
    assert shot.exists() and shot.stat().st_size > 5000
    rf.wait(timeout=60)
    assert _api(rf)["live_bytes"] == rf.transfers() == rf.plan.cost.bytes_moved
