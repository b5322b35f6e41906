"""The fault matrix: {relation API, array front-end} × {SIGKILL at 25/50/90% of the
run, SIGSTOP before the submission, two workers SIGKILLed one after the other, the
worker holding the scattered data SIGKILLed} × {matmul, FFNN step, a chained result}:
each cell's result checked against numpy, its time against the same run with no
failure.  (A worker stopped *during* a run: tests/test_recovery.py.)

LocalCluster(3 workers × 1 thread, processes, nannies, 127.0.0.1): a killed worker
comes back under another address; a stopped one is removed after
``tra-dask.worker-timeout`` (set to :data:`WORKER_TIMEOUT` here).  Time is from the
user's call (``td.submit`` of the expression, its plan cached by the warm-up run) to
the results gathered as numpy arrays; the fault is injected by a timer at its
fraction of the no-failure time (the median of ``--repeat`` runs).  Inputs: one
operand made on the workers by a function that sleeps ``--delay`` s per chunk (so
the run lasts long enough to be hit), the others in-process arrays that the runtime
scatters.  tests/test_fault_matrix.py runs a subset of the cells with these
definitions.

    python benchmarks/faults.py [--scale 1] [--repeat 3] [--quick] [--no-write]
"""

from __future__ import annotations

import datetime
import os
import platform
import signal
import statistics
import sys
import threading
import time

import dask
import numpy as np

import tra_dask as td

APIS = ("relation", "array")
FAULTS = ("kill at 25%", "kill at 50%", "kill at 90%", "SIGSTOP before the submission", "two kills (25%, 60%)",
          "scatter holder killed at 25%")
WORKLOADS = ("matmul", "FFNN step", "chain")
WORKERS = 3
# seconds without a heartbeat before a worker counts as frozen (tra-dask.worker-timeout; default 20 s).  Not
# less: on two busy cores a worker importing tra_dask for its first task misses heartbeats for 3-8 s
WORKER_TIMEOUT = 10.0
CONFIG = {"distributed.scheduler.active-memory-manager.start": False,
          "tra-dask.worker-timeout": f"{WORKER_TIMEOUT}s"}
DELAY = {"delay": 0.15}  # seconds a slow chunk sleeps; set by main() (the workers read it from the function)


# ---------------------------------------------------------------------------
# inputs: small integers (products and sums of them are exact in float64), the same
# values whatever the cut


def values(rows, cols, seed: int = 0):
    i = np.asarray(rows)[:, None]
    j = np.asarray(cols)[None, :]
    return ((i * 7 + j * 3 + seed * 5) % 11 - 5).astype("float64")


class SlowRegion:
    """``fn(region)`` for ``td.from_region``: :func:`values` after a sleep (the run's
    length).  An object, so that the sleep travels with it to the workers."""

    def __init__(self, delay: float, seed: int = 0):
        self.delay, self.seed = delay, seed

    def __call__(self, region):
        time.sleep(self.delay)
        return values(np.arange(region[0].start, region[0].stop), np.arange(region[1].start, region[1].stop),
                      self.seed)


class SlowBlock:
    """``fn(key)`` for ``td.from_function``: the block ``key`` of ``block``² chunks."""

    def __init__(self, delay: float, block: int, shape: tuple, seed: int = 0):
        self.region, self.block, self.shape = SlowRegion(delay, seed), block, shape

    def __call__(self, key):
        b, (n, m) = self.block, self.shape
        return self.region((slice(key[0] * b, min(n, (key[0] + 1) * b)), slice(key[1] * b, min(m, (key[1] + 1) * b))))


def _full(shape, seed=0):
    return values(np.arange(shape[0]), np.arange(shape[1]), seed)


def _slow(api: str, shape: tuple, block: int, delay: float, name: str, seed: int = 0):
    if api == "array":
        return td.from_region(SlowRegion(delay, seed), shape, "float64", chunks=block, name=name)
    return td.from_function(SlowBlock(delay, block, shape, seed), shape, block, "float64", name=name)


