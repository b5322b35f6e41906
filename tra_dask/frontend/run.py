"""Planning array expressions: the chunking chosen with the plan.

:func:`plan_chunking` compares candidate chunkings by planning each with the planning
function it is given, on a :class:`~tra_dask.ClusterSpec`.  In this process
(``td.to_numpy(x)``, ``x.relation``) that is :func:`tra_dask.optimize` on the default
spec (``sites`` sites: :func:`build_local`); on a cluster (``x.compute()``,
``x.plan(client)``) :mod:`tra_dask.runtime.arrays` hands it the cluster's planning
function (:func:`tra_dask.plan_for`'s, the calibrated spec, data already there at its
fixed placement).  This module imports neither the runtime nor calibration.
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import time
from collections import OrderedDict
from dataclasses import fields

import numpy as np

from .. import logical as L
from ..kernels import is_device, to_host
from ..optimizer import compile as _compile, optimize
from ..optimizer.cache import type_token
from ..optimizer.cluster import ClusterSpec
from ..optimizer.optimize import NoPlanFits, searched_alike
from ..optimizer.plan import Stage
from ..optimizer.target import Target, search_options
from .array import Array
from .build import Builder, computed_here as _computed_here
from .chains import merge_chains
from .chunking import PLANNED_MARGIN, AxisClasses, _topo, choose
from .einsum import contraction_paths
from .estimate import Estimator
from .nodes import Einsum, Leaf

__all__ = ["build_local", "evaluate_local", "plan_chunking", "cluster_api"]


def cluster_api():
    """:mod:`tra_dask.api`, the module that plans and runs arrays on a cluster
    (``x.compute()``, ``x.plan(client)``, ``numpy.asarray(x)``), loaded on first use.

    It sits above the front-end (it imports the runtime, which imports this package
    and distributed), so the front-end names it here, once, instead of importing it:
    the front-end itself imports neither the runtime nor calibration."""
    return importlib.import_module("tra_dask.api")


def namespace():
    """:mod:`tra_dask.array_api`, the Array API namespace (``x.__array_namespace__()``),
    loaded on first use: it re-exports :mod:`.array_api` from above the front-end."""
    return importlib.import_module("tra_dask.array_api")


def _multi_paths(roots):
    """Einsum nodes of more than two operands whose contraction order is ours to choose."""
    return [n for n in _topo(roots) if isinstance(n, Einsum) and len(n.subs) > 2]


def as_arrays(x) -> tuple:
    """One array or several (planned together: shared work is done once)."""
    xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    bad = [type(a).__name__ for a in xs if not isinstance(a, Array)]
    if bad or not xs:
        raise TypeError(f"expected td.Array(s), got {', '.join(bad) or 'nothing'}")
    return xs


def refuse_empty(x, where: str):
    """An array with an axis of extent 0 has numpy's empty result, held in its leaf:
    there is no relation (chunks have extents >= 1) and nothing to plan."""
    for a in as_arrays(x):
        if a.size == 0:
            raise ValueError(f"{where}: the td.Array of shape {a.shape} is empty (an axis of extent 0): there is "
                             f"nothing to plan or run; td.to_numpy(x), x.compute() and numpy.asarray(x) give "
                             f"numpy's empty array")


def with_empties(x, run):
    """``run(x)`` for the arrays of ``x`` that are not empty; the empty ones are
    numpy's empty arrays of their shape and dtype (known without running)."""
    xs = as_arrays(x)
    if all(a.size for a in xs):
        return run(x)
    if not isinstance(x, (tuple, list)):
        return np.empty(x.shape, x.dtype)
    rest = tuple(a for a in xs if a.size)
    got = iter(run(rest) if rest else ())
    return tuple(next(got) if a.size else np.empty(a.shape, a.dtype) for a in xs)


def _fixed_path(node: Einsum):
    if node.optimize == "auto":
        return None
    if isinstance(node.optimize, tuple):
        return node.optimize
    import opt_einsum

    eq = ",".join(node.subs) + "->" + node.out
    sizes = dict(node.sizes)
    shapes = [tuple(sizes[c] for c in s) for s in node.subs]
    try:
        path, _ = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=node.optimize)
    except Exception as e:
        raise ValueError(f"einsum optimize={node.optimize!r}: {e}") from None
    return tuple(tuple(int(i) for i in st) for st in path)


