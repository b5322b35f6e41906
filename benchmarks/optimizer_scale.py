"""How the optimizer scales, keys only (no data is made): three tables for
benchmarks/README.md.

1. Matmul at 8, 64, 512 and 4096 simulated sites for the square, common-large-dim and
   two-large-dims shapes: the chosen plan's floats moved against the communication
   lower bound for C = A·B (Al Daas, Ballard et al. 2022; `tra_dask.optimizer.bounds`)
   times the sites, and the planner's time.  Block grids: each dim gets about
   2·P^(1/3)·dim/(m·k·n)^(1/3) blocks (a power of two), so the bound's ideal grid is
   expressible.
2. Planner time vs input tuples: a square multiply on 8 sites with 1e2 … 1e5 tuples
   per input.
3. Planner time vs program size: chains of 2 … 8 multiplies on 8 sites.

    python benchmarks/optimizer_scale.py [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys
import time

import tra_dask as td
from _report import write_section
from tra_dask.optimizer.bounds import matmul_lower_bound
from tra_dask.programs import matmul

SHAPES = {"square": (16_384, 16_384, 16_384), "common-large-dim": (10_000, 640_000, 10_000),
          "two-large-dims": (80_000, 10_000, 80_000)}


class NoData:
    def __call__(self, key):
        raise AssertionError("planning must not load data")


def src(shape, blocks, name):
    return td.from_function(NoData(), shape, tuple(-(-n // b) for n, b in zip(shape, blocks)), "float64", name=name)


def _pow2(x: float) -> int:
    return 2 ** max(0, round(math.log2(max(x, 1.0))))


def grid_blocks(shape, P):
    m, k, n = shape
    gm, c = (m * k * n) ** (1 / 3), P ** (1 / 3)
    return tuple(min(_pow2(2 * c * d / gm), 1024) for d in shape)


def bound_rows(sites):
    for P in sites:
        for name, (m, k, n) in SHAPES.items():
            b = grid_blocks((m, k, n), P)
            t0 = time.perf_counter()
            plan = td.optimize(matmul(src((m, k), b[:2], "A"), src((k, n), b[1:], "B")), sites=P, objective="bytes")
            dt = time.perf_counter() - t0
            bound = matmul_lower_bound(m, k, n, P) * P
            row = (P, name, "x".join(map(str, b)), plan.cost.floats_moved, bound, plan.cost.floats_moved / bound,
                   plan.cost.flops_balance, dt, "; ".join(dict.fromkeys(plan.strategies())))
            print(f"{P:>5} sites {name:<17} blocks {row[2]:<10} moved {row[3]:.3e} bound {bound:.3e} "
                  f"ratio {row[5]:.2f} balance {row[6]:.2f}  {dt:6.2f} s  [{row[8]}]", flush=True)
            yield row


def tuple_rows(sizes, full_up_to=100):
    """Optimize a square multiply of n x n blocks per input on 8 sites; up to
    ``full_up_to`` blocks also with the sketch off (the full search), to compare."""
    for n in sizes:  # n x n blocks per input: n^2 tuples
        A, B = src((100 * n, 100 * n), (n, n), "A"), src((100 * n, 100 * n), (n, n), "B")
        expr = matmul(A, B)
        t0 = time.perf_counter()
        plan = td.optimize(expr, sites=8, objective="bytes")
        dt = time.perf_counter() - t0
        sk = plan.search.sketch
        full_dt = full_moved = None
        if sk is not None and n <= full_up_to:
            t0 = time.perf_counter()
            full_moved = td.optimize(expr, sites=8, sketch=False, objective="bytes").cost.floats_moved
            full_dt = time.perf_counter() - t0
        how = "full" if sk is None else f"sketch, blocks/{sk['factor']:.2f}, {sk['replayed']} replayed"
        print(f"matmul {n}x{n} blocks ({n * n} tuples per input, {n ** 3} join tuples), 8 sites: {dt:.2f} s "
              f"[{how}] moved {plan.cost.floats_moved:.3e}"
              + (f"; full search {full_dt:.2f} s moved {full_moved:.3e}" if full_dt is not None else ""), flush=True)
        yield n * n, n ** 3, dt, plan.cost.floats_moved, how, full_dt, full_moved


def chain_rows(lengths):
    for L in lengths:
        mats = [src((400, 400), (4, 4), f"M{i}") for i in range(L + 1)]
        expr = mats[0]
        for m in mats[1:]:
            expr = matmul(expr, m)
        t0 = time.perf_counter()
        plan = td.optimize(expr, sites=8, objective="bytes")
        dt = time.perf_counter() - t0
        print(f"chain of {L} multiplies (4x4 blocks each), 8 sites: {dt:.2f} s, {len(plan.nodes)} plan nodes", flush=True)
        yield L, len(plan.nodes), dt, plan.search.truncated


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes only (a smoke test)")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    sites = (8, 64) if args.quick else (8, 64, 512, 4096)
    bounds = list(bound_rows(sites))
    tuples = list(tuple_rows((10, 32, 50) if args.quick else (10, 32, 100, 316)))
    chains = list(chain_rows((2, 3) if args.quick else (2, 3, 4, 6, 8)))
    if args.write and not args.quick:
        write_readme(bounds, tuples, chains)


def write_readme(bounds, tuples, chains):
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    head = (f"`python benchmarks/optimizer_scale.py` — {stamp}, {platform.node()} ({platform.machine()}, "
            f"{os.cpu_count()} cores), python {platform.python_version()}. Keys only, cost model `\"exact\"`, "
            "objective `\"bytes\"`, default beam; one run each (the machine is shared: times are rough).")
    lines = [head, "", "Matmul vs the communication lower bound (floats every site must receive beyond what it "
             "owns, times the sites; a plan whose work is balanced cannot move less). Target: ≤ 1.3× the bound, "
             "planner < 10 s at 4096 sites.", "",
             "| sites | shape | blocks (i×k×j) | floats moved | lower bound | ratio | flops balance | plan (s) | strategy |",
             "|---:|---|---|---:|---:|---:|---:|---:|---|"]
    for P, name, b, moved, bound, ratio, bal, dt, strat in bounds:
        lines.append(f"| {P} | {name} | {b} | {moved:.3e} | {bound:.3e} | {ratio:.2f} | {bal:.2f} | {dt:.2f} | {strat} |")
    lines += ["", "Planner time vs input tuples (square multiply, 8 sites). Target: < 5 s at 1e4 tuples, < 60 s at 1e5. "
              "Above 4·10⁴ join tuples the search runs on a sketch (fewer blocks, same chunks) and replays its best "
              "plans at full size (README: the optimizer, precisely); the full search is run too where it fits, to "
              "compare.", "",
              "| tuples per input | join tuples | optimize (s) | planned | floats moved | full search (s) | "
              "full search floats moved |", "|---:|---:|---:|---|---:|---:|---:|"]
    for t, j, dt, moved, how, fdt, fmoved in tuples:
        lines.append(f"| {t:,} | {j:,} | {dt:.2f} | {how} | {moved:.3e} | "
                     + (f"{fdt:.2f} | {fmoved:.3e} |" if fdt is not None else "- | - |"))
    lines += ["", "Before issue 10 (same machine): 0.36 s at 1e2, 15.6 s at 1e3, 146 s at 1e4 tuples."]
    lines += ["", "Planner time vs program size (chains of multiplies, 400² matrices in 4×4 blocks, 8 sites).", "",
              "| multiplies | plan nodes | optimize (s) | budget exhausted |", "|---:|---:|---:|---|"]
    lines += [f"| {L} | {n} | {dt:.2f} | {'yes' if tr else 'no'} |" for L, n, dt, tr in chains]
    write_section("optimizer scale", lines)


if __name__ == "__main__":
    sys.exit(main())