def _held(api: str, x: np.ndarray, block: int, name: str):
    """An in-process array (scattered to its sites when the plan runs)."""
    if api == "array":
        return td.from_array(x, chunks=block, name=name)
    return td.from_numpy(x, (block, min(block, x.shape[1])), name=name)


def _softmax_rows(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def ffnn_numpy(X, Y, W1, W2, lr):
    """The step of ``tra_dask.programs.ffnn_sgd_step`` in numpy (its docstring's formulas)."""
    Z1 = X @ W1
    A1 = np.maximum(Z1, 0)
    dZ2 = (_softmax_rows(A1 @ W2) - Y) / X.shape[0]
    dW2 = A1.T @ dZ2
    dW1 = X.T @ ((dZ2 @ W2.T) * (Z1 > 0))
    return W1 - lr * dW1, W2 - lr * dW2


class Workload:
    """One workload written in one API: ``run(client)`` submits it as a user does and
    returns ``(results as numpy arrays, the result objects of its last submission)``;
    ``want`` is numpy's answer; ``exact(got)`` compares."""

    def __init__(self, api: str, name: str, n: int = 600, block: int = 100, delay: float = 0.15):
        if api not in APIS or name not in WORKLOADS:
            raise ValueError(f"no workload {name!r} in the {api!r} API; workloads {WORKLOADS}, APIs {APIS}")
        self.api, self.name = api, name
        if name == "FFNN step":
            d, h, labels = n // 2, n // 3, 10
            rng = np.random.default_rng(0)
            Y = np.eye(labels)[rng.integers(0, labels, n)]
            W1, W2 = rng.random((d, h)) * 0.01, rng.random((h, labels)) * 0.01
            X = _slow(api, (n, d), block, delay, "X")
            args = (X, _held(api, Y, block, "Y"), _held(api, W1, block, "W1"), _held(api, W2, block, "W2"), 0.1)
            if api == "array":
                from tra_dask.programs.arrays import ffnn_sgd_step_array as step
            else:
                from tra_dask.programs import ffnn_sgd_step as step
            self.exprs = [step(*args)]
            self.want = list(ffnn_numpy(_full((n, d)), Y, W1, W2, 0.1))
            self.tolerance = 1e-10
            return
        a, b = _full((n, n)), _full((n, n), seed=1)
        A, B = _slow(api, (n, n), block, delay, "A"), _held(api, b, block, "B")
        first = self._matmul(A, B)
        self.tolerance = 0.0
        if name == "matmul":
            self.exprs, self.want = [first], [a @ b]
        else:  # chain: the result is an input of a second expression
            c = _full((n, n), seed=2)
            self.exprs, self.want = [first], [a @ b @ c]
            self.c = _held(api, c, block, "C")

    def _matmul(self, x, y):
        if self.api == "array":
            return td.einsum("ij,jk->ik", x, y)
        from tra_dask.programs import matmul

        return matmul(x, y)

    def run(self, client):
        out = td.submit(self.exprs[0], client=client)
        self.earlier = []  # result objects of earlier submissions of this run (their recoveries count)
        if self.name == "chain":
            src = td.from_array(out) if self.api == "array" else out
            self.earlier = [out]
            out = td.submit(self._matmul(src, self.c), client=client)
        outs = list(out) if isinstance(out, tuple) else [out]
        return [o.to_numpy() for o in outs], outs

    def exact(self, got) -> bool:
        if len(got) != len(self.want):
            return False
        if self.tolerance == 0.0:
            return all(g.shape == w.shape and np.array_equal(g, w) for g, w in zip(got, self.want))
        return all(g.shape == w.shape and np.allclose(g, w, rtol=self.tolerance, atol=1e-12)
                   for g, w in zip(got, self.want))


# ---------------------------------------------------------------------------
# faults


def workers_of(client) -> list[str]:
    from tra_dask.runtime import workers_info

    return sorted(workers_info(client))


def pids_of(client, workers) -> dict:
    return client.run(os.getpid, workers=list(workers))


def _scatter_holder(outs) -> str | None:
    """The worker that received most of the in-process chunks of the submission behind
    ``outs`` (its first run)."""
    lowered = outs[0]._submission.generations[0]
    held = {w: len(keys) for w, keys in lowered.scatter.items() if keys}
    return max(held, key=held.get) if held else None


def _plan_of(fault: str, workers: list[str], holder: str | None) -> list[tuple[float, str, int]]:
    """``[(fraction of the no-failure time, worker, signal)]``."""
    if len(workers) < WORKERS:
        raise RuntimeError(f"the cluster has {len(workers)} workers, not {WORKERS}: settle() it first")
    if fault.startswith("kill at"):
        return [(int(fault.split()[-1].rstrip("%")) / 100, workers[1], signal.SIGKILL)]
    if fault.startswith("SIGSTOP"):
        return [(0.0, workers[1], signal.SIGSTOP)]
    if fault.startswith("two kills"):
        return [(0.25, workers[1], signal.SIGKILL), (0.6, workers[2], signal.SIGKILL)]
    if fault.startswith("scatter holder"):
        if holder is None:
            raise ValueError("the workload scatters nothing: no worker holds scattered data")
        return [(0.25, holder, signal.SIGKILL)]
    raise ValueError(f"no fault {fault!r}; faults {FAULTS}")


def measure(client, work: Workload, repeat: int = 1):
    """A warm-up run (plans cached, data sent, code imported) and ``repeat`` timed runs
    with no failure: ``(median seconds or None, the worker holding most scattered
    chunks)``; every run checked against numpy."""
    got, outs = work.run(client)
    if not work.exact(got):
        raise AssertionError(f"{work.api} {work.name}: the run with no failure is not exact")
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        got, outs = work.run(client)
        times.append(time.monotonic() - t0)
        if not work.exact(got):
            raise AssertionError(f"{work.api} {work.name}: the run with no failure is not exact")
    return (statistics.median(times) if times else None), _scatter_holder(outs)


def faulted(client, work: Workload, fault: str, base: float, holder: str | None = None):
    """One run of ``work`` with ``fault`` injected at its fraction of ``base`` seconds:
    ``(seconds, exact, what the recovery says, stopped pids)``.  A stopped worker is
    continued after the run (the caller waits for the cluster to settle)."""
    workers = workers_of(client)
    shots = _plan_of(fault, workers, holder)
    pids = pids_of(client, {w for _, w, _ in shots})
    timers = [threading.Timer(at * base, os.kill, (pids[w], sig)) for at, w, sig in shots if at > 0]
    stopped = [pids[w] for _, w, sig in shots if sig == signal.SIGSTOP]
    for at, w, sig in shots:
        if at == 0:  # before the user's call
            os.kill(pids[w], sig)
    t0 = time.monotonic()
    for t in timers:
        t.start()
    try:
        got, outs = work.run(client)
        seconds = time.monotonic() - t0
    finally:
        for t in timers:
            t.cancel()
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # the removed worker's nanny ended it
                pass
    notes = [note for o in work.earlier + outs for _, note in o.recoveries]
    return seconds, work.exact(got), "; ".join(dict.fromkeys(notes)), stopped


def settle(client, n: int = WORKERS, timeout: float = 40.0) -> bool:
    """Wait until the cluster has ``n`` workers again; False if it has not after
    ``timeout`` s.  A killed worker's nanny starts a new one, but not every time (a
    worker removed as frozen, a nanny whose worker died soon after it started it
    again leaves the cluster): after 5 s a ``LocalCluster`` is scaled back to ``n``."""
    deadline, scaled = time.monotonic() + timeout, False
    start = time.monotonic()
    while time.monotonic() < deadline:
        if len(workers_of(client)) >= n:
            return True
        cluster = getattr(client, "cluster", None)
        if not scaled and time.monotonic() - start > 5 and hasattr(cluster, "scale"):
            cluster.scale(n)
            scaled = True
        time.sleep(0.2)
    return False


# ---------------------------------------------------------------------------


def _short(note: str) -> str:
    if not note:
        return "none needed"
    what = []
    if "stopped answering" in note:
        what.append("frozen worker removed")
    if "resumed" in note:
        what.append(note.split("resumed on ", 1)[1].split(";")[0].split(" (")[0])
    elif "planned again" in note:
        what.append("planned again whole")
    return "; ".join(dict.fromkeys(what)) or note[:60]


def main(argv=None) -> None:
    import argparse

    from _harness import start_cluster
    from _report import write_section

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scale", type=float, default=1.0, help="fraction of the sizes (n = 900 × scale)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--delay", type=float, default=0.15, help="seconds each slow chunk sleeps")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat, a few cells: a smoke test")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    n = max(200, int(900 * (0.25 if args.quick else args.scale)) // 100 * 100)
    repeat = 1 if args.quick else args.repeat
    faults = FAULTS[:1] if args.quick else FAULTS
    rows = []
    spec = None
    with dask.config.set(CONFIG):
        for api in APIS:
            for name in WORKLOADS:
                work = Workload(api, name, n=n, block=100, delay=args.delay)
                client = None
                try:
                    for fault in faults:
                        if client is None:
                            client = start_cluster(WORKERS)
                            if spec is None:
                                spec = td.cluster_spec(client)  # calibrated once, kept for every cluster
                            else:
                                td.set_cluster_spec(client, spec)
                            base, holder = measure(client, work, repeat)
                            print(f"{api} {name} (n={n}): {base:.2f} s with no failure", flush=True)
                        seconds, ok, note, stopped = faulted(client, work, fault, base, holder)
                        rows.append((api, name, fault, base, seconds, ok, _short(note)))
                        print(f"  {fault}: {seconds:.2f} s = {seconds / base:.2f}× exact={ok} [{_short(note)}]",
                              flush=True)
                        if not settle(client):  # a new cluster
                            client.close()
                            client = None
                        else:
                            holder = measure(client, work, 0)[1]  # warm again: the new worker, the plan for it
                finally:
                    if client is not None:
                        client.close()
    ratios = [r[4] / r[3] for r in rows]
    print(f"{sum(r[5] for r in rows)}/{len(rows)} exact; ratio median {statistics.median(ratios):.2f}, "
          f"max {max(ratios):.2f}", flush=True)
    if args.write:
        stamp = (f"{datetime.date.today()} on {platform.node()} ({os.cpu_count()} cores), {WORKERS} workers × 1 "
                 f"thread, `tra-dask.worker-timeout` {WORKER_TIMEOUT:g} s")
        lines = [f"{stamp}; `python benchmarks/faults.py{' --quick' if args.quick else ''}` (n = {n}, "
                 f"blocks of 100, the slow operand's chunks sleep {args.delay:g} s each). Time is from the "
                 f"user's `td.submit` (the plan cached by a warm-up run) to the results gathered as numpy; the "
                 f"no-failure time is the median of {repeat} runs. Faults are injected by a timer at their "
                 f"fraction of that time: SIGKILL of a worker the plan pins tasks to (its nanny starts a new "
                 f"one under another address), SIGSTOP before the call (the worker is removed after the worker "
                 f"timeout and continued after the run), two workers SIGKILLed one after the other, and SIGKILL of the "
                 f"worker that holds most of the scattered in-process chunks. Exact: equal to numpy "
                 f"(FFNN: within 1e-10). {sum(r[5] for r in rows)} of {len(rows)} cells exact; ratio median "
                 f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}, "
                 f"{sum(x <= 2 for x in ratios)} of {len(rows)} within 2×.", "",
                 "| API | workload | fault | no failure s | with failure s | ratio | exact | recovery |",
                 "|---|---|---|---|---|---|---|---|"]
        for api, name, fault, base, seconds, ok, note in rows:
            lines.append(f"| {api} | {name} | {fault} | {base:.2f} | {seconds:.2f} | {seconds / base:.2f} | "
                         f"{'yes' if ok else '**no**'} | {note} |")
        write_section("fault matrix", lines)
    if not all(r[5] for r in rows):
        sys.exit("a result after a fault was not exact")


if __name__ == "__main__":
    main()
