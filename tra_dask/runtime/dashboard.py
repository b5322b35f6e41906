"""The tra_dask page in the Dask dashboard.

A scheduler plugin (registered by the runtime once per scheduler; idempotent) that

* records which worker computed each task (so placement can be checked from the
  scheduler's own transitions),
* keeps the plans submitted to this scheduler and follows them live from the
  scheduler's transitions: each operator's tasks (waiting / running / done / erred)
  and the bytes that move between workers while the plan runs, and
* serves them on the scheduler's HTTP server: ``/tra-dask`` (a page: the plan drawn
  as operators with arrows from their inputs, each coloured by its state; bytes moved,
  predicted and counted live, per plan, per output and per pair of sites; the explain
  tree; it refreshes itself) and ``/tra-dask/api/plans`` (the same numbers as JSON).

Reaching it from Dask's dashboard: when the plugin starts on a scheduler whose
Bokeh dashboard is running, ``tra-dask`` is appended to the dashboard's navigation
bar (the ``pages`` list of ``distributed.dashboard.scheduler.template_variables``,
which every Dask page renders its top bar from), and the tra_dask page links back to
Dask's ``/status``.  Both are served under the dashboard's URL prefix, if any.

Bytes counted live.  A task of a plan that finishes (or errs) on worker W read its
dependencies on W; each dependency that W did not hold when the task was assigned
to W was fetched from another worker: its ``nbytes`` count once per fetch
(concurrent tasks on W that wait for the same dependency share one fetch, as the
worker does).  Assignment, not the finish, is when to look: a worker reports the
copy it fetched before it runs the task, so at the finish W already holds it.  A fetch is attributed to the operator of the task that needed it, to
the destination W, and to the worker that held the chunk when the plan first needed
it (its "home"; with several copies, the lowest address).  Per output, the page sums
the bytes of the operators the output node depends on (itself included); outputs
that share operators share their bytes.  After a run the plan total equals what
``RelationFutures.transfers()`` reads from the workers' transfer logs (which stays
the authoritative measure) and so do the per-destination sums; a worker may fetch a
chunk from a copy other than its home, so one cell of the per-site matrix can then
differ from the logs while its column total does not.  What can make the totals
differ: a task cancelled after its inputs arrived (its fetch is not counted here),
the scheduler's view of a worker's replicas lagging that worker by a message (a
worker that had just dropped a chunk fetches it again, uncounted here), and, on the
other side, ``transfers()`` counting another submission's concurrent fetches of the
same cluster-resident inputs.

The page is served by the scheduler's own HTTP server, so it is bound wherever the
dashboard is (the embedded cluster binds 127.0.0.1 only).

Under load.  Everything runs on the scheduler's event loop, so nothing here may take
long: per task of a kept plan the plugin keeps a few bytes in arrays (its state, its
pinned worker, the worker that ran it), found from the key's prefix; the page and the
JSON read per-operator and per-site counts kept up to date by the transitions (never
the tasks), and are made again only after something changed.  The page draws the
newest plans in full and lists the older ones one row each (each links to a page of
its own, ``/tra-dask?plan=<token>``; the JSON takes ``?plan=<token>`` too).
Configuration (``dask.config``, read on the scheduler each time it matters):

* ``tra-dask.dashboard.keep-plans`` (50): plans kept; the oldest submitted go first.
* ``tra-dask.dashboard.keep-seconds`` ("1h"; 0 or None: no limit): a plan none of
  whose tasks changed state for this long goes (checked every 10 s, at each
  submission and at each request).
* ``tra-dask.dashboard.page-plans`` (10): plans the page draws in full.

(For a ``dask scheduler`` process: its Dask config file, or the environment, e.g.
``DASK_TRA_DASK__DASHBOARD__KEEP_PLANS=20``.)

A plan that goes takes its live counts and its ``ran_on()`` records with it.
"""

from __future__ import annotations

import html
import json
import sys
import time
from array import array
from collections import OrderedDict
from urllib.parse import quote

import dask
import numpy as np
from dask.utils import parse_timedelta
from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["TraScheduler", "PAGE", "API"]

PAGE = "/tra-dask"
API = "/tra-dask/api/plans"
NAV = PAGE.strip("/")  # the entry in Dask's navigation bar (a link relative to its pages)

# dask.config keys read on the scheduler (each time they matter, so a change applies at once)
KEEP_PLANS, KEEP_SECONDS, PAGE_PLANS = ("tra-dask.dashboard.keep-plans", "tra-dask.dashboard.keep-seconds",
                                        "tra-dask.dashboard.page-plans")
