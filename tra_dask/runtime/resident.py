"""Data already on the cluster: where it lives (fixed placements for the planner),
checks that it is still there, and dask arrays as TRA sources."""

from __future__ import annotations

import time
import weakref

import numpy as np
from distributed import Client

from ..kernels import is_device
from ..logical import ClusterSource, flatten_outputs
from ..logical.nodes import toposort
from ..optimizer import Plan
from ..physical import KeySites, PSource
from ..types import RelationType
from .cluster import _FetchFromCluster, _resolve, _wait_done, _who_has, watched
from ..logical.evaluate import substitute

def _keeper_futures(src: ClusterSource) -> list:
    from .futures import RelationFutures

    keeper = src.keeper
    if isinstance(keeper, RelationFutures):
        return list(keeper.values())
    if isinstance(keeper, tuple):  # from_dask_array: (array, futures)
        return list(keeper[1])
    return []


def refresh_sources(expr, client: Client):
    """``expr`` with every input that is an earlier submission's result waited for
    (which recovers it if one of its workers was lost) and, where it was recovered,
    replaced by the new result (same type, other keys)."""
    from .futures import RelationFutures

    mapping = {}
    for node in toposort(flatten_outputs(expr)[0]):
        keeper = getattr(node, "keeper", None) if isinstance(node, ClusterSource) else None
        if isinstance(keeper, RelationFutures) and keeper.client is client:
            keeper.wait()
            current = {f.key for f in keeper.values()}
            if not all(dk in current for _, dk in node.dask_keys):  # recovered: same chunks, new keys
                mapping[node] = ClusterSource(tuple((k, keeper[k].key) for k, _ in node.dask_keys), node.type,
                                              node.name, node.fetch, keeper=keeper, on_device=node.on_device)
    return substitute(expr, mapping) if mapping else expr


def _raise_users_error(src: ClusterSource, future) -> None:
    """A chunk of a dask input failed to compute: the user's own exception (its type,
    message and remote traceback), with a note of which input and chunk it was."""
    exc = future.exception()
    if isinstance(exc, BaseException):
        note = f"(raised computing {src.name}: block key {future.key!r}, an input of a tra_dask plan)"
        if note not in getattr(exc, "__notes__", ()):  # the client keeps one exception object per key
            try:
                exc.add_note(note)
            except Exception:  # pragma: no cover - an exception that takes no notes
                pass
        raise exc
    raise RuntimeError(f"{src.name}: computing block key {future.key!r} failed: {exc!r}")


def _check_cluster_source(src: ClusterSource, client: Client) -> None:
    """Data of another cluster, or data that is gone, cannot be an input here; a dask
    input whose block raised raises that exception."""
    from .futures import RelationFutures

    for f in _keeper_futures(src):
        if f.client is not client and getattr(f.client, "scheduler", None) is not getattr(client, "scheduler", None):
            raise ValueError(
                f"{src.name} lives on another Dask client/cluster ({f.client}); submit it with that "
                f"client, or gather it and use td.from_numpy"
            )
        if f.status == "error" and not isinstance(src.keeper, RelationFutures):
            _raise_users_error(src, f)
        if f.status in ("cancelled", "lost", "error"):
            raise RuntimeError(
                f"{src.name}: chunk key {f.key!r} is {f.status} (its cluster was restarted or closed?); "
                f"re-submit the expression that made it"
            )


def _where(client: Client, sources: list, wait: bool = False, workers=()) -> dict:
    """``{dask key: [worker, ...]}`` for the chunks of cluster-resident ``sources``
    (each checked usable here first), asked of the scheduler in one round trip; with
    ``wait``, chunks still being computed are waited for (``workers`` watched: one
    that left or froze is :class:`~tra_dask.runtime.cluster.WorkersLeft`), then asked
    again."""
    for src in sources:
        _check_cluster_source(src, client)
    keys = list(dict.fromkeys(k for src in sources for _, k in src.dask_keys))
    who = _who_has(client, keys) if keys else {}
    if wait and len(who) < len(keys):
        _wait_done([f for src in sources for f in _keeper_futures(src) if f.key not in who], client, workers,
                   timeout=300)
        for src in sources:  # a block that raised meanwhile: the user's exception
            _check_cluster_source(src, client)
        who = _who_has(client, keys)
    return who


def _cluster_placements(expr, client: Client, workers: list[str]) -> dict:
    """Fixed placements of cluster-resident sources: where their data is."""
    sources = [n for n in toposort(flatten_outputs(expr)[0]) if isinstance(n, ClusterSource)]
    out = {}
    who = _where(client, sources, wait=True, workers=workers)
    held: dict = {}  # worker -> how many of these chunks it holds
    for ws in who.values():
        for w in ws:
            held[w] = held.get(w, 0) + 1
    for src in sources:
        items = []
        for tra_key, dk in src.dask_keys:
            # a chunk with replicas (a copy an earlier plan fetched, until Dask's memory
            # manager drops it) is placed on the holder that holds the most of the
            # others: where a plan reading them together finds it already
            holders = sorted((w for w in who.get(dk, ()) if w in workers), key=lambda w: -held[w])
            if not holders and not who.get(dk):
                raise RuntimeError(f"{src.name}: the chunk {tra_key} (key {dk!r}) is not on the cluster any more")
            # data on a worker outside the chosen sites is fetched by the site that needs it
            items.append((tra_key, workers.index(holders[0]) if holders else 0))
        out[src] = KeySites(tuple(items), len(workers))
    return out


