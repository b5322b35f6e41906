"""Planning and running array expressions on a cluster: ``plan``, ``submit``, ``compute``.

The chunking is chosen with the plan by the front-end
(:func:`tra_dask.frontend.run.plan_chunking`), given the planning function of this
cluster: every candidate chunking is planned as :func:`tra_dask.plan_for` plans a
relation (the time objective on the calibrated cluster, data already there — dask
arrays — at its fixed placement).  The client and workers are resolved once per
call, by the caller of :func:`plan_on`.
"""

from __future__ import annotations

from ..frontend.recut import rechunk
from ..frontend.run import as_arrays, evaluate_local, kept_search, plan_chunking, refuse_empty, with_empties
from ..kernels import to_host
from .cluster import _resolve, current_client
from .resident import from_dask_array
from .submit import _Progress, _remember, _submit_planned, planned_on, target_for

__all__ = ["plan", "plan_on", "submit", "compute", "compute_local_or_cluster"]


def plan(x, client=None, sites=None, *, calibrate: bool = True, memory_limit=None, gathers=None):
    """``(plan, client, workers)`` for running ``x`` on a cluster: the plan
    :func:`submit` runs, or with ``gathers="array"`` the one :func:`compute` runs
    (which then plans nothing again: the same structure on the same target)."""
    refuse_empty(x, "td.Array.plan")
    client, workers = _resolve(client or current_client(), sites)
    return (plan_on(x, client, workers, calibrate=calibrate, memory_limit=memory_limit, gathers=gathers), client,
            workers)


def plan_on(x, client, workers, *, calibrate: bool = True, memory_limit=None, gathers=None):
    """The plan for ``x`` on ``workers`` of ``client`` (resolved by the caller),
    chunking chosen with it, for a call that does with the results what ``gathers``
    says (:attr:`~tra_dask.ClusterSpec.gathers`: None for ``td.submit``, ``"array"``
    for ``td.compute``): the chunk choice and the plan are costed on that one spec.  The runtime knows how it was made
    (:func:`tra_dask.runtime.submit._remember`): where Dask moves the data it reads
    before it runs (the Active Memory Manager dropping a replica), it is planned again
    for where the data is, as :func:`tra_dask.plan_for`'s plans are."""
    made: dict = {}

    def dask_source(arr, chunks, name):  # its blocks where they live, re-cut by the plan to ``chunks``
        if arr.name not in made:
            made[arr.name] = from_dask_array(arr, name=name, client=client)
        return rechunk(made[arr.name], arr.chunks, tuple(chunks), name=name)

    def plan_rel(rel, options):
        return planned_on(rel, client, workers, objective="time", calibrate=calibrate, memory_limit=memory_limit,
                          options=options, gathers=gathers)

    target, _ = target_for(client, workers, memory_limit=memory_limit, calibrate=calibrate, objective="time",
                           gathers=gathers)
    _, p, _ = plan_chunking(x, target, plan_rel, dask_source, context=(tuple(workers), memory_limit, calibrate))
    # the plan kept is plan_rel's search with kept_search()'s options, the chunking stage recorded before it
    return _remember(p, p.stages[:1], objective="time", calibrate=calibrate, memory_limit=memory_limit,
                     gathers=gathers, options=kept_search())


def submit(x, client=None, sites=None, **kw):
    """Run ``x``; its :class:`~tra_dask.runtime.ArrayFutures` (a tuple of them for a tuple).

    Planned and sent as a relation is (:func:`tra_dask.runtime.submit`): a worker lost
    while it is planned or sent makes it plan again on the workers there are, and the
    results are the objects a recovery updates.  The results stay on the workers: the
    plan is costed without their way to the client (:func:`compute`'s is)."""
    return _submit(x, client, sites, None, **kw)


def _submit(x, client, sites, gathers, **kw):
    refuse_empty(x, "td.submit")
    name = kw.pop("name", None)
    calibrate, memory_limit = kw.pop("calibrate", True), kw.pop("memory_limit", None)
    if kw:
        raise TypeError(f"submit() of an array got unexpected keyword argument(s) {sorted(kw)}")
    options = dict(optimize=True, memory_limit=memory_limit, cost_model="exact", objective="time",
                   calibrate=calibrate, name=name)  # what a recovery plans the expression with again

    def make(client, workers):
        return plan_on(x, client, workers, calibrate=calibrate, memory_limit=memory_limit, gathers=gathers)

    return _submit_planned(make, client or current_client(), sites, options, array=True)


def compute(x, client=None, sites=None, progress: bool = False, **kw):
    """Run ``x`` on the cluster; the assembled array (a tuple of them for a tuple) in
    its chunks' array module, as dask returns it: numpy, or cupy for cupy chunks.
    ``progress``: draw a progress bar while it runs (as :func:`tra_dask.compute` of a
    relation does by default).  The chunking and plan are chosen counting the results'
    way here (gathered and assembled: :attr:`~tra_dask.ClusterSpec.gathers`)."""
    if not all(a.size for a in as_arrays(x)):
        return with_empties(x, lambda rest: compute(rest, client, sites, progress, **kw))
    out = _submit(x, client, sites, "array", **kw)
    items = list(out) if isinstance(out, tuple) else [out]
    bar = _Progress(items) if progress else None
    try:
        got = [o.assembled() for o in items]
    finally:
        if bar is not None:
            bar.close()
    return tuple(got) if isinstance(out, tuple) else got[0]


def compute_local_or_cluster(x):
    """``numpy.asarray(x)``: on the current Dask client if there is one, else here."""
    if current_client() is not None:
        return to_host(compute(x))
    return evaluate_local(x)