DEFAULTS = {KEEP_PLANS: 50, KEEP_SECONDS: "1h", PAGE_PLANS: 10}
EXPIRE_EVERY = 10.0  # seconds between the scheduler's checks for plans past keep-seconds

_COLOURS = {"waiting": "#e8e8e8", "running": "#f5c542", "done": "#6fbf73", "erred": "#e05a4f", "no tasks": "#f4f4f4"}

WAITING, RUNNING, DONE, ERRED = 0, 1, 2, 3  # a task's category, one byte per task
_NAMES = ("waiting", "running", "done", "erred")


def _category(old: int, finish: str) -> int:
    """A task's state on the page after a scheduler transition to ``finish``: a task
    that was done stays done when the scheduler later releases or forgets it."""
    if finish == "processing":
        return RUNNING
    if finish == "memory":
        return DONE
    if finish == "erred":
        return ERRED
    return DONE if old == DONE else WAITING


def _config(name: str):
    return dask.config.get(name, DEFAULTS[name])


class _LivePlan:
    """One plan's record and what the scheduler has seen of it so far.

    Per task it keeps a few bytes in arrays indexed by the task's slot (its place in
    the record's key list): ``state`` (its category), ``pinned`` and ``ran`` (indices
    into ``names``, the workers' addresses; -1: not run yet).  A task key
    ``(prefix, j)`` of operator ``i`` finds its slot through ``lookup[i]``, an array
    indexed by ``j`` (a dict where the ``j`` are sparse); other keys through ``loose``.
    Everything else is per operator or per worker: ``counts[i]`` the categories'
    counts of operator ``i`` (``[n]``: tasks of no operator), ``sites`` per worker.
    While tasks run: ``pending`` the dependencies each running task has to fetch
    ``((dep, W), nbytes, home)``; ``fetches`` the open fetches ``(dep, W) -> [tasks
    waiting on it, counted?]``; ``home`` where each fetched chunk was first found
    (dropped once every task is done or erred)."""

    def __init__(self, record: dict, keys: list, key_workers: list):
        self.record = record
        self.token = record["token"]
        self.nodes = record.get("nodes") or []
        n = len(self.nodes)
        self.submitted = self.active = record["submitted"]
        self.counts = [{"total": 0, "running": 0, "done": 0, "erred": 0} for _ in range(n + 1)]  # [n]: no operator
        self.names = list(record["workers"])
        self.index = index = {w: i for i, w in enumerate(self.names)}
        pinned = []
        for w in key_workers:
            i = index.get(w)
            if i is None:
                i = index[w] = len(self.names)
                self.names.append(w)
            pinned.append(i)
        self.pinned = array("i", pinned)
        self.state = array("b", bytes(len(keys)))
        self.ran = array("i", [-1]) * len(keys)
        self.ntasks, self.settled = len(keys), 0  # settled: done or erred
        self.lookup, self.loose = self._index(keys)
        per_site = np.bincount(np.frombuffer(self.pinned, dtype=np.int32), minlength=len(self.names)).tolist()
        self.site_list = [{"tasks": c, "done": 0} for c in per_site]
        self.sites = {w: s for w, s in zip(self.names, self.site_list) if s["tasks"] or w in record["workers"]}
        self.pending: dict = {}
        self.fetches: dict = {}
        self.home: dict = {}
        self.moved = 0
        self.node_moved = [0] * (n + 1)
        self.matrix: dict = {}  # (source worker, destination worker) -> bytes

    def _index(self, keys: list) -> tuple:
        """``lookup[i]`` (slot of operator ``i``'s key ``(prefix, j)``) and ``loose``
        (slot of any other key); counts each operator's tasks."""
        by_prefix = {nd["prefix"]: nd["index"] for nd in self.nodes}
        n = len(self.nodes)
        js: list = [[] for _ in range(n)]
        slots: list = [[] for _ in range(n)]
        loose = {}
        for slot, key in enumerate(keys):
            if type(key) is not tuple:
                key = _key(key)  # a list where the record came as msgpack
            if len(key) == 2 and type(key[1]) is int and key[1] >= 0:
                i = by_prefix.get(key[0])
                if i is not None:
                    js[i].append(key[1])
                    slots[i].append(slot)
                    continue
            loose[key] = slot
        lookup = []
        for i in range(n):
            self.counts[i]["total"] = len(js[i])
            if not js[i]:
                lookup.append({})
                continue
            j, s = np.array(js[i], dtype=np.int64), np.array(slots[i], dtype=np.int32)
            top = int(j.max()) + 1
            if top <= 4 * len(j) + 64:  # dense enough: 4 bytes per possible j
                table = np.full(top, -1, dtype=np.int32)
                table[j] = s
                lookup.append(array("i", table.tobytes()))
            else:
                lookup.append(dict(zip(js[i], slots[i])))
        self.counts[n]["total"] = len(loose)
        return lookup, loose

    def slot(self, node: int, j) -> int:
        """The slot of operator ``node``'s key ``(prefix, j)``, or -1."""
        table = self.lookup[node]
        if type(table) is dict:
            return table.get(j, -1)
        return table[j] if type(j) is int and 0 <= j < len(table) else -1

    def name(self, worker: str) -> int:
        """The index of ``worker`` in ``names`` (added if new)."""
        i = self.index.get(worker)
        if i is None:
            i = self.index[worker] = len(self.names)
            self.names.append(worker)
            self.site_list.append({"tasks": 0, "done": 0})
        return i

    def task(self, key, node: int, slot: int, ts, start: str, finish: str, worker: str | None) -> None:
        """Follow one transition of one of this plan's tasks."""
        old = self.state[slot]
        new = _category(old, finish)
        if new != old:
            counts = self.counts[node]
            if old:
                counts[_NAMES[old]] -= 1
            if new:
                counts[_NAMES[new]] += 1
            self.state[slot] = new
            if (old == DONE) != (new == DONE):
                self.site_list[self.pinned[slot]]["done"] += 1 if new == DONE else -1
            self.settled += (new >= DONE) - (old >= DONE)
            self.active = time.time()
        if start == "processing":
            if finish == "memory" and worker:
                self.ran[slot] = self.name(worker)
            ran_on = (worker or self.names[self.pinned[slot]]) if finish in ("memory", "erred") else None
            self._left_processing(key, node, ran_on)
        if finish == "processing" and ts is not None:
            self._assigned(key, ts)

    def _assigned(self, key, ts) -> None:
        """The dependencies the assigned worker lacks: it will fetch them."""
        ws = ts.processing_on
        if ws is None:
            return
        missing = []
        for dts in ts.dependencies:
            holders = dts.who_has
            if not holders or ws in holders:
                continue
            home = self.home.get(dts.key)
            if home is None:
                home = self.home[dts.key] = min(h.address for h in holders)
            pair = (dts.key, ws.address)
            fetch = self.fetches.get(pair)
            if fetch is None:
                fetch = self.fetches[pair] = [0, False]
            fetch[0] += 1
            missing.append((pair, dts.get_nbytes(), home))
        if missing:
            self.pending[key] = missing

    def _left_processing(self, key, node: int, ran_on: str | None) -> None:
        """A task left processing: if it ran (on ``ran_on``), what it fetched moved."""
        for pair, nbytes, home in self.pending.pop(key, ()):
            fetch = self.fetches[pair]
            if ran_on is not None and not fetch[1]:
                fetch[1] = True
                self.moved += nbytes
                self.node_moved[node] += nbytes
                cell = (home, ran_on)
                self.matrix[cell] = self.matrix.get(cell, 0) + nbytes
            fetch[0] -= 1
            if fetch[0] == 0:
                del self.fetches[pair]
        if self.settled == self.ntasks and not self.pending:
            self.home.clear()  # a run is over: per-chunk state goes, the counts stay

    def summary(self) -> dict:
        """The plan's totals, without its operators (a row on the page)."""
        c = {k: sum(counts[k] for counts in self.counts) for k in ("total", "running", "done", "erred")}
        c["waiting"] = c["total"] - c["running"] - c["done"] - c["erred"]
        rec = self.record
        return {"token": self.token, "title": rec.get("name") or rec["label"], "label": rec["label"],
                "submitted": self.submitted, "predicted_bytes": rec["predicted_bytes"], "live_bytes": self.moved,
                "measured_bytes": rec["measured_bytes"], **c}

    def snapshot(self) -> dict:
        """The plan as the JSON API serves it (and the page draws it): per operator,
        per output and per pair of sites, from the counts (never per task)."""
        rec = self.record
        item = {k: v for k, v in rec.items() if k not in ("nodes", "outputs")}
        nodes = []
        for spec, counts, moved in zip(self.nodes, self.counts, self.node_moved):
            c = dict(counts)
            c["waiting"] = c["total"] - c["running"] - c["done"] - c["erred"]
            nodes.append({**{k: spec[k] for k in ("index", "op", "label", "params", "inputs")},
                          **c, "state": _node_state(c), "live_bytes": moved})
        totals = {k: sum(n[k] for n in nodes) + self.counts[-1][k] for k in ("total", "running", "done", "erred")}
        totals["waiting"] = totals["total"] - totals["running"] - totals["done"] - totals["erred"]
        outputs = [{"label": o["label"], "node": o["node"],
                    "live_bytes": sum(nodes[i]["live_bytes"] for i in _ancestors(self.nodes, o["node"]))}
                   for o in rec.get("outputs") or []]
        order = list(rec["workers"]) + sorted({w for cell in self.matrix for w in cell} - set(rec["workers"]))
        item.update(totals, title=rec.get("name") or rec["label"], live_bytes=self.moved, nodes=nodes,
                    outputs=outputs, per_site={w: dict(s) for w, s in self.sites.items()},
                    transfers={"workers": order,
                               "bytes": [[self.matrix.get((s, d), 0) for d in order] for s in order]})
        return item


