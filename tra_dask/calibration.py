"""``td.calibrate(client)``: measure a Dask cluster for the time model.

A few seconds of measurements on the workers themselves (runtime layer: it talks to
``distributed``):

* **kernel rates** — every worker at once (so cores shared by several workers on one
  host are shared as they will be when a plan runs) times a float64 matrix product
  (``"blas"``, flops/s) and an elementwise add (``"elementwise"``, elements/s), the
  median over workers;
* **task overhead** — a batch of empty tasks pinned to one worker, end to end
  through the scheduler (seconds per task);
* **bandwidth** — an array made on one worker, then read by a task pinned to another
  (seconds beyond an empty task's, per byte), within a host and, when the workers
  span hosts, between hosts;
* **memory and threads** — the workers' own ``memory_limit`` and ``nthreads``.

The runtime calibrates a cluster once and caches the spec per scheduler address
(:func:`cluster_spec`); ``ClusterSpec.save``/``load`` keep it in a file.
"""

from __future__ import annotations

import datetime
import statistics
import time

import numpy as np

from .optimizer.cluster import ClusterSpec

__all__ = ["calibrate", "cluster_spec"]

_CACHE: dict = {}


def _kernel_rates(n: int = 512, elems: int = 2_000_000, seconds: float = 0.25) -> dict:
    """Run on a worker: the best rate of a few repetitions of each kernel class."""
    import time as _time

    import numpy as _np

    rng = _np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    x, y = rng.random(elems), rng.random(elems)

    def best(fn, work):
        fn()
        t_end, rates = _time.perf_counter() + seconds, []
        while _time.perf_counter() < t_end or len(rates) < 2:
            t0 = _time.perf_counter()
            fn()
            rates.append(work / max(_time.perf_counter() - t0, 1e-9))
        return max(rates)

    return {"blas": best(lambda: a @ b, 2.0 * n ** 3), "elementwise": best(lambda: _np.add(x, y), float(elems))}


def _make(nbytes):
    return np.ones(nbytes // 8)


def _size(x):
    return int(getattr(x, "nbytes", 0))


def _noop(*args):  # noqa: ARG001
    return None


def _one_trip(client, dep, worker) -> float:
    """Seconds for a task on ``worker`` that reads the future ``dep`` (None: an empty task)."""
    t0 = time.perf_counter()
    fut = (client.submit(_size, dep, workers=[worker], allow_other_workers=False, pure=False) if dep is not None
           else client.submit(_noop, workers=[worker], allow_other_workers=False, pure=False))
    fut.result()
    dt = time.perf_counter() - t0
    fut.release()
    return dt


def calibrate(client, *, transfer_bytes: int = 32 * 2**20, tasks: int = 100) -> ClusterSpec:
    """Measure ``client``'s cluster (module doc) and return its :class:`ClusterSpec`
    (``spec.source`` says when and where it was measured; ``spec.seconds`` how long
    it took is in the source text)."""
    from distributed import Client

    if not isinstance(client, Client):
        raise TypeError(f"calibrate needs a distributed.Client, got {type(client).__name__}")
    if client.status != "running":
        raise RuntimeError(f"the Dask client is {client.status}; calibrate a running cluster")
    started = time.perf_counter()
    info = client.scheduler_info(n_workers=-1)["workers"]
    workers = sorted(info)
    if not workers:
        raise RuntimeError("calibrate: the cluster has no workers; start some (dask worker <scheduler>) first")
    # kernel rates, every worker at once
    per_worker = client.run(_kernel_rates, workers=workers)
    rates = {k: statistics.median(r[k] for r in per_worker.values()) for k in ("blas", "elementwise")}
    # task overhead: empty tasks pinned to one worker, end to end
    _one_trip(client, None, workers[0])  # warm
    t0 = time.perf_counter()
    futs = client.map(_noop, range(tasks), workers=[workers[0]], allow_other_workers=False, pure=False)
    client.gather(futs)
    overhead = (time.perf_counter() - t0) / tasks
    del futs
    # bandwidth: an array made on one worker, read by a task on another
    hosts = [info[w].get("host") or w.rsplit(":", 1)[0] for w in workers]
    local = remote = None
    if len(workers) > 1:
        src = workers[0]
        same = next((w for w, h in zip(workers[1:], hosts[1:]) if h == hosts[0]), None)
        other = next((w for w, h in zip(workers[1:], hosts[1:]) if h != hosts[0]), None)
        for dest in (same, other):
            if dest is None:
                continue
            bw = _bandwidth(client, src, dest, transfer_bytes)
            if dest == same:
                local = bw
            else:
                remote = bw
    bandwidth = remote or local or 4.5e8
    memory = [info[w].get("memory_limit") or 0 for w in workers]
    memory = min([m for m in memory if m > 0], default=4e9)
    threads = min(int(info[w].get("nthreads") or 1) for w in workers)
    host_ids = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
    took = time.perf_counter() - started
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return ClusterSpec(
        sites=len(workers), memory_per_site=float(memory), bandwidth=float(bandwidth),
        bandwidth_local=float(local or bandwidth), hosts=tuple(host_ids[h] for h in hosts), rates=rates,
        task_overhead=float(overhead), threads=threads,
        source=f"calibrated on {client.scheduler.address} at {stamp} in {took:.1f} s",
    )


def _bandwidth(client, src: str, dest: str, nbytes: int) -> float:
    """Bytes/s of one transfer ``src`` -> ``dest`` (beyond an empty task's time)."""
    best = float("inf")
    for _ in range(2):
        data = client.submit(_make, nbytes, workers=[src], allow_other_workers=False, pure=False)
        data.result()
        empty = min(_one_trip(client, None, dest) for _ in range(2))
        trip = _one_trip(client, data, dest)
        best = min(best, max(trip - empty, 1e-6))
        data.release()
    return nbytes / best


def cluster_spec(client, *, calibrate_: bool = True) -> ClusterSpec:
    """The cached spec of ``client``'s cluster: calibrated the first time it is asked
    for (per scheduler address and worker set), or the defaults when
    ``calibrate_`` is False."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    if not calibrate_:
        return ClusterSpec(sites=max(1, len(info)))
    key = (client.scheduler.address, tuple(sorted(info)))
    spec = _CACHE.get(key)
    if spec is None:
        spec = _CACHE[key] = calibrate(client)
    return spec
