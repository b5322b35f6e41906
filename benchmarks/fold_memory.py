"""Does a fold that makes its fused partial products one at a time hold less?

A contraction over many chunks along the summed index (``ij,jk->ik``, 1000 x 50000 @
50000 x 1000 float64, 100 chunks along j, the shape of dask issue 10053 at half
size), numpy inputs, chunks given, 3 workers: the plan co-partitions the chunks
(CMM), and each site's ~33 partial products (8 MB each) are fused into the fold
that sums them.  Run with the fold making them one at a time (the default) and
with all made before the fold (``tra-dask.fold-one-at-a-time: False``),
interleaved (each round starting with the other one): wall time and the largest
rise of any worker's resident memory during the run (sampled every 10 ms), each run
starting from workers that handed their freed memory back (glibc ``malloc_trim``),
so that memory an earlier run left in an allocator does not hide a rise.

    python benchmarks/fold_memory.py [--repeat 3] [--no-write]
"""

from __future__ import annotations

import argparse
import statistics

import dask
import numpy as np

import tra_dask as td
from _harness import LoadWatch, machine_line, start_cluster
from auto_chunking import PeakRSS


def _trim():
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-write", dest="write", action="store_false")
    args = ap.parse_args(argv)
    client = start_cluster(3)
    try:
        td.cluster_spec(client)
        n, k, nc = 1000, 50_000, 100
        rng = np.random.default_rng(1)
        a, b = rng.random((n, k)), rng.random((k, n))
        plan = td.einsum("ij,jk->ik", a, b, chunks={"j": k // nc}).plan(client)
        got = {True: [], False: []}
        for rep in range(args.repeat + 1):  # the first round warms the scatter cache and is not kept
            for defer in ((True, False) if rep % 2 else (False, True)):
                with dask.config.set({"tra-dask.fold-one-at-a-time": defer}):
                    client.run(_trim)
                    with PeakRSS(client) as mem, LoadWatch(None) as w:
                        rf = td.submit(plan, client=client)
                        rf.wait()
                    if rep:
                        got[defer].append((w.wall, mem.growth))
                    check = rf.to_numpy()[:2, :2] if rep == 1 else None
                    del rf
                    if check is not None:
                        assert np.allclose(check, a[:2] @ b[:, :2])
        lines = [f"Machine: {machine_line(argparse.Namespace(sites=3))}", "",
                 f"`ij,jk->ik`, {n}x{k} @ {k}x{n} float64, {nc} chunks along j (given), numpy inputs, 3 workers; "
                 f"plan: {plan.explain().splitlines()[4].strip()}; {args.repeat} interleaved runs after one "
                 f"untimed round, each from workers that returned their freed memory (malloc_trim).", "",
                 "| fold | wall min (s) | wall median (s) | peak worker RSS growth, max of runs (MiB) |",
                 "|---|---|---|---|"]
        for defer, label in ((True, "partial products made one at a time (default)"),
                             (False, "all partial products made before the fold")):
            walls = [x for x, _ in got[defer]]
            lines.append(f"| {label} | {min(walls):.3f} | {statistics.median(walls):.3f} | "
                         f"{max(g for _, g in got[defer]) / 2**20:.0f} |")
        print("\n".join(lines))
        if args.write:
            from _report import write_section

            write_section("fold memory", lines)
    finally:
        client.close()


if __name__ == "__main__":
    main()