def _node_state(c: dict) -> str:
    if c["total"] == 0:
        return "no tasks"
    if c["erred"]:
        return "erred"
    if c["done"] == c["total"]:
        return "done"
    return "running" if c["running"] or c["done"] else "waiting"


def _ancestors(nodes: list, i: int) -> set:
    """Operator ``i`` and every operator it reads, directly or not."""
    seen, todo = set(), [i]
    while todo:
        j = todo.pop()
        if j not in seen and 0 <= j < len(nodes):
            seen.add(j)
            todo.extend(nodes[j]["inputs"])
    return seen


class _Ran:
    """Which worker computed each task, as ``key in ran`` / ``ran[key]``: a kept
    plan's tasks from the plan's arrays, other tasks from a dict of the newest
    ``limit``."""

    def __init__(self, plugin: "TraScheduler", limit: int):
        self.plugin, self.limit, self.other = plugin, limit, OrderedDict()

    def note(self, key, worker: str) -> None:
        self.other[key] = worker
        if len(self.other) > self.limit:
            self.other.popitem(last=False)

    def get(self, key, default=None):
        hit = self.plugin._find(key)
        if hit is None:
            return self.other.get(key, default)
        plan, _, slot = hit
        i = plan.ran[slot]
        return default if i < 0 else plan.names[i]

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def __getitem__(self, key) -> str:
        worker = self.get(key)
        if worker is None:
            raise KeyError(key)
        return worker


