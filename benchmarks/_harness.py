"""Shared by the workload benchmarks: one cluster, inputs on the workers before
timing, tra_dask (chosen plan and every alternative) next to dask.array, numpy and
torch, measured bytes between workers, and a load check on the machine."""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import statistics
import time

import dask
import numpy as np
import psutil
from distributed import Client, Future, LocalCluster, futures_of, wait

from distributed.system import MEMORY_LIMIT

import tra_dask as td
from tra_dask.runtime import spawn_config, worker_config


def cluster_config(sites: int) -> dict:
    """The workers' Dask config: tra_dask's embedded cluster's (its transfer log, no
    Active Memory Manager, workers that reuse freed memory:
    ``tra_dask.runtime.worker_config``), for both systems.  With
    ``TRA_BENCH_DASK_MALLOC=1`` in the environment the workers keep Dask's own
    malloc settings (for a before/after of that choice)."""
    config = worker_config(MEMORY_LIMIT / sites)
    if os.environ.get("TRA_BENCH_DASK_MALLOC") == "1":
        config = {k: v for k, v in config.items() if k != "distributed.nanny.pre-spawn-environ"}
    return config


# a run during which other processes used the CPU is redone once (measure); not in --quick
# runs, which are smoke tests whose times nobody reads (the test suite runs them beside
# other tests: every run would be redone)
REDO_BUSY = True


class _Parser(argparse.ArgumentParser):
    def parse_args(self, *a, **k):
        global REDO_BUSY
        args = super().parse_args(*a, **k)
        REDO_BUSY = not args.quick
        return args


