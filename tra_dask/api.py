"""The entry points that run on a cluster: ``plan``, ``submit``, ``compute`` for TRA
expressions (relations, plans) and for :class:`td.Array` expressions alike.

This module imports the runtime (and so distributed); ``import tra_dask`` loads it
on first use of ``td.submit`` / ``td.compute``, and a :class:`td.Array` reaches it
through :func:`tra_dask.frontend.run.cluster_api` (``x.compute()``, ``x.plan()``).
"""

from __future__ import annotations

from . import runtime
from .frontend.array import Array
from .logical import check_outputs
from .runtime import arrays
from .runtime.futures import ArrayFutures

__all__ = ["plan", "submit", "compute", "compute_local_or_cluster"]


def _is_arrays(x) -> bool:
    return isinstance(x, Array) or (isinstance(x, (tuple, list)) and bool(x) and
                                    all(isinstance(a, Array) for a in x))


def _arrays(x):
    """``x`` with each submitted array's futures (:class:`~tra_dask.runtime.futures.ArrayFutures`,
    alone or in a tuple of arrays) as the lazy :class:`td.Array` over them that any
    other operand position takes (``rf.array``)."""
    if isinstance(x, ArrayFutures):
        return x.array
    if isinstance(x, (tuple, list)) and x and all(isinstance(a, (Array, ArrayFutures)) for a in x) \
            and any(isinstance(a, ArrayFutures) for a in x):
        return type(x)(a.array if isinstance(a, ArrayFutures) else a for a in x)
    return x


def plan(x, client=None, sites=None, **kw):
    """The plan :func:`submit` would run for ``x`` on ``client``'s workers: for a
    :class:`td.Array` (or a tuple of them) with its chunking chosen with the plan, for
    a TRA expression :func:`tra_dask.plan_for`'s."""
    x = _arrays(x)
    if _is_arrays(x):
        return arrays.plan(x, client, sites, **kw)[0]
    return runtime.plan_for(x, client, sites, **kw)


def submit(x, client=None, sites=None, *, check: bool = True, **kw):
    """Run a TRA expression, a Plan or a :class:`td.Array` on a Dask cluster (see
    :func:`tra_dask.runtime.submit`); futures back.  With ``check`` (the default),
    every output must satisfy the integrity constraints, as for :func:`evaluate`
    (checked on the exact types, before planning)."""
    x = _arrays(x)
    if _is_arrays(x):
        return arrays.submit(x, client, sites, **kw)
    if check:
        check_outputs(x)
    return runtime.submit(x, client, sites, **kw)


def compute(x, client=None, sites=None, *, check: bool = True, **kw):
    """Run and gather: a numpy array for a :class:`td.Array`, ``{key: chunk}`` for a
    relation (see :func:`tra_dask.runtime.compute`); a tuple of arrays runs as one
    plan.  ``check`` as for :func:`submit`; a submitted array's futures
    (``td.submit(x)`` of an array) are an array here too."""
    x = _arrays(x)
    if _is_arrays(x):
        return arrays.compute(x, client, sites, **kw)
    if check:
        check_outputs(x)
    return runtime.compute(x, client, sites, **kw)


compute_local_or_cluster = arrays.compute_local_or_cluster
