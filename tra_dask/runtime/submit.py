"""Plan, lower, send: ``plan_for``, ``submit``, ``compute``."""

from __future__ import annotations

import threading
import time
import uuid
import weakref

import dask
from distributed import Client, Future

from .dashboard import _add_plan
from ..logical import ClusterSource, Relation, on_device
from ..logical.nodes import toposort
from ..lowering import Lowered, lower
from ..lowering.keys import task_name
from ..optimizer import NoPlanFits, Plan, compile
from ..optimizer.cache import PlanCache, signature
from ..optimizer.objective import DEFAULT_OBJECTIVE
from ..optimizer import optimize as _optimize
from ..optimizer.optimize import searched_alike
from ..optimizer.target import Target
from .cluster import WorkersLeft, _ensure_recorder, _gone_after, _resolve, _Vanished, run_on_workers, workers_info
from .futures import ArrayFutures, RelationFutures, Submission
from .resident import _check_plan_sources, _cluster_placements, refresh_sources, scatter_once
from .calibrate import cluster_spec

def plan_for(expr, client: Client | None = None, sites=None, *, optimize: bool = True,
             memory_limit: float | None = None, cost_model: str = "exact", objective=None,
             calibrate: bool = True, beam: int | None = None, budget: int | None = None) -> Plan:
    """The plan :func:`submit` would run for ``expr`` on ``client``'s workers (with the
    fixed placements of data already on the cluster), without running it.

    With the time objective (the default) the plan is chosen for this cluster: it is
    measured on the first plan (:func:`tra_dask.calibrate`, ~3-4 s) and the spec cached
    per cluster; ``calibrate=False`` uses the default :class:`~tra_dask.ClusterSpec`
    instead.
    ``beam``, ``budget``: the search's width and length (see :func:`tra_dask.optimize`)."""
    client, workers = _resolve(client, sites)
    return planned_on(expr, client, workers, optimize=optimize, memory_limit=memory_limit, cost_model=cost_model,
                      objective=objective, calibrate=calibrate, beam=beam, budget=budget)


def planned_on(expr, client: Client, workers: list[str], *, optimize: bool = True, memory_limit=None,
               cost_model: str = "exact", objective=None, calibrate: bool = True, options="auto", beam=None,
               budget=None, gathers=None) -> Plan:
    """:func:`plan_for` on ``client`` and ``workers`` already resolved (a submission
    resolves them once and plans with them, however many plans it makes).
    ``gathers``: what the call does with the results (:func:`target_for`)."""
    options = dict(optimize=optimize, memory_limit=memory_limit, cost_model=cost_model, objective=objective,
                   calibrate=calibrate, options=options, beam=beam, budget=budget, gathers=gathers)
    plan = _plan_for(expr, client, workers, **options)
    _PLANNED_FOR[plan] = options  # submit() plans it again the same way if Dask moves its data meanwhile
    return plan


_PLANNED_FOR: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # plan_for's (and the front-end's) plans -> options


def target_for(client: Client, workers: list[str], expr=None, *, memory_limit=None, calibrate: bool = True,
               objective=None, cost_model: str = "exact", gathers=None) -> tuple:
    """``(target, room)``: the :class:`~tra_dask.optimizer.target.Target` a plan on
    ``workers`` of ``client`` is made for — the one place that reads the workers'
    memory budget, calibrates the cluster and reads where ``expr``'s cluster data
    lives (its fixed placements; none without ``expr``).  ``room``: the budget read
    from the workers (a :class:`MemoryBudget`, saying how it was found), or None when
    ``memory_limit`` was given or an Objective object brings its own.  ``gathers``: what
    the call does with the results (:meth:`ClusterSpec.gathering`: the time model prices
    bringing them to the client)."""
    objective = DEFAULT_OBJECTIVE if objective is None else objective
    placements = (_cluster_placements(expr, client, workers) or None) if expr is not None else None
    room = None
    own = not isinstance(objective, str)  # an Objective object: its own limit and cluster
    if memory_limit is None and not own:
        memory_limit = room = _memory_budget(client, workers)
    cluster = None
    if objective == "time":
        cluster = cluster_spec(client, calibrate_=calibrate, workers=workers).with_sites(len(workers)).gathering(gathers)
        cluster = cluster if expr is None or on_device(expr) else cluster.on_host()  # GPU terms for device data only
        if cluster.gpu is not None and room is not None and cluster.gpu.memory < room:
            # chunks on the device: its memory is the hard limit (the same share of it as of the host's)
            memory_limit = room = _device_budget(cluster.gpu)
    target = Target(len(workers), cluster=cluster, memory_limit=memory_limit, placements=placements,
                    cost_model=cost_model)
    return target, room


