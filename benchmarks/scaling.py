"""Strong scaling: tra_dask on W single-threaded workers against dask.array (its
default chunks and its best of a few hand-chosen chunkings) on the same workers and
numpy on all the host's cores, in one run.

Workloads (``--n`` sizes them; float64): the three matmul shapes of the paper
(general n x n x n; common-large-dim n/4 x 4n x n/4; two-large-dims 3n/2 x n/8 x
3n/2), a contraction with four indices per operand (``abcd,bdce->ace``) and the FFNN
SGD step (:func:`tra_dask.programs.ffnn_sgd_step_array`; dask runs the same code).

For each W a LocalCluster(processes=True, W workers x 1 thread) on 127.0.0.1,
calibrated before the clock starts.  What is timed is each workload with its inputs
already on the workers: tra_dask's second submission of the same expression over the
same numpy arrays (the first sends the chunks and chooses the chunking; the second
finds both, as a training loop's next step does), dask's ``.persist()`` over arrays
persisted at each chunking (a fresh name per run), numpy in this process.  Best of
--repeat.  Parallel efficiency is T(1 worker) / (W x T(W workers)).  Each tra_dask
result is checked against numpy once per W.  Also printed: the first submission's
planning time (the plan's stages), the bytes the timed submission moved between
workers (measured) and the plan's predicted seconds.

    python benchmarks/scaling.py [--n 4096] [--workers 1 2 4 8 16] [--repeat 2]
        [--workloads general ...] [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))


def workloads(n: int, rng) -> dict:
    """``{name: (numpy inputs, their sizes)}``: n^3 multiply-adds for the
    general multiply, about n^3 / 4 for the other two shapes and n^3 / 2 for the FFNN
    step, n^3 / 8 for the contraction (its operands are the largest per flop)."""
    r = lambda *s: rng.random(s)  # noqa: E731
    q, e = max(n // 4, 1), max(n // 8, 1)
    c = max(int(round((n ** 3 / 2048) ** 0.2)), 2)  # abcd,bdce->ace: a = e = 16c, b = c = d = c
    N, D, H, L = n * 2, max(n // 4, 1), n // 2, 16
    labels = rng.integers(0, L, N)
    return {
        "general": ((r(n, n), r(n, n)), f"{n}x{n}x{n}"),
        "common-large-dim": ((r(q, 4 * n), r(4 * n, q)), f"{q}x{4 * n}x{q}"),
        "two-large-dims": ((r(3 * n // 2, e), r(e, 3 * n // 2)), f"{3 * n // 2}x{e}x{3 * n // 2}"),
        "abcd,bdce->ace": ((r(16 * c, c, c, c), r(c, c, c, 16 * c)), f"a=e={16 * c}, b=c=d={c}"),
        "ffnn": ((r(N, D), (labels[:, None] == np.arange(L)[None, :]).astype(float), r(D, H) * 0.01,
                  r(H, L) * 0.01), f"N={N} D={D} H={H} L={L}"),
    }


def functions(name: str):
    """(numpy function, dask.array function, tra_dask function) of a workload: the
    same code for the three where it can be."""
    import dask.array as da

    from ffnn import LR, step
    from tra_dask.programs import ffnn_sgd_step_array

    if name == "abcd,bdce->ace":
        # numpy and dask at their best: a contraction path (BLAS), not numpy's default loops
        return (lambda a, b: np.einsum(name, a, b, optimize=True), lambda a, b: da.einsum(name, a, b, optimize=True),
                lambda a, b: np.einsum(name, a, b))  # numpy's einsum on td arrays is td.einsum (it plans its own)
    if name == "ffnn":
        return (lambda X, Y, W1, W2: step(np, X, Y, W1, W2, X.shape[0]),
                lambda X, Y, W1, W2: step(da, X, Y, W1, W2, X.shape[0]),
                lambda X, Y, W1, W2: ffnn_sgd_step_array(X, Y, W1, W2, LR))
    return (lambda a, b: a @ b,) * 3


def _best(fn, repeat):
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def _hand_chunks(shape, b) -> tuple:
    """A hand chunking: each of an array's longest dims in b blocks, the others whole
    (a square matrix: b x b blocks; an index cut the same way in every operand here,
    so that dask need not unify the chunks)."""
    return tuple(-(-d // b) if d == max(shape) else d for d in shape)


def _outputs(x):
    return list(x) if isinstance(x, tuple) else [x]


def run_workers(W, cases, repeat, dask_blocks):
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import tra_dask as td

    out = {}
    with LocalCluster(processes=True, n_workers=W, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address=None, silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
        client.wait_for_workers(W)
        td.cluster_spec(client)  # calibrated before the clock starts (a cluster's first plan would)
        for name, (inputs, want, np_fn, da_fn, td_fn) in cases.items():
            r = {}

            def expr():
                return td_fn(*[td.from_array(a) for a in inputs])

            t0 = time.perf_counter()
            got = _outputs(td.submit(expr(), client=client))  # sends the chunks, chooses the chunking
            for g in got:
                g.wait()
            r["first"] = time.perf_counter() - t0
            stages = {s.name: s for s in got[0].plan.stages}
            chunking = stages.get("chunking")  # the chunk choice: it holds the other stages' time
            r["planning"] = chunking.seconds if chunking else sum(s.seconds for s in stages.values())
            r["chunking"] = chunking.note.split(";")[0] if chunking else "-"
            for g, w in zip(got, _outputs(want)):
                g = g.to_numpy()
                assert np.allclose(g, w, rtol=1e-9, atol=1e-9 * abs(w).max()), f"tra_dask's {name} is wrong"
            r["predicted"] = got[0].plan.cost.seconds
            del got
            moved = []

            def ours():
                res = _outputs(td.submit(expr(), client=client))
                for g in res:
                    g.wait()
                moved.append(sum(g.transfers() for g in res))

            r["td"] = _best(ours, repeat)
            r["bytes"] = min(moved)
            best, default = None, None
            for b in [None, *dask_blocks]:  # None: dask's default chunks
                arrs = [da.from_array(a) if b is None else da.from_array(a, chunks=_hand_chunks(a.shape, b))
                        for a in inputs]
                arrs = client.persist(arrs)
                wait(arrs)
                runs = iter(range(10 ** 6))

                def theirs():
                    k = next(runs)
                    first = arrs[0].map_blocks(lambda z: z, name=f"fresh-{name}-{b}-{k}")
                    y = client.persist(_outputs(da_fn(first, *arrs[1:])))
                    wait(y)
                    return y

                t = _best(theirs, repeat)
                if b is None:
                    default = t
                elif best is None or t < best[0]:
                    best = (t, b)
                client.cancel(arrs)
            r["dask"], r["dask_blocks"], r["dask_default"] = best[0], best[1], default
            out[name] = r
            print(f"  W={W} {name}: done", file=sys.stderr, flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--workers", type=int, nargs="+", default=None)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workloads", nargs="+", default=None, help="names (default: all)")
    p.add_argument("--dask-blocks", type=int, nargs="+", default=[2, 4, 8], help="blocks per dim tried for dask")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    cores = os.cpu_count() or 1
    workers = args.workers or [w for w in (1, 2, 4, 8, 16) if w <= cores]
    rng = np.random.default_rng(0)
    made = workloads(args.n, rng)
    names = args.workloads or list(made)
    cases, sizes, t_np = {}, {}, {}
    for name in names:
        inputs, size = made[name]
        np_fn, da_fn, td_fn = functions(name)
        want = np_fn(*inputs)
        t_np[name] = _best(lambda: np_fn(*inputs), args.repeat)
        cases[name] = (inputs, want, np_fn, da_fn, td_fn)
        sizes[name] = size
        print(f"{name} ({size}): numpy on {cores} cores {t_np[name]:.3f} s", flush=True)
    rows = []
    for W in workers:
        res = run_workers(W, cases, args.repeat, args.dask_blocks)
        rows.append((W, res))
        for name, r in res.items():
            eff = rows[0][1][name]["td"] / (W * r["td"]) if rows[0][0] == 1 else float("nan")
            print(f"W={W:2d} {name}: tra_dask {r['td']:.3f} s (first {r['first']:.2f} s, planning "
                  f"{r['planning']:.2f} s, predicted {r['predicted']:.3f} s, {r['bytes'] / 1e6:.0f} MB moved, "
                  f"{r['chunking']}), efficiency {eff:.0%}; dask default {r['dask_default']:.3f} s, best "
                  f"{r['dask']:.3f} s ({r['dask_blocks']} blocks/dim); tra_dask/dask best "
                  f"{r['td'] / r['dask']:.2f}, tra_dask/numpy {r['td'] / t_np[name]:.2f}", flush=True)
    if args.write:
        from _report import write_section

        lines = [f"benchmarks/scaling.py, {datetime.date.today()}, {platform.node()}, {cores} cores; float64, "
                 f"best of {args.repeat}; W single-threaded workers of one LocalCluster(processes=True)", "",
                 "| workload | workers | tra_dask s | efficiency | predicted s | planning s | MB moved | "
                 "dask default s | dask best s (blocks/dim) | tra_dask / dask best | numpy s | tra_dask / numpy |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name in names:
            t1 = rows[0][1][name]["td"] if rows[0][0] == 1 else None
            for W, res in rows:
                r = res[name]
                eff = f"{t1 / (W * r['td']):.0%}" if t1 else "-"
                lines.append(f"| {name} ({sizes[name]}) | {W} | {r['td']:.3f} | {eff} | {r['predicted']:.3f} | "
                             f"{r['planning']:.2f} | {r['bytes'] / 1e6:.0f} | {r['dask_default']:.3f} | "
                             f"{r['dask']:.3f} ({r['dask_blocks']}) | {r['td'] / r['dask']:.2f} | "
                             f"{t_np[name]:.3f} | {r['td'] / t_np[name]:.2f} |")
        write_section(f"Scaling ({platform.node()}, {cores} cores)", lines)


if __name__ == "__main__":
    main()
