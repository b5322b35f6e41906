"""Matrix multiply, tra_dask vs dask.array vs numpy vs torch, in one run.

The paper's three shapes at 1/10 of its sizes (general 4000³; common large dim
1000×64000×1000; two large dims 8000×1000×8000), inputs as dask arrays persisted on a
LocalCluster(2 workers × 1 thread) before timing (fresh inputs for every repeat, so
no run profits from copies an earlier one left behind).  tra_dask runs the
optimizer's plan and the alternatives it considered (so "chosen vs fastest measured"
is visible); dask.array runs ``a @ b`` on the same chunks.

    python benchmarks/matmul.py [--repeat 3] [--dtype float64 float32] [--quick]
"""

from __future__ import annotations

import itertools
import sys

import dask.array as da
import numpy as np

import tra_dask as td
from _harness import (Report, fresh_plan_maker, own_placement_maker, parser, plans_to_time, start_cluster,
                      time_dask, time_local, time_tra, torch_or_none)
from tra_dask.programs import matmul, random_uniform

SHAPES = {"general": (4000, 4000, 4000), "common-large-dim": (1000, 64000, 1000), "two-large-dims": (8000, 1000, 8000)}
BLOCKS = {"general": (4, 4, 4), "common-large-dim": (1, 8, 1), "two-large-dims": (4, 1, 4)}


def check_block(rf, dtype, name):
    """Output block (0, 0) against numpy on the input chunks it reads."""
    srcs = {n.source.name: n.source for n in rf.plan.nodes if hasattr(n, "source")}
    a_src, b_src = srcs["A"], srcs["B"]
    got = rf[(0, 0)].result()
    ref = sum(a_src.load((0, k)) @ b_src.load((k, 0)) for k in range(a_src.type.frontier[1]))
    tol = (1e-4 if dtype == "float32" else 1e-10) * float(np.abs(ref).max()) * np.sqrt(a_src.type.frontier[1])
    assert np.allclose(got, ref, rtol=0, atol=tol), name


def main(argv=None):
    args = parser(__doc__).parse_args(argv)
    if args.quick:
        args.scale, args.repeat, args.dtype, args.alternatives = 0.1, 1, args.dtype[:1], 2
    client = start_cluster(args.sites)
    torch = torch_or_none()
    seeds = itertools.count()
    report = Report(args)
    try:
        for shape, dims in list(SHAPES.items())[:1 if args.quick else None]:  # --quick: the general shape only
            I, K, J = (max(1, int(d * args.scale)) for d in dims)
            bi, bk, bj = BLOCKS[shape]
            for dtype in args.dtype:
                def inputs():
                    rng = da.random.default_rng(next(seeds))
                    a = client.persist(rng.random((I, K), chunks=(-(-I // bi), -(-K // bk)), dtype=dtype))
                    b = client.persist(rng.random((K, J), chunks=(-(-K // bk), -(-J // bj)), dtype=dtype))
                    return a, b

                def expr():
                    a, b = inputs()
                    return matmul(td.from_dask_array(a, client=client, name="A"),
                                  td.from_dask_array(b, client=client, name="B"))

                def free_expr():
                    s = next(seeds)
                    return matmul(random_uniform((I, K), (-(-I // bi), -(-K // bk)), seed=s, dtype=dtype, name="A"),
                                  random_uniform((K, J), (-(-K // bk), -(-J // bj)), seed=s + 1, dtype=dtype, name="B"))

                plan = td.plan_for(expr(), client)
                runs = [(name, fresh_plan_maker(client, expr, index, name.split(': ', 1)[1])) for index, name in plans_to_time(plan, args.alternatives)]
                runs.insert(1, ("tra_dask chosen, inputs placed by tra_dask", own_placement_maker(client, free_expr)))
                results = []
                for name, make in runs:
                    r = time_tra(client, make, args.repeat)
                    check_block(r["rf"], dtype, name)
                    results.append((name, r))
                results.append(("dask.array", time_dask(client, lambda: (lambda ab: ab[0] @ ab[1])(inputs()), args.repeat)))
                a, b = inputs()
                an, bn = client.compute(a).result(), client.compute(b).result()
                results.append(("numpy", time_local(lambda: an @ bn, args.repeat)))
                if torch is not None:
                    ta, tb = torch.from_numpy(an), torch.from_numpy(bn)
                    results.append(("torch", time_local(lambda: ta @ tb, args.repeat)))
                case = f"{shape} {I}x{K}x{J}"
                report.add(case, dtype, results)
                client.cancel([a, b])
    finally:
        client.close()
    report.write("matmul", "matmul.py")


if __name__ == "__main__":
    sys.exit(main())
