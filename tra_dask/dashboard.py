"""The tra_dask page in the Dask dashboard.

A scheduler plugin (registered by the runtime at each submission; idempotent) that

* records which worker computed each task (so placement can be checked from the
  scheduler's own transitions), and
* keeps the plans submitted to this scheduler and serves them on the scheduler's
  HTTP server: ``/tra-dask`` (a page: explain tree, predicted vs measured bytes moved,
  tasks per site and progress; it refreshes itself) and ``/tra-dask/api/plans``
  (the same as JSON).

The page is served by the scheduler's own HTTP server, so it is bound wherever the
dashboard is (the embedded cluster binds 127.0.0.1 only).
"""

from __future__ import annotations

import html
import json
import time
from collections import OrderedDict

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["TraScheduler", "PAGE", "API"]

PAGE = "/tra-dask"
API = "/tra-dask/api/plans"


class TraScheduler(SchedulerPlugin):
    name = "tra-dask"
    idempotent = True

    def __init__(self, limit: int = 1_000_000, keep_plans: int = 50):
        self.limit, self.keep_plans = limit, keep_plans
        self.ran: OrderedDict = OrderedDict()    # task key -> worker that computed it
        self.plans: OrderedDict = OrderedDict()  # token -> plan record

    # -- scheduler hooks ---------------------------------------------------
    async def start(self, scheduler):
        self.scheduler = scheduler
        app = getattr(scheduler, "http_application", None)
        if app is not None:
            from tornado import web

            plugin = self

            class Page(web.RequestHandler):
                def get(self):
                    self.set_header("Content-Type", "text/html; charset=utf-8")
                    self.write(plugin.render_page())

            class Api(web.RequestHandler):
                def get(self):
                    self.set_header("Content-Type", "application/json")
                    self.write(json.dumps(plugin.snapshot()))

            app.add_handlers(r".*", [(PAGE + "/?", Page), (API, Api)])

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        if start == "processing" and finish == "memory" and kwargs.get("worker"):
            self.ran[key] = kwargs["worker"]
            if len(self.ran) > self.limit:
                self.ran.popitem(last=False)

    # -- plans -------------------------------------------------------------
    def add_plan(self, record: dict) -> None:
        record = dict(record, submitted=time.time(), measured_bytes=None)
        record["keys"] = [tuple(k) if isinstance(k, list) else k for k in record["keys"]]
        self.plans[record["token"]] = record
        while len(self.plans) > self.keep_plans:
            self.plans.popitem(last=False)

    def set_measured(self, token: str, nbytes: int) -> None:
        if token in self.plans:
            self.plans[token]["measured_bytes"] = int(nbytes)

    def _status(self, rec: dict) -> dict:
        tasks = getattr(self.scheduler, "tasks", {})
        done = running = waiting = erred = 0
        per_site = {w: {"tasks": 0, "done": 0} for w in rec["workers"]}
        for key, worker in zip(rec["keys"], rec["key_workers"]):
            per_site.setdefault(worker, {"tasks": 0, "done": 0})["tasks"] += 1
            ts = tasks.get(key)
            state = ts.state if ts is not None else None
            if key in self.ran or state == "memory":
                done += 1
                per_site[worker]["done"] += 1
            elif state == "processing":
                running += 1
            elif state == "erred":
                erred += 1
            else:
                waiting += 1
        return {"done": done, "running": running, "waiting": waiting, "erred": erred,
                "total": len(rec["keys"]), "per_site": per_site}

    def snapshot(self) -> list:
        out = []
        for rec in reversed(self.plans.values()):
            item = {k: v for k, v in rec.items() if k not in ("keys", "key_workers")}
            item.update(self._status(rec))
            out.append(item)
        return out

    def render_page(self) -> str:
        plans = self.snapshot()
        parts = [
            "<!doctype html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='2'>",
            "<title>tra_dask plans</title><style>body{font-family:sans-serif;margin:1.5em}"
            "pre{background:#f6f8fa;padding:.8em;overflow:auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
            ".bar{background:#ddd;width:300px;height:12px}.fill{background:#3a7;height:12px}</style></head><body>",
            f"<h1>tra_dask: {len(plans)} plan(s) on this scheduler</h1>",
        ]
        if not plans:
            parts.append("<p>No TRA plan has been submitted to this scheduler yet.</p>")
        for p in plans:
            frac = p["done"] / p["total"] if p["total"] else 1.0
            measured = "not measured yet" if p["measured_bytes"] is None else f"{p['measured_bytes']:,} bytes"
            parts += [
                f"<h2 id='{html.escape(p['token'])}'>{html.escape(p['label'])} "
                f"<small>[{html.escape(p['token'])}]</small></h2>",
                f"<p>strategy: {html.escape('; '.join(p['strategies']) or 'compiled plan')}</p>",
                f"<p>bytes moved between workers: predicted <b class='predicted'>{p['predicted_bytes']:,}</b> bytes, "
                f"measured <b class='measured'>{measured}</b></p>",
                f"<p>progress: {p['done']} / {p['total']} tasks done, {p['running']} running, "
                f"{p['waiting']} waiting, {p['erred']} erred</p>",
                f"<div class='bar'><div class='fill' style='width:{300 * frac:.0f}px'></div></div>",
                "<table><tr><th>site</th><th>worker</th><th>tasks</th><th>done</th></tr>",
            ]
            for i, w in enumerate(p["workers"]):
                st = p["per_site"].get(w, {"tasks": 0, "done": 0})
                parts.append(f"<tr><td>{i}</td><td>{html.escape(w)}</td><td>{st['tasks']}</td><td>{st['done']}</td></tr>")
            parts += ["</table>", f"<pre>{html.escape(p['explain'])}</pre>"]
        parts.append("</body></html>")
        return "".join(parts)


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