class TraScheduler(SchedulerPlugin):
    """The scheduler side of tra_dask: task records, live plans, the page and its API.

    Everything here runs on the scheduler's event loop: the transition hook does a
    dictionary lookup per transition (an array update or two for tasks of kept
    plans); the page and the API read the kept plans' per-operator and per-site
    counts, never their tasks, and are rendered again only after something changed.
    Plans expire: beyond ``keep_plans`` (else ``tra-dask.dashboard.keep-plans``, 50)
    the oldest go; a plan none of whose tasks moved for
    ``tra-dask.dashboard.keep-seconds`` (default 1h; 0 or None: never) goes.  Tasks of
    no kept plan: the workers that computed the newest ``limit`` are kept."""

    name = "tra-dask"
    idempotent = True

    def __init__(self, limit: int = 100_000, keep_plans: int | None = None):
        self.limit, self.keep_plans = limit, keep_plans
        self.ran = _Ran(self, limit)              # task key -> worker that computed it
        self.plans: OrderedDict = OrderedDict()  # token -> _LivePlan, oldest first
        self.prefixes: dict = {}                 # task key prefix -> (_LivePlan, operator index)
        self.loose: dict = {}                    # other task key of a kept plan -> (_LivePlan, slot)
        self.version = 0                         # bumped by every change the page shows
        self._cache: dict = {}                   # (route, argument) -> (version, body)
        self.scheduler = None
        self.prefix = ""                         # the dashboard's URL prefix ("" or "/something")

    # -- scheduler hooks ---------------------------------------------------
    async def start(self, scheduler):
        self.scheduler = scheduler
        callbacks = getattr(scheduler, "periodic_callbacks", None)
        if callbacks is not None:
            from tornado.ioloop import PeriodicCallback

            old = callbacks.get("tra-dask-expire")
            if old is not None:
                old.stop()
            callbacks["tra-dask-expire"] = pc = PeriodicCallback(self.expire, EXPIRE_EVERY * 1000)
            pc.start()
        app = getattr(scheduler, "http_application", None)
        if app is None:
            return
        from tornado import web

        self.prefix = _dashboard_prefix(app)
        plugin = self

        class Page(web.RequestHandler):
            def get(self):
                self.set_header("Content-Type", "text/html; charset=utf-8")
                self.write(plugin.render_page(self.get_argument("plan", None)))

        class Api(web.RequestHandler):
            def get(self):
                self.set_header("Content-Type", "application/json")
                self.write(plugin.render_json(self.get_argument("plan", None)))

        app.add_handlers(r".*", [(self.prefix + PAGE + "/?", Page), (self.prefix + API, Api)])
        _add_to_dask_navigation(scheduler, app)

    async def close(self):
        callbacks = getattr(self.scheduler, "periodic_callbacks", None) or {}
        pc = callbacks.get("tra-dask-expire")
        if pc is not None and pc.callback == self.expire:
            pc.stop()

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        """Record who computed each task; follow the tasks of kept plans."""
        worker = kwargs.get("worker")
        hit = self._find(key)
        if hit is None:
            if start == "processing" and finish == "memory" and worker:
                self.ran.note(key, worker)
            return
        plan, node, slot = hit
        ts = self.scheduler.tasks.get(key) if finish == "processing" else None
        plan.task(key, node, slot, ts, start, finish, worker)
        self.version += 1

    def _find(self, key):
        """``(plan, operator, slot)`` of a task of a kept plan, or None."""
        if type(key) is tuple and len(key) == 2:
            entry = self.prefixes.get(key[0])
            if entry is not None:
                plan, node = entry
                slot = plan.slot(node, key[1])
                if slot >= 0:
                    return plan, node, slot
        if self.loose:
            entry = self.loose.get(key)
            if entry is not None:
                plan, slot = entry
                return plan, len(plan.nodes), slot
        return None

    # -- plans -------------------------------------------------------------
    def add_plan(self, record: dict) -> None:
        """Keep a plan (see ``runtime.submit._publish`` for the record's fields) and
        index its tasks, so each transition finds its plan, operator and slot at once.
        The record's key lists are not kept: a few bytes per task are."""
        keys = record["keys"]
        key_workers = record["key_workers"]
        outputs = [{"label": o["label"], "node": o["node"]} for o in record.get("outputs") or []]
        record = {k: v for k, v in record.items() if k not in ("keys", "key_workers", "outputs")}
        record.update(submitted=time.time(), measured_bytes=None, outputs=outputs)
        plan = _LivePlan(record, keys, key_workers)
        old = self.plans.pop(plan.token, None)
        if old is not None:
            self._forget(old)
        self.plans[plan.token] = plan
        for node in plan.nodes:
            self.prefixes[node["prefix"]] = (plan, node["index"])
        for key, slot in plan.loose.items():
            self.loose[key] = (plan, slot)
        self.version += 1
        self.expire()

    def _forget(self, plan: _LivePlan) -> None:
        for node in plan.nodes:
            if self.prefixes.get(node["prefix"], (None,))[0] is plan:
                del self.prefixes[node["prefix"]]
        for key in plan.loose:
            if self.loose.get(key, (None,))[0] is plan:
                del self.loose[key]

    def expire(self, now: float | None = None) -> list:
        """Drop the plans past ``keep_plans`` (oldest first) and those idle for longer
        than keep-seconds; the tokens dropped."""
        keep = self.keep_plans if self.keep_plans is not None else int(_config(KEEP_PLANS))
        age = _config(KEEP_SECONDS)
        age = parse_timedelta(age, default="s") if age not in (None, 0, "0") else None
        now = time.time() if now is None else now
        gone = [t for t, p in self.plans.items() if age and now - p.active > age]
        for token in gone:
            self._forget(self.plans.pop(token))
        while len(self.plans) > max(0, keep):
            token, plan = self.plans.popitem(last=False)
            self._forget(plan)
            gone.append(token)
        if gone:
            self.version += 1
        return gone

    def set_measured(self, token: str, nbytes: int) -> None:
        """What ``RelationFutures.transfers()`` measured from the workers' logs."""
        if token in self.plans:
            self.plans[token].record["measured_bytes"] = int(nbytes)
            self.version += 1

    def snapshot(self, token: str | None = None) -> list:
        """Every plan kept (or the one of ``token``), newest first, as the JSON API serves it."""
        self.expire()
        plans = reversed(self.plans.values()) if token is None else [self.plans[token]] if token in self.plans else []
        return [plan.snapshot() for plan in plans]

    def _cached(self, route: str, arg, make) -> str:
        """The body of ``route`` made again only when something changed since."""
        self.expire()
        hit = self._cache.get((route, arg))
        if hit is not None and hit[0] == self.version:
            return hit[1]
        if len(self._cache) > 64:
            self._cache.clear()
        body = make()
        self._cache[(route, arg)] = (self.version, body)
        return body

    def render_json(self, token: str | None = None) -> str:
        return self._cached(API, token, lambda: json.dumps(self.snapshot(token)))

    def render_page(self, token: str | None = None) -> str:
        """The page: the newest ``tra-dask.dashboard.page-plans`` plans (or the one of
        ``token``) drawn in full, the other kept plans one row each."""
        n = max(0, int(_config(PAGE_PLANS)))

        def make():
            if token is not None:
                shown = [self.plans[token]] if token in self.plans else []
                rest: list = []
            else:
                newest = list(reversed(self.plans.values()))
                shown, rest = newest[:n], newest[n:]
            return render_page([p.snapshot() for p in shown], self.prefix,
                               rest=[p.summary() for p in rest], kept=len(self.plans), token=token)

        return self._cached(PAGE, (token, n), make)


