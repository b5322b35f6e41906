"""The runtime: run plans on Dask clusters and hand back futures.

``td.submit`` compiles a TRA expression (or takes a Plan), lowers it to a pinned
graph for the client's workers, scatters in-process source chunks straight to their
sites, sends the graph and returns a :class:`RelationFutures` per output.  With no
client, an embedded ``LocalCluster`` on 127.0.0.1 is started (one single-threaded
worker process per site; the dashboard on 127.0.0.1 only) and closed at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from collections.abc import Mapping

import dask
import numpy as np
from distributed import Client, Future, LocalCluster
from .dashboard import TraScheduler, _add_plan, _set_measured, page_link

from .logical import ClusterSource, Relation, flatten_outputs, to_numpy
from .logical.nodes import toposort
from .lowering import Lowered, lower
from .optimizer import Plan, compile
from .optimizer import optimize as _optimize
from .physical import KeySites
from .types import RelationType

__all__ = ["submit", "compute", "plan_for", "RelationFutures", "from_dask_array", "embedded_client"]

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
    (started on first use, restarted if another size is asked for, closed at exit)."""
    with _LOCK:
        c = _EMBEDDED.get("client")
        if c is not None and _EMBEDDED.get("n") == n_workers and c.status == "running":
            return c
        _close_embedded()
        with dask.config.set(_CONFIG):
            cluster = LocalCluster(
                n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
            )
            client = Client(cluster, set_as_default=False)
        _EMBEDDED.update(cluster=cluster, client=client, n=n_workers)
        return client


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
        raise ValueError(f"sites {missing} are not workers of this cluster; workers: {available}")
    return chosen


def _resolve(client, sites):
    if client is None:
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