# candidates are compared under the "quick" search options (optimizer.target.SEARCH_OPTIONS:
# two placements per node, fewer rounds where the beam binds; a budget of 300 rewrites as
# well left plans 1.2-2x slower); the plan kept is searched with kept_search()'s options
ORDERS = 2  # contraction orders planned under the chosen chunking (the best by the estimate)
KEPT_SEARCH = "narrow"


def kept_search() -> str:
    """The search options the plan an array expression keeps is made with: the Dask
    config ``tra-dask.array-search`` (default ``"narrow"``: the comparison's beam, with
    the least-traffic candidates the time band's near ties go to; where the comparison's
    beam never bound, its plan is kept as it is; ``"auto"`` searches the winner wider).
    On every row of the chunking benchmarks and on random einsums ``"auto"`` predicted
    the same seconds (benchmarks/README.md, "The plan kept")."""
    import dask

    name = dask.config.get("tra-dask.array-search", KEPT_SEARCH)
    if not isinstance(name, str):
        raise ValueError(f"tra-dask.array-search must name search options, got {name!r}")
    search_options(name)  # (an unknown name: the error lists the valid ones)
    return name


def _rechunk_seconds(arr, sites: int, spec) -> float:
    """What the estimate charges for re-cutting a dask array on ``spec``: its bytes
    cross the network (all but a site's share) and one task per block."""
    return arr.nbytes * (1 - 1 / sites) / spec.bandwidth + arr.npartitions * spec.task_overhead / sites


def _structure(roots, sites: int, spec) -> tuple:
    """What the chunking choice depends on, as a hashable value: every node's class and
    parameters, its inputs (by position), each leaf's kind, shape, dtype and given
    chunks (a dask array's chunks; a relation's type) — not the numbers in the data —
    and the cluster."""
    ids: dict = {}
    parts = []
    leaves: dict = {}
    for n in _topo(roots):
        if isinstance(n, Leaf):
            extra = (n.data.chunks if n.kind == "dask" else type_token(n.data.type) if n.kind == "relation"
                     else None, is_device(getattr(n.data, "_meta", n.data)))  # device data: another choice
            slot = leaves.setdefault(id(n.data), len(leaves))
            parts.append(("leaf", slot, n.kind, n.shape, str(n.dtype), n.chunks, extra))
        else:
            params = tuple((f.name, repr(getattr(n, f.name))) for f in fields(n) if f.name != "inputs")
            parts.append((type(n).__name__, params, tuple(ids[id(i)] for i in n.inputs)))
        ids[id(n)] = len(parts) - 1
    return tuple(parts), tuple(ids[id(r)] for r in roots), sites, repr(spec)


_CHOICES: "OrderedDict" = OrderedDict()  # _structure -> (blocks, contraction paths, why): the last 64 choices
_CHOICES_LOCK = threading.Lock()


