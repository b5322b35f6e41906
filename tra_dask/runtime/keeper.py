"""A scheduler plugin that keeps a lost worker's neighbours' work for the recovery.

When a worker that held the only copy of scattered data (in-process chunks tra_dask
sent) leaves, Dask forgets every task downstream of that data that is not in
memory, and then releases what those tasks were waiting for: chunks finished on the
surviving workers, which the recovery (:mod:`tra_dask.runtime.resume`) would read
instead of computing them again.  The scheduler announces a worker's removal
(event ``remove-worker`` on topic ``all``) before it makes those transitions, so on
that event this plugin records a hold — a want by the pseudo-client
``tra-dask-keeper``, as ``fire_and_forget`` does — on each tra_dask chunk in memory on
a surviving worker that a task not yet run reads.  The recovery takes over the holds
it uses and drops the others (:func:`take`); holds nobody takes are dropped after
``tra-dask.recovery-hold`` (dask config, default 60 s).
"""

from __future__ import annotations

import re
import time

import dask
from distributed.diagnostics.plugin import SchedulerPlugin

KEEPER = "tra-dask-keeper"
_TASK = re.compile(r"^[A-Za-z]+-\d+-[0-9a-f]{10}$")  # the lowering's task keys: (f"{op}-{node}-{token}", i)


def is_tra_key(key) -> bool:
    return (isinstance(key, tuple) and len(key) >= 2 and isinstance(key[0], str)
            and (key[0].startswith("tra-data-") or _TASK.match(key[0]) is not None))


def hold_seconds() -> float:
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("tra-dask.recovery-hold", "60s")))


class TraKeeper(SchedulerPlugin):
    name = "tra-dask-keeper"
    idempotent = True

    def __init__(self):
        self.held: dict = {}  # key -> when the hold was made
        self.scheduler = None
        self.seconds = hold_seconds()

    async def start(self, scheduler):
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        pc = PeriodicCallback(self.expire, 5000)
        scheduler.periodic_callbacks["tra-dask-keeper-expire"] = pc
        pc.start()

    def log_event(self, topic, msg) -> None:
        if topic != "all" or not isinstance(msg, dict) or msg.get("action") != "remove-worker":
            return
        s, gone = self.scheduler, msg.get("worker")
        if s is None:
            return
        keys = []
        for key, ts in s.tasks.items():
            if (ts.state == "memory" and is_tra_key(key) and any(ws.address != gone for ws in ts.who_has)
                    and any(d.state != "memory" for d in ts.dependents)):
                keys.append(key)
        if keys:
            s.client_desires_keys(keys=keys, client=KEEPER)
            now = time.time()
            self.held.update(dict.fromkeys(keys, now))

    def release(self, keys) -> None:
        keys = [k for k in keys if self.held.pop(k, None) is not None]
        if keys and self.scheduler is not None:
            self.scheduler.client_releases_keys(keys=keys, client=KEEPER, stimulus_id=f"tra-dask-keeper-{time.time()}")

    def expire(self) -> None:
        if self.held:
            cut = time.time() - self.seconds
            self.release([k for k, t in self.held.items() if t < cut])


def take(dask_scheduler, keys) -> None:
    """Drop the keeper's holds on ``keys`` (the caller holds what it needs by now)."""
    plugin = dask_scheduler.plugins.get(TraKeeper.name)
    if plugin is not None:
        plugin.release(keys)
