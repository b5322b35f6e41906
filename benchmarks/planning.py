"""Planning time on the hot path: a first submission, and a repeated one (the plan cache).

For a matmul of 16 blocks per operand (4x4 grids) on an embedded cluster, times
`td.plan_for` (what `td.submit` pays before lowering):

* first: a structure the cache has not seen (the cache is cleared before each try);
* repeated, same expression: the same relations again;
* repeated, new data: a training loop's next step — new numpy arrays of the same
  shapes (from_numpy), the expression built again;
* the array front-end: `A @ B` / an FFNN-like step on new numpy arrays each time
  (the chunking choice and the plan both reused after the first).

Best and median of --repeat tries, `time.perf_counter`; writes a table into
benchmarks/README.md.

    python benchmarks/planning.py [--repeat 20] [--sites 2 3] [--no-write]
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
from tra_dask.frontend.run import _CHOICES
from tra_dask.runtime import embedded_client
from tra_dask.runtime.submit import _plan_cache


def _timed(fn, repeat, before=None):
    ts = []
    for _ in range(repeat):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--sites", type=int, nargs="+", default=[2, 3])
    p.add_argument("--n", type=int, default=2000, help="matmul extent (n x n @ n x n, 4x4 blocks)")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    client = embedded_client(max(args.sites))
    rng = np.random.default_rng(0)
    n, b = args.n, args.n // 4
    A, B = rng.random((n, n)), rng.random((n, n))
    rows = []
    for sites in args.sites:
        workers = sorted(client.scheduler_info()["workers"])[:sites]
        cache = _plan_cache(client)

        def expr(a=A, bb=B):
            return td.programs.matmul(td.from_numpy(a, (b, b), name="A"), td.from_numpy(bb, (b, b), name="B"))

        same = expr()
        td.plan_for(same, client, workers)  # warm: imports, calibration-free paths
        first = _timed(lambda: td.plan_for(same, client, workers), args.repeat, before=cache.clear)
        td.plan_for(same, client, workers)
        hits0 = cache.hits
        again = _timed(lambda: td.plan_for(same, client, workers), args.repeat)
        fresh = [(rng.random((n, n)), rng.random((n, n))) for _ in range(3)]
        k = iter(range(10**9))

        def next_step():
            a, bb = fresh[next(k) % len(fresh)]
            td.plan_for(expr(a, bb), client, workers)

        step = _timed(next_step, args.repeat)
        assert cache.hits - hits0 == 2 * args.repeat, "the repeated plans did not come from the cache"
        rows.append((sites, f"matmul {n}x{n}x{n}, 4x4 blocks per operand (td.plan_for)", first, again, step))

        pool = [(rng.random((n, n // 2)), rng.random((n // 2, n))) for _ in range(3)]
        j = iter(range(10**9))

        def array_plan(new_data):
            def go():
                x, w = pool[next(j) % len(pool)] if new_data else pool[0]
                xa, wa = td.from_array(x), td.from_array(w)
                (xa @ wa).plan(client, sites=workers)
            return go

        def clear_all():
            cache.clear()
            _CHOICES.clear()

        afirst = _timed(array_plan(False), max(3, args.repeat // 5), before=clear_all)
        array_plan(False)()
        again_a = _timed(array_plan(False), args.repeat)
        step_a = _timed(array_plan(True), args.repeat)  # other arrays each time
        rows.append((sites, f"td.Array x @ w, {n}x{n // 2} @ {n // 2}x{n}, chunks='auto' (x.plan)", afirst, again_a,
                     step_a))
    for r in rows:
        print(f"{r[0]} sites {r[1]}: first {r[2][0] * 1e3:.1f} ms, repeated {r[3][0] * 1e3:.2f} ms, "
              f"new data {r[4][0] * 1e3:.2f} ms (best)")
    if args.write:
        import dask
        import distributed

        stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
        lines = [
            f"`python benchmarks/planning.py --repeat {args.repeat} --sites {' '.join(map(str, args.sites))}` — "
            f"{stamp}, {platform.node()} ({platform.machine()}, {os.cpu_count()} cores), python "
            f"{platform.python_version()}, dask {dask.__version__}, distributed {distributed.__version__}, "
            f"numpy {np.__version__}. Embedded LocalCluster; time of `td.plan_for` (or the array's `plan`), "
            f"which includes the scheduler round trips for the worker list and memory budget (~1.5 ms here).",
            "",
            "| sites | what | first plan, best / median (ms) | same expression again (ms) | "
            "next step, new data (ms) |",
            "|---:|---|---:|---:|---:|",
        ]
        for sites, what, f, a, s in rows:
            lines.append(f"| {sites} | {what} | {f[0] * 1e3:.1f} / {f[1] * 1e3:.1f} | {a[0] * 1e3:.2f} / "
                         f"{a[1] * 1e3:.2f} | {s[0] * 1e3:.2f} / {s[1] * 1e3:.2f} |")
        lines += ["", "Targets (issue 15): a repeated submission plans in < 5 ms (cache hit); a first matmul "
                      "submission plans in < 50 ms at 16 blocks per operand."]
        write_section("planning time and the plan cache", lines)


if __name__ == "__main__":
    sys.exit(main())
