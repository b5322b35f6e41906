"""Does the chunking tra_dask chooses run as fast as the best one a person picks?

On a real LocalCluster (2, then 3 workers x 1 thread), calibrated once: for the
paper's matmul shapes, the FFNN SGD step and nearest neighbour, written with the
array front-end over numpy inputs, the plan with ``chunks="auto"`` runs
**interleaved** (each round starting one variant later) with the plans of at least 4 hand-chosen grids (block counts per
index; every input cut alike).  A run is: the plan's inputs scattered from this
process, every task, wait (results stay on the workers) — the same for all.
Planning is timed apart (the automatic chunking plans many candidates).

Then ``td.einsum`` against ``dask.array.einsum`` for a contraction with many chunks
along the contracted index (the shape of dask issue 10053), both over the same
persisted dask arrays: wall time and the peak resident memory of the busiest worker
(sampled every 10 ms).

    python benchmarks/auto_chunking.py [--repeat 5] [--scale 0.25] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time

import dask.array as da
import numpy as np
import psutil
from distributed import wait

import tra_dask as td
from _harness import LoadWatch, machine_line, start_cluster
from tra_dask.runtime.arrays import plan as plan_arrays
from tra_dask.programs import ffnn_sgd_step_array, nearest_neighbor_array

MATMUL = {"general": (4000, 4000, 4000), "common-large-dim": (1000, 64000, 1000), "two-large-dims": (8000, 1000, 8000)}


def _cut(x, letters, counts):
    return td.from_array(x, chunks=tuple(-(-n // counts.get(c, 1)) for n, c in zip(x.shape, letters)))


def cases(scale, p, dtype):
    """(name, inputs {name: (array, letters)}, build(**arrays) -> Array(s), grids [{letter: count}])."""
    rng = np.random.default_rng(0)
    for shape, dims in MATMUL.items():
        I, K, J = (max(8, int(d * scale)) for d in dims)
        inputs = {"A": (rng.random((I, K), dtype=dtype), "ik"), "B": (rng.random((K, J), dtype=dtype), "kj")}
        grids = [{"i": p}, {"k": p}, {"j": p}, {"i": p, "j": p}, {"i": p, "k": p, "j": p},
                 {"i": 2 * p, "k": 2 * p, "j": 2 * p}]
        yield f"matmul {shape} {I}x{K}x{J}", inputs, lambda A, B: A @ B, grids
    n, d, h, l = int(10_000 * scale), 1600, int(10_000 * scale), 10
    inputs = {"X": (rng.random((n, d), dtype=dtype), "nd"), "Y": (np.eye(l, dtype=dtype)[rng.integers(0, l, n)], "nl"),
              "W1": ((rng.random((d, h), dtype=dtype) - 0.5) * 0.1, "dh"),
              "W2": ((rng.random((h, l), dtype=dtype) - 0.5) * 0.1, "hl")}
    grids = [{"n": p}, {"h": p}, {"d": p}, {"n": p, "h": p}, {"n": 2 * p, "d": 2, "h": 2 * p}, {"n": 2 * p}]
    yield (f"ffnn step N={n} D={d} H={h}", inputs,
           lambda X, Y, W1, W2: ffnn_sgd_step_array(X, Y, W1, W2, 0.1), grids)
    N, D = int(150_000 * scale), 600
    A = rng.random((D, D), dtype=dtype)
    inputs = {"q": (rng.random(D, dtype=dtype), "d"), "X": (rng.random((N, D), dtype=dtype), "nd"),
              "A": ((A @ A.T).astype(dtype), "de")}
    grids = [{"n": p}, {"n": 2 * p}, {"n": 4 * p}, {"n": p, "d": 2, "e": 2}, {"d": p, "e": p}, {"n": 8 * p}]
    yield f"nearest neighbour N={N} D={D}", inputs, lambda q, X, A: nearest_neighbor_array(q, X, A), grids


def _plan(client, build, inputs, grid):
    arrays = {k: (td.from_array(x) if grid is None else _cut(x, letters, grid)) for k, (x, letters) in inputs.items()}
    out = build(**arrays)
    t0 = time.perf_counter()
    plan = plan_arrays(out, client)[0]
    return plan, time.perf_counter() - t0


def _blocks(plan):
    """The chunk shape of every source of a plan (to see which hand grid auto matches)."""
    from tra_dask.physical import PSource

    return sorted((n.source.name, n.type.chunk_shape(tuple([0] * n.type.arity))) for n in plan.nodes
                  if isinstance(n, PSource))


def _run(client, plan):
    with LoadWatch(None) as w:
        rf = td.submit(plan, client=client)
        for one in rf if isinstance(rf, tuple) else (rf,):
            one.wait()
    return w.wall, w.busy


def compare(client, p, args, dtype):
    rows = []
    for name, inputs, build, grids in cases(args.scale, p, dtype):
        variants = [("auto", None)] + [("hand " + "".join(f"{c}{n}" for c, n in g.items()), g) for g in grids]
        plans = {}
        for label, g in variants:
            try:
                plans[label] = _plan(client, build, inputs, g)
            except ValueError as e:  # a hand grid that does not fit
                print(f"  {name} {label}: {e}", file=sys.stderr)
        walls = {k: [] for k in plans}
        flagged = {k: 0 for k in plans}
        order = list(plans)
        for r in range(args.repeat):  # interleaved, each round starting one variant later
            for label in order[r % len(order):] + order[:r % len(order)]:
                plan = plans[label][0]
                wall, busy = _run(client, plan)
                walls[label].append(wall)
                flagged[label] += busy
        # a hand grid whose plan is the auto plan (same chunking, same plan) measures the
        # same thing: pool their runs, so the ratio compares plans, not noise
        text = {k: "\n".join(x for x in p.explain().splitlines()  # all but how the chunking was found
                             if not x.lstrip().startswith(("chunking:", "search:"))) for k, (p, _) in plans.items()}
        for k in plans:
            if k != "auto" and text[k] == text["auto"]:
                walls["auto"] = walls[k] = walls["auto"] + walls[k]
        best_hand = min((min(w), k) for k, w in walls.items() if k != "auto")
        auto = min(walls["auto"])
        note = plans["auto"][0].stage("chunking").note.split("; least")[0]
        same = [k for k in plans if k != "auto" and _blocks(plans[k][0]) == _blocks(plans["auto"][0])]
        if same:
            note += f" (= {same[0][5:]})"
        rows.append((name, dtype, auto, best_hand, plans, walls, flagged, note))
        print(f"{p} workers {name} {dtype}: auto {auto:.3f}s, best hand {best_hand[1]} {best_hand[0]:.3f}s "
              f"(ratio {auto / best_hand[0]:.2f}); plan auto {plans['auto'][1]:.2f}s", flush=True)
    return rows


class PeakRSS:
    """Peak resident memory of each worker process, sampled every 10 ms."""

    def __init__(self, client):
        pids = client.run(lambda: __import__("os").getpid())
        self.procs = {w: psutil.Process(pid) for w, pid in pids.items()}

    def __enter__(self):
        self.peak = {w: p.memory_info().rss for w, p in self.procs.items()}
        self.base = dict(self.peak)
        self.stop = False
        self.t = threading.Thread(target=self._loop, daemon=True)
        self.t.start()
        return self

    def _loop(self):
        while not self.stop:
            for w, p in self.procs.items():
                try:
                    self.peak[w] = max(self.peak[w], p.memory_info().rss)
                except psutil.Error:
                    pass
            time.sleep(0.01)

    def __exit__(self, *exc):
        self.stop = True
        self.t.join()
        return False

    @property
    def growth(self) -> float:
        """The largest rise above its starting RSS of any worker."""
        return max(self.peak[w] - self.base[w] for w in self.peak)


def versus_dask(client, args):
    n, k, nchunks = (400, 40_000, 200) if args.quick else (1000, 100_000, 200)
    rng = da.random.default_rng(1)
    A = client.persist(rng.random((n, k), chunks=(n, k // nchunks)))
    B = client.persist(rng.random((k, n), chunks=(k // nchunks, n)))
    wait([A, B])
    out = []
    for rep in range(args.repeat):
        for who in ("tra_dask", "dask.array"):
            client.run(lambda: __import__("gc").collect())
            with PeakRSS(client) as mem, LoadWatch(None) as w:
                if who == "tra_dask":
                    rf = td.submit(td.einsum("ij,jk->ik", A, B), client=client)
                    rf.wait()
                    res = rf.to_dask_array()
                else:
                    res = client.persist(da.einsum("ij,jk->ik", A, B))
                    wait(res)
            out.append((who, w.wall, mem.growth))
            check = res[:3, :3].compute(scheduler=client.get) if hasattr(res, "compute") else None
            del res
    ref = (A[:3] @ B[:, :3]).compute(scheduler=client.get)
    assert check is None or np.allclose(check, ref)
    return (n, k, nchunks), out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--sites", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--dtype", nargs="+", default=["float64"])
    ap.add_argument("--no-dask", dest="vs_dask", action="store_false", help="skip the dask.array.einsum comparison")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", dest="write", action="store_false")
    args = ap.parse_args(argv)
    if args.quick:
        args.scale, args.repeat, args.sites = 0.05, 1, [2]
    all_rows, machines, vs = [], [], None
    for p in args.sites:
        client = start_cluster(p)
        try:
            t0 = time.perf_counter()
            spec = td.cluster_spec(client)
            print(f"calibrated {p} workers in {time.perf_counter() - t0:.1f} s: {spec}", flush=True)
            machines.append(machine_line(argparse.Namespace(sites=p)))
            for dtype in args.dtype:
                all_rows += [(p,) + r for r in compare(client, p, args, dtype)]
            if p == max(args.sites) and args.vs_dask:
                vs = (p, versus_dask(client, args))
        finally:
            client.close()
    lines = table(all_rows, vs, machines)
    print("\n".join(lines))
    if args.write and not args.quick:
        from _report import write_section

        write_section("automatic chunking" + ("" if args.scale == 0.25 else f" (scale {args.scale})"), lines)


def table(rows, vs, machines):
    machines = [m.replace(", inputs persisted on the workers before timing", "") for m in machines]
    lines = [f"Machines: {m}" for m in machines] + [
        "",
        "Inputs are numpy arrays in the client; a run scatters them, runs every task and waits (same for every "
        "row). `auto` = `chunks=\"auto\"` (the default); `hand` = every input cut by the block counts named "
        "(index letter + number of blocks; unnamed indices one block). Min of the interleaved repeats; "
        "planning time apart. `(= g)`: auto chose hand grid g's chunking; when the plans are identical their "
        "runs are pooled (the same plan measured twice differs only by noise, up to 2x at these sizes here).",
        "",
        "| workers | case | dtype | auto (s) | best hand grid | best hand (s) | auto / best | worst hand (s) | "
        "auto chunking chose | planning auto (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for p, name, dtype, auto, (best, label), plans, walls, flagged, note in rows:
        worst = max(min(w) for k, w in walls.items() if k != "auto")
        ratios.append(auto / best)
        lines.append(f"| {p} | {name} | {dtype} | {auto:.3f} | {label[5:]} | {best:.3f} | {auto / best:.2f} | "
                     f"{worst:.3f} | {note} | {plans['auto'][1]:.2f} |")
    if ratios:
        lines += ["", f"auto / best hand: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}; "
                      f"{sum(r <= 1.2 for r in ratios)} of {len(ratios)} rows within 1.2x."]
    if vs:
        p, ((n, k, nchunks), out) = vs
        lines += ["", f"### td.einsum vs dask.array.einsum: `ij,jk->ik`, {n}x{k} @ {k}x{n} float64, {nchunks} "
                      f"chunks along j (dask issue 10053), {p} workers, inputs persisted", "",
                  "| who | wall min (s) | wall median (s) | peak worker RSS growth (MiB) |", "|---|---|---|---|"]
        for who in ("tra_dask", "dask.array"):
            w = [t for o, t, _ in out if o == who]
            m = [g for o, _, g in out if o == who]
            lines.append(f"| {who} | {min(w):.3f} | {statistics.median(w):.3f} | {max(m) / 2**20:.0f} |")
    return lines


if __name__ == "__main__":
    main()
