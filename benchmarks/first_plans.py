"""A new expression's first plan: what a new user waits for before anything runs.

Each case is planned in a fresh process (nothing cached: no earlier choice of the same
structure), over numpy arrays, for a simulated cluster of ``--sites`` sites of the
default ``ClusterSpec`` (``td.frontend.run.build_local``: the chunk choice, the
contraction order and the plan, as ``td.compute`` makes them; no workers, no
calibration; ``dask`` is imported first, as a session with a cluster has it).  The
time is the planning call's, the best of ``--repeat`` processes;
the column "searches" counts the optimizer runs it made (and those not of the quick
search that compares candidates: the kept plan's).  ``--base DIR`` runs the same
cases on another checkout (a ``git worktree`` of an older commit) interleaved with this
one, for a before/after table.

    python benchmarks/first_plans.py [--sites 2] [--repeat 3] [--base DIR] [--no-write]
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
    "gram A.T @ A (2000x300)": "A(2000, 300).T @ A(2000, 300)",
    "bmm bij,bjk->bik (8x200x100, 8x100x200)": "td.einsum('bij,bjk->bik', A(8, 200, 100), A(8, 100, 200))",
    "tensordot over two axes (60x40x50, 50x40x30)":
        "td.tensordot(A(60, 40, 50), A(50, 40, 30), axes=([1, 2], [1, 0]))",
    "3-operand chain ij,jk,kl->il (600x400x500x300)":
        "td.einsum('ij,jk,kl->il', A(600, 400), A(400, 500), A(500, 300))",
    "attention-like pipeline (4x256x64)": "attention()",
    "many-index abcdef,bcdfg->abcdeg (a=8)": "td.einsum('abcdef,bcdfg->abcdeg', A(*(8,) * 6), A(*(8,) * 5))",
    "given chunks: bmm bij,bjk->bik (8x200x100, 8x100x200), chunks 50":
        "td.einsum('bij,bjk->bik', A(8, 200, 100), A(8, 100, 200), chunks=50)",
}

CHILD = r"""
import importlib, json, time
import dask  # (imported before the clock starts: a session that plans for a cluster has it)
import numpy as np
import tra_dask as td
run = importlib.import_module("tra_dask.frontend.run")
rng = np.random.default_rng(0)

def A(*s):
    return td.from_array(rng.random(s))

def attention():
    q, k, v = A(4, 256, 64), A(4, 256, 64), A(4, 256, 64)
    s = td.einsum("bqd,bkd->bqk", q, k) / 8.0
    e = np.exp(s - s.max(axis=2, keepdims=True))
    p = e / e.sum(axis=2, keepdims=True)
    return td.einsum("bqk,bkd->bqd", p, v)

searches = []
optimize = run.optimize
def counted(*a, **k):
    searches.append(k.get("options"))
    return optimize(*a, **k)
run.optimize = counted
x = EXPR
t0 = time.perf_counter()
rel, plan = run.build_local(x, sites=SITES)
print(json.dumps({"seconds": time.perf_counter() - t0, "searches": len(searches),
                  "kept": len(searches) - searches.count("quick"), "predicted": plan.cost.seconds}))
"""


def run_one(root: str, expr: str, sites: int) -> dict:
    code = CHILD.replace("EXPR", expr).replace("SITES", str(sites))
    env = dict(os.environ, PYTHONPATH=root)
    # (run in ``root``: ``python -c`` puts the working directory first on the path, ahead of PYTHONPATH)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env,
                         cwd=root)
    if out.returncode:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:120]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--base", help="another checkout to compare with (its root directory)")
    p.add_argument("--only", nargs="*", help="case names containing any of these")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    roots = {"this": here} | ({"base": os.path.abspath(args.base)} if args.base else {})
    cases = {k: v for k, v in CASES.items() if not args.only or any(o in k for o in args.only)}
    rows = []
    for name, expr in cases.items():
        got = {r: [] for r in roots}
        for _ in range(args.repeat):  # interleaved: this, base, this, base ...
            for label, root in roots.items():
                got[label].append(run_one(root, expr, args.sites))
        best = {}
        for label, runs in got.items():
            ok = [r for r in runs if "error" not in r]
            best[label] = min(ok, key=lambda r: r["seconds"]) if ok else runs[0]
        rows.append((name, best))
        print(name, {k: (round(v["seconds"], 2), v.get("searches")) if "error" not in v else v["error"]
                     for k, v in best.items()}, flush=True)
    if not args.write:
        return

    def cell(r):
        if "error" in r:
            return r["error"], "-"
        return f"{r['seconds']:.2f} s", f"{r['searches']} ({r['kept']} for the plan kept)"

    from _report import write_section

    head = (f"benchmarks/first_plans.py, {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()} "
            f"({os.cpu_count()} cores); {args.sites} sites of the default ClusterSpec, numpy inputs; best of "
            f"{args.repeat} fresh processes{', interleaved with the base checkout' if args.base else ''}")
    cols = ["expression", "planning", "searches"] + (["base planning", "base searches", "base / this"] if args.base
                                                     else [])
    lines = [head, "", "| " + " | ".join(cols) + " |", "|---|" + "---:|" * (len(cols) - 1)]
    for name, best in rows:
        cells = [name, *cell(best["this"])]
        if args.base:
            b = best["base"]
            ratio = (f"{b['seconds'] / best['this']['seconds']:.2f}" if "error" not in b and "error" not in best["this"]
                     else "-")
            cells += [*cell(b), ratio]
        lines.append("| " + " | ".join(cells) + " |")
    write_section("First plans (benchmarks/first_plans.py)", lines)


if __name__ == "__main__":
    main()
