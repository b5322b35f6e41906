"""The tra_dask page in the Dask dashboard.

A scheduler plugin (registered by the runtime at each submission; idempotent) that

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
dashboard is (the embedded cluster binds 127.0.0.1 only); rendering it walks the
plans' operators and sites, never their tasks.
"""

from __future__ import annotations

import html
import json
import sys
import time
from collections import OrderedDict

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["TraScheduler", "PAGE", "API"]

PAGE = "/tra-dask"
API = "/tra-dask/api/plans"
NAV = PAGE.strip("/")  # the entry in Dask's navigation bar (a link relative to its pages)

_COLOURS = {"waiting": "#e8e8e8", "running": "#f5c542", "done": "#6fbf73", "erred": "#e05a4f", "no tasks": "#f4f4f4"}


def _category(old: str, finish: str) -> str:
    """A task's state on the page after a scheduler transition to ``finish``: a task
    that was done stays done when the scheduler later releases or forgets it."""
    if finish in ("processing", "memory", "erred"):
        return {"processing": "running", "memory": "done", "erred": "erred"}[finish]
    return "done" if old == "done" else "waiting"


class _LivePlan:
    """One plan's record and what the scheduler has seen of it so far.

    ``state`` holds each task's category when not ``waiting``; ``counts[i]`` the
    categories' counts for operator ``i``; ``pending`` the dependencies each running
    task has to fetch ``((dep, W), nbytes, home)``; ``fetches`` the open fetches
    ``(dep, W) -> [tasks waiting on it, counted?]``."""

    def __init__(self, record: dict):
        self.record = record
        self.token = record["token"]
        self.nodes = record.get("nodes") or []
        n = len(self.nodes)
        self.counts = [{"total": 0, "running": 0, "done": 0, "erred": 0} for _ in range(n + 1)]  # [n]: no operator
        self.sites = {w: {"tasks": 0, "done": 0} for w in record["workers"]}
        self.state: dict = {}
        self.pending: dict = {}
        self.fetches: dict = {}
        self.home: dict = {}
        self.moved = 0
        self.node_moved = [0] * (n + 1)
        self.matrix: dict = {}  # (source worker, destination worker) -> bytes

    def task(self, key, node: int, worker: str, ts, start: str, finish: str, ran_on: str | None) -> None:
        """Follow one transition of one of this plan's tasks."""
        old = self.state.get(key, "waiting")
        new = _category(old, finish)
        if new != old:
            counts = self.counts[node]
            if old != "waiting":
                counts[old] -= 1
            if new != "waiting":
                counts[new] += 1
                self.state[key] = new
            else:
                self.state.pop(key, None)
            site = self.sites.get(worker)
            if site is not None and (old == "done") != (new == "done"):
                site["done"] += 1 if new == "done" else -1
        if start == "processing":
            self._left_processing(key, node, ran_on if finish in ("memory", "erred") else None)
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

    def snapshot(self) -> dict:
        """The plan as the JSON API serves it (and the page draws it)."""
        rec = self.record
        item = {k: v for k, v in rec.items() if k not in ("keys", "key_workers", "nodes", "outputs")}
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


