"""The ``tra-dask`` command.

``tra-dask run matmul --shape general --scale 0.05 --sites 2`` builds the paper's
matrix multiply (§6.1) at ``scale`` times the paper's sizes, plans it, prints the
plan with its predicted cost, runs it on an embedded Dask cluster (or on
``--scheduler ADDRESS``) with a progress bar, checks sampled output blocks against
numpy, and prints the wall time, predicted vs measured bytes moved between workers,
and the dashboard link.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time

import numpy as np
from ._format import fmt_bytes as _fmt_bytes

# The paper's three matrix-multiply shapes (I, K, J), §6.1.
PAPER_SHAPES = {
    "general": (40_000, 40_000, 40_000),
    "common-large-dim": (10_000, 640_000, 10_000),
    "two-large-dims": (80_000, 10_000, 80_000),
}


def run_matmul(args) -> int:
    from distributed import Client, progress

    from . import compile as compiled_plan
    from . import optimize as optimized_plan
    from .programs import matmul, random_uniform
    from .runtime import embedded_client, submit, workers_info

    I, K, J = (max(1, round(d * args.scale)) for d in PAPER_SHAPES[args.shape])
    b = args.blocks
    chunks_a = (-(-I // b), -(-K // b))
    chunks_b = (-(-K // b), -(-J // b))
    A = random_uniform((I, K), chunks_a, seed=args.seed, dtype=args.dtype, name="A")
    B = random_uniform((K, J), chunks_b, seed=args.seed + 1, dtype=args.dtype, name="B")
    C = matmul(A, B)
    print(f"tra-dask run matmul --shape {args.shape} --scale {args.scale}: "
          f"A {I}x{K} @ B {K}x{J}, {args.dtype}, {b} blocks per dim, {args.sites} sites")
    print(f"  expression: {C!r}")

    t0 = time.perf_counter()
    if args.scheduler:
        client = Client(args.scheduler, timeout="30s")
        client.wait_for_workers(args.sites, timeout=60)
        where = f"scheduler {args.scheduler}"
    else:
        client = embedded_client(args.sites)
        where = "embedded LocalCluster on 127.0.0.1"
    print(f"  cluster: {where}, {len(workers_info(client))} workers "
          f"(ready in {time.perf_counter() - t0:.1f} s)")
    t1 = time.perf_counter()
    plan = compiled_plan(C, sites=args.sites) if args.compiled else optimized_plan(C, sites=args.sites)
    how = "the paper's compiled plan (--compiled)" if args.compiled else (
        f"optimized in {time.perf_counter() - t1:.2f} s from {len(plan.alternatives) + 1} plans considered")
    print(f"  plan: {how}")
    print("\n".join("    " + line for line in plan.explain().splitlines()))

    t0 = time.perf_counter()
    rf = submit(plan, client=client)
    if args.progress:
        progress(list(rf.values()), scheduler=client.scheduler.address)
        print()
    rf.wait()
    wall = time.perf_counter() - t0
    flops = 2.0 * I * K * J
    print(f"  ran {rf.lowered.ntasks} pinned tasks in {wall:.2f} s ({flops / wall / 1e9:.1f} GFLOP/s)")
    predicted, measured = rf.plan.cost.bytes_moved, rf.transfers()
    print(f"  bytes moved between workers: predicted {_fmt_bytes(predicted)}, measured {_fmt_bytes(measured)}")

    rng = np.random.default_rng(args.seed)
    keys = sorted(rf)
    sample = [keys[i] for i in rng.choice(len(keys), size=min(args.check, len(keys)), replace=False)]
    worst = 0.0
    for i, j in sample:
        got = rf[(i, j)].result()
        ref = sum(A.load((i, k)) @ B.load((k, j)) for k in range(A.frontier[1]))
        err = float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))
        worst = max(worst, err)
    tol = 1e-4 if np.dtype(args.dtype) == np.float32 else 1e-10
    ok = worst <= tol
    print(f"  check vs numpy on {len(sample)} sampled blocks {sample}: max relative error "
          f"{worst:.2e} (tolerance {tol:.0e}) -> {'OK' if ok else 'MISMATCH'}")
    print(f"  dashboard: {client.dashboard_link} (this plan: {rf.dashboard_link})")
    print(f"  machine: {platform.node()} {platform.machine()}, python {platform.python_version()}, "
          f"numpy {np.__version__}")
    if args.scheduler:
        client.close()
    return 0 if ok else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tra-dask", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one of the paper's workloads")
    wl = run.add_subparsers(dest="workload", required=True)
    mm = wl.add_parser("matmul", help="matrix multiply (paper §6.1)")
    mm.add_argument("--shape", choices=sorted(PAPER_SHAPES), default="general")
    mm.add_argument("--scale", type=float, default=0.05, help="fraction of the paper's sizes (default 0.05)")
    mm.add_argument("--blocks", type=int, default=4, help="chunks per matrix dim (default 4)")
    mm.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    mm.add_argument("--seed", type=int, default=0)
    mm.add_argument("--check", type=int, default=3, help="output blocks to check against numpy")
    mm.add_argument("--sites", type=int, default=2, help="sites = Dask workers (default 2)")
    mm.add_argument("--scheduler", default=None, help="address of a running dask scheduler (default: embedded cluster)")
    mm.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    mm.add_argument("--compiled", action="store_true", help="run the paper's compiled plan, not the optimizer's")
    args = p.parse_args(argv)
    if args.scale <= 0 or args.blocks <= 0 or args.sites <= 0:
        p.error("--scale, --blocks and --sites must be positive")
    return run_matmul(args)


if __name__ == "__main__":
    sys.exit(main())