def _wait_done(futures, client: Client | None = None, pinned=(), timeout: float | None = None) -> None:
    """Poll until every future is done (``distributed.wait`` needs a default client,
    which an embedded cluster is not).  With ``pinned`` workers, fail fast if one of
    them leaves the cluster: tasks pinned to it could never run."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending, last_check, missing = list(futures), 0.0, set()
    while pending:
        pending = [f for f in pending if not f.done()]
        if not pending:
            return
        now = time.monotonic()
        if pinned and now - last_check > 0.5:
            last_check = now
            # gone in two checks in a row (0.5 s apart): one answer without a worker
            # has been seen while the cluster was busy and every worker was alive
            now_missing = set(pinned) - set(workers_info(client))
            gone, missing = now_missing & missing, now_missing
            if gone:
                sites = sorted(list(pinned).index(w) for w in gone)
                raise RuntimeError(
                    f"worker(s) {sorted(gone)} (site(s) {sites}) left the cluster; tasks of this plan "
                    f"are pinned to them and cannot run (re-submit on the remaining workers)"
                )
        if deadline is not None and now > deadline:
            raise TimeoutError(f"{len(pending)} of {len(futures)} chunks not done after {timeout} s")
        time.sleep(0.02)


def _keeper_futures(src: ClusterSource) -> list:
    keeper = src.keeper
    if isinstance(keeper, RelationFutures):
        return list(keeper.values())
    if isinstance(keeper, tuple):  # from_dask_array: (array, futures)
        return list(keeper[1])
    return []


def _check_cluster_source(src: ClusterSource, client: Client) -> None:
    """Data of another cluster, or data that is gone, cannot be an input here."""
    for f in _keeper_futures(src):
        if f.client is not client and getattr(f.client, "scheduler", None) is not getattr(client, "scheduler", None):
            raise ValueError(
                f"{src.name} lives on another Dask client/cluster ({f.client}); submit it with that "
                f"client, or gather it and use td.from_numpy"
            )
        if f.status in ("cancelled", "lost", "error"):
            raise RuntimeError(
                f"{src.name}: chunk key {f.key!r} is {f.status} (its cluster was restarted or closed?); "
                f"re-submit the expression that made it"
            )


def _cluster_placements(expr, client: Client, workers: list[str]) -> dict:
    """Fixed placements of cluster-resident sources: where their data is."""
    sources = [n for n in toposort(flatten_outputs(expr)[0]) if isinstance(n, ClusterSource)]
    out = {}
    for src in sources:
        _check_cluster_source(src, client)
        keys = [k for _, k in src.dask_keys]
        who = _who_has(client, keys)
        if len(who) < len(keys):  # still being computed: wait for them, then ask again
            _wait_done([f for f in _keeper_futures(src) if f.key not in who], client, timeout=300)
            who = _who_has(client, keys)
        items = []
        for tra_key, dk in src.dask_keys:
            holders = [w for w in who.get(dk, ()) if w in workers]
            if not holders and not who.get(dk):
                raise RuntimeError(f"{src.name}: the chunk {tra_key} (key {dk!r}) is not on the cluster any more")
            # data on a worker outside the chosen sites is fetched by the site that needs it
            items.append((tra_key, workers.index(holders[0]) if holders else 0))
        out[src] = KeySites(tuple(items), len(workers))
    return out


def plan_for(expr, client: Client | None = None, sites=None, *, optimize: bool = True,
             memory_limit: float | None = None, cost_model: str = "exact", objective=None,
             calibrate: bool = True, beam: int | None = None, budget: int | None = None) -> Plan:
    """The plan :func:`submit` would run for ``expr`` on ``client``'s workers (with the
    fixed placements of data already on the cluster), without running it.

    With ``objective="time"`` the plan is chosen for this cluster: it is measured once
    (:func:`tra_dask.calibrate`, 1-3 s) and the spec cached per cluster;
    ``calibrate=False`` uses the default :class:`~tra_dask.ClusterSpec` instead.
    ``beam``, ``budget``: the search's width and length (see :func:`tra_dask.optimize`)."""
    client, workers = _resolve(client, sites)
    if not isinstance(expr, (Relation, tuple, list, dict)) and hasattr(expr, "__tra_relation__"):
        expr = expr.__tra_relation__()
    placements = _cluster_placements(expr, client, workers) or None
    if not optimize:
        return compile(expr, sites=len(workers), placements=placements, cost_model=cost_model)
    if memory_limit is None:
        memory_limit = _workers_memory_limit(client, workers)
    cluster = None
    if objective == "time":
        from .calibration import cluster_spec

        cluster = cluster_spec(client, calibrate_=calibrate).with_sites(len(workers))
    search = {k: v for k, v in (("beam", beam), ("budget", budget)) if v is not None}
    return _optimize(expr, sites=len(workers), placements=placements, memory_limit=memory_limit,
                     cost_model=cost_model, objective=objective, cluster=cluster, **search)


def submit(expr_or_plan, client: Client | None = None, sites=None, *, optimize: bool = True,
           memory_limit: float | None = None, cost_model: str = "exact", objective=None, calibrate: bool = True):
    """Run a TRA expression (or a Plan) on a Dask cluster; futures back.

    Parameters
    ----------
    expr_or_plan : Relation, tuple/dict of relations, or Plan
    client : distributed.Client, optional
        Default: an embedded LocalCluster on 127.0.0.1 with one worker per site.
    sites : int or list of worker addresses, optional
        How many (or which) workers are the plan's sites; default all.
    optimize : bool
        Search for the cheapest plan (default); False runs the paper's compiled plan.
    memory_limit : bytes per site, optional
        Default: the smallest memory limit of the chosen workers (if they have one).
    objective : "bytes" (default), "time" or an Objective
        What the optimizer minimises (see :func:`tra_dask.optimize`).
    calibrate : bool
        For the time objective: measure the cluster once (cached) rather than use
        the default :class:`~tra_dask.ClusterSpec`.

    Returns
    -------
    RelationFutures, or a tuple/dict of them for several outputs.
    """
    client, workers = _resolve(client, sites)
    if isinstance(expr_or_plan, Plan):
        plan = expr_or_plan
        if plan.sites != len(workers):
            raise ValueError(f"the plan is for {plan.sites} sites but {len(workers)} workers were chosen")
        _check_plan_sources(plan, client, workers)
    else:
        plan = plan_for(expr_or_plan, client, workers, optimize=optimize, memory_limit=memory_limit,
                        cost_model=cost_model, objective=objective, calibrate=calibrate)
    return _run(plan, client, workers)


