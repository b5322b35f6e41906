"""The /tra-dask page under load: does serving it stall the scheduler?

Starts a LocalCluster (2 worker processes, 127.0.0.1 only), registers the tra_dask
scheduler plugin as the runtime does, runs a few real small plans, then stores
``--plans`` synthetic plan records of ``--tasks`` task keys each (the record
``runtime.submit._publish`` sends; by default every task is then taken through
processing -> memory -> released -> forgotten, as after a finished run).  Then, for
``--seconds``, threads fetch the page and its JSON route over HTTP back to back while
the client measures the scheduler's round trip (``run_on_scheduler`` of a no-op).
Reports the round trip (p50/p99/max) idle and under load, what one render of the
page and of the JSON costs on the scheduler, what ``add_plan`` of one record costs
there (and the longest round trip while the records arrive), the scheduler's
resident memory and one full ``gc.collect()`` there.

    python benchmarks/dashboard_load.py [--plans 50] [--tasks 70000] [--seconds 15]
                                        [--label after] [--no-write]

Rows of a label replace the README table's older rows of that label; other rows stay
(the ``before`` row: ``PYTHONPATH=<a copy of tra_dask with the earlier dashboard.py>``
and ``--label before``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import tra_dask as td  # noqa: E402
from _harness import start_cluster  # noqa: E402
from _report import README, write_section  # noqa: E402
from tra_dask.runtime.dashboard import API, PAGE, TraScheduler  # noqa: E402
from tra_dask.programs import matmul, random_uniform  # noqa: E402

TITLE = "dashboard under load"
OPS = [("source", "X", []), ("source", "Y", []), ("Broadcast", "Broadcast(X)", [0]),
       ("LocalJoin", "LocalJoin(X, Y)", [2, 1]), ("Shuffle", "Shuffle(LocalJoin)", [3]),
       ("LocalAggregate", "LocalAggregate(Shuffle)", [4])]


def synthetic_record(i: int, ntasks: int, workers: list) -> dict:
    """A record shaped like ``_publish``'s: ``ntasks`` keys spread over six operators."""
    token = f"synthetic{i:03d}"
    per = np.array_split(np.arange(ntasks), len(OPS))
    nodes, keys = [], []
    for j, ((op, label, inputs), idx) in enumerate(zip(OPS, per)):
        prefix = f"{op}-{j}-{token}"
        nodes.append({"index": j, "op": op, "label": label, "prefix": prefix, "params": "keys=(0, 1)",
                      "inputs": inputs, "tasks": len(idx)})
        keys += [(prefix, t) for t in range(len(idx))]  # as _publish sends them: sorted graph keys
    last = nodes[-1]["prefix"]
    return {"token": token, "label": "LocalAggregate over X, Y", "name": f"synthetic plan {i}",
            "explain": "\n".join(f"{n['op']} {n['label']}" for n in nodes), "strategies": ["CMM"],
            "predicted_bytes": 10**9, "workers": list(workers), "keys": keys,
            "key_workers": [workers[t % len(workers)] for t in range(len(keys))],
            "nodes": nodes, "outputs": [{"label": "out", "node": len(OPS) - 1,
                                         "keys": [k for k in keys if k[0] == last]}]}


# -- run on the scheduler ---------------------------------------------------------------

def _one():
    return 1


def _timed_add(dask_scheduler, record):
    t0 = time.perf_counter()
    dask_scheduler.plugins[TraScheduler.name].add_plan(record)
    return time.perf_counter() - t0


def _finish(dask_scheduler, token):
    """Take every task of a stored plan through a finished run's transitions."""
    plugin = dask_scheduler.plugins[TraScheduler.name]
    plan = plugin.plans[token]
    workers = plan.record["workers"]
    keys = [(n["prefix"], j) for n in plan.nodes for j in range(n["tasks"])]  # as synthetic_record made them
    for t, key in enumerate(keys):
        w = workers[t % len(workers)]
        plugin.transition(key, "released", "waiting")
        plugin.transition(key, "waiting", "processing")
        plugin.transition(key, "processing", "memory", worker=w)
        plugin.transition(key, "memory", "released")
        plugin.transition(key, "released", "forgotten")