def _key(k):
    return tuple(_key(x) for x in k) if isinstance(k, list) else k


def _bokeh_dashboard(app):
    """The Bokeh application (Dask's dashboard) on the scheduler's HTTP application,
    or None (no Bokeh: Dask then serves a "needs bokeh" page at /status)."""
    return next((a for a in getattr(app, "applications", ()) if hasattr(a, "app_paths")), None)


def _dashboard_prefix(app) -> str:
    """The URL prefix of Dask's dashboard ("" or "/something")."""
    bokeh = _bokeh_dashboard(app)
    prefix = getattr(bokeh, "prefix", "") if bokeh is not None else ""
    return prefix.rstrip("/") if isinstance(prefix, str) else ""


def _add_to_dask_navigation(scheduler, app) -> None:
    """Put ``tra-dask`` in the top bar of Dask's Bokeh pages (/status, /workers, ...).

    distributed builds that bar from the ``pages`` list of its memoized
    ``template_variables(scheduler)``, which every page's template shares; a page
    opened after this shows the link.  Nothing happens without the Bokeh dashboard."""
    dash = sys.modules.get("distributed.dashboard.scheduler")
    if dash is None or _bokeh_dashboard(app) is None:
        return
    try:
        pages = dash.template_variables(scheduler)["pages"]
    except Exception:  # another distributed version: the page is still there, unlinked
        return
    if NAV not in pages:
        pages.append(NAV)