def _workers_memory_limit(client: Client, workers: list[str]) -> float | None:
    info = workers_info(client)
    limits = [info[w].get("memory_limit") or 0 for w in workers if w in info]
    limits = [x for x in limits if x > 0]
    return float(min(limits)) if limits else None


def _check_plan_sources(plan: Plan, client: Client, workers: list[str]) -> None:
    """A hand-made plan must place cluster-resident data on a worker that holds it."""
    from .physical import PSource

    nodes = [n for n in plan.nodes if isinstance(n, PSource) and isinstance(n.source, ClusterSource)]
    for node in nodes:
        src = node.source
        _check_cluster_source(src, client)
        who = _who_has(client, [k for _, k in src.dask_keys])
        holders = {tk: {workers.index(w) for w in who.get(dk, ()) if w in workers} for tk, dk in src.dask_keys}
        for site, keys in enumerate(node.layout.site_keys(node.type)):
            for k in keys:
                if holders[k] and site not in holders[k]:
                    raise ValueError(
                        f"the plan places {src.name} chunk {k} on site {site}, but it lives on site(s) "
                        f"{sorted(holders[k])}; plan it with td.submit(expr) or td.plan_for(expr, client)"
                    )


def _run(plan: Plan, client: Client, workers: list[str]):
    token = uuid.uuid4().hex[:10]
    lowered = lower(plan, workers, token)
    recorded = _ensure_recorder(client)
    if recorded:
        _publish(plan, lowered, client)
    started = time.time()
    keepalive: dict = {}
    for w, data in lowered.scatter.items():
        keepalive.update(client.scatter(data, workers=[w]))
    for node in toposort(plan.outputs):  # cluster-resident sources stay alive while we run
        src = getattr(node, "source", None)
        if isinstance(src, ClusterSource):
            keepalive[src.name] = src.keeper
    in_graph = lowered.graph_keys()
    wanted = sorted({k for o in lowered.outputs for k in o.values() if k in in_graph}, key=str)
    futures = dict(zip(wanted, client.get(lowered.graph(), wanted, sync=False))) if wanted else {}
    results = []
    for node, keys in zip(plan.outputs, lowered.outputs):
        futs = {}
        for tra_key, dk in keys.items():
            if dk in futures:
                futs[tra_key] = futures[dk]
            elif dk in keepalive:
                futs[tra_key] = keepalive[dk]
            else:
                futs[tra_key] = Future(dk, client)
        results.append(RelationFutures(futs, plan, node, client, lowered, started, keepalive, recorded))
    return plan.rebuild(results)


def _publish(plan: Plan, lowered: Lowered, client: Client) -> None:
    """Show the plan on the scheduler's tra_dask page."""
    keys = sorted(lowered.graph_keys(), key=str)  # tasks (scattered chunks are data, not tasks)
    record = {
        "token": lowered.token,
        "label": " + ".join(o.label for o in plan.outputs),
        "explain": plan.explain(),
        "strategies": plan.strategies(),
        "predicted_bytes": int(plan.cost.bytes_moved),
        "workers": list(lowered.workers),
        "keys": keys,
        "key_workers": [lowered.planned[k] for k in keys],
    }
    try:
        client.run_on_scheduler(_add_plan, record=record)
    except Exception:  # the page is a convenience; the run does not depend on it
        pass


def compute(expr, client: Client | None = None, sites=None, progress: bool = True, **kw):
    """Run ``expr`` and gather: ``{key: chunk}`` (or a tuple/dict of them), with Dask's
    progress bar (``progress=False`` for none).  Keyword arguments go to
    :func:`submit` (``optimize``, ``memory_limit``, ``cost_model``, ``objective``, ``calibrate``)."""
    out = submit(expr, client=client, sites=sites, **kw)
    items, rebuild = _flatten_futures(out)
    if progress:
        from distributed import progress as _progress

        notebook = False
        try:  # a widget in notebooks when ipywidgets is there; a text bar everywhere else
            import ipywidgets  # noqa: F401
            from IPython import get_ipython

            notebook = type(get_ipython()).__name__ == "ZMQInteractiveShell"
        except Exception:
            pass
        with items[0].client.as_current():
            _progress([f for rf in items for f in rf.values()], notebook=notebook)
    return rebuild([rf.gather() for rf in items])


