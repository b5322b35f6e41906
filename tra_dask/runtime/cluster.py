"""Clusters: the embedded LocalCluster, the client to use, the live worker list,
waiting on futures with a check for workers that left."""

from __future__ import annotations

import ast
import atexit
import contextlib
import logging
import os
import sys
import threading
import time
import weakref

import dask
from distributed import Client, Future, LocalCluster, Security
from distributed.system import MEMORY_LIMIT

from .dashboard import TraScheduler
from .keeper import TraKeeper, WorkerLeft

# Measured facts (ARCHITECTURE §5): the transfer log must not wrap during a submission,
# and tasks pinned to a worker that died must error rather than wait forever.
_CONFIG = {
    "distributed.admin.low-level-log-length": 1_000_000,
    "distributed.scheduler.no-workers-timeout": "10s",
    # The Active Memory Manager drops "extra" replicas; it may drop the copy that a
    # pinned task on that worker will read later, which then travels again.
    "distributed.scheduler.active-memory-manager.start": False,
}

REUSE_CAP = 512 * 2**20  # the most freed memory a worker keeps for its next arrays


def worker_config(memory_limit: float) -> dict:
    """The Dask config the embedded cluster starts its workers with: ``_CONFIG``,
    and glibc malloc settings that let a worker reuse the memory of the arrays it
    freed instead of returning it to the OS at once.

    Why (measured, ``benchmarks/README.md``): Dask spawns workers with
    ``MALLOC_TRIM_THRESHOLD_=65536``, which also turns off glibc's adaptive mmap
    threshold, so every array over 128 KiB is a fresh ``mmap`` whose pages fault
    on first write and go back to the OS when it is freed.  Writing a new 4 MiB
    array then runs at 3.5-4 GB/s here (8 GB/s at 64 MiB), against 21-26 GB/s into
    reused memory; on a VM whose host hands out pages lazily, at 0.5-3 GB/s.  With
    ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` at ``memory_limit /
    16`` (at most :data:`REUSE_CAP`), arrays up to that size come from the heap and
    up to that much freed memory stays for reuse: the nearest-neighbour plans ran
    11-24% faster, the FFNN steps 23-39% (dask.array on such workers gains alike).  The cost: up to that much memory a worker
    freed still counts as its (unmanaged) memory.  ``MALLOC_ARENA_MAX=1``: a task
    runs on a worker thread, and glibc gives each thread an arena of heaps of at most
    64 MiB, so an array larger than that (a 4000x4000 float64 result) was a fresh
    ``mmap`` whatever the thresholds: writing a new 128 MB result took 16-160 ms
    (page faults, 80-140 a round) where one arena reuses the freed memory (5 ms, no
    faults), and the calibration (``client.run``: the worker's main thread, the main
    arena) measured memory the tasks did not get.  Other Dask settings in
    ``distributed.nanny.pre-spawn-environ`` are kept."""
    keep = int(max(2**16, min(REUSE_CAP, memory_limit // 16)))
    env = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}),
           "MALLOC_MMAP_THRESHOLD_": keep, "MALLOC_TRIM_THRESHOLD_": keep, "MALLOC_ARENA_MAX": 1}
    return {**_CONFIG, "distributed.nanny.pre-spawn-environ": env}



_MALLOC = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")


@contextlib.contextmanager
def spawn_config(config: dict):
    """``dask.config.set(config)`` while workers start, with the malloc variables of
    its pre-spawn environment also in ``os.environ``.  Why: a Nanny lets
    ``os.environ`` override the config for the variables Dask's own config names, and
    every Nanny writes its pre-spawn variables into its parent's ``os.environ`` — so
    once any cluster with Dask's settings started in this process,
    ``MALLOC_TRIM_THRESHOLD_=65536`` would win over :func:`worker_config`.  A value
    in ``os.environ`` that is not Dask's own (the user's) is kept; the previous values
    are put back afterwards."""
    dask_own = dask.config.get("distributed.nanny.pre-spawn-environ", {})
    ours = config.get("distributed.nanny.pre-spawn-environ", {})
    saved = {}
    for k in _MALLOC:
        have = os.environ.get(k)
        if k in ours and (have is None or have == str(dask_own.get(k))):
            saved[k] = have
            os.environ[k] = str(ours[k])
    try:
        with dask.config.set(config):
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------
# the embedded cluster