def plan_chunking(x, target: Target, plan_rel, dask_source, context=()):
    """Chunking, contraction order and plan for ``x`` (an array, or a tuple of
    arrays planned together) on ``target`` (its sites and cluster spec; a
    :class:`~tra_dask.optimizer.target.Target`): ``plan_rel(rel, options) -> Plan``
    plans a relation with the named search options (``"quick"``, a narrower search,
    for comparing candidates; :func:`kept_search`'s for the plan kept).  A candidate that cuts a dask
    input otherwise re-cuts it inside its plan (``dask_source``), costed there.  Returns ``(relation or
    tuple of relations, plan, choice)`` (choice None when an expression of the same
    structure — :func:`_structure` and ``context`` — was chosen for before: that
    chunking is planned again over this data); the plan carries a ``chunking`` stage saying
    what was chosen and why."""
    several = isinstance(x, (tuple, list))
    sites, spec = target.sites, target.cluster or ClusterSpec(sites=target.sites)
    t0 = time.perf_counter()
    roots = merge_chains([a._node for a in as_arrays(x)])  # a @ b @ c: one einsum, its order ours to choose
    cl = AxisClasses(roots)
    multi = _multi_paths(roots)
    paths = {n: p for n in multi if (p := _fixed_path(n)) is not None}
    # an automatic order's candidates (opt_einsum's, once): it starts as their best (what Builder would take)
    orders = {n: contraction_paths(list(n.subs), n.out, dict(n.sizes)) for n in multi if n not in paths}
    paths.update((n, cands[0]) for n, cands in orders.items())
    built: dict = {}  # (blocks, paths, quick) -> (relation, plan)

    on_device = any(isinstance(n, Leaf) and is_device(getattr(n.data, "_meta", n.data)) for n in cl.nodes)
    if not on_device:  # the GPU terms price device data only (host chunks run on the CPUs)
        spec = spec.on_host()
    kept = kept_search()
    structure = (_structure(roots, sites, spec), context, kept)

    # the first candidate planned is the estimate's best, and most often the one kept: where
    # the kept plan's search is no wider than the comparison's, it is planned so at once
    # (compared as what would be kept; a later winner is searched so again)
    first = search_options(kept).beam <= search_options("quick").beam

    def evaluate(blocks, paths=paths, quick=True):
        nonlocal first
        if quick and first:
            quick = first = False
        options = "quick" if quick else kept
        key = (tuple(blocks), tuple(paths.get(n) for n in multi), options)
        narrow = built.get(key[:2] + ("quick",))
        if not quick and key not in built and narrow is not None and searched_alike(narrow[1], "quick", kept):
            built[key] = narrow  # the quick search's beam never bound: the wider search's space is the same
        if quick and key not in built and key[:2] + (kept,) in built:
            built[key] = built[key[:2] + (kept,)]  # searched wider already: the plan it would come to
        if key not in built:
            def block(node, axis):
                return min(blocks[cl.of[(node, axis)]], max(1, node.shape[axis]))

            build = Builder(block, dask_source, paths)
            rel = tuple(build(r) for r in roots) if several else build(roots[0])
            built[key] = (rel, plan_rel(rel, options))
        p = built[key][1]
        return p, p.cost.seconds or 0.0

    with _CHOICES_LOCK:
        seen = _CHOICES.get(structure)
    if seen is not None:  # the same structure was chosen for before: its chunking, planned over this data
        blocks, order, why = seen
        before = {n: p for n, p in zip(multi, order) if p is not None}
        try:
            evaluate(blocks, before, quick=False)
        except NoPlanFits:  # it does not fit where it did (less memory now): choose again
            pass
        else:
            rel, best = built[(tuple(blocks), tuple(before.get(n) for n in multi), kept)]
            why = f"{why} (the choice made before for an expression of this structure)"
            return rel, best.with_stage(Stage("chunking", None, time.perf_counter() - t0, why)), None
    estimate = Estimator(cl, sites, spec, paths,
                         rechunk=lambda arr, cut: _rechunk_seconds(arr, sites, spec))
    held = estimate.least_held(orders)
    if held is not None and held[0] > estimate.memory * sites:  # no chunking can fit: say so before planning
        raise NoPlanFits(
            f"no chunking fits in memory: {held[1]} holds its operands (and its result, where that is an "
            f"output or another step's operand), {held[0]:,.0f} bytes, "
            f"at least {held[0] / sites:,.0f} bytes per site on {sites} site(s) against the limit of "
            f"{estimate.memory:,.0f} bytes; use more workers or a larger limit")
    settled = all(len(c) < 2 for c in orders.values())
    # (a contraction order still open: the plan kept is made once the order is chosen, below)
    choice = choose(cl, sites, evaluate, final=(lambda blocks: evaluate(blocks, quick=False)) if settled else None,
                    estimate=estimate, settled=settled)
    notes = []
    for node, cands in orders.items():  # the contraction order: opt_einsum's candidates, costed under the chunking
        guesses = []  # each order's analytic estimate: the best ORDERS are planned
        for i, path in enumerate(cands):
            trial = dict(paths)
            trial[node] = path
            guesses.append((Estimator(cl, sites, spec, trial)(choice.blocks), i, path))
        guesses.sort()
        scored = []
        alike: set = set()  # the estimates of the orders planned
        for g, _, path in guesses[:ORDERS]:
            if g > guesses[0][0] * PLANNED_MARGIN:
                break  # estimated slower than the best order by more than the margin: not planned
            if g in alike:
                continue  # priced exactly as one planned (a symmetric chain's mirror order)
            alike.add(g)
            trial = dict(paths)
            trial[node] = path
            try:
                scored.append((evaluate(choice.blocks, trial)[1], len(scored), path))
            except ValueError:
                continue
        if scored:
            paths[node] = min(scored)[2]
            notes.append(f"contraction order {[list(s) for s in paths[node]]}, the fastest of {len(scored)} planned "
                         f"(of {len(cands)} from opt_einsum, by the estimate) for {','.join(node.subs)}->{node.out}")
    # the plan kept (kept_search(): the plan compared, or a wider search of it)
    evaluate(choice.blocks, paths, quick=False)
    rel, best = built[(tuple(choice.blocks), tuple(paths.get(n) for n in multi), kept)]
    why = choice.why + ("; " + "; ".join(notes) if notes else "")
    with _CHOICES_LOCK:
        _CHOICES[structure] = (tuple(choice.blocks), tuple(paths.get(n) for n in multi), why)
        while len(_CHOICES) > 64:
            _CHOICES.popitem(last=False)
    return rel, best.with_stage(Stage("chunking", None, time.perf_counter() - t0, why)), choice


