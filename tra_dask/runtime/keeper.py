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

It puts cluster data back where it was: a copy of a chunk that stays on the cluster
(a dask array's block a plan reads where it lives, or a chunk a client sent, which
the next submission of the plan finds on the worker it was sent to) that a tra_dask
task made its worker fetch is dropped once no task of that worker still waits for it,
the chunk's other copies kept (:meth:`TraKeeper.transition`).  Left alone, Dask's Active Memory Manager
drops one copy of the two at random every 2 s, the original as often as not: a loop
over persisted dask arrays then found some of its chunks on other workers at every
submission, and planned each step again (4 workers, Dask's defaults: 1-11 of 128
chunks moved per step, 0.15-0.27 s of planning a step for a 0.04 s run).  And while a
task reads such a copy, the manager (which keeps the copy in use) would drop the
original whenever its cycle fell during the read, so the keeper swaps its
``ReduceReplicas`` for one that leaves those blocks alone until they are read
(:class:`SparingReduceReplicas`).  A plan's moves are then also the moves it measures
on its next submission.

It also fails each tra_dask task pinned to the lost worker with :class:`WorkerLeft`
once Dask has it waiting for a worker that will never come, so that Dask's own calls
on a result (``dask.compute(rf)``, ``distributed.wait``, ``rf[k].result()``) raise at
once rather than wait forever; tra_dask's own waits read that error as the signal to
resume.
"""

from __future__ import annotations

import time

import dask
from distributed.active_memory_manager import ReduceReplicas
from distributed.diagnostics.plugin import SchedulerPlugin

from ..lowering.keys import is_data_key, is_tra_key

KEEPER = "tra-dask-keeper"


def hold_seconds() -> float:
    from dask.utils import parse_timedelta

    return float(parse_timedelta(dask.config.get("tra-dask.recovery-hold", "60s")))


class WorkerLeft(RuntimeError):
    """The error of a tra_dask task pinned to a worker that left the cluster (it could
    never run): what Dask's own calls (``dask.compute(rf)``, ``distributed.wait``,
    ``future.result()``) raise, at once, instead of waiting forever.  tra_dask's own
    waits resume the plan instead."""

    def __init__(self, worker: str):
        super().__init__(f"tra_dask: this task was pinned to worker {worker}, which left the cluster; rf.wait(), "
                         f"rf.gather(), rf.to_numpy() and td.compute resume the plan on the workers there are")
        self.worker = worker

    def __reduce__(self):
        return WorkerLeft, (self.worker,)


class TraKeeper(SchedulerPlugin):
    name = "tra-dask-keeper"
    idempotent = True

    def __init__(self):
        self.held: dict = {}  # key -> when the hold was made
        self.scheduler = None
        self.seconds = hold_seconds()
        self.pending: set = set()  # keys with a _fail_if_stranded call queued
        self.failed: dict = {}     # key -> the lost worker it was failed for (until forgotten)
        self.running: dict = {}    # tra_dask task -> the worker it runs on
        self.fetched: dict = {}    # cluster data key -> workers a tra_dask task made fetch a copy

    # -- tasks pinned to a worker that left: an error, not a wait without end ------
    def remove_worker(self, scheduler, worker, *, stimulus_id=None, **kwargs) -> None:
        """After Dask moved the lost worker's tasks back: each tra_dask task pinned there
        that now waits for a worker (``no-worker``) fails with :class:`WorkerLeft`; one
        still waiting for its inputs fails when it gets that far (:meth:`transition`).
        The copies it had fetched are gone with it."""
        for ts in list(getattr(scheduler, "unrunnable", ())):
            self._fail_if_stranded(ts.key)
        for k, where in list(self.fetched.items()):
            where.discard(worker)
            if not where:
                del self.fetched[k]

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        if finish == "processing" and is_tra_key(key):
            self._note_fetches(key)
        elif start == "processing" and key in self.running:
            self._drop_fetched(key, self.running.pop(key))  # (done, failed or released: read or not needed)
        if start == "memory":  # a block released or forgotten: nothing fetched of it is left to drop
            self.fetched.pop(key, None)
        if finish == "forgotten":
            self.failed.pop(key, None)
        elif finish == "no-worker" and is_tra_key(key) and key not in self.pending:
            import asyncio

            self.pending.add(key)  # one queued call per key, however often it comes back
            asyncio.get_running_loop().call_soon(self._fail_if_stranded, key)  # not inside a transition

    # -- cluster data read where it lives: the copies tra_dask's tasks fetched, dropped --
    def _note_fetches(self, key) -> None:
        """``key`` (a tra_dask task) starts on a worker: which of its inputs that stay on
        the cluster (not a tra_dask task's result: a dask array's block, or a chunk a
        client sent) that worker does not hold (it fetches a copy)."""
        s = self.scheduler
        ts = s.tasks.get(key) if s is not None else None
        ws = ts.processing_on if ts is not None else None
        if ws is None:
            return
        self.running[key] = ws.address
        for d in ts.dependencies:
            if (is_data_key(d.key) or not is_tra_key(d.key)) and ws not in (d.who_has or ()):
                self.fetched.setdefault(d.key, set()).add(ws.address)

    def _drop_fetched(self, key, addr: str) -> None:
        """``key`` left ``addr`` (finished, failed or released): the copies it made
        ``addr`` fetch go, where no other task that has not finished may read them
        there, and a running worker other than ``addr`` holds the block (not one being
        retired: its copy may be on its way out).  The scheduler forgets the copy now and
        the worker releases it; a worker asked to release a block that a task of its
        own is executing on raises and closes, which the check of the block's readers
        is there to rule out (the memory manager checks the same)."""
        s = self.scheduler
        ts = s.tasks.get(key)
        if ts is None:
            return
        drop = []
        for d in ts.dependencies:
            where = self.fetched.get(d.key)
            if not where or addr not in where:
                continue
            if any(dd.state not in ("memory", "released", "forgotten", "erred") and _may_run_on(dd, addr)
                   for dd in d.dependents or ()):
                continue  # another task there still reads it: the last one drops it
            where.discard(addr)
            if not where:
                del self.fetched[d.key]
            holders = d.who_has or ()
            if any(w.address == addr for w in holders) and any(
                    w.address != addr and w in s.running for w in holders):
                drop.append(d.key)
        if drop:
            s.request_remove_replicas(addr, drop, stimulus_id=f"tra-dask-drop-fetched-{time.time()}")

    def _fail_if_stranded(self, key) -> None:
        """Fail ``key`` with :class:`WorkerLeft` if it waits for a worker that left —
        once per key and lost worker: failing a task releases its inputs, and Dask
        sends an erred task's erred dependents back to waiting when an input is
        released, so a task failed again each time it came back to ``no-worker``
        would cycle (on a scheduler that closes, every task is stranded at once: that
        cycle filled the event loop with callbacks and the scheduler never exited).
        Its clients were told of the error the first time.  Nothing is done while
        the scheduler closes."""
        from distributed.core import Status

        self.pending.discard(key)
        s = self.scheduler
        ts = s.tasks.get(key) if s is not None else None
        if ts is None or ts.state != "no-worker" or not is_tra_key(key) or not ts.worker_restrictions:
            return
        if s.status not in (Status.running, Status.paused):
            return  # closing: every worker leaves; there is nobody left to tell
        if any(w in s.workers for w in ts.worker_restrictions):
            return  # its worker is there (busy or paused): it will run
        from distributed.protocol import pickle

        worker = sorted(ts.worker_restrictions)[0]
        if self.failed.get(key) == worker:
            return
        self.failed[key] = worker
        stimulus = f"tra-dask-worker-left-{time.time()}"
        try:
            recs = s.transition(key, "erred", stimulus_id=stimulus, cause=key,
                                exception=pickle.dumps(WorkerLeft(worker)), exception_text=f"worker {worker} left")
            s.transitions(recs, stimulus_id=stimulus)
        except Exception:  # the task moved on meanwhile: nothing to do
            pass

    async def start(self, scheduler):
        from tornado.ioloop import PeriodicCallback

        self.scheduler = scheduler
        _spare_fetched(scheduler, self)
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
            if (ts.state == "memory" and is_tra_key(key) and any(ws.address != gone for ws in ts.who_has or ())
                    and any(d.state != "memory" for d in ts.dependents or ())):
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


def _spare_fetched(scheduler, keeper: TraKeeper) -> None:
    """Swap the scheduler's memory manager's ``ReduceReplicas`` policies for ones that
    leave alone the blocks tra_dask tasks fetched and have not finished reading
    (``keeper.fetched``: the keeper drops those copies itself when they are read).
    Otherwise the manager, which keeps the copy a running task reads, drops the
    original of such a block whenever its cycle falls during the read — always, for a
    task that reads for longer than the cycle (2 s)."""
    amm = getattr(scheduler, "extensions", {}).get("amm")
    if amm is None:
        return
    for policy in list(amm.policies):
        if type(policy) is ReduceReplicas:
            amm.policies.discard(policy)
            amm.add_policy(SparingReduceReplicas(keeper))


class SparingReduceReplicas(ReduceReplicas):
    """Dask's ``ReduceReplicas``, except for the blocks tra_dask tasks are reading from
    copies they fetched (:func:`_spare_fetched`)."""

    def __init__(self, keeper):
        self.keeper = keeper

    def run(self):
        fetched = self.keeper.fetched
        got = super().run()
        try:
            suggestion = next(got)
            while True:
                if suggestion.ts.key in fetched:
                    suggestion = next(got)
                else:
                    suggestion = got.send((yield suggestion))
        except StopIteration:
            return


def _may_run_on(ts, addr: str) -> bool:
    """Whether task ``ts`` (not run yet) may run on worker ``addr``: it runs there, or
    is pinned there, or goes wherever the scheduler puts it."""
    if ts.processing_on is not None:
        return ts.processing_on.address == addr
    return not ts.worker_restrictions or addr in ts.worker_restrictions


def take(dask_scheduler, keys) -> None:
    """Drop the keeper's holds on ``keys`` (the caller holds what it needs by now)."""
    plugin = dask_scheduler.plugins.get(TraKeeper.name)
    if plugin is not None:
        plugin.release(keys)
