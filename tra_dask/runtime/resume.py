"""Resuming a submission after workers were lost: only the unfinished part runs again.

The plan is lowered again (another token) on the workers there are, with each lost
site's tasks handed to a surviving worker; then the graph is cut down to what the
missing results need:

* a result chunk in memory on a surviving worker, or still to be computed there from
  inputs that are not lost, is kept as it is (its future stays);
* a task whose output (under any earlier lowering of this plan) is, or will be, in
  memory on a surviving worker in that sense is not run again: the new graph reads
  that copy (an alias task on that worker; the scheduler is told, in the same
  event-loop step that found it, that this client wants the key, so it cannot be
  released on the way).  One still to run keeps its inputs held too: no task of the
  plan waits for them any more, so the scheduler would free them, and the kept task
  would have to make them again, on the lost worker they are pinned to;
* everything else a missing result needs is run: lost chunks from their lineage
  (loads again, in-process data sent again, the operators above them).

Placement of what runs again: each operator's tasks (and each array's chunks that a
lost site had) are dealt out evenly over the surviving workers (a worker that joined
counts), each to its planned worker while that one has had fewer than its share,
else to the one holding most of its inputs among those that have not: the work
spreads as the plan spread it, and chains stay together where that costs no balance.  Results are the same as the plan's:
where a task runs never changes what it computes (Dask moves its inputs), only the
bytes that move; :meth:`RelationFutures.transfers` measures them.

What cannot be resumed this way — an input that is an earlier result which was
itself planned again (its chunks have other keys now) — is planned again whole by
:meth:`Submission.recover`.
"""

from __future__ import annotations

import time
import uuid

from dask.task_spec import Task, TaskRef
from distributed import Future

from ..logical import ClusterSource
from ..lowering import Lowered, lower, tasks
from ..lowering.keys import stem, with_token
from ..physical import PSource
from .cluster import workers_info
from .resident import _check_cluster_source, scatter_once
from .futures import RelationFutures
from .keeper import take

_LOST = "tra-dask-lost-site-"