_EMBEDDED: dict = {}
_LOCK = threading.Lock()
SCALE_TIMEOUT = 60.0  # seconds for the workers the embedded cluster adds to join


def embedded_client(n_workers: int | None = None, *, security=None, gpu: bool = False) -> Client:
    """A client of this process's embedded LocalCluster (127.0.0.1 only), which has
    at least ``n_workers`` workers (default: as many as it has, or one per core when
    it starts here).

    It starts on first use and is closed at exit, never before: results on it and
    other threads' submissions to it stay usable.  A call for more workers than it
    has adds them (``LocalCluster.scale``: plans already pinned to the others are not
    touched); ``td.submit(..., sites=k)`` on it runs on ``k`` of its workers.

    ``security``: ``True`` (a temporary self-signed certificate,
    ``distributed.Security.temporary()``; needs ``cryptography``, the ``tls`` extra)
    or a ``distributed.Security`` with TLS certificates and keys: the scheduler, the
    workers and the client then talk TLS only (``tls://127.0.0.1:…``).  It is chosen
    when the cluster starts, so ask for it first; ``td.submit``/``td.compute`` with
    no client then run on this cluster.  Asking for ``security`` of an embedded
    cluster that runs without it (or with another Security) is an error.

    Its client becomes the default client when no other is open (as ``Client()``
    does), so Dask's own calls (``dask.compute``, ``x.compute()`` of a result's dask
    array) run on it; a client the user opens later takes precedence.

    ``gpu=True``: workers for GPUs (the ``gpu`` extra), one per visible GPU by
    default — ``dask_cuda.LocalCUDACluster`` when dask-cuda is installed and there
    are at least as many GPUs as workers (each worker pinned to its own device), else
    a LocalCluster whose workers share the first visible GPU.  Like ``security``, it
    is chosen when the cluster starts.  cupy data then computes on the devices and
    ``td.calibrate`` measures them."""
    if n_workers is not None and (isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1):
        raise ValueError(f"n_workers must be a positive int, got {n_workers!r}")
    if not isinstance(gpu, bool):
        raise TypeError(f"gpu must be True or False, got {gpu!r}")
    gpus = visible_gpus() if gpu else 0
    if gpu and gpus == 0:
        raise RuntimeError("embedded_client(gpu=True): no GPU is visible to this process (cupy sees none, or "
                           "cupy is not installed: pip install 'tra-dask[gpu]')")
    if security is not None and security is not True and security is not False and not isinstance(security, Security):
        raise TypeError(f"security must be True, False, None or a distributed.Security, got {type(security).__name__}")
    with _LOCK:
        c = _EMBEDDED.get("client")
        if c is not None and c.status == "running":
            _check_security(security)
            if gpu and not _EMBEDDED.get("gpu"):
                raise ValueError("the embedded cluster is already running without GPU workers; ask for "
                                 "embedded_client(gpu=True) before anything runs on it")
            if n_workers is not None and len(workers_info(c)) < n_workers:
                _scale_embedded(n_workers)
            return c
        _check_main_guard()
        _close_embedded()  # a client that was closed: nobody can be using its cluster
        sec = Security.temporary() if security is True else (security or None)
        n = n_workers or gpus or os.cpu_count() or 2
        config = worker_config(MEMORY_LIMIT / n)  # LocalCluster's "auto" memory limit per worker
        kind = _cuda_cluster_class() if gpu and n <= gpus else None
        with spawn_config(config):
            cluster = (kind or LocalCluster)(
                n_workers=n, threads_per_worker=1, processes=True,
                host="127.0.0.1", dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
                **({"security": sec, "protocol": "tls://"} if sec is not None else {}),
            )
            client = Client(cluster, set_as_default=current_client() is None)
        _EMBEDDED.update(cluster=cluster, client=client, security=sec, config=config, gpu=gpu)
        return client