# -- the page ---------------------------------------------------------------------

_STYLE = (
    "body{font-family:sans-serif;margin:1.5em}pre{background:#f6f8fa;padding:.8em;overflow:auto}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
    "td.l,th.l{text-align:left}.bar{background:#ddd;width:300px;height:12px}.fill{background:#3a7;height:12px}"
    "nav a{margin-right:1em}.plan{border-top:2px solid #456;margin-top:1.5em}"
    + "".join(f".st-{s.replace(' ', '-')}{{background:{c}}}" for s, c in _COLOURS.items())
)


_LEGEND = ("<p>" + " ".join(f"<span class='st-{s.replace(' ', '-')}'>&nbsp;{s}&nbsp;</span>" for s in _COLOURS)
           + " &mdash; running: sent to its worker (Dask's <i>processing</i>); a red arrow: bytes fetched</p>")


def render_page(plans: list, prefix: str = "", rest: list = (), kept: int | None = None,
                token: str | None = None) -> str:
    """The /tra-dask page: ``plans`` (:meth:`_LivePlan.snapshot`) drawn in full,
    ``rest`` (:meth:`_LivePlan.summary`) one row each."""
    esc = html.escape
    kept = len(plans) + len(rest) if kept is None else kept
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>",
        f"<title>tra_dask plans</title><style>{_STYLE}</style></head><body>",
        f"<nav><a href='{esc(prefix)}/status'>&larr; Dask dashboard (status)</a>"
        f"<a href='{esc(prefix)}/workers'>workers</a><a href='{esc(prefix)}/graph'>task graph</a>"
        f"<a href='{esc(prefix + API)}'>JSON</a>"
        + (f"<a href='{esc(prefix + PAGE)}'>all plans</a>" if token is not None else "") + "</nav>",
        f"<h1>tra_dask: {kept} plan(s) on this scheduler</h1>",
    ]
    if token is not None and not plans:
        parts.append(f"<p>Plan {esc(token)} is not kept on this scheduler (any more).</p>")
    elif not plans:
        parts.append("<p>No TRA plan has been submitted to this scheduler yet.</p>")
    for p in plans:
        parts.append(_plan_html(p))
    if rest:
        parts.append(_older_table(rest, prefix, len(plans)))
    parts.append("</body></html>")
    return "".join(parts)