def _flatten_futures(out):
    if isinstance(out, RelationFutures):
        return [out], lambda rs: rs[0]
    if isinstance(out, tuple):
        return list(out), tuple
    if isinstance(out, list):
        return list(out), list
    names = list(out)
    return [out[n] for n in names], lambda rs: dict(zip(names, rs))


class RelationFutures(Mapping):
    """The result of a submission: ``{TRA key: distributed.Future}``.

    Also ``.plan`` (the plan it ran), ``.gather()``, ``.to_numpy()``,
    ``.to_dask_array()``, ``.transfers()`` (bytes measured moving between workers for
    this submission) and ``.ran_on()`` (which worker computed each task).  It can be
    the input of a later TRA expression: its chunks stay where they are.
    """

    def __init__(self, futures: dict, plan: Plan, node, client: Client, lowered: Lowered, started: float,
                 keepalive: dict, recorded: bool):
        self._futures = dict(sorted(futures.items()))
        self.plan, self.node, self.client, self.lowered = plan, node, client, lowered
        self.token = lowered.token
        self._started, self._keepalive, self._recorded = started, keepalive, recorded
        self._finished = None

    # -- Mapping -----------------------------------------------------------
    def __getitem__(self, key):
        return self._futures[key]

    def __iter__(self):
        return iter(self._futures)

    def __len__(self):
        return len(self._futures)

    @property
    def type(self) -> RelationType:
        return self.node.type

    @property
    def label(self) -> str:
        return f"futures({self.node.label})"

    def __repr__(self):
        states = {}
        for f in self._futures.values():
            states[f.status] = states.get(f.status, 0) + 1
        return f"<RelationFutures {self.node.label}: {len(self)} chunks {states} on {len(self.lowered.workers)} sites>"

    def _repr_html_(self) -> str:
        from .viz import futures_html
        return futures_html(self)

    @property
    def dashboard_link(self) -> str | None:
        """This submission on the scheduler's tra_dask dashboard page."""
        link = page_link(self.client)
        return f"{link}#{self.token}" if link else None

    # -- waiting -----------------------------------------------------------
    def wait(self, timeout: float | None = None) -> "RelationFutures":
        """Wait until every chunk is computed.  Raises the first task error, or a
        clear error if a worker that the plan pins tasks to leaves the cluster."""
        _check_client(self.client)
        _wait_done(list(self._futures.values()), self.client, self.lowered.workers, timeout)
        if self._finished is None:
            self._finished = time.time()
        for f in self._futures.values():
            if f.status == "error":
                raise f.exception()
        self._keepalive.clear()  # the inputs may go now
        return self

    def gather(self) -> dict:
        """``{key: chunk}`` in this process."""
        self.wait()
        return self.client.gather(dict(self._futures))

    def to_numpy(self):
        return to_numpy(self.node, self.gather())

    # -- composition -------------------------------------------------------
    def __tra_relation__(self) -> ClusterSource:
        """This result as a source of a later TRA expression (its data stays put)."""
        client = self.client
        futs = self._futures
        return ClusterSource(
            tuple((k, f.key) for k, f in futs.items()), self.node.type, f"futures-{self.token}",
            _FetchFromCluster(client), keeper=self,
        )

    def to_dask_array(self):
        """A dask array backed by these futures (no data moves).  The keys must form
        one tensor's chunk grid."""
        import dask.array as da
        from dask.highlevelgraph import HighLevelGraph

        t = self.node.type
        if t.arity != t.rank or not t.is_continuous:
            raise ValueError(
                f"{self.label}: to_dask_array needs a continuous grid with key arity == chunk rank, "
                f"got arity {t.arity}, rank {t.rank}"
            )
        chunks = t.grid_extents()
        name = f"tra-array-{self.token}-{uuid.uuid4().hex[:6]}"
        layer = {(name,) + k: f for k, f in self._futures.items()}
        graph = HighLevelGraph.from_collections(name, layer, dependencies=())
        return da.Array(graph, name, chunks, dtype=t.dtype)

    # -- measurements ------------------------------------------------------
    def transfers(self) -> int:
        """Bytes that moved between workers for this submission, from the workers'
        transfer logs: transfers of this submission's keys (and of the cluster-resident
        inputs it read) between its start and its end.  Data sent to the client is not
        counted; another submission reading the same cluster-resident inputs at the
        same time would be."""
        self.wait()
        ours = self.lowered.graph_keys() | {k for d in self.lowered.scatter.values() for k in d}
        for node in toposort(self.plan.outputs):
            src = getattr(node, "source", None)
            if isinstance(src, ClusterSource):
                ours |= {k for _, k in src.dask_keys}
        workers = set(self.lowered.workers)
        since, until = self._started - 0.01, self._finished + 0.5

        def count(dask_worker, ours=ours, workers=workers, since=since, until=until):
            total = 0
            for e in dask_worker.transfer_outgoing_log:
                if e["who"] in workers and since <= e["start"] <= until:
                    total += sum(n for k, n in e["keys"].items() if k in ours)
            return total

        total = int(sum(self.client.run(count, workers=list(workers)).values()))
        if self._recorded:
            try:
                self.client.run_on_scheduler(_set_measured, token=self.token, nbytes=total)
            except Exception:
                pass
        return total

    def ran_on(self) -> dict:
        """``{dask key: worker}`` for every task of this submission that the
        scheduler saw finish (empty if the scheduler cannot load tra_dask)."""
        self.wait()
        if not self._recorded:
            return {}
        keys = self.lowered.graph_keys()

        def grab(dask_scheduler, keys=keys):
            plugin = dask_scheduler.plugins.get(TraScheduler.name)
            return {} if plugin is None else {k: plugin.ran[k] for k in keys if k in plugin.ran}

        return self.client.run_on_scheduler(grab)

    def planned_on(self) -> dict:
        """``{dask key: worker}`` as the plan pinned them."""
        return {k: w for k, w in self.lowered.planned.items() if k in self.lowered.graph_keys()}