def visible_gpus() -> int:
    """How many GPUs this process sees (0 without cupy or a CUDA driver)."""
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, no driver, no device
        return 0


def _cuda_cluster_class():
    """``dask_cuda.LocalCUDACluster`` (one worker per GPU), or None without dask-cuda."""
    try:
        from dask_cuda import LocalCUDACluster
    except Exception:  # not installed, or built for another dask
        return None
    return LocalCUDACluster


def _check_security(security) -> None:
    """``security`` asked of the running embedded cluster: it must be what it started with."""
    have = _EMBEDDED.get("security")
    if security is None or (security is True and have is not None) or security is have:
        return
    if security is False and have is None:
        return
    now = "without TLS" if have is None else "with TLS" + (" (another Security)" if security is not False else "")
    raise ValueError(f"the embedded cluster is already running {now}; its security is chosen when it starts: "
                     f"call embedded_client(security=...) before anything runs on it")


def _scale_embedded(n: int) -> None:
    """Add workers to the embedded cluster until it has ``n`` (under ``_LOCK``)."""
    cluster, client = _EMBEDDED["cluster"], _EMBEDDED["client"]
    with spawn_config(_EMBEDDED["config"]):  # the new workers' settings, as at the start
        if len(cluster.worker_spec) < n:
            cluster.scale(n)
        try:
            client.wait_for_workers(n, timeout=SCALE_TIMEOUT)
        except TimeoutError as e:
            raise RuntimeError(f"the embedded cluster did not reach {n} workers in {SCALE_TIMEOUT:g} s "
                               f"(it has {len(workers_info(client))})") from e


def current_client() -> Client | None:
    """The open default Dask client (``distributed.default_client()``), or None."""
    from distributed import default_client

    try:
        c = default_client()
    except ValueError:
        return None
    return c if c.status == "running" else None


_GUARD_HELP = (
    "put the code that runs tra_dask under `if __name__ == \"__main__\":` — the embedded cluster "
    "starts worker processes, and each of them imports the main module again"
)


def _check_main_guard() -> None:
    """A clear error, before any process starts, when the embedded cluster is started
    from a script's top-level code outside an ``if __name__ == "__main__":`` block
    (worker processes would re-import the script and run that code again), and in a
    worker process that is importing the main module."""
    main = sys.modules.get("__main__")
    if getattr(main, "__name__", None) == "__mp_main__":
        raise RuntimeError(f"tra_dask: an embedded cluster was asked for while a new process imported the main module; {_GUARD_HELP}")
    path = getattr(main, "__file__", None)
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals.get("__name__") == "__main__" and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None or not path or frame.f_code.co_filename != path:
        return  # not called from a script's top level (a notebook, python -c, a function)
    try:
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return
    line = frame.f_lineno
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test) and node.lineno <= line <= (node.end_lineno or line):
            return
    raise RuntimeError(f"tra_dask: {path}, line {line}: {_GUARD_HELP}")