def parser(doc: str) -> argparse.ArgumentParser:
    p = _Parser(description=doc.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the sizes (default: 1/10 of the paper's)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dtype", nargs="+", default=["float64", "float32"])
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke test")
    p.add_argument("--alternatives", type=int, default=6, help="alternative plans to time besides the chosen one")
    p.add_argument("--no-write", dest="write", action="store_false")
    return p


def start_cluster(sites: int) -> Client:
    """A client whose ``close()`` also closes its LocalCluster."""
    with spawn_config(cluster_config(sites)):
        cluster = LocalCluster(n_workers=sites, threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL)
        client = Client(cluster)
    close = client.close

    def close_both(*a, **kw):
        close(*a, **kw)
        cluster.close()

    client.close = close_both
    return client


def start_dask_processes(sites: int) -> Client:
    """A client of a real cluster: a ``dask scheduler`` and ``sites`` ``dask worker``
    processes (each with its nanny, one thread) on 127.0.0.1, started with the
    commands a user types, the workers' Dask config that of :func:`cluster_config`
    (passed as Dask passes config to the processes it spawns).  ``close()`` shuts the
    cluster down and waits for the processes."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    config = cluster_config(sites)
    with dask.config.set(config):
        inherit = dask.config.serialize(dask.config.global_config)
    env = dict(os.environ, DASK_INTERNAL_INHERIT_CONFIG=inherit,
               **{k: str(v) for k, v in config.get("distributed.nanny.pre-spawn-environ", {}).items()
                  if k.startswith("MALLOC_")})
    dask_cli = str(Path(sys.executable).with_name("dask"))
    tmp = tempfile.TemporaryDirectory()
    sched_file = Path(tmp.name) / "scheduler.json"
    procs = [subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(sched_file)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    for _ in range(sites):
        procs.append(subprocess.Popen([dask_cli, "worker", "--scheduler-file", str(sched_file), "--host",
                                       "127.0.0.1", "--nthreads", "1", "--no-dashboard", "--memory-limit",
                                       str(int(MEMORY_LIMIT / sites))], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    def stop():
        for p in procs:
            p.terminate()  # a nanny stops its worker on SIGTERM
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        tmp.cleanup()

    try:
        deadline = time.time() + 60
        while not sched_file.exists():
            if time.time() > deadline or procs[0].poll() is not None:
                raise RuntimeError("dask scheduler did not start")
            time.sleep(0.1)
        client = Client(scheduler_file=str(sched_file), timeout="30s")
        client.wait_for_workers(sites, timeout=60)
    except BaseException:
        stop()
        raise
    close = client.close

    def close_all(*a, **kw):
        try:
            client.shutdown()
        finally:
            close(*a, **kw)
            stop()

    client.close = close_all
    return client


def worker_bytes(client: Client, since: float, until: float) -> int:
    """Bytes sent worker-to-worker between ``since`` and ``until`` (transfer logs)."""
    workers = set(client.scheduler_info()["workers"])

    def count(dask_worker, since=since, until=until, workers=workers):
        return sum(e["total"] for e in dask_worker.transfer_outgoing_log
                   if e["who"] in workers and since <= e["start"] <= until)

    return int(sum(client.run(count).values()))


def twins(client: Client, arrays: list) -> list:
    """Fresh copies of persisted dask arrays, every chunk copied on the worker that
    holds the original (no transfer), as persisted dask arrays of new keys.  Two
    systems timed on twins of the same inputs start from the same placement, so their
    bytes moved compare like for like (a fresh ``persist`` places chunks anew each
    time, and copies a run fetched would help a second run on the same arrays)."""
    import uuid

    import dask.array as da
    from dask.core import flatten

    keys = [list(flatten(x.__dask_keys__())) for x in arrays]
    who = client.who_has(futures_of(arrays))
    out = []
    for x, ks in zip(arrays, keys):
        name = f"twin-{uuid.uuid4().hex[:12]}"
        graph = {}
        for k in ks:
            holder = sorted(who[k])[0]
            new = (name, *k[1:])
            graph[new] = client.submit(np.copy, Future(k, client), key=new, workers=[holder],
                                       allow_other_workers=False, pure=False)
        out.append(da.Array(graph, name, x.chunks, dtype=x.dtype, meta=x._meta))
    wait([f for g in out for f in g.dask.values()])
    return out


class LoadWatch:
    """CPU seconds used on the machine by processes that are not ours during a run."""

    def __init__(self, client: Client | None):
        ours = {os.getpid()} | {c.pid for c in psutil.Process().children(recursive=True)}
        self.ours = ours

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.total0 = sum(psutil.cpu_times()[:3])
        self.ours0 = self._ours()
        return self

    def _ours(self):
        s = 0.0
        for pid in self.ours:
            try:
                t = psutil.Process(pid).cpu_times()
                s += t.user + t.system
            except psutil.Error:
                pass
        return s

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.t0
        total = sum(psutil.cpu_times()[:3]) - self.total0
        mine = self._ours() - self.ours0
        self.other = max(0.0, total - mine)
        return False

    @property
    def busy(self) -> bool:
        """Other processes used more than 20% of one core during the run."""
        return self.other > 0.2 * self.wall


def measure(run, repeat: int, setup=None):
    """Time ``run(setup())`` ``repeat`` times, ``setup`` untimed (fresh inputs each
    time, so copies a previous run left on other workers do not help the next); a run
    during which other processes used the CPU is redone once (not with --quick:
    :data:`REDO_BUSY`), then flagged.  Returns (min, median, flagged, last setup, last
    result)."""
    walls, flagged, out, ctx = [], 0, None, None
    for _ in range(repeat):
        for attempt in range(2 if REDO_BUSY else 1):
            ctx = setup() if setup is not None else None
            with LoadWatch(None) as w:
                out = run(ctx)
            if not w.busy:
                break
        flagged += w.busy
        walls.append(w.wall)
    return min(walls), statistics.median(walls), flagged, ctx, out


def time_tra(client, make_plan, repeat):
    """``make_plan()`` (untimed: fresh inputs on the workers, then the plan) ->
    Plan; timed: submit it and wait.  Wall, measured and predicted bytes, tasks."""
    def run(plan):
        rf = td.submit(plan, client=client)
        for one in rf if isinstance(rf, tuple) else (rf,):
            one.wait()
        return rf

    best, med, flagged, plan, rf = measure(run, repeat, make_plan)
    first = rf[0] if isinstance(rf, tuple) else rf  # one submission: its transfers cover every output
    return dict(best=best, median=med, flagged=flagged, moved=first.transfers(), predicted=plan.cost.bytes_moved,
                tasks=first.lowered.ntasks, rf=rf)


def time_dask(client, make_collection, repeat):
    """``make_collection()`` (untimed) -> a dask collection over fresh persisted
    inputs; timed: persist it and wait."""
    last = {}

    def run(x):
        xs = list(x) if isinstance(x, (tuple, list)) else [x]
        t0 = time.time()
        y = client.persist(xs)
        wait(y)
        last.update(t0=t0, t1=time.time(), ntasks=len(dask.base.collections_to_expr(xs).__dask_graph__())
                    if hasattr(dask.base, "collections_to_expr") else None)
        return y

    best, med, flagged, _, y = measure(run, repeat, make_collection)
    moved = worker_bytes(client, last["t0"] - 0.01, last["t1"] + 0.5)
    return dict(best=best, median=med, flagged=flagged, moved=moved, tasks=last["ntasks"], result=y)


def time_local(fn, repeat):
    best, med, flagged, _, out = measure(lambda _: fn(), repeat)
    return dict(best=best, median=med, flagged=flagged, result=out)


def torch_or_none():
    try:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        return torch
    except Exception:
        return None


def machine_line(args, cluster: str = "LocalCluster") -> str:
    import distributed

    torch = torch_or_none()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f"{stamp}, {platform.node()} ({platform.machine()}, {os.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB), python {platform.python_version()}, numpy "
            f"{np.__version__}, dask/distributed {dask.__version__}/{distributed.__version__}, torch "
            f"{getattr(torch, '__version__', 'not installed')}; {cluster}({args.sites} workers x 1 thread, "
            f"processes, {_malloc()}), inputs persisted on the workers before timing; OPENBLAS_CORETYPE="
            f"{os.environ.get('OPENBLAS_CORETYPE', 'unset')}, BLAS {_blas()}")


def _malloc() -> str:
    if os.environ.get("TRA_BENCH_DASK_MALLOC") == "1":
        return "Dask's malloc settings"
    return "workers reuse freed memory as tra_dask's embedded cluster's do"


def _blas() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ", ".join(f"{i['internal_api']} {i.get('architecture', '')} x{i['num_threads']}" for i in threadpool_info())
    except Exception:
        return "unknown"


def fmt_mib(n) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def table_rows(case: str, dtype: str, results: list) -> list[str]:
    """results: [(name, dict)]; ratios to numpy and dask.array by best time."""
    by = dict(results)
    np_t = by.get("numpy", {}).get("best")
    da_t = by.get("dask.array", {}).get("best")
    rows = []
    for name, r in results:
        ratio_np = f"{r['best'] / np_t:.2f}" if np_t else "-"
        ratio_da = f"{r['best'] / da_t:.2f}" if da_t else "-"
        rows.append(f"| {case} | {dtype} | {name} | {r['best']:.3f} | {r['median']:.3f} | {fmt_mib(r.get('moved'))} "
                    f"| {fmt_mib(r.get('predicted'))} | {r.get('tasks', '-')} | {ratio_np} | {ratio_da} "
                    f"| {r['flagged'] or ''} |")
    return rows


HEADER = ["| case | dtype | system / plan | min (s) | median (s) | MiB moved | MiB predicted | tasks "
          "| / numpy | / dask.array | busy runs |",
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]


def strategy(plan) -> str:
    """The plan's strategies, each once, in plan order ("" when none is recognised)."""
    return "; ".join(dict.fromkeys(plan.strategies()))


def plans_to_time(plan, k: int):
    """Indices into [plan, *alternatives]: the chosen plan and up to ``k``
    alternatives, one per distinct strategy, with their names."""
    out, seen = [(0, "tra_dask chosen: " + (strategy(plan) or "compiled"))], set()
    seen.add(out[0][1].split(": ", 1)[1])
    for i, alt in enumerate(plan.alternatives, start=1):
        name = strategy(alt) or "other"
        if name in seen or len(out) > k:
            continue
        seen.add(name)
        out.append((i, "alternative: " + name))
    return out


def pick(plan, i: int, name: str | None = None):
    """Plan ``i`` of ``[plan, *alternatives]``; with ``name``, the first of them whose
    strategy is that name (else plan ``i`` if there is one, else the chosen plan)."""
    plans = [plan, *plan.alternatives]
    if name is not None:
        for p in plans:
            if (strategy(p) or "other") == name:
                return p
    return plans[i] if i < len(plans) else plan


def fresh_plan_maker(client, build_expr, index: int, name: str | None = None):
    """A ``make_plan`` for :func:`time_tra`: new inputs, plan them where they are,
    then take the plan of the same strategy (``name``, as :func:`plans_to_time` gives
    it) or rank among the alternatives: where Dask put the new inputs may differ, and
    with it the alternatives."""
    def make():
        return pick(td.plan_for(build_expr(), client), index, name)
    return make


def own_placement_maker(client, build_free_expr):
    """A ``make_plan`` for :func:`time_tra` where tra_dask places its inputs: the
    expression over free sources (made on the workers) is optimized keys-only, each
    source is then made on the workers where that plan wants it (untimed), and the
    timed plan runs over those chunks, fixed where they are."""
    import dataclasses

    from tra_dask.logical import Source, flatten_outputs, substitute, toposort
    from tra_dask.physical import PSource

    def make():
        expr = build_free_expr()
        sites = len(client.scheduler_info()["workers"])
        plan = td.optimize(expr, sites=sites)
        placed = {}
        for node in plan.nodes:
            if isinstance(node, PSource) and node.free and node.source not in placed:
                src_plan = td.compile(node.source, sites=sites, placements={node.source: node.placement_})
                placed[node.source] = td.submit(src_plan, client=client).wait()
        for node in toposort(flatten_outputs(expr)[0]):
            if isinstance(node, Source) and node not in placed and not hasattr(node, "dask_keys"):
                placed[node] = td.submit(node, client=client).wait()
        named = {src: dataclasses.replace(rf.__tra_relation__(), name=src.label) for src, rf in placed.items()}
        return td.plan_for(substitute(expr, named), client)

    return make


class Report:
    """Rows printed as they come and written as one section of benchmarks/README.md."""

    def __init__(self, args):
        self.args = args
        self.lines = [machine_line(args), "", *HEADER]

    def add(self, case: str, dtype: str, results: list) -> None:
        rows = table_rows(case, dtype, results)
        for row in rows:
            print(row, flush=True)
        self.lines += rows

    def write(self, title: str, script: str) -> None:
        if self.args.write and not self.args.quick:
            from _report import write_section

            write_section(title, [f"`python benchmarks/{script} --repeat {self.args.repeat}` — " + self.lines[0],
                                  *self.lines[1:]])
