"""``td.calibrate(client)``: measure a Dask cluster for the time model.

A few seconds of measurements on the cluster itself (runtime layer: it talks to
``distributed``):

* **kernel rates** — every worker at once (so cores shared by several workers on one
  host are shared as they will be when a plan runs) runs a float64 matrix product
  at two sizes (``"blas"``: the peak and the size at half of it), a float32 one at
  the larger size (its rate over float64's: ``blas_float32``) and an elementwise
  add into an array it has (``"elementwise"``, elements/s: the result's new array
  is the new-memory term's) for a window, and the throughput over the window counts
  (work done / time taken); each window's mean over a host's workers (they ran it
  at once: the host's rate per worker), the median over the workers.  Then one worker of each host
  with several runs the large product and the add again while the host's others
  idle (``rates_alone``, where that is faster: the rates of a plan that keeps one
  worker of a host busy);
* **a loaded machine** — each probe runs in three windows and keeps the quiet
  reading (:func:`quiet_reading`: the highest rate, a low quantile of seconds; a
  rate's window is read as its mean over the host's workers, :func:`host_rate`), as
  do the overheads below (the bandwidth keeps its rounds' total, the matmul rate in a
  plan its best run); where repeats disagree by more than 2x (``NOISY``) the spec's
  ``source`` says so and ``td.calibrate`` warns (rates read 4-17x low and task
  costs 4-12x high while other processes kept the development VM's cores busy);
* **new memory** — the same way, the bytes/s at which a worker writes new arrays
  as a plan's kernels make them: rounds of four arrays of up to 16 MiB, kept
  together, then freed (a kernel's results live until their readers ran).  It is
  the worker's allocator that decides: one that keeps freed memory (the embedded
  cluster's workers, :func:`tra_dask.runtime.worker_config`) writes into memory it
  touched before (21-26 GB/s on the development VM); Dask's default settings
  return every freed array to the OS, so each new one faults its pages in again
  (3.5-8 GB/s there, and 0.5-3 GB/s when the VM's host has not backed the pages
  yet).  Memory a worker never touched before is not modelled;
* **bandwidth** — as a plan's Broadcast/Shuffle uses the links: every worker at once
  reads an array made on another (a ring: each sends one and receives one), the
  bytes each worker sent plus received per second beyond a round of empty tasks —
  within a host (each host's workers in a ring) and, when the workers span hosts,
  between hosts (each worker from one on another host).  Transfers at once share
  the cores that serialise and copy them: with 3 workers on the development VM's 2
  cores a ring moved 0.6-1.1 GB/s each way per worker where one transfer alone got
  1.7-3.1 GB/s (a 2-worker ring: 1.2-1.9 vs 1.5-3.0), and the shuffles of a plan ran
  at the ring's rate — a transfer is work at both ends, which the time model charges
  (:mod:`tra_dask.optimizer.time`);
* **the way to the client** — every worker makes an array and the client gathers
  them as it gathers a result (:mod:`tra_dask.runtime.gather`), then copies them into
  one new array as it assembles one: the bytes/s of each over three rounds
  (``client_bandwidth``, ``assemble_bandwidth``: what ``td.compute`` adds to a plan);
* **overheads** — two tra_dask plans on tiny chunks (so kernels and bytes are
  negligible) with few and with many tasks, submitted and waited for as a user does,
  five times each: the line through their quiet readings gives the seconds per
  submission and per task;
* **the matmul rate in a plan** — a multiply in 1024² blocks on persisted inputs
  with enough block products to keep every worker busy, planned for the time
  objective and run three times (the best kept): the rate at which the
  model predicts its wall time replaces the kernel's solo peak when lower (kernels
  share the cores with the scheduler, the client and transfers);
* **GPUs** — where every worker has one (cupy sees a device), one worker per device
  measures it (the devices at once; workers sharing a device would measure each
  other): matmul rates per dtype at two sizes, elementwise adds, copies device ↔
  host, a kernel launch, and its memory (:class:`GpuSpec`, with how many workers
  share a device), and the ring of transfers again with device arrays (device →
  host → network → host → device, as Dask moves them, end to end); plans over cupy
  data are then priced on the devices.  The matmul rate in a plan (below) is
  measured on the host only;
* **memory, threads and cores** — the workers' own ``memory_limit`` and
  ``nthreads``, and the cores each worker's process may use (``dask.system``'s
  count: affinity and cgroup quota): where a host's workers have more threads than
  it has cores, the time model lets a busy worker take an idle one's core.

The runtime calibrates a cluster once and caches the spec per scheduler address
(:func:`cluster_spec`); ``td.calibrate(client, refresh=True)`` measures it again
and replaces the cached spec; ``ClusterSpec.save``/``load`` keep it in a file.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import threading
import time
import warnings
from collections import Counter
from urllib.parse import urlsplit

import dask
import numpy as np

from ..optimizer import optimize
from ..optimizer.cluster import ClusterSpec, GpuSpec
from ..optimizer.time import plan_seconds
from ..programs import matmul, random_uniform
from .cluster import _wait_done, run_on_workers, workers_info
from .gather import gather
from .resident import _cluster_placements, from_dask_array, refresh_sources

__all__ = ["calibrate", "cluster_spec", "set_cluster_spec", "quiet_reading", "host_rate"]

_CACHE: dict = {}  # (scheduler address, cluster shape) -> spec
_CACHE_LOCKS: dict = {}
_KEY_OF: dict = {}  # (scheduler address, its workers' addresses) -> the _CACHE key of that shape


def _kernel_rates(sizes=(64, 512), elems: int = 2_000_000, seconds: float = 0.3,
                  fresh_bytes: int = 2**27, alone: bool = False, start: float | None = None) -> dict:
    """Run on a worker (all workers at once, or one of a host with ``alone``): the
    throughput of each kernel class (matmul at each of ``sizes``) over windows of
    repetitions — work done / time taken, not the best repetition's rate: where
    workers share cores (more workers than cores on a host) a single repetition often
    has a core to itself, which a plan keeping every worker busy does not get.  Each
    probe runs :data:`REPEATS` windows in turn, each reading returned (a list per
    probe): every worker runs its windows at once, so the caller takes each window's
    mean over a host's workers and keeps the quiet window (:func:`host_rate`).
    Windows of 0.3 s in all for the rates the model uses most (elementwise, the large
    matmul): with 0.15 s, four calibrations of one 3-worker cluster on 2 cores read
    the matmul rate at 6.3-8.3e10/s (and 4.6e10 in another run), with 0.4 s
    6.6-7.1e10; half of it for the rest (the small matmul, new memory, the float32
    ratio: its fastest turns).  The elementwise rate is an add into an array the
    worker has (``out=``): making a kernel's result, a new array, is the new-memory
    term's (``"fresh"``), so that the time model counts a result's write once.
    ``"exp"``: elements/s of ``exp`` into an array the worker has (compute bound: what
    a transcendental element costs in adds, the spec's ``exp_cost``).
    ``alone``: the large matmul and the add only, on half the windows (the rates of
    a worker whose host's other workers idle).  ``start``: the wall-clock time
    (``time.time()``: one clock for a host's workers) at which the first probe's
    windows begin; each later probe's begin where the one before ends, plus
    :data:`SYNC_MARGIN` for its untimed call, so that a host's workers run window i
    of each probe at the same moments (started as they were called, 3 workers began
    85-92 ms apart, against windows of 100 ms)."""
    import numpy as _np

    rng = _np.random.default_rng(0)
    x, y, z = rng.random(elems), rng.random(elems), _np.empty(elems)
    at = [start]  # when the next probe's windows begin (None: the first as soon as it is called)

    def probe(fn, work, window):
        fn()  # untimed, once: the windows that follow run warm, one after the other
        w = window / REPEATS
        begin = time.time() if at[0] is None else at[0]
        at[0] = begin + window + SYNC_MARGIN
        if begin > time.time():
            time.sleep(begin - time.time())
        return [_throughput(fn, work, w, warm=False, until=begin + (i + 1) * w) for i in range(REPEATS)]

    if alone:
        n = sizes[-1]
        a, b = rng.random((n, n)), rng.random((n, n))
        return {"elementwise": probe(lambda: _np.add(x, y, out=z), float(elems), seconds / 2),
                f"blas{n}": probe(lambda: a @ b, 2.0 * n ** 3, seconds / 2)}
    out = {"elementwise": probe(lambda: _np.add(x, y, out=z), float(elems), seconds)}
    # new arrays as a plan makes them: a round of arrays kept until their readers ran,
    # then freed, the next round written where the worker's allocator puts it (after
    # the untimed first round: memory the worker already touched, if it keeps freed
    # memory; fresh pages each time if it returns it to the OS, as Dask's defaults do)
    # (four arrays a round read the rates eight did, in half the time: benchmarks/README.md)
    m = max(1, min(2 * elems, fresh_bytes // 64))

    def one_round():
        kept = [_np.ones(m) for _ in range(4)]
        return len(kept)

    out["fresh"] = probe(one_round, 32.0 * m, seconds / 2)
    out["exp"] = probe(lambda: _np.exp(x, out=z), float(elems), seconds / 4)  # a compute-bound elementwise kernel
    for n in sizes:
        a, b = rng.random((n, n)), rng.random((n, n))
        out[f"blas{n}"] = probe(lambda a=a, b=b: a @ b, 2.0 * n ** 3, seconds if n == sizes[-1] else seconds / 2)
    out["blas_float32"] = _float32_speedup(rng, sizes[-1], seconds / 2)
    return out


def host_rate(per_worker: dict, key: str, host_of: dict) -> tuple[float, float]:
    """``(rate, spread)`` of probe ``key`` from :func:`_kernel_rates`' readings
    (``per_worker``: worker -> its result; ``host_of``: worker -> host): per host, each
    window's mean over the host's workers — they ran that window at once, so the mean
    is the host's throughput per worker, what the spec's rates mean — and the quiet
    window of those (:func:`quiet_reading`); the median over the workers of each
    host's rate (a host of three workers counts three times), and how far any host's
    windows disagreed.  Not each worker's own quiet window: where a host has
    more workers than cores, the OS gives a worker a core to itself in some windows
    and a share in others, and each worker's best window read the rate alone (3
    one-thread workers on 2 cores: 0.8-1.1e9 adds/s a worker, in windows whose mean
    was 0.7e9; the median over workers was the rate alone in one calibration and
    a third of it in another).

    >>> host_rate({"a": {"k": [3.0, 1.0]}, "b": {"k": [1.0, 3.0]}, "c": {"k": [2.0, 2.0]}},
    ...           "k", {"a": "h", "b": "h", "c": "h"})
    (2.0, 1.0)
    """
    rates, spread = [], 1.0
    for ws in _by_host(list(per_worker), [host_of[w] for w in per_worker]).values():
        windows = [per_worker[w][key] for w in ws]
        n = min(len(w) for w in windows)  # (the windows every worker of the host ran)
        rate, disagree = quiet_reading(np.mean([w[:n] for w in windows], axis=0))
        rates += [rate] * len(windows)
        spread = max(spread, disagree)
    return statistics.median(rates), spread


# windows per probe of a rate: the quiet one is kept (quiet_reading)
REPEATS = 3
# seconds between one probe's last window and the next one's first, for the next
# one's untimed call (a 512² matmul: 7-40 ms on a shared core); and from the call of
# the workers to their first window (they import and allocate first)
SYNC_MARGIN = 0.04
START_MARGIN = 0.15
# repeats of a probe that disagree by more than this ratio: the machine was loaded
# while it was measured (the spec's source says so, and td.calibrate warns); repeats on
# the quiet 2-core development VM disagreed up to 1.6x (the overheads' tiny plans)
NOISY = 2.0


def quiet_reading(readings, *, rate: bool = True, quantile: float = 0.25) -> tuple[float, float]:
    """``(the quiet reading, how far the readings disagree)`` of repeats of one
    probe.  A loaded machine only ever slows a probe down, never speeds it up, so the
    quiet reading of a rate (``rate``) is the highest and of a cost (seconds: an
    overhead) a low ``quantile`` (not the lowest: one lucky run of a scheduler
    round-trip is not what every task gets); the disagreement is the largest reading
    over the smallest (1: all alike).

    >>> quiet_reading([1e9, 2.5e9, 2.4e9])
    (2500000000.0, 2.5)
    >>> quiet_reading([0.010, 0.002, 0.0021, 0.0022, 0.009], rate=False)
    (0.0021, 5.0)
    """
    got = sorted(float(r) for r in readings)
    if not got or got[0] <= 0 or any(not np.isfinite(r) for r in got):
        raise ValueError(f"quiet_reading: readings must be positive and finite, got {readings!r}")
    q = got[-1] if rate else got[min(len(got) - 1, int(quantile * len(got)))]
    return q, got[-1] / got[0]


def _float32_speedup(rng, n: int, seconds: float) -> float:
    """A float32 n×n×n product's rate over a float64 one's: the two run in turns over
    one window, and the ratio of their fastest runs (a run without a preemption: on
    3 workers sharing 2 cores the ratio of the summed times read 1.2 once and the
    median of the turns' ratios 5.8 once, against 2.3-2.5 alone — preemptions land
    on one product of a turn and not the other)."""
    a, b = rng.random((n, n)), rng.random((n, n))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    a @ b, a32 @ b32
    t64 = t32 = float("inf")
    clock = time.perf_counter
    t0, turns = clock(), 0
    while clock() < t0 + seconds or turns < 3:
        s = clock()
        a @ b
        m = clock()
        a32 @ b32
        t64, t32, turns = min(t64, m - s), min(t32, clock() - m), turns + 1
    return t64 / max(t32, 1e-9)


def _throughput(fn, work: float, seconds: float, clock=time.perf_counter, warm: bool = True,
                until: float | None = None) -> float:
    """``work`` per second of ``fn`` over a window of at least ``seconds`` and three
    calls (``until``: to that wall-clock time, ``time.time()``, instead), after one
    untimed call (``warm``; False where ``fn`` just ran): all the calls' work over all
    their time (a slow call counts, as it does in a plan), not the fastest call's rate."""
    if warm:
        fn()
    t0 = clock()
    reps = 0
    if until is None:
        until, now = t0 + seconds, clock
    else:
        now = time.time
    while now() < until or reps < 3:
        fn()
        reps += 1
    return reps * work / max(clock() - t0, 1e-9)


def _gpu_rates(sizes=(1024, 4096), elems: int = 2**24, seconds: float = 0.2, nbytes: int = 2**26) -> dict | None:
    """Run on a worker (all workers at once): its GPU's numbers for :class:`GpuSpec`,
    or None where the worker has no GPU (no cupy, no device).  Matmul throughput per
    dtype at two sizes (the peak and half size through them, as on the host),
    elementwise adds, copies of ``nbytes`` device → host and host → device (pageable
    host memory, as Dask's TCP comms use), the seconds of a tiny kernel launched and
    waited for, and the device's memory and name.  Every timing synchronises the
    device (cupy's kernels return before they finish)."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        dev = cupy.cuda.Device()
        free, total = dev.mem_info
    except Exception:  # no cupy, no driver, no device
        return None
    sync = cupy.cuda.get_current_stream().synchronize

    def timed(fn):
        def run():
            fn()
            sync()
        return run

    out = {"memory": float(total), "name": cupy.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()}
    rng = cupy.random.default_rng(0)
    for dtype in ("float32", "float64"):
        for n in sizes:
            if 2 * n * n * 8 * 3 > free / 4:
                continue
            a = rng.random((n, n), dtype=dtype)
            b = rng.random((n, n), dtype=dtype)
            out[f"{dtype}@{n}"] = _throughput(timed(lambda a=a, b=b: a @ b), 2.0 * n ** 3, seconds)
            del a, b
    x = cupy.ones(elems)
    y = cupy.ones(elems)
    out["elementwise"] = _throughput(timed(lambda: cupy.add(x, y)), float(elems), seconds)
    tiny = cupy.ones(16)
    out["launch"] = 1.0 / _throughput(timed(lambda: cupy.add(tiny, tiny)), 1.0, seconds / 2)
    d = cupy.ones(nbytes // 8)
    h = d.get()
    out["to_host"] = _throughput(d.get, float(nbytes), seconds)
    out["from_host"] = _throughput(timed(lambda: cupy.asarray(h)), float(nbytes), seconds)
    del x, y, d
    cupy.get_default_memory_pool().free_all_blocks()
    return out


def _gpu_id() -> str | None:
    """Run on a worker: the UUID of the GPU it computes on (None without one)."""
    try:
        import cupy

        dev = cupy.cuda.Device()
        return bytes(cupy.cuda.runtime.getDeviceProperties(dev.id)["uuid"]).hex()
    except Exception:  # no cupy, no driver, no device
        return None


def _gpu_spec(client, workers: list, hosts: list) -> GpuSpec | None:
    """The cluster's :class:`GpuSpec`, or None unless every worker has a GPU.  Workers
    that share one device (several workers of a host on one GPU) would measure each
    other: one worker per device measures it (the devices at once), and
    ``sharing`` says how many workers share each (the largest count)."""
    ids = run_on_workers(client, _gpu_id, workers)
    if any(ids.get(w) is None for w in workers):
        return None
    groups: dict = {}
    for w, h in zip(workers, hosts):
        groups.setdefault((h, ids[w]), []).append(w)
    measured = run_on_workers(client, _gpu_rates, [ws[0] for ws in groups.values()])
    return _gpu_spec_of(measured, max(len(ws) for ws in groups.values()))


def _gpu_spec_of(per_device: dict, sharing: int = 1) -> GpuSpec | None:
    """A :class:`GpuSpec` from :func:`_gpu_rates` of one worker per device (the
    median, the smallest memory); None if one has no GPU."""
    got = list(per_device.values())
    if not got or any(r is None for r in got):
        return None

    def med(k):
        return statistics.median(r[k] for r in got)

    blas, half = {}, 0.0
    for dtype in ("float32", "float64"):
        measured = sorted(int(k.split("@")[1]) for k in got[0] if k.startswith(dtype + "@"))
        if not measured:
            continue
        if len(measured) > 1:
            peak, h = _blas_fit(med(f"{dtype}@{measured[0]}"), med(f"{dtype}@{measured[-1]}"),
                                small=measured[0], large=measured[-1])
            half = max(half, h) if dtype == "float32" else half
        else:
            peak = med(f"{dtype}@{measured[0]}")
        blas[dtype] = peak
    if not blas:
        return None
    return GpuSpec(memory=min(r["memory"] for r in got), blas=blas, elementwise=med("elementwise"),
                   to_host=med("to_host"), from_host=med("from_host"), blas_half_size=half,
                   launch=med("launch"), name=got[0]["name"], sharing=sharing)


def _blas_fit(r_small: float, r_large: float, small: int = 64, large: int = 512) -> tuple[float, float]:
    """``(peak, half size)`` of ``rate(n) = peak / (1 + half / n)`` through two
    measured rates (no fall-off measured: the larger rate, half size 0)."""
    denom = r_small / small - r_large / large
    if r_small >= r_large or denom <= 0:
        return max(r_small, r_large), 0.0
    half = (r_large - r_small) / denom
    return r_large * (1 + half / large), half


def _overheads(client, workers, runs: tuple = (5, 3)) -> tuple[float, float, float]:
    """``(per submission, per task, spread)`` seconds: plans on tiny chunks with few
    and many tasks, run ``runs`` times each, the quiet reading of each
    (:func:`quiet_reading`: a low quantile), and the line through them; ``spread``:
    how far the runs of one plan disagreed.  The one-task plan's run is one scheduler
    round trip, read five times; the many-task plan's averages over its tasks, read
    three times (benchmarks/README.md, "Calibration time")."""
    from .submit import submit

    points, spread = [], 1.0
    for n, times in zip((1, 6), runs):
        e = matmul(random_uniform((4 * n, 4 * n), (4, 4), seed=1, name="A"),
                   random_uniform((4 * n, 4 * n), (4, 4), seed=2, name="B"))
        plan = optimize(e, sites=len(workers), objective="bytes")
        walls = []
        for _ in range(times):
            t0 = time.perf_counter()
            submit(plan, client=client, sites=workers).wait()
            walls.append(time.perf_counter() - t0)
        wall, disagree = quiet_reading(walls, rate=False)
        points.append((plan.cost.tasks, wall))
        spread = max(spread, disagree)
    (n1, t1), (n2, t2) = points
    per_task = max((t2 - t1) / max(n2 - n1, 1), 1e-6)
    return max(t1 - per_task * n1, 1e-4), per_task, spread


def _in_situ(client, workers, spec: ClusterSpec, build, shape: tuple, chunk: int, with_rate, lo: float,
              hi: float) -> float:
    """The value of one spec parameter at which the time model predicts what a plan
    actually takes.  ``build(A, B)`` makes the plan's expression over two ``shape``
    inputs in ``chunk``² blocks, persisted where Dask puts them; it is planned as the
    model would (objective "time" on ``spec``: every worker busy), submitted and
    waited for three times, the best kept (the first run, after the probes above,
    is not slower than the next); ``with_rate(v)`` is ``spec`` with the parameter ``v``,
    bisected (geometrically) in ``[lo, hi]`` — the predicted time falls as it grows."""
    import math

    import dask.array as da
    from distributed import futures_of

    from .submit import submit

    rng = da.random.default_rng(7)
    a, b = (client.persist(rng.random(shape, chunks=chunk)) for _ in range(2))
    _wait_done(futures_of([a, b]), client, workers)  # distributed.wait would need a default client
    expr = build(from_dask_array(a, client=client, name="A"), from_dask_array(b, client=client, name="B"))
    runs, plans = [], {}
    for _ in range(3):
        for attempt in range(5):  # placed each time: a chunk's copies come and go (the last run's fetches)
            expr = refresh_sources(expr, client)
            where = _cluster_placements(expr, client, workers)
            at = (expr, tuple(where.items()))  # (the search is deterministic: same placements, same plan)
            if at not in plans:
                plans[at] = optimize(expr, sites=len(workers), placements=where, objective="time", cluster=spec)
            plan = plans[at]
            t0 = time.perf_counter()
            try:
                run = submit(plan, client=client, sites=workers)
                break
            except ValueError:  # a copy planned on was released meanwhile (submit checks): plan again
                if attempt == 4:
                    raise
                time.sleep(0.05)
        run.wait()
        runs.append((time.perf_counter() - t0, plan))
    measured, plan = min(runs, key=lambda r: r[0])

    def predicted(v):
        return plan_seconds(plan.cost, with_rate(v))[0]

    if predicted(hi) >= measured:
        return hi
    if predicted(lo) <= measured:
        return lo
    for _ in range(40):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if predicted(mid) > measured else (lo, mid)
    return lo


def _in_situ_blas(client, workers, spec: ClusterSpec, chunk: int = 1024) -> float:
    """The matmul rate a plan actually gets: a multiply in ``chunk``² blocks (enough
    block products for every worker: ``p``³ >= workers with ``p`` >= 2 blocks a
    side): the kernels of a task compete with the scheduler, the client and
    transfers on the same cores, which a kernel timed alone does not see.  Never
    above the measured peak."""
    import math

    p = max(2, math.ceil(len(workers) ** (1 / 3) - 1e-9))
    peak = spec.rates["blas"]
    return _in_situ(client, workers, spec, matmul, (p * chunk, p * chunk), chunk,
                    lambda v: dataclasses.replace(spec, rates=dict(spec.rates, blas=v)), 0.02 * peak, peak)


def _cores() -> int:
    """Run on a worker: the cores its process may use (affinity and cgroup quota
    counted, as Dask counts them)."""
    from dask.system import CPU_COUNT

    return int(CPU_COUNT)


def _make(nbytes):
    return np.ones(nbytes // 8)


def _make_device(nbytes):
    import cupy

    out = cupy.ones(nbytes // 8)
    cupy.cuda.runtime.deviceSynchronize()
    return out


def _size(x):
    return int(getattr(x, "nbytes", 0))


def _noop(*args):  # noqa: ARG001
    return None


def calibrate(client, *, transfer_bytes: int = 32 * 2**20, refresh: bool = False) -> ClusterSpec:
    """Measure ``client``'s cluster (module doc) and return its :class:`ClusterSpec`
    (``spec.source`` says when and where it was measured, how long it took, and
    whether the machine looked loaded: repeats of a probe that disagreed by more than
    :data:`NOISY` times, which also warns).  ``refresh``: the runtime plans on the new
    spec from now on (it keeps the spec it calibrated on a cluster's first plan for
    the cluster's life: refresh one read on a loaded machine)."""
    from distributed import Client

    if not isinstance(client, Client):
        raise TypeError(f"calibrate needs a distributed.Client, got {type(client).__name__}")
    if client.status != "running":
        raise RuntimeError(f"the Dask client is {client.status}; calibrate a running cluster")
    started = time.perf_counter()
    info = workers_info(client)
    workers = sorted(info)
    if not workers:
        raise RuntimeError("calibrate: the cluster has no workers; start some (dask worker <scheduler>) first")
    # kernel rates, every worker at once
    memory = [info[w].get("memory_limit") or 0 for w in workers]
    memory = min([m for m in memory if m > 0], default=4e9)
    # kept arrays: at most 1/8 of a worker's memory
    per_worker = run_on_workers(client, _kernel_rates, workers, fresh_bytes=int(min(2**27, memory / 8)),
                                start=time.time() + START_MARGIN)
    hosts = [info[w].get("host") or w.rsplit(":", 1)[0] for w in workers]
    host_of = dict(zip(workers, hosts))
    med, spread = {"blas_float32": statistics.median(r["blas_float32"] for r in per_worker.values())}, 1.0
    for k in ("elementwise", "blas64", "blas512", "fresh", "exp"):
        med[k], disagree = host_rate(per_worker, k, host_of)
        spread = max(spread, disagree)
    peak, half = _blas_fit(med["blas64"], med["blas512"])
    rates = {"blas": peak, "elementwise": med["elementwise"]}
    # the same kernels on one worker of each host of several while the others idle
    firsts = [ws[0] for ws in _by_host(workers, hosts).values() if len(ws) > 1]
    speedup = {}
    if firsts:
        alone = run_on_workers(client, _kernel_rates, firsts, alone=True, start=time.time() + START_MARGIN)
        for cls, k in (("blas", "blas512"), ("elementwise", "elementwise")):
            rate, disagree = host_rate(alone, k, host_of)
            speedup[cls], spread = rate / med[k], max(spread, disagree)
    submit_overhead, task_overhead, noise = _overheads(client, workers)
    spread = max(spread, noise)
    # bandwidth: every worker at once reads an array made on another
    local_pairs, remote_pairs = _rings(workers, hosts)
    local = _bandwidth(client, local_pairs, transfer_bytes) if local_pairs else None
    remote = _bandwidth(client, remote_pairs, transfer_bytes) if remote_pairs else None
    bandwidth = remote or local or 4.5e8
    threads = min(int(info[w].get("nthreads") or 1) for w in workers)
    cores = min(run_on_workers(client, _cores, workers).values())
    to_client, assembled = _client_link(client, workers, transfer_bytes)
    gpu = _gpu_spec(client, workers, hosts)
    if gpu is not None and (local_pairs or remote_pairs):  # device arrays between workers, end to end
        gpu = dataclasses.replace(gpu, link=_bandwidth(client, remote_pairs or local_pairs, 4 * transfer_bytes,
                                                       make=_make_device))
    host_ids = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    spec = ClusterSpec(
        sites=len(workers), memory_per_site=float(memory), bandwidth=float(bandwidth),
        bandwidth_local=float(local or bandwidth), hosts=tuple(host_ids[h] for h in hosts), rates=rates,
        task_overhead=float(task_overhead), submit_overhead=float(submit_overhead), blas_half_size=float(half),
        blas_float32=float(med["blas_float32"]),
        fresh_bandwidth=float(med["fresh"]), client_bandwidth=to_client, assemble_bandwidth=assembled,
        hash_bandwidth=_hash_bandwidth(), exp_cost=max(1.0, med["elementwise"] / med["exp"]),
        threads=threads, cores=int(cores), gpu=gpu, source="",
    )
    # (host data: the host's model, whatever GPUs the workers have)
    blas = _in_situ_blas(client, workers, spec.on_host(), chunk=1024 if memory >= 2**30 else 512)
    rates = dict(spec.rates, blas=blas)
    took = time.perf_counter() - started
    note = ""
    if spread > NOISY:
        note = (f"; repeats of a probe disagreed up to {spread:.1f}x: the machine was loaded, the quiet readings "
                f"kept (td.calibrate(client, refresh=True) when it is quiet)")
        warnings.warn(f"td.calibrate: {client.scheduler.address}{note[1:]}", RuntimeWarning, stacklevel=2)
    spec = dataclasses.replace(spec, rates=rates, rates_alone=_alone_rates(rates, speedup), source=(
        f"calibrated on {client.scheduler.address} at {stamp} in {took:.1f} s (matmul peak as a "
        f"kernel {peak:.3g}/s, in a plan {blas:.3g}/s{note})"))
    if refresh:
        set_cluster_spec(client, spec)
    return spec


def _alone_rates(rates: dict, speedup: dict, least: float = 1.1) -> dict | None:
    """``rates_alone`` of a spec: each class's rate times how much faster its kernel
    ran on a worker whose host's other workers idled, where that is at least
    ``least`` times (less is the noise between two windows); None if no class."""
    alone = {k: rates[k] * s for k, s in speedup.items() if s >= least}
    return alone or None


def _by_host(workers: list, hosts: list) -> dict:
    """host -> its workers, in order."""
    by_host: dict = {}
    for w, h in zip(workers, hosts):
        by_host.setdefault(h, []).append(w)
    return by_host


def _rings(workers: list, hosts: list) -> tuple[list, list]:
    """``(local, remote)`` transfer pairs ``(source, destination)`` in which every
    worker sends one array and receives one: each host's workers in a ring (hosts
    with one worker have none), and the workers taken host by host in turn, each
    from the one before it where that one is on another host (with unequal hosts a
    worker may only send or only receive)."""
    by_host = _by_host(workers, hosts)
    local = [(ws[i - 1], ws[i]) for ws in by_host.values() if len(ws) > 1 for i in range(len(ws))]
    if len(by_host) < 2:
        return local, []
    turns = [list(ws) for ws in by_host.values()]
    order = []  # round robin over hosts: neighbours are on different hosts
    while any(turns):
        for ws in turns:
            if ws:
                order.append(ws.pop(0))
    host_of = dict(zip(workers, hosts))
    remote = [(order[i - 1], order[i]) for i in range(len(order)) if host_of[order[i - 1]] != host_of[order[i]]]
    return local, remote


def _bandwidth(client, pairs: list, nbytes: int, rounds: int = 3, make=None) -> float:
    """Bytes/s a worker sends plus receives while every ``(source, destination)``
    pair moves ``nbytes`` at once (each worker one of each: ``2 * nbytes``), beyond a
    round of empty tasks on the destinations at once: all the
    rounds' bytes over all their time (as :func:`_throughput`: a slow round counts,
    as it does in a plan — the best round alone read 1.1 to 2.1 GB/s in two
    calibrations of one 2-worker cluster minutes apart).  Waits through the client
    given (:func:`~tra_dask.runtime.cluster._wait_done`): ``distributed.wait`` asks
    for the default client, which a ``Client(..., set_as_default=False)`` is not."""
    dests = [d for _, d in pairs]
    pinned = sorted({w for pair in pairs for w in pair})  # watched: one that stops answering ends the wait

    def at_once(deps) -> float:
        t0 = time.perf_counter()
        futs = [client.submit(_size if dep is not None else _noop, *([dep] if dep is not None else []),
                              workers=[d], allow_other_workers=False, pure=False) for dep, d in zip(deps, dests)]
        _wait_done(futs, client, pinned)
        dt = time.perf_counter() - t0
        for f in futs:
            f.release()
        return dt

    taken = 0.0
    warm = make is not None  # device arrays: the first round sets up each worker's device side, untimed
    for r in range(rounds + warm):
        data = {s: client.submit(make or _make, nbytes, workers=[s], allow_other_workers=False, pure=False)
                for s in dict.fromkeys(s for s, _ in pairs)}
        _wait_done(list(data.values()), client, pinned)
        empty = min(at_once([None] * len(pairs)) for _ in range(2))
        took = max(at_once([data[s] for s, _ in pairs]) - empty, 1e-6)
        taken += took if r >= warm else 0.0
        for f in data.values():
            f.release()
    return 2 * rounds * nbytes / taken


def _hash_bandwidth(nbytes: int = 2**25, rounds: int = 3) -> float:
    """Bytes/s at which this process names an in-process array by its content (the
    lowering's hash of a numpy input, each submission): the quiet reading of
    ``rounds`` hashes of a ``nbytes`` array (:func:`quiet_reading`)."""
    from ..lowering import content_token

    x = np.random.default_rng(0).random(nbytes // 8)
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        content_token(x)
        rates.append(x.nbytes / max(time.perf_counter() - t0, 1e-6))
    return quiet_reading(rates)[0]


def _client_link(client, workers: list, nbytes: int, rounds: int = 3) -> tuple[float, float]:
    """``(client_bandwidth, assemble_bandwidth)``: bytes/s at which the client gathers
    an array of ``nbytes`` from every worker at once, as it gathers a result, and at
    which it copies them into one new array, as it assembles one (all the rounds'
    bytes over all their time)."""
    gathered = copied = 0.0
    for _ in range(rounds):
        futs = {w: client.submit(_make, nbytes, workers=[w], allow_other_workers=False, pure=False) for w in workers}
        _wait_done(list(futs.values()), client, workers)
        t0 = time.perf_counter()
        got = gather(client, futs, workers)
        t1 = time.perf_counter()
        out = np.empty(sum(a.size for a in got.values()))
        at = 0
        for a in got.values():
            out[at:at + a.size] = a
            at += a.size
        copied += time.perf_counter() - t1
        gathered += t1 - t0
        for f in futs.values():
            f.release()
        del got, out
    total = rounds * len(workers) * (nbytes // 8) * 8
    return total / max(gathered, 1e-6), total / max(copied, 1e-6)


def cluster_spec(client, *, calibrate_: bool = True, workers=None) -> ClusterSpec:
    """The cached spec of ``client``'s cluster: calibrated the first time it is asked
    for, or the defaults when ``calibrate_`` is False.

    A spec given for the cluster (:func:`set_cluster_spec`) or named by the Dask
    config ``tra-dask.cluster-spec`` (a file ``ClusterSpec.save`` wrote) is used
    instead of calibrating.

    Cached per scheduler address and the workers' *shape*: the hosts they run on and
    their threads.  A worker that died and was replaced on the same host (a new
    address, the same machine) does not cost a new calibration, nor does a cluster
    that lost workers (the recovery plans on the survivors with the spec measured
    with them, for fewer sites — no new measurement while the cluster is in flux);
    one more worker, or a worker on a new host, does.

    ``workers``: the addresses of all the cluster's workers, sorted, when the caller
    has just asked the scheduler (a repeated submission): a cluster seen before is
    then looked up without asking again."""
    address = client.scheduler.address
    if calibrate_ and workers is not None:
        key = _KEY_OF.get((address, tuple(workers)))
        if key in _CACHE:
            return _CACHE[key]
    info = workers_info(client)
    if not calibrate_:
        return ClusterSpec(sites=max(1, len(info)))
    shape = _shape(info)
    key = _KEY_OF[(address, tuple(sorted(info)))] = (address, shape)
    with _CACHE_LOCKS.setdefault(key, threading.Lock()):  # threads asking at once: one calibration
        spec = _CACHE.get(key)
        if spec is None:
            spec = _smaller(address, shape) or _from_config(len(info))
            if spec is None:
                warnings.warn(f"tra_dask: measuring the cluster at {address} ({len(info)} worker(s)) for its first "
                              f"plan (td.calibrate: several seconds, once per cluster); to skip it, save a spec "
                              f"(td.calibrate(client).save(path)) and name it in the Dask config "
                              f"tra-dask.cluster-spec", CalibrationNotice, stacklevel=2)
                spec = calibrate(client)
            _CACHE[key] = spec
    return spec


class CalibrationNotice(UserWarning):
    """Said once per cluster, when its first plan starts measuring it (:func:`cluster_spec`)."""


def _from_config(sites: int) -> ClusterSpec | None:
    """The spec in the file that the Dask config ``tra-dask.cluster-spec`` names
    (``DASK_TRA_DASK__CLUSTER_SPEC=path``: one calibration kept for every cluster of
    that shape a process plans on), for ``sites`` sites; None when it is not set."""
    path = dask.config.get("tra-dask.cluster-spec", None)
    if not path:
        return None
    try:
        spec = ClusterSpec.load(path)
    except (OSError, ValueError, TypeError) as e:
        raise ValueError(f"the Dask config tra-dask.cluster-spec = {path!r} is not a saved td.ClusterSpec "
                         f"(ClusterSpec.save writes one): {e}") from None
    return spec if spec.sites == sites else spec.with_sites(sites)


def _smaller(address: str, shape: tuple) -> ClusterSpec | None:
    """A spec measured on this scheduler's cluster when it had these workers and more
    (the same hosts and threads), for this many sites; None if there is none."""
    want = Counter(shape)
    for (addr, had), spec in list(_CACHE.items()):
        if addr == address and len(had) > len(shape) and not want - Counter(had):
            return spec.with_sites(len(shape))
    return None


def set_cluster_spec(client, spec: ClusterSpec) -> None:
    """Plan on ``client``'s cluster (its workers as they are now) with ``spec`` — one
    measured before and kept in a file (``ClusterSpec.load(path)``), or written by
    hand — instead of calibrating it on the first plan."""
    if not isinstance(spec, ClusterSpec):
        raise TypeError(f"spec must be a td.ClusterSpec (td.calibrate or ClusterSpec.load), "
                        f"got {type(spec).__name__}")
    info = workers_info(client)
    if not info:
        raise RuntimeError("the cluster has no workers: a spec is kept per cluster shape (hosts and threads "
                           "of its workers); set it once the workers are up")
    _CACHE[(client.scheduler.address, _shape(info))] = spec


def _shape(info: dict) -> tuple:
    """The workers as calibration sees them: (host, threads) of each, sorted."""
    return tuple(sorted((urlsplit(addr).hostname or addr, int(w.get("nthreads", 1)))
                        for addr, w in info.items()))