def _is_main_test(test) -> bool:
    """``__name__ == "__main__"`` (either order)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


def _close_embedded() -> None:
    client, cluster = _EMBEDDED.pop("client", None), _EMBEDDED.pop("cluster", None)
    _EMBEDDED.pop("security", None)
    _EMBEDDED.pop("config", None)
    if client is not None:
        try:  # let short work finish, then stop the rest, so workers are not cut off mid-transfer
            pending = [Future(k, client) for k, st in list(client.futures.items()) if not st.done()]
            try:
                _wait_done(pending, client, timeout=5)
            except TimeoutError:
                cancel_safely(client, pending)
            client.run(_stop_heartbeat, callback_timeout=10)  # a round trip: the cancellations have reached the workers
        except Exception:
            pass
        try:  # bounded: a worker stuck in its own shutdown (Ctrl-C reaches the whole process group) must not hold the exit
            client.close(timeout=10)
        except Exception:
            pass
    if cluster is not None:
        try:
            cluster.close(timeout=20)
        except Exception:
            pass


def _stop_heartbeat(dask_worker) -> None:
    """On a worker of the embedded cluster as it closes: no more heartbeats.  The
    scheduler may close before a worker does, and distributed logs a heartbeat that
    meets the closed scheduler as an ERROR with its traceback (dask/distributed#7192);
    at exit nothing needs them."""
    pc = dask_worker.periodic_callbacks.get("heartbeat")
    if pc is not None:
        pc.stop()


try:  # close before the interpreter's thread pools shut down (plain atexit runs after)
    threading._register_atexit(_close_embedded)
except Exception:  # pragma: no cover - other interpreters
    atexit.register(_close_embedded)


# ---------------------------------------------------------------------------
# task records on the scheduler


_SCHEDULER_ID: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # client -> its scheduler's id, last seen
_REGISTERED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # client -> the scheduler id it registered on


def _ensure_recorder(client: Client) -> bool:
    """Register the tra_dask scheduler plugins: task records and the dashboard page;
    the keeper of work a recovery reads (:mod:`tra_dask.runtime.keeper`).  Once per
    scheduler a client talks to (its id, as :func:`workers_info` last saw it: a
    scheduler restarted at the same address is another one), not on every submission
    (two round trips)."""
    sid = _SCHEDULER_ID.get(client)
    if sid is not None and _REGISTERED.get(client) == sid:
        return True
    try:
        client.register_plugin(TraScheduler())
        client.register_plugin(TraKeeper())
    except Exception:  # a scheduler that cannot import tra_dask: no records, nothing else lost
        return False
    if sid is not None:
        _REGISTERED[client] = sid
    return True


# ---------------------------------------------------------------------------


def workers_info(client: Client) -> dict:
    """``{address: info}`` of every worker, asked of the scheduler now.
    ``client.scheduler_info()`` returns the client's cached identity, which its own
    periodic refresh (asking for no workers) may overwrite between the fetch and the
    read: an empty worker list on a healthy cluster, now and then."""
    ident = client.sync(client.scheduler.identity, n_workers=-1)
    if ident.get("id") is not None:
        _SCHEDULER_ID[client] = ident["id"]
    return dict(ident.get("workers", {}))


def _check_client(client: Client) -> None:
    if client.status != "running":
        raise RuntimeError(f"the Dask client is {client.status}; connect a running client (or pass client=None)")


def _workers(client: Client, sites) -> list[str]:
    _check_client(client)
    available = sorted(workers_info(client))
    if not available:
        raise RuntimeError("the cluster has no workers")
    if sites is None:
        return available
    if isinstance(sites, int) and not isinstance(sites, bool):
        if sites < 1:
            raise ValueError(f"sites must be >= 1, got {sites}")
        if sites > len(available):
            raise ValueError(
                f"asked for {sites} sites but the cluster has {len(available)} worker(s) "
                f"({', '.join(available)}); one site runs on one worker"
            )
        return available[:sites]
    chosen = list(sites)
    missing = [w for w in chosen if w not in available]
    if missing:
        raise _Vanished(f"sites {missing} are not workers of this cluster; workers: {available}")
    return chosen


class _Vanished(ValueError):
    """Named sites that are not (or no longer) workers of the cluster."""


def _resolve(client, sites):
    """``(client, workers)``: the client given, else the open default client, else the
    embedded cluster (started with ``sites`` workers, default one per core).  On the
    embedded cluster (given, the default, or started here) ``sites=k`` is ``k`` of
    its workers: it is scaled up to ``k`` if it has fewer, never restarted."""
    if client is None:
        client = current_client()
    embedded = _EMBEDDED.get("client")
    if client is None or (client is embedded and client.status == "running"):
        if isinstance(sites, int) and not isinstance(sites, bool):
            need = sites if sites >= 1 else None  # _workers says what is wrong with sites < 1
        else:
            need = len(sites) if sites else None
        client = embedded_client(need)
    return client, _workers(client, sites)


def cancel_safely(client: Client, futures: list) -> None:
    """``client.cancel(futures, force=True)``, except for keys whose cancellation would
    reach a task no client wants (a task of a later plan that reads them, waiting or
    done): distributed's ``stimulus_cancel`` asserts that every task it cancels is
    wanted, and that failure drops the client's connection to the scheduler — and with
    it every future the client holds, other results included (distributed 2026.8.0).
    Those keys are not cancelled; they are released when the caller drops its futures.
    When the scheduler cannot be asked, nothing is cancelled."""
    if not futures:
        return
    try:
        ok = set(client.run_on_scheduler(_cancellable, keys=[f.key for f in futures]))
    except Exception:
        return
    safe = [f for f in futures if f.key in ok]
    if safe:
        client.cancel(safe, force=True)


def _cancellable(dask_scheduler, keys: list) -> list:
    """The keys of ``keys`` whose every dependent, transitively, is wanted by a client
    (what ``stimulus_cancel`` asserts of every task it cancels)."""
    out = []
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        if ts is None:
            continue
        stack, seen = [ts], set()
        while stack:
            t = stack.pop()
            if t.key in seen:
                continue
            seen.add(t.key)
            if not t.who_wants:
                break
            stack.extend(t.dependents)
        else:
            out.append(k)
    return out


def _who_has(client: Client, keys: list) -> dict:
    """``{key: [worker, ...]}`` from the scheduler's own records."""

    def ask(dask_scheduler, keys=keys):
        tasks = dask_scheduler.tasks
        return {k: sorted(ws.address for ws in tasks[k].who_has) for k in keys if k in tasks and tasks[k].who_has}

    return client.run_on_scheduler(ask)


class WorkersLeft(RuntimeError):
    """Workers that a plan pins tasks to left the cluster or stopped answering
    (``gone``: their addresses): those tasks cannot run."""

    def __init__(self, message: str, gone):
        super().__init__(message)
        self.gone = frozenset(gone)


def worker_timeout() -> float:
    """Seconds without a heartbeat after which a worker counts as frozen (stuck in C
    code, swapping, a paused VM): ``dask.config`` ``tra-dask.worker-timeout``, default 20 s."""
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("tra-dask.worker-timeout", "20s")))