def _older_table(rest: list, prefix: str, shown: int) -> str:
    """One row per plan not drawn (each row is its ``#token`` anchor and links to its own page)."""
    esc = html.escape
    rows = "".join(
        f"<tr id='{esc(p['token'])}'><td class='l'><a href='{esc(prefix + PAGE)}?plan={esc(quote(p['token']))}'>"
        f"{esc(p['title'])}</a></td><td class='l'>{esc(p['token'])}</td>"
        f"<td class='l'>{time.strftime('%H:%M:%S', time.localtime(p['submitted']))}</td>"
        f"<td>{p['done']} / {p['total']}</td><td>{p['running']}</td><td>{p['erred']}</td>"
        f"<td>{p['predicted_bytes']:,}</td><td>{p['live_bytes']:,}</td></tr>"
        for p in rest)
    return (f"<h3>older plans ({len(rest)}; the newest {shown} are drawn above)</h3><table class='older'>"
            "<tr><th class='l'>plan</th><th class='l'>token</th><th class='l'>submitted</th><th>tasks done</th>"
            f"<th>running</th><th>erred</th><th>bytes predicted</th><th>bytes counted live</th></tr>{rows}</table>")


def _plan_html(p: dict) -> str:
    esc = html.escape
    frac = p["done"] / p["total"] if p["total"] else 1.0
    measured = "not called yet" if p["measured_bytes"] is None else f"{p['measured_bytes']:,} bytes"
    parts = [
        f"<section class='plan'><h2 id='{esc(p['token'])}'>{esc(p['title'])} <small>[{esc(p['token'])}]</small></h2>",
        f"<p>computes <b>{esc(p['label'])}</b></p>" if p.get("name") else "",
        f"<p>strategy: {esc('; '.join(p['strategies']) or 'compiled plan')}</p>",
        f"<p>bytes moved between workers: predicted <b class='predicted'>{p['predicted_bytes']:,}</b> bytes, "
        f"counted live <b class='measured' id='live-{esc(p['token'])}'>{p['live_bytes']:,} bytes</b>; "
        f"measured by transfers(): <b class='transfers'>{measured}</b></p>",
        f"<p>progress: {p['done']} / {p['total']} tasks done, {p['running']} running, "
        f"{p['waiting']} waiting, {p['erred']} erred</p>",
        f"<div class='bar'><div class='fill' style='width:{300 * frac:.0f}px'></div></div>",
    ]
    if p["outputs"]:
        rows = "".join(f"<tr><td class='l'>{esc(o['label'])}</td><td>{o['node']}</td><td>{o['live_bytes']:,}</td></tr>"
                       for o in p["outputs"])
        parts.append("<h3>outputs</h3><table><tr><th class='l'>output</th><th>operator</th>"
                     f"<th>bytes moved by the operators it reads</th></tr>{rows}</table>")
    if p["nodes"]:
        parts += ["<h3>plan</h3>", _LEGEND, plan_svg(p["nodes"], p["token"]), _nodes_table(p["nodes"])]
    parts.append(_transfers_table(p["transfers"]))
    parts.append("<h3>sites</h3><table><tr><th>site</th><th class='l'>worker</th><th>tasks</th><th>done</th></tr>")
    for i, w in enumerate(p["workers"]):
        st = p["per_site"].get(w, {"tasks": 0, "done": 0})
        parts.append(f"<tr><td>{i}</td><td class='l'>{esc(w)}</td><td>{st['tasks']}</td><td>{st['done']}</td></tr>")
    parts += ["</table>", f"<details><summary>explain</summary><pre>{esc(p['explain'])}</pre></details></section>"]
    return "".join(parts)


def _head(n: dict) -> str:
    return f"Source {n['label']}" if n["op"] == "source" else n["op"]


def _nodes_table(nodes: list) -> str:
    esc = html.escape
    rows = "".join(
        f"<tr><td>{n['index']}</td><td class='l'>{esc(_head(n))}</td><td class='l'>{esc(n['label'])}</td>"
        f"<td class='l'>{esc(n['params'])}</td><td class='l st-{n['state'].replace(' ', '-')}'>{n['state']}</td>"
        f"<td>{n['done']} / {n['total']}</td><td>{n['live_bytes']:,}</td></tr>"
        for n in nodes)
    return ("<table><tr><th>#</th><th class='l'>operator</th><th class='l'>label</th><th class='l'>parameters</th>"
            f"<th class='l'>state</th><th>tasks done</th><th>bytes fetched</th></tr>{rows}</table>")