def _render_times(dask_scheduler, n):
    import json

    plugin = dask_scheduler.plugins[TraScheduler.name]
    page, api = [], []
    for _ in range(n):
        plugin.version = getattr(plugin, "version", 0) + 1  # as after a transition: no cached page
        t0 = time.perf_counter()
        html = plugin.render_page()
        t1 = time.perf_counter()
        body = json.dumps(plugin.snapshot())
        t2 = time.perf_counter()
        page.append(t1 - t0)
        api.append(t2 - t1)
    return statistics.median(page), statistics.median(api), len(html), len(body)


def _memory(dask_scheduler):
    """The scheduler process's RSS after a full collection (and glibc's trim, so freed
    memory is not counted), the collection's time and the objects it tracks."""
    import ctypes
    import gc

    import psutil

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    t0 = time.perf_counter()
    gc.collect()
    return psutil.Process().memory_info().rss, time.perf_counter() - t0, len(gc.get_objects())


def _gc_watch(dask_scheduler, on: bool):
    """Record the scheduler's garbage collections (start: ``on``); returns the pauses (s) of each generation."""
    import gc

    if on:
        log, t = {0: [], 1: [], 2: []}, [0.0]

        def cb(phase, info, log=log, t=t):
            if phase == "start":
                t[0] = time.perf_counter()
            else:
                log[info["generation"]].append(time.perf_counter() - t[0])

        dask_scheduler._tra_gc_watch = (cb, log)
        gc.callbacks.append(cb)
        return None
    cb, log = dask_scheduler._tra_gc_watch
    gc.callbacks.remove(cb)
    return log


# -- on the client ------------------------------------------------------------------------

def probe(client, seconds: float, pause: float = 0.01) -> list:
    """Round-trip times of a no-op on the scheduler, back to back for ``seconds``."""
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        client.run_on_scheduler(_one)
        out.append(time.perf_counter() - t0)
        time.sleep(pause)
    return out


