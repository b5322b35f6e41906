"""Clusters: the embedded LocalCluster, the client to use, the live worker list,
waiting on futures with a check for workers that left."""

from __future__ import annotations

import ast
import atexit
import logging
import os
import sys
import threading
import time

import dask
from distributed import Client, Future, LocalCluster

from ..dashboard import TraScheduler

# Measured facts (ARCHITECTURE §5): the transfer log must not wrap during a submission,
# and tasks pinned to a worker that died must error rather than wait forever.
_CONFIG = {
    "distributed.admin.low-level-log-length": 1_000_000,
    "distributed.scheduler.no-workers-timeout": "10s",
    # The Active Memory Manager drops "extra" replicas; it may drop the copy that a
    # pinned task on that worker will read later, which then travels again.
    "distributed.scheduler.active-memory-manager.start": False,
}

# ---------------------------------------------------------------------------
# the embedded cluster

_EMBEDDED: dict = {}
_LOCK = threading.Lock()


def embedded_client(n_workers: int) -> Client:
    """A client of this process's embedded LocalCluster with ``n_workers`` workers
    (started on first use, restarted if another size is asked for, closed at exit).

    Its client becomes the default client when no other is open (as ``Client()``
    does), so Dask's own calls (``dask.compute``, ``x.compute()`` of a result's dask
    array) run on it; a client the user opens later takes precedence."""
    with _LOCK:
        c = _EMBEDDED.get("client")
        if c is not None and _EMBEDDED.get("n") == n_workers and c.status == "running":
            return c
        _check_main_guard()
        _close_embedded()
        with dask.config.set(_CONFIG):
            cluster = LocalCluster(
                n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
            )
            client = Client(cluster, set_as_default=current_client() is None)
        _EMBEDDED.update(cluster=cluster, client=client, n=n_workers)
        return client


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
    _EMBEDDED.pop("n", None)
    if client is not None:
        try:  # let short work finish, then stop the rest, so workers are not cut off mid-transfer
            pending = [Future(k, client) for k, st in list(client.futures.items()) if not st.done()]
            try:
                _wait_done(pending, client, timeout=5)
            except TimeoutError:
                client.cancel(pending, force=True)
                client.run(lambda: None)  # a round trip: the cancellations have reached the workers
        except Exception:
            pass
        client.close()
    if cluster is not None:
        cluster.close()


try:  # close before the interpreter's thread pools shut down (plain atexit runs after)
    threading._register_atexit(_close_embedded)
except Exception:  # pragma: no cover - other interpreters
    atexit.register(_close_embedded)


# ---------------------------------------------------------------------------
# task records on the scheduler


def _ensure_recorder(client: Client) -> bool:
    """Register the tra_dask scheduler plugin (task records and the dashboard page)."""
    try:
        client.register_plugin(TraScheduler())
        return True
    except Exception:  # a scheduler that cannot import tra_dask: no records, nothing else lost
        return False


# ---------------------------------------------------------------------------


def workers_info(client: Client) -> dict:
    """``{address: info}`` of every worker, asked of the scheduler now.
    ``client.scheduler_info()`` returns the client's cached identity, which its own
    periodic refresh (asking for no workers) may overwrite between the fetch and the
    read: an empty worker list on a healthy cluster, now and then."""
    return dict(client.sync(client.scheduler.identity, n_workers=-1).get("workers", {}))


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
    embedded cluster (sized by ``sites``, default one worker per core)."""
    if client is None:
        client = current_client()
        if client is not None and client is _EMBEDDED.get("client"):
            client = None  # the embedded cluster: sized by this call's sites
    if client is None:
        running = _EMBEDDED.get("client")
        if sites is None and running is not None and running.status == "running":
            return running, _workers(running, None)
        n = sites if isinstance(sites, int) else (len(sites) if sites else (os.cpu_count() or 2))
        client = embedded_client(n)
        sites = None
    return client, _workers(client, sites)


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


class _Watch:
    """Polls the pinned workers (:func:`_liveness`): :meth:`check` raises
    :class:`WorkersLeft` for a worker missing in two checks in a row (so that a worker
    list read in the middle of a change does not count) or frozen (it is then
    removed from the cluster)."""

    def __init__(self, client: Client, pinned):
        self.client, self.pinned, self.missing = client, list(pinned), set()
        self.timeout = worker_timeout()

    def check(self, why: str) -> None:
        now_missing, frozen = _liveness(self.client, self.pinned, self.timeout)
        gone, self.missing = now_missing & self.missing, now_missing
        if frozen:
            remove_workers(self.client, frozen)
        if gone or frozen:
            lost = gone | frozen
            sites = sorted(self.pinned.index(w) for w in lost)
            how = f"stopped answering (no heartbeat for {self.timeout:g} s)" if frozen else "left the cluster"
            raise WorkersLeft(f"worker(s) {sorted(lost)} (site(s) {sites}) {how}; {why}", lost)


def _wait_done(futures, client: Client | None = None, pinned=(), timeout: float | None = None) -> None:
    """Poll until every future is done (``distributed.wait`` needs a default client,
    which an embedded cluster is not).  With ``pinned`` workers, raise
    :class:`WorkersLeft` as soon as one of them leaves the cluster or stops answering
    (:func:`worker_timeout`; it is then removed from the cluster): tasks pinned to it
    could never run.  Every wait on a plan's futures goes through here."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending, last_check = list(futures), 0.0
    watch = _Watch(client, pinned) if pinned else None
    while pending:
        pending = [f for f in pending if not f.done()]
        if not pending:
            _check_lost(futures, client, pinned)
            return
        now = time.monotonic()
        if watch is not None and now - last_check > 0.5:
            last_check = now
            watch.check("tasks of this plan are pinned to them and cannot run")
        if deadline is not None and now > deadline:
            raise TimeoutError(f"{len(pending)} of {len(futures)} chunks not done after {timeout} s")
        time.sleep(0.02)


def _check_lost(futures, client: Client, pinned) -> None:
    """Futures the scheduler cancelled (it forgets a finished key whose only copy was
    on a worker that died and whose task is pinned there): :class:`WorkersLeft` when
    pinned workers are gone."""
    if not pinned or not any(f.status in ("cancelled", "lost") for f in futures):
        return
    gone = set(pinned) - set(workers_info(client))
    if gone:
        raise WorkersLeft(f"worker(s) {sorted(gone)} holding results of this plan left the cluster", gone)


def watched(fn, client: Client, pinned):
    """``fn()`` (a blocking call on ``client``, e.g. a gather), run in a thread while
    the pinned workers are watched as in :func:`_wait_done`: if one of them is lost,
    :class:`WorkersLeft` is raised at once (Dask's gather would retry a lost worker's
    keys forever; the abandoned call ends when the recovery cancels them)."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller
            box["error"] = e

    thread = threading.Thread(target=run, daemon=True, name="tra-dask-watched")
    thread.start()
    watch = _Watch(client, pinned)
    while True:
        thread.join(0.5)
        if not thread.is_alive():
            break
        watch.check("they hold results of this plan")
    if "error" in box:
        from distributed.client import FutureCancelledError

        if isinstance(box["error"], FutureCancelledError):
            gone = set(pinned) - set(workers_info(client))
            if gone:
                raise WorkersLeft(f"worker(s) {sorted(gone)} holding results of this plan left the cluster",
                                  gone) from box["error"]
        raise box["error"]
    return box["value"]


class _FetchFromCluster:
    """Fetches a chunk by key for the reference evaluator."""

    def __init__(self, client):
        self.client = client

    def __call__(self, key):
        return Future(key, self.client).result()