def resume(sub, error) -> bool:
    """Run the unfinished part of submission ``sub`` on the workers there are (see the
    module docstring) and give its result objects the new futures.  False when it
    cannot be resumed (the caller plans it again whole)."""
    client, plan, outputs = sub.client, sub.plan, sub.outputs
    gens = sub.generations
    alive = set(workers_info(client)) - set(error.gone)
    survivors = sorted(alive)
    if not survivors:
        raise RuntimeError(f"{error}; no workers are left to run it on") from error
    for node in plan.nodes:
        src = getattr(node, "source", None) if isinstance(node, PSource) else None
        if isinstance(src, ClusterSource):
            if not _source_keys_current(src):  # an earlier result: recovered first, if it lost workers too
                return False
            _check_cluster_source(src, client)  # gone for good: a clear error
    original = gens[0].workers
    names = [w if w in alive else f"{_LOST}{s}" for s, w in enumerate(original)]
    new = lower(plan, names, uuid.uuid4().hex[:10])
    task_of = {k: t for layer in new.layers.values() for k, t in layer.items()}
    scattered = {k: w for w, d in new.scatter.items() for k in d}

    def earlier(key) -> list:  # the same task under every earlier lowering, newest first
        return [(with_token(key[0], g.token), key[1]) for g in reversed(gens)]

    current = [dict(rf._futures) for rf in outputs]
    candidates = {old for k in task_of for old in earlier(k)} | {f.key for fs in current for f in fs.values()}
    # futures first, so that the scheduler's reports on them (sent when it records the want) are not dropped
    ours = {k: Future(k, client) for k in candidates}
    # {key in memory on, or still to run on, a survivor: there}; {a held key still to run: the held keys it reads}
    held, reads = _usable(client, candidates, alive)
    keep = {k: ours[k] for k in held}  # wanted by this client while we need them
    del ours  # the rest: released

    def reused(key):
        return next((old for old in earlier(key) if old in held), None) if key in task_of else None

    # what the missing results need
    roots, kept = [], [{} for _ in outputs]
    for o, (keys, futs) in enumerate(zip(new.outputs, current)):
        for tra_key, nk in keys.items():
            f = futs.get(tra_key)
            if f is not None and f.key in held:
                kept[o][tra_key] = f
            elif reused(nk) is not None:
                kept[o][tra_key] = keep[reused(nk)]
            else:
                roots.append(nk)
    needed: set = set()
    alias: dict = {}  # needed key -> the earlier key it reads
    stack = list(roots)
    while stack:
        k = stack.pop()
        if k in needed or (k not in task_of and k not in scattered):
            continue  # seen, or data resident on the cluster
        needed.add(k)
        old = reused(k)
        if old is not None:
            alias[k] = old
        elif k in task_of:
            stack.extend(task_of[k].dependencies)

    used = set(alias.values()) | {f.key for ks in kept for f in ks.values()}
    # a kept chunk still to run needs its inputs kept too: released, the scheduler would free
    # them (no task of the plan waits for them now), and the kept task would have to make
    # them again, on the lost worker they are pinned to
    stack = [k for k in used if k in reads]
    while stack:
        for d in reads[stack.pop()]:
            if d not in used:
                used.add(d)
                if d in reads:
                    stack.append(d)
    keep = {k: f for k, f in keep.items() if k in used}  # the rest: released when these go

    # where each needed key runs.  Each operator's tasks that run again (and each
    # array's in-process chunks that a lost site had) are dealt out over the
    # survivors evenly — a quota of ceil(n / survivors) each — every task to its
    # planned worker while that one is under quota, else to the worker under quota
    # that holds most of its inputs: the work spreads as the plan spread it, and
    # chains stay together where that costs no balance
    def group(k):  # an operator's tasks; an array's chunks ("tra-data-<array tag>-<content token>")
        return stem(k[0])

    target = {k: held[alias[k]] for k in alias}
    target.update({k: new.planned[k] for k in needed if k in scattered and new.planned[k] in alive})
    todo = [k for k in new.planned if k in needed and k not in target]  # the lowering's order: inputs first
    sizes: dict = {}
    for k in todo:
        sizes[group(k)] = sizes.get(group(k), 0) + 1
    dealt: dict = {}
    for k in todo:
        g = group(k)
        quota = -(-sizes[g] // len(survivors))
        open_ = [a for a in survivors if dealt.get((g, a), 0) < quota]
        if new.planned[k] in open_:
            w = new.planned[k]
        else:
            inputs = [target.get(d) for d in task_of[k].dependencies] if k in task_of else []
            w = min(open_, key=lambda a: (-inputs.count(a), dealt.get((g, a), 0), a))
        dealt[(g, w)] = dealt.get((g, w), 0) + 1
        target[k] = w

    gen = Lowered(new.token, survivors)
    gen.work, gen.node_keys, gen.moves = new.work, new.node_keys, new.moves
    for k in new.planned:  # the lowering's order: a topological one
        if k not in needed:
            continue
        w = target[k]
        gen.planned[k] = w
        if k in alias:
            gen.layers[w][k] = Task(k, tasks.identity, TaskRef(alias[k]))
        elif k in task_of:
            gen.layers[w][k] = task_of[k]
        else:
            gen.scatter[w][k] = new.scatter[scattered[k]][k]
            if k in new.scatter_owner:
                gen.scatter_owner[k] = new.scatter_owner[k]
                gen.scatter_region[k] = new.scatter_region.get(k)
    gen.outputs = [{tk: (kept[o][tk].key if tk in kept[o] else nk) for tk, nk in keys.items()}
                   for o, keys in enumerate(new.outputs)]

    # send: in-process chunks for the lost sites (those still on survivors are not sent
    # again: the scatter cache), then the graph; the results get the new futures
    sent = scatter_once(client, gen)
    gen.scatter = {w: dict.fromkeys(d) for w, d in gen.scatter.items()}
    gen.scatter_owner = {}
    gen.scatter_region = {}
    wanted = sorted({k for k in roots if k in task_of}, key=str)
    futures = dict(zip(wanted, client.get(gen.graph(), wanted, sync=False))) if wanted else {}
    for o, rf in enumerate(outputs):
        futs = {}
        for tk, nk in new.outputs[o].items():
            if tk in kept[o]:
                futs[tk] = kept[o][tk]
            else:
                futs[tk] = futures[nk] if nk in futures else sent[nk] if nk in sent else Future(nk, client)
        rf._futures = dict(sorted(futs.items()))
        rf.lowered, rf.token, rf._finished = gen, gen.token, None
        rf._keepalive.update(sent)
        rf._keepalive.update(keep)
    sub.generations.append(gen)
    ran = gen.ntasks - len(alias)
    sub.history.append((time.time(), f"{error}; resumed on {len(survivors)} worker(s): {ran} of the plan's "
                                     f"{len(task_of)} tasks run again, {len(used)} chunks kept"))
    # the replaced futures are not cancelled (a forced cancel takes their dependents, which
    # may be chunks kept above): dropped here, they are released; tasks pinned to a lost
    # worker fail with WorkerLeft (runtime/keeper.py)
    return True


def _source_keys_current(src: ClusterSource) -> bool:
    """An input that is an earlier result: are its chunks still under the keys the plan
    reads (False once that result was itself planned again)?"""
    keeper = src.keeper
    if not isinstance(keeper, RelationFutures):
        return True
    keeper.wait()  # recovers it first if it lost workers too
    now = {f.key for f in keeper.values()}
    return all(dk in now for _, dk in src.dask_keys)


def _usable(client, keys, alive) -> tuple[dict, dict]:
    """``({key: worker}, {key: inputs})``.  The first: those of ``keys`` that are, or will
    be, in memory on a worker in ``alive``: in memory there (its worker: one holding
    it), or still to run with every input usable and a worker restriction that
    survived (its worker: where it will run).  The second: for each of those still to
    run, its inputs among ``keys`` (each usable too).  In the same step on the
    scheduler this client is recorded as wanting them, so that none is released before
    the graph that reads them arrives; the caller drops its futures of those it does
    not use, and of a still-to-run one it uses it keeps the inputs."""
    keys, alive, who = list(keys), frozenset(alive), client.id

    def grab(dask_scheduler, keys=keys, alive=alive, who=who):
        tasks, memo = dask_scheduler.tasks, {}

        def where(ts):
            if ts.key in memo:
                return memo[ts.key]
            memo[ts.key] = None  # (no cycles in a task graph; this only stops a repeat)
            if ts.state == "memory":
                if any(d.exception_blame is not None or d.state == "erred" for d in ts.dependencies or ()):
                    memo[ts.key] = None  # Dask errs it when a graph that reads it arrives
                    return None
                holders = sorted(ws.address for ws in ts.who_has or () if ws.address in alive)
                w = holders[0] if holders else None
            elif ts.state in ("erred", "forgotten") or ts.run_spec is None:
                w = None
            else:
                allowed = sorted(set(ts.worker_restrictions or ()) & alive)
                w = allowed[0] if allowed and all(where(d) is not None for d in ts.dependencies or ()) else None
            memo[ts.key] = w
            return w

        out, reads, asked = {}, {}, set(keys)
        for k in keys:
            ts = tasks.get(k)
            w = where(ts) if ts is not None else None
            if w is not None:
                out[k] = w
                if ts.state != "memory":
                    reads[k] = [d.key for d in ts.dependencies or () if d.key in asked]
        if out:
            dask_scheduler.client_desires_keys(keys=list(out), client=who)

        take(dask_scheduler, keys)  # held for us since the worker left: ours now (or let go)
        return out, reads

    return client.run_on_scheduler(grab)