def _check_plan_sources(plan: Plan, client: Client, workers: list[str]) -> None:
    """A hand-made plan must place cluster-resident data on a worker that holds it."""
    nodes = [n for n in plan.nodes if isinstance(n, PSource) and isinstance(n.source, ClusterSource)]
    who = _where(client, [n.source for n in nodes])
    for node in nodes:
        src = node.source
        holders = {tk: {workers.index(w) for w in who.get(dk, ()) if w in workers} for tk, dk in src.dask_keys}
        for site, keys in enumerate(node.layout.site_keys(node.type)):
            for k in keys:
                if holders[k] and site not in holders[k]:
                    raise ValueError(
                        f"the plan places {src.name} chunk {k} on site {site}, but it lives on site(s) "
                        f"{sorted(holders[k])}; plan it with td.submit(expr) or td.plan_for(expr, client)"
                    )


def from_dask_array(x, name: str | None = None, client: Client | None = None) -> ClusterSource:
    """A tensor relation over a dask array's blocks, where they already are.

    The array is persisted on ``client`` (default: the open default client, else the
    embedded cluster) if it is
    not already; its blocks never pass through this process, and the plan sees
    where each block lives (a fixed placement).
    """
    from distributed import futures_of

    if client is None:  # a client given is used as it is (a submission resolved it already)
        client = _resolve(None, None)[0]
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
                         _FetchFromCluster(client), keeper=(x, list(futs.values())),
                         on_device=is_device(getattr(x, "_meta", None)))


# ---------------------------------------------------------------------------
# chunks scattered from this process, sent once per cluster

_SCATTERED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # client -> {slot: (key, Future)}


def scatter_once(client: Client, lowered) -> dict:
    """Send ``lowered``'s in-process chunks to their workers, except those this process
    already sent to that worker: ``{key: Future}`` for all of them.

    A chunk's key names its content, position and worker (see the lowering); one
    copy per (array, region of it, position, worker) is kept — the latest: changed data has
    another key and is sent again, replacing the old copy — while the array it came
    from lives in this process (or until :func:`drop_scattered`)."""
    cache = _SCATTERED.setdefault(client, {})
    out, kept = {}, {}
    for worker, data in lowered.scatter.items():
        fresh = {}
        for key, chunk in data.items():
            owner = lowered.scatter_owner.get(key)
            hit = cache.get(_slot(lowered, key)) if owner is not None else None
            if hit is not None and hit[0] == key and hit[1].status == "finished":
                out[key] = kept[key] = hit[1]
            else:
                fresh[key] = chunk
        if not fresh:
            continue
        # watched: a worker that left or stopped answering is WorkersLeft (the plan is made
        # again without it), not a scatter that waits for it
        sent = watched(lambda: client.scatter(fresh, workers=[worker]), client, [worker],
                       "this plan's data was being sent to it")
        out.update(sent)
        for key, f in sent.items():
            owner = lowered.scatter_owner.get(key)
            slot = _slot(lowered, key)
            try:  # kept while its array lives here
                weakref.finalize(owner, _forget, weakref.ref(client), slot, key)
            except TypeError:  # not weak-referenceable (or not content-named): not kept
                continue
            cache[slot] = (key, f)
    if kept:
        try:
            client.run_on_scheduler(_drop_replicas, homes={k: k[1] for k in kept})
        except Exception:  # a scheduler that cannot import tra_dask: copies may stay (fewer bytes move)
            pass
    return out


def _slot(lowered, key) -> tuple:
    """Where the scatter cache keeps a sent chunk: its array, its region of it, its
    worker and its place in the relation.  The region is part of it, so that two
    chunkings of one array (a loop that uses it under both) keep both cuts instead of
    evicting each other's."""
    return (id(lowered.scatter_owner.get(key)), lowered.scatter_region.get(key)) + key[1:]


def _drop_replicas(dask_scheduler, homes: dict) -> None:
    """Forget the copies of kept chunks that earlier plans moved to other workers, so
    that this plan's moves happen (and are counted) as planned; the copy on the chunk's
    own worker stays.  The workers hear of it before they hear of this plan's tasks
    (one ordered stream per worker)."""
    by_worker: dict = {}
    idle = ("memory", "released", "forgotten", "erred")
    for key, home in homes.items():
        ts = dask_scheduler.tasks.get(key)
        if ts is None or not any(ws.address == home for ws in ts.who_has or ()):
            continue
        if any(d.state not in idle for d in ts.dependents or ()):
            continue  # a task (another submission's) will read or is reading a copy: a worker
            # asked to drop a replica in use refuses by disconnecting, losing its data
        for ws in ts.who_has:
            if ws.address != home:
                by_worker.setdefault(ws.address, []).append(key)
    for addr, keys in by_worker.items():
        dask_scheduler.request_remove_replicas(addr, keys, stimulus_id=f"tra-dask-drop-replicas-{time.time()}")


def _forget(client_ref, slot, key) -> None:
    client = client_ref()
    cache = _SCATTERED.get(client, {}) if client is not None else {}
    if cache.get(slot, (None,))[0] == key:
        del cache[slot]


def drop_scattered(client: Client | None = None) -> int:
    """Release the chunks this process scattered and kept on ``client``'s cluster
    (all clients when None); returns how many.  The next submission sends them again."""
    clients = [client] if client is not None else list(_SCATTERED)
    n = 0
    for c in clients:
        n += len(_SCATTERED.pop(c, {}))
    return n