def build_local(x, sites: int = 1, memory_limit=None, cluster=None):
    """``(relation, plan)`` for ``x`` planned in this process for ``sites`` sites of
    the default :class:`~tra_dask.ClusterSpec` (``memory_limit``: bytes per site), or
    for the sites of ``cluster`` (a ClusterSpec, e.g. one a calibration saved)."""
    refuse_empty(x, "td.Array.to_relation")
    if cluster is not None:
        if not isinstance(cluster, ClusterSpec):
            raise TypeError(f"td.Array.to_relation: cluster must be a td.ClusterSpec, got {type(cluster).__name__}")
        if sites not in (1, cluster.sites):
            raise ValueError(f"td.Array.to_relation: sites={sites} but the cluster has {cluster.sites} sites; "
                             f"give one of them (or cluster.with_sites({sites}))")
        spec, sites = cluster, cluster.sites
        if memory_limit is not None:
            spec = dataclasses.replace(spec, memory_per_site=memory_limit)
    else:
        spec = ClusterSpec(sites=sites) if memory_limit is None else ClusterSpec(sites=sites,
                                                                                 memory_per_site=memory_limit)
    cache: dict = {}

    def local_dask(arr, chunks, name):
        if id(arr) not in cache:
            cache[id(arr)] = (arr, _computed_here(arr))
        return L.from_numpy(cache[id(arr)][1], chunks if arr.ndim else (), name=name)

    target = Target(sites, cluster=spec)

    def plan_rel(rel, options):
        if sites == 1 and memory_limit is None:  # nothing to place, nothing to fit: the paper's plan
            return _compile(rel, sites=1)
        return optimize(rel, target, objective="time", options=options)

    rel, p, _ = plan_chunking(x, target, plan_rel, local_dask, context=(memory_limit,))
    return rel, p


def evaluate_local(x, sites: int = 1, host: bool = True):
    """Evaluate ``x`` (an array or a tuple of arrays) in this process with the
    reference evaluator: numpy arrays (``host``), else each array in its chunks'
    own module (cupy chunks give a cupy array, with no copy to the host).  An empty
    array is numpy's empty array (nothing runs)."""
    if not all(a.size for a in as_arrays(x)):
        return with_empties(x, lambda rest: evaluate_local(rest, sites, host))
    rel, _ = build_local(x, sites)
    done = to_host if host else (lambda a: a)
    if isinstance(rel, tuple):
        chunks = L.evaluate(rel)
        return tuple(done(L.to_numpy(r, c)) for r, c in zip(rel, chunks))
    return done(L.to_numpy(rel))