class _FetchFromCluster:
    """Fetches a chunk by key for the reference evaluator."""

    def __init__(self, client):
        self.client = client

    def __call__(self, key):
        return Future(key, self.client).result()


def from_dask_array(x, name: str | None = None, client: Client | None = None) -> ClusterSource:
    """A tensor relation over a dask array's blocks, where they already are.

    The array is persisted on ``client`` (default: the current client) if it is
    not already; its blocks never pass through this process, and the plan sees
    where each block lives (a fixed placement).
    """
    from distributed import default_client, futures_of

    client = client or default_client()
    _check_client(client)
    block_keys = {(x.name,) + idx for idx in np.ndindex(*x.numblocks)}
    if not block_keys <= {f.key for f in futures_of(x)}:
        x = client.persist(x)
    futs = {f.key: f for f in futures_of(x) if f.key in block_keys}
    keys = {}
    for idx in np.ndindex(*x.numblocks):
        dk = (x.name,) + idx
        if dk not in futs:
            raise ValueError(f"from_dask_array: block {idx} is not backed by a future; persist the array first")
        keys[tuple(int(i) for i in idx)] = dk
    shapes = np.array([[x.chunks[d][i] for d, i in enumerate(idx)] for idx in keys], dtype=np.int64)
    table, ids = np.unique(shapes, axis=0, return_inverse=True)
    t = RelationType(np.array(list(keys), dtype=np.int64).reshape(len(keys), x.ndim), ids.reshape(-1),
                     [tuple(r) for r in table.tolist()], x.dtype)
    return ClusterSource(tuple(sorted(keys.items())), t, name or f"dask-array[{x.name[:24]}]",
                         _FetchFromCluster(client), keeper=(x, list(futs.values())))