def _liveness(client: Client, pinned, timeout: float) -> tuple[set, set]:
    """``(missing, frozen)``: pinned workers the scheduler does not have, and those it
    has not heard from for ``timeout`` seconds longer than from the freshest worker."""

    def ask(dask_scheduler, pinned=tuple(pinned)):
        workers = dask_scheduler.workers
        freshest = max((ws.last_seen for ws in workers.values()), default=0.0)
        return {w: freshest - workers[w].last_seen for w in pinned if w in workers}

    # silent relative to the worker heard from last, so that a scheduler that was itself
    # busy (its loop blocked, so no heartbeats were read) does not make everyone frozen
    silent = client.run_on_scheduler(ask)
    return set(pinned) - set(silent), {w for w, s in silent.items() if s > timeout}


def remove_workers(client: Client, addresses) -> None:
    """Take frozen workers out of the cluster (the scheduler forgets their data and
    sends them no more work; a worker that wakes up reconnects as a new one)."""

    async def drop(dask_scheduler, addresses=tuple(addresses)):
        for a in addresses:
            if a in dask_scheduler.workers:
                await dask_scheduler.remove_worker(address=a, stimulus_id=f"tra-dask-frozen-{time.time()}", close=True)

    client.run_on_scheduler(drop)


_REMOVED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # client -> {address: removed}


def _follow_removals(client: Client, workers) -> dict:
    """``{address: True}`` for the ``workers`` the scheduler has announced removing
    since we began following them: the scheduler publishes a ``remove-worker`` event
    under each worker's address, and this client subscribes to those topics (one
    message, no round trip; a topic the user follows already is left alone)."""
    seen = _REMOVED.setdefault(client, {})
    handlers = getattr(client, "_event_handlers", {})
    for w in workers:
        if w in seen or w in handlers:
            continue
        seen[w] = False

        def on_event(event, w=w, seen=seen):
            msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
            if isinstance(msg, dict) and msg.get("action") == "remove-worker":
                seen[w] = True

        try:
            client.subscribe_topic(w, on_event)
        except Exception:  # no event stream: the polled check still notices
            pass
    return seen


