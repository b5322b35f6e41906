"""The result's way to the client: ``td.compute`` of ``ij,jk->ik`` with a 4200x280 and
b 280x4200 float64 (issue 43) on a 2-worker LocalCluster (processes, 127.0.0.1).

For each chunking of the result (2 row blocks, 2 column blocks, a 2x2 grid, 1 block),
the result path alone — after the plan ran, gather the chunks and assemble one array —
two ways, interleaved on one cluster: tra_dask's (``ArrayFutures.assembled()``:
fetched from the workers, a one-chunk result not copied) and Dask's default
(``client.gather``, through the scheduler, then assembled): wall seconds and this
process's CPU seconds (the client and, with a LocalCluster, the scheduler); then
``td.compute`` end to end for the automatic chunking and the hand 2100-grid.

    python benchmarks/result_path.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import numpy as np
from distributed import Client, LocalCluster

import tra_dask as td
from tra_dask.logical.evaluate import assemble


def _timed(fn):
    w, p = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - p


def _row(name, w, p):
    return (f"| {name} | {min(w):.3f} | {statistics.median(w):.3f} | {min(p):.3f} | "
            f"{statistics.median(p):.3f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    with LocalCluster(processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cl, Client(cl) as c:
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((4200, 280)), rng.standard_normal((280, 4200))
        ref = a @ b
        cuts = {"2 row blocks": ((2100, 280), (280, 4200)), "2 column blocks": ((4200, 280), (280, 2100)),
                "2x2 grid": ((2100, 280), (280, 2100)), "1 block": ((4200, 280), (280, 4200))}
        rfs = {k: td.submit(td.einsum("ij,jk->ik", td.from_array(a, chunks=ca), td.from_array(b, chunks=cb))).wait()
               for k, (ca, cb) in cuts.items()}

        def dask_default(rf):
            got = c.gather(dict(rf))
            return assemble(got, rf._extents, rf.dtype)

        ways = {"tra_dask": lambda rf: rf.assembled(), "client.gather + assemble": dask_default}
        times = {(k, w): ([], []) for k in rfs for w in ways}
        for _ in range(args.repeat):
            for k, rf in rfs.items():
                for w, fn in ways.items():
                    dt = _timed(lambda: fn(rf))
                    times[(k, w)][0].append(dt[0])
                    times[(k, w)][1].append(dt[1])
        print("| result path (gather + assemble) | wall min (s) | wall median (s) | client CPU min (s) | "
              "client CPU median (s) |\n|---|---|---|---|---|")
        for (k, w), (wall, cpu) in times.items():
            print(_row(f"{k}, {w}", wall, cpu))

        xs = {"auto": td.einsum("ij,jk->ik", td.asarray(a), td.asarray(b)),
              "hand 2100-grid": td.einsum("ij,jk->ik", td.from_array(a, chunks=(2100, 280)),
                                          td.from_array(b, chunks=(280, 2100)))}
        for x in xs.values():
            np.testing.assert_allclose(td.compute(x), ref, rtol=1e-10, atol=1e-9)
        comp = {k: ([], []) for k in xs}
        for _ in range(args.repeat):
            for k, x in xs.items():
                dt = _timed(lambda: td.compute(x))
                comp[k][0].append(dt[0])
                comp[k][1].append(dt[1])
        print("\n| td.compute | wall min (s) | wall median (s) | client CPU min (s) | client CPU median (s) |\n"
              "|---|---|---|---|---|")
        for k, (wall, cpu) in comp.items():
            print(_row(k, wall, cpu))


if __name__ == "__main__":
    main()
