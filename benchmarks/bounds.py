"""Plans against the communication lower bound, keys only (no data is made).

For 8, 64, 512 and 4096 simulated sites and six matmul shapes, the array front-end
chooses the chunking and the plan (``(A @ B).to_relation(sites=P)``: the default
cluster description, objective ``"time"``), and the table gives the plan's floats
moved against ``P ×`` the memory-independent lower bound of Al Daas, Ballard et al.
(SPAA 2022; :mod:`tra_dask.optimizer.bounds`: words every site must communicate
beyond its 1/P share of each matrix, when each does 1/P of the multiply-adds).  A
plan whose multiply-adds are balanced cannot move less than the bound; one whose
flops are unbalanced can (its ratio is then no measure of optimality).

Each row is planned in a child process with a time limit (``--limit``, 120 s);
a row that does not finish is reported as not run, and so is that shape at more
sites (planning takes longer with more sites).

    python benchmarks/bounds.py [--sites 8 64] [--limit 120] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import platform
import sys
import time

import tra_dask as td
from _report import write_section
from tra_dask.optimizer.bounds import matmul_lower_bound, matmul_regime, plan_lower_bound

# name: (m, k, n), and whether B is A's own transpose (the gram X.T @ X)
SHAPES = {
    "square": ((4096, 4096, 4096), False),
    "common-large-dim": ((1024, 65536, 1024), False),
    "two-large-dims": ((8192, 1024, 8192), False),
    "lopsided 10000x100x10000": ((10000, 100, 10000), False),
    "lopsided 1000x1000x10": ((1000, 1000, 10), False),
    "tall-skinny gram X.T@X, X 65536x256": ((256, 65536, 256), True),
}
SITES = (8, 64, 512, 4096)


def _no_data(region):
    raise AssertionError("planning must not make data")


def _expr(shape, gram):
    m, k, n = shape
    if gram:
        X = td.from_region(_no_data, (k, m), "float64", name="X")
        return X.T @ X
    A = td.from_region(_no_data, (m, k), "float64", name="A")
    B = td.from_region(_no_data, (k, n), "float64", name="B")
    return A @ B


def one_row(P, name, q):
    shape, gram = SHAPES[name]
    t0 = time.perf_counter()
    _, plan = _expr(shape, gram).to_relation(sites=P)
    dt = time.perf_counter() - t0
    b = plan_lower_bound(plan)
    chunking = next((s.note for s in plan.stages if s.name == "chunking"), "")
    q.put(dict(moved=plan.cost.floats_moved, bound=b["total"] if b else None, ratio=b["ratio"] if b else None,
               balance=plan.cost.flops_balance, seconds=dt, strategy="; ".join(dict.fromkeys(plan.strategies())),
               chunking=chunking.split("; least")[0]))


def rows(sites, limit):
    ctx = mp.get_context("fork")
    too_slow: dict = {}  # shape -> the sites at which it ran past the limit
    for P in sites:
        for name, (shape, gram) in SHAPES.items():
            m, k, n = shape
            row = dict(P=P, name=name, regime=matmul_regime(m, k, n, P), per_site=matmul_lower_bound(m, k, n, P))
            if name in too_slow:  # planning takes longer with more sites: not tried again
                row["skipped"] = f"not run (planning too slow: > {limit:.0f} s at {too_slow[name]} sites already)"
                print(f"{P:>5} sites {name:<36} {row['regime']}  {row['skipped']}", flush=True)
                yield row
                continue
            q = ctx.Queue()
            proc = ctx.Process(target=one_row, args=(P, name, q))
            t0 = time.perf_counter()
            proc.start()
            proc.join(limit)
            if proc.is_alive():
                proc.kill()
                proc.join()
                row["skipped"] = f"not run (planning too slow: > {limit:.0f} s)"
                too_slow[name] = P
            elif q.empty():
                row["skipped"] = f"failed (exit code {proc.exitcode})"
            else:
                row.update(q.get())
            wall = time.perf_counter() - t0
            if "skipped" in row:
                print(f"{P:>5} sites {name:<36} {row['regime']}  {row['skipped']} ({wall:.0f} s)", flush=True)
            else:
                print(f"{P:>5} sites {name:<36} {row['regime']}  moved {row['moved']:.3e} bound {row['bound']:.3e} "
                      f"ratio {row['ratio']:.2f} balance {row['balance']:.2f}  {row['seconds']:.1f} s  "
                      f"[{row['strategy']}] {row['chunking']}", flush=True)
            yield row


def write_readme(table, limit):
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"`python benchmarks/bounds.py` — {stamp}, {platform.node()} ({platform.machine()}, {os.cpu_count()} cores), "
        f"python {platform.python_version()}. Keys only; the chunking and the plan chosen by the array front-end "
        "(`(A @ B).to_relation(sites=P)`: default cluster description, objective `\"time\"`); each row planned in "
        f"a child process with a {limit:.0f} s limit; one run each (the machine is shared: times are rough).",
        "",
        "The bound (`tra_dask.optimizer.bounds`): the memory-independent lower bound of Al Daas, Ballard, Grigori, "
        "Kumar and Rouse (SPAA 2022) — with the dims sorted d1 ≥ d2 ≥ d3, the words each site must communicate "
        "beyond its 1/P share of each matrix are d2·d3·(1 − 1/P) if P ≤ d1/d2 (1-D), "
        "2·sqrt(mkn·d3/P) − (d1·d3 + d2·d3)/P if P ≤ d1·d2/d3² (2-D), else 3·(mkn/P)^(2/3) − (mk + kn + mn)/P (3-D); "
        "the table's bound is P times that, the least total a plan whose multiply-adds are balanced can move. "
        "A plan with unbalanced flops can move less (its ratio says nothing about optimality). For the gram "
        "X.T @ X the two operands are one array: the bound is that of two distinct operands (valid in the 1-D "
        "regime, where it counts only the reduction of C; above, a site may use one received element of X twice).",
        "",
        "| sites | shape (m×k×n) | regime | chunks chosen | floats moved | lower bound | ratio | flops balance | "
        "plan (s) | strategy |",
        "|---:|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in table:
        m, k, n = SHAPES[r["name"]][0]
        shape = f"{r['name']} ({m}×{k}×{n})"
        if "skipped" in r:
            lines.append(f"| {r['P']} | {shape} | {r['regime']} | - | - | {r['per_site'] * r['P']:.3e} | - | - | - | "
                         f"{r['skipped']} |")
        else:
            lines.append(f"| {r['P']} | {shape} | {r['regime']} | {r['chunking']} | {r['moved']:.3e} | "
                         f"{r['bound']:.3e} | {r['ratio']:.2f} | {r['balance']:.2f} | {r['seconds']:.1f} | "
                         f"{r['strategy']} |")
    write_section("communication bounds", lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, nargs="+", default=list(SITES))
    p.add_argument("--limit", type=float, default=120.0, help="seconds per row")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    table = list(rows(args.sites, args.limit))
    if args.write:
        write_readme(table, args.limit)


if __name__ == "__main__":
    sys.exit(main())
