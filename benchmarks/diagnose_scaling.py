"""What the chunk choice sees on W workers (a diagnostic for benchmarks/scaling.py): the
calibrated spec, the chunkings planned with their predicted seconds, and the measured
seconds of a few fixed chunkings of the same multiply.

    python benchmarks/diagnose_scaling.py [--n 6000] [--workers 16]
"""
import argparse
import logging
import time

import numpy as np


def main():
    import tra_dask as td
    from distributed import Client, LocalCluster

    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=6000)
    p.add_argument("--workers", type=int, default=16)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    A, B = rng.random((args.n, args.n)), rng.random((args.n, args.n))
    with LocalCluster(processes=True, n_workers=args.workers, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers)
        spec = td.calibrate(client)
        print(repr(spec), flush=True)
        x = td.from_array(A) @ td.from_array(B)
        plan = x.plan(client)
        print("chosen:", plan.stage("chunking").note, "predicted", plan.cost.seconds, flush=True)
        for blocks in (2, 4, 8):
            c = -(-args.n // blocks)
            y = td.from_array(A, chunks=(c, c)) @ td.from_array(B, chunks=(c, c))
            rf = td.submit(y, client=client)
            rf.wait()
            ts = []
            for _ in range(2):
                t0 = time.perf_counter()
                r = td.submit(td.from_array(A, chunks=(c, c)) @ td.from_array(B, chunks=(c, c)), client=client)
                r.wait()
                ts.append(time.perf_counter() - t0)
            print(f"{blocks}^3 blocks: predicted {rf.plan.cost.seconds:.3f} s, measured {min(ts):.3f} s, "
                  f"moved {rf.plan.cost.bytes_moved / 2**20:.0f} MiB, tasks {rf.plan.cost.tasks}", flush=True)
            print(rf.plan.explain()[:900], flush=True)


if __name__ == "__main__":
    main()