class TraScheduler(SchedulerPlugin):
    """The scheduler side of tra_dask: task records, live plans, the page and its API.

    Everything here runs on the scheduler's event loop: the transition hook does a
    dictionary lookup per transition (and a little more for tasks of kept plans);
    the page and the API walk the kept plans' operators and sites, not their tasks."""

    name = "tra-dask"
    idempotent = True

    def __init__(self, limit: int = 1_000_000, keep_plans: int = 50):
        self.limit, self.keep_plans = limit, keep_plans
        self.ran: OrderedDict = OrderedDict()    # task key -> worker that computed it
        self.plans: OrderedDict = OrderedDict()  # token -> _LivePlan
        self.tasks: dict = {}                    # task key -> (_LivePlan, operator index, pinned worker)
        self.scheduler = None
        self.prefix = ""                         # the dashboard's URL prefix ("" or "/something")

    # -- scheduler hooks ---------------------------------------------------
    async def start(self, scheduler):
        self.scheduler = scheduler
        app = getattr(scheduler, "http_application", None)
        if app is None:
            return
        from tornado import web

        self.prefix = _dashboard_prefix(app)
        plugin = self

        class Page(web.RequestHandler):
            def get(self):
                self.set_header("Content-Type", "text/html; charset=utf-8")
                self.write(plugin.render_page())

        class Api(web.RequestHandler):
            def get(self):
                self.set_header("Content-Type", "application/json")
                self.write(json.dumps(plugin.snapshot()))

        app.add_handlers(r".*", [(self.prefix + PAGE + "/?", Page), (self.prefix + API, Api)])
        _add_to_dask_navigation(scheduler, app)

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        """Record who computed each task; follow the tasks of kept plans."""
        worker = kwargs.get("worker")
        if start == "processing" and finish == "memory" and worker:
            self.ran[key] = worker
            if len(self.ran) > self.limit:
                self.ran.popitem(last=False)
        entry = self.tasks.get(key)
        if entry is not None:
            plan, node, pinned = entry
            ts = self.scheduler.tasks.get(key) if finish == "processing" else None
            plan.task(key, node, pinned, ts, start, finish, worker or pinned)

    # -- plans -------------------------------------------------------------
    def add_plan(self, record: dict) -> None:
        """Keep a plan (see ``runtime.submit._publish`` for the record's fields) and
        index its tasks, so each transition finds its plan and operator at once."""
        record = dict(record, submitted=time.time(), measured_bytes=None)
        record["keys"] = [_key(k) for k in record["keys"]]
        for o in record.get("outputs") or []:
            o["keys"] = [_key(k) for k in o.get("keys", ())]
        plan = _LivePlan(record)
        by_prefix = {n["prefix"]: n["index"] for n in plan.nodes}
        for key, worker in zip(record["keys"], record["key_workers"]):
            node = by_prefix.get(key[0], -1) if isinstance(key, tuple) and key else -1
            self.tasks[key] = (plan, node, worker)
            plan.counts[node]["total"] += 1
            plan.sites.setdefault(worker, {"tasks": 0, "done": 0})["tasks"] += 1
        self.plans[plan.token] = plan
        while len(self.plans) > self.keep_plans:
            _, old = self.plans.popitem(last=False)
            for key in old.record["keys"]:
                if self.tasks.get(key, (None,))[0] is old:
                    del self.tasks[key]

    def set_measured(self, token: str, nbytes: int) -> None:
        """What ``RelationFutures.transfers()`` measured from the workers' logs."""
        if token in self.plans:
            self.plans[token].record["measured_bytes"] = int(nbytes)

    def snapshot(self) -> list:
        """Every plan kept, newest first, as the JSON API serves it."""
        return [plan.snapshot() for plan in reversed(self.plans.values())]

    def render_page(self) -> str:
        return render_page(self.snapshot(), self.prefix)


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


def render_page(plans: list, prefix: str = "") -> str:
    """The /tra-dask page for :meth:`TraScheduler.snapshot`'s plans."""
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>",
        f"<title>tra_dask plans</title><style>{_STYLE}</style></head><body>",
        f"<nav><a href='{esc(prefix)}/status'>&larr; Dask dashboard (status)</a>"
        f"<a href='{esc(prefix)}/workers'>workers</a><a href='{esc(prefix)}/graph'>task graph</a>"
        f"<a href='{esc(prefix + API)}'>JSON</a></nav>",
        f"<h1>tra_dask: {len(plans)} plan(s) on this scheduler</h1>",
    ]
    if not plans:
        parts.append("<p>No TRA plan has been submitted to this scheduler yet.</p>")
    for p in plans:
        parts.append(_plan_html(p))
    parts.append("</body></html>")
    return "".join(parts)


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
