"""One FFNN SGD step, tra_dask vs dask.array vs numpy vs torch, in one run.

The paper's two networks at 1/10 of its sizes: speech-like (N=10000, D=1600, H=10000,
L=10) and extreme classification (N=1000, D=59754, H=1000, L=14588); ReLU hidden
layer, softmax, mean cross-entropy, one step of SGD (§6.3).  Inputs persisted on a
LocalCluster(2 workers × 1 thread) before timing, fresh for every repeat.

    python benchmarks/ffnn.py [--repeat 3] [--dtype float32 float64] [--quick]
"""

from __future__ import annotations

import itertools
import sys

import dask.array as da
import numpy as np

import tra_dask as td
from _harness import (Report, fresh_plan_maker, parser, plans_to_time, start_cluster, time_dask, time_local,
                      time_tra, torch_or_none)
from tra_dask.programs import ffnn_sgd_step

CASES = {"speech": ((10_000, 1600, 10_000, 10), (4, 2, 4, 1)), "xml": ((1000, 59_754, 1000, 14_588), (2, 4, 2, 4))}
LR = 0.1


def make_inputs(seed, dims, blocks, dtype):
    """X, one-hot Y, W1, W2 as lazy dask arrays: ``dims`` (N, D, H, L) in ``blocks``
    (blocks along N, D, H, L)."""
    N, D, H, L = dims
    bn, bd, bh, bl = blocks
    rng = da.random.default_rng(seed)
    c = lambda n, b: -(-n // b)  # noqa: E731
    X = rng.standard_normal((N, D), chunks=(c(N, bn), c(D, bd)), dtype=dtype)
    labels = rng.integers(0, L, N, chunks=c(N, bn))
    Y = (labels[:, None] == da.arange(L, chunks=c(L, bl))[None, :]).astype(dtype)
    W1 = rng.standard_normal((D, H), chunks=(c(D, bd), c(H, bh)), dtype=dtype) * 0.01
    W2 = rng.standard_normal((H, L), chunks=(c(H, bh), c(L, bl)), dtype=dtype) * 0.01
    return [X, Y, W1, W2]


def step(xp, X, Y, W1, W2, n):
    """The same step in numpy or dask.array (the natural code)."""
    Z1 = X @ W1
    A1 = xp.maximum(Z1, 0)
    Z2 = A1 @ W2
    E = xp.exp(Z2 - Z2.max(axis=1, keepdims=True))
    P = E / E.sum(axis=1, keepdims=True)
    dZ2 = (P - Y) / n
    dW2 = A1.T @ dZ2
    dA1 = dZ2 @ W2.T
    dZ1 = dA1 * (Z1 > 0)
    dW1 = X.T @ dZ1
    return W1 - LR * dW1, W2 - LR * dW2


def torch_step(torch, X, Y, W1, W2, n):
    Z1 = X @ W1
    A1 = Z1.clamp(min=0)
    P = torch.softmax(A1 @ W2, dim=1)
    dZ2 = (P - Y) / n
    dW2 = A1.T @ dZ2
    dZ1 = (dZ2 @ W2.T) * (Z1 > 0)
    dW1 = X.T @ dZ1
    return W1 - LR * dW1, W2 - LR * dW2


def main(argv=None):
    p = parser(__doc__)
    p.set_defaults(dtype=["float32", "float64"])
    args = p.parse_args(argv)
    if args.quick:
        args.scale, args.repeat, args.dtype, args.alternatives = 0.05, 1, args.dtype[:1], 0
    client = start_cluster(args.sites)
    torch = torch_or_none()
    seeds = itertools.count()
    report = Report(args)
    try:
        for case, (dims, blocks) in list(CASES.items())[:1 if args.quick else None]:  # --quick: speech only
            N, D, H, L = (max(2, int(d * args.scale)) for d in dims)
            if args.quick:  # (a smoke test: half the blocks per dim, a search a few times smaller)
                blocks = tuple(max(1, b // 2) for b in blocks)
            for dtype in args.dtype:
                def inputs():
                    return client.persist(make_inputs(next(seeds), (N, D, H, L), blocks, dtype))

                def expr():
                    X, Y, W1, W2 = inputs()
                    rel = [td.from_dask_array(x, client=client, name=nm) for x, nm in zip((X, Y, W1, W2), ("X", "Y", "W1", "W2"))]
                    return ffnn_sgd_step(*rel, LR)

                plan = td.plan_for(expr(), client)
                results = []
                for index, name in plans_to_time(plan, args.alternatives):
                    r = time_tra(client, fresh_plan_maker(client, expr, index, name.split(': ', 1)[1]), args.repeat)
                    srcs = {n.source.name: client.compute(n.source.keeper[0]).result()
                            for n in r["rf"][0].plan.nodes if hasattr(n, "source") and n.source.name in ("X", "Y", "W1", "W2")}
                    ref1, ref2 = step(np, srcs["X"], srcs["Y"], srcs["W1"], srcs["W2"], N)
                    got1 = r["rf"][0][(0, 0)].result()
                    assert np.allclose(got1, ref1[: got1.shape[0], : got1.shape[1]], rtol=1e-3, atol=1e-5), name
                    r["rf"] = None
                    results.append((name, r))
                results.append(("dask.array", time_dask(client, lambda: step(da, *inputs(), N), args.repeat)))
                X, Y, W1, W2 = (client.compute(x).result() for x in inputs())
                results.append(("numpy", time_local(lambda: step(np, X, Y, W1, W2, N), args.repeat)))
                if torch is not None:
                    tX, tY, tW1, tW2 = (torch.from_numpy(x) for x in (X, Y, W1, W2))
                    results.append(("torch", time_local(lambda: torch_step(torch, tX, tY, tW1, tW2, N), args.repeat)))
                label = f"{case} N={N} D={D} H={H} L={L}"
                report.add(label, dtype, results)
    finally:
        client.close()
    report.write("ffnn", "ffnn.py")


if __name__ == "__main__":
    sys.exit(main())
