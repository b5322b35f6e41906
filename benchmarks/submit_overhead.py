"""End-to-end overhead per task of td.submit on an embedded 2-worker cluster.

A plan of tiny tasks (from_function chunks of 8 floats, then a kernel on each), so
the time is all planning, lowering, graph submission, scheduling and bookkeeping.
Reports wall time per task for plans of about 1k and 10k tasks, best and median of
--repeat runs on a warm cluster, and writes a table into benchmarks/README.md.

    python benchmarks/submit_overhead.py [--repeat 5] [--sites 2] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import numpy as np

import tra_dask as td
from _report import write_section
from tra_dask.runtime import embedded_client


class Ones:
    """A picklable loader: one tiny chunk per key."""

    def __call__(self, key):
        return np.ones(8)


def run(ntuples: int, client, sites: int):
    R = td.from_function(Ones(), (8 * ntuples,), 8, "float64", name=f"ones{ntuples}")
    expr = td.transform(R, "neg")
    t0 = time.perf_counter()
    rf = td.submit(expr, client=client, sites=sites)
    t_submitted = time.perf_counter()
    rf.wait()
    t1 = time.perf_counter()
    return rf.lowered.ntasks, t1 - t0, t_submitted - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--sites", type=int, default=2)
    p.add_argument("--sizes", type=int, nargs="+", default=[500, 5000], help="tuples per plan (2 tasks each)")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    client = embedded_client(args.sites)
    run(100, client, args.sites)  # warm up: imports and pickling caches on the workers
    rows = []
    for n in args.sizes:
        walls, submits, ntasks = [], [], 0
        for _ in range(args.repeat):
            ntasks, wall, sub = run(n, client, args.sites)
            walls.append(wall)
            submits.append(sub)
        rows.append((ntasks, min(walls), statistics.median(walls), statistics.median(submits)))
        print(f"{ntasks:>6} tasks: best {min(walls):.3f} s, median {statistics.median(walls):.3f} s "
              f"-> {1e3 * min(walls) / ntasks:.3f} ms/task best, {1e3 * statistics.median(walls) / ntasks:.3f} "
              f"ms/task median (client-side plan+lower+send {statistics.median(submits):.3f} s)")
    if args.write:
        write_readme(rows, args)


def write_readme(rows, args):
    import dask
    import distributed

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    table = [
        f"`python benchmarks/submit_overhead.py --repeat {args.repeat} --sites {args.sites}` — {stamp}, "
        f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores), python {platform.python_version()}, "
        f"dask {dask.__version__}, distributed {distributed.__version__}, numpy {np.__version__}. "
        f"Embedded LocalCluster, {args.sites} single-threaded worker processes, warm.",
        "",
        "| tasks | best wall (s) | median wall (s) | best ms/task | median ms/task | client side (plan+lower+send, s) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for ntasks, best, med, sub in rows:
        table.append(f"| {ntasks} | {best:.3f} | {med:.3f} | {1e3 * best / ntasks:.3f} | {1e3 * med / ntasks:.3f} | {sub:.3f} |")
    table.append("")
    table.append("Target: < 1.5 ms per task end to end. End to end = from `td.submit` (compile, lower, send) "
                 "until every result is in worker memory.")
    write_section("submit overhead", table)


if __name__ == "__main__":
    sys.exit(main())