class _Watch:
    """Watches the pinned workers: :meth:`check` raises :class:`WorkersLeft` for a
    worker the scheduler no longer has (it forgot that worker's data when it removed
    it; a worker that comes back is a new one) or one that is frozen (it is then
    removed from the cluster).  A removal the scheduler announced is seen at once
    (:meth:`quick`); the scheduler is asked (:func:`_liveness`) every half second."""

    def __init__(self, client: Client, pinned):
        self.client, self.pinned = client, list(pinned)
        self.timeout = worker_timeout()
        self.removed = _follow_removals(client, self.pinned)

    def quick(self) -> bool:
        """Has the scheduler announced removing one of the pinned workers?"""
        removed = self.removed
        return any(removed.get(w) for w in self.pinned)

    def check(self, why: str) -> None:
        gone, frozen = _liveness(self.client, self.pinned, self.timeout)
        for w in self.pinned:  # a worker back at the same address (a fixed port) is a new one, and there
            if self.removed.get(w) and w not in gone:
                self.removed[w] = False
        if frozen:
            remove_workers(self.client, frozen)
        if gone or frozen:
            lost = gone | frozen
            sites = sorted(self.pinned.index(w) for w in lost)
            how = f"stopped answering (no heartbeat for {self.timeout:g} s)" if frozen else "left the cluster"
            raise WorkersLeft(f"worker(s) {sorted(lost)} (site(s) {sites}) {how}; {why}", lost)


def _wait_done(futures, client: Client | None = None, pinned=(), timeout: float | None = None) -> None:
    """Wait until every future is done (``distributed.wait`` needs a default client,
    which an embedded cluster is not): each pending future's done-callback counts it,
    and the last one wakes the wait at once.  With ``pinned`` workers, raise
    :class:`WorkersLeft` as soon as one of them leaves the cluster or stops answering
    (:func:`worker_timeout`; it is then removed from the cluster): tasks pinned to it
    could never run — a removal the scheduler announces is seen within
    :data:`_WAKE` seconds, the scheduler is asked every half second.  Every wait on a
    plan's futures goes through here.  (It polled every 20 ms before: a plan's results
    arrived 10 ms late on average, 10-20% of a plan that runs 0.1 s.)"""
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    pending = [f for f in futures if not f.done()]
    watch = _Watch(client, pinned) if pinned and pending else None
    if pending:
        finished = _woken_when_done(pending)
        last_check = start
        while not finished():
            now = time.monotonic()
            if watch is not None and (now - last_check > 0.5 or watch.quick()):
                last_check = now
                watch.check("tasks of this plan are pinned to them and cannot run")
            if deadline is not None and now > deadline:
                n = sum(not f.done() for f in futures)
                raise TimeoutError(f"{n} of {len(futures)} chunks not done after {timeout} s")
    _check_lost(futures, client, pinned)


_WAKE = 0.05  # seconds: how often a wait looks at announced removals and the deadline


def _woken_when_done(pending: list):
    """``finished() -> bool``: True once every future of ``pending`` is done, else
    False after at most :data:`_WAKE` seconds.  Each future's done-callback counts it
    down and the last one sets an event — except inside a Dask done-callback, where
    those callbacks would queue behind the caller (Dask runs them on one thread): there
    it looks at the futures every 5 ms."""
    if threading.current_thread().name.startswith("Dask-Callback-Thread"):
        def finished():
            time.sleep(0.005)
            return all(f.done() for f in pending)
        return finished
    done, lock, left = threading.Event(), threading.Lock(), [len(pending)]

    def one_done(_):
        with lock:
            left[0] -= 1
            if left[0] <= 0:
                done.set()
    for f in pending:
        f.add_done_callback(one_done)
    return lambda: done.wait(_WAKE)