def _plan_for(expr, client, workers, *, optimize, memory_limit, cost_model, objective, calibrate, options, beam,
              budget, gathers):
    if objective is None:
        objective = DEFAULT_OBJECTIVE
    if not isinstance(expr, (Relation, tuple, list, dict)) and hasattr(expr, "__tra_relation__"):
        expr = expr.__tra_relation__()
    expr = refresh_sources(expr, client)
    if not optimize:
        placements = _cluster_placements(expr, client, workers) or None
        return compile(expr, sites=len(workers), placements=placements, cost_model=cost_model)
    target, room = target_for(client, workers, expr, memory_limit=memory_limit, calibrate=calibrate,
                              objective=objective, cost_model=cost_model, gathers=gathers)
    cache = _plan_cache(client) if dask.config.get("tra-dask.plan-cache", True) else None
    if cache is None:
        return _searched(expr, client, workers, target, room, objective, options, beam, budget)[0]
    placements = target.placement_map
    sig, sources = signature(expr, lambda s: placements[s].token if placements and s in placements else None)
    key = (sig, tuple(workers), cost_model, _objective_token(objective), target.cluster, options, beam, budget,
           room is None and target.memory_limit)
    while True:  # (a miss another thread is planning: its plan, once it is in the cache)
        plan = cache.get(key, expr, sources, accept=lambda p, limit: _fits(p, limit, target.memory_limit))
        if plan is None and isinstance(options, str) and options != "quick" and beam is None and budget is None:
            # the quick search's plan of the same expression, where it is what this search finds
            quick = cache.get(key[:5] + ("quick",) + key[6:], expr, sources,
                              accept=lambda p, limit: _fits(p, limit, target.memory_limit))
            if quick is not None and searched_alike(quick, "quick", options):
                plan = quick
        if plan is not None:
            return plan
        with cache.planning(key) as mine:
            if mine:
                plan, limit = _searched(expr, client, workers, target, room, objective, options, beam, budget)
                cache.put(key, plan, sources, limit)
                return plan


def _searched(expr, client, workers, target, room, objective, options, beam, budget) -> tuple:
    """``(plan, the memory limit it was planned for)``: the search for ``expr`` on
    ``target``, asking the workers once to hand memory back before saying no plan fits."""
    for again in (False, True):
        try:
            plan = _optimize(expr, target, objective=objective, options=options, beam=beam, budget=budget)
            break
        except NoPlanFits as e:
            if room is None:
                raise
            # memory the workers' allocators keep after freeing counts as held until handed
            # back: hand it back and measure again, once, before saying no
            more = None if again else _reclaimed_budget(client, workers)
            if more is None or more <= room:
                raise NoPlanFits(f"{e} (the limit is the cluster's: {room.why})") from None
            room = more
            target = target.replace(memory_limit=float(more))
    return plan, target.memory_limit


_PLAN_CACHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # client -> PlanCache
_PLAN_CACHES_LOCK = threading.Lock()


def _plan_cache(client: Client) -> PlanCache:
    """The client's cache of plans (:mod:`tra_dask.optimizer.cache`): a repeated
    submission of an expression of the same structure, over sources of the same types
    and placements on the same workers, reuses the plan instead of searching again.
    ``dask.config.set({"tra-dask.plan-cache": False})`` turns it off."""
    with _PLAN_CACHES_LOCK:
        cache = _PLAN_CACHES.get(client)
        if cache is None:
            cache = _PLAN_CACHES[client] = PlanCache(int(dask.config.get("tra-dask.plan-cache-size", 64)))
        return cache


