"""Planning time and memory against the number of sites, keys only.

Each expression is written with the array front-end over ``td.from_region`` arrays
(a function of a region: nothing is made while planning) and planned for a simulated
cluster of N sites of the default ``ClusterSpec`` (``td.Array.to_relation(sites=N)``:
the chunking chosen with the plan, as on a cluster).  Every (expression, N) runs in a
fresh process, so nothing is cached from an earlier one; the time is the planning
call's, the memory the process's peak resident size after it.

    python benchmarks/planning_sites.py [--sites 16 64 256 1024] [--only NAME ...] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

CASES = {
    "matmul 4096³": "mm(4096, 4096, 4096)",
    "matmul 16384³": "mm(16384, 16384, 16384)",
    "square 16384³ (paper)": "mm(16384, 16384, 16384)",
    "common-large-dim 10⁴x6.4·10⁵x10⁴": "mm(10_000, 640_000, 10_000)",
    "two-large-dims 8·10⁴x10⁴x8·10⁴": "mm(80_000, 10_000, 80_000)",
    "abcdef,bcdfg->abcdeg": "es('abcdef,bcdfg->abcdeg', 24)",
    "5-operand chain ab,bc,cd,de,ef->af": "es('ab,bc,cd,de,ef->af', 4096)",
    "FFNN SGD step (10⁴x6·10⁴x10³x10³)": "ffnn()",
}
CASES.pop("square 16384³ (paper)")  # (the same expression as matmul 16384³)

CHILD = r"""
import json, resource, sys, time
import dask.config  # (a one-time import every Dask user has made: not planning)
import tra_dask as td
from tra_dask.programs import ffnn_sgd_step_array

def nodata(region):
    raise AssertionError("planning must not make data")

def arr(*shape):
    return td.from_region(nodata, shape, "float64")

def mm(m, k, n):
    return arr(m, k) @ arr(k, n)

def es(eq, n):
    ins = eq.split("->")[0].split(",")
    return td.einsum(eq, *[arr(*(n,) * len(s)) for s in ins])

def ffnn():
    X, Y, W1, W2 = arr(10_000, 60_000), arr(10_000, 1_000), arr(60_000, 1_000), arr(1_000, 1_000)
    return ffnn_sgd_step_array(X, Y, W1, W2, 0.1)

x = EXPR
sites = SITES
t0 = time.perf_counter()
outs = x if isinstance(x, tuple) else (x,)
if len(outs) == 1:
    rel, plan = td.frontend.run.build_local(outs[0], sites=sites)
else:
    rel, plan = td.frontend.run.build_local(outs, sites=sites)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "predicted": plan.cost.seconds, "chunking": plan.stages[0].note}))
"""


def run_one(expr: str, sites: int, timeout: float) -> dict:
    code = CHILD.replace("EXPR", expr).replace("SITES", str(sites))
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:.0f} s"}
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, nargs="+", default=[16, 64, 256, 1024])
    p.add_argument("--only", nargs="*", help="case names containing any of these")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--no-write", dest="write", action="store_false")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--from-json", nargs="+", help="write the table from these files (rows of other runs)")
    args = p.parse_args(argv)
    cases = {k: v for k, v in CASES.items() if not args.only or any(o in k for o in args.only)}
    rows = []
    if args.from_json:
        for path in args.from_json:
            with open(path) as f:
                got = json.load(f)
            rows += [tuple(r) for r in got["rows"]]
            host = got["host"]
        args.sites = sorted({s for _, s, _ in rows})
        cases = {k: v for k, v in CASES.items() if any(n == k for n, _, _ in rows)}
    else:
        host = f"{platform.node()}, {os.cpu_count()} cores"
    for name, expr in ([] if args.from_json else cases.items()):
        for sites in args.sites:
            r = run_one(expr, sites, args.timeout)
            rows.append((name, sites, r))
            if "error" in r:
                print(f"{name:40s} {sites:5d} sites: {r['error']}", flush=True)
            else:
                print(f"{name:40s} {sites:5d} sites: {r['seconds']:6.2f} s, {r['rss'] / 2**30:.2f} GiB peak, "
                      f"predicted {r['predicted']:.3g} s | {r['chunking'][:90]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"host": host, "rows": rows}, f)
    if args.write:
        from _report import write_section

        head = (f"benchmarks/planning_sites.py, {datetime.date.today()}, {host}; one fresh process per "
                f"cell; the chunking chosen with the plan, default ClusterSpec; peak resident memory of the process")
        lines = [head, "", "| expression | " + " | ".join(f"{s} sites" for s in args.sites) + " |",
                 "|---|" + "---|" * len(args.sites)]
        for name in cases:
            cells = []
            for s in args.sites:
                r = next((r for n, s2, r in rows if n == name and s2 == s), {"error": "not run"})
                if True:
                    cells.append(("NoPlanFits: the inputs do not fit the sites' memory" if "fits in memory" in
                                  r["error"] else r["error"]) if "error" in r else
                                 f"{r['seconds']:.2f} s, {r['rss'] / 2**30:.2f} GiB (predicted {r['predicted']:.3g} s)")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        write_section("Planning time vs sites (keys only)", lines)


if __name__ == "__main__":
    main()
