"""A worker SIGKILLed while a plan runs: time to the exact result, against the run
with no failure, for a matmul and the FFNN step.

LocalCluster(3 workers × 1 thread, processes, nannies: a killed worker comes back
under another address and the next submission may use it).  For each workload: the
median of ``--repeat`` runs with no failure, then a run per kill point (25%, 50%,
90% of that time: ``os.kill(pid, SIGKILL)`` of one worker the plan pins tasks to),
each with ``tra-dask.recovery`` = ``resume`` (the default: run the unfinished part
again) and ``replan`` (plan the whole expression again), results checked against
numpy.

    python benchmarks/recovery.py [--repeat 3] [--quick]
"""

from __future__ import annotations

import datetime
import os
import platform
import signal
import statistics
import sys
import time

import dask
import numpy as np

import tra_dask as td
from _harness import parser, start_cluster
from _report import write_section
from tra_dask.programs import ffnn_sgd_step, matmul

WHEN = (0.25, 0.5, 0.9)


def workloads(scale: float):
    rng = np.random.default_rng(0)
    n = int(2400 * scale) // 4 * 4
    a, b = rng.random((n, n)), rng.random((n, n))
    A, B = td.from_numpy(a, (n // 4, n // 4), name="A"), td.from_numpy(b, (n // 4, n // 4), name="B")
    yield f"matmul {n}³ f64, 4×4 blocks", matmul(A, B), lambda got: np.allclose(got, a @ b)
    N, D, H, L = (int(4000 * scale), int(1600 * scale), int(4000 * scale), 10)
    X = td.from_numpy(rng.random((N, D)), (N // 4, D // 2), name="X")
    Y = td.from_numpy(np.eye(L)[rng.integers(0, L, N)], (N // 4, L), name="Y")
    W1 = td.from_numpy(rng.random((D, H)) * 0.01, (D // 2, H // 4), name="W1")
    W2 = td.from_numpy(rng.random((H, L)) * 0.01, (H // 4, L), name="W2")
    step = ffnn_sgd_step(X, Y, W1, W2, 0.1)
    want = td.evaluate(step)

    def exact(got):
        return all(set(g) == set(w) and all(np.allclose(g[k], w[k]) for k in w) for g, w in zip(got, want))

    yield f"FFNN step N={N} D={D} H={H} L={L} f64", step, exact


def _run(client, plan, kill_at=None):
    """Seconds from submitting the (ready) plan to the gathered result, the result, and
    the recovery note."""
    t0 = time.monotonic()
    out = td.submit(plan, client=client)
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    if kill_at is not None:
        victim = items[0].lowered.workers[1]
        pid = client.run(os.getpid, workers=[victim])[victim]
        time.sleep(max(0.0, kill_at - (time.monotonic() - t0)))
        os.kill(pid, signal.SIGKILL)
    got = [rf.to_numpy() if len(items) == 1 else rf.gather() for rf in items]
    seconds = time.monotonic() - t0
    notes = items[0].recoveries
    return seconds, (got[0] if len(items) == 1 else got), (notes[-1][1] if notes else "")


def _settle(client, n: int) -> None:
    """Wait until the nanny's new worker has joined."""
    deadline = time.monotonic() + 60
    while len(client.scheduler_info(n_workers=-1)["workers"]) < n and time.monotonic() < deadline:
        time.sleep(0.2)


def main(argv=None) -> None:
    args = parser(__doc__).parse_args(argv)
    scale = 0.5 if args.quick else args.scale
    repeat = 1 if args.quick else args.repeat
    sites = 3
    client = start_cluster(sites)
    rows = []
    try:
        for name, expr, exact in workloads(scale):
            t0 = time.monotonic()
            plan = td.plan_for(expr, client)
            planning = time.monotonic() - t0
            _run(client, plan)  # warm: data sent, code imported
            base = statistics.median(_run(client, plan)[0] for _ in range(repeat))
            print(f"{name}: planned in {planning:.2f} s, runs in {base:.2f} s with no failure", flush=True)
            for when in WHEN:
                for how in ("resume", "replan"):
                    with dask.config.set({"tra-dask.recovery": how}):
                        seconds, got, note = _run(client, plan, kill_at=when * base)
                    ok = exact(got)
                    rerun = note.split(": ", 1)[-1].split(",")[0] if "resumed" in note else "whole plan"
                    rows.append((name, when, how, base, seconds, ok, rerun))
                    print(f"  kill at {when:.0%} ({how}): {seconds:.2f} s = {seconds / base:.2f}× exact={ok} "
                          f"[{rerun}]", flush=True)
                    _settle(client, sites)
                    plan = td.plan_for(expr, client)  # the worker list changed: plan for the new one
                    _run(client, plan)  # the new worker warm
    finally:
        client.close()
    if args.write:
        stamp = f"{datetime.date.today()} on {platform.node()} ({os.cpu_count()} cores), {sites} workers × 1 thread"
        lines = [f"{stamp}; `python benchmarks/recovery.py{' --quick' if args.quick else ''}`. One worker the "
                 f"plan pins tasks to is SIGKILLed at 25/50/90% of the no-failure time; its nanny restarts it "
                 f"under another address. `resume` (the default) runs the unfinished part again; `replan` "
                 f"plans the whole expression again (its planning time counts). Time is from submitting the ready plan to the gathered result; the no-failure time is the median of the repeats.", "",
                 "| workload | kill at | recovery | no failure s | with kill s | ratio | exact | ran again |",
                 "|---|---|---|---|---|---|---|---|"]
        for name, when, how, base, seconds, ok, rerun in rows:
            lines.append(f"| {name} | {when:.0%} | {how} | {base:.2f} | {seconds:.2f} | {seconds / base:.2f} | "
                         f"{'yes' if ok else '**no**'} | {rerun} |")
        write_section("recovery from a killed worker", lines)
    if not all(r[5] for r in rows):
        sys.exit("a result after a kill was not exact")


if __name__ == "__main__":
    main()