def _transfers_table(t: dict) -> str:
    """Bytes moved from each source (rows) to each destination (columns)."""
    names = t["workers"]
    if not names:
        return ""
    esc = html.escape
    head = "".join(f"<th title='{esc(w)}'>to {i}</th>" for i, w in enumerate(names))
    rows = "".join(
        f"<tr><th class='l' title='{esc(w)}'>from {i} ({esc(w)})</th>"
        + "".join(f"<td>{b:,}</td>" for b in row) + f"<td>{sum(row):,}</td></tr>"
        for i, (w, row) in enumerate(zip(names, t["bytes"])))
    cols = "".join(f"<td>{sum(col):,}</td>" for col in zip(*t["bytes"]))
    return ("<h3>bytes moved between sites (counted live)</h3><table class='transfers'>"
            f"<tr><th></th>{head}<th>sent</th></tr>{rows}<tr><th class='l'>received</th>{cols}<td></td></tr></table>")


def plan_svg(nodes: list, token: str = "plan") -> str:
    """The plan as an inline SVG: one box per operator (id ``tra-op-<token>-<i>``), in rows by
    depth from the sources, coloured by state, with an arrow from each input (red
    into an operator that fetched bytes).  The full label is the box's tooltip."""
    esc = html.escape
    depth: dict = {}
    for n in nodes:  # the nodes come in lowering (topological) order
        depth[n["index"]] = 1 + max((depth.get(i, 0) for i in n["inputs"]), default=-1)
    lines = {n["index"]: [f"#{n['index']} {_head(n)}", n["params"], f"{n['state']}: {n['done']}/{n['total']} tasks",
                          f"{n['live_bytes']:,} bytes fetched" if n["live_bytes"] else ""] for n in nodes}
    width = {i: max(140, 7 * max(len(s) for s in ls) + 16) for i, ls in lines.items()}
    box_h, gap_x, gap_y, pad = 70, 24, 40, 10
    pos, row_x = {}, {}
    for n in nodes:
        i, d = n["index"], depth[n["index"]]
        x = row_x.get(d, pad)
        pos[i] = (x, pad + d * (box_h + gap_y))
        row_x[d] = x + width[i] + gap_x
    total_w = max(row_x.values(), default=pad) + pad
    total_h = pad + (max(depth.values(), default=0) + 1) * (box_h + gap_y)
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' class='plan-graph' width='{total_w}' height='{total_h}' "
           f"font-family='monospace' font-size='11'><defs><marker id='arrow-{esc(token)}' viewBox='0 0 10 10' refX='9' refY='5' "
           "markerUnits='userSpaceOnUse' markerWidth='9' markerHeight='9' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' fill='#555'/>"
           "</marker></defs>"]
    for n in nodes:
        x1, y1 = pos[n["index"]]
        for j in n["inputs"]:
            if j in pos:
                x0, y0 = pos[j]
                colour, w = ("#c33", 2.5) if n["live_bytes"] else ("#888", 1.2)
                out.append(f"<line x1='{x0 + width[j] / 2:.0f}' y1='{y0 + box_h}' x2='{x1 + width[n['index']] / 2:.0f}' "
                           f"y2='{y1 - 2}' stroke='{colour}' stroke-width='{w}' marker-end='url(#arrow-{esc(token)})'/>")
    for n in nodes:
        i = n["index"]
        x, y = pos[i]
        out.append(f"<g id='tra-op-{esc(token)}-{i}' class='op {esc(n['state'])}'><title>{esc(n['label'])}</title>"
                   f"<rect x='{x}' y='{y}' width='{width[i]}' height='{box_h}' rx='6' "
                   f"fill='{_COLOURS[n['state']]}' stroke='#456'/>")
        for k, text in enumerate(lines[i]):
            if not text:
                continue
            weight = " font-weight='bold'" if k == 0 else ""
            out.append(f"<text x='{x + 8}' y='{y + 16 + 15 * k}'{weight}>{esc(text)}</text>")
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


# -- called on the scheduler by the runtime -----------------------------------------

def _add_plan(dask_scheduler, record):
    dask_scheduler.plugins[TraScheduler.name].add_plan(record)


def _set_measured(dask_scheduler, token, nbytes):
    dask_scheduler.plugins[TraScheduler.name].set_measured(token, nbytes)


def page_link(client) -> str | None:
    """The tra_dask page on ``client``'s scheduler dashboard."""
    link = getattr(client, "dashboard_link", None)
    if not link:
        return None
    base = link.split("/status")[0].rstrip("/")
    return base + PAGE