def stats(xs: list) -> tuple:
    xs = sorted(xs)
    return (1e3 * xs[len(xs) // 2], 1e3 * xs[min(len(xs) - 1, int(0.99 * len(xs)))], 1e3 * xs[-1])


FETCH = """
import json, sys, threading, time, urllib.request
urls, seconds = sys.argv[1:-1], float(sys.argv[-1])
out = {u: [] for u in urls}
end = time.monotonic() + seconds
def fetch(u):
    while time.monotonic() < end:
        t0 = time.perf_counter()
        urllib.request.urlopen(u, timeout=60).read()
        out[u].append(time.perf_counter() - t0)
threads = [threading.Thread(target=fetch, args=(u,)) for u in urls]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""


def fetch_load(urls: list, seconds: float) -> subprocess.Popen:
    """Another process (as a browser would be) fetching each of ``urls`` back to back."""
    return subprocess.Popen([sys.executable, "-c", FETCH, *urls, str(seconds)], stdout=subprocess.PIPE, text=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plans", type=int, default=50)
    p.add_argument("--tasks", type=int, default=70_000)
    p.add_argument("--real", type=int, default=3, help="real small plans submitted first")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--fetchers", type=int, default=1, help="threads per route fetching back to back")
    p.add_argument("--waiting", action="store_true", help="leave the synthetic tasks waiting (no transitions)")
    p.add_argument("--label", default="after")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)

    import tra_dask.runtime.dashboard

    print("tra_dask.runtime.dashboard from", tra_dask.runtime.dashboard.__file__)
    client = start_cluster(2)
    try:
        # as the runtime's _ensure_recorder, with room for the real plans next to the synthetic ones
        client.register_plugin(TraScheduler(keep_plans=args.plans + args.real))
        workers = sorted(client.scheduler_info()["workers"])
        base = client.dashboard_link.split("/status")[0].rstrip("/")
        for s in range(args.real):
            X = random_uniform((400, 400), 100, seed=s, name="X")
            td.submit(matmul(X, X), client=client, sites=2).wait()
        idle = probe(client, 3.0)
        rss0, gc0_s, _ = client.run_on_scheduler(_memory)

        add, add_rt, during = [], [], []
        stop = threading.Event()

        def probe_until_stopped():
            while not stop.is_set():
                t0 = time.perf_counter()
                client.run_on_scheduler(_one)
                during.append(time.perf_counter() - t0)
                time.sleep(0.01)

        watch = threading.Thread(target=probe_until_stopped, daemon=True)
        watch.start()
        client.run_on_scheduler(_gc_watch, on=True)
        for i in range(args.plans):
            rec = synthetic_record(i, args.tasks, workers)  # one at a time: this process hosts the scheduler
            t0 = time.perf_counter()
            add.append(client.run_on_scheduler(_timed_add, record=rec))
            add_rt.append(time.perf_counter() - t0)
            del rec
        stop.set()
        watch.join()
        add_pauses = client.run_on_scheduler(_gc_watch, on=False)
        tokens = [synthetic_record(i, 0, workers)["token"] for i in range(args.plans)]
        if not args.waiting:
            for token in tokens:
                client.run_on_scheduler(_finish, token=token)
        rss1, gc_s, objects = client.run_on_scheduler(_memory)
        page_s, api_s, page_len, api_len = client.run_on_scheduler(_render_times, n=5)

        urls = [base + route for route in (PAGE, API) for _ in range(args.fetchers)]
        fetch = fetch_load(urls, args.seconds + 2)
        time.sleep(1.0)  # the fetcher's start-up
        client.run_on_scheduler(_gc_watch, on=True)
        loaded = probe(client, args.seconds)
        pauses = client.run_on_scheduler(_gc_watch, on=False)
        times = json.loads(fetch.communicate(timeout=120)[0])
        fetched = {route: [t for u, ts in times.items() if u.endswith(route) for t in ts] for route in (PAGE, API)}
    finally:
        client.close()

    row = dict(label=args.label, idle=stats(idle), loaded=stats(loaded), page_ms=1e3 * page_s, api_ms=1e3 * api_s,
               page_kb=page_len / 1024, api_kb=api_len / 1024, add_ms=1e3 * statistics.median(add),
               add_max_ms=1e3 * max(add), add_rt_ms=1e3 * statistics.median(add_rt), during_max=stats(during)[2],
               rss_mib=(rss1 - rss0) / 2**20, gc_ms=1e3 * gc_s, gc0_ms=1e3 * gc0_s, objects=objects,
               gets={r: (len(v), 1e3 * statistics.median(v) if v else float("nan")) for r, v in fetched.items()})
    print(f"round trip idle   p50/p99/max {row['idle'][0]:.1f} / {row['idle'][1]:.1f} / {row['idle'][2]:.1f} ms "
          f"({len(idle)} calls)")
    print(f"round trip loaded p50/p99/max {row['loaded'][0]:.1f} / {row['loaded'][1]:.1f} / {row['loaded'][2]:.1f} ms "
          f"({len(loaded)} calls; {', '.join(f'{r}: {n} GETs, median {ms:.0f} ms' for r, (n, ms) in row['gets'].items())})")
    print(f"render on the scheduler: page {row['page_ms']:.1f} ms ({row['page_kb']:.0f} KiB), "
          f"JSON {row['api_ms']:.1f} ms ({row['api_kb']:.0f} KiB)")
    print(f"add_plan of {args.tasks} keys on the scheduler: median {row['add_ms']:.0f} ms, max {row['add_max_ms']:.0f} ms; "
          f"round trip of the call {row['add_rt_ms']:.0f} ms; longest no-op round trip meanwhile {row['during_max']:.0f} ms")
    print(f"scheduler memory for {args.plans} plans: +{row['rss_mib']:.0f} MiB RSS; gc.collect() {row['gc_ms']:.0f} ms "
          f"over {row['objects']:,} tracked objects ({row['gc0_ms']:.0f} ms before the plans)")
    for what, log in (("adding plans", add_pauses), ("loaded", pauses)):
        print(f"scheduler's gc pauses while {what}: " + ", ".join(
            f"gen {g}: {len(v)}x, max {1e3 * max(v, default=0):.0f} ms" for g, v in sorted(log.items())))
    if args.write:
        write_readme(row, args)


HEADER = ["| run | round trip idle p50/p99/max (ms) | round trip while GETs run p50/p99/max (ms) | GETs page / JSON "
          "(median ms) | render page / JSON on the scheduler (ms) | page / JSON size (KiB) | add_plan median / max (ms) "
          "| longest round trip during add_plan (ms) | scheduler RSS for the plans (MiB) | full gc.collect (ms; before "
          "the plans) |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]


def write_readme(row, args):
    import dask
    import distributed

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    f3 = "{:.1f} / {:.1f} / {:.1f}".format
    line = (f"| {row['label']} ({stamp}, load {os.getloadavg()[1]:.1f}) | {f3(*row['idle'])} | {f3(*row['loaded'])} | "
            f"{row['gets'][PAGE][0]}x {row['gets'][PAGE][1]:.0f} / {row['gets'][API][0]}x {row['gets'][API][1]:.0f} | "
            f"{row['page_ms']:.1f} / {row['api_ms']:.1f} | {row['page_kb']:.0f} / {row['api_kb']:.0f} | "
            f"{row['add_ms']:.0f} / {row['add_max_ms']:.0f} | {row['during_max']:.0f} | {row['rss_mib']:.0f} | "
            f"{row['gc_ms']:.0f} ({row['gc0_ms']:.0f}) |")
    old = []
    text = README.read_text() if README.exists() else ""
    start = text.find(f"## {TITLE}")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        section = text[start:end if end >= 0 else len(text)]
        old = [ln for ln in section.splitlines() if ln.startswith("| ") and not ln.startswith("| run ")
               and not ln.startswith(f"| {row['label']} (")]
    lines = [
        f"`python benchmarks/dashboard_load.py --plans {args.plans} --tasks {args.tasks} --seconds {args.seconds:g}` — "
        f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores), python {platform.python_version()}, "
        f"dask {dask.__version__}, distributed {distributed.__version__}. LocalCluster (2 worker processes, "
        f"127.0.0.1), {args.real} real plans and {args.plans} synthetic records of {args.tasks:,} task keys "
        f"({'left waiting' if args.waiting else 'each task taken through a finished run'}); "
        f"{args.fetchers} thread(s) per route fetching /tra-dask and its JSON back to back; the round trip is "
        "`client.run_on_scheduler` of a no-op, every 10 ms.",
        "",
        *HEADER, *old, line, "",
        "Target: round trip < 50 ms while the page and JSON are fetched. `before`: each kept plan indexed its "
        "tasks as Python objects (a dict entry and a tuple per task, the record's key lists kept: ~3.6 M objects "
        "that every full garbage collection walks: 0.3-1.4 s each here, set off by the next submission) and the page "
        "drew every plan. `after`: a few bytes per task in arrays (state, pinned worker, worker that ran it) "
        "found from the key's prefix, the record's key lists dropped; the page draws the newest "
        "`tra-dask.dashboard.page-plans` (10) plans and lists the others one row each (`/tra-dask?plan=<token>` "
        "draws one); page and JSON are made again only after something changed. Plans expire: beyond "
        "`tra-dask.dashboard.keep-plans` (50) the oldest go, and a plan none of whose tasks changed state for "
        "`tra-dask.dashboard.keep-seconds` (\"1h\"; 0: never) goes (checked every 10 s on the scheduler). "
        "The machine is shared (load: the 5-minute load average on its 2 cores when the row was written): "
        "tails (p99, max) there are the machine's as much as the scheduler's.",
    ]
    write_section(TITLE, lines)


if __name__ == "__main__":
    main()
