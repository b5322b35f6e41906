"""Re-cuts side by side: tra_dask (the re-cut inside its plan) against dask.array (its
own rechunk and slicing) and numpy, on persisted dask inputs.

Workloads: a product of slices off the blocks' boundaries, a reversed and strided
slice summed, a take of rows then a product, a roll added to its input, and an
einsum over inputs whose chunks the chunk choice changes.  Per system: best and median
wall seconds of ``--repeat`` runs over fresh copies of the inputs where they lie
(tra_dask: submit and wait; dask.array: persist and wait; numpy: one process), bytes moved between workers (tra_dask: measured and
predicted), tasks, and tra_dask's planning seconds (first plan; the same structure
again).  Writes the section "re-cuts" of benchmarks/README.md.

    python benchmarks/recut.py [--sites 2] [--scale 1] [--repeat 3] [--quick] [--no-write]
"""

from __future__ import annotations

import time

import dask.array as da
import numpy as np

import tra_dask as td
from _harness import fmt_mib, machine_line, parser, start_cluster, time_dask, time_local, time_tra, twins
from _report import write_section


def workloads(n: int):
    """``name -> (tra_dask expression of X, Y; dask.array of X, Y; numpy of x, y)``."""
    idx = np.random.default_rng(0).permutation(n)[: n // 2]
    lo, hi = n // 10 + 3, n - n // 10 - 5
    return {
        "X[a:b] @ Y[a:b] (off the blocks)": (lambda X, Y: td.from_array(X)[lo:hi] @ td.from_array(Y)[lo:hi].T,
                                             lambda X, Y: X[lo:hi] @ Y[lo:hi].T, lambda x, y: x[lo:hi] @ y[lo:hi].T),
        "X[::-1, ::3].sum(0)": (lambda X, Y: td.from_array(X)[::-1, ::3].sum(axis=0),
                                lambda X, Y: X[::-1, ::3].sum(axis=0), lambda x, y: x[::-1, ::3].sum(axis=0)),
        "X[idx] @ Y.T (take)": (lambda X, Y: td.from_array(X)[idx] @ td.from_array(Y).T,
                                lambda X, Y: X[idx] @ Y.T, lambda x, y: x[idx] @ y.T),
        "roll(X, n/3) + X": (lambda X, Y: np.roll(td.from_array(X), n // 3, axis=0) + td.from_array(X),
                             lambda X, Y: da.roll(X, n // 3, axis=0) + X, lambda x, y: np.roll(x, n // 3, axis=0) + x),
        "einsum ij,kj->ik (re-chunked)": (lambda X, Y: td.einsum("ij,kj->ik", X, Y),
                                          lambda X, Y: da.einsum("ij,kj->ik", X, Y),
                                          lambda x, y: np.einsum("ij,kj->ik", x, y, optimize=True)),
    }


def main(argv=None):
    p = parser(__doc__)
    args = p.parse_args(argv)
    n = max(64, int((512 if args.quick else 3000) * args.scale))
    repeat = 1 if args.quick else args.repeat
    blocks = (n // 3 + 7, n // 2 + 1)  # chunks no boundary of the slices falls on
    client = start_cluster(args.sites)
    lines = [f"Machine: {machine_line(args)}; X, Y {n}x{n} float64 in blocks of {blocks}.", "",
             "| workload | system | best s | median s | MiB moved | MiB predicted | tasks | planning s (first / again) "
             "| vs dask.array | vs numpy |", "|---|---|---|---|---|---|---|---|---|---|"]
    try:
        rng = da.random.default_rng(1)
        X = client.persist(rng.random((n, n), chunks=blocks))
        Y = client.persist(rng.random((n, n), chunks=blocks))
        x, y = X.compute(), Y.compute()
        for name, (tra, dsk, npy) in workloads(n).items():
            timings = {}

            def make_plan(tra=tra):  # over fresh copies of the inputs, where the originals are
                Xt, Yt = twins(client, [X, Y])
                t0 = time.perf_counter()
                plan = tra(Xt, Yt).plan(client)
                timings.setdefault("first", time.perf_counter() - t0)
                timings["again"] = time.perf_counter() - t0
                return plan

            t = time_tra(client, make_plan, repeat)
            got = t["rf"].to_numpy()
            want = npy(x, y)
            assert np.allclose(got, want), name
            d = time_dask(client, lambda dsk=dsk: dsk(*twins(client, [X, Y])), repeat)
            loc = time_local(lambda npy=npy: npy(x, y), repeat)
            plan_s = f"{timings['first']:.2f} / {timings['again']:.2f}"
            lines.append(f"| {name} | tra_dask | {t['best']:.3f} | {t['median']:.3f} | {fmt_mib(t['moved'])} | "
                         f"{fmt_mib(t['predicted'])} | {t['tasks']} | {plan_s} | {t['best'] / d['best']:.2f} | "
                         f"{t['best'] / loc['best']:.2f} |")
            lines.append(f"| {name} | dask.array | {d['best']:.3f} | {d['median']:.3f} | {fmt_mib(d['moved'])} | - | "
                         f"{d['tasks']} | - | 1.00 | {d['best'] / loc['best']:.2f} |")
            lines.append(f"| {name} | numpy | {loc['best']:.3f} | {loc['median']:.3f} | - | - | - | - | "
                         f"{loc['best'] / d['best']:.2f} | 1.00 |")
            print("\n".join(lines[-3:]), flush=True)
    finally:
        client.close()
    if args.write and not args.quick:
        write_section("re-cuts", lines)


if __name__ == "__main__":
    main()
