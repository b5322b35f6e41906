"""Plans in pictures and in the Dask dashboard; nothing bound to all interfaces."""

import os
import re
import shutil
import subprocess
import time
import urllib.request

import numpy as np
import psutil
import pytest

import tra_dask as td
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


def test_embedded_cluster_listens_on_loopback_only():
    from tra_dask.runtime import embedded_client

    client = embedded_client(2)
    me = psutil.Process()
    pids = [me.pid] + [p.pid for p in me.children(recursive=True)]
    addrs = _listening(pids)
    assert addrs, "the cluster should be listening somewhere"
    assert set(addrs) == {"127.0.0.1"}, addrs
    assert client.dashboard_link.startswith("http://127.0.0.1:")


def test_dashboard_page_lists_the_plan_and_its_bytes():
    rf = td.submit(matmul(random_uniform((400, 400), 100, seed=1, name="X"),
                          random_uniform((400, 400), 100, seed=2, name="Y")), sites=2)
    rf.wait()
    measured = rf.transfers()
    link = rf.dashboard_link
    assert link.startswith("http://127.0.0.1:") and link.endswith("#" + rf.token)
    page = urllib.request.urlopen(link.split("#")[0], timeout=10).read().decode()
    assert rf.token in page and "LocalJoin" in page
    assert f"{rf.plan.cost.bytes_moved:,}" in page and f"{measured:,} bytes" in page
    import json

    plans = json.loads(urllib.request.urlopen(link.split("/tra-dask")[0] + "/tra-dask/api/plans", timeout=10).read())
    mine = next(p for p in plans if p["token"] == rf.token)
    assert mine["done"] == mine["total"] > 0 and mine["predicted_bytes"] == rf.plan.cost.bytes_moved


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


class Slow:
    def __call__(self, key):
        time.sleep(0.4)
        return np.ones((50, 50))


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium here (.ci/run installs Debian's chromium)")
def test_browser_sees_the_running_plan(tmp_path):
    R = td.from_function(Slow(), (400, 400), 50, "float64", name="slow")
    rf = td.submit(matmul(R, R), sites=2)  # ~16 s of loading on 2 workers: still running while we look
    url = rf.dashboard_link.split("#")[0]
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    shot = tmp_path / "tra-dask-page.png"
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=60).stdout
    subprocess.run([CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1200,1000", url],
                   capture_output=True, timeout=60)
    assert rf.token in dom
    for op in ("LocalJoin", "LocalAggregate", "Source slow"):
        assert op in dom
    assert f"{rf.plan.cost.bytes_moved:,}" in dom  # predicted bytes on the page
    assert "running" in dom and "tasks done" in dom
    assert not all(f.done() for f in rf.values())  # the plan was still running
    assert shot.exists() and shot.stat().st_size > 5000
    rf.client.cancel(list(rf.values()))