def _check_lost(futures, client: Client, pinned) -> None:
    """Futures the scheduler cancelled (it forgets a finished key whose only copy was
    on a worker that died and whose task is pinned there) or failed with
    :class:`~tra_dask.runtime.keeper.WorkerLeft` (pinned to a worker that left):
    :class:`WorkersLeft` when pinned workers are gone."""
    if not pinned:
        return
    left = set()
    for f in futures:
        if f.status == "error":
            e = f.exception()
            if isinstance(e, WorkerLeft):
                left.add(e.worker)
    if not left and not any(f.status in ("cancelled", "lost") for f in futures):
        return
    gone = (set(pinned) - set(workers_info(client))) | left  # WorkerLeft: it left (it may be back, a new worker)
    if gone:
        raise WorkersLeft(f"worker(s) {sorted(gone)} holding results of this plan left the cluster", gone)


def watched(fn, client: Client, pinned, why: str = "they hold results of this plan"):
    """``fn()`` (a blocking call on ``client`` that talks to the ``pinned`` workers: a
    gather, a scatter, a ``client.run``), run in a thread while those workers are
    watched as in :func:`_wait_done`: if one of them leaves the cluster or stops
    answering (no heartbeat for :func:`worker_timeout`; it is then removed from the
    cluster), :class:`WorkersLeft` is raised at once — Dask's gather would retry a lost
    worker's keys forever, and a scatter to or a ``client.run`` on a frozen worker
    waits until the scheduler gives up on it (``worker-ttl``, 5 minutes).  The
    abandoned call ends when the recovery cancels its keys, or when the removed worker's
    connection closes.  An error of ``fn`` that a lost worker explains (a closed comm,
    a cancelled future, a worker the scheduler no longer has) is :class:`WorkersLeft`
    too.  ``why``: what the workers are to this call, for the message."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True, name="tra-dask-watched")
    thread.start()
    watch, last_check = _Watch(client, pinned), time.monotonic()
    while True:
        thread.join(0.05)
        if not thread.is_alive():
            break
        if watch.quick() or time.monotonic() - last_check > 0.5:
            last_check = time.monotonic()
            watch.check(why)
    if "error" in box:
        from distributed.client import FutureCancelledError

        error = box["error"]
        if isinstance(error, (FutureCancelledError, WorkerLeft, OSError, KeyError)):
            gone = _gone_after(client, pinned, error)
            if isinstance(error, WorkerLeft):
                gone.add(error.worker)
            if gone:
                raise WorkersLeft(f"worker(s) {sorted(gone)} left the cluster ({type(error).__name__}: "
                                  f"{error}); {why}", gone) from error
        raise error
    return box["value"]


def _gone_after(client: Client, workers, error: BaseException) -> set:
    """Those of ``workers`` the scheduler no longer has, after ``error`` ended a call
    on them: a call that met a worker as it died (a closed comm) may fail before the
    scheduler has removed it, so after a connection error it is asked again for up to
    two seconds."""
    deadline = time.monotonic() + (2.0 if isinstance(error, OSError) else 0.0)
    while True:
        try:
            gone = set(workers) - set(workers_info(client))
        except Exception:  # the scheduler cannot be asked: nothing is known to be gone
            return set()
        if gone or time.monotonic() >= deadline:
            return gone
        time.sleep(0.1)


def run_on_workers(client: Client, fn, workers, *args, **kwargs) -> dict:
    """``client.run(fn, *args, workers=workers, **kwargs)`` under the liveness watch
    (:func:`watched`): a worker that stopped answering (before or during the call) is
    removed from the cluster and :class:`WorkersLeft` raised, instead of the call
    waiting for it.  Every ``client.run`` of tra_dask goes through here."""
    workers = list(workers)
    return watched(lambda: client.run(fn, *args, workers=workers, **kwargs), client, workers,
                   f"they were running {getattr(fn, '__name__', 'a call')}")


class _FetchFromCluster:
    """Fetches a chunk by key for the reference evaluator."""

    def __init__(self, client):
        self.client = client

    def __call__(self, key):
        return Future(key, self.client).result()