def _objective_token(objective):
    """A hashable stand-in for the objective option (an Objective object by identity)."""
    return objective if objective is None or isinstance(objective, str) else ("object", id(objective))


def _fits(plan: Plan, planned_under, limit) -> bool:
    """A cached plan is reused under the memory budget of now when it fits it, and the
    budget it was chosen under was not much tighter (then a better plan may fit now):
    within 25%, or both none."""
    if limit is None or planned_under is None:
        return limit is None and planned_under is None
    if float(plan.cost.peak_bytes_per_site.max()) > float(limit):
        return False
    return float(planned_under) >= 0.75 * float(limit)


def submit(expr_or_plan, client: Client | None = None, sites=None, *, optimize: bool = True,
           memory_limit: float | None = None, cost_model: str = "exact", objective=None, calibrate: bool = True,
           name: str | None = None):
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
    objective : "time" (default), "bytes" or an Objective
        What the optimizer minimises (see :func:`tra_dask.optimize`).  An Objective
        object brings its own memory limit and cluster spec (the workers' memory
        and the calibration are not used).
    calibrate : bool
        For the time objective: measure the cluster on its first plan (cached, ~3-4 s)
        rather than use the default :class:`~tra_dask.ClusterSpec`.
    name : str, optional
        What the dashboard's tra_dask page calls this submission (default: its
        outputs' labels).

    Returns
    -------
    RelationFutures, or a tuple/dict of them for several outputs (ArrayFutures for a
    plan of array expressions, ``td.Array.plan()``'s).
    """
    kw = dict(optimize=optimize, memory_limit=memory_limit, cost_model=cost_model, objective=objective,
              calibrate=calibrate, name=name)
    if isinstance(expr_or_plan, Plan):  # a plan the array front-end made (it chose a chunking): arrays back
        array = any(st.name == "chunking" for st in expr_or_plan.stages)
        return _submit_planned(None, client, sites, kw, plan=expr_or_plan, array=array)

    def make(client, workers):
        return planned_on(expr_or_plan, client, workers, optimize=optimize, memory_limit=memory_limit,
                        cost_model=cost_model, objective=objective, calibrate=calibrate)

    return _submit_planned(make, client, sites, kw)


def _submit_planned(make, client, sites, kw: dict, *, plan: Plan | None = None, array: bool = False):
    """Plan and send, the one way for every submission (a relation, a Plan, the array
    front-end's expressions): ``make(client, workers) -> Plan`` plans it on the
    workers there are now (or ``plan``, given).  A worker that leaves while it is
    planned or sent makes it plan again on the workers there are then (three tries,
    unless the caller named the workers); a plan whose cluster data Dask moved since it
    was made (the Active Memory Manager dropping the replica it placed a chunk on, a
    rebalance) is planned again for where the data is, when it is known how it was
    made (:func:`plan_for`'s plans, the front-end's).  ``kw``: :func:`submit`'s
    options, which a recovery plans with again.  ``array``: the results are
    :class:`~tra_dask.runtime.ArrayFutures`."""
    name = kw.get("name")
    for attempt in range(3):
        client, workers = _resolve(client, sites)
        try:
            if plan is not None:
                p = plan
                if p.sites != len(workers):
                    raise ValueError(f"the plan is for {p.sites} sites but {len(workers)} workers were chosen")
            else:
                p = make(client, workers)
            p = _where_its_data_is(p, client, workers)
            return _run(p, client, workers, name, kw, array=array)
        except Exception as e:  # a worker left while we planned (calibrated) or sent: plan again
            if not isinstance(e, (WorkersLeft, _Vanished)):
                gone = _gone_after(client, workers, e)
                if not gone:
                    raise  # not a lost worker: the user's error, a bad argument, ...
                lost = WorkersLeft(f"worker(s) {sorted(gone)} left the cluster while this expression was "
                                   f"planned or sent ({type(e).__name__}: {e})", gone)
                lost.__cause__, e = e, lost
            if plan is not None:
                raise RuntimeError(f"{e}; re-submit (a plan on all the workers there are now is made by "
                                   f"td.submit(expr) with no sites list)") from e
            if not (sites is None or isinstance(sites, int)):
                raise e  # the caller named the workers (the recovery does, and tries again)
            if attempt == 2:
                raise RuntimeError(f"{e}; gave up after 3 tries to plan and send it as workers kept "
                                   f"leaving") from e
            time.sleep(0.2)


def _where_its_data_is(plan: Plan, client: Client, workers: list[str]) -> Plan:
    """``plan``, or, where the cluster data it reads is no longer where it places it
    (the Active Memory Manager dropped that replica, a rebalance, a restarted worker)
    and it is known how the plan was made, that plan made again for where the data
    is now.  A plan made by hand (or by compile/optimize) raises: the caller chose
    that placement."""
    try:
        _check_plan_sources(plan, client, workers)
        return plan
    except ValueError:
        made = _PLANNED_FOR.get(plan)
        if made is None or plan.expr is None:
            raise
    options = dict(made)
    before = options.pop("stages", ())  # steps before the optimizer (the front-end's chunking)
    fresh = planned_on(plan.expr, client, workers, **options)
    for stage in reversed(before):
        fresh = fresh.with_stage(stage)
    _PLANNED_FOR[fresh] = made
    return fresh


def _remember(plan: Plan, stages=(), **options) -> Plan:
    """Record how a plan that :func:`plan_for` made with ``options`` and that was then
    given earlier ``stages`` (:meth:`Plan.with_stage`: the array front-end's choice of
    chunking) can be made again, as for :func:`plan_for`'s own plans."""
    defaults = dict(optimize=True, memory_limit=None, cost_model="exact", objective=None, calibrate=True,
                    options="auto", beam=None, budget=None, gathers=None)
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"_remember: unknown option(s) {sorted(unknown)}")
    _PLANNED_FOR[plan] = {**defaults, **options, "stages": tuple(stages)}
    return plan


def memory_fraction() -> tuple[float, str]:
    """The fraction of a worker's ``memory_limit`` a plan may fill, and its name: the
    workers' memory *target* (``distributed.worker.memory.target``, where Dask starts
    spilling), else the first of spill/pause/terminate that is set — never the limit
    at which the nanny kills the worker."""
    for name in ("target", "spill", "pause", "terminate"):
        f = dask.config.get(f"distributed.worker.memory.{name}", False)
        if f not in (False, None) and 0 < float(f) <= 1:
            return float(f), name
    return 1.0, "limit"


def _device_budget(gpu) -> "MemoryBudget":
    """Bytes per site for a plan whose chunks live on the GPUs: :func:`memory_fraction`
    of the device's memory (cupy's pool holds what a plan frees for its next arrays)."""
    fraction, name = memory_fraction()
    budget = MemoryBudget(fraction * gpu.memory)
    budget.why = f"{fraction:.0%} ({name}) of the {gpu.name}'s {gpu.memory:,.0f} bytes of device memory"
    return budget


class MemoryBudget(float):
    """Bytes per site a plan may hold at its peak, and how they were found (for the
    error when no plan fits)."""

    why: str = ""


def _memory_budget(client: Client, workers: list[str]) -> MemoryBudget | None:
    """Bytes per site for a plan on ``workers``: the smallest of, per worker, its memory
    target (:func:`memory_fraction` of its ``memory_limit``) less the memory its process
    holds besides Dask's data (its baseline: the interpreter, libraries, buffers; the
    scheduler's ``unmanaged_old`` measure).  None when the workers have no limit."""
    who = tuple(workers)

    def ask(dask_scheduler, who=who):
        out = {}
        for w in who:
            ws = dask_scheduler.workers.get(w)
            if ws is not None and ws.memory_limit:
                out[w] = (int(ws.memory_limit), int(ws.memory.unmanaged_old))
        return out

    try:
        seen = client.run_on_scheduler(ask)
    except Exception:  # a scheduler that cannot run this: the limits the client knows, no baseline
        info = workers_info(client)
        seen = {w: (int(info[w].get("memory_limit") or 0), 0) for w in workers if w in info}
        seen = {w: v for w, v in seen.items() if v[0] > 0}
    budget = _budget_of(seen, "")
    if budget is not None and budget <= 0:
        budget = _reclaimed_budget(client, workers) or budget
    if budget is not None and budget <= 0:
        raise ValueError(f"no room for a plan: {budget.why} leaves {float(budget):,.0f} bytes; give the workers "
                         f"more memory (memory_limit) or pass memory_limit= explicitly")
    return budget


def _budget_of(seen: dict, how: str) -> MemoryBudget | None:
    """The budget from ``{worker: (memory_limit, bytes held besides data)}``."""
    if not seen:
        return None
    fraction, name = memory_fraction()
    w, (limit, baseline) = min(seen.items(), key=lambda kv: fraction * kv[1][0] - kv[1][1])
    budget = MemoryBudget(fraction * limit - baseline)
    budget.why = (f"worker {w}: {fraction:.0%} ({name}) of its memory_limit {limit:,} bytes, less the "
                  f"{baseline:,} bytes its process holds besides data{how}")
    return budget


def _reclaimed_budget(client: Client, workers: list[str]) -> MemoryBudget | None:
    """The budget after each worker hands the memory its allocator keeps free back to
    the system (glibc's ``malloc_trim``; elsewhere nothing changes), measured on the
    workers themselves: after heavy work a process holds freed memory that the
    scheduler's ``unmanaged_old`` counts as taken until it is returned."""
    try:
        seen = run_on_workers(client, _trim_and_measure, workers)
    except WorkersLeft:  # one stopped answering (removed now): planned again on the others
        raise
    except Exception:  # a worker gone meanwhile, or a cluster that cannot run this: no second look
        return None
    return _budget_of({w: v for w, v in seen.items() if v is not None}, " (measured after returning freed memory)")


def _trim_and_measure(dask_worker):
    import ctypes

    limit = dask_worker.memory_manager.memory_limit
    if not limit:
        return None
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    held = dask_worker.monitor.get_process_memory() - dask_worker.state.nbytes
    return int(limit), max(0, int(held))


def _run(plan: Plan, client: Client, workers: list[str], name: str | None = None, kw: dict | None = None,
         array: bool = False):
    token = uuid.uuid4().hex[:10]
    lowered = lower(plan, workers, token)
    recorded = _ensure_recorder(client)
    if recorded:
        _publish(plan, lowered, client, name)
    started = time.time()
    keepalive: dict = {}
    keepalive.update(scatter_once(client, lowered))
    # sent: keep the keys (transfers() reads them), not this process's copies of the data
    lowered.scatter = {w: dict.fromkeys(d) for w, d in lowered.scatter.items()}
    lowered.scatter_owner = {}
    lowered.scatter_region = {}
    for node in toposort(plan.outputs):  # cluster-resident sources stay alive while we run
        src = getattr(node, "source", None)
        if isinstance(src, ClusterSource):
            keepalive[src.name] = src.keeper
    in_graph = lowered.graph_keys()
    wanted = sorted({k for o in lowered.outputs for k in o.values() if k in in_graph}, key=str)
    futures = dict(zip(wanted, client.get(lowered.graph(), wanted, sync=False))) if wanted else {}
    results, submission = [], Submission(plan, client, kw or {"name": name}, lowered)
    kind = ArrayFutures if array else RelationFutures  # the same object the recovery updates
    for node, keys in zip(plan.outputs, lowered.outputs):
        futs = {}
        for tra_key, dk in keys.items():
            if dk in futures:
                futs[tra_key] = futures[dk]
            elif dk in keepalive:
                futs[tra_key] = keepalive[dk]
            else:
                futs[tra_key] = Future(dk, client)
        results.append(kind(futs, plan, node, client, lowered, started, keepalive, recorded, submission))
    submission.outputs = results
    return plan.rebuild(results)


def _publish(plan: Plan, lowered: Lowered, client: Client, name: str | None = None) -> None:
    """Show the plan on the scheduler's tra_dask page."""
    keys = sorted(lowered.graph_keys(), key=str)  # tasks (scattered chunks are data, not tasks)
    order = lowered.work.order
    index = {n: i for i, n in enumerate(order)}
    fused = lowered.work.into.per_node()
    record = {
        "token": lowered.token,
        "label": " + ".join(_title(o) for o in plan.outputs),
        "explain": plan.explain(),
        "strategies": plan.strategies(),
        "predicted_bytes": int(plan.cost.bytes_moved),
        "workers": list(lowered.workers),
        "keys": keys,
        "key_workers": [lowered.planned[k] for k in keys],
        "name": name,
        # the plan's operators in lowering order: task keys of operator i are (f"{op}-{i}-{token}", j)
        "nodes": [
            {"index": i, "op": n._op, "label": n.label, "prefix": task_name(n._op, i, lowered.token),
             "params": n._fmt_params()[:120],
             "inputs": [index[c] for c in n.children],
             # its own tasks: those fused into a reader run inside the reader's task
             "tasks": int(len(lowered.work[n].task_site)) - fused.get(n, 0), "fused": fused.get(n, 0)}
            for i, n in enumerate(order)
        ],
        "outputs": [{"label": o.label, "node": index[o]} for o in plan.outputs],
    }
    try:
        client.run_on_scheduler(_add_plan, record=record)
    except Exception:  # the page is a convenience; the run does not depend on it
        pass


def _title(node) -> str:
    """A whole (not cut-off) name for a plan output: its label where that is short,
    else its operator over the sources it reads."""
    label = node.label
    if not label.endswith("..."):
        return label
    sources = dict.fromkeys(n.label for n in toposort([node]) if not n.children)
    return f"{node._op} over {', '.join(sources)}"


def compute(expr, client: Client | None = None, sites=None, progress: bool = True, **kw):
    """Run ``expr`` and gather: ``{key: chunk}`` (or a tuple/dict of them), with a
    progress bar (``progress=False`` for none).  Keyword arguments go to
    :func:`submit` (``optimize``, ``memory_limit``, ``cost_model``, ``objective``, ``calibrate``, ``name``)."""
    out = submit(expr, client=client, sites=sites, **kw)
    items, rebuild = _flatten_futures(out)
    bar = _Progress(items) if progress else None
    try:
        return rebuild([rf.gather() for rf in items])  # waits, recovering from lost workers
    finally:
        if bar is not None:
            bar.close()


class _Progress:
    """A progress bar over results' chunks that never blocks the caller (the waits
    that follow it check for lost workers): Dask's widget in a notebook (when
    ipywidgets is there), else a text bar drawn from a thread; it follows the
    results' futures through a recovery."""

    def __init__(self, items):
        self.items, self.stop, self.thread = items, threading.Event(), None
        notebook = False
        try:
            import ipywidgets  # noqa: F401
            from IPython import get_ipython

            notebook = type(get_ipython()).__name__ == "ZMQInteractiveShell"
        except Exception:
            pass
        if notebook:
            from distributed import progress

            with items[0].client.as_current():
                progress([f for rf in items for f in rf.values()], notebook=True)
        else:
            self.started = time.monotonic()
            self.thread = threading.Thread(target=self._run, daemon=True, name="tra-dask-progress")
            self.thread.start()

    def _draw(self, final: bool = False) -> None:
        futures = [f for rf in self.items for f in rf._futures.values()]
        done = sum(f.done() for f in futures)
        frac = done / len(futures) if futures else 1.0
        bar = "#" * int(40 * frac)
        print(f"\r[{bar:<40}] | {100 * frac:3.0f}% Completed | {time.monotonic() - self.started:5.1f}s",
              end="\n" if final else "", flush=True)

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self._draw()

    def close(self) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self._draw(final=True)


def _flatten_futures(out):
    if isinstance(out, RelationFutures):
        return [out], lambda rs: rs[0]
    if isinstance(out, tuple):
        return list(out), tuple
    if isinstance(out, list):
        return list(out), list
    names = list(out)
    return [out[n] for n in names], lambda rs: dict(zip(names, rs))

