"""Nearest neighbour in a Riemannian metric, tra_dask vs dask.array vs numpy vs torch.

The paper's two data sets at 1/10 of its sizes: "large" (N=150000 points, D=600) and
"wide" (N=600, D=10000): argmin_i (x_i - x_q) A (x_i - x_q)ᵀ (§6.2).  Inputs persisted
on a LocalCluster(2 workers × 1 thread) before timing, fresh for every repeat.

    python benchmarks/nearest_neighbor.py [--repeat 3] [--dtype float64 float32] [--quick]
"""

from __future__ import annotations

import itertools
import sys

import dask.array as da
import numpy as np

import tra_dask as td
from _harness import (Report, fresh_plan_maker, parser, plans_to_time, start_cluster, time_dask, time_local,
                      time_tra, torch_or_none)
from tra_dask.programs import nearest_neighbor

CASES = {"large": ((150_000, 600), (8, 2)), "wide": ((600, 10_000), (2, 8))}


def make_inputs(seed, dims, blocks, dtype):
    """The query q, the points X and the metric M as lazy dask arrays: ``dims`` (N, D)
    in ``blocks`` (blocks along N, D)."""
    (N, D), (bn, bd) = dims, blocks
    rng = da.random.default_rng(seed)
    c = lambda n, b: -(-n // b)  # noqa: E731
    X = rng.standard_normal((N, D), chunks=(c(N, bn), c(D, bd)), dtype=dtype)
    q = rng.standard_normal((D,), chunks=(c(D, bd),), dtype=dtype)
    M = rng.standard_normal((D, D), chunks=(c(D, bd), c(D, bd)), dtype=dtype) / float(np.sqrt(D))
    return [q, X, M]


def nn(xp, q, X, A):
    diff = X - q
    dist = ((diff @ A) * diff).sum(axis=1)
    i = xp.argmin(dist)
    return dist[i], i


def main(argv=None):
    args = parser(__doc__).parse_args(argv)
    if args.quick:
        args.scale, args.repeat, args.dtype, args.alternatives = 0.02, 1, args.dtype[:1], 1
    client = start_cluster(args.sites)
    torch = torch_or_none()
    seeds = itertools.count()
    report = Report(args)
    try:
        for case, (dims, blocks) in list(CASES.items())[:1 if args.quick else None]:  # --quick: the large case only
            N, D = (max(4, int(d * args.scale)) for d in dims)
            for dtype in args.dtype:
                def inputs():
                    return client.persist(make_inputs(next(seeds), (N, D), blocks, dtype))

                def expr():
                    q, X, M = inputs()
                    return nearest_neighbor(*(td.from_dask_array(x, client=client, name=nm)
                                              for x, nm in zip((q, X, M), ("xq", "X", "A"))))

                plan = td.plan_for(expr(), client)
                results = []
                for index, name in plans_to_time(plan, args.alternatives):
                    r = time_tra(client, fresh_plan_maker(client, expr, index, name.split(': ', 1)[1]), args.repeat)
                    srcs = {n.source.name: client.compute(n.source.keeper[0]).result()
                            for n in r["rf"].plan.nodes if hasattr(n, "source") and n.source.name in ("xq", "X", "A")}
                    value, index_ = r["rf"][()].result()
                    ref_value, ref_index = nn(np, srcs["xq"], srcs["X"], srcs["A"])
                    assert int(index_) == int(ref_index) and np.isclose(value, ref_value, rtol=1e-3), name
                    r["rf"] = None
                    results.append((name, r))
                results.append(("dask.array", time_dask(client, lambda: da.stack(nn(da, *inputs())), args.repeat)))
                q, X, M = (client.compute(x).result() for x in inputs())
                results.append(("numpy", time_local(lambda: nn(np, q, X, M), args.repeat)))
                if torch is not None:
                    tq, tX, tM = (torch.from_numpy(x) for x in (q, X, M))
                    results.append(("torch", time_local(lambda: nn(torch, tq, tX, tM), args.repeat)))
                label = f"{case} N={N} D={D}"
                report.add(label, dtype, results)
    finally:
        client.close()
    report.write("nearest neighbour", "nearest_neighbor.py")


if __name__ == "__main__":
    sys.exit(main())
