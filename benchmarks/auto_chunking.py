"""Does the chunking tra_dask chooses run as fast as the best one a person picks,
and does the time model predict what each plan takes?

On a real LocalCluster (2, then 3 workers x 1 thread, processes, 127.0.0.1),
calibrated once: for 15 shapes written with the array front-end over numpy inputs —
square, common-large-dim and two-large-dims matrix products, a tall-skinny gram
``X.T @ X``, an outer-product-like product (contracted index of 8), a batched
``bij,bjk->bik``, a lopsided 3-operand chain as an einsum and as ``A @ B @ C``, a
many-index einsum ``abcdef,bcdfg->abcdeg``, two elementwise pipelines ending in a
reduction, a row-wise dot ``ij,ij->i``, the FFNN forward pass and SGD step and
nearest neighbour — the plan with ``chunks="auto"`` runs **interleaved** (each
round starting one variant later) with the plans of at least 6 hand-chosen grids
(block counts per index; every input cut alike): ``--repeat`` rounds, and more for a
shape whose plans are short, until each plan has run ``--min-time`` seconds.  Each plan runs once untimed first
(it sends its inputs, which the scatter cache keeps, so later runs send nothing, as
the time model assumes); a timed run is every task of the plan and the wait
(results stay on the workers) — the same for all.  Planning is timed apart (the
automatic chunking plans many candidates).

Every distinct plan timed is also a prediction: ``plan.cost.seconds`` (the time
model on the calibrated spec) against its measured seconds (the min of its runs).
Reported: the distribution of ``|predicted/measured - 1|`` (median, 90th
percentile, worst, share within ±30%, count off by more than 2x), the worst
predictions, and the auto plan's prediction for each of the 9 workloads of issue 43
(row dot, outer product, ``X.T @ X``, batched, the two chains, FFNN forward, the two
elementwise pipelines).

Then ``td.einsum`` against ``dask.array.einsum`` for a contraction with many chunks
along the contracted index (the shape of dask issue 10053), both over the same
persisted dask arrays: wall time and the peak resident memory of the busiest worker
(sampled every 10 ms).

    python benchmarks/auto_chunking.py [--repeat 3] [--min-time 0.5] [--scale 0.25] [--sites 2 3] [--only gram]
        [--quick] [--no-dask] [--markdown FILE] [--no-write]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import threading
import time
from typing import Callable

import dask.array as da
import numpy as np
import psutil
from distributed import wait

import tra_dask as td
from _harness import LoadWatch, machine_line, start_cluster
from tra_dask.optimizer.time import plan_seconds
from tra_dask.programs import ffnn_forward_array, ffnn_sgd_step_array, nearest_neighbor_array
from tra_dask.runtime.arrays import plan as plan_arrays

MATMUL = {"square": (4000, 4000, 4000), "common-large-dim": (1000, 64000, 1000),
          "two-large-dims": (8000, 1000, 8000)}


@dataclasses.dataclass
class Case:
    """One shape: its inputs ``{name: (numpy array, index letters)}``, ``build(**arrays)
    -> Array`` (or a tuple of them), the hand grids ``[{letter: blocks}]`` (unnamed
    letters one block) and, for the workloads of the prediction table, its name there."""

    name: str
    inputs: dict
    build: Callable
    grids: list
    workload: str | None = None


def _cut(x, name, letters, counts):
    return td.from_array(x, chunks=tuple(-(-n // counts.get(c, 1)) for n, c in zip(x.shape, letters)), name=name)


def cases(scale, p, dtype):
    """The shapes at ``scale`` (of their large dimensions) for ``p`` workers."""
    rng = np.random.default_rng(0)

    def big(n, lo=8):
        return max(lo, int(n * scale))

    def rand(*shape):
        return rng.random(shape, dtype=dtype)

    for shape, dims in MATMUL.items():
        I, K, J = (big(d) for d in dims)
        yield Case(f"matmul {shape} {I}x{K}x{J}", {"A": (rand(I, K), "ik"), "B": (rand(K, J), "kj")},
                   lambda A, B: A @ B, [{"i": p}, {"k": p}, {"j": p}, {"i": p, "j": p}, {"i": p, "k": p, "j": p},
                                        {"i": 2 * p, "k": 2 * p, "j": 2 * p}])
    n, d = big(200_000), 100
    yield Case(f"gram X.T @ X X={n}x{d}", {"X": (rand(n, d), "nd")}, lambda X: X.T @ X,
               [{}, {"n": p}, {"n": 2 * p}, {"n": 4 * p}, {"n": 8 * p}, {"d": 2}, {"n": p, "d": 2}], "X.T @ X")
    I, K = big(16_000), 8
    yield Case(f"outer-like {I}x{K} @ {K}x{I}", {"A": (rand(I, K), "ik"), "B": (rand(K, I), "kj")},
               lambda A, B: A @ B, [{}, {"i": p}, {"j": p}, {"i": 2 * p}, {"j": 2 * p}, {"i": p, "j": p},
                                    {"i": 2 * p, "j": 2 * p}], "outer product")
    b, n = 16, big(2000)
    yield Case(f"batched bij,bjk->bik {b}x{n}x{n}x{n}", {"A": (rand(b, n, n), "bij"), "B": (rand(b, n, n), "bjk")},
               lambda A, B: td.einsum("bij,bjk->bik", A, B),
               [{"b": p}, {"b": 2 * p}, {"i": p}, {"k": p}, {"j": p}, {"b": p, "i": 2}, {"b": p, "j": 2}], "batched")
    L, s = big(8000), 400
    chain = {"A": (rand(L, s), "ij"), "B": (rand(s, L), "jk"), "C": (rand(L, s), "kl")}
    grids = [{"i": p}, {"k": p}, {"l": p}, {"j": p}, {"i": 2 * p}, {"k": 2 * p}, {"i": p, "k": p}]
    yield Case(f"chain ij,jk,kl->il {L}x{s}x{L}x{s}", chain, lambda A, B, C: td.einsum("ij,jk,kl->il", A, B, C),
               grids, "chain (einsum)")
    yield Case(f"chain A @ B @ C {L}x{s}x{L}x{s}", chain, lambda A, B, C: A @ B @ C, grids, "chain (@)")
    a, (b, c, d_, e, f, g) = big(64, 2), (8, 6, 4, 32, 64, 64)
    yield Case(f"many-index abcdef,bcdfg->abcdeg a={a}",
               {"A": (rand(a, b, c, d_, e, f), "abcdef"), "B": (rand(b, c, d_, f, g), "bcdfg")},
               lambda A, B: td.einsum("abcdef,bcdfg->abcdeg", A, B),
               [{"a": p}, {"b": p}, {"c": p}, {"e": p}, {"f": p}, {"g": p}, {"a": p, "b": 2}])
    n = big(8000)
    ew = [{}, {"i": p}, {"j": p}, {"i": 2 * p}, {"i": 4 * p}, {"j": 2 * p}, {"i": p, "j": p}]
    yield Case(f"elementwise sum(exp(a)*b+c) {n}x{n}", {"a": (rand(n, n), "ij"), "b": (rand(n, n), "ij"),
                                                       "c": (rand(n, n), "ij")},
               lambda a, b, c: (np.exp(a) * b + c).sum(), ew, "elementwise: sum(exp(a)*b+c)")
    yield Case(f"elementwise sqrt(a*a+b*b).sum(axis=0) {n}x{n}", {"a": (rand(n, n), "ij"), "b": (rand(n, n), "ij")},
               lambda a, b: np.sqrt(a * a + b * b).sum(axis=0), ew, "elementwise: sqrt(a*a+b*b).sum(0)")
    n, d = big(400_000), 100
    yield Case(f"row dot ij,ij->i {n}x{d}", {"a": (rand(n, d), "ij"), "b": (rand(n, d), "ij")},
               lambda a, b: td.einsum("ij,ij->i", a, b),
               [{}, {"i": p}, {"i": 2 * p}, {"i": 4 * p}, {"i": 8 * p}, {"j": 2}, {"i": p, "j": 2}], "row dot")
    n, d, h, l = big(10_000), 1600, big(10_000), 10
    ffnn = {"X": (rand(n, d), "nd"), "W1": ((rand(d, h) - 0.5) * 0.1, "dh"), "W2": ((rand(h, l) - 0.5) * 0.1, "hl")}
    grids = [{"n": p}, {"h": p}, {"d": p}, {"n": p, "h": p}, {"n": 2 * p, "d": 2, "h": 2 * p}, {"n": 2 * p}]
    yield Case(f"ffnn forward N={n} D={d} H={h}", ffnn, lambda X, W1, W2: ffnn_forward_array(X, W1, W2), grids,
               "FFNN forward")
    step = dict(ffnn, Y=(np.eye(l, dtype=dtype)[rng.integers(0, l, n)], "nl"))
    yield Case(f"ffnn step N={n} D={d} H={h}", step,
               lambda X, Y, W1, W2: ffnn_sgd_step_array(X, Y, W1, W2, 0.1), grids)
    N, D = big(150_000), 600
    A = rand(D, D)
    yield Case(f"nearest neighbour N={N} D={D}", {"q": (rand(D), "d"), "X": (rand(N, D), "nd"),
                                                  "A": ((A @ A.T).astype(dtype), "de")},
               lambda q, X, A: nearest_neighbor_array(q, X, A),
               [{"n": p}, {"n": 2 * p}, {"n": 4 * p}, {"n": p, "d": 2, "e": 2}, {"d": p, "e": p}, {"n": 8 * p}])


def grid_label(g) -> str:
    return "".join(f"{c}{n}" for c, n in g.items()) or "1 block"


def _plan(client, case, grid):
    arrays = {k: (td.from_array(x, name=k) if grid is None else _cut(x, k, letters, grid))
              for k, (x, letters) in case.inputs.items()}
    out = case.build(**arrays)
    t0 = time.perf_counter()
    plan = plan_arrays(out, client)[0]
    return plan, time.perf_counter() - t0


def predicted(plan, spec) -> float:
    """The plan's predicted seconds on the calibrated spec (``plan.cost.seconds``;
    the time model run on the plan where the plan was not annotated)."""
    s = plan.cost.seconds
    return s if s is not None else plan_seconds(plan.cost, spec)[0]


def chosen_grid(plan, case) -> str:
    """A plan's chunking in the hand grids' notation: blocks per letter of the inputs
    (``c2/3`` where inputs cut letter c differently), letters of one block left out."""
    from tra_dask.physical import PSource

    counts: dict = {}
    for node in plan.nodes:
        if isinstance(node, PSource) and node.source.name in case.inputs:
            x, letters = case.inputs[node.source.name]
            chunk = node.type.chunk_shape(tuple([0] * node.type.arity))
            for c, n, b in zip(letters, x.shape, chunk):
                counts.setdefault(c, set()).add(-(-n // max(1, b)))
    return "".join(f"{c}{'/'.join(map(str, sorted(v)))}" for c, v in sorted(counts.items())
                   if v != {1}) or "1 block"


def _run(client, plan):
    with LoadWatch(None) as w:
        rf = td.submit(plan, client=client)
        for one in rf if isinstance(rf, tuple) else (rf,):
            one.wait()
    return w.wall, w.busy


@dataclasses.dataclass
class Row:
    """One shape on one cluster, per variant (label): its chunking (:func:`chosen_grid`),
    tasks, planning seconds, runs and prediction; ``same[label]``: the first variant
    whose plan is this one's.  (The plans themselves are not kept: they hold the inputs,
    and with them the copies the scatter cache keeps on the workers.)"""

    workers: int
    name: str
    workload: str | None
    dtype: str
    chose: dict
    tasks: dict
    planning: dict
    walls: dict
    flagged: dict
    predicted: dict
    same: dict
    running: float  # seconds spent running its plans (the untimed first runs included)

    @property
    def auto(self) -> float:
        return min(self.walls["auto"])

    @property
    def best_hand(self) -> tuple:
        return min((min(w), k) for k, w in self.walls.items() if k != "auto")

    @property
    def worst_hand(self) -> float:
        return max(min(w) for k, w in self.walls.items() if k != "auto")


def compare(client, p, args, dtype, spec):
    rows = []
    for case in cases(args.scale, p, dtype):
        if args.only and not any(o in case.name for o in args.only):
            continue
        variants = [("auto", None)] + [("hand " + grid_label(g), g) for g in case.grids]
        plans, planning = {}, {}
        for label, g in variants:
            try:
                plans[label], planning[label] = _plan(client, case, g)
            except ValueError as e:  # a hand grid that does not fit
                print(f"  {case.name} {label}: {e}", file=sys.stderr)
        # a hand grid whose plan is the auto plan's (same chunking, same plan) measures the
        # same thing: their runs are pooled, so the ratio compares plans, not noise
        text = {k: "\n".join(x for x in pl.explain().splitlines()  # all but how the chunking was found
                             if not x.lstrip().startswith(("chunking:", "search:"))) for k, pl in plans.items()}
        same = {k: next(j for j in plans if text[j] == text[k]) for k in plans}
        order = list(plans)
        t0 = time.perf_counter()
        for label in order:  # untimed: sends the inputs (then kept by the scatter cache) and warms the workers
            _run(client, plans[label])
        walls = {k: [] for k in plans}
        flagged = {k: 0 for k in plans}
        rounds, r = args.repeat, 0
        while r < rounds:  # interleaved, each round starting one variant later
            for label in order[r % len(order):] + order[:r % len(order)]:
                wall, busy = _run(client, plans[label])
                walls[same[label]].append(wall)
                flagged[same[label]] += busy
            r += 1
            if r == args.repeat:  # short plans: more rounds, up to --min-time of runs each (the min of
                # 3 runs of a 0.05 s plan is noise here: row ratios moved by up to 0.4 run to run)
                typical = float(np.median([w for v in walls.values() for w in v]))
                rounds = max(rounds, min(MAX_ROUNDS, math.ceil(args.min_time / max(typical, 1e-3))))
        for k in plans:
            walls[k], flagged[k] = walls[same[k]], flagged[same[k]]
        row = Row(p, case.name, case.workload, dtype, {k: chosen_grid(pl, case) for k, pl in plans.items()},
                  {k: pl.cost.tasks for k, pl in plans.items()}, planning, walls, flagged,
                  {k: predicted(pl, spec) for k, pl in plans.items()}, same, time.perf_counter() - t0)
        del plans
        td.drop_scattered(client)  # this shape's inputs, every cut of them, leave the workers
        rows.append(row)
        best, label = row.best_hand
        print(f"{p} workers {case.name} {dtype}: auto {row.auto:.3f}s (predicted {row.predicted['auto']:.3f}), best "
              f"hand {label[5:]} {best:.3f}s (ratio {row.auto / best:.2f}); planning auto {planning['auto']:.2f}s",
              flush=True)
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
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=MIN_TIME,
                    help="seconds of timed runs per plan at least: short plans run more rounds (at most "
                         f"{MAX_ROUNDS})")
    ap.add_argument("--scale", type=float, default=SCALE)
    ap.add_argument("--sites", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--dtype", nargs="+", default=["float64"])
    ap.add_argument("--only", nargs="+", default=[],
                    help="run only the shapes whose name contains one of these texts (implies --no-write)")
    ap.add_argument("--no-dask", dest="vs_dask", action="store_false", help="skip the dask.array.einsum comparison")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, one repeat, 2 workers: a smoke test")
    ap.add_argument("--markdown", metavar="FILE", help="also write the tables, with every plan's prediction, to FILE")
    ap.add_argument("--no-write", dest="write", action="store_false", help="do not write benchmarks/README.md")
    args = ap.parse_args(argv)
    if args.quick:
        args.scale, args.repeat, args.sites, args.min_time = 0.02, 1, [2], 0.0
    t_start = time.perf_counter()
    all_rows, machines, calib, vs = [], [], [], None
    for p in args.sites:
        client = start_cluster(p)
        try:
            t0 = time.perf_counter()
            spec = td.cluster_spec(client)
            calib.append(f"{p} workers: {spec!r} ({time.perf_counter() - t0:.1f} s)")
            print(f"calibrated {calib[-1]}", flush=True)
            machines.append(machine_line(argparse.Namespace(sites=p)))
            for dtype in args.dtype:
                all_rows += compare(client, p, args, dtype, spec)
            if p == max(args.sites) and args.vs_dask:
                vs = (p, versus_dask(client, args))
        finally:
            client.close()
    took = time.perf_counter() - t_start
    lines = table(all_rows, vs, machines, calib)
    every = prediction_rows(all_rows)
    planning, running = sum(sum(r.planning.values()) for r in all_rows), sum(r.running for r in all_rows)
    print("\n".join(lines + ["", *every, "", f"took {took:.0f} s: planning {planning:.0f} s, running {running:.0f} s"]))
    command = (f"`python benchmarks/auto_chunking.py --repeat {args.repeat} --min-time {args.min_time} "
               f"--scale {args.scale} --sites "
               f"{' '.join(map(str, args.sites))}{'' if args.vs_dask else ' --no-dask'}` ({took / 60:.1f} min)")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(["# automatic chunking", "", command, "", *lines, "", *every]) + "\n")
        print(f"wrote {args.markdown}")
    if args.write and not args.quick and not args.only:
        from _report import write_section

        write_section("automatic chunking" + ("" if args.scale == SCALE else f" (scale {args.scale})"),
                      [command, "", *lines])


MIN_TIME, MAX_ROUNDS = 0.5, 12  # a 0.05 s plan runs 10 rounds, a 0.3 s one the 3 of --repeat
SCALE = 0.25  # the default: both worker counts in about 15 minutes on the development VM's 2 cores


def _share(n, total) -> str:
    return f"{n} of {total}" + (f" ({n / total:.0%})" if total else "")


def _rank(values, q):
    """The ``q`` quantile of ``values`` by nearest rank."""
    v = sorted(values)
    return v[max(0, math.ceil(q * len(v)) - 1)]


def predictions(rows):
    """Every distinct plan timed: ``(row, label, predicted, measured min, measured median)``
    (a hand grid whose plan is the auto plan is counted once, as auto)."""
    return [(r, k, r.predicted[k], min(r.walls[k]), statistics.median(r.walls[k]))
            for r in rows for k in r.walls if r.same[k] == k]


def error_stats(preds) -> str:
    """The distribution of ``|predicted/measured - 1|`` over ``preds`` (see :func:`predictions`)."""
    errs = [pred / meas - 1 for _, _, pred, meas, _ in preds]
    a = [abs(e) for e in errs]
    return (f"{len(errs)} distinct plans timed: |predicted/measured − 1| median {_rank(a, 0.5):.0%}, 90th "
            f"percentile {_rank(a, 0.9):.0%}, worst {max(a):.0%}; within ±30%: "
            f"{_share(sum(x <= 0.3 for x in a), len(a))}; off by more than 2x: "
            f"{sum(not 0.5 <= 1 + e <= 2 for e in errs)}; over-predicted {sum(e > 0 for e in errs)}, "
            f"under-predicted {sum(e < 0 for e in errs)}")


def table(rows, vs, machines, calib):
    machines = [m.replace(", inputs persisted on the workers before timing", "") for m in machines]
    lines = [f"Machines: {m}" for m in machines] + [f"Calibrated: {c}" for c in calib] + [
        "",
        "Inputs are numpy arrays in the client; each plan runs once untimed (it sends its inputs, kept by the "
        "scatter cache), then a timed run is every task and the wait (same for every row). `auto` = "
        "`chunks=\"auto\"` (the default); `hand` = every input cut by the block counts named (index letter + "
        "number of blocks; unnamed indices one block). Min of the interleaved rounds (`--repeat`, and more for "
        "short plans: `--min-time` seconds of runs per plan); planning time apart. "
        "`auto chose`: the auto plan's blocks per index of the inputs (`(= g)`: hand grid g's chunking); when "
        "the plans are identical their runs are pooled (the same plan measured twice differs only by noise).",
        "",
        "| workers | case | dtype | auto (s) | best hand grid | best hand (s) | auto / best | worst hand (s) | "
        "auto chose | auto predicted (s) | planning auto (s) |",
        "|---|---|---|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    ratios = []
    for r in rows:
        best, label = r.best_hand
        ratios.append(r.auto / best)
        chose = r.chose["auto"]
        same = [k for k in r.chose if k != "auto" and r.chose[k] == chose]
        if same:
            chose += f" (= {same[0][5:]})"
        lines.append(f"| {r.workers} | {r.name} | {r.dtype} | {r.auto:.3f} | {label[5:]} | {best:.3f} | "
                     f"{r.auto / best:.2f} | {r.worst_hand:.3f} | {chose} | {r.predicted['auto']:.3f} | "
                     f"{r.planning['auto']:.2f} |")
    if ratios:
        lines += ["", f"auto / best hand: median {statistics.median(ratios):.2f}, max {max(ratios):.2f}; "
                      f"**{sum(x <= 1.2 for x in ratios)} of {len(ratios)} rows within 1.2x** of the best hand grid."]
    preds = predictions(rows)
    if preds:
        lines += ["", "### predicted vs measured", "",
                  "Predicted (`plan.cost.seconds`, calibrated spec) vs measured (min of the runs), over "
                  f"{error_stats(preds)}."]
        workers = sorted({r.workers for r in rows})
        if len(workers) > 1:
            lines += [""] + [f"- {p} workers: {error_stats([x for x in preds if x[0].workers == p])}"
                             for p in workers]
        lines += ["", "The workloads of issue 43 (the auto plan of each):", "",
                  "| workers | workload | case | predicted (s) | measured min (s) | median (s) | error |",
                  "|---|---|---|---:|---:|---:|---:|"]
        mine = [x for x in preds if x[0].workload and x[1] == "auto"]
        for r, _, pred, meas, med in mine:
            lines.append(f"| {r.workers} | {r.workload} | {r.name} | {pred:.3f} | {meas:.3f} | {med:.3f} | "
                         f"{pred / meas - 1:+.0%} |")
        if mine:
            lines += ["", "Workloads within ±30%: " + _share(sum(abs(x[2] / x[3] - 1) <= 0.3 for x in mine), len(mine))
                      + "."]
        worst = sorted(preds, key=lambda x: -abs(x[2] / x[3] - 1))[:10]
        lines += ["", "The 10 worst predictions:", "",
                  "| workers | case | plan | predicted (s) | measured min (s) | error |", "|---|---|---|---:|---:|---:|"]
        lines += [f"| {r.workers} | {r.name} | {k} | {pred:.3f} | {meas:.3f} | {pred / meas - 1:+.0%} |"
                  for r, k, pred, meas, _ in worst]
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


def prediction_rows(rows) -> list[str]:
    """Every distinct plan timed, its prediction and measurement (for ``--markdown``)."""
    out = ["### every plan timed", "",
           "| workers | case | plan | same plan as | predicted (s) | measured min (s) | median (s) | error | tasks | "
           "busy runs | planning (s) |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        for k in r.walls:
            twins = ", ".join(j for j in r.walls if j != k and r.same[j] == r.same[k])
            meas = min(r.walls[k])
            out.append(f"| {r.workers} | {r.name} | {k} | {twins} | {r.predicted[k]:.3f} | {meas:.3f} | "
                       f"{statistics.median(r.walls[k]):.3f} | {r.predicted[k] / meas - 1:+.0%} | {r.tasks[k]} | "
                       f"{r.flagged[k] or ''} | {r.planning[k]:.2f} |")
    return out


if __name__ == "__main__":
    main()
