"""A loop of submissions over persisted dask arrays, Dask's defaults (the Active Memory
Manager on): per step, the seconds `td.submit` took before the run, whether the step
searched for a plan again (the plan cache missed), and how many input blocks had moved
to another worker since the step before.

    python benchmarks/dask_input_loop.py [--workers 4] [--n 2048] [--chunk 256] [--steps 6]

The steps run back to back, as a training loop's do (the manager's cycle, every 2 s,
falls where it falls); ``--pause`` seconds between them gives it time to act on each.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--pause", type=float, default=0.0)
    args = p.parse_args()

    import dask.array as da
    from distributed import Client, LocalCluster, futures_of, wait

    import tra_dask as td
    from tra_dask.runtime.cluster import _who_has
    from tra_dask.runtime.submit import _plan_cache

    with LocalCluster(processes=True, n_workers=args.workers, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers)
        td.set_cluster_spec(client, td.ClusterSpec(args.workers))  # (no calibration: planning is measured)
        print("memory manager running:", client.amm.running(), flush=True)
        rng = np.random.default_rng(0)
        a = da.from_array(rng.random((args.n, args.n)), chunks=args.chunk).persist()
        b = da.from_array(rng.random((args.n, args.n)), chunks=args.chunk).persist()
        wait([a, b])
        keys = [f.key for f in futures_of([a, b])]
        cache = _plan_cache(client)
        before = _who_has(client, keys)
        searched = moved_steps = 0
        start = time.perf_counter()
        for i in range(args.steps):
            misses = cache.misses
            t0 = time.perf_counter()
            rf = td.submit(td.einsum("ij,jk->ik", a, b), client=client)
            t1 = time.perf_counter()
            wait(rf)
            time.sleep(args.pause)
            after = _who_has(client, keys)
            moved = sum(set(after.get(k, ())) != set(before.get(k, ())) for k in keys)
            copies = sum(len(w) > 1 for w in after.values())
            again = cache.misses > misses
            if i:
                searched += again
                moved_steps += moved > 0
            print(f"step {i}: submit {t1 - t0:.3f} s, {'searched' if again else 'plan reused'}, "
                  f"{moved} of {len(keys)} blocks moved, {copies} with copies", flush=True)
            before = after
        print(f"{args.workers} workers: {searched} of {args.steps - 1} later steps searched again, "
              f"inputs moved in {moved_steps}; {time.perf_counter() - start:.2f} s in all")


if __name__ == "__main__":
    main()
